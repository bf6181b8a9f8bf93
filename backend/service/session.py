"""Session storage: a folder under the server's workdir holding what a client sent (views, initial points),
the training settings and checkpoint, so a restarted server can reopen it and go on as before."""
from __future__ import annotations

import io
import json
import os
import re
import shutil
import zipfile
from pathlib import Path

import numpy as np

from blender_addon.core import codecs, protocol
from blender_addon.core.cameras import Camera
from blender_addon.core.errors import SplatwrightError
from blender_addon.core.files import remove_stale_temporaries, write_atomic
from blender_addon.core.points import POINTS_FILE, read_points, write_points
from blender_addon.core.settings import BACKGROUND, SPZ_AXES, TRAINING
from ..data.dataset import Dataset, scene_times
from ..data.images import quantise
from ..policy import CHECKPOINT
from ..train import load_latest_checkpoint, previous_checkpoint
from .frames import view_rgb

SESSION_FORMAT = 2  # 2: initial points as points3d.ply (blender_addon/core/points.py); checkpoints of format 2
IMPORTED = "imported"  # an imported session's splat file is kept as imported.<its own ending>


class Session:
    """Layout: session.json (format, name, and the training settings once training started);
    views/NNNNNN.npy (image as uploaded, rows top-down) and views/NNNNNN.json (camera, name, time), the .json
    written last so a view exists once it does; points3d.ply; checkpoint.pt and the one before it,
    checkpoint.prev.pt; splats.ply. A session made by importing a splat file keeps the file as it came
    (imported.ply, .spz, .splat or .pt; session.json names it and the background it is shown with), and shows it
    until a checkpoint of its own replaces it. Every file is replaced atomically and durably.

    A session opens with whatever of it can be read: unreadable parts are skipped and listed in `warnings`.
    Messages name files relative to the workdir, never the server's own folders."""

    def __init__(self, workdir: Path, name: str):
        self.workdir, self.folder, self.name = workdir, workdir / name, name
        self.cameras: list[Camera] = []
        self.images: list[np.ndarray] = []
        self.names: list[str] = []
        self.times: list[float | None] = []  # when each view is seen, in a dynamic scene
        self.next_view = 0  # file number of the next view: after every file there, read or not
        self.points: tuple[np.ndarray, np.ndarray] | None = None
        self.settings: dict | None = None  # the training settings of the last start (settings.TRAINING)
        self.imported: dict | None = None  # an imported session's {"file": its name, "background": [r, g, b]}
        self.warnings: list[str] = []  # what could not be read when the session opened

    @property
    def checkpoint_path(self) -> Path:
        return self.folder / CHECKPOINT

    @property
    def meta_path(self) -> Path:
        return self.folder / "session.json"

    @property
    def pixels(self) -> int:
        return sum(c.width * c.height for c in self.cameras)

    def shown(self, path: Path) -> str:
        """`path` as messages name it: relative to the workdir."""
        return path.relative_to(self.workdir).as_posix()

    @property
    def has_model(self) -> bool:
        """Whether the session has a model on the disk: a checkpoint, or the splat file it was made from."""
        return self.imported is not None or self.checkpoint_path.is_file()

    @property
    def imported_file(self) -> tuple[Path, tuple, str] | None:
        """The splat file the session keeps, if an import made it, the background it is shown with and the axes an
        SPZ that does not say its own is read in."""
        return _imported_source(self.folder, self.imported)

    @classmethod
    def create_imported(cls, workdir: Path, file_name: str, data: bytes, background,
                        spz_axes: str = SPZ_AXES[0]) -> "Session":
        """A new session keeping the splat file `data` (named `file_name`) shown with `background` (an SPZ that
        does not say its axes read in `spz_axes`), named after the file (its stem, with -2, -3, ... where that is
        taken)."""
        base = session_name_for(file_name)
        name, n = base, 1
        taken = {p.name.casefold() for p in _entries(workdir)}
        while name.casefold() in taken:
            n += 1
            name = f"{base}-{n}"
        session = cls.open(workdir, name, create=True)
        # Its own ending, which tells a .splat (a name may be nothing but ".splat")
        ending = re.sub(r"[^a-z0-9]", "", file_name.lower().rpartition(".")[2]) if "." in file_name else ""
        kept = f"{IMPORTED}.{ending or 'ply'}"
        try:
            session.write_file(kept, data)
            session.imported = {"file": kept, "background": [float(c) for c in background], "spz_axes": spz_axes}
            session._write_meta()
        except BaseException:  # a full disk: no session without its file
            shutil.rmtree(session.folder, ignore_errors=True)
            raise
        return session

    @classmethod
    def open(cls, workdir: Path, name: str, create: bool) -> "Session":
        session = cls(workdir, name)
        folder = session.folder
        twins = [p.name for p in _entries(workdir) if p.name.casefold() == name.casefold() and p.name != name]
        if twins:
            raise SplatwrightError(f"session {name!r} differs from {twins[0]!r} only in case, and Windows and macOS "
                                   f"would keep both in one folder; open {twins[0]!r} or choose another name")
        if not folder.exists():
            if not create:
                raise SplatwrightError(f"no session {name!r}; open it with create=true to make one")
            session._write(folder / "views", None)
            session._write_meta()
            return session
        mark_used(folder)
        session._read(folder)
        return session

    def _read(self, folder: Path) -> None:
        for place in (folder, folder / "views"):
            try:
                stale = remove_stale_temporaries(place)
            except OSError as e:
                self.warnings.append(f"cannot remove unfinished files in {self.shown(place)} ({e.strerror})")
                continue
            self.warnings += [f"removed the unfinished file {self.shown(tmp)}" for tmp in stale]
        self._read_meta()
        for camera_file in sorted((folder / "views").glob("*.json")):
            self._read_view(camera_file)
        numbers = [int(p.stem) for p in (folder / "views").glob("*.*") if p.stem.isdigit()]
        self.next_view = max(numbers, default=-1) + 1
        if (folder / POINTS_FILE).is_file():
            try:
                self.points = read_points(folder / POINTS_FILE)
            except SplatwrightError as e:
                self.warnings.append(f"skipped the initial points: {str(e).split(': ', 1)[-1]}")
        self._check_checkpoint()

    def _read_meta(self) -> None:
        try:
            meta = json.loads(self.meta_path.read_text())
            if not isinstance(meta, dict):
                raise ValueError("not a JSON object")
        except (OSError, ValueError) as e:
            self.warnings.append(f"{self.shown(self.meta_path)} is unreadable ({e}); its training settings are "
                                 "lost and it is written again")
            try:
                self._write_meta()
            except SplatwrightError as e:
                self.warnings.append(str(e))
            return
        if meta.get("format") != SESSION_FORMAT:
            raise SplatwrightError(f"session {self.name!r} has format {meta.get('format')}, this backend reads "
                                   f"{SESSION_FORMAT}; open it with a matching backend")
        self.imported = imported_entry(meta)
        if meta.get("settings") is not None:
            try:
                self.settings = TRAINING.check(meta["settings"])
            except ValueError as e:
                self.warnings.append(f"{self.shown(self.meta_path)}: skipped its training settings ({e})")

    def _read_view(self, camera_file: Path) -> None:
        try:
            view = json.loads(camera_file.read_text())
            image = np.load(camera_file.with_suffix(".npy"), allow_pickle=False)
            name = str(view.pop("name"))
            time = view.pop("time", None)
            if time is not None and not 0.0 <= float(time) <= 1.0:
                raise ValueError(f"its time {time} is outside [0, 1]")
            camera = codecs.camera_from_wire(view)
            if image.ndim != 3 or image.shape[:2] != (camera.height, camera.width):
                raise ValueError(f"its image is {image.shape[:2]}, its camera {camera.width}x{camera.height}")
        except (OSError, ValueError, KeyError, TypeError, AttributeError, EOFError, SplatwrightError) as e:
            self.warnings.append(f"skipped the unreadable view {self.shown(camera_file.with_suffix(''))} ({e})")
            return
        self.cameras.append(camera)
        self.images.append(image)
        self.names.append(name)
        self.times.append(None if time is None else float(time))

    def _check_checkpoint(self) -> None:
        """An unreadable newest checkpoint (a power loss can leave it empty) gives way to the previous one, so
        the next checkpoint does not push the good one out."""
        newest, previous = self.checkpoint_path, previous_checkpoint(self.checkpoint_path)
        if not newest.exists() or _looks_whole(newest):
            return
        try:
            if _looks_whole(previous):
                os.replace(previous, newest)
                self.warnings.append(f"{self.shown(newest)} is unreadable; the previous checkpoint replaces it")
            else:
                newest.unlink()
                self.warnings.append(f"{self.shown(newest)} is unreadable and there is no earlier one; it was "
                                     "removed and training starts over")
        except OSError as e:
            self.warnings.append(f"{self.shown(newest)} is unreadable and cannot be replaced ({e.strerror})")

    def load_checkpoint(self) -> dict:
        """The newest readable checkpoint's state; falling back to the previous one adds a warning."""
        state, warning = load_latest_checkpoint(self.checkpoint_path)
        if warning:
            self.warnings.append(warning)
        return state

    def _write_meta(self) -> None:
        meta = {"format": SESSION_FORMAT, "name": self.name, "settings": self.settings}
        if self.imported is not None:
            meta["imported"] = self.imported
        self._write(self.meta_path, json.dumps(meta).encode())

    def _write(self, path: Path, data: bytes | None) -> None:
        """Write a file atomically (or make a folder, for None); a full disk or a read-only folder raises
        SplatwrightError with the file and the reason."""
        try:
            if data is None:
                path.mkdir(parents=True)
            else:
                write_atomic(path, data)
        except OSError as e:
            raise SplatwrightError(f"cannot write {self.shown(path)}: {e.strerror or e}") from None

    def save_settings(self, settings: dict) -> None:
        self.settings = settings
        self._write_meta()

    def add_view(self, camera: Camera, image: np.ndarray, name: str, time: float | None = None) -> int:
        """Store a view of any size (seen at `time`, in a dynamic scene); returns its index among the session's
        views."""
        index = len(self.cameras)
        name = name or f"view_{self.next_view:06d}"
        stem = self.folder / "views" / f"{self.next_view:06d}"
        buffer = io.BytesIO()
        np.save(buffer, image, allow_pickle=False)
        self._write(stem.with_suffix(".npy"), buffer.getbuffer())
        self._write(stem.with_suffix(".json"), json.dumps({**codecs.camera_to_wire(camera), "name": name,
                                                           "time": time}).encode())
        self.next_view += 1
        self.cameras.append(camera)
        self.images.append(image)
        self.names.append(name)
        self.times.append(time)
        return index

    def set_points(self, xyz: np.ndarray, rgb: np.ndarray) -> None:
        try:
            write_points(self.folder / POINTS_FILE, xyz, rgb)
        except OSError as e:
            raise SplatwrightError(f"cannot write {self.shown(self.folder / POINTS_FILE)}: {e.strerror or e}") from None
        self.points = (xyz, rgb)

    def write_file(self, name: str, data: bytes) -> str:
        """Write a file of the session (e.g. splats.ply); returns its name as messages give it."""
        self._write(self.folder / name, data)
        return self.shown(self.folder / name)

    def dataset(self, background, views: int | None = None) -> Dataset:
        """The first `views` views (all by default) as a training dataset."""
        images = [quantise(view_rgb(image, background)) for image in self.images[:views]]
        return Dataset(list(self.cameras[:views]), images, list(self.names[:views]),
                       scene_times(self.times[:views], f"session {self.name!r}"))


