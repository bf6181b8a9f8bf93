"""Mark Kellogg's `.ksplat`, the format of the GaussianSplats3D viewer (@mkkellogg/gaussian-splats-3d), read only.
Its specification is the viewer's source: src/loaders/SplatBuffer.js (github.com/mkkellogg/GaussianSplats3D),
version 0.1 of the format, read here as the viewer's release 0.4.7 writes it.

A 4096-byte header (little-endian): uint8 major 0 and minor 1 version, 2 unused bytes, uint32 most sections,
sections, most splats, splats; at byte 20 a uint16 compression level (0, 1 or 2); at byte 24 the scene centre
(float32 x 3), then the range of 8-bit SH (float32 min, max; 0 meaning -1.5 and 1.5). Then a 1024-byte header
per section: uint32 splats, most splats, bucket size, bucket count; float32 bucket block size; at byte 20 a
uint16 bucket's bytes; at byte 24 uint32 position range (0 meaning the level's: 1 or 32767), storage bytes,
full buckets, partly filled buckets; at byte 40 a uint16 SH degree (0-2). The sections' data follow the
headers, each: uint32 lengths of the partly filled buckets, float32 x 3 centres of the buckets (levels 1 and 2),
then per splat (its most splats, in bucket order):
- position: level 0 float32 x 3; levels 1 and 2 uint16 x 3, (v - range) x (block size / 2 / range) + the
  centre of the bucket holding the splat (buckets hold `bucket size` splats, then the partly filled ones'
  lengths): steps of block size / 65534, 0.076 mm at the default 5 m blocks;
- scale (linear, not log), then rotation (w, x, y, z, normalised on reading): float32 at level 0, float16
  above (11 significant bits: relative steps of 1/2048);
- colour RGBA uint8: RGB floor((0.5 + SH_C0 x SH DC) x 255), A floor(sigmoid(opacity) x 255), clamped to
  [0, 255]: values fall up to 1/255 low (read back at the byte's value);
- SH beyond DC, per degree channel-major (degree 1: R1 R2 R3 G1 .. B3; degree 2: R4 .. R8 G4 .. B8): float32,
  float16, or at level 2 uint8 floor((v - min) / (max - min) x 255) over the header's range.
Axes are the PLY's, as the viewer reads a PLY, so nothing flips. No magic: a file is taken for a .ksplat by its
header (version 0.1, a known compression level, sections that add up to the file's size)."""
from __future__ import annotations

import struct

import numpy as np

from blender_addon.core.errors import SplatwrightError
from ..gaussians import Gaussians
from ..sh import SH_C0
from .budget import Budget
from .common import byte_logit, gaussians_from_columns

HEADER_BYTES = 4096
SECTION_HEADER_BYTES = 1024
HEADER = struct.Struct("<BBxxIIIIH2x3fff")  # version, most sections, sections, most splats, splats, level, ...
SECTION = struct.Struct("<IIIIfH2xIIIIH")  # splats, most splats, bucket size, buckets, block size, bucket bytes, ...
VERSION = (0, 1)
DEFAULT_SH_RANGE = 1.5  # half of the 8-bit SH range where the header gives none
POSITION_RANGE = {0: 1, 1: 32767, 2: 32767}  # by compression level
BUCKET_BYTES = 12  # a bucket's centre, float32 x 3
MAX_SH_DEGREE = 2
SH_FLOATS = {0: 0, 1: 9, 2: 24}  # SH values beyond DC per splat, by degree


def _splat_dtype(level: int, degree: int) -> np.dtype:
    real = "<f4" if level == 0 else "<f2"
    position = "<f4" if level == 0 else "<u2"
    sh = "<f4" if level == 0 else "<f2" if level == 1 else "u1"
    return np.dtype([("position", position, 3), ("scale", real, 3), ("rotation", real, 4), ("rgba", "u1", 4),
                     ("sh", sh, SH_FLOATS[degree])])


def is_ksplat(head: bytes) -> bool:
    """Whether a file's first bytes are a .ksplat header (version 0.1, a known compression level, sections)."""
    if len(head) < HEADER.size:
        return False
    major, minor, most_sections, _, _, _, level = HEADER.unpack_from(head)[:7]
    return (major, minor) == VERSION and level in POSITION_RANGE and 0 < most_sections <= (1 << 16)


