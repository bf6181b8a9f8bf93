"""A splat model's parameters as numpy arrays, and the official 3DGS PLY layout they travel in: the one
definition of its columns, which the backend writes (backend/formats/ply.py) and the add-on reads.

Columns, all float32: x y z nx ny nz f_dc_0..2 f_rest_0..(3*(K-1)-1) opacity scale_0..2 rot_0..3, where
K = (degree+1)^2 and f_rest is channel-major (all of red's coefficients, then green's, then blue's). Opacity is
a logit, scales are logarithms and rotations unit quaternions (w, x, y, z): the trained parameters.

A 4D model's motion travels as MOTION_COLUMNS after those (other readers ignore them): the file's parameters are
then each Gaussian's at its time centre (backend/dynamic.py's fields, by the names MOTION_FIELDS gives)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import SplatwrightError

SH_DEGREES = {0: 0, 9: 1, 24: 2, 45: 3}  # f_rest columns -> SH degree
MOTION_FIELDS = {"velocities": ("vx", "vy", "vz"), "accelerations": ("ax", "ay", "az"),
                 "angular_velocities": ("wx", "wy", "wz"), "time_centers": ("t_center",),
                 "time_precisions": ("t_precision",)}  # DynamicGaussians' motion -> its PLY columns
MOTION_COLUMNS = [column for columns in MOTION_FIELDS.values() for column in columns]
_HEADER_END = b"end_header\n"
_MAX_HEADER_BYTES = 1 << 16


def ply_columns(sh_degree: int) -> list[str]:
    """The vertex properties of a model of `sh_degree`, in the file's order."""
    rest = 3 * ((sh_degree + 1) ** 2 - 1)
    return (["x", "y", "z", "nx", "ny", "nz", "f_dc_0", "f_dc_1", "f_dc_2"] + [f"f_rest_{i}" for i in range(rest)]
            + ["opacity", "scale_0", "scale_1", "scale_2", "rot_0", "rot_1", "rot_2", "rot_3"])


@dataclass
class SplatArrays:
    means: np.ndarray  # (N, 3)
    log_scales: np.ndarray  # (N, 3)
    quats: np.ndarray  # (N, 4) w, x, y, z
    opacity_logits: np.ndarray  # (N,)
    sh_dc: np.ndarray  # (N, 3)
    sh_rest: np.ndarray  # (N, K-1, 3): coefficient, then channel

    def __len__(self) -> int:
        return len(self.means)

    @property
    def sh_degree(self) -> int:
        return round((self.sh_rest.shape[1] + 1) ** 0.5) - 1


def read_ply_bytes(data: bytes | memoryview, what: str = "the model") -> SplatArrays:
    """The model in a binary little-endian 3DGS PLY whose vertex properties are all float32 in the official
    order, as the backend writes it; any other PLY is refused, saying so (the backend reads every variant)."""
    model, motion = read_motion_ply_bytes(data, what)
    if motion is not None:
        raise SplatwrightError(f"{what}: a 4D model's parameters with its motion, not a model of one time")
    return model


def read_motion_ply_bytes(data: bytes | memoryview, what: str = "the model") -> tuple[SplatArrays, dict | None]:
    """read_ply_bytes' model, and a 4D model's motion by DynamicGaussians' names where the file has
    MOTION_COLUMNS after the official ones (None where it has none)."""
    data = memoryview(data)
    head = bytes(data[:_MAX_HEADER_BYTES])
    end = head.find(_HEADER_END)
    if not head.startswith(b"ply\n") or end < 0:
        raise SplatwrightError(f"{what}: not a PLY file")
    lines = head[:end].decode("ascii", "replace").splitlines()
    if "format binary_little_endian 1.0" not in lines:
        raise SplatwrightError(f"{what}: not a binary little-endian PLY")
    vertex = [line.split() for line in lines if line.startswith("element vertex ")]
    properties = [line.split() for line in lines if line.startswith("property ")]
    if len(vertex) != 1 or not vertex[0][2].isdigit() or any(p[1] != "float" or len(p) != 3 for p in properties):
        raise SplatwrightError(f"{what}: not a 3DGS PLY of float32 vertex properties")
    count, names = int(vertex[0][2]), [p[2] for p in properties]
    rest = sum(name.startswith("f_rest_") for name in names)
    moving = names[-len(MOTION_COLUMNS):] == MOTION_COLUMNS
    official = names[:-len(MOTION_COLUMNS)] if moving else names
    if rest not in SH_DEGREES or official != ply_columns(SH_DEGREES[rest]):
        raise SplatwrightError(f"{what}: its columns are not the official 3DGS layout's")
    body = data[end + len(_HEADER_END):]
    if len(body) < count * len(names) * 4:
        raise SplatwrightError(f"{what}: {count} splats announced, {len(body) // (len(names) * 4)} present")
    table = np.frombuffer(body, "<f4", count * len(names)).reshape(count, len(names))
    k = rest // 3
    motion = None
    if moving:
        first = len(official)
        motion = {}
        for field, columns in MOTION_FIELDS.items():
            motion[field] = table[:, first:first + len(columns)].copy()
            motion[field] = motion[field][:, 0] if len(columns) == 1 else motion[field]
            first += len(columns)
    return SplatArrays(means=table[:, 0:3].copy(), log_scales=table[:, 10 + rest:13 + rest].copy(),
                       quats=table[:, 13 + rest:17 + rest].copy(), opacity_logits=table[:, 9 + rest].copy(),
                       sh_dc=table[:, 6:9].copy(),
                       sh_rest=table[:, 9:9 + rest].reshape(count, 3, k).transpose(0, 2, 1).copy()), motion


def encode_ply_bytes(model: SplatArrays, comments: tuple[str, ...] = (), motion: dict | None = None) -> bytes:
    """`model` as a binary little-endian PLY in the official 3DGS layout, with header `comments`; with a 4D
    model's `motion` (by DynamicGaussians' names), MOTION_COLUMNS after the official ones."""
    n = len(model)
    moved = [] if motion is None else [np.asarray(motion[field], np.float32).reshape(n, -1) for field in MOTION_FIELDS]
    table = np.concatenate([model.means, np.zeros((n, 3), np.float32), model.sh_dc,
                            model.sh_rest.transpose(0, 2, 1).reshape(n, -1), model.opacity_logits.reshape(n, 1),
                            model.log_scales, model.quats, *moved], axis=1).astype("<f4")
    columns = ply_columns(model.sh_degree) + (MOTION_COLUMNS if motion is not None else [])
    header = ["ply", "format binary_little_endian 1.0", *(f"comment {c}" for c in comments), f"element vertex {n}",
              *(f"property float {name}" for name in columns), "end_header"]
    return ("\n".join(header) + "\n").encode("ascii") + table.tobytes()
