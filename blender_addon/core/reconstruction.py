"""Structure from motion as both sides see it: which files are photos and which a video, the frame rate a video's
frames are taken at, the stages a reconstruction reports, and the reconstructed capture as it travels from a
backend on another machine (a zip of its images/ and sparse/ folders). Standard library only.

The backend reconstructs (backend/data/photos.py and video.py); the add-on uploads the photos, follows the
progress and brings the capture in as Import COLMAP does."""
from __future__ import annotations

import io
import shutil
import zipfile
from pathlib import Path, PurePosixPath

from .colmap import IMAGES_FOLDER
from .errors import SplatwrightError

PHOTO_SUFFIXES = (".jpg", ".jpeg", ".png", ".tif", ".tiff", ".bmp")
VIDEO_SUFFIXES = (".mp4", ".mov", ".m4v", ".mkv", ".avi", ".webm")
DEFAULT_RATE = 2.0  # frames taken a second of video: a walk around an object moves a few degrees between them
MIN_RATE = 0.01  # a frame every 100 s: slower, a video is a few frames far apart
MAX_RATE = 120.0  # frames are named by their time in milliseconds, and no video has more frames a second
STAGES = ("decoding", "features", "matching", "mapping", "undistortion")
# A reconstruction's states, as its events give them: running, then one of the others.
STATES = ("running", "finished", "failed", "cancelled")
CAPTURE_FOLDERS = (IMAGES_FOLDER, "sparse")  # what a reconstructed capture is made of


def is_photo(name: str) -> bool:
    return PurePosixPath(name).suffix.lower() in PHOTO_SUFFIXES


def is_video(name: str) -> bool:
    return PurePosixPath(name).suffix.lower() in VIDEO_SUFFIXES


def pack_capture(root: Path) -> bytes:
    """The capture folder `root`'s images/ and sparse/ as a zip, stored as they are (photos are compressed
    already), its names relative to `root` with / between folders."""
    data = io.BytesIO()
    with zipfile.ZipFile(data, "w", zipfile.ZIP_STORED) as packed:
        for folder in CAPTURE_FOLDERS:
            for path in sorted((root / folder).rglob("*")):
                if path.is_file():
                    packed.write(path, path.relative_to(root).as_posix())
    return data.getvalue()


def unpack_capture(data: bytes, root: Path) -> Path:
    """Unpack pack_capture's zip into `root` (its images/ and sparse/ replaced); refused, with nothing written,
    where a name is not a file inside images/ or sparse/ or an entry is compressed (a stored zip holds no more
    than its own size)."""
    try:
        packed = zipfile.ZipFile(io.BytesIO(data))
        entries = packed.infolist()
    except (zipfile.BadZipFile, ValueError) as e:
        raise SplatwrightError(f"the reconstructed capture from the backend is not a zip ({e})") from None
    for entry in entries:
        parts = PurePosixPath(entry.filename).parts
        if (entry.is_dir() or len(parts) < 2 or parts[0] not in CAPTURE_FOLDERS or ".." in parts
                or "\\" in entry.filename or entry.compress_type != zipfile.ZIP_STORED):
            raise SplatwrightError(f"the reconstructed capture from the backend holds {entry.filename[:200]!r}, "
                                   "which is no stored file inside images/ or sparse/; update the backend")
    for folder in CAPTURE_FOLDERS:
        shutil.rmtree(root / folder, ignore_errors=True)
    for entry in entries:
        target = root.joinpath(*PurePosixPath(entry.filename).parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        with packed.open(entry) as source, open(target, "wb") as out:
            shutil.copyfileobj(source, out)
    return root
