"""Splat files made of several files, as one: a SOG folder (its meta.json and the images it names) as the bundled
.sog zip its specification defines, and a .gltf naming buffers in files beside it as the same .gltf with them
inline (data: URIs); and a bundled SOG written back out as a folder. What the add-on sends the backend and what the
backend reads from a path are the same bytes. Stdlib only (the add-on shares it)."""
from __future__ import annotations

import base64
import io
import json
import zipfile
from pathlib import Path
from urllib.parse import unquote

from .errors import SplatwrightError
from .files import write_atomic

SOG_META = "meta.json"  # a SOG folder's file that names the others (a name ending so is taken for one)
SOG_SECTIONS = ("means", "scales", "quats", "sh0", "shN")  # meta.json's entries that name image files
GLTF_SUFFIX = ".gltf"


def is_sog_meta(path: str | Path) -> bool:
    return Path(path).name.lower().endswith(SOG_META)


def bundled(path: str | Path) -> tuple[bytes, str]:
    """The file at `path` as one file's bytes, and the name that says what they are: a SOG folder's meta.json as
    a bundled SOG (name.sog), a .gltf with its buffers inline, any other file as it is."""
    path = Path(path)
    if not path.is_file():
        raise SplatwrightError(f"{path}: no such file")
    if is_sog_meta(path):
        return _sog_bundle(path), (path.parent.name or "model") + ".sog"
    if path.suffix.lower() == GLTF_SUFFIX:
        return _gltf_inline(path), path.name
    return path.read_bytes(), path.name


def write_sog_folder(meta_path: str | Path, bundle: bytes) -> None:
    """The files of bundled SOG `bundle` beside `meta_path` (its folder made where missing), each written whole,
    its meta.json (written as `meta_path`) last: a folder has a meta.json only once the images it names are there."""
    meta_path = Path(meta_path)
    meta_path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(io.BytesIO(bundle)) as z:
        names = [n for n in z.namelist() if n != SOG_META]
        for name in names:
            write_atomic(meta_path.parent / _plain(name, "the SOG"), z.read(name))
        write_atomic(meta_path, z.read(SOG_META))


def _sog_bundle(meta_path: Path) -> bytes:
    raw = meta_path.read_bytes()
    try:
        meta = json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise SplatwrightError(f"{meta_path}: not a SOG's meta.json (not JSON: {e})") from None
    files = [file for section in SOG_SECTIONS if isinstance(meta, dict) and isinstance(meta.get(section), dict)
             for file in meta[section].get("files", []) if isinstance(file, str)]
    if not files:
        raise SplatwrightError(f"{meta_path}: not a SOG's meta.json (it names no image files)")
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as z:
        for file in dict.fromkeys(files):
            image = meta_path.parent / _plain(file, str(meta_path))
            if not image.is_file():
                raise SplatwrightError(f"{meta_path}: names {file}, which is not beside it")
            z.writestr(file, image.read_bytes())
        z.writestr(SOG_META, raw)
    return out.getvalue()


def _gltf_inline(path: Path) -> bytes:
    raw = path.read_bytes()
    try:
        gltf = json.loads(raw)
    except (ValueError, RecursionError):
        return raw  # not a glTF's JSON: the reader says what it is
    buffers = gltf.get("buffers") if isinstance(gltf, dict) else None
    if not isinstance(buffers, list):
        return raw
    changed = False
    for buffer in buffers:
        uri = buffer.get("uri") if isinstance(buffer, dict) else None
        if isinstance(uri, str) and not uri.startswith("data:"):
            relative = unquote(uri)
            if ":" in relative.split("/")[0] or relative.startswith("/") or ".." in Path(relative).parts:
                raise SplatwrightError(f"{path}: buffer {uri!r} is not a file beside the .gltf (a URL or a path "
                                       "outside its folder); Splatwright reads buffers inline or beside it")
            file = path.parent / relative
            if not file.is_file():
                raise SplatwrightError(f"{path}: its buffer {uri} is not beside it")
            buffer["uri"] = "data:application/octet-stream;base64," + base64.b64encode(file.read_bytes()).decode()
            changed = True
    return json.dumps(gltf).encode() if changed else raw


def _plain(name: str, owner: str) -> str:
    """`name` if it is a plain file name (a SOG's files lie side by side)."""
    if not name or Path(name).name != name or name in (".", ".."):
        raise SplatwrightError(f"{owner}: names {name!r}, not a plain file name beside its meta.json")
    return name
