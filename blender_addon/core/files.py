"""Files written whole or not at all, and durably: through a temporary file beside the target, flushed to the
disk, renamed over it, and the folder flushed too, so neither a crash nor a power loss leaves a half-written
file. Stdlib only (the add-on shares it)."""
from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path

TEMPORARY_SUFFIX = ".tmp"


@contextmanager
def replacing(path: str | Path, previous: str | Path | None = None):
    """Yields the temporary path to write; it replaces `path` when the block ends without an error. With
    `previous`, the file it replaces is kept under that name (replacing the one kept before), so the last
    good version survives until the new one is on the disk."""
    path = Path(path)
    tmp = path.with_name(path.name + TEMPORARY_SUFFIX)
    try:
        yield tmp
        sync_file(tmp)
        if previous is not None and path.exists():
            _keep_as(path, Path(previous))
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    sync_folder(path.parent)


def _keep_as(path: Path, previous: Path) -> None:
    """Make `previous` the file `path` is now: a second name for it where the file system has hard links, so
    `path` itself never goes missing; else by renaming it."""
    link = previous.with_name(previous.name + TEMPORARY_SUFFIX)
    link.unlink(missing_ok=True)
    try:
        os.link(path, link)
    except OSError:
        os.replace(path, previous)
    else:
        os.replace(link, previous)


def write_atomic(path: str | Path, data: bytes | bytearray | memoryview) -> None:
    with replacing(path) as tmp:
        with open(tmp, "wb") as f:
            f.write(data)


def sync_file(path: str | Path) -> None:
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def sync_folder(folder: str | Path) -> None:
    """Flush a folder's entries (new and renamed files) to the disk; systems that cannot open a folder
    (Windows) flush them with the files."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def remove_stale_temporaries(folder: str | Path) -> list[Path]:
    """Delete the temporary files an interrupted write left in `folder`; returns them."""
    stale = sorted(Path(folder).glob("*" + TEMPORARY_SUFFIX))
    for tmp in stale:
        tmp.unlink(missing_ok=True)
    return stale


def sequence_paths(path: str | Path, frames: int) -> list[Path]:
    """The files of a sequence of `frames` saved as `path` (name.ext): name_0001.ext ..., the whole ending kept
    (name_0001.compressed.ply), as PLY-sequence players number them."""
    path = Path(path)
    stem, dot, ending = path.name.partition(".")
    return [path.with_name(f"{stem}_{k:04d}{dot}{ending}") for k in range(1, frames + 1)]
