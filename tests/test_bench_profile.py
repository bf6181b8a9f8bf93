"""`bench profile` puts every kernel of cuda/ in a named stage of a training step (none falls into "other")."""
from __future__ import annotations

import re
from pathlib import Path

from backend.tools.bench.profile import OTHER, stage_of

CUDA_DIR = Path(__file__).resolve().parent.parent / "cuda"


def kernel_names() -> list[str]:
    names = []
    for src in CUDA_DIR.glob("*.cu"):
        code = re.sub(r"//[^\n]*", "", src.read_text())  # a comment may sit between the bounds and the name
        names += re.findall(r"__global__ void(?: __launch_bounds__\([^)]*\))?\s+(\w+)", code)
    return names


def test_every_kernel_has_a_stage():
    names = kernel_names()
    assert len(names) >= 15, names
    unstaged = [name for name in names if stage_of(f"void splatwright::{name}(int)") == OTHER]
    assert not unstaged, f"kernels bench profile would count as {OTHER!r}: {unstaged}"


def test_stages_of_known_kernels():
    assert stage_of("splatwright::rasterize_bwd_kernel(RasterArgs, ...)") == "rasterize backward"
    assert stage_of("splatwright::sum_entry_grads_kernel(float const*, ...)") == "rasterize backward"
    assert stage_of("splatwright::gather_ids_kernel(int const*, ...)") == "binning + sort"
    assert stage_of("splatwright::grad_stats_kernel(...)") == "densification + indexing"
    assert stage_of("void at::native::vectorized_elementwise_kernel<4, exp_kernel>(...)") == OTHER
