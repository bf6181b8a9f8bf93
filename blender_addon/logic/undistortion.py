"""Undistorting a COLMAP capture for the import, off Blender's main thread and the way the backend does it
(core/colmap.py's make_undistorted, through pycolmap): in Blender's own Python where pycolmap imports there, else
by the backend's Python, `python -m backend.data CAPTURE`, run from the backend's sources in the add-on."""
from __future__ import annotations

import threading
from pathlib import Path

from ..core import colmap
from ..core.errors import SplatwrightError
from .environment import child_env, spawn

IN_BLENDER = "in Blender's Python"
BY_BACKEND = "by the backend's Python (Blender's Python has no pycolmap)"


class Undistortion:
    """Makes root/undistorted on a thread: with pycolmap here, or waiting on a child process (the backend's
    Python). `how` says which; `finished` once it ended; result() the undistorted capture folder, or
    SplatwrightError saying why not."""

    def __init__(self, root: Path, pycolmap, python: str, sources: Path):
        """`pycolmap`: the module where Blender's Python imports it, else None; `python` and `sources`: the
        backend's Python and its sources."""
        self.root = root
        self.process = None
        self._error: str | None = None
        self._done = threading.Event()
        if pycolmap is not None:
            self.how = IN_BLENDER
            work, args = self._undistort, (pycolmap,)
        elif python and Path(python).is_file():
            self.how = BY_BACKEND
            try:
                self.process = spawn([python, "-m", "backend.data", str(root)], sources,
                                     child_env(PYTHONPATH=str(sources)))
            except OSError as e:
                raise SplatwrightError(f"{root}: the backend's Python {python} could not be started to undistort "
                                       f"the cameras ({e}); press Set Up Backend in the add-on's preferences") from e
            work, args = self._wait_for_backend, ()
        else:
            raise SplatwrightError(f"{root}: the COLMAP model's cameras have lens distortion, and undistorting them "
                                   "needs pycolmap, which Blender's Python lacks, or the backend's Python: press Set "
                                   "Up Backend in the add-on's preferences")
        threading.Thread(target=work, args=args, name="splatwright-undistort", daemon=True).start()

    def _undistort(self, pycolmap) -> None:
        try:
            colmap.make_undistorted(pycolmap, self.root)
        except Exception as e:  # pycolmap raises its own types; each is this undistortion's failure
            self._error = f"{self.root}: undistortion failed ({e})"
        finally:
            self._done.set()

    def _wait_for_backend(self) -> None:
        try:
            output, _ = self.process.communicate()
            if self.process.returncode != 0:
                lines = output.strip().splitlines()
                errors = [line.removeprefix("error: ") for line in lines if line.startswith("error: ")]
                self._error = (errors[-1] if errors else f"{self.root}: the backend's undistortion exited with code "
                               f"{self.process.returncode}: {' | '.join(lines[-3:]) or 'no output'}")
        finally:
            self._done.set()

    @property
    def finished(self) -> bool:
        return self._done.is_set()

    def wait(self) -> Path:
        self._done.wait()
        return self.result()

    def result(self) -> Path:
        """The undistorted capture folder, once finished."""
        if self._error:
            raise SplatwrightError(self._error)
        made = colmap.undistorted_copy(self.root)
        if made is None:
            raise SplatwrightError(f"{self.root}: undistortion made no model in {self.root / colmap.UNDISTORTED}")
        return made

    def cancel(self) -> None:
        """Stop the backend's undistortion (one in Blender's Python runs to its end on its thread)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
