"""PlayCanvas's SOG ("spatially ordered Gaussians", SuperSplat's and splat-transform's export), version 2:
https://developer.playcanvas.com/user-manual/gaussian-splatting/formats/sog/

A SOG is `meta.json` and 8-bit RGBA images (lossless WebP) in which texel i (x = i % W, y = i // W, rows from the
top) holds splat i; either files side by side in a folder (named by its meta.json), or the same files at the root
of a zip, the bundled `.sog`. Axes are the official 3DGS PLY's: nothing flips. Per attribute:
- positions: each coordinate v as l = sign(v) ln(1 + |v|), stored in 16 bits (means_l.webp's RGB the low byte,
  means_u.webp's the high byte) of its place between meta's means.mins and means.maxs (of l, per axis): within
  half a step, (maxs - mins) / 131070 in l, so a coordinate is within that times (1 + |v|);
- scales: each log scale is one entry of a codebook of up to 256 (scales.codebook), its index in scales.webp's RGB;
  we write a 1D k-means codebook of all three axes' log scales;
- rotations: quats.webp's RGB hold the components of the unit quaternion (w, x, y, z) other than the largest in
  magnitude, in that order, the quaternion negated where the largest is negative, as byte (c sqrt(2) / 2 + 0.5) x
  255; its alpha is 252 plus the index of the largest (within 0.5 / 255 x sqrt(2) / 2 ~ 0.0028 a component);
- colour: sh0.webp's RGB index a codebook of up to 256 SH DC coefficients (sh0.codebook; ours 1D k-means), its
  alpha is sigmoid(opacity) x 255 (nearest byte, within 0.5 / 255);
- SH beyond DC (optional): shN_labels.webp's R + 256 G names an entry of a palette of at most 65536 (shN.count);
  entry e is row e // 64, texels (e % 64) x K .. + K - 1 of shN_centroids.webp (64 K texels wide for K
  coefficients a colour), whose RGB index a codebook of up to 256 coefficients (shN.codebook). We write each splat
  as its own entry where there are at most 65536 (then the codebook is the only loss), and otherwise the means of
  65536 cells that split the coefficients at their median along their widest dimension, 16 times over.
Values are rounded to nearest and clamped. We write splats in Morton order (compressed_ply.morton_columns), images of
W = 4 ceil(sqrt(N) / 4) texels by H = 4 ceil(N / W / 4), as splat-transform does. Version 1 (meta.json without a
version, per-channel ranges) is not read.
"""
from __future__ import annotations

import io
import json
import math
import warnings
import zipfile

import numpy as np
from PIL import Image

from blender_addon.core.errors import SplatwrightError
from ..gaussians import Gaussians
from .budget import MAX_RATIO, SMALL_FILE_BYTES, Budget
from .common import (OTHER_COMPONENTS, byte_logit, gaussians_from_columns, round_half_away, sh_degree_of,
                     sigmoid, to_byte)
from .compressed_ply import morton_columns

VERSION = 2
META = "meta.json"
ZIP_MAGIC = b"PK\x03\x04"
CODEBOOK = 256  # entries of a codebook at most: a byte indexes it
PALETTE = 65536  # SH palette entries at most: 16 bits index it
PALETTE_ROW = 64  # palette entries a row of shN_centroids.webp
QUAT_TAG = 252  # quats.webp's alpha: this plus the index of the largest component
COEFFS = {1: 3, 2: 8, 3: 15}  # SH coefficients a colour beyond DC, by degree
MAX_META_BYTES = 1 << 20  # meta.json holds counts and three or four codebooks: a few tens of KB
SPARE_TEXELS = 1 << 20  # texels an image may have beyond twice the splat count (a writer's own layout)
IMAGE_FORMATS = ("WEBP", "PNG")
SQRT2 = math.sqrt(2.0)
FILES = {"means": ["means_l.webp", "means_u.webp"], "scales": ["scales.webp"], "quats": ["quats.webp"],
         "sh0": ["sh0.webp"], "shN": ["shN_centroids.webp", "shN_labels.webp"]}


