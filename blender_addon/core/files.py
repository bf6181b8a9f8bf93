"""Files written whole or not at all, and durably: through a temporary file beside the target, flushed to the
disk, renamed over it, and the folder flushed too, so neither a crash nor a power loss leaves a half-written
file. Stdlib only (the add-on shares it)."""
from __future__ import annotations

import json
import os
import re
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

TEMPORARY_SUFFIX = ".tmp"
SEQUENCE_MANIFEST = "{stem}.sequence.json"  # beside the frames of a sequence saved as {stem}.ext: sequence_manifest


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


def sequence_manifest(path: str | Path) -> Path:
    """The manifest of the sequence saved as `path` (name.ext): name.sequence.json beside its frames. It lists the
    frames' files and says whether they are all in place: begin_sequence, end_sequence, sequence_state."""
    path = Path(path)
    return path.with_name(SEQUENCE_MANIFEST.format(stem=path.name.partition(".")[0]))


def begin_sequence(path: str | Path, frames: list[Path]) -> None:
    """Before the first frame of the sequence saved as `path` goes in place: its manifest lists `frames` (the files
    of sequence_paths) as not all in place, which it says until end_sequence, so a sequence whose writer was killed
    is known as incomplete."""
    _write_manifest(path, {"complete": False, "frames": [frame.name for frame in frames]})


def end_sequence(path: str | Path, frames: list[Path]) -> None:
    """Once every frame of the sequence saved as `path` is in place: its manifest says it is complete, with each
    frame's size."""
    _write_manifest(path, {"complete": True, "frames": [frame.name for frame in frames],
                           "bytes": [frame.stat().st_size for frame in frames]})


def _write_manifest(path: str | Path, fields: dict) -> None:
    write_atomic(sequence_manifest(path), json.dumps({"format": 1, **fields}, indent=1).encode())


class SequenceState(NamedTuple):
    complete: bool
    message: str  # what the sequence is, or what it lacks and what to do


def sequence_state(file: str | Path) -> SequenceState | None:
    """Whether the splat file `file` (name_0001.ply ...) is a frame of a complete sequence, by the manifest beside
    it (begin_sequence): complete when the manifest says so and every frame it lists is there in its size. None
    where the file's name is not a frame's or no manifest is beside it (a file of another writer)."""
    file = Path(file)
    frame_stem = re.fullmatch(r"(.+)_\d{4,}", file.name.partition(".")[0])
    if frame_stem is None:
        return None
    manifest = file.with_name(SEQUENCE_MANIFEST.format(stem=frame_stem[1]))
    try:
        entry = json.loads(manifest.read_text(encoding="utf-8"))
        frames, complete = [str(name) for name in entry["frames"]], entry["complete"] is True
        sizes = [int(size) for size in entry["bytes"]] if complete else []
        if complete and len(sizes) != len(frames):
            raise ValueError(f"{len(frames)} frames but {len(sizes)} sizes")
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError, KeyError) as e:
        return SequenceState(False, f"{manifest.name}, the manifest of the sequence {file.name} belongs to, is "
                                    f"unreadable ({e}); export the sequence again")
    if file.name not in frames:
        return SequenceState(False, f"{file.name} is none of the {len(frames)} frames {manifest.name} lists: it is "
                                    "left from another export of that name; export the sequence again")
    if not complete:
        there = sum((file.parent / name).is_file() for name in frames)
        return SequenceState(False, f"the sequence of {file.name} is incomplete: its export stopped before all "
                                    f"{len(frames)} frames were in place ({there} of their files are there, of this "
                                    f"export or an earlier one; {manifest.name} says so); export the sequence again")
    for name, size in zip(frames, sizes):
        try:
            changed = (file.parent / name).stat().st_size != size
        except OSError:
            return SequenceState(False, f"the sequence of {file.name} is incomplete: its frame {name} is missing; "
                                        "export the sequence again")
        if changed:
            return SequenceState(False, f"the sequence of {file.name} is incomplete: its frame {name} is not the "
                                        f"size {manifest.name} gives; export the sequence again")
    return SequenceState(True, f"{file.name} is frame {frames.index(file.name) + 1} of a complete sequence of "
                               f"{len(frames)} ({manifest.name})")
