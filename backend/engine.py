"""The engine behind the server: the open session's model, a training thread and a render thread, and the
state machine they follow (protocol.STATES). Its methods answer the server's requests with reply fields and
raise SplatwrightError with a message for the user; it knows nothing about sockets."""
from __future__ import annotations

import math
import sys
import tempfile
import threading
import time
import traceback
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Callable, Hashable

import numpy as np
import torch

from blender_addon.core import protocol
from blender_addon.core.cameras import Camera
from blender_addon.core.errors import SplatwrightError
from blender_addon.core.protocol import placement_scale
from blender_addon.core.settings import TRAINING
from .frames import QueuedFrame, finish_frame, queue_frame, view_rgb
from .dynamic import DYNAMIC_FILE, DynamicGaussians, gaussians_from_tensors, read_dynamic, write_dynamic
from .gaussians import Gaussians, quat_multiply
from .sh import rotate_sh
from .formats import encode_any, format_for_path, notes, read_any
from .ply import encode_ply
from .policy import CHECKPOINT, make_config, system_report
from .render import camera_tensors
from .session import Session, imported_file
from .shared_frames import SharedFrames
from .train import TrainConfig, Trainer, load_latest_checkpoint

RENDER_PRIORITY = -100  # of the render stream; torch maps it to the highest priority the GPU has
SAVED_MODELS = 4  # sessions' saved models kept loaded for the requests that name them
DYNAMIC_SUFFIX = ".pt"  # a file name with this ending is a 4D model's file (backend.dynamic's splats4d.pt)
DYNAMIC_FORMAT = "4d"  # what export_ply's reply calls that format
ZIP_MAGIC = b"PK\x03\x04"  # how a torch file (a 4D model's) begins
WATCH_SECONDS = 1.0  # a live view that asked for a frame of the training model this recently gets its copies


def log(message: str) -> None:
    print(f"splatwright serve: {message}", file=sys.stderr, flush=True)


def _limit(default: int, meaning: str):
    return field(default=default, metadata={"help": meaning})


@dataclass(frozen=True)
class Limits:
    """What a session may hold and ask for, so no request can exhaust the server's memory; each is a
    `serve` flag, --max-<name> (cli.py), and a request over one is refused with a message naming it."""
    views: int = _limit(2000, "views a session may hold")
    view_pixels: int = _limit(4096 * 4096, "pixels (width x height) of one view")
    session_pixels: int = _limit(500_000_000, "pixels of all of a session's views together (about 16 bytes "
                                              "of memory each while training)")
    render_pixels: int = _limit(4096 * 4096, "pixels of one rendered frame")
    points: int = _limit(2_000_000, "initial points or random initial Gaussians of a session")

    @staticmethod
    def flag(name: str) -> str:
        return "--max-" + name.replace("_", "-")

    def check(self, name: str, value: int, what: str) -> None:
        """SplatwrightError if `value` (of `what`) is over the limit `name`."""
        cap = getattr(self, name)
        if value > cap:
            raise SplatwrightError(f"{what}: {value:,} is over the cap of {cap:,} {self.meaning(name)}; start the "
                                   f"backend with serve {self.flag(name)} N to allow more")

    @staticmethod
    def meaning(name: str) -> str:
        return next(f.metadata["help"] for f in fields(Limits) if f.name == name)


@dataclass
class RenderJob:
    camera: Camera
    format: str
    depth: bool  # also send the depth plane
    done: Callable[[dict, bytes | memoryview], None]  # reply fields and payload
    fail: Callable[[str, str], None]  # error code and message
    model: str | None = None  # a session whose saved model is drawn (protocol.MODEL_CHOICE); None: the shown one
    crop: np.ndarray | None = None  # model space into the unit cube of the box the drawn Gaussians' centres are in
    time: float | None = None  # when a 4D model is drawn (None: 0)
    stream: Hashable = None  # a newer job of the same stream supersedes this one while it waits
    shared: SharedFrames | None = None  # the connection's shared-memory frames, where the request asked for them
    seq: int = 0


@dataclass(frozen=True)
class Model:
    """Gaussians to draw or export, with what they are drawn with."""
    g: Gaussians
    sh_degree: int
    background: tuple
    step: int
    trained: bool = False  # the open session's trained model (not a viewed file or a saved model)


def trained_model(t: Trainer) -> Model:
    return Model(t.g, t.sh_degree, t.cfg.background, t.step, True)


