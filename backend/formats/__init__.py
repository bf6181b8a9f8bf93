"""The splat formats read and written, one module each, and the choice between them. A file's format is
found from its content, never from its name alone; the format written is named by the output's name.

| format                      | module                   | recognised by                                  | written for       |
|-----------------------------|--------------------------|------------------------------------------------|-------------------|
| official 3DGS PLY           | formats.ply              | a "ply" header without a `chunk` element       | *.ply             |
| PlayCanvas compressed PLY   | formats.compressed_ply   | a "ply" header with a `chunk` element          | *.compressed.ply  |
| Niantic SPZ (versions 2-4)  | formats.spz              | gzip's bytes 1f 8b, or "NGSP" (version 4)      | *.spz (4; or 3)   |
| antimatter15 .splat         | formats.splat            | no magic: a name ending .splat, then checked   | *.splat           |
| mkkellogg .ksplat           | formats.ksplat           | a version 0.1 header with a known compression  | (read only)       |
| PlayCanvas SOG (version 2)  | formats.sog              | a zip (the bundle), or JSON named *meta.json   | *.sog, *meta.json |
|                             |                          | or with "means" (a folder's meta.json)         | (a folder)        |
| glTF KHR_gaussian_splatting | formats.gltf             | "glTF" (a .glb), or other JSON (a .gltf)       | *.glb, *.gltf     |

Each decoder reads against a budget (formats.budget) and returns a model that formats.validate passed. A SOG
folder and a .gltf whose buffers are files beside it are read as one file (blender_addon/core/bundles.py). A
file none of them reads is refused naming what it looks like (formats.identify).
"""
from __future__ import annotations

from pathlib import Path

import torch

from blender_addon.core.bundles import bundled, is_sog_meta, write_sog_folder
from blender_addon.core.errors import SplatwrightError
from blender_addon.core.files import write_atomic
from ..gaussians import Gaussians, sh_coeff_count
from .budget import Budget
from .ply import STANDARD, encode_ply, header_formation, read_ply
from . import compressed_ply, gltf, identify, ksplat, sog, splat, spz

FORMATS = ("ply", "compressed_ply", "spz", "splat", "ksplat", "sog", "glb", "gltf")
# Output names, the longer suffix first; *meta.json: a SOG folder.
SUFFIXES = {".compressed.ply": "compressed_ply", ".ply": "ply", ".spz": "spz", ".splat": "splat", ".sog": "sog",
            sog.META: "sog", ".glb": "glb", ".gltf": "gltf"}
DECODERS = {"ply": read_ply, "compressed_ply": compressed_ply.decode, "spz": spz.decode, "splat": splat.decode,
            "ksplat": ksplat.decode, "sog": sog.decode, "glb": gltf.decode, "gltf": gltf.decode}
ENCODERS = {"ply": encode_ply, "compressed_ply": compressed_ply.encode, "spz": spz.encode, "splat": splat.encode,
            "sog": sog.encode, "glb": gltf.encode_glb, "gltf": gltf.encode_gltf}
_HEAD = 1 << 16  # bytes read to recognise a file: PLY headers end well within them


def _head(source: str | Path | bytes) -> tuple[bytes, str]:
    """A file's first bytes (enough to recognise it) and its name, or those of bytes."""
    if isinstance(source, bytes):
        return source[:_HEAD], ""
    path = Path(source)
    if not path.is_file():
        raise SplatwrightError(f"{path}: no such file")
    with open(path, "rb") as f:
        return f.read(_HEAD), str(path)


def detect(head: bytes, name: str) -> str:
    """The format of a file from its first bytes (up to 64 KiB); `name` counts only for .splat, which has no magic."""
    if spz.is_spz(head):
        return "spz"
    if ksplat.is_ksplat(head):
        return "ksplat"
    if head[:4] == sog.ZIP_MAGIC:
        return "sog"
    if gltf.is_glb(head):
        return "glb"
    if head.lstrip(b"\xef\xbb\xbf \t\r\n")[:1] == b"{":
        gltf_keys = b'"accessors"' in head or b'"meshes"' in head  # a glTF's, never a SOG meta.json's
        return "sog" if is_sog_meta(name) or (b'"means"' in head and not gltf_keys) else "gltf"
    if head.startswith((b"ply\n", b"ply\r\n")):
        end = head.find(b"end_header")
        header = head[:max(end, 0)].decode("ascii", "replace")
        return "compressed_ply" if compressed_ply.is_compressed_ply(header) else "ply"
    what = identify.looks_like(head)
    if str(name).lower().endswith(".splat") and what is None:
        return "splat"
    raise SplatwrightError(f"{name}: {what or 'an unknown binary file'}, not a splat file Splatwright reads (not a "
                           "PLY, an SPZ, a .ksplat, a SOG or a glTF, and not a .splat by its name and content)")


