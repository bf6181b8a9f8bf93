"""The training of the open session: the thread that steps its trainer and the engine's states
(protocol.STATES), and the copies of the training model that live views draw from while it trains."""
from __future__ import annotations

import math
import threading
import time
import traceback
import weakref
from dataclasses import replace
from typing import Callable

import torch

from blender_addon.core import protocol
from blender_addon.core.errors import SplatwrightError
from blender_addon.core.settings import TRAINING
from ..dynamic import DynamicGaussians
from ..gaussians import Gaussians, with_far_field
from ..policy import make_config
from ..train import TrainConfig, Trainer
from .frames import view_rgb
from .group_training import GroupRun, follow, from_bytes
from .limits import Limits
from .log import log
from .render_queue import RenderQueue
from .saved_models import imported_model
from .session import Session
from .shown import Model, Shown, trained_model

WATCH_SECONDS = 1.0  # a live view that asked for a frame of the training model this recently gets its copies


class TrainingCopies:
    """Copies of the training model that the training thread makes after each step on the GPU while a live view
    watches it (asked for a frame of it within WATCH_SECONDS), each with an event recorded after its copy. A frame
    then draws the newest copy the GPU has finished, a step or two old, instead of copying the model behind the
    kernels of the step still queued on the GPU (Renderer._copied). The two kept take twice the model's parameters
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


class Training:
    """The open session's training, one thread at a time, and the engine's states (protocol.STATES): idle (no
    trainer), training, paused, stopping, stopped, finished, failed. Its methods raise SplatwrightError with a
    message for the user, and every change of state is told as a state event."""

    def __init__(self, shown: Shown, limits: Limits, device: str, rasterizer: str, copies: TrainingCopies,
                 renders: RenderQueue, emit: Callable[[dict], None], processes: int = 1, parallel: str = "data"):
        self.shown, self.limits, self.device, self.rasterizer = shown, limits, device, rasterizer
        # How many processes train (group_training.py, `serve --gpus`) and how they share the work.
        self.processes, self.parallel = processes, parallel
        self.copies = copies  # made after each step while a live view watches
        self.renders = renders  # waiting frames are let in between steps
        self.emit = emit
        self.cond = threading.Condition()  # state and stepping
        self.state = "idle"
        self.failure = ""  # why the training last failed: the state event's reason while the state is failed
        self.stepping = False  # the training thread is inside a step
        self.settings = TRAINING.defaults()  # of the running training: its checkpoint and progress cadence
        # Whether the trainer's run has a checkpoint of its own: a fresh run leaves the old model's checkpoint
        # on the disk until it writes its first one.
        self.run_checkpointed = False
        self.thread: threading.Thread | None = None

    def status(self) -> dict:
        """Without the model lock, so it answers at once whatever runs: each value is read once, and a step
        in progress shows as the one before it."""
        session, t, viewed = self.shown.session, self.shown.trainer, self.shown.viewed
        model = viewed.g if viewed else (t.g if t else None)
        state = self.state
        return {"session": session.name if session else None, "state": state,
                "reason": self.failure if state == "failed" else None,
                "views": len(session.cameras) if session else 0,
                "step": t.step if t else 0, "iterations": t.cfg.iterations if t else 0,
                "gaussians": len(viewed.g) if viewed else (len(t.g) if t else 0),
                "checkpoint": bool(session and session.has_model),
                "settings": session.settings if session else None,
                "dynamic": isinstance(model, DynamicGaussians), "rendered": self.renders.rendered}

    def running(self) -> bool:
        with self.cond:
            return self.state in protocol.RUNNING

    def show(self, session: Session, viewed: Model | None = None) -> None:
        """Make `session` the open one, with nothing trained in memory (`viewed`: its imported file's model)."""
        with self.shown.lock:
            self.shown.session, self.shown.trainer, self.shown.viewed = session, None, viewed
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

    # ---- requests ----

    def start(self, fields: dict, model: Gaussians | None = None) -> dict:
        """Start, or continue the session's trainer (in memory or its checkpoint) unless `fresh`; with `model`,
        continue from it instead of the trainer's own model (continuing_from). Returns at once: the trainer is set
        up (views, initial Gaussians or the checkpoint) on the training thread, and a state event follows once it
        is ready. With `fresh`, the session's checkpoint stays until the new run writes its own."""
        shown = self.shown
        session = shown.require_session()
        settings = {name: fields[name] for name in TRAINING.fields}
        with self.cond:
            if self.state in protocol.RUNNING:
                raise SplatwrightError(f"training is already running (state {self.state}); use resume, pause "
                                       "or stop instead")
        if not session.cameras:
            raise SplatwrightError("the session has no views yet; add views before starting training")
        if model is not None and fields["fresh"]:
            raise SplatwrightError("a model sent with start_training is continued from, and fresh starts over "
                                   "without it; send it without fresh")
        if model is not None and any(t is not None for t in session.times):
            raise SplatwrightError(f"session {session.name!r} trains a 4D model (its views have times), and a model "
                                   "sent to continue from is static; continue without it, or start over")
        self.limits.check("points", settings["init_points"] or 0, "init_points")
        self.limits.check("points", settings["far_field"] or 0, "far_field")
        with shown.lock:
            if fields["fresh"]:
                shown.trainer = None
            continued = shown.trainer is not None or (not fields["fresh"] and session.checkpoint_path.is_file())
            if model is not None and not continued:
                raise SplatwrightError(f"session {session.name!r} has no trained model for the model sent to "
                                       "replace; train it first, or start without a model")
            self._check_unfinished()
            shown.viewed = None
            session.save_settings(settings)
        self.settings = settings
        if continued:
            self._launch_continued(model)
        else:
            self.run_checkpointed = False
            config = make_config(self.device, self.rasterizer, settings)
            config = replace(config, batch_views=max(config.batch_views, self.processes))  # a view a process
            self._launch(lambda: self._new_trainer(config))
        return {**self.status(), "continued": continued}

    def resume(self) -> dict:
        with self.cond:
            running = self.state in protocol.RUNNING
            if self.state == "paused":
                self.state = "training"
                self.cond.notify_all()
        if running:
            self._emit_state()
            return self.status()
        shown = self.shown
        session = shown.require_session()
        with shown.lock:
            if shown.trainer is None and not session.checkpoint_path.is_file():
                raise SplatwrightError("nothing to resume: this session has no trainer or checkpoint; "
                                       "send start_training")
            self._check_unfinished()
            shown.viewed = None
        if shown.trainer is None:
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
        with self.shown.lock:
            self.copies.clear()  # nothing is queued now: frames copy the model at once
        self._emit_state()
        return self.status()

    def stop(self) -> dict:
        """Stop training (or its set-up) and checkpoint; returns once the checkpoint is written."""
        with self.cond:
            if self.state in ("training", "paused"):
                self.state = "stopping"
                self.cond.notify_all()
            thread = self.thread
        if thread is not None:
            thread.join()
        return self.status()

    def save_checkpoint(self) -> dict:
        self._check_not_in_group("checkpoint")
        shown = self.shown
        with shown.lock:
            if shown.trainer is None:
                raise SplatwrightError("no trainer to checkpoint; start training first")
            shown.trainer.save_checkpoint(shown.session.checkpoint_path)
            self.run_checkpointed = True
            return {"step": shown.trainer.step, "path": shown.session.shown(shown.session.checkpoint_path)}

    def load_checkpoint(self) -> dict:
        """Replace the trainer by the session's checkpoint (also while training: the next step uses it); in a
        session made by an import that has none, show the file it keeps."""
        self._check_not_in_group("load a checkpoint")
        shown = self.shown
        session = shown.require_session()
        if not session.checkpoint_path.is_file():
            if session.imported_file is None:
                raise SplatwrightError(f"session {session.name!r} has no checkpoint yet")
            model = imported_model(*session.imported_file, self.device, self.limits.budget())
            with shown.lock:
                shown.trainer, shown.viewed = None, model
            self._emit_state()
            return self.status()
        trainer = self._trainer_from_checkpoint()
        with shown.lock:
            shown.trainer, shown.viewed = trainer, None
            self.run_checkpointed = True
        with self.cond:
            if self.state in ("idle", "failed", "finished"):
                self.state = "stopped"
        self._emit_state()
        return self.status()

    def _check_not_in_group(self, what: str) -> None:
        """The server's trainer only shows a group's model while the group trains (group_training.py)."""
        with self.cond:
            if self.processes > 1 and self.stepping:
                raise SplatwrightError(f"training runs in {self.processes} processes, which write its checkpoints; "
                                       f"pause it to {what}")

    # ---- the training thread ----

    def _stopping(self) -> bool:
        return self.state == "stopping"

    def _new_trainer(self, cfg: TrainConfig) -> Trainer:
        """The set-up of a run from scratch; run on the training thread, InterruptedError once stopped."""
        session = self.shown.session
        views, points = len(session.cameras), session.points  # what it has now; views added later join after
        data = session.dataset(cfg.background, views)
        gaussians = None
        if points is not None:
            start = time.monotonic()
            # The session's points say not where they come from: far-field points only where asked for.
            points = with_far_field(*points, data.cameras, data.images, self.settings["far_field"] or 0, cfg.seed)
            gaussians = Gaussians.from_point_cloud(*points, cfg.sh_degree, self.device, cancelled=self._stopping)
            log(f"initial Gaussians from {len(points[0])} points in {time.monotonic() - start:.1f} s")
        return Trainer(data, cfg, self.device, gaussians)

    def _trainer_from_checkpoint(self) -> Trainer:
        session = self.shown.session
        views = len(session.cameras)  # what it has now; views added later join after
        state = session.load_checkpoint()
        self._emit_warnings(session)
        cfg = replace(TrainConfig.from_dict(state["config"]), rasterizer=self.rasterizer)
        return Trainer.from_checkpoint(session.dataset(cfg.background, views), state, self.device, cfg)

    def _launch_continued(self, model: Gaussians | None = None) -> None:
        """Train on from the trainer in memory, or else from the session's checkpoint; with `model`, their run
        goes on from that model (continuing_from)."""
        trainer = self.shown.trainer
        if trainer is None:
            self.run_checkpointed = True
        if model is not None:
            self._launch(lambda: continuing_from(trainer if trainer is not None else self._trainer_from_checkpoint(),
                                                 model))
        elif trainer is None:
            self._launch(self._trainer_from_checkpoint)
        else:
            self._launch(None)

    def _check_unfinished(self) -> None:
        trainer = self.shown.trainer
        if trainer is not None and trainer.step >= trainer.cfg.iterations:
            raise SplatwrightError(f"training already finished at step {trainer.step}; "
                                   "start with fresh=true to train again")

    def _launch(self, set_up: Callable[[], Trainer] | None) -> None:
        """Train on a new thread, first making the trainer with `set_up` unless there is one."""
        with self.cond:
            self.state = "training"
            self.stepping = False
        self.thread = threading.Thread(target=self._train_loop, args=(set_up,), name="train", daemon=True)
        self.thread.start()
        self._emit_state()

    def _train_loop(self, set_up: Callable[[], Trainer] | None) -> None:
        try:
            if set_up is not None and not self._install(set_up()):
                return
            final_state = self._run_steps() if self.processes == 1 else self._run_group()
            with self.shown.lock:
                self.copies.clear()
                self._checkpoint()
            self._set_state(final_state)
            self.emit(self._progress(0.0))
        except InterruptedError:  # stopped during the set-up
            log("training stopped before its set-up finished")
            self._set_state("stopped" if self.shown.trainer is not None else "idle")
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
        """Make a newly set-up trainer the session's, with the views added while it was set up, and tell the client
        once how it trains otherwise than asked (trainer.note); False (and the finished state) if it has no steps
        left."""
        shown = self.shown
        session = shown.session
        if trainer.note:
            log(f"session {session.name}: {trainer.note}")
            self.emit({"event": "warning", "message": trainer.note})
        with shown.lock:
            for i in range(len(trainer.data), len(session.cameras)):
                trainer.add_view(session.cameras[i], view_rgb(session.images[i], trainer.cfg.background),
                                 session.names[i])
            shown.trainer = trainer
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
            self.shown.trainer.save_checkpoint(self.shown.session.checkpoint_path)
            self.run_checkpointed = True
        except SplatwrightError as e:
            log(str(e))
            self.emit({"event": "warning", "message": f"{e}; training goes on without it"})

    def _between_steps(self) -> bool:
        """Not stepping while paused (what waits for a pause goes on); whether the state is training again."""
        with self.cond:
            self.stepping = False
            self.cond.notify_all()
            self.cond.wait_for(lambda: self.state != "paused")
            if self.state != "training":
                return False
            self.stepping = True
            return True

    def _run_steps(self) -> str:
        """Step until stopped or finished; returns the state to end in."""
        last_time, last_step = time.monotonic(), self.shown.trainer.step
        while True:
            if not self._between_steps():
                return "stopped"
            with self.shown.lock:
                trainer = self.shown.trainer
                if trainer.step >= trainer.cfg.iterations:
                    return "finished"
                trainer.train_step()
                self.copies.publish(trainer)
                if trainer.checkpoint_due(self.settings["checkpoint_every"], self.settings["checkpoint_seconds"]):
                    self._checkpoint()
            self.renders.let_in()
            now = time.monotonic()
            if now - last_time >= self.settings["progress_interval"]:
                self.emit(self._progress((trainer.step - last_step) / (now - last_time)))
                last_time, last_step = now, trainer.step

    def _run_group(self) -> str:
        """Train in the group of processes, a run while the state is training; returns the state to end in."""
        told = {"", self.shown.trainer.note}  # notes told once: the server's trainer's, and the group's
        while True:
            if not self._between_steps():
                return "stopped"
            trainer = self._group_run(told)
            if trainer.step >= trainer.cfg.iterations:
                return "finished"

    def _group_run(self, told: set[str]) -> Trainer:
        """A run of the group from the server's trainer until it finishes or the state leaves training; the
        group's state at its end becomes the server's trainer, which it returns. Its notes not in `told` are told."""
        shown = self.shown
        trainer = shown.trainer
        run = GroupRun(self.processes, self.device, self.parallel, trainer, self.rasterizer, self.settings,
                       str(shown.session.checkpoint_path))
        last_time, last_step, final = time.monotonic(), trainer.step, None
        try:
            for kind, message in run.messages():
                if self.state != "training":
                    run.stop.set()
                if kind == "model":
                    with shown.lock:
                        follow(trainer, message, self.device)
                    now = time.monotonic()
                    self.emit(self._progress((trainer.step - last_step) / (now - last_time)))
                    last_time, last_step = now, trainer.step
                elif kind == "checkpoint":
                    self.run_checkpointed = True
                elif kind == "warning" or (kind == "note" and message not in told):
                    told.add(message)
                    log(f"session {shown.session.name}: {message}")
                    self.emit({"event": "warning", "message": message})
                elif kind == "end":
                    final = from_bytes(message)
        finally:
            run.end()
        if final is None:
            raise SplatwrightError(f"the {self.processes} training processes ended without sending their model")
        cfg = replace(TrainConfig.from_dict(final["config"]), rasterizer=self.rasterizer)
        ended = Trainer.from_checkpoint(trainer.data, final, self.device, cfg)
        with shown.lock:
            shown.trainer = ended
        return ended

    def _fail(self, code: str, message: str) -> None:
        """After a failed step the model in memory may be half updated: go back to the last checkpoint of
        this run (a fresh run without one goes back to nothing)."""
        shown = self.shown
        with shown.lock:
            step = shown.trainer.step if shown.trainer else 0
            shown.trainer = None
            self.copies.clear()
            if self.run_checkpointed and shown.session.checkpoint_path.is_file():
                try:
                    shown.trainer = self._trainer_from_checkpoint()
                except (SplatwrightError, RuntimeError) as e:
                    log(f"cannot reload the checkpoint after the failure: {e}")
            back_to = f"step {shown.trainer.step}" if shown.trainer else "nothing (no checkpoint yet)"
        log(f"step {step}: {message}")
        failure = (f"at step {step}: {message}. The model went back to the last checkpoint, {back_to}; resume to "
                   f"retry from there or start with fresh=true.")[:protocol.MAX_TEXT_CHARS]
        with self.cond:
            self.failure = failure  # before the state: status() reads both without the lock
            self.state = "failed"
            self.stepping = False
            self.cond.notify_all()
        self.emit({"event": "error", "code": code, "message": failure})
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
        with self.shown.lock:
            t = self.shown.trainer
            event = {"event": "progress", "state": self.state, "step": t.step, "iterations": t.cfg.iterations,
                     "loss": _finite_or_none(t.last["loss"]), "psnr": _finite_or_none(t.last["psnr"]),
                     "gaussians": len(t.g), "views": len(t.data), "its_per_s": round(its_per_s, 2),
                     "gpu_memory_mb": None}
        if self.device == "cuda":
            event["gpu_memory_mb"] = round(torch.cuda.memory_allocated() / 2**20, 1)
        return event


def continuing_from(trainer: Trainer, model: Gaussians) -> Trainer:
    """A static `trainer`'s run going on from `model` (such as the trainer's model as a user edited it: points
    deleted, moved, cropped) instead of its own: the same views, configuration, step, training time and random
    state, so the learning rates, the SH degree and densification go on where they were. The model's rows need not
    match the old model's, so Adam's moments and step counts start at zero, as for a new model, and so do the
    densification statistics (the next densification counts the steps since)."""
    replaced = Trainer(trainer.data, trainer.cfg, trainer.device, model)
    replaced.step, replaced.train_seconds = trainer.step, trainer.train_seconds
    replaced.checkpointed_at = trainer.checkpointed_at
    replaced.generator.set_state(trainer.generator.get_state())
    replaced.note = trainer.note
    return replaced


def _finite_or_none(x: float) -> float | None:
    return x if math.isfinite(x) else None
