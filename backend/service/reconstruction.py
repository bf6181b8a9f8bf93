"""Structure from motion for the server's client (protocol: upload_photo, reconstruct, cancel_reconstruction,
fetch_reconstruction, and the `reconstruction` events). A capture NAME lives in WORKDIR/.reconstructions/NAME (a
dot: never a session's folder): the uploaded photos or video in its upload/, and the COLMAP capture that
backend/data/photos.py makes (images/, sparse/, and its database, so running again reuses the features). One
reconstruction runs at a time, on a thread of its own, while the server goes on answering renders; its progress
goes to whichever client is connected as events."""
from __future__ import annotations

import shutil
import threading
import time
import traceback
from pathlib import Path
from typing import Callable

from blender_addon.core import protocol
from blender_addon.core.codecs import MAX_IMAGE_BYTES
from blender_addon.core.errors import SplatwrightError
from blender_addon.core.reconstruction import is_photo, is_video, pack_capture
from ..data.photos import Cancelled, reconstruct
from .limits import Limits
from .log import log

FOLDER = ".reconstructions"
UPLOAD = "upload"
EVENT_INTERVAL = 0.2  # seconds between progress events of one stage (its first and last always go)


class Reconstructions:
    def __init__(self, workdir: Path, limits: Limits, emit: Callable[[dict], None]):
        self.root, self.limits, self.emit = workdir / FOLDER, limits, emit
        self.lock = threading.Lock()
        self.running: str | None = None  # the capture being reconstructed
        self.cancel_event = threading.Event()
        self.thread: threading.Thread | None = None

    def _refuse_while_running(self, capture: str, doing: str) -> None:
        if self.running == capture:
            raise SplatwrightError(f"the photos of {capture} are being reconstructed; cancel that before {doing}")

    def upload(self, capture: str, file: str, offset: int, first: bool, data: bytes) -> dict:
        """Write `data` into the upload's `file` at `offset` (0: a new file; else where the file ends); `first`
        empties the upload. Checked against the caps: the photos (views), each photo's bytes (a view's image),
        and all the upload's bytes (upload_bytes); a video is the upload's only file."""
        folder = self.root / capture / UPLOAD
        with self.lock:
            self._refuse_while_running(capture, "uploading again")
            if first:
                shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True, exist_ok=True)
            sizes = {p.name: p.stat().st_size for p in folder.iterdir() if p.is_file()}
            had = sizes.get(file, 0)
            if offset != had:
                raise SplatwrightError(f"{file}: a part from byte {offset:,} came, but {had:,} bytes of it are here; "
                                       "upload the file again from its start")
            others = set(sizes) - {file}
            if others and (is_video(file) or any(is_video(name) for name in others)):
                raise SplatwrightError(f"{file}: an upload is one video or photos, not both; upload again with first")
            if is_photo(file):
                self.limits.check("views", len(set(sizes) | {file}), f"{capture}: photos uploaded",
                                  "choose fewer photos")
                if offset + len(data) > MAX_IMAGE_BYTES:
                    raise SplatwrightError(f"{file}: {offset + len(data):,} bytes is over the cap of "
                                           f"{MAX_IMAGE_BYTES:,} bytes of one photo; make it smaller")
            total = sum(sizes.values()) + len(data)
            self.limits.check("upload_bytes", total, f"{capture}: bytes uploaded", "choose fewer or smaller photos, "
                              "or a shorter video")
            try:
                with open(folder / file, "r+b" if offset else "wb") as out:
                    out.seek(offset)
                    out.write(data)
            except OSError as e:
                raise SplatwrightError(f"{file}: the backend's machine could not store it ({e.strerror}); free "
                                       "space there, or rename the file") from None
        return {"files": len(set(sizes) | {file}), "bytes": total}

    def start(self, capture: str, path: str, rate: float, local_client: bool) -> dict:
        """Reconstruct the upload of `capture`, or the folder or video `path` on this machine (for a client on it
        only), on a thread; its events tell the progress and the end."""
        if path:
            if not local_client:
                raise SplatwrightError("only a client on the backend's machine may name a folder or video there; "
                                       "upload the photos instead")
            source = Path(path)
            if not source.exists():
                raise SplatwrightError(f"{path}: no such folder or video on the backend's machine")
        else:
            source = self.root / capture / UPLOAD
            files = sorted(source.iterdir()) if source.is_dir() else []
            if not files:
                raise SplatwrightError(f"{capture}: nothing uploaded; upload the photos or the video first")
            if is_video(files[0].name):
                source = files[0]
        with self.lock:
            if self.running is not None:
                raise SplatwrightError(f"the photos of {self.running} are being reconstructed; wait for it or cancel "
                                       "it first")
            self.running = capture
            self.cancel_event.clear()
        self.thread = threading.Thread(target=self._run, args=(capture, source, rate), name=f"reconstruct {capture}",
                                       daemon=True)
        self.thread.start()
        return {"capture": capture, "source": source.name if not path else str(source)}

    def cancel(self) -> dict:
        """Stop the running reconstruction at its next progress report."""
        with self.lock:
            running = self.running is not None
            self.cancel_event.set()
        return {"running": running}

    def close(self, wait: float) -> None:
        """Cancel the running reconstruction and wait up to `wait` seconds for it to stop, so that its database
        is not left half written (a long mapping step reports, and so stops, only at its end)."""
        self.cancel()
        if self.thread is not None:
            self.thread.join(wait)

    def fetch(self, capture: str) -> tuple[dict, bytes]:
        """The capture made, as core/reconstruction.pack_capture's zip."""
        with self.lock:
            self._refuse_while_running(capture, "fetching it")
        folder = self.root / capture
        if not (folder / "sparse").is_dir():
            raise SplatwrightError(f"{capture}: no reconstruction made; reconstruct the photos first")
        data = pack_capture(folder)
        if len(data) > protocol.MAX_PAYLOAD_BYTES:
            raise SplatwrightError(f"{capture}: the capture's {len(data):,} bytes are over the "
                                   f"{protocol.MAX_PAYLOAD_BYTES:,} one reply may carry; use fewer photos, or a "
                                   "backend on this machine, which reads the capture where it is")
        return {"capture": capture, "bytes": len(data)}, data

    def _run(self, capture: str, source: Path, rate: float) -> None:
        shown = {"stage": "", "at": 0.0}

        def progress(stage: str, done: int, total: int) -> None:
            now = time.monotonic()
            if stage != shown["stage"] or done >= total or now - shown["at"] >= EVENT_INTERVAL:
                shown.update(stage=stage, at=now)
                self.emit({"event": "reconstruction", "capture": capture, "state": "running", "stage": stage,
                           "done": done, "total": total})

        out = self.root / capture
        ended = {"event": "reconstruction", "capture": capture}
        try:
            made = reconstruct(source, out, self.limits.check, progress, rate=rate, cancel=self.cancel_event)
            ended.update(state="finished", folder=str(made.folder), registered=made.registered, photos=made.photos,
                         points=made.points, message=f"registered {made.registered} of {made.photos} "
                         f"{'frames' if made.sampled is not None else 'photos'}, {made.points:,} points")
        except Cancelled as e:
            ended.update(state="cancelled", message=str(e))
        except SplatwrightError as e:
            ended.update(state="failed", message=str(e))
        except Exception as e:  # a bug or pycolmap's own failure: one line for the client, the traceback here
            traceback.print_exc()
            ended.update(state="failed", message=f"structure from motion of {capture} failed: {e!r}; see the "
                                                 "backend's log")
        ended["message"] = " ".join(ended["message"].split())[:protocol.MAX_TEXT_CHARS]
        log(f"reconstruction of {capture}: {ended['state']}: {ended['message']}")
        with self.lock:
            self.running = None
        self.emit(ended)