def session_name_for(file_name: str) -> str:
    """A session name (protocol.SessionName) after a file's name: its stem with what a name may not hold made
    '-', room left for a -N, "splats" where nothing of it is left."""
    stem = Path(file_name).name.split(".")[0]
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", stem).strip("-._")[:56] or "splats"
    try:
        return protocol.SessionName().check(name)
    except ValueError:  # a Windows device name
        return f"{name}-splats"


def _entries(folder: Path) -> list[Path]:
    """What `folder` holds; nothing if it is gone (the sessions folder removed while the server runs: a new
    session makes it)."""
    try:
        return list(folder.iterdir())
    except FileNotFoundError:
        return []


def mark_used(folder: Path) -> None:
    """Note that the session in `folder` is used now: its folder's modification time, which every file written
    there also moves, is when it was last used (imported_sessions)."""
    try:
        os.utime(folder)
    except OSError:  # a read-only folder: its last write stands
        pass


def imported_sessions(workdir: Path) -> list[str]:
    """The sessions in `workdir` that imports made (their session.json names the file they keep), least recently
    used first (mark_used)."""
    found = []
    for folder in _entries(workdir):
        try:
            if folder.is_dir() and imported_file(folder) is not None:
                found.append((folder.stat().st_mtime_ns, folder.name))
        except OSError:  # removed meanwhile
            continue
    return [name for _, name in sorted(found)]


