"""PlayCanvas's compressed PLY (SuperSplat's and splat-transform's `.compressed.ply`).

A binary little-endian PLY with the elements
- chunk: one row per 256 splats (the last may cover fewer), float32 min_x min_y min_z max_x max_y max_z,
  min_scale_x min_scale_y min_scale_z max_scale_x max_scale_y max_scale_z (of the log scales) and, in files
  since 2024, min_r min_g min_b max_r max_g max_b (of the colour 0.5 + SH_C0 x DC);
- vertex: uint32 packed_position, packed_rotation, packed_scale, packed_color;
- sh (optional): uchar f_rest_0 .. f_rest_{3(K-1)-1}, channel-major as in the official 3DGS PLY.
Positions and scales are 11-10-11 bits (x in the top 11 bits, y the next 10, z the low 11) of their place
between the chunk's min and max. Rotations are 2-10-10-10: the index of the largest |component| of
(w, x, y, z) in the top two bits, then the other three in order as q x sqrt(1/2) + 0.5 in 10 bits each, the
quaternion negated first where its largest component is negative. Colours are 8-8-8-8: R, G, B (their place
between the chunk's min and max, or the colour itself without them) and sigmoid(opacity). Values are rounded
to nearest and clamped. SH bytes are trunc((c / 8 + 0.5) x 256) clamped, read back as
((byte + 0.5) / 256 - 0.5) x 8, with 0 and 255 as -4 and 4. Axes are the PLY's: nothing flips.
We write splats in Morton order, so each chunk covers a small region and its bounds are tight.
"""
from __future__ import annotations

import io
import math

import numpy as np
from plyfile import PlyData

from blender_addon.core.errors import SplatwrightError
from ..gaussians import Gaussians
from ..sh import SH_C0
from .budget import Budget, PLY_HEADER_BYTES, check_ply_counts
from .common import OTHER_COMPONENTS, byte_logit, columns, gaussians_from_columns, pack_unorm, sigmoid, unpack_bits

CHUNK = 256
POSITION_BOUNDS = ["min_x", "min_y", "min_z", "max_x", "max_y", "max_z"]
SCALE_BOUNDS = ["min_scale_x", "min_scale_y", "min_scale_z", "max_scale_x", "max_scale_y", "max_scale_z"]
COLOR_BOUNDS = ["min_r", "min_g", "min_b", "max_r", "max_g", "max_b"]
PACKED = ["packed_position", "packed_rotation", "packed_scale", "packed_color"]
SCALE_LIMIT = 20.0  # log-scale bounds are clamped to +-20, as PlayCanvas does (some trainers leave infinities)
SQRT2 = math.sqrt(2.0)


def is_compressed_ply(header: str) -> bool:
    """Whether a PLY header (its text up to end_header) declares the `chunk` element of this format."""
    return any(line.split()[:2] == ["element", "chunk"] for line in header.splitlines())