class TrainingCopies:
    """Copies of the training model that the training thread makes after each step on the GPU while a live view
    watches it (asked for a frame of it within WATCH_SECONDS), each with an event recorded after its copy. A frame
    then draws the newest copy the GPU has finished, a step or two old, instead of copying the model behind the
    kernels of the step still queued on the GPU (Engine._copied). The two kept take twice the model's parameters
    in GPU memory while watched training runs (they go when it pauses or its thread ends), and a copy costs a
    step about 1% (1M Gaussians, H200). Use with the model lock held."""

    def __init__(self):
        self.copies: list[tuple[weakref.ref, Model, torch.cuda.Event]] = []  # (trainer, copy, done), newest last
        self.watched_until = 0.0

    def publish(self, trainer: Trainer) -> None:
        """After `trainer`'s step, on the training thread."""
        if time.monotonic() > self.watched_until:
            self.clear()  # not watched: their memory goes back
            return
        self.copies = self.copies[-1:]  # two with the one made now
        model = trained_model(trainer)
        try:
            copy = replace(model, g=model.g.detached())
        except torch.cuda.OutOfMemoryError:  # a live view never fails training: frames copy the model instead
            self.clear()
            return
        done = torch.cuda.Event()
        done.record()
        self.copies.append((weakref.ref(trainer), copy, done))

    def clear(self) -> None:
        self.copies = []

    def finished(self, trainer: Trainer) -> Model | None:
        """The newest copy of `trainer`'s model that the GPU has finished, if there is one; the asker watches."""
        self.watched_until = time.monotonic() + WATCH_SECONDS
        for owner, copy, done in reversed(self.copies):
            if owner() is trainer and done.query():
                return copy
        return None