def is_bundle(data: bytes) -> bool:
    """Whether `data` is a bundled SOG: a zip with meta.json at its root."""
    if data[:4] != ZIP_MAGIC:
        return False
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            return META in z.namelist()
    except (zipfile.BadZipFile, OSError, ValueError):
        return False


def decode(data: bytes, name: str = "the SOG", budget: Budget = Budget()) -> Gaussians:
    """The model of a bundled SOG's bytes (a folder's files are bundled first: core/bundles.py), read against
    `budget` (budget.py): meta.json's splat count and each image's declared size are checked before any image is
    decoded."""
    if data[:4] != ZIP_MAGIC:
        what = ("a SOG's meta.json alone; its images are files beside it: read it from its folder, or bundle the "
                "folder as a .sog" if data.lstrip()[:1] == b"{" else "not a SOG (neither a zip nor a meta.json)")
        raise SplatwrightError(f"{name}: {what}")
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            return _decode(z, len(data), name, budget)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, NotImplementedError, RuntimeError) as e:
        raise SplatwrightError(f"{name}: unreadable SOG zip ({e})") from None


def encode(g: Gaussians) -> bytes:
    """The bundled SOG (version 2) of `g`: a zip of meta.json and its images (stored: WebP is compressed)."""
    members = encode_members(g)
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as z:
        for member, content in members.items():
            z.writestr(zipfile.ZipInfo(member, date_time=(1980, 1, 1, 0, 0, 0)), content)
    return out.getvalue()


def encode_members(g: Gaussians) -> dict[str, bytes]:
    """The files of `g`'s SOG by name, meta.json last (a folder written in this order has its meta.json only once
    its images are there)."""
    c = morton_columns(g, "SOG")
    n = len(c["means"])
    width = 4 * math.ceil(math.sqrt(n) / 4)
    height = 4 * math.ceil(n / width / 4)
    images: dict[str, bytes] = {}

    def image(file: str, rgba: np.ndarray, size: tuple[int, int] = (width, height)) -> None:
        texels = np.zeros((size[0] * size[1], 4), np.uint8)
        texels[:, 3] = 255
        texels[:len(rgba), :rgba.shape[1]] = rgba
        buffer = io.BytesIO()
        # exact: keep the RGB of texels whose alpha (an opacity) is 0, which WebP would otherwise discard
        Image.fromarray(texels.reshape(size[1], size[0], 4), "RGBA").save(buffer, "WEBP", lossless=True, exact=True)
        images[file] = buffer.getvalue()

    log = np.sign(c["means"]) * np.log1p(np.abs(c["means"].astype(np.float64)))
    lo, hi = log.min(axis=0), log.max(axis=0)
    span = hi - lo
    place = np.where(span > 0, (log - lo) / np.where(span > 0, span, 1.0), 0.0)
    fixed = np.clip(round_half_away(place * 65535.0), 0, 65535).astype(np.uint16)
    image(FILES["means"][0], (fixed & 0xFF).astype(np.uint8))
    image(FILES["means"][1], (fixed >> 8).astype(np.uint8))

    q = c["quats"].astype(np.float64)
    rows = np.arange(n)
    largest = np.argmax(np.abs(q), axis=1)
    q *= np.where(q[rows, largest] < 0, -1.0, 1.0)[:, None]
    others = q[rows[:, None], OTHER_COMPONENTS[largest]] * SQRT2
    image(FILES["quats"][0], np.concatenate([to_byte((others * 0.5 + 0.5) * 255.0),
                                             (QUAT_TAG + largest).astype(np.uint8)[:, None]], axis=1))

    scale_book, scale_index = codebook(c["log_scales"])
    image(FILES["scales"][0], scale_index)
    color_book, color_index = codebook(c["sh_dc"])
    image(FILES["sh0"][0], np.concatenate([color_index, to_byte(sigmoid(c["opacity_logits"]) * 255.0)[:, None]],
                                          axis=1))
    meta = {"version": VERSION, "asset": {"generator": "Splatwright"}, "count": n,
            "means": {"mins": lo.tolist(), "maxs": hi.tolist(), "files": FILES["means"]},
            "scales": {"codebook": scale_book, "files": FILES["scales"]},
            "quats": {"files": FILES["quats"]},
            "sh0": {"codebook": color_book, "files": FILES["sh0"]}}
    degree = sh_degree_of(c["sh_rest"])
    if degree:
        k = COEFFS[degree]
        entries, labels = palette(c["sh_rest"].reshape(n, -1))
        sh_book, sh_index = codebook(entries)  # (entries, K x 3): coefficient-major, the colour inner
        rows_needed = math.ceil(len(entries) / PALETTE_ROW)
        texels = np.zeros((rows_needed * PALETTE_ROW, k, 3), np.uint8)
        texels[:len(entries)] = sh_index.reshape(-1, k, 3)
        image(FILES["shN"][0], texels.reshape(-1, 3), (PALETTE_ROW * k, rows_needed))
        image(FILES["shN"][1], np.stack([labels & 0xFF, labels >> 8], axis=1).astype(np.uint8))
        meta["shN"] = {"count": len(entries), "bands": degree, "codebook": sh_book, "files": FILES["shN"]}
    return {**images, META: json.dumps(meta).encode()}


