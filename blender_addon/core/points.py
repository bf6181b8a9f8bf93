"""Point clouds as PLY files (points3d.ply beside a scene's transforms, as 3DGS reads NeRF-synthetic scenes):
positions and 8-bit colours, the initial Gaussians of a capture. Numpy only (the add-on shares it).

Written as binary little-endian x, y, z (float) and red, green, blue (uchar); read from binary little-endian or
ASCII PLY with further vertex properties (normals, ...), which are ignored, and colours as integers in
[0, 255] or floats in [0, 1]."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .errors import SplatwrightError
from .files import write_atomic

POINTS_FILE = "points3d.ply"
PLY_TYPES = {"char": "i1", "int8": "i1", "uchar": "u1", "uint8": "u1", "short": "i2", "int16": "i2",
             "ushort": "u2", "uint16": "u2", "int": "i4", "int32": "i4", "uint": "u4", "uint32": "u4",
             "float": "f4", "float32": "f4", "double": "f8", "float64": "f8"}


def write_points(path: str | Path, xyz: np.ndarray, rgb: np.ndarray) -> None:
    """`xyz` (N, 3) positions and `rgb` (N, 3) uint8 colours, written atomically."""
    xyz, rgb = np.asarray(xyz, dtype=np.float32), np.asarray(rgb, dtype=np.uint8)
    if xyz.ndim != 2 or xyz.shape[1] != 3 or rgb.shape != xyz.shape:
        raise SplatwrightError(f"points must be (N, 3) positions and (N, 3) colours, got {xyz.shape} and {rgb.shape}")
    vertices = np.empty(len(xyz), dtype=[("x", "<f4"), ("y", "<f4"), ("z", "<f4"),
                                         ("red", "u1"), ("green", "u1"), ("blue", "u1")])
    for i, axis in enumerate("xyz"):
        vertices[axis] = xyz[:, i]
    for i, channel in enumerate(("red", "green", "blue")):
        vertices[channel] = rgb[:, i]
    header = ("ply\nformat binary_little_endian 1.0\n"
              f"element vertex {len(xyz)}\n"
              "property float x\nproperty float y\nproperty float z\n"
              "property uchar red\nproperty uchar green\nproperty uchar blue\nend_header\n")
    write_atomic(path, header.encode("ascii") + vertices.tobytes())


def read_points(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """(xyz (N, 3) float32, rgb (N, 3) uint8); points without colours are grey."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise SplatwrightError(f"{path}: cannot read the point cloud ({e.strerror})") from None
    end = data.find(b"end_header\n")
    if not data.startswith(b"ply\n") or end < 0:
        raise SplatwrightError(f"{path}: not a PLY file (no 'ply' ... 'end_header' header)")
    fmt, count, names, types, in_vertex = None, None, [], [], False
    for line in data[:end].decode("ascii", "replace").splitlines()[1:]:
        words = line.split()
        if not words or words[0] in ("comment", "obj_info"):
            continue
        if words[0] == "format":
            fmt = words[1]
        elif words[0] == "element":
            in_vertex = words[1] == "vertex"
            if in_vertex:
                count = int(words[2])
            elif count is None:
                raise SplatwrightError(f"{path}: element {words[1]} comes before the vertices; write them first")
        elif words[0] == "property" and in_vertex:
            if words[1] == "list" or words[1] not in PLY_TYPES:
                raise SplatwrightError(f"{path}: vertex property {' '.join(words[1:])} is not a plain number type")
            types.append(PLY_TYPES[words[1]])
            names.append(words[2])
    missing = [axis for axis in "xyz" if axis not in names]
    if count is None or missing:
        raise SplatwrightError(f"{path}: the vertices need x, y and z properties (missing {', '.join(missing) or 'vertex element'})")
    body = data[end + len(b"end_header\n"):]
    if fmt == "binary_little_endian":
        dtype = np.dtype([(name, "<" + t) for name, t in zip(names, types)])
        if len(body) < count * dtype.itemsize:
            raise SplatwrightError(f"{path}: {count} vertices announced but the file ends after "
                                   f"{len(body) // dtype.itemsize}")
        vertices = np.frombuffer(body, dtype=dtype, count=count)
        columns = {name: vertices[name] for name in names}
    elif fmt == "ascii":
        rows = body.decode("ascii", "replace").split("\n")[:count]
        try:
            table = np.array([row.split()[:len(names)] for row in rows], dtype=np.float64).reshape(count, len(names))
        except ValueError:
            raise SplatwrightError(f"{path}: the ASCII vertex rows are not {count} rows of {len(names)} numbers") from None
        columns = {name: table[:, i] for i, name in enumerate(names)}
    else:
        raise SplatwrightError(f"{path}: PLY format {fmt} is not supported; write binary_little_endian or ascii")
    xyz = np.stack([columns[axis] for axis in "xyz"], axis=1).astype(np.float32)
    if not np.isfinite(xyz).all():
        raise SplatwrightError(f"{path}: point positions hold NaN or infinity")
    if all(c in columns for c in ("red", "green", "blue")):
        rgb = np.stack([columns[c] for c in ("red", "green", "blue")], axis=1).astype(np.float64)
        if types[names.index("red")].startswith("f"):  # colours stored as floats in [0, 1]
            rgb = rgb * 255.0 + 0.5
        rgb = rgb.clip(0, 255).astype(np.uint8)
    else:
        rgb = np.full((count, 3), 128, dtype=np.uint8)
    return xyz, rgb
