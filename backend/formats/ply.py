"""PLY I/O in the official 3DGS layout, readable by other 3DGS viewers and trainers.

Vertex properties, all float32: x y z nx ny nz f_dc_0..2 f_rest_0..(3*(K-1)-1) opacity scale_0..2 rot_0..3,
where K = (degree+1)^2 and f_rest is channel-major (all of red's coefficients, then green's, then blue's).
Opacity is stored as a logit and scales as logarithms, exactly the trained parameters.

A model trained for an image formation other than the standard one (render/formation.py) says so in a header
comment, `comment splatwright image_formation blender`, which other readers ignore; a file without one is a
standard 3DGS model, as every other trainer's is.
"""
from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import torch
from plyfile import PlyData, PlyElement

from blender_addon.core.errors import SplatwrightError
from blender_addon.core.files import write_atomic
from blender_addon.core.settings import FORMATIONS
from ..gaussians import Gaussians

_REQUIRED = ["x", "y", "z", "f_dc_0", "f_dc_1", "f_dc_2", "opacity",
             "scale_0", "scale_1", "scale_2", "rot_0", "rot_1", "rot_2", "rot_3"]
_REST_COUNTS = {0: 0, 9: 1, 24: 2, 45: 3}  # number of f_rest columns -> SH degree
FORMATION_COMMENT = "splatwright image_formation"  # the header comment naming a model's image formation
STANDARD = FORMATIONS[0]


def write_ply(path: str | Path, g: Gaussians, formation: str = STANDARD) -> None:
    """Write atomically: a partial file never replaces a good one."""
    write_atomic(path, encode_ply(g, formation))


def encode_ply(g: Gaussians, formation: str = STANDARD) -> bytes:
    """The PLY file of `g` in the official 3DGS layout, trained for image formation `formation`."""
    n = len(g)
    t = {k: v.detach().cpu().float().numpy() for k, v in g.tensors().items()}
    rest = t["sh_rest"].transpose(0, 2, 1).reshape(n, -1)  # (N, 3, K-1) -> channel-major
    columns = ([t["means"], np.zeros((n, 3), np.float32), t["sh_dc"].reshape(n, 3), rest,
                t["opacity_logits"][:, None], t["log_scales"], t["quats"]])
    names = (["x", "y", "z", "nx", "ny", "nz", "f_dc_0", "f_dc_1", "f_dc_2"]
             + [f"f_rest_{i}" for i in range(rest.shape[1])]
             + ["opacity", "scale_0", "scale_1", "scale_2", "rot_0", "rot_1", "rot_2", "rot_3"])
    data = np.concatenate(columns, axis=1).astype(np.float32)
    vertex = np.empty(n, dtype=[(name, "f4") for name in names])
    for i, name in enumerate(names):
        vertex[name] = data[:, i]
    out = io.BytesIO()
    if formation not in FORMATIONS:
        raise ValueError(f"unknown image formation {formation!r}")
    comments = [] if formation == STANDARD else [f"{FORMATION_COMMENT} {formation}"]
    PlyData([PlyElement.describe(vertex, "vertex")], comments=comments).write(out)
    return out.getvalue()


def header_formation(header: str, name: str = "the PLY") -> str:
    """The image formation a PLY header's comment names; standard where none does."""
    for line in header.splitlines():
        words = line.split()
        if words[:1] == ["comment"] and " ".join(words[1:3]) == FORMATION_COMMENT:
            formation = " ".join(words[3:])
            if formation not in FORMATIONS:
                raise SplatwrightError(f"{name}: made for image formation {formation!r}, which this version does "
                                       f"not know (it knows {', '.join(FORMATIONS)})")
            return formation
    return STANDARD


def read_ply(source: str | Path | bytes | bytearray, name: str = "the PLY") -> Gaussians:
    """Gaussians from a 3DGS PLY file, or from its bytes (`name` then says what they are in errors)."""
    if isinstance(source, (bytes, bytearray)):
        path, stream, head = name, io.BytesIO(source), bytes(source[:4])
    else:
        path = Path(source)
        if not path.is_file():
            raise SplatwrightError(f"{path}: no such file")
        with open(path, "rb") as f:
            head = f.read(4)
        stream = str(path)  # by name, so plyfile maps the file rather than copying it
    if head != b"ply\n":
        raise SplatwrightError(f"{path}: not a PLY file (it does not start with 'ply')")
    try:
        ply = PlyData.read(stream)
    except Exception as e:  # plyfile reports truncation and bad headers with assorted types
        raise SplatwrightError(f"{path}: unreadable PLY ({e}); the vertex count may not match the data") from e
    if "vertex" not in ply:
        raise SplatwrightError(f"{path}: PLY has no 'vertex' element")
    vertex = ply["vertex"]
    names = {p.name for p in vertex.properties}
    missing = [c for c in _REQUIRED if c not in names]
    if missing:
        raise SplatwrightError(f"{path}: not a 3DGS PLY, missing columns: {', '.join(missing)}")
    n_rest = sum(1 for c in names if c.startswith("f_rest_"))
    if n_rest not in _REST_COUNTS:
        raise SplatwrightError(f"{path}: {n_rest} f_rest_* columns; a 3DGS PLY has 0, 9, 24 or 45")
    absent = [f"f_rest_{i}" for i in range(n_rest) if f"f_rest_{i}" not in names]
    if absent:
        raise SplatwrightError(f"{path}: f_rest columns are not numbered 0..{n_rest - 1} (missing {absent[0]})")

    n = len(vertex.data)
    if n == 0:
        raise SplatwrightError(f"{path}: the PLY has no vertices (Gaussians)")

    def col(*cols: str) -> np.ndarray:
        out = np.empty((n, len(cols)), np.float32)
        for i, c in enumerate(cols):
            out[:, i] = vertex[c]
        return out

    arrays = {
        "means": col("x", "y", "z"),
        "log_scales": col("scale_0", "scale_1", "scale_2"),
        "quats": col("rot_0", "rot_1", "rot_2", "rot_3"),
        "opacity_logits": col("opacity")[:, 0],
        "sh_dc": col("f_dc_0", "f_dc_1", "f_dc_2").reshape(n, 1, 3),
        "sh_rest": col(*[f"f_rest_{i}" for i in range(n_rest)]).reshape(n, 3, n_rest // 3).transpose(0, 2, 1),
    }
    for name, a in arrays.items():
        bad = ~np.isfinite(a).reshape(n, -1).all(axis=1)
        if bad.any():
            raise SplatwrightError(
                f"{path}: {int(bad.sum())} vertices have NaN or infinite {name} (first at row {int(np.argmax(bad))})")
    if (np.linalg.norm(arrays["quats"], axis=1) < 1e-12).any():
        raise SplatwrightError(f"{path}: some rotations are zero quaternions")
    return Gaussians(**{k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in arrays.items()})
