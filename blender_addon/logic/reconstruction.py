"""Photos to cameras through the backend's structure from motion, without bpy: what the user chose (a folder of
photos, a photo in one, or a video), the capture's name, the upload to a backend on another machine, and the
progress as the panel and the status bar say it."""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..core.errors import SplatwrightError
from ..core.reconstruction import PHOTO_SUFFIXES, VIDEO_SUFFIXES, is_photo, is_video

UPLOAD_CHUNK_BYTES = 32 << 20  # a video goes up in parts this large, so neither side holds all of it at once
STAGE_TEXTS = {"decoding": "Taking frames", "features": "Features", "matching": "Matching pairs",
               "mapping": "Registered", "undistortion": "Undistorting"}


@dataclass(frozen=True)
class Source:
    path: Path  # a folder of photos, or a video
    video: bool

    @property
    def files(self) -> list[Path]:
        """What is uploaded: the video, or the folder's photos in name order."""
        if self.video:
            return [self.path]
        return sorted(p for p in self.path.iterdir() if p.is_file() and is_photo(p.name))

    @property
    def capture(self) -> str:
        """The capture's name (a session name): photos-<the folder's name or the video's stem>-<a hash of its whole
        path>, so that two folders of one name (two cameras' DCIM) make two captures."""
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", self.path.stem if self.video else self.path.name).strip("_.-")
        where = hashlib.sha256(str(self.path.resolve()).encode()).hexdigest()[:8]
        return f"photos-{(safe or 'capture')[:46]}-{where}"


def source_of(chosen: str) -> Source:
    """The photos or video the user chose: a folder of photos, a photo (its folder's photos), or a video file."""
    path = Path(chosen)
    if path.is_file() and is_video(path.name):
        return Source(path, True)
    folder = path.parent if path.is_file() and is_photo(path.name) else path
    if not folder.is_dir():
        raise SplatwrightError(f"{chosen or 'nothing chosen'}: choose a folder of photos "
                               f"({', '.join(PHOTO_SUFFIXES)}) or a video ({', '.join(VIDEO_SUFFIXES)})")
    source = Source(folder, False)
    if not source.files:
        raise SplatwrightError(f"{folder} holds no photos ({', '.join(PHOTO_SUFFIXES)}); choose their folder, or a "
                               "video")
    return source


def upload(client, source: Source, cancelled: Callable[[], bool],
           sent: Callable[[int, int], None] = lambda done, total: None) -> bool:
    """Upload the photos (or the video, in parts) of `source` to the backend's capture source.capture, the
    upload emptied first; sent(files done, files) after each file. False where cancelled() stopped it."""
    files, first = source.files, True
    for index, path in enumerate(files):
        with open(path, "rb") as file:
            offset = 0
            while True:
                if cancelled():
                    return False
                part = file.read(UPLOAD_CHUNK_BYTES)
                client.request("upload_photo", {"capture": source.capture, "file": path.name, "offset": offset,
                                                "first": first}, part)
                first, offset = False, offset + len(part)
                if len(part) < UPLOAD_CHUNK_BYTES:
                    break
        sent(index + 1, len(files))
    return True


def progress_text(event: dict) -> tuple[float | None, str]:
    """(the share of the stage done, or None, and what it says) of a reconstruction's latest event."""
    stage, done, total = event.get("stage", ""), event.get("done", 0), event.get("total", 0)
    if stage not in STAGE_TEXTS:
        return None, "Starting structure from motion"
    if not total or stage == "undistortion":
        return None, STAGE_TEXTS[stage]
    return min(1.0, done / total), f"{STAGE_TEXTS[stage]} {done}/{total}"


class Reconstruction:
    """What Make Cameras from Photos is doing, as its timer moves it on (ops/colmap.py): 'start' (waiting for the
    backend), 'starting' (uploading and starting it), 'running' (the backend's events tell its progress),
    'fetching' (the capture coming from a backend on another machine), then bringing it in. `uploaded` is set
    on the worker thread while the photos go up; `cancelled` set once the user cancels."""

    def __init__(self, source: Source, rate: float):
        self.source, self.rate = source, rate
        self.stage = "start"
        self.uploaded = (0, len(source.files))  # files sent, files
        self.cancelled = False

    def progress(self, connecting: bool, remote: bool, event: dict) -> tuple[float | None, str]:
        """(the share done, or None, and what it says) now; `event`: the backend's latest reconstruction event."""
        if self.stage == "start":
            return None, "Starting the backend" if connecting else "Starting"
        if self.stage == "starting":
            done, total = self.uploaded
            if remote and done < total:
                return done / total, f"Uploading {done}/{total}"
            return None, "Starting structure from motion"
        if self.stage == "fetching":
            return None, "Bringing the cameras in"
        return progress_text(event if event.get("capture") == self.source.capture else {})
