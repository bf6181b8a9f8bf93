"""antimatter15's `.splat` web format (github.com/antimatter15/splat): no header, 32 bytes per splat.

Each record, little-endian: position float32 x 3, scale float32 x 3 (linear, not log), colour RGBA uint8 x 4
(RGB = (0.5 + SH_C0 x SH DC) x 255, A = sigmoid(opacity) x 255), rotation uint8 x 4, the unit quaternion
(w, x, y, z) as q x 128 + 128. Bytes are the nearest integer, clamped to [0, 255]. Axes are the PLY's, so
nothing flips. There is no SH beyond degree 0: writing a model of a higher degree keeps only its base colour
(`notes` says so). Having no magic, a file is taken for a `.splat` only by its name, and then checked.
"""
from __future__ import annotations

import numpy as np

from blender_addon.core.errors import SplatwrightError
from ..gaussians import Gaussians
from ..sh import SH_C0
from .budget import Budget
from .common import byte_logit, columns, gaussians_from_columns, sigmoid, to_byte

RECORD = np.dtype([("position", "<f4", 3), ("scale", "<f4", 3), ("rgba", "u1", 4), ("rotation", "u1", 4)])


def decode(data: bytes, name: str = "the .splat", budget: Budget = Budget()) -> Gaussians:
    if not data:
        raise SplatwrightError(f"{name}: empty file")
    if len(data) % RECORD.itemsize:
        raise SplatwrightError(f"{name}: {len(data)} bytes is not a whole number of 32-byte .splat records "
                               "(truncated, or not a .splat file)")
    budget.check_count(len(data) // RECORD.itemsize, name)
    r = np.frombuffer(data, RECORD)
    n = len(r)
    scale = r["scale"].astype(np.float64)
    with np.errstate(invalid="ignore"):
        bad = ~(np.isfinite(scale) & (scale > 0)).all(axis=1)
    if bad.any():
        raise SplatwrightError(f"{name}: {int(bad.sum())} of {n} records have NaN, infinite or non-positive scales "
                               f"(first at record {int(np.argmax(bad))}); not a .splat file?")
    if (r["rotation"] == 128).all(axis=1).any():
        raise SplatwrightError(f"{name}: some rotations are zero quaternions; not a .splat file?")
    return gaussians_from_columns({
        "means": r["position"].copy(),
        "log_scales": np.log(scale).astype(np.float32),
        "quats": (r["rotation"].astype(np.float32) - 128.0) / 128.0,
        "opacity_logits": byte_logit(r["rgba"][:, 3]),
        "sh_dc": ((r["rgba"][:, :3] / 255.0 - 0.5) / SH_C0).astype(np.float32),
        "sh_rest": np.zeros((n, 0, 3), np.float32),
    }, name, budget)


def encode(g: Gaussians) -> bytes:
    c = columns(g)
    r = np.empty(len(g), RECORD)
    r["position"] = c["means"]
    r["scale"] = np.exp(c["log_scales"])
    r["rgba"][:, :3] = to_byte((0.5 + SH_C0 * c["sh_dc"].astype(np.float64)) * 255.0)
    r["rgba"][:, 3] = to_byte(sigmoid(c["opacity_logits"]) * 255.0)
    r["rotation"] = to_byte(c["quats"] * 128.0 + 128.0)
    return r.tobytes()


def notes(g: Gaussians) -> list[str]:
    degree = g.max_sh_degree
    if degree == 0:
        return []
    return [f".splat holds no SH beyond degree 0: the model's degree {degree} view-dependent colour is dropped, "
            "only its base colour is kept"]