def decode(data: bytes, name: str = "the compressed PLY", budget: Budget = Budget()) -> Gaussians:
    check_ply_counts(data[:PLY_HEADER_BYTES], len(data), name, budget)
    try:
        ply = PlyData.read(io.BytesIO(data))
    except Exception as e:  # plyfile reports truncation and bad headers with assorted types
        raise SplatwrightError(f"{name}: unreadable PLY ({e}); the element counts may not match the data") from e
    elements = {e.name: e.data for e in ply.elements}
    for element, needed in (("chunk", POSITION_BOUNDS + SCALE_BOUNDS), ("vertex", PACKED)):
        present = elements[element].dtype.names if element in elements else ()
        missing = [p for p in needed if p not in present]
        if missing:
            raise SplatwrightError(f"{name}: not a compressed PLY, its {element} element lacks {', '.join(missing)}")
    chunk, vertex = elements["chunk"], elements["vertex"]
    n = len(vertex)
    if n == 0:
        raise SplatwrightError(f"{name}: the compressed PLY holds no splats")
    if len(chunk) != math.ceil(n / CHUNK):
        raise SplatwrightError(f"{name}: {len(chunk)} chunks for {n} splats; the format has one chunk per "
                               f"{CHUNK} splats ({math.ceil(n / CHUNK)}), so the counts do not match")
    wrong = [p for p in PACKED if vertex.dtype[p] != np.dtype("<u4")]
    if wrong:
        raise SplatwrightError(f"{name}: {', '.join(wrong)} must be uint properties")
    owner = np.arange(n) // CHUNK

    def lerp(names: list[str], t: np.ndarray) -> np.ndarray:
        bounds = np.stack([chunk[p] for p in names], axis=1).astype(np.float64)[owner]
        return (bounds[:, :3] + (bounds[:, 3:] - bounds[:, :3]) * t).astype(np.float32)

    color = vertex["packed_color"].astype(np.uint32)
    rgb = np.stack([unpack_bits(color, shift, 8) for shift in (24, 16, 8)], axis=1) / 255.0
    if all(p in chunk.dtype.names for p in COLOR_BOUNDS):
        rgb = lerp(COLOR_BOUNDS, rgb)
    return gaussians_from_columns({
        "means": lerp(POSITION_BOUNDS, _unpack_111011(vertex["packed_position"])),
        "log_scales": lerp(SCALE_BOUNDS, _unpack_111011(vertex["packed_scale"])),
        "quats": _unpack_rotation(vertex["packed_rotation"].astype(np.uint32)),
        "opacity_logits": byte_logit(unpack_bits(color, 0, 8)),
        "sh_dc": ((rgb - 0.5) / SH_C0).astype(np.float32),
        "sh_rest": _read_sh(elements.get("sh"), n, name),
    }, name, budget)


def morton_columns(g: Gaussians, what: str) -> dict[str, np.ndarray]:
    """`g`'s columns (common.columns) in Morton order of their positions, as the chunked formats write them;
    refused for an empty model, which `what` (the format) cannot hold."""
    c = columns(g)
    if len(c["means"]) == 0:
        raise SplatwrightError(f"{what}: no splats to write")
    order = morton_order(c["means"])
    return {k: v[order] for k, v in c.items()}


