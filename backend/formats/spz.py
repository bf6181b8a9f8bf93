"""Niantic's SPZ format (github.com/nianticlabs/spz): quantised columns, about 10x smaller than a PLY.

Versions 2 and 3 are one gzip stream: a 16-byte header (uint32 magic 0x5053474e "NGSP", uint32 version,
uint32 splat count, then uint8 SH degree, fractional bits, flags, reserved), then each column for all splats
in turn:
- positions: 3 x 24-bit signed fixed point with `fractional bits` bits after the point;
- alphas: sigmoid(opacity) x 255;
- colours: SH DC x (0.15 x 255) + 127.5;
- scales: (log scale + 10) x 16;
- rotations: version 2 keeps x, y, z of the quaternion with w >= 0, as (q + 1) x 127.5 in 3 bytes; version 3
  the "smallest three" in a little-endian uint32: 2 bits naming the largest component (x, y, z, w order),
  then for each other component in that order a sign bit and 9 bits of |q| / sqrt(1/2);
- SH beyond DC: coefficient-major with the colour channel inner, x 128 + 128, kept to 5 bits for degree 1
  and 4 bits above (the low bits zeroed to help gzip).
Each byte value is the nearest integer, clamped to [0, 255]. Version 4 (the zstandard package reads and writes
it) has a 32-byte plain header (adding the stream count and the offset of a table of contents), each column
zstd-compressed on its own (an empty one, SH of degree 0, not stored), and its extension records (uint32 type,
uint32 length, payload; flagged 0x2) between the header and the table. Versions 2 and 3 keep flagged records
after the columns. We write version 4, or version 3 on request (for readers older than 2026).

Coordinates: SPZ stores RUB (x right, y up, z back) unless Adobe's coordinate-system record
(SPZ_ADOBE_coordinate_system, type 0xADBE0003, payload the uint32 number of the system the data is stored in)
says otherwise; the official 3DGS PLY and our model, both in the world frame as trained, are RDF (x right, y
down, z forward). Between the two, y and z are negated: positions (x, y, z) -> (x, -y, -z), quaternions
(w, x, y, z) -> (w, x, -y, -z), and each SH coefficient is multiplied by the sign its basis function takes under
the flip: a half turn about x, its own inverse. We write RUB, as Niantic's library does, and version 4 says so
in that record. A file without it (Niantic's library writes none; splat-transform and SuperSplat, which store
the PLY's axes unconverted, write none either) is read in the axes `axes` names: "ply" (stored as the PLY's,
SuperSplat's files; the default) or "rub" (as the specification says, Niantic's files and our version 3).
Nothing in such a file tells the two apart: both writers pack with Niantic's library (the same header, flags 0,
12 fractional bits), and a scene's splats do not say which way is up.

Other records (such as Adobe's safe-orbit camera, 0xADBE0002) and the antialiasing flag (0x1) do not change
how the model reads; `extras` reads them, and a version 4 write of the model keeps those it is given.
"""
from __future__ import annotations

import gzip
import math
import struct
from dataclasses import dataclass

import numpy as np

from blender_addon.core.errors import SplatwrightError
from blender_addon.core.settings import SPZ_AXES
from ..gaussians import Gaussians
from .budget import Budget, Inflater, zstd_available, zstandard
from .common import (OTHER_COMPONENTS, byte_logit, columns, gaussians_from_columns, round_half_away, sh_degree_of,
                     sigmoid, to_byte, unit_quats, unpack_bits)

MAGIC = 0x5053474E
GZIP_MAGIC = b"\x1f\x8b"
NGSP_MAGIC = b"NGSP"
LEGACY_HEADER = struct.Struct("<IIIBBBB")  # magic, version, splats, SH degree, fractional bits, flags, reserved
NGSP_HEADER = struct.Struct("<IIIBBBBI12x")  # ... , stream count, table of contents offset, reserved
VERSIONS = (4, 3)  # written: the default first
FLAG_ANTIALIASED = 0x1
FLAG_EXTENSIONS = 0x2
COORDINATE_SYSTEM_RECORD = 0xADBE0003
# Niantic's numbers of the axis conventions 1..8: of n - 1, bit 0 is x right, bit 1 y up, bit 2 z forward.
RUB, RDF = 4, 6
AXES = dict(zip(SPZ_AXES, (RDF, RUB)))  # how a file without a coordinate-system record is read: the default first
ZSTD_LEVEL = 12  # Niantic's
COLOR_SCALE = 0.15
SH_BITS = (5, 4)  # bits kept of degree-1 coefficients and of higher ones
MAX_FRACTIONAL_BITS = 12  # ~0.25 mm steps, as Niantic writes
SQRT1_2 = math.sqrt(0.5)
MAX_EXTENSION_BYTES = 1 << 20  # of extension records after the columns of versions 2 and 3


