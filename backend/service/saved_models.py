"""Sessions' saved models, loaded for the requests that name them (SavedModels), and the model files sessions
keep: splat files in any format, or 4D models' files (splats4d.pt), told apart by name and content."""
from __future__ import annotations

import threading
from collections import OrderedDict
from pathlib import Path

from blender_addon.core.errors import SplatwrightError
from ..dynamic import DynamicGaussians, gaussians_from_tensors, read_dynamic
from ..formats import formation_of, read_any, sog
from ..formats.budget import Budget
from ..gaussians import Gaussians
from ..policy import CHECKPOINT
from ..torch_files import ZIP_MAGIC
from ..train import TrainConfig, load_latest_checkpoint
from .log import log
from .session import imported_file, mark_used
from .shown import Model

SAVED_MODELS = 4  # sessions' saved models kept loaded for the requests that name them
DYNAMIC_SUFFIX = ".pt"  # a file name with this ending is a 4D model's file (backend.dynamic's splats4d.pt)


class SavedModels:
    """Sessions' saved models (their last checkpoints, or the files imports made them from), loaded when a request
    first names them and kept for the SAVED_MODELS sessions named last; a checkpoint written since is loaded
    again. They are never trained, so whoever has one may read it without a lock."""

    def __init__(self, workdir: Path, device: str, budget: Budget = Budget(), size: int = SAVED_MODELS):
        self.workdir, self.device, self.budget, self.size = workdir, device, budget, size
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
        model = (imported_model(*imported, self.device, self.budget) if imported
                 else self._checkpoint_model(name, source))
        mark_used(folder)
        with self.lock:
            self.models[name] = (stamp, model, imported)
            self.models.move_to_end(name)
            while len(self.models) > self.size:
                self.models.popitem(last=False)
        return model

    def loaded(self) -> list[str]:
        """The sessions whose models are kept loaded: drawn lately."""
        with self.lock:
            return list(self.models)

    def _checkpoint_model(self, name: str, path: Path) -> Model:
        state, warning = load_latest_checkpoint(path)
        if warning:
            log(f"session {name}: {warning}")
        cfg, g = TrainConfig.from_dict(state["config"]), gaussians_from_tensors(state["gaussians"]).to(self.device)
        # The SH degree its trainer renders with at that step (Trainer.sh_degree).
        sh_degree = min(cfg.sh_degree, g.max_sh_degree, state["step"] // cfg.sh_interval)
        return Model(g, sh_degree, tuple(cfg.background), state["step"], formation=cfg.image_formation)


def imported_model(path: Path, background: tuple, spz_axes: str, device, budget: Budget) -> Model:
    """The model of the splat file an imported session keeps (session.imported_file), as load_ply showed it."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise SplatwrightError(f"cannot read {path.parent.name}/{path.name}, the file session {path.parent.name!r} "
                               f"was imported from ({e.strerror or e})") from None
    return file_model(data, path.name, background, device, budget, spz_axes)


def file_model(data: bytes, name: str, background, device, budget: Budget, spz_axes: str = "ply") -> Model:
    """The model of a splat file or a 4D model's file (read_model_file, within `budget`; an SPZ that does not say
    its axes read in `spz_axes`), to draw over `background` in the image formation it was trained for (a 4D model's
    file: the standard one)."""
    g = read_model_file(data, name, budget, spz_axes).to(device)
    formation = "standard" if isinstance(g, DynamicGaussians) else formation_of(data, name or "the uploaded model")
    return Model(g, g.max_sh_degree, tuple(background), 0, formation=formation)


def is_dynamic_file(data: bytes, name: str) -> bool:
    """Whether a file is a 4D model's (backend.dynamic): named *.pt, or a torch file (a zip) that is neither named
    as a .splat (the one splat format without magic bytes) nor a bundled SOG (a zip too)."""
    lower = name.lower()
    return lower.endswith(DYNAMIC_SUFFIX) or (data[:len(ZIP_MAGIC)] == ZIP_MAGIC and not lower.endswith(".splat")
                                              and not sog.is_bundle(data))


def read_model_file(data: bytes, name: str, budget: Budget = Budget(), spz_axes: str = "ply") -> Gaussians:
    """The model of a splat file or a 4D model's file (load_ply's) of at most `budget`'s Gaussians; `name`, the
    file's, may be empty; an SPZ that does not say its axes is read in `spz_axes`."""
    what = name or "the uploaded model"
    if is_dynamic_file(data, name):
        return read_dynamic(data, what, budget)
    return read_any(data, what, budget=budget, spz_axes=spz_axes)