class SavedModels:
    """Sessions' saved models (their last checkpoints, or the files imports made them from), loaded when a request
    first names them and kept for the SAVED_MODELS sessions named last; a checkpoint written since is loaded
    again. They are never trained, so whoever has one may read it without a lock."""

    def __init__(self, workdir: Path, device: str, size: int = SAVED_MODELS):
        self.workdir, self.device, self.size = workdir, device, size
        self.lock = threading.Lock()
        # session -> (file stamp, model, the import it came from or None)
        self.models: OrderedDict[str, tuple[tuple, Model, tuple | None]] = OrderedDict()

    def get(self, name: str) -> Model:
        folder = self.workdir / name
        source, imported = folder / CHECKPOINT, None
        if not source.is_file():
            with self.lock:
                kept = self.models.get(name)
            # A kept import names its file, so a viewer's every frame does not read session.json again.
            imported = kept[2] if kept is not None and kept[2] is not None else imported_file(folder)
            if imported is not None:
                source = imported[0]
        try:
            stat = source.stat()
        except OSError:
            what = (f"lost the file it was imported from ({source.name}); import the file again" if imported
                    else "has no saved model yet; train it until it checkpoints" if folder.is_dir()
                    else "does not exist in the backend's sessions folder")
            raise SplatwrightError(f"session {name!r} {what}") from None
        stamp = (source.name, stat.st_mtime_ns, stat.st_size)
        with self.lock:
            kept = self.models.get(name)
            if kept is not None and kept[0] == stamp:
                self.models.move_to_end(name)
                return kept[1]
        # Outside the lock: other sessions' models stay available.
        model = imported_model(*imported, self.device) if imported else self._checkpoint_model(name, source)
        with self.lock:
            self.models[name] = (stamp, model, imported)
            self.models.move_to_end(name)
            while len(self.models) > self.size:
                self.models.popitem(last=False)
        return model

    def _checkpoint_model(self, name: str, path: Path) -> Model:
        state, warning = load_latest_checkpoint(path)
        if warning:
            log(f"session {name}: {warning}")
        cfg, g = TrainConfig.from_dict(state["config"]), gaussians_from_tensors(state["gaussians"]).to(self.device)
        # The SH degree its trainer renders with at that step (Trainer.sh_degree).
        sh_degree = min(cfg.sh_degree, g.max_sh_degree, state["step"] // cfg.sh_interval)
        return Model(g, sh_degree, tuple(cfg.background), state["step"])


def imported_model(path: Path, background: tuple, device) -> Model:
    """The model of the splat file an imported session keeps (session.imported_file), as load_ply showed it."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise SplatwrightError(f"cannot read {path.parent.name}/{path.name}, the file session {path.parent.name!r} "
                               f"was imported from ({e.strerror or e})") from None
    g = read_model_file(data, path.name).to(device)
    return Model(g, g.max_sh_degree, tuple(background), 0)


class RenderQueue:
    """Renders waiting their turn, oldest first, at most one of each stream: a newer job supersedes its stream's
    waiting one (a viewer wants its newest view, not every view it had) and goes to the end. The trainer calls
    `let_in` between steps so waiting frames are rendered before the next step starts."""

    def __init__(self):
        self.cond = threading.Condition()
        self.waiting: OrderedDict[Hashable, RenderJob] = OrderedDict()
        self.submitted = 0  # sequence number of the newest job
        self.settled = 0  # newest sequence number rendered (or failed)
        self.closed = False

    def submit(self, job: RenderJob) -> None:
        with self.cond:
            self.submitted += 1
            job.seq = self.submitted
            old = self.waiting.pop(job.stream, None)
            self.waiting[job.stream] = job
            self.cond.notify_all()
        if old is not None:
            old.fail(protocol.SUPERSEDED, "a newer render request replaced this one before it started")

    def take(self) -> RenderJob | None:
        """The next job, or None once closed."""
        with self.cond:
            self.cond.wait_for(lambda: self.waiting or self.closed)
            return None if self.closed else self.waiting.popitem(last=False)[1]

    def settle(self, job: RenderJob) -> None:
        with self.cond:
            self.settled = max(self.settled, job.seq)
            self.cond.notify_all()

    def let_in(self) -> None:
        """Wait until every job submitted so far has been drawn from the model; jobs arriving meanwhile
        wait a step."""
        with self.cond:
            target = self.submitted
            self.cond.wait_for(lambda: self.settled >= target or self.closed)

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()


class Engine:
    """The model of the open session (its trainer) or a PLY loaded for viewing, a training thread and a
    render thread. Methods return reply fields and raise SplatwrightError with a message for the user.

    States (protocol.STATES): idle (no trainer), training, paused, stopping, stopped, finished, failed."""

    def __init__(self, workdir: Path, device: str, rasterizer: str, limits: Limits = Limits()):
        self.workdir, self.device, self.rasterizer, self.limits = workdir, device, rasterizer, limits
        self.emit: Callable[[dict], None] = lambda event: None  # the server points this at its client
        self.model_lock = threading.Lock()  # session data, trainer and viewed model
        self.cond = threading.Condition()  # state and stepping
        self.state = "idle"
        self.stepping = False  # the training thread is inside a step
        self.session: Session | None = None
        self.trainer: Trainer | None = None
        self.viewed: tuple[Gaussians, tuple] | None = None  # the open session's imported file and background
        self.settings = TRAINING.defaults()  # of the running training: its checkpoint and progress cadence
        # Whether the trainer's run has a checkpoint of its own: a fresh run leaves the old model's checkpoint
        # on the disk until it writes its first one.
        self.run_checkpointed = False
        self.train_thread: threading.Thread | None = None
        self.renders = RenderQueue()
        self.training_copies = TrainingCopies()
        # Frames render on their own stream, ahead of training's queued kernels (_draw says why that is safe).
        self.render_stream = torch.cuda.Stream(priority=RENDER_PRIORITY) if device == "cuda" else None
        self.saved = SavedModels(workdir, device)
        self.render_thread = threading.Thread(target=self._render_loop, name="render", daemon=True)
        self.render_thread.start()
        self._capabilities: dict | None = None

    # ---- status and capabilities ----

    def status(self) -> dict:
        """Without the model lock, so it answers at once whatever runs: each value is read once, and a step
        in progress shows as the one before it."""
        session, t, viewed = self.session, self.trainer, self.viewed
        shown = viewed[0] if viewed else (t.g if t else None)
        return {"session": session.name if session else None, "state": self.state,
                "views": len(session.cameras) if session else 0,
                "step": t.step if t else 0, "iterations": t.cfg.iterations if t else 0,
                "gaussians": len(viewed[0]) if viewed else (len(t.g) if t else 0),
                "checkpoint": bool(session and session.has_model),
                "settings": session.settings if session else None,
                "dynamic": isinstance(shown, DynamicGaussians)}

    def capabilities(self) -> dict:
        if self._capabilities is None:
            report = {**system_report(), "numpy": np.__version__, "protocol": protocol.PROTOCOL_VERSION,
                      "device": self.device, "rasterizer": self.rasterizer}
            self._capabilities = report
        return self._capabilities

    # ---- sessions and their data ----

    def open_session(self, name: str, create: bool) -> dict:
        if self.session is not None and self.session.name == name:
            return self.status()  # already open, e.g. a client reconnecting to the session it left training
        with self.cond:
            running = self.state in protocol.RUNNING
        if running:
            raise SplatwrightError(f"session {self.session.name!r} is training; stop it before opening another")
        self._switch_to(Session.open(self.workdir, name, create))
        return self.status()

    def _switch_to(self, session: Session, viewed: tuple[Gaussians, tuple] | None = None) -> None:
        """Make `session` the open one, with nothing trained in memory (`viewed`: its imported file's model)."""
        with self.model_lock:
            self.session, self.trainer, self.viewed = session, None, viewed
        with self.cond:
            self.state = "idle"
        self._emit_warnings(session)
        self._emit_state()  # the model shown changed (a state event says so, as training's progress does)

    def _emit_warnings(self, session: Session) -> None:
        """Tell the client (and the log) what the session could not read, once."""
        warnings, session.warnings = session.warnings, []
        for warning in warnings:
            log(f"session {session.name}: {warning}")
            self.emit({"event": "warning", "message": f"session {session.name!r}: {warning}"})

    def _require_session(self) -> Session:
        if self.session is None:
            raise SplatwrightError("no session is open; send open_session first")
        return self.session

    def check_view(self, camera: Camera) -> None:
        """Refuse a view over the limits before its image is decoded."""
        session = self._require_session()
        self.limits.check("views", len(session.cameras) + 1, "views in the session")
        self.limits.check("view_pixels", camera.width * camera.height, f"the {camera.width}x{camera.height} view")
        self.limits.check("session_pixels", session.pixels + camera.width * camera.height,
                          "pixels of the session's views with this one")

    def add_view(self, camera: Camera, image: np.ndarray, name: str, time: float | None = None) -> dict:
        session = self._require_session()
        self.check_view(camera)
        with self.model_lock:
            index = session.add_view(camera, image, name, time)
            if self.trainer is not None:
                self.trainer.add_view(camera, view_rgb(image, self.trainer.cfg.background), session.names[index],
                                      time or 0.0)
        return {"index": index, "views": index + 1}

    def set_points(self, xyz: np.ndarray, rgb: np.ndarray) -> dict:
        """Stores them only: the Gaussians are made from them (a neighbour search) when training starts, on the
        training thread."""
        session = self._require_session()
        self.limits.check("points", len(xyz), "initial points")
        with self.model_lock:
            session.set_points(xyz, rgb)
        return {"points": len(xyz), "note": "used when training starts from scratch"}

    # ---- training ----

    def _stopping(self) -> bool:
        return self.state == "stopping"

    def _new_trainer(self, cfg: TrainConfig) -> Trainer:
        """The set-up of a run from scratch; run on the training thread, InterruptedError once stopped."""
        session = self.session
        views, points = len(session.cameras), session.points  # what it has now; views added later join after
        gaussians = None
        if points is not None:
            start = time.monotonic()
            gaussians = Gaussians.from_point_cloud(*points, cfg.sh_degree, self.device, cancelled=self._stopping)
            log(f"initial Gaussians from {len(points[0])} points in {time.monotonic() - start:.1f} s")
        return Trainer(session.dataset(cfg.background, views), cfg, self.device, gaussians)

    def _trainer_from_checkpoint(self) -> Trainer:
        session = self.session
        views = len(session.cameras)  # what it has now; views added later join after
        state = session.load_checkpoint()
        self._emit_warnings(session)
        cfg = replace(TrainConfig.from_dict(state["config"]), rasterizer=self.rasterizer)
        return Trainer.from_checkpoint(session.dataset(cfg.background, views), state, self.device, cfg)

    def start_training(self, fields: dict) -> dict:
        """Start, or continue the session's trainer (in memory or its checkpoint) unless `fresh`. Returns at
        once: the trainer is set up (views, initial Gaussians or the checkpoint) on the training thread, and a
        state event follows once it is ready. With `fresh`, the session's checkpoint stays until the new run
        writes its own."""
        session = self._require_session()
        settings = {name: fields[name] for name in TRAINING.fields}
        with self.cond:
            if self.state in protocol.RUNNING:
                raise SplatwrightError(f"training is already running (state {self.state}); use resume, pause "
                                       "or stop instead")
        if not session.cameras:
            raise SplatwrightError("the session has no views yet; add views before starting training")
        self.limits.check("points", settings["init_points"] or 0, "init_points")
        with self.model_lock:
            if fields["fresh"]:
                self.trainer = None
            continued = self.trainer is not None or (not fields["fresh"] and session.checkpoint_path.is_file())
            self._check_unfinished()
            self.viewed = None
            session.save_settings(settings)
        self.settings = settings
        if self.trainer is not None or continued:
            self._launch_continued()
        else:
            self.run_checkpointed = False
            config = make_config(self.device, self.rasterizer, settings)
            self._launch(lambda: self._new_trainer(config))
        return {**self.status(), "continued": continued}

    def _launch_continued(self) -> None:
        """Train on from the trainer in memory, or else from the session's checkpoint."""
        if self.trainer is None:
            self.run_checkpointed = True
            self._launch(self._trainer_from_checkpoint)
        else:
            self._launch(None)

    def _check_unfinished(self) -> None:
        if self.trainer is not None and self.trainer.step >= self.trainer.cfg.iterations:
            raise SplatwrightError(f"training already finished at step {self.trainer.step}; "
                                   "start with fresh=true to train again")

    def resume(self) -> dict:
        with self.cond:
            running = self.state in protocol.RUNNING
            if self.state == "paused":
                self.state = "training"
                self.cond.notify_all()
        if running:
            self._emit_state()
            return self.status()
        session = self._require_session()
        with self.model_lock:
            if self.trainer is None and not session.checkpoint_path.is_file():
                raise SplatwrightError("nothing to resume: this session has no trainer or checkpoint; "
                                       "send start_training")
            self._check_unfinished()
            self.viewed = None
        if self.trainer is None:
            self.settings = session.settings or TRAINING.defaults()  # as it ran before a restart
        self._launch_continued()
        return self.status()

    def pause(self) -> dict:
        """Returns once the current step is done, so the reported step stays put until resume."""
        with self.cond:
            if self.state == "training":
                self.state = "paused"
            elif self.state != "paused":
                raise SplatwrightError(f"cannot pause: training is not running (state {self.state})")
            self.cond.wait_for(lambda: not self.stepping or self.state != "paused")
        with self.model_lock:
            self.training_copies.clear()  # nothing is queued now: frames copy the model at once
        self._emit_state()
        return self.status()

    def stop(self) -> dict:
        """Stop training (or its set-up) and checkpoint; returns once the checkpoint is written."""
        with self.cond:
            if self.state in ("training", "paused"):
                self.state = "stopping"
                self.cond.notify_all()
            thread = self.train_thread
        if thread is not None:
            thread.join()
        return self.status()

    def _launch(self, set_up: Callable[[], Trainer] | None) -> None:
        """Train on a new thread, first making the trainer with `set_up` unless there is one."""
        with self.cond:
            self.state = "training"
            self.stepping = False
        self.train_thread = threading.Thread(target=self._train_loop, args=(set_up,), name="train", daemon=True)
        self.train_thread.start()
        self._emit_state()

    def _train_loop(self, set_up: Callable[[], Trainer] | None) -> None:
        try:
            if set_up is not None and not self._install(set_up()):
                return
            final_state = self._run_steps()
            with self.model_lock:
                self.training_copies.clear()
                self._checkpoint()
            self._set_state(final_state)
            self.emit(self._progress(0.0))
        except InterruptedError:  # stopped during the set-up
            log("training stopped before its set-up finished")
            self._set_state("stopped" if self.trainer is not None else "idle")
        except SplatwrightError as e:  # e.g. a checkpoint that cannot be read
            self._fail(protocol.REJECTED, str(e))
        except FloatingPointError as e:
            self._fail(protocol.DIVERGED, f"training diverged ({e}); lower the learning rate or check the views")
        except torch.cuda.OutOfMemoryError:
            torch.cuda.empty_cache()
            self._fail(protocol.OUT_OF_MEMORY, "the GPU ran out of memory while training; lower max_gaussians "
                       "or the image size, or close other programs using the GPU")
        except Exception as e:  # a bug or an unexpected environment problem; keep serving
            traceback.print_exc()
            self._fail(protocol.INTERNAL, f"training failed: {e!r}; see the backend's log")

    def _install(self, trainer: Trainer) -> bool:
        """Make a newly set-up trainer the session's, with the views added while it was set up; False (and
        the finished state) if it has no steps left."""
        session = self.session
        with self.model_lock:
            for i in range(len(trainer.data), len(session.cameras)):
                trainer.add_view(session.cameras[i], view_rgb(session.images[i], trainer.cfg.background),
                                 session.names[i])
            self.trainer = trainer
        if trainer.step < trainer.cfg.iterations:
            self._emit_state()
            return True
        self._set_state("finished")
        self.emit({"event": "error", "code": protocol.REJECTED, "message": f"training already finished at step "
                   f"{trainer.step}; start with fresh=true to train again"})
        return False

    def _checkpoint(self) -> None:
        """Checkpoint the trainer (call with the model lock held); a failed write (a full disk, a read-only
        folder) is reported and training goes on."""
        try:
            self.trainer.save_checkpoint(self.session.checkpoint_path)
            self.run_checkpointed = True
        except SplatwrightError as e:
            log(str(e))
            self.emit({"event": "warning", "message": f"{e}; training goes on without it"})

    def _run_steps(self) -> str:
        """Step until stopped or finished; returns the state to end in."""
        last_time, last_step = time.monotonic(), self.trainer.step
        while True:
            with self.cond:
                self.stepping = False
                self.cond.notify_all()
                self.cond.wait_for(lambda: self.state != "paused")
                if self.state != "training":
                    return "stopped"
                self.stepping = True
            with self.model_lock:
                trainer = self.trainer
                if trainer.step >= trainer.cfg.iterations:
                    return "finished"
                trainer.train_step()
                self.training_copies.publish(trainer)
                if trainer.checkpoint_due(self.settings["checkpoint_every"], self.settings["checkpoint_seconds"]):
                    self._checkpoint()
            self.renders.let_in()
            now = time.monotonic()
            if now - last_time >= self.settings["progress_interval"]:
                self.emit(self._progress((trainer.step - last_step) / (now - last_time)))
                last_time, last_step = now, trainer.step

    def _fail(self, code: str, message: str) -> None:
        """After a failed step the model in memory may be half updated: go back to the last checkpoint of
        this run (a fresh run without one goes back to nothing)."""
        with self.model_lock:
            step = self.trainer.step if self.trainer else 0
            self.trainer = None
            self.training_copies.clear()
            if self.run_checkpointed and self.session.checkpoint_path.is_file():
                try:
                    self.trainer = self._trainer_from_checkpoint()
                except (SplatwrightError, RuntimeError) as e:
                    log(f"cannot reload the checkpoint after the failure: {e}")
            back_to = f"step {self.trainer.step}" if self.trainer else "nothing (no checkpoint yet)"
        log(f"step {step}: {message}")
        with self.cond:
            self.state = "failed"
            self.stepping = False
            self.cond.notify_all()
        self.emit({"event": "error", "code": code,
                   "message": f"at step {step}: {message}. The model went back to the last checkpoint, "
                              f"{back_to}; resume to retry from there or start with fresh=true."})
        self._emit_state()

    def _set_state(self, state: str) -> None:
        with self.cond:
            self.state = state
            self.stepping = False
            self.cond.notify_all()
        self._emit_state()

    def _emit_state(self) -> None:
        self.emit({"event": "state", **self.status()})

    def _progress(self, its_per_s: float) -> dict:
        with self.model_lock:
            t = self.trainer
            event = {"event": "progress", "state": self.state, "step": t.step, "iterations": t.cfg.iterations,
                     "loss": _finite_or_none(t.last["loss"]), "psnr": _finite_or_none(t.last["psnr"]),
                     "gaussians": len(t.g), "views": len(t.data), "its_per_s": round(its_per_s, 2),
                     "gpu_memory_mb": None}
        if self.device == "cuda":
            event["gpu_memory_mb"] = round(torch.cuda.memory_allocated() / 2**20, 1)
        return event

    # ---- the displayed model: render, export, checkpoints, PLY ----

    def _live_model(self, name: str | None) -> Model | None:
        """The model in memory a request for session `name`'s model (None: the shown one) gets: the open
        session's (its imported file, or its trainer's) when it names that session, else None (its saved model);
        call with model_lock held."""
        if name is not None and (self.session is None or self.session.name != name):
            return None
        if self.viewed is not None:  # the open session's imported file
            g, background = self.viewed
            return Model(g, g.max_sh_degree, background, 0)
        if self.trainer is not None:
            return trained_model(self.trainer)
        if name is not None:
            return None
        raise SplatwrightError("nothing to render yet: train a model, or load one (in Blender: Import Splats, or "
                               "a session with a checkpoint)")

    def _render_loop(self) -> None:
        if self.render_stream is not None:
            torch.cuda.set_stream(self.render_stream)  # this thread's current stream from now on
        while (job := self.renders.take()) is not None:
            frame = None
            try:
                fields, frame = self._draw(job)
                placed, payload = finish_frame(frame)
                if frame.slot is not None:
                    frame.slot.owner.sent(frame.slot.index)
                job.done({**fields, **placed}, payload)
                frame = None
            except SplatwrightError as e:
                job.fail(protocol.REJECTED, str(e))
            except torch.cuda.OutOfMemoryError:
                torch.cuda.empty_cache()
                job.fail(protocol.OUT_OF_MEMORY, f"the GPU ran out of memory rendering {job.camera.width}x"
                         f"{job.camera.height}; ask for a smaller frame")
            except Exception as e:  # a bug; the next frame may well work
                traceback.print_exc()
                job.fail(protocol.INTERNAL, f"rendering failed: {e!r}; see the backend's log")
            finally:
                if frame is not None and frame.slot is not None:  # not sent: the slot is free again
                    frame.slot.owner.discard(frame.slot.index)
                self.renders.settle(job)

    def submit_render(self, job: RenderJob) -> None:
        camera = job.camera
        try:
            self.limits.check("render_pixels", camera.width * camera.height, f"the {camera.width}x{camera.height} "
                              "frame")
        except SplatwrightError as e:
            job.fail(protocol.REJECTED, str(e))
            return
        self.renders.submit(job)

    def _draw(self, job: RenderJob) -> tuple[dict, QueuedFrame]:
        """The render reply's fields and the queued frame, drawn from a copy of the model taken under the model
        lock, so training and requests go on while it renders. The job is settled (training may take its next
        step) once the copy is taken.

        On the GPU this thread works on the high-priority render stream. While training runs watched, the copy is
        one the training thread made after a recent step and the GPU has finished (TrainingCopies). Otherwise it is
        queued on the render stream, after what the default stream (training's, and the requests' uploads) has
        queued so far: it reads the model as the last step left it. The default stream then waits for that copy
        before anything queued later, so no later in-place update can tear it, and memory freed by a later step
        (densification replaces the model's tensors) is reused, on the stream it was allocated on, only after the
        copy read it. The render itself reads only the copy and this stream's own tensors, so its kernels may pass
        training's queued ones."""
        camera = job.camera
        view = camera_tensors(camera, self.device)
        with torch.no_grad():
            with self.model_lock:
                model = self._live_model(job.model)
                if model is not None:
                    model = self._copied(model)
            self.renders.settle(job)
            if model is None:  # a saved model, loaded here when it is not yet: training goes on meanwhile
                model = self.saved.get(job.model)
            frame = queue_frame(chosen(model.g, job.crop, job.time), camera, model.sh_degree, model.background,
                                self.rasterizer, view, job.format, job.depth, job.shared)
        fields = {"width": camera.width, "height": camera.height, "format": frame.format, "step": model.step,
                  "dynamic": isinstance(model.g, DynamicGaussians),
                  "sh_degree": model.sh_degree, "background": [float(c) for c in model.background]}
        return fields, frame

    def _copied(self, model: Model) -> Model:
        """A copy of `model` to render from (_draw says why): on the GPU, while a live view watches training, a
        finished one the training thread made (TrainingCopies)."""
        if self.render_stream is None:
            return replace(model, g=model.g.detached())
        copy = self.training_copies.finished(self.trainer) if model.trained else None
        if copy is not None:
            # Made on training's stream: once freed, its memory waits for the render stream's work queued by then.
            for tensor in copy.g.tensors().values():
                tensor.record_stream(self.render_stream)
            return copy
        training = torch.cuda.default_stream()
        self.render_stream.wait_stream(training)
        g = model.g.detached()
        # The render stream holds nothing else now (the last frame's copy to the host was waited for), so training
        # waits for the copy alone.
        training.wait_stream(self.render_stream)
        return replace(model, g=g)

    def export_ply(self, name: str = "splats.ply", model: str | None = None, crop: np.ndarray | None = None,
                   time: float | None = None, placement: np.ndarray | None = None) -> tuple[dict, bytes]:
        """Session `model`'s model (None: the shown one; protocol.MODEL_CHOICE), at `time` if it is 4D, cropped
        and placed, in the format the file `name` is for; a *.pt name asks for a 4D model's own file (the one
        training writes), its motion placed with it and cropped to the Gaussians inside the box at `time`."""
        dynamic_file = Path(name).suffix.lower() == DYNAMIC_SUFFIX
        fmt = DYNAMIC_FORMAT if dynamic_file else format_for_path(name)
        with self.model_lock:  # a snapshot only: encoding a large model must not hold up training or rendering
            shown = self._live_model(model)
            if shown is not None:
                shown = replace(shown, g=shown.g.detached())
        shown = shown or self.saved.get(model)
        dynamic = isinstance(shown.g, DynamicGaussians)
        if dynamic_file:
            if not dynamic:
                what = "the model shown" if model is None else f"the model of session {model!r}"
                raise SplatwrightError(f"{name}: {what} is a static model, the same at every time, and a .pt file "
                                       f"holds a 4D model ({DYNAMIC_FILE} from training on views with times); "
                                       "export it as .ply, .compressed.ply, .spz or .splat")
            g = placed(kept(shown.g, crop, time), placement)
            data = dynamic_file_bytes(g)
            said = [] if crop is None else [f"the crop box kept the Gaussians inside it at time {time or 0.0:g}"]
        else:
            g = placed(chosen(shown.g, crop, time), placement)
            data = encode_any(g, fmt)
            said = notes(g, fmt)
        path = ""
        whole = crop is None and placement is None and (time is None or not dynamic)  # a static one at any time
        if shown.trained and whole and not dynamic_file:
            # the session's whole trained model is also kept beside its checkpoint, as a PLY; a viewed one is not
            path = self.session.write_file("splats.ply", data if fmt == "ply" else encode_ply(g))
        fields = {"path": path, "gaussians": len(g), "step": shown.step, "format": fmt, "note": "; ".join(said),
                  "dynamic": dynamic}
        return fields, data

    def save_checkpoint(self) -> dict:
        with self.model_lock:
            if self.trainer is None:
                raise SplatwrightError("no trainer to checkpoint; start training first")
            self.trainer.save_checkpoint(self.session.checkpoint_path)
            self.run_checkpointed = True
            return {"step": self.trainer.step, "path": self.session.shown(self.session.checkpoint_path)}

    def load_checkpoint(self) -> dict:
        """Replace the trainer by the session's checkpoint (also while training: the next step uses it); in a
        session made by an import that has none, show the file it keeps."""
        session = self._require_session()
        if not session.checkpoint_path.is_file():
            if session.imported_file is None:
                raise SplatwrightError(f"session {session.name!r} has no checkpoint yet")
            model = imported_model(*session.imported_file, self.device)
            with self.model_lock:
                self.trainer, self.viewed = None, (model.g, model.background)
            self._emit_state()
            return self.status()
        trainer = self._trainer_from_checkpoint()
        with self.model_lock:
            self.trainer, self.viewed = trainer, None
            self.run_checkpointed = True
        with self.cond:
            if self.state in ("idle", "failed", "finished"):
                self.state = "stopped"
        self._emit_state()
        return self.status()

    def load_ply(self, data: bytes, background, name: str = "") -> dict:
        """Show the splat file `data` (any format, told by its content; `name`, its file name, tells a .splat),
        or a 4D model's file (splats4d.pt: a *.pt name or a torch file's content), drawn at each request's
        time. The file is kept in a new session named after it, which opens: a splat object can place that
        session's model in a scene, and renders naming it draw it after a restart too."""
        with self.cond:
            if self.state in protocol.RUNNING:
                raise SplatwrightError("training is running; stop it before loading a model to view")
        data = bytes(data)
        g = read_model_file(data, name).to(self.device)  # a file that cannot be read makes no session
        session = Session.create_imported(self.workdir, name, data, background)
        self._switch_to(session, (g, tuple(background)))
        # and the status says whether it is 4D
        return {"gaussians": len(g), "sh_degree": g.max_sh_degree, "session": session.name}

    def close(self, render_wait: float = 0.2) -> bool:
        """Stop training (with a checkpoint) and the render thread; returns whether the render thread ended
        within `render_wait` seconds (a long CPU render cannot be interrupted: the process then exits without
        waiting for it)."""
        self.stop()
        self.renders.close()
        self.render_thread.join(timeout=render_wait)
        return not self.render_thread.is_alive()


def _finite_or_none(x: float) -> float | None:
    return x if math.isfinite(x) else None


def is_dynamic_file(data: bytes, name: str) -> bool:
    """Whether a file is a 4D model's (backend.dynamic): named *.pt, or a torch file (a zip) not named as a
    .splat (the one splat format without magic bytes)."""
    lower = name.lower()
    return lower.endswith(DYNAMIC_SUFFIX) or (data[:len(ZIP_MAGIC)] == ZIP_MAGIC and not lower.endswith(".splat"))


def read_model_file(data: bytes, name: str) -> Gaussians:
    """The model of a splat file or a 4D model's file (load_ply's); `name`, the file's, may be empty."""
    what = name or "the uploaded model"
    return read_dynamic_file(data, what) if is_dynamic_file(data, name) else read_any(data, what)


def read_dynamic_file(data: bytes, name: str) -> DynamicGaussians:
    """The 4D model of a file's bytes (read_dynamic), refused in one line where torch explains at length why it
    will not load a file (one of objects other than tensors, which no upload may run, or no torch file)."""
    try:
        return read_dynamic(data, name)
    except SplatwrightError as e:
        if "\n" not in str(e):
            raise
    what = ("a torch file of objects other than tensors" if data[:len(ZIP_MAGIC)] == ZIP_MAGIC
            else "not a torch file")
    raise SplatwrightError(f"{name}: not a Splatwright 4D model ({what}; training on timed views writes "
                           f"{DYNAMIC_FILE})") from None


def dynamic_file_bytes(g: DynamicGaussians) -> bytes:
    """The file of 4D model `g` as training writes it: by write_dynamic itself (one definition of the file), in
    a temporary folder."""
    with tempfile.TemporaryDirectory(prefix="splatwright-") as folder:
        path = Path(folder) / DYNAMIC_FILE
        write_dynamic(path, g)
        return path.read_bytes()


def chosen(g: Gaussians, crop: np.ndarray | None, time: float | None) -> Gaussians:
    """The Gaussians a request chose of model `g` (protocol.MODEL_CHOICE): a 4D model's at `time`, cropped."""
    return cropped(g.at(0.0 if time is None else time), crop)


def cropped(g: Gaussians, crop: np.ndarray | None) -> Gaussians:
    """The Gaussians whose centres `crop` (model space into a box's unit cube) takes into [-1, 1]^3."""
    return g if crop is None else subset(g, inside(g.means, crop))


def kept(g: Gaussians, crop: np.ndarray | None, time: float | None) -> Gaussians:
    """The Gaussians of model `g` (a 4D model's with their motion) whose centres at `time` (None: 0) `crop`
    takes into [-1, 1]^3."""
    return g if crop is None else subset(g, inside(g.at(0.0 if time is None else time).means, crop))


def inside(means: torch.Tensor, crop: np.ndarray) -> torch.Tensor:
    m = torch.as_tensor(crop, dtype=means.dtype, device=means.device)
    return ((means @ m[:3, :3].T + m[:3, 3]).abs() <= 1.0).all(dim=-1)


def subset(g: Gaussians, mask: torch.Tensor) -> Gaussians:
    return type(g)(**{name: value[mask] for name, value in g.tensors().items()})


def placed(g: Gaussians, placement: np.ndarray | None) -> Gaussians:
    """The Gaussians moved by `placement` (a rotation, a translation and one scale: protocol.placement_scale):
    their means, rotations, scales and view-dependent colours, and a 4D model's motion with them (so the
    placed model at any time is the model at that time, placed)."""
    if placement is None:
        return g
    scale = placement_scale(placement)
    m = torch.as_tensor(placement, dtype=g.means.dtype, device=g.means.device)
    rotation = placement[:3, :3] / scale
    turn = torch.as_tensor(matrix_to_quat(rotation), dtype=g.quats.dtype, device=g.quats.device)
    moved = replace(g, means=g.means @ m[:3, :3].T + m[:3, 3], log_scales=g.log_scales + math.log(scale),
                    quats=quat_multiply(turn.expand_as(g.quats), g.quats),
                    sh_rest=rotate_sh(g.sh_rest, torch.as_tensor(rotation)))
    if isinstance(g, DynamicGaussians):  # velocities and accelerations scale and turn, angular velocities turn
        turned = torch.as_tensor(rotation, dtype=g.means.dtype, device=g.means.device)
        moved = replace(moved, velocities=g.velocities @ m[:3, :3].T, accelerations=g.accelerations @ m[:3, :3].T,
                        angular_velocities=g.angular_velocities @ turned.T)
    return moved


def matrix_to_quat(rotation: np.ndarray) -> np.ndarray:
    """The unit quaternion (w, x, y, z) of a rotation matrix (from its largest component, for accuracy)."""
    r = rotation
    trace = np.trace(r)
    candidates = [1 + trace, 1 + r[0, 0] - r[1, 1] - r[2, 2], 1 - r[0, 0] + r[1, 1] - r[2, 2],
                  1 - r[0, 0] - r[1, 1] + r[2, 2]]
    k = int(np.argmax(candidates))
    s = 2.0 * math.sqrt(candidates[k])
    if k == 0:
        q = [s / 4, (r[2, 1] - r[1, 2]) / s, (r[0, 2] - r[2, 0]) / s, (r[1, 0] - r[0, 1]) / s]
    elif k == 1:
        q = [(r[2, 1] - r[1, 2]) / s, s / 4, (r[0, 1] + r[1, 0]) / s, (r[0, 2] + r[2, 0]) / s]
    elif k == 2:
        q = [(r[0, 2] - r[2, 0]) / s, (r[0, 1] + r[1, 0]) / s, s / 4, (r[1, 2] + r[2, 1]) / s]
    else:
        q = [(r[1, 0] - r[0, 1]) / s, (r[0, 2] + r[2, 0]) / s, (r[1, 2] + r[2, 1]) / s, s / 4]
    return np.array(q) / np.linalg.norm(q)