@dataclass(frozen=True)
class Header:
    version: int
    count: int
    sh_degree: int
    fractional_bits: int
    flags: int


@dataclass(frozen=True)
class Extras:
    """What an SPZ holds beside the model and its axes: the antialiasing flag and the other extension records
    (type, payload), in the file's order."""
    antialiased: bool = False
    records: tuple[tuple[int, bytes], ...] = ()


def is_spz(head: bytes) -> bool:
    return head[:2] == GZIP_MAGIC or head[:4] == NGSP_MAGIC


def check_axes(axes: str) -> str:
    if axes not in AXES:
        raise SplatwrightError(f"SPZ axes {axes!r}: choose {' or '.join(AXES)}")
    return axes


def decode(data: bytes, name: str = "the SPZ", budget: Budget = Budget(), axes: str = "ply") -> Gaussians:
    """The model of an SPZ file's bytes, inflated against `budget` (budget.py): the counts its header declares
    are checked before its columns are inflated, and no stream inflates past them. A file without a
    coordinate-system record is read in `axes` (AXES)."""
    unstated = AXES[check_axes(axes)]
    header, streams, records = _read(data, name, budget)
    system = _coordinate_system(records, name) or unstated
    return gaussians_from_columns(_flipped(_unpack(header, streams), _signs_to_ours(system)), name, budget)


def extras(data: bytes, name: str = "the SPZ", budget: Budget = Budget()) -> Extras:
    """The antialiasing flag and the extension records but the coordinate system's of an SPZ file's bytes."""
    header, _, records = _read(data, name, budget)
    return Extras(bool(header.flags & FLAG_ANTIALIASED),
                  tuple((kind, payload) for kind, payload in records if kind != COORDINATE_SYSTEM_RECORD))


def encode(g: Gaussians, version: int = VERSIONS[0], kept: Extras = Extras()) -> bytes:
    """SPZ bytes of `g` (SH degree 0 to 3) in RUB: version 4 (zstd) saying so in its coordinate-system record,
    with `kept`'s flag and records after it; or version 3 (gzip), which has neither."""
    if version not in VERSIONS:
        raise SplatwrightError(f"SPZ version {version}: Splatwright writes versions {' and '.join(map(str, VERSIONS))}")
    c = _flipped(columns(g), _signs_to_ours(RUB))  # the flip is its own inverse
    n, degree = len(c["means"]), sh_degree_of(c["sh_rest"])
    if n == 0:
        raise SplatwrightError("SPZ: no splats to write")
    fractional_bits = _fractional_bits(c["means"])
    fixed = round_half_away(c["means"].astype(np.float64) * (1 << fractional_bits)).astype(np.int32) & 0xFFFFFF
    sh_bits = np.full(c["sh_rest"].shape[1], SH_BITS[1])
    sh_bits[:3] = SH_BITS[0]
    body = [
        fixed.astype("<u4").view(np.uint8).reshape(-1, 4)[:, :3],
        to_byte(sigmoid(c["opacity_logits"]) * 255.0),
        to_byte(c["sh_dc"] * (COLOR_SCALE * 255.0) + 127.5),
        to_byte((c["log_scales"] + 10.0) * 16.0),
        _pack_smallest_three(c["quats"]),
        _quantize_sh(c["sh_rest"], sh_bits[None, :, None]),
    ]
    streams = [np.ascontiguousarray(a).tobytes() for a in body]
    if version == 3:
        header = LEGACY_HEADER.pack(MAGIC, version, n, degree, fractional_bits, 0, 0)
        return gzip.compress(header + b"".join(streams), compresslevel=6, mtime=0)
    if zstandard is None:
        raise SplatwrightError("SPZ version 4 is zstd-compressed; install the zstandard package (pip install "
                               "zstandard), or write version 3")
    records = b"".join(struct.pack("<II", kind, len(payload)) + payload
                       for kind, payload in ((COORDINATE_SYSTEM_RECORD, struct.pack("<I", RUB)), *kept.records))
    packed = [zstandard.ZstdCompressor(level=ZSTD_LEVEL).compress(s) for s in streams if s]
    flags = FLAG_EXTENSIONS | (FLAG_ANTIALIASED if kept.antialiased else 0)
    toc = NGSP_HEADER.size + len(records)
    header = NGSP_HEADER.pack(MAGIC, version, n, degree, fractional_bits, flags, len(packed), toc)
    table = b"".join(struct.pack("<QQ", len(p), len(s)) for p, s in zip(packed, filter(None, streams)))
    return header + records + table + b"".join(packed)


