"""The one check of a model read from a file, whatever its format (the splat formats and the 4D model's file):
everything a reader returns has passed it, so nothing malformed reaches a session, a render or a written file."""
from __future__ import annotations

import torch

from blender_addon.core.errors import SplatwrightError
from ..gaussians import Gaussians, sh_coeff_count
from .budget import Budget

# Each parameter's shape beyond its first dimension (one row per Gaussian); sh_rest's rows are (K - 1, 3) for K
# coefficients of an SH degree 0-3. A 4D model's motion (backend.dynamic) is among them.
ROWS = {"means": (3,), "log_scales": (3,), "quats": (4,), "opacity_logits": (), "sh_dc": (1, 3), "sh_rest": (None, 3),
        "velocities": (3,), "accelerations": (3,), "angular_velocities": (3,), "time_centers": (),
        "time_precisions": ()}
SH_REST = [sh_coeff_count(degree) - 1 for degree in range(4)]
NON_NEGATIVE = ("time_precisions",)  # 1 / width^2 of a window in time


def validated(g: Gaussians, name: str, budget: Budget = Budget()) -> Gaussians:
    """`g`, its tensors contiguous, if every parameter is a dense float32 tensor of one row per Gaussian in the
    shape the model's type has, SH of degree 0-3, at least one and at most `budget`'s Gaussians, values finite,
    rotations non-zero and windows in time non-negative; else SplatwrightError naming the file (`name`), the
    parameter and the first problem, in one line."""
    tensors = g.tensors()
    for key, t in tensors.items():
        if key not in ROWS:
            raise SplatwrightError(f"{name}: the model has a parameter {key!r} that no model has")
        if not isinstance(t, torch.Tensor):
            raise SplatwrightError(f"{name}: {key} is {type(t).__name__}, not a tensor")
        if t.layout != torch.strided:
            raise SplatwrightError(f"{name}: {key} is a {t.layout} tensor; a model's parameters are dense")
        if t.dtype != torch.float32:
            raise SplatwrightError(f"{name}: {key} holds {str(t.dtype).removeprefix('torch.')} values; a model's "
                                   "parameters are float32")
        if t.dim() == 0:
            raise SplatwrightError(f"{name}: {key} is a single number; a model's parameters have a row per Gaussian")
    n = tensors["means"].shape[0]
    if n == 0:
        raise SplatwrightError(f"{name}: the model holds no Gaussians")
    budget.check_count(n, name)
    for key, t in tensors.items():
        row = ROWS[key]
        if key == "sh_rest" and t.dim() == 3 and t.shape[0] == n and t.shape[2] == 3 and t.shape[1] not in SH_REST:
            raise SplatwrightError(f"{name}: {t.shape[1]} higher SH coefficients per colour (SH degree "
                                   f"{(t.shape[1] + 1) ** 0.5 - 1:g}); Splatwright reads SH degrees 0-3 "
                                   f"({', '.join(map(str, SH_REST))} coefficients)")
        wrong = any(r is not None and s != r for s, r in zip(t.shape[1:], row))
        if t.dim() != 1 + len(row) or t.shape[0] != n or wrong:
            expected = ", ".join([str(n)] + ["K" if r is None else str(r) for r in row])
            raise SplatwrightError(f"{name}: {key} has shape {tuple(t.shape)}; a model of {n} Gaussians has "
                                   f"({expected}{',' if not row else ''})")
        if t.untyped_storage().nbytes() < t.numel() * t.element_size():
            raise SplatwrightError(f"{name}: {key} repeats its data to {tuple(t.shape)} from "
                                   f"{t.untyped_storage().nbytes()} bytes")
    for key, t in tensors.items():
        bad = ~torch.isfinite(t.reshape(n, -1)).all(dim=1)
        if bool(bad.any()):
            raise SplatwrightError(f"{name}: {int(bad.sum())} of {n} Gaussians have NaN or infinite {key} "
                                   f"(first at row {int(bad.int().argmax())})")
    if bool((torch.linalg.vector_norm(tensors["quats"], dim=1) < 1e-12).any()):
        raise SplatwrightError(f"{name}: some rotations are zero quaternions")
    for key in NON_NEGATIVE:
        if key in tensors and bool((tensors[key] < 0).any()):
            raise SplatwrightError(f"{name}: {int((tensors[key] < 0).sum())} of {n} Gaussians have a negative {key}")
    return type(g)(**{key: t.contiguous() for key, t in tensors.items()})