def codebook(values: np.ndarray, size: int = CODEBOOK, rounds: int = 16) -> tuple[list[float], np.ndarray]:
    """A codebook of at most `size` float32 values for all of `values` (1D k-means from their quantiles; their
    distinct values where there are no more than `size`), and each value's nearest entry's index, as uint8 in
    `values`' shape."""
    flat = values.astype(np.float32).ravel()
    distinct = np.unique(flat)
    if len(distinct) <= size:
        book = distinct.astype(np.float64)
    else:
        ordered = np.sort(flat).astype(np.float64)
        sums = np.concatenate([[0.0], np.cumsum(ordered)])
        book = np.unique(ordered[np.linspace(0, len(ordered) - 1, size).astype(np.int64)])
        for _ in range(rounds):
            ends = np.searchsorted(ordered, (book[1:] + book[:-1]) / 2)  # each entry's values: between midpoints
            starts, ends = np.concatenate([[0], ends]), np.concatenate([ends, [len(ordered)]])
            filled = ends > starts
            book = np.unique(np.where(filled, (sums[ends] - sums[starts]) / np.maximum(ends - starts, 1), book))
        book = np.unique(book.astype(np.float32)).astype(np.float64)
    index = np.clip(np.searchsorted((book[1:] + book[:-1]) / 2, flat), 0, len(book) - 1)
    return book.astype(np.float32).tolist(), index.astype(np.uint8).reshape(values.shape)


def palette(rest: np.ndarray, size: int = PALETTE) -> tuple[np.ndarray, np.ndarray]:
    """At most `size` entries for the rows of `rest` (N, D) and each row's entry: the rows themselves where there
    are no more than `size`; else the means of cells made by splitting every cell of two rows or more at its
    median along the dimension in which it varies most, log2(size) times."""
    n = len(rest)
    if n <= size:
        return rest.astype(np.float32), np.arange(n)
    order = np.arange(n)
    starts = np.array([0])
    for _ in range(int(math.log2(size))):
        x = rest[order].astype(np.float64)
        counts = np.diff(np.concatenate([starts, [n]]))
        cell = np.repeat(np.arange(len(starts)), counts)
        mean = np.add.reduceat(x, starts) / counts[:, None]
        widest = np.argmax(np.add.reduceat(x * x, starts) / counts[:, None] - mean ** 2, axis=1)
        order = order[np.lexsort((x[np.arange(n), widest[cell]], cell))]
        halves = starts[counts > 1] + counts[counts > 1] // 2
        starts = np.sort(np.concatenate([starts, halves]))
    counts = np.diff(np.concatenate([starts, [n]]))
    labels = np.empty(n, np.int64)
    labels[order] = np.repeat(np.arange(len(starts)), counts)
    entries = np.add.reduceat(rest[order].astype(np.float64), starts) / counts[:, None]
    return entries.astype(np.float32), labels


