"""PLY I/O in the official 3DGS layout (blender_addon/core/splats.py defines its columns), readable by other 3DGS
viewers and trainers.

A model trained for an image formation other than the standard one (render/formation.py) says so in a header
comment, `comment splatwright image_formation blender`, which other readers ignore; a file without one is a
standard 3DGS model, as every other trainer's is.
"""
from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import torch
from plyfile import PlyData

from blender_addon.core.errors import SplatwrightError
from blender_addon.core.files import write_atomic
from blender_addon.core.settings import FORMATIONS
from blender_addon.core.splats import SH_DEGREES, SplatArrays, encode_ply_bytes
from ..gaussians import Gaussians
from .budget import PLY_HEADER_BYTES, Budget, check_ply_counts
from .validate import validated

_REQUIRED = ["x", "y", "z", "f_dc_0", "f_dc_1", "f_dc_2", "opacity",
             "scale_0", "scale_1", "scale_2", "rot_0", "rot_1", "rot_2", "rot_3"]
FORMATION_COMMENT = "splatwright image_formation"  # the header comment naming a model's image formation
STANDARD = FORMATIONS[0]


def write_ply(path: str | Path, g: Gaussians, formation: str = STANDARD) -> None:
    """Write atomically: a partial file never replaces a good one."""
    write_atomic(path, encode_ply(g, formation))


def encode_ply(g: Gaussians, formation: str = STANDARD) -> bytes:
    """The PLY file of `g` in the official 3DGS layout, trained for image formation `formation`."""
    if formation not in FORMATIONS:
        raise ValueError(f"unknown image formation {formation!r}")
    t = {k: v.detach().cpu().float().numpy() for k, v in g.tensors().items()}
    model = SplatArrays(means=t["means"], log_scales=t["log_scales"], quats=t["quats"],
                        opacity_logits=t["opacity_logits"], sh_dc=t["sh_dc"].reshape(len(g), 3), sh_rest=t["sh_rest"])
    return encode_ply_bytes(model, () if formation == STANDARD else (f"{FORMATION_COMMENT} {formation}",))


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


def read_ply(source: str | Path | bytes | bytearray, name: str = "the PLY", budget: Budget = Budget()) -> Gaussians:
    """Gaussians from a 3DGS PLY file, or from its bytes (`name` then says what they are in errors), of at most
    `budget`'s splats."""
    if isinstance(source, (bytes, bytearray)):
        path, stream, head, size = name, io.BytesIO(source), bytes(source[:PLY_HEADER_BYTES]), len(source)
    else:
        path = Path(source)
        if not path.is_file():
            raise SplatwrightError(f"{path}: no such file")
        with open(path, "rb") as f:
            head, size = f.read(PLY_HEADER_BYTES), path.stat().st_size
        stream = str(path)  # by name, so plyfile maps the file rather than copying it
    if head[:4] != b"ply\n":
        raise SplatwrightError(f"{path}: not a PLY file (it does not start with 'ply')")
    check_ply_counts(head, size, str(path), budget)
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
    if n_rest not in SH_DEGREES:
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
    return validated(Gaussians(**{k: torch.from_numpy(v) for k, v in arrays.items()}), str(path), budget)