def imported_entry(meta) -> dict | None:
    """session.json's record of the splat file an imported session keeps, or None (any other session, or a
    record that is not one)."""
    entry = meta.get("imported") if isinstance(meta, dict) else None
    if not isinstance(entry, dict) or not re.fullmatch(IMPORTED + r"\.[a-z0-9]+", str(entry.get("file"))):
        return None
    try:
        # A record without axes was written when an SPZ without a coordinate-system record was read as RUB.
        axes = entry.get("spz_axes", "rub")
        return {"file": entry["file"], "background": BACKGROUND.check(entry.get("background")),
                "spz_axes": axes if axes in SPZ_AXES else SPZ_AXES[0]}
    except ValueError:
        return None


def imported_file(folder: Path) -> tuple[Path, tuple, str] | None:
    """The splat file the session in `folder` keeps, if an import made it, the background it is shown with and
    the axes an SPZ that does not say its own is read in; None for any other session."""
    try:
        entry = imported_entry(json.loads((folder / "session.json").read_text()))
    except (OSError, ValueError):
        return None
    return _imported_source(folder, entry)


def _imported_source(folder: Path, entry: dict | None) -> tuple[Path, tuple, str] | None:
    return None if entry is None else (folder / entry["file"], tuple(entry["background"]), entry["spz_axes"])


def _looks_whole(path: Path) -> bool:
    """Whether a checkpoint file is a complete archive (torch.save writes zip archives, whose directory is at
    the end: a cut-off or empty file has none)."""
    try:
        return path.is_file() and path.stat().st_size > 0 and zipfile.is_zipfile(path)
    except OSError:
        return False