# --- reading ----------------------------------------------------------------------------------------------

def _read(data: bytes, name: str, budget: Budget) -> tuple[Header, list, list[tuple[int, bytes]]]:
    if data[:4] == NGSP_MAGIC:
        return _read_ngsp(data, name, budget)
    if data[:2] == GZIP_MAGIC:
        return _read_legacy(data, name, budget)
    raise SplatwrightError(f"{name}: not an SPZ file (it starts neither with gzip's bytes 1f 8b nor with 'NGSP')")


def _check_header(h: Header, name: str) -> Header:
    if h.version == 1:
        raise SplatwrightError(f"{name}: SPZ version 1 (float16 positions) is not supported; versions 2-4 are")
    if h.version not in (2, 3, 4):
        raise SplatwrightError(f"{name}: SPZ version {h.version} is not supported; versions 2-4 are")
    if h.count == 0:
        raise SplatwrightError(f"{name}: the SPZ holds no splats")
    if h.sh_degree > 3:
        raise SplatwrightError(f"{name}: SH degree {h.sh_degree}; Splatwright reads SH degrees 0-3")
    if h.fractional_bits > 23:
        raise SplatwrightError(f"{name}: {h.fractional_bits} fractional bits in 24-bit positions")
    return h


def _column_sizes(h: Header) -> list[int]:
    """Bytes of positions, alphas, colours, scales, rotations and SH."""
    n, dim = h.count, (h.sh_degree + 1) ** 2 - 1
    return [9 * n, n, 3 * n, 3 * n, (3 if h.version == 2 else 4) * n, 3 * dim * n]