# --- reading ----------------------------------------------------------------------------------------------

def _decode(z: zipfile.ZipFile, stored: int, name: str, budget: Budget) -> Gaussians:
    cap = stored * MAX_RATIO + SMALL_FILE_BYTES  # the most one member may plausibly inflate to

    def member(file: str, limit: int) -> bytes:
        try:
            info = z.getinfo(file)
        except KeyError:
            raise SplatwrightError(f"{name}: the SOG has no {file}") from None
        if info.file_size > limit:
            raise SplatwrightError(f"{name}: {file} declares {info.file_size:,} bytes, more than a SOG's {file} "
                                   f"can hold ({limit:,})")
        with z.open(info) as f:
            content = f.read(limit + 1)
        if len(content) > limit:
            raise SplatwrightError(f"{name}: {file} inflates beyond {limit:,} bytes")
        return content

    meta = _meta(member(META, MAX_META_BYTES), name)
    n = meta["count"]
    degree = meta["shN"]["bands"] if "shN" in meta else 0
    budget.decoded_bytes(n, 4 * (6 if degree else 5), stored, name)  # the per-splat images' texels

    def texels(section: str, i: int, channels: int, least: int = n, width: int | None = None,
               most_rows: int | None = None) -> np.ndarray:
        """The first `least` texels of an image as (least, channels) uint8, its declared size checked first."""
        file = meta[section]["files"][i]
        content = member(file, cap)
        try:
            with warnings.catch_warnings():  # Pillow's own limit: an error, before ours (far below it) is checked
                warnings.simplefilter("error", Image.DecompressionBombWarning)
                img = Image.open(io.BytesIO(content), formats=IMAGE_FORMATS)
        except (Image.DecompressionBombWarning, Image.DecompressionBombError):
            raise SplatwrightError(f"{name}: {file} declares more than {Image.MAX_IMAGE_PIXELS:,} texels, beyond "
                                   "any SOG's images") from None
        except (OSError, SyntaxError, ValueError) as e:
            raise SplatwrightError(f"{name}: {file} is not a WebP or PNG image ({e})") from None
        w, h = img.size
        too_large = (w != width or h > most_rows) if width is not None else w * h > 2 * least + SPARE_TEXELS
        if w * h < least or too_large:
            want = (f"{width} texels wide and at most {most_rows} rows" if width is not None
                    else f"{least:,} to {2 * least + SPARE_TEXELS:,} texels")
            raise SplatwrightError(f"{name}: {file} is {w}x{h}; it should hold {want}")
        try:
            rgba = np.asarray(img.convert("RGBA")).reshape(-1, 4)
        except (OSError, ValueError) as e:
            raise SplatwrightError(f"{name}: {file} is corrupt ({e})") from None
        return rgba[:least, :channels]

    lo, hi = (np.array(meta["means"][k], np.float64) for k in ("mins", "maxs"))
    fixed = texels("means", 0, 3).astype(np.float64) + 256.0 * texels("means", 1, 3)
    log = lo + (hi - lo) * fixed / 65535.0
    quats = texels("quats", 0, 4)
    sh0 = texels("sh0", 0, 4)
    c = {
        "means": (np.sign(log) * np.expm1(np.abs(log))).astype(np.float32),
        "quats": _unpack_quats(quats, name),
        "log_scales": _look_up(meta["scales"]["codebook"], texels("scales", 0, 3), "scales", name),
        "sh_dc": _look_up(meta["sh0"]["codebook"], sh0[:, :3], "sh0", name),
        "opacity_logits": byte_logit(sh0[:, 3]),
        "sh_rest": np.zeros((n, 0, 3), np.float32),
    }
    if degree:
        k, entries = COEFFS[degree], meta["shN"]["count"]
        rows = math.ceil(entries / PALETTE_ROW)
        centroids = texels("shN", 0, 3, rows * PALETTE_ROW * k, PALETTE_ROW * k, rows)
        labels = texels("shN", 1, 2).astype(np.int64)
        labels = labels[:, 0] + 256 * labels[:, 1]
        if labels.max() >= entries:
            raise SplatwrightError(f"{name}: shN_labels names palette entry {labels.max()} of {entries} "
                                   f"(splat {int(np.argmax(labels >= entries))})")
        table = _look_up(meta["shN"]["codebook"], centroids, "shN", name).reshape(-1, k, 3)
        c["sh_rest"] = table[labels]
    return gaussians_from_columns(c, name, budget)


