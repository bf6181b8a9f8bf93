"""What the engine shows: the open session with its model in memory (Shown), and a model to draw or export with
what it is drawn with (Model)."""
from __future__ import annotations

import threading
from dataclasses import dataclass

from blender_addon.core.errors import SplatwrightError
from ..gaussians import Gaussians
from ..render.formation import STANDARD
from ..train import Trainer
from .session import Session


@dataclass(frozen=True)
class Model:
    """Gaussians to draw or export, with what they are drawn with."""
    g: Gaussians
    sh_degree: int
    background: tuple
    step: int
    trained: bool = False  # the open session's trained model (not a viewed file or a saved model)
    formation: str = STANDARD  # the image formation it was trained for, which it is drawn and exported in


def trained_model(t: Trainer) -> Model:
    return Model(t.g, t.sh_degree, t.cfg.background, t.step, True, t.cfg.image_formation)


class Shown:
    """The open session and its model in memory: its trainer, or the model of the file it was imported from, with
    its background (`viewed`). `lock` guards the three and the session's data."""

    def __init__(self):
        self.lock = threading.Lock()
        self.session: Session | None = None
        self.trainer: Trainer | None = None
        self.viewed: Model | None = None  # the open session's imported file's model

    def require_session(self) -> Session:
        if self.session is None:
            raise SplatwrightError("no session is open; send open_session first")
        return self.session

    def live_model(self, name: str | None) -> Model | None:
        """The model in memory a request for session `name`'s model (None: the shown one) gets: the open
        session's (its imported file, or its trainer's) when it names that session, else None (its saved model);
        call with the lock held."""
        if name is not None and (self.session is None or self.session.name != name):
            return None
        if self.viewed is not None:  # the open session's imported file
            return self.viewed
        if self.trainer is not None:
            return trained_model(self.trainer)
        if name is not None:
            return None
        raise SplatwrightError("nothing to render yet: train a model, or load one (in Blender: Import Splats, or "
                               "a session with a checkpoint)")
