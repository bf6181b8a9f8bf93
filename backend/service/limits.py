"""What a session may hold and a client ask for: the server's caps, each a `serve` flag."""
from __future__ import annotations

from dataclasses import dataclass, field, fields

from blender_addon.core.errors import SplatwrightError
from ..formats.budget import MAX_MODEL_SPLATS, Budget


def _limit(default: int, meaning: str):
    return field(default=default, metadata={"help": meaning})


@dataclass(frozen=True)
class Limits:
    """What a session may hold and ask for, so no request can exhaust the server's memory; each is a
    `serve` flag, --max-<name> (arguments.py), and a request over one is refused with a message naming it."""
    views: int = _limit(2000, "views a session may hold")
    view_pixels: int = _limit(4096 * 4096, "pixels (width x height) of one view")
    session_pixels: int = _limit(500_000_000, "pixels of all of a session's views together (about 16 bytes "
                                              "of memory each while training)")
    render_pixels: int = _limit(4096 * 4096, "pixels of one rendered frame")
    points: int = _limit(2_000_000, "initial points or random initial Gaussians of a session")
    model_splats: int = _limit(MAX_MODEL_SPLATS, "Gaussians of a model read from a file (an import, or a model sent "
                                                 "to convert or to continue training from)")
    queued_renders: int = _limit(64, "renders one connection may have waiting over all its streams (a stream keeps "
                                     "only its newest one waiting)")
    imported_sessions: int = _limit(32, "imported models' sessions kept in the sessions folder")
    video_seconds: int = _limit(1800, "seconds of one video that structure from motion takes frames from")
    upload_bytes: int = _limit(8 << 30, "bytes of the photos or the video one reconstruction uploads (each photo "
                                        "also at most the bytes of one view's image)")

    @staticmethod
    def flag(name: str) -> str:
        return "--max-" + name.replace("_", "-")

    def check(self, name: str, value: int, what: str, instead: str = "", command: str = "serve") -> None:
        """SplatwrightError if `value` (of `what`) is over the limit `name`; `instead`: what else the user may do
        than allow more; `command`: the command whose flag allows more (the server's, or the photos command's)."""
        cap = getattr(self, name)
        if value > cap:
            allow = (f"start the backend with serve {self.flag(name)} N" if command == "serve"
                     else f"run {command} with {self.flag(name)} N")
            raise SplatwrightError(f"{what}: {value:,} is over the cap of {cap:,} {self.meaning(name)}; "
                                   f"{instead + ', or ' if instead else ''}{allow} to allow more")

    def budget(self) -> Budget:
        """What reading a model file may decode (formats.budget), its refusal naming the flag that allows more."""
        return Budget(self.model_splats, f"start the backend with serve {self.flag('model_splats')} N to allow more")

    @staticmethod
    def meaning(name: str) -> str:
        return next(f.metadata["help"] for f in fields(Limits) if f.name == name)
