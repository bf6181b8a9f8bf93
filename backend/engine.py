"""The engine behind the server: the open session's model, a training thread and a render thread, and the
state machine they follow (protocol.STATES). Its methods answer the server's requests with reply fields and
raise SplatwrightError with a message for the user; it knows nothing about sockets."""
from __future__ import annotations

import math
import sys
import threading
import time
import traceback
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from blender_addon.core import protocol
from blender_addon.core.cameras import Camera
from blender_addon.core.errors import SplatwrightError
from blender_addon.core.files import write_atomic
from blender_addon.core.settings import TRAINING
from .frames import QueuedFrame, encode_frame, queue_frame, view_rgb
from .gaussians import Gaussians
from .ply import encode_ply, read_ply
from .policy import make_config, system_report
from .render import camera_tensors
from .session import Session
from .train import TrainConfig, Trainer, load_checkpoint


def log(message: str) -> None:
    print(f"splatwright serve: {message}", file=sys.stderr, flush=True)


@dataclass
class RenderJob:
    camera: Camera
    format: str
    depth: bool  # also send the depth plane
    done: Callable[[dict, bytes | memoryview], None]  # reply fields and payload
    fail: Callable[[str, str], None]  # error code and message
    seq: int = 0


class RenderQueue:
    """At most one render waits: a newer request supersedes it. The trainer calls `let_in` between steps so
    a waiting frame is rendered before the next step starts."""

    def __init__(self):
        self.cond = threading.Condition()
        self.waiting: RenderJob | None = None
        self.submitted = 0  # sequence number of the newest job
        self.settled = 0  # newest sequence number rendered (or failed)
        self.closed = False

    def submit(self, job: RenderJob) -> None:
        with self.cond:
            self.submitted += 1
            job.seq = self.submitted
            old, self.waiting = self.waiting, job
            self.cond.notify_all()
        if old is not None:
            old.fail(protocol.SUPERSEDED, "a newer render request replaced this one before it started")

    def take(self) -> RenderJob | None:
        """The next job, or None once closed."""
        with self.cond:
            self.cond.wait_for(lambda: self.waiting is not None or self.closed)
            job, self.waiting = self.waiting, None
            return None if self.closed else job

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

    def __init__(self, workdir: Path, device: str, rasterizer: str):
        self.workdir, self.device, self.rasterizer = workdir, device, rasterizer
        self.emit: Callable[[dict], None] = lambda event: None  # the server points this at its client
        self.model_lock = threading.Lock()  # session data, trainer and viewed model
        self.cond = threading.Condition()  # state and stepping
        self.state = "idle"
        self.stepping = False  # the training thread is inside a step
        self.session: Session | None = None
        self.trainer: Trainer | None = None
        self.viewed: tuple[Gaussians, tuple] | None = None  # a loaded PLY and its background
        self.settings = TRAINING.defaults()  # of the running training: its checkpoint and progress cadence
        self.train_thread: threading.Thread | None = None
        self.renders = RenderQueue()
        self.render_thread = threading.Thread(target=self._render_loop, name="render", daemon=True)
        self.render_thread.start()
        self._capabilities: dict | None = None

    # ---- status and capabilities ----

    def status(self) -> dict:
        with self.model_lock:
            t = self.trainer
            return {"session": self.session.name if self.session else None, "state": self.state,
                    "views": len(self.session.cameras) if self.session else 0,
                    "step": t.step if t else 0, "iterations": t.cfg.iterations if t else 0,
                    "gaussians": len(self.viewed[0]) if self.viewed else (len(t.g) if t else 0),
                    "checkpoint": bool(self.session and self.session.checkpoint_path.is_file()),
                    "settings": self.session.settings if self.session else None}

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
        session = Session.open(self.workdir, name, create)
        with self.model_lock:
            self.session, self.trainer, self.viewed = session, None, None
        with self.cond:
            self.state = "idle"
        self._emit_state()  # the model shown changed (a state event says so, as training's progress does)
        return self.status()

    def _require_session(self) -> Session:
        if self.session is None:
            raise SplatwrightError("no session is open; send open_session first")
        return self.session

    def add_view(self, camera: Camera, image: np.ndarray, name: str) -> dict:
        session = self._require_session()
        with self.model_lock:
            index = session.add_view(camera, image, name)
            if self.trainer is not None:
                self.trainer.add_view(camera, view_rgb(image, self.trainer.cfg.background), session.names[index])
        return {"index": index, "views": index + 1}

    def set_points(self, xyz: np.ndarray, rgb: np.ndarray) -> dict:
        session = self._require_session()
        with self.model_lock:
            session.set_points(xyz, rgb)
        return {"points": len(xyz), "note": "used when training starts from scratch"}

    # ---- training ----

    def _new_trainer(self, cfg: TrainConfig) -> Trainer:
        session = self.session
        gaussians = None
        if session.points is not None:
            gaussians = Gaussians.from_point_cloud(*session.points, cfg.sh_degree, self.device)
        return Trainer(session.dataset(cfg.background), cfg, self.device, gaussians)

    def _trainer_from_checkpoint(self) -> Trainer:
        state = load_checkpoint(self.session.checkpoint_path)
        cfg = replace(TrainConfig.from_dict(state["config"]), rasterizer=self.rasterizer)
        return Trainer.from_checkpoint(self.session.dataset(cfg.background), state, self.device, cfg)

    def start_training(self, fields: dict) -> dict:
        """Start, or continue the session's trainer (in memory or its checkpoint) unless `fresh`."""
        session = self._require_session()
        settings = {name: fields[name] for name in TRAINING.fields}
        with self.cond:
            if self.state in protocol.RUNNING:
                raise SplatwrightError(f"training is already running (state {self.state}); use resume, pause "
                                       "or stop instead")
        if not session.cameras:
            raise SplatwrightError("the session has no views yet; add views before starting training")
        with self.model_lock:
            if fields["fresh"]:
                session.checkpoint_path.unlink(missing_ok=True)
                self.trainer = None
            continued = self.trainer is not None or session.checkpoint_path.is_file()
            if self.trainer is None:
                if continued:
                    self.trainer = self._trainer_from_checkpoint()
                else:
                    self.trainer = self._new_trainer(make_config(self.device, self.rasterizer, settings))
            if self.trainer.step >= self.trainer.cfg.iterations:
                raise SplatwrightError(f"training already finished at step {self.trainer.step}; "
                                       "start with fresh=true to train again")
            self.viewed = None
            session.save_settings(settings)
        self.settings = settings
        self._launch()
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
        session = self._require_session()
        with self.model_lock:
            if self.trainer is None:
                if not session.checkpoint_path.is_file():
                    raise SplatwrightError("nothing to resume: this session has no trainer or checkpoint; "
                                           "send start_training")
                self.trainer = self._trainer_from_checkpoint()
                self.settings = session.settings or TRAINING.defaults()  # as it ran before a restart
            if self.trainer.step >= self.trainer.cfg.iterations:
                raise SplatwrightError(f"training already finished at step {self.trainer.step}")
            self.viewed = None
        self._launch()
        return self.status()

    def pause(self) -> dict:
        """Returns once the current step is done, so the reported step stays put until resume."""
        with self.cond:
            if self.state == "training":
                self.state = "paused"
            elif self.state != "paused":
                raise SplatwrightError(f"cannot pause: training is not running (state {self.state})")
            self.cond.wait_for(lambda: not self.stepping or self.state != "paused")
        self._emit_state()
        return self.status()

    def stop(self) -> dict:
        """Stop training and checkpoint; returns once the checkpoint is written."""
        with self.cond:
            if self.state in ("training", "paused"):
                self.state = "stopping"
                self.cond.notify_all()
            thread = self.train_thread
        if thread is not None:
            thread.join()
        return self.status()

    def _launch(self) -> None:
        with self.cond:
            self.state = "training"
            self.stepping = False
        self.train_thread = threading.Thread(target=self._train_loop, name="train", daemon=True)
        self.train_thread.start()
        self._emit_state()

    def _train_loop(self) -> None:
        try:
            final_state = self._run_steps()
            with self.model_lock:
                self.trainer.save_checkpoint(self.session.checkpoint_path)
            self._set_state(final_state)
            self.emit(self._progress(0.0))
        except FloatingPointError as e:
            self._fail(protocol.DIVERGED, f"training diverged ({e}); lower the learning rate or check the views")
        except torch.cuda.OutOfMemoryError:
            torch.cuda.empty_cache()
            self._fail(protocol.OUT_OF_MEMORY, "the GPU ran out of memory while training; lower max_gaussians "
                       "or the image size, or close other programs using the GPU")
        except Exception as e:  # a bug or an unexpected environment problem; keep serving
            traceback.print_exc()
            self._fail(protocol.INTERNAL, f"training failed: {e!r}; see the backend's log")

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
                every = self.settings["checkpoint_every"]
                if every and trainer.step % every == 0:
                    trainer.save_checkpoint(self.session.checkpoint_path)
            self.renders.let_in()
            now = time.monotonic()
            if now - last_time >= self.settings["progress_interval"]:
                self.emit(self._progress((trainer.step - last_step) / (now - last_time)))
                last_time, last_step = now, trainer.step

    def _fail(self, code: str, message: str) -> None:
        """After a failed step the model in memory may be half updated: go back to the last checkpoint."""
        with self.model_lock:
            step = self.trainer.step
            self.trainer = None
            if self.session.checkpoint_path.is_file():
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

    def _shown_model(self) -> tuple[Gaussians, int, tuple, int]:
        """(Gaussians, SH degree, background, step) of what is displayed; call with model_lock held."""
        if self.viewed is not None:
            g, background = self.viewed
            return g, g.max_sh_degree, background, 0
        if self.trainer is not None:
            t = self.trainer
            return t.g, t.sh_degree, t.cfg.background, t.step
        raise SplatwrightError("nothing to render yet: start training, load_checkpoint or load_ply first")

    def submit_render(self, job: RenderJob) -> None:
        self.renders.submit(job)

    def _render_loop(self) -> None:
        while (job := self.renders.take()) is not None:
            try:
                fields, frame = self._draw(job.camera, job.format, job.depth)
                self.renders.settle(job)  # the frame is queued on the GPU: training may go on
                payload, fields["depth_offset"] = encode_frame(frame, job.format)
                job.done(fields, payload)
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
                self.renders.settle(job)

    def _draw(self, camera: Camera, format: str, depth: bool) -> tuple[dict, QueuedFrame]:
        """The render reply's fields and the queued frame, holding the model lock only while it is queued."""
        # Before taking the lock: the copy to the device waits for the GPU work already queued (a training step).
        view = camera_tensors(camera, self.device)
        with self.model_lock, torch.no_grad():
            g, sh_degree, background, step = self._shown_model()
            frame = queue_frame(g, camera, sh_degree, background, self.rasterizer, view, depth)
        fields = {"width": camera.width, "height": camera.height, "format": format, "step": step,
                  "sh_degree": sh_degree, "background": [float(c) for c in background]}
        return fields, frame

    def export_ply(self) -> tuple[dict, bytes]:
        with self.model_lock:  # a snapshot only: encoding a large model must not hold up training or rendering
            g, _, _, step = self._shown_model()
            g, trained = g.detached(), self.viewed is None
        data = encode_ply(g)
        path = ""
        if trained:  # the session's trained model is also kept beside its checkpoint; a viewed PLY is not
            path = str(self.session.folder / "splats.ply")
            write_atomic(path, data)
        return {"path": path, "gaussians": len(g), "step": step}, data

    def save_checkpoint(self) -> dict:
        with self.model_lock:
            if self.trainer is None:
                raise SplatwrightError("no trainer to checkpoint; start training first")
            self.trainer.save_checkpoint(self.session.checkpoint_path)
            return {"step": self.trainer.step, "path": str(self.session.checkpoint_path)}

    def load_checkpoint(self) -> dict:
        """Replace the trainer by the session's checkpoint (also while training: the next step uses it)."""
        session = self._require_session()
        if not session.checkpoint_path.is_file():
            raise SplatwrightError(f"session {session.name!r} has no checkpoint yet")
        trainer = self._trainer_from_checkpoint()
        with self.model_lock:
            self.trainer, self.viewed = trainer, None
        with self.cond:
            if self.state in ("idle", "failed", "finished"):
                self.state = "stopped"
        self._emit_state()
        return self.status()

    def load_ply(self, data: bytes, background) -> dict:
        with self.cond:
            if self.state in protocol.RUNNING:
                raise SplatwrightError("training is running; stop it before loading a PLY to view")
        g = read_ply(data, "the uploaded PLY").to(self.device)
        with self.model_lock:
            self.viewed = (g, tuple(background))
        self._emit_state()
        return {"gaussians": len(g), "sh_degree": g.max_sh_degree}

    def close(self) -> None:
        """Stop training (with a checkpoint) and the render thread."""
        self.stop()
        self.renders.close()
        self.render_thread.join(timeout=10)


def _finite_or_none(x: float) -> float | None:
    return x if math.isfinite(x) else None