def read_any(source: str | Path | bytes, name: str = "the splat file", fmt: str | None = None,
             budget: Budget = Budget(), spz_axes: str = "ply") -> Gaussians:
    """Gaussians from a file in any supported format, or from its bytes (`name` then says what they are in
    errors, and a .splat must be named so). `fmt` names the format instead of recognising it. Every decoder reads
    against `budget` (budget.py) and returns a model validate.validated passed. `spz_axes`: the axes an SPZ
    without a coordinate-system record is read in (spz.AXES)."""
    head, path_name = _head(source)
    name = path_name or name
    if fmt is None:
        fmt = detect(head, name)
    elif fmt not in FORMATS:
        raise SplatwrightError(f"unknown splat format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if fmt == "ply":
        return read_ply(source, name, budget)  # by path: plyfile maps the file rather than copying it
    data = source if isinstance(source, bytes) else bundled(source)[0]  # a SOG folder, a .gltf's buffers: inline
    if fmt == "spz":
        return spz.decode(data, name, budget, spz_axes)
    return DECODERS[fmt](data, name, budget)


def formation_of(source: str | Path | bytes, name: str = "the splat file") -> str:
    """The image formation (render/formation.py) a splat file's model was trained for: what its PLY header's
    comment names (ply.header_formation); standard for a PLY without one and for the other formats, which have no
    place for it."""
    head, path_name = _head(source)
    if not head.startswith((b"ply\n", b"ply\r\n")):
        return STANDARD
    end = head.find(b"end_header")
    return header_formation(head[:max(end, 0)].decode("ascii", "replace"), path_name or name)


def format_for_path(path: str | Path) -> str:
    lower = Path(path).name.lower()
    for suffix, fmt in SUFFIXES.items():
        if lower.endswith(suffix):
            return fmt
    raise SplatwrightError(f"{path}: no splat format has this name; use *.ply (3DGS PLY), *.compressed.ply "
                           "(PlayCanvas), *.spz (Niantic), *.splat (antimatter15), *.sog or a folder's meta.json "
                           "(PlayCanvas SOG), or *.glb or *.gltf (glTF)")


def encode_any(g: Gaussians, fmt: str, formation: str = STANDARD, spz_version: int = spz.VERSIONS[0],
               spz_kept: spz.Extras = spz.Extras()) -> bytes:
    """`g`, trained for image formation `formation`, in format `fmt`; only the PLY has a place for the formation.
    An SPZ is of version `spz_version`, keeping `spz_kept` (spz.encode)."""
    if fmt not in ENCODERS:
        raise SplatwrightError(f"unknown splat format {fmt!r}; choose one of {', '.join(ENCODERS)}")
    if fmt == "spz":
        return spz.encode(g, spz_version, spz_kept)
    return encode_ply(g, formation) if fmt == "ply" else ENCODERS[fmt](g)


def notes(g: Gaussians, fmt: str, formation: str = STANDARD, spz_version: int = spz.VERSIONS[0],
          spz_kept: spz.Extras = spz.Extras()) -> list[str]:
    """What writing `g`, trained for image formation `formation`, in `fmt` leaves out or changes, beyond the
    format's quantisation."""
    said = splat.notes(g) if fmt == "splat" else spz.notes(spz_version, spz_kept) if fmt == "spz" else []
    if formation != STANDARD:
        kept = ("its PLY comment names it, for Blender 5.3 and Splatwright, which draw it as trained"
                if fmt == "ply" else "this format has no place to say so")
        said.append(f"the model was trained for Blender's image formation ({formation}; {kept}): other 3DGS viewers "
                    "blend its colours as display values and widen each splat by 0.3 px, so there it looks darker "
                    "where colours mix and its fine parts look thicker (for them, train with image_formation "
                    "standard)")
    return said


def write_any(path: str | Path, g: Gaussians, formation: str = STANDARD, spz_version: int = spz.VERSIONS[0],
              spz_kept: spz.Extras = spz.Extras()) -> list[str]:
    """Write `g`, trained for image formation `formation`, atomically in the format `path` names (an SPZ of
    `spz_version`, keeping `spz_kept`); returns `notes` on what the format left out or changes."""
    fmt = format_for_path(path)
    data = encode_any(g, fmt, formation, spz_version, spz_kept)
    if fmt == "sog" and is_sog_meta(path):
        write_sog_folder(path, data)
    else:
        write_atomic(path, data)
    return notes(g, fmt, formation, spz_version, spz_kept)


def with_sh_degree(g: Gaussians, degree: int) -> Gaussians:
    """`g` with SH up to `degree`: higher bands dropped, missing ones zero."""
    if not 0 <= degree <= 3:
        raise SplatwrightError(f"SH degree {degree}: choose 0 to 3")
    k = sh_coeff_count(degree) - 1
    rest = g.sh_rest.detach()[:, :k]
    if rest.shape[1] < k:
        rest = torch.cat([rest, rest.new_zeros(len(g), k - rest.shape[1], 3)], dim=1)
    return type(g)(**{**g.detached().tensors(), "sh_rest": rest.clone()})  # a 4D model keeps its motion