def decode(data: bytes, name: str = "the .ksplat", budget: Budget = Budget()) -> Gaussians:
    """The model of a .ksplat file's bytes, of at most `budget`'s splats; every section's declared size is
    checked against the file before it is read."""
    if len(data) < HEADER_BYTES or not is_ksplat(data):
        raise SplatwrightError(f"{name}: not a .ksplat file (no version 0.1 header of {HEADER_BYTES} bytes)")
    (_, _, most_sections, _, most_splats, _, level, *_, sh_min, sh_max) = HEADER.unpack_from(data)
    budget.check_count(most_splats, name)
    sh_min, sh_max = sh_min or -DEFAULT_SH_RANGE, sh_max or DEFAULT_SH_RANGE  # as the viewer reads them
    base = HEADER_BYTES + most_sections * SECTION_HEADER_BYTES
    if base > len(data):
        raise SplatwrightError(f"{name}: truncated .ksplat: {most_sections} section headers end past the file's end")
    parts, total = [], 0
    for i in range(most_sections):
        (_, splats, bucket_size, buckets, block_size, bucket_bytes, position_range, _, full, partial,
         degree) = SECTION.unpack_from(data, HEADER_BYTES + i * SECTION_HEADER_BYTES)
        if degree > MAX_SH_DEGREE:
            raise SplatwrightError(f"{name}: section {i} has SH degree {degree}; a .ksplat holds degrees 0-2")
        total += splats
        budget.check_count(total, name)
        dtype = _splat_dtype(level, degree)
        buckets_at = base + 4 * partial
        data_at = buckets_at + bucket_bytes * buckets
        end = data_at + dtype.itemsize * splats
        if end > len(data):
            raise SplatwrightError(f"{name}: truncated .ksplat: section {i}'s {splats} splats end past the file's end")
        rows = np.frombuffer(data, dtype, splats, data_at)
        means = rows["position"].astype(np.float32)
        if level:
            if bucket_bytes != BUCKET_BYTES or full + partial != buckets or not block_size > 0:
                raise SplatwrightError(f"{name}: section {i}'s buckets are malformed ({buckets} buckets of "
                                       f"{bucket_bytes} bytes, {full} full and {partial} partly filled)")
            lengths = np.concatenate([np.full(full, bucket_size, np.int64),
                                      np.frombuffer(data, "<u4", partial, base).astype(np.int64)])
            if lengths.sum() != splats:
                raise SplatwrightError(f"{name}: section {i}'s buckets hold {lengths.sum()} splats, its header "
                                       f"says {splats}")
            centres = np.frombuffer(data, "<f4", 3 * buckets, buckets_at).reshape(-1, 3)
            r = position_range or POSITION_RANGE[level]
            means = (means - r) * (block_size / 2 / r) + np.repeat(centres, lengths, axis=0)
        sh = rows["sh"].astype(np.float32)
        if level == 2:
            sh = sh / 255 * (sh_max - sh_min) + sh_min
        bands = [sh[:, 9 * (d > 1):SH_FLOATS[d]].reshape(splats, 3, -1).transpose(0, 2, 1)
                 for d in range(1, degree + 1)]  # each degree channel-major
        parts.append((means, rows["scale"].astype(np.float64), rows["rotation"].astype(np.float32), rows["rgba"],
                      np.concatenate([np.zeros((splats, 0, 3), np.float32), *bands], axis=1)))
        base = end
    if base != len(data):
        raise SplatwrightError(f"{name}: {len(data) - base} bytes after the last .ksplat section")
    degree = max(p[4].shape[1] for p in parts)
    means, scale, quats, rgba, _ = (np.concatenate([p[k] for p in parts]) for k in range(5))
    sh_rest = np.concatenate([np.pad(p[4], ((0, 0), (0, degree - p[4].shape[1]), (0, 0))) for p in parts])
    with np.errstate(invalid="ignore", divide="ignore"):
        bad = ~(np.isfinite(scale) & (scale > 0)).all(axis=1)
        if bad.any():
            raise SplatwrightError(f"{name}: {int(bad.sum())} of {len(scale)} splats have NaN, infinite or "
                                   f"non-positive scales (first at splat {int(np.argmax(bad))})")
        log_scales = np.log(scale).astype(np.float32)
    return gaussians_from_columns({
        "means": means.astype(np.float32),
        "log_scales": log_scales,
        "quats": quats,
        "opacity_logits": byte_logit(rgba[:, 3]),
        "sh_dc": ((rgba[:, :3] / 255.0 - 0.5) / SH_C0).astype(np.float32),
        "sh_rest": sh_rest.astype(np.float32),
    }, name, budget)
