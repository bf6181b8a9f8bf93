"""Torch files: written whole or not at all (checkpoints and 4D models), and read from anywhere (an upload, a file
the user names) only once their zip is known to hold no more than the file's own bytes."""
from __future__ import annotations

import io
import pickle
import zipfile
from pathlib import Path

import torch

from blender_addon.core.errors import SplatwrightError
from blender_addon.core.files import replacing

ZIP_MAGIC = b"PK\x03\x04"  # how a torch file begins
MAX_PICKLE_BYTES = 1 << 20  # of a torch file's object structure (the tensors' data is apart from it)


def save(path: str | Path, state: dict, what: str, previous: str | Path | None = None) -> None:
    """torch.save `state` to `path` through a temporary file (files.replacing, keeping the file it replaces as
    `previous` if given). Whatever the writer raises (OSError from the file, RuntimeError from torch's zip writer
    when the disk fills) is SplatwrightError naming `what` and the reason; the file it would replace stays as it
    was."""
    try:
        with replacing(path, previous) as tmp, open(tmp, "wb") as f:
            torch.save(state, f)
    except Exception as e:
        raise SplatwrightError(f"cannot write {what} {Path(path).name} ({reason(e)})") from None


def reason(e: BaseException) -> str:
    """What made a write fail, in a few words: the system's reason where an OSError is behind it (torch's zip
    writer reports a full disk as 'unexpected pos', its cause an OSError)."""
    seen = e
    while seen is not None:
        if isinstance(seen, OSError):
            return seen.strerror or str(seen)
        seen = seen.__cause__ or seen.__context__
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


def load(source: str | Path | bytes, name: str, what: str, hint: str = "") -> object:
    """What torch.load reads from a file that may come from anyone (`source`: its path or bytes): tensors and plain
    containers only (weights_only), and only from a torch zip whose records are stored uncompressed within the
    file's own bytes. Anything else is SplatwrightError in one line, "`name`: not `what` (why; `hint`)"."""
    def refused(why: str) -> SplatwrightError:
        return SplatwrightError(f"{name}: not {what} ({'; '.join(filter(None, [why, hint]))})")
    data = source if isinstance(source, bytes) else None
    try:
        if data is None:
            with open(source, "rb") as f:
                head, size = f.read(len(ZIP_MAGIC)), Path(source).stat().st_size
        else:
            head, size = data[:len(ZIP_MAGIC)], len(data)
    except OSError as e:
        raise SplatwrightError(f"{name}: cannot read it ({e.strerror or e})") from None
    if head != ZIP_MAGIC:
        raise refused("not a torch file")
    try:
        with zipfile.ZipFile(io.BytesIO(data) if data is not None else source) as z:
            records = z.infolist()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError, EOFError) as e:
        raise refused(f"a damaged torch file: {e}") from None
    packed = [r.filename for r in records if r.compress_type != zipfile.ZIP_STORED]
    if packed:
        raise refused(f"{packed[0]} is compressed, and torch stores its records as they are")
    if sum(r.file_size for r in records) > size:
        raise refused("its records claim more bytes than the file holds")
    if any(r.filename.endswith(".pkl") and r.file_size > MAX_PICKLE_BYTES for r in records):
        raise refused(f"its object structure is over {MAX_PICKLE_BYTES:,} bytes")
    try:
        return torch.load(io.BytesIO(data) if data is not None else source, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:  # torch explains at length why it will not run the file's code
        raise refused("a torch file of objects other than tensors") from None
    except Exception as e:  # torch raises assorted types for truncated or foreign files
        raise refused(f"an unreadable torch file: {reason(e)}") from None