def _meta(raw: bytes, name: str) -> dict:
    """meta.json, its structure checked: version 2, a count, each section's files and numbers."""
    try:
        meta = json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise SplatwrightError(f"{name}: meta.json is not JSON ({e})") from None
    if not isinstance(meta, dict):
        raise SplatwrightError(f"{name}: meta.json is not a JSON object")
    version = meta.get("version")
    if version != VERSION:
        said = "no version (version 1, the first SOG layout)" if version is None else f"version {version!r}"
        raise SplatwrightError(f"{name}: a SOG of {said}; Splatwright reads version {VERSION} (splat-transform 1.0 "
                               "and later write it: convert the file with it)")
    count = meta.get("count")
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise SplatwrightError(f"{name}: meta.json's count is {count!r}, not a positive whole number of splats")
    sections = ["means", "scales", "quats", "sh0"] + (["shN"] if "shN" in meta else [])
    for section in sections:
        entry = meta.get(section)
        files = entry.get("files") if isinstance(entry, dict) else None
        if not (isinstance(files, list) and len(files) == len(FILES[section])
                and all(isinstance(f, str) for f in files)):
            raise SplatwrightError(f"{name}: meta.json's {section} should name its {len(FILES[section])} image "
                                   "file(s) in `files`")
    for key in ("mins", "maxs"):
        _numbers(meta["means"].get(key), f"means.{key}", name, 3, 3)
    for section in ("scales", "sh0", "shN"):
        if section in meta:
            _numbers(meta[section].get("codebook"), f"{section}.codebook", name, 1, CODEBOOK)
    if "shN" in meta:
        bands, entries = meta["shN"].get("bands"), meta["shN"].get("count")
        if not isinstance(bands, int) or bands not in COEFFS:
            raise SplatwrightError(f"{name}: meta.json's shN.bands is {bands!r}; SH degrees 1-3 are read")
        if not isinstance(entries, int) or not 1 <= entries <= PALETTE:
            raise SplatwrightError(f"{name}: meta.json's shN.count is {entries!r}, not 1 to {PALETTE}")
    return meta


def _numbers(value, what: str, name: str, least: int, most: int) -> None:
    if not (isinstance(value, list) and least <= len(value) <= most
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in value)):
        size = str(least) if least == most else f"{least} to {most}"
        raise SplatwrightError(f"{name}: meta.json's {what} should be a list of {size} finite numbers")


def _look_up(book: list, index: np.ndarray, section: str, name: str) -> np.ndarray:
    if int(index.max()) >= len(book):
        raise SplatwrightError(f"{name}: {section} indexes entry {int(index.max())} of a codebook of {len(book)}")
    return np.asarray(book, np.float32)[index]


def _unpack_quats(texels: np.ndarray, name: str) -> np.ndarray:
    largest = texels[:, 3].astype(np.intp) - QUAT_TAG
    bad = (largest < 0) | (largest > 3)
    if bad.any():
        raise SplatwrightError(f"{name}: quats.webp's alpha is {int(texels[np.argmax(bad), 3])} at splat "
                               f"{int(np.argmax(bad))}; it should be {QUAT_TAG}-{QUAT_TAG + 3}")
    rows = np.arange(len(texels))
    q = np.zeros((len(texels), 4))
    others = (texels[:, :3] / 255.0 * 2.0 - 1.0) / SQRT2
    q[rows[:, None], OTHER_COMPONENTS[largest]] = others
    q[rows, largest] = np.sqrt(np.maximum(0.0, 1.0 - (others ** 2).sum(axis=1)))
    return q.astype(np.float32)
