"""The CUDA kernels' constants (cuda/constants.h, cuda/sh.cuh) equal the Python ones (backend/render/constants.py,
backend/render/formation.py, backend/sh.py): read from the headers' text everywhere, and from the compiled
extension on a GPU.

Values compare at the kernel's precision: exactly for int and double constants, after rounding the Python value
to float32 for float ones."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

from backend import sh
from backend.render import constants, formation

CUDA_DIR = Path(__file__).resolve().parent.parent / "cuda"
KERNEL_ONLY = {"BLOCK_SIZE"}  # threads per tile, TILE * TILE: no Python counterpart


def sh_coefficients() -> dict[str, float]:
    """backend/sh.py's SH coefficients, a tuple's entries named as sh.cuh names them (SH_C2 -> SH_C2_0 ...)."""
    found = {}
    for name, value in vars(sh).items():
        if not name.startswith("SH_C"):
            continue
        if isinstance(value, tuple):
            found |= {f"{name}_{i}": entry for i, entry in enumerate(value)}
        else:
            found[name] = value
    return found


def header_constants(*filenames: str) -> dict[str, tuple[str, float]]:
    """NAME -> (C++ type, value) of every constexpr in the headers. A value may be a literal or arithmetic on
    literals and earlier constants (1.0f / 255.0f, TILE * TILE); it is evaluated in Python floats."""
    types, values = {}, {}
    for filename in filenames:
        text = re.sub(r"//[^\n]*", "", (CUDA_DIR / filename).read_text())
        for ctype, declarators in re.findall(r"constexpr\s+(int|float|double)\s+([^;]+);", text):
            for declarator in declarators.split(","):
                name, expression = (part.strip() for part in declarator.split("="))
                expression = re.sub(r"(?<=[\d.])f\b", "", expression)  # 1.0f -> 1.0
                types[name] = ctype
                values[name] = eval(expression, {"__builtins__": {}}, dict(values))  # the repository's own header
    return {name: (types[name], values[name]) for name in types}


def at_kernel_precision(ctype: str, value: float) -> float:
    return float(np.float32(value)) if ctype == "float" else value


RASTERIZER = {name: value for name, value in vars(constants).items() if name.isupper()}
FORMATION = {name: getattr(formation, name)
             for name in ("SCALE_CLAMP", "FILM_SPLAT_VARIANCE", "FILM_TAP_SIDE", "FILM_TAP_CENTRE")}
PYTHON = RASTERIZER | FORMATION | sh_coefficients()
HEADERS = header_constants("constants.h", "sh.cuh")


@pytest.mark.parametrize("name", sorted(PYTHON))
def test_header_value_equals_python(name):
    assert name in HEADERS, f"{name} is defined in Python but in neither cuda/constants.h nor cuda/sh.cuh"
    ctype, value = HEADERS[name]
    assert at_kernel_precision(ctype, value) == at_kernel_precision(ctype, PYTHON[name])


def test_every_header_constant_has_a_python_counterpart():
    assert set(HEADERS) - set(PYTHON) == KERNEL_ONLY


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="needs a CUDA GPU (torch sees none) to build the extension")
def test_extension_exports_the_python_values():
    from backend.kernels import extension
    exported = extension().constants()
    assert set(exported) == set(RASTERIZER) | set(FORMATION) | {"SH_C0"}
    for name, value in exported.items():
        ctype, _ = HEADERS[name]
        assert type(value) is type(PYTHON[name]), name
        assert value == at_kernel_precision(ctype, PYTHON[name]), name