def encode(g: Gaussians) -> bytes:
    c = morton_columns(g, "compressed PLY")
    n = len(c["means"])
    n_chunks = math.ceil(n / CHUNK)
    owner = np.arange(n) // CHUNK

    def bounds(a: np.ndarray) -> np.ndarray:
        """(chunks, 6): each chunk's min then max of the three columns of `a`."""
        padded = np.concatenate([a, np.repeat(a[-1:], n_chunks * CHUNK - n, axis=0)]).reshape(n_chunks, CHUNK, 3)
        return np.concatenate([padded.min(axis=1), padded.max(axis=1)], axis=1).astype(np.float32)

    def place(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        lo, hi = b[owner, :3].astype(np.float64), b[owner, 3:].astype(np.float64)
        span = hi - lo
        t = np.where(span < 1e-5, 0.0, (a - lo) / np.where(span < 1e-5, 1.0, span))
        return np.clip(t, 0.0, 1.0)

    rgb = c["sh_dc"].astype(np.float64) * SH_C0 + 0.5
    position_bounds = bounds(c["means"])
    scale_bounds = np.clip(bounds(c["log_scales"]), -SCALE_LIMIT, SCALE_LIMIT)
    color_bounds = bounds(rgb)
    t_rgb = place(rgb, color_bounds)
    packed = np.stack([
        _pack_111011(place(c["means"], position_bounds)),
        _pack_rotation(c["quats"]),
        _pack_111011(place(c["log_scales"], scale_bounds)),
        (pack_unorm(t_rgb[:, 0], 8) << np.uint32(24) | pack_unorm(t_rgb[:, 1], 8) << np.uint32(16)
         | pack_unorm(t_rgb[:, 2], 8) << np.uint32(8) | pack_unorm(sigmoid(c["opacity_logits"]), 8)),
    ], axis=1).astype("<u4")
    chunk_rows = np.concatenate([position_bounds, scale_bounds, color_bounds], axis=1).astype("<f4")
    rest = c["sh_rest"].transpose(0, 2, 1).reshape(n, -1)  # channel-major, as f_rest_* in the 3DGS PLY
    sh = np.clip(np.trunc((rest.astype(np.float64) / 8.0 + 0.5) * 256.0), 0, 255).astype(np.uint8)
    lines = (["ply", "format binary_little_endian 1.0", "comment Generated by Splatwright",
              f"element chunk {n_chunks}"]
             + [f"property float {p}" for p in POSITION_BOUNDS + SCALE_BOUNDS + COLOR_BOUNDS]
             + [f"element vertex {n}"] + [f"property uint {p}" for p in PACKED])
    if rest.shape[1]:
        lines += [f"element sh {n}"] + [f"property uchar f_rest_{i}" for i in range(rest.shape[1])]
    header = ("\n".join(lines + ["end_header"]) + "\n").encode("ascii")
    return header + chunk_rows.tobytes() + packed.tobytes() + sh.tobytes()


def morton_order(means: np.ndarray) -> np.ndarray:
    """Indices putting splats in Morton (Z-curve) order of their positions on a 1024^3 grid over the model."""
    lo, hi = means.min(axis=0), means.max(axis=0)
    cells = ((means - lo) / np.maximum(hi - lo, 1e-12) * 1023).astype(np.uint64)
    code = np.zeros(len(means), np.uint64)
    for bit in range(10):
        for axis in range(3):
            code |= ((cells[:, axis] >> np.uint64(bit)) & np.uint64(1)) << np.uint64(3 * bit + axis)
    return np.argsort(code, kind="stable")


def _unpack_111011(words: np.ndarray) -> np.ndarray:
    words = words.astype(np.uint32)
    return np.stack([unpack_bits(words, 21, 11) / 2047.0, unpack_bits(words, 11, 10) / 1023.0,
                     unpack_bits(words, 0, 11) / 2047.0], axis=1)


def _pack_111011(t: np.ndarray) -> np.ndarray:
    return (pack_unorm(t[:, 0], 11) << np.uint32(21) | pack_unorm(t[:, 1], 10) << np.uint32(11)
            | pack_unorm(t[:, 2], 11))


def _unpack_rotation(words: np.ndarray) -> np.ndarray:
    largest = (words >> np.uint32(30)).astype(np.intp)
    others = np.stack([(unpack_bits(words, shift, 10) / 1023.0 - 0.5) * SQRT2 for shift in (20, 10, 0)], axis=1)
    rows = np.arange(len(words))
    q = np.zeros((len(words), 4))
    q[rows[:, None], OTHER_COMPONENTS[largest]] = others
    q[rows, largest] = np.sqrt(np.maximum(0.0, 1.0 - (others ** 2).sum(axis=1)))
    return q.astype(np.float32)


def _pack_rotation(q: np.ndarray) -> np.ndarray:
    rows = np.arange(len(q))
    largest = np.argmax(np.abs(q), axis=1)
    q = q.astype(np.float64) * np.where(q[rows, largest] < 0, -1.0, 1.0)[:, None]
    t = q[rows[:, None], OTHER_COMPONENTS[largest]] / SQRT2 + 0.5
    return (largest.astype(np.uint32) << np.uint32(30) | pack_unorm(t[:, 0], 10) << np.uint32(20)
            | pack_unorm(t[:, 1], 10) << np.uint32(10) | pack_unorm(t[:, 2], 10))


def _read_sh(sh, n: int, name: str) -> np.ndarray:
    """(N, K-1, 3) higher SH coefficients of the `sh` element (None: degree 0)."""
    if sh is None:
        return np.zeros((n, 0, 3), np.float32)
    count = len(sh.dtype.names)
    names = [f"f_rest_{i}" for i in range(count)]
    if count not in (9, 24, 45) or list(sh.dtype.names) != names:
        raise SplatwrightError(f"{name}: the sh element must hold f_rest_0 .. f_rest_N-1 for N = 9, 24 or 45")
    if len(sh) != n:
        raise SplatwrightError(f"{name}: {len(sh)} sh rows for {n} splats; the counts do not match")
    b = np.stack([sh[p] for p in names], axis=1).astype(np.float64)
    level = np.where(b == 0, 0.0, np.where(b == 255, 1.0, (b + 0.5) / 256.0))
    return ((level - 0.5) * 8.0).reshape(n, 3, count // 3).transpose(0, 2, 1).astype(np.float32)