def _read_legacy(data: bytes, name: str, budget: Budget) -> tuple[Header, list, list[tuple[int, bytes]]]:
    stream = Inflater(data, name, "SPZ's gzip stream")
    raw = stream.read(LEGACY_HEADER.size)
    if len(raw) < LEGACY_HEADER.size:
        raise SplatwrightError(f"{name}: truncated SPZ: {len(raw)} bytes, shorter than the 16-byte header")
    magic, version, count, degree, bits, flags, _ = LEGACY_HEADER.unpack_from(raw)
    if magic != MAGIC:
        raise SplatwrightError(f"{name}: gzip data that is not SPZ (magic {magic:#010x}, expected {MAGIC:#010x})")
    if version == 4:
        raise SplatwrightError(f"{name}: SPZ version 4 inside gzip; version 4 files start with 'NGSP'")
    header = _check_header(Header(version, count, degree, bits, flags), name)
    sizes = _column_sizes(header)
    need = budget.decoded_bytes(count, sum(sizes) // count, len(data), name)
    body = stream.read(need)
    if len(body) < need:
        raise SplatwrightError(f"{name}: truncated SPZ: {count} splats need {need} bytes of columns, "
                               f"the file holds {len(body)}")
    rest = stream.read(MAX_EXTENSION_BYTES + 1)  # what is left: the stream's end is checked unless it is too much
    extra = f"more than {MAX_EXTENSION_BYTES}" if len(rest) > MAX_EXTENSION_BYTES else str(len(rest))
    if rest and not flags & FLAG_EXTENSIONS:
        raise SplatwrightError(f"{name}: {extra} bytes after the columns of {count} splats; "
                               "the splat count does not match the data")
    if len(rest) > MAX_EXTENSION_BYTES:
        raise SplatwrightError(f"{name}: {extra} bytes of extension records after the columns of {count} splats")
    ends = np.cumsum([0] + sizes)
    view = memoryview(body)
    streams = [view[a:b] for a, b in zip(ends[:-1], ends[1:])]
    return header, streams, _records(bytes(rest), name) if flags & FLAG_EXTENSIONS else []


def _read_ngsp(data: bytes, name: str, budget: Budget) -> tuple[Header, list, list[tuple[int, bytes]]]:
    if len(data) < NGSP_HEADER.size:
        raise SplatwrightError(f"{name}: truncated SPZ: {len(data)} bytes, shorter than the 32-byte header")
    magic, version, count, degree, bits, flags, n_streams, toc = NGSP_HEADER.unpack_from(data)
    if version != 4:
        raise SplatwrightError(f"{name}: an 'NGSP' header with version {version}; it belongs to version 4")
    header = _check_header(Header(version, count, degree, bits, flags), name)
    sizes = _column_sizes(header)
    stored = [s for s in sizes if s]  # empty columns (no SH) are not stored
    if n_streams != len(stored):
        raise SplatwrightError(f"{name}: {n_streams} streams where SH degree {degree} has {len(stored)} columns")
    start = toc + 16 * n_streams
    if toc < NGSP_HEADER.size or start > len(data):
        raise SplatwrightError(f"{name}: truncated SPZ: its table of contents ends past the file's end")
    if not zstd_available():
        raise SplatwrightError(f"{name}: SPZ version 4 is zstd-compressed; install the zstandard package "
                               "(pip install zstandard) to read it")
    budget.decoded_bytes(count, sum(sizes) // count, len(data), name)
    table = np.frombuffer(data, "<u8", 2 * n_streams, toc).reshape(-1, 2)
    streams, offset = [], start
    for i, ((packed, unpacked), size) in enumerate(zip(table.tolist(), stored)):
        if unpacked != size:
            raise SplatwrightError(f"{name}: stream {i} unpacks to {unpacked} bytes but {count} splats need {size}; "
                                   "the counts do not match")
        if offset + packed > len(data):
            raise SplatwrightError(f"{name}: truncated SPZ: stream {i} ends past the file's end")
        zstd = Inflater(memoryview(data)[offset:offset + packed], name, f"stream {i}", "zstd")
        column = zstd.read(size)
        if len(column) != size or not zstd.at_end():
            raise SplatwrightError(f"{name}: stream {i} unpacks to {'more than ' if len(column) == size else ''}"
                                   f"{len(column)} bytes, expected {size}")
        streams.append(column)
        offset += packed
    if offset != len(data):
        raise SplatwrightError(f"{name}: {len(data) - offset} bytes after the last stream")
    streams += [b""] * (len(sizes) - len(streams))
    return header, streams, _records(data[NGSP_HEADER.size:toc], name) if flags & FLAG_EXTENSIONS else []


def _records(data: bytes, name: str) -> list[tuple[int, bytes]]:
    """Extension records (type, payload), in order."""
    records, offset = [], 0
    while offset < len(data):
        if offset + 8 > len(data):
            raise SplatwrightError(f"{name}: truncated SPZ extension record")
        kind, length = struct.unpack_from("<II", data, offset)
        if offset + 8 + length > len(data):
            raise SplatwrightError(f"{name}: truncated SPZ extension record {kind:#010x}")
        records.append((kind, bytes(data[offset + 8:offset + 8 + length])))
        offset += 8 + length
    return records


def _coordinate_system(records: list[tuple[int, bytes]], name: str) -> int:
    """The system the coordinate-system record names; 0 where there is none or it says "unspecified"."""
    payload = dict(records).get(COORDINATE_SYSTEM_RECORD)
    if payload is None:
        return 0
    if len(payload) != 4:
        raise SplatwrightError(f"{name}: coordinate-system record of {len(payload)} bytes, expected 4")
    system = int.from_bytes(payload, "little")
    if system and not 1 <= system <= 8:
        raise SplatwrightError(f"{name}: stored in coordinate system {system}, one that swaps axes; "
                               "Splatwright reads the systems 1-8 (axis flips only)")
    return system


def _unpack(h: Header, streams: list[bytes]) -> dict[str, np.ndarray]:
    """The columns as stored (in the file's axes)."""
    positions, alphas, colors, scales, rotations, sh = (np.frombuffer(s, np.uint8) for s in streams)
    n = h.count
    p = positions.reshape(3 * n, 3).astype(np.int32)
    fixed = p[:, 0] | p[:, 1] << 8 | p[:, 2] << 16
    fixed = (fixed ^ 0x800000) - 0x800000  # sign-extend 24 bits
    return {
        "means": (fixed.reshape(n, 3) / float(1 << h.fractional_bits)).astype(np.float32),
        "log_scales": (scales.reshape(n, 3) / 16.0 - 10.0).astype(np.float32),
        "quats": _unpack_first_three(rotations.reshape(n, 3)) if h.version == 2 else _unpack_smallest_three(
            rotations.view("<u4")),
        "opacity_logits": byte_logit(alphas),
        "sh_dc": ((colors.reshape(n, 3) / 255.0 - 0.5) / COLOR_SCALE).astype(np.float32),
        "sh_rest": ((sh.reshape(n, -1, 3).astype(np.float32) - 128.0) / 128.0),
    }


def _unpack_first_three(r: np.ndarray) -> np.ndarray:
    xyz = r / 127.5 - 1.0
    w = np.sqrt(np.maximum(0.0, 1.0 - (xyz ** 2).sum(axis=1)))
    return unit_quats(np.concatenate([w[:, None], xyz], axis=1))


def _unpack_smallest_three(comp: np.ndarray) -> np.ndarray:
    largest = (comp >> np.uint32(30)).astype(np.intp)
    fields = np.stack([unpack_bits(comp, shift, 10) for shift in (20, 10, 0)], axis=1)  # ascending index order
    values = (fields & 511) * (SQRT1_2 / 511) * np.where(fields >> 9 & 1, -1.0, 1.0)
    rows = np.arange(len(comp))
    q = np.zeros((len(comp), 4))
    q[rows[:, None], OTHER_COMPONENTS[largest]] = values
    q[rows, largest] = np.sqrt(np.maximum(0.0, 1.0 - (values ** 2).sum(axis=1)))
    return unit_quats(q[:, [3, 0, 1, 2]])  # x, y, z, w -> w, x, y, z


# --- axes -------------------------------------------------------------------------------------------------

def _signs_to_ours(system: int) -> tuple[int, int, int]:
    """Axis signs taking coordinate system `system` (1..8) to ours, RDF."""
    bits = system - 1
    return (1 if bits & 1 else -1), (-1 if bits & 2 else 1), (1 if bits & 4 else -1)


def _flipped(c: dict[str, np.ndarray], signs: tuple[int, int, int]) -> dict[str, np.ndarray]:
    """The model with its axes multiplied by `signs`: positions flip, rotations are conjugated by the flip and
    each SH coefficient takes the sign of its basis function under it."""
    sx, sy, sz = signs
    sh_signs = np.array([sy, sz, sx,  # degree 1: y, z, x
                         sx * sy, sy * sz, 1, sx * sz, 1,  # degree 2: xy, yz, 3z^2 - 1, xz, x^2 - y^2
                         sy, sx * sy * sz, sy, sz, sx, sz, sx], np.float32)  # degree 3
    return {**c,
            "means": c["means"] * np.array(signs, np.float32),
            "quats": c["quats"] * np.array([1, sy * sz, sx * sz, sx * sy], np.float32),
            "sh_rest": c["sh_rest"] * sh_signs[:c["sh_rest"].shape[1], None]}


# --- writing ----------------------------------------------------------------------------------------------

def _fractional_bits(means: np.ndarray) -> int:
    """Niantic's 12 fractional bits, fewer where positions would not fit 24 bits."""
    extent = float(np.abs(means).max(initial=0.0))
    for bits in range(MAX_FRACTIONAL_BITS, -1, -1):
        if extent * (1 << bits) < (1 << 23) - 1:
            return bits
    raise SplatwrightError(f"SPZ: positions reach {extent:.0f}, beyond the format's 24-bit range (+-8388607)")


def _pack_smallest_three(q_wxyz: np.ndarray) -> np.ndarray:
    q = q_wxyz[:, [1, 2, 3, 0]].astype(np.float64)  # SPZ's order x, y, z, w
    rows = np.arange(len(q))
    largest = np.argmax(np.abs(q), axis=1)
    others = q[rows[:, None], OTHER_COMPONENTS[largest]]
    magnitude = np.minimum(np.floor(511 * np.abs(others) / SQRT1_2 + 0.5), 511).astype(np.uint32)
    negative = ((others < 0) ^ (q[rows, largest] < 0)[:, None]).astype(np.uint32)  # -q is the same rotation
    fields = negative << np.uint32(9) | magnitude
    comp = (largest.astype(np.uint32) << np.uint32(30) | fields[:, 0] << np.uint32(20)
            | fields[:, 1] << np.uint32(10) | fields[:, 2])
    return comp.astype("<u4").view(np.uint8)


def _quantize_sh(x: np.ndarray, bits: np.ndarray) -> np.ndarray:
    bucket = 2.0 ** (8 - bits)
    q = round_half_away(x.astype(np.float64) * 128.0) + 128.0
    return np.clip(np.floor((q + bucket // 2) / bucket) * bucket, 0, 255).astype(np.uint8)


def notes(version: int, kept: Extras = Extras()) -> list[str]:
    """What a write of `version` leaves out: version 3 has no place for the axes or for `kept`."""
    if version != 3:
        return []
    said = ["SPZ version 3 does not say its axes: it holds RUB, as the specification says and Niantic's tools read "
            "it; read it back with --spz-axes rub (SuperSplat and splat-transform show it turned 180 degrees about x)"]
    if kept.records or kept.antialiased:
        what = ([f"{len(kept.records)} extension record(s)"] if kept.records else []) + (
            ["the antialiasing flag"] if kept.antialiased else [])
        said.append(f"the source's {' and '.join(what)} are left out: this writer's version 3 carries none "
                    "(version 4 keeps them)")
    return said
