"""Exports: the model a request names (protocol.MODEL_CHOICE), chosen and placed, as a file in the format its
name asks for, or as a 4D model's own file."""
from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np

from blender_addon.core.errors import SplatwrightError
from blender_addon.core.splats import MOTION_FIELDS, encode_ply_bytes, read_ply_bytes
from ..dynamic import DYNAMIC_FILE, DynamicGaussians, write_dynamic
from ..formats import encode_any, format_for_path, notes
from ..formats.budget import Budget
from ..formats.ply import FORMATION_COMMENT, STANDARD, encode_ply, read_ply
from ..gaussians import Gaussians
from ..placement import chosen, kept, placed, placement_notes
from .saved_models import DYNAMIC_SUFFIX, SavedModels
from .shown import Shown

DYNAMIC_FORMAT = "4d"  # what export_ply's reply calls that format


class Exports:
    """Exports of the shown model or of a session's saved model (`saved`); the whole trained model of the open
    session is also kept beside its checkpoint."""

    def __init__(self, shown: Shown, saved: SavedModels):
        self.shown, self.saved = shown, saved

    def export(self, name: str = "splats.ply", model: str | None = None, crop: np.ndarray | None = None,
               time: float | None = None, placement: np.ndarray | None = None,
               motion: bool = False) -> tuple[dict, bytes]:
        """Session `model`'s model (None: the shown one; protocol.MODEL_CHOICE), at `time` if it is 4D, cropped
        and placed, in the format the file `name` is for; a *.pt name asks for a 4D model's own file (the one
        training writes), its motion placed with it and cropped to the Gaussians inside the box at `time`. With
        `motion`, a 4D model is a PLY of its parameters with its motion (motion_ply_bytes), placed and cropped
        so, and a static model its PLY."""
        dynamic_file = Path(name).suffix.lower() == DYNAMIC_SUFFIX and not motion
        name = "splats.ply" if motion else name
        fmt = DYNAMIC_FORMAT if dynamic_file else format_for_path(name)
        with self.shown.lock:  # a snapshot only: encoding a large model must not hold up training or rendering
            source = self.shown.live_model(model)
            if source is not None:
                source = replace(source, g=source.g.detached())
        source = source or self.saved.get(model)
        dynamic = isinstance(source.g, DynamicGaussians)
        if dynamic_file:
            if not dynamic:
                what = "the model shown" if model is None else f"the model of session {model!r}"
                raise SplatwrightError(f"{name}: {what} is a static model, the same at every time, and a .pt file "
                                       f"holds a 4D model ({DYNAMIC_FILE} from training on views with times); "
                                       "export it as .ply, .compressed.ply, .spz or .splat")
            g = placed(kept(source.g, crop, time), placement)
            data = dynamic_file_bytes(g)
            said = [] if crop is None else [f"the crop box kept the Gaussians inside it at time {time or 0.0:g}"]
        elif motion and dynamic:
            g = placed(kept(source.g, crop, time), placement)
            fmt, data, said = "ply", motion_ply_bytes(g, source.formation), []
        else:
            g = placed(chosen(source.g, crop, time), placement)
            data = encode_any(g, fmt, source.formation)
            said = notes(g, fmt, source.formation)
        path = ""
        whole = crop is None and placement is None and (time is None or not dynamic)  # a static one at any time
        if source.trained and whole and not dynamic_file and not (motion and dynamic):
            # the session's whole trained model is also kept beside its checkpoint, as a PLY; a viewed one is not
            ply = data if fmt == "ply" else encode_ply(g, source.formation)
            path = self.shown.session.write_file("splats.ply", ply)
        fields = {"path": path, "gaussians": len(g), "step": source.step, "format": fmt, "note": "; ".join(said),
                  "dynamic": dynamic}
        return fields, data


def convert(data: bytes, name: str, placement: np.ndarray | None = None,
            budget: Budget = Budget()) -> tuple[dict, bytes]:
    """A model the client sent (a 3DGS PLY of at most `budget`'s splats) in the format the file `name` is for,
    placed by any invertible affine `placement` (backend/placement.py), the note saying what the placement and the
    format leave out."""
    if Path(name).suffix.lower() == DYNAMIC_SUFFIX:
        raise SplatwrightError(f"{name}: a model sent to convert is static; export it as .ply, .compressed.ply, "
                               ".spz or .splat")
    fmt = format_for_path(name)
    sent = read_ply(bytes(data), "the model sent", budget)
    g = placed(sent, placement)
    said = placement_notes(sent, placement) + notes(g, fmt)
    return {"gaussians": len(g), "format": fmt, "note": "; ".join(said)}, encode_any(g, fmt)


def motion_ply_bytes(g: DynamicGaussians, formation: str) -> bytes:
    """4D model `g` as a PLY in the official layout of its parameters at each Gaussian's time centre, with its
    motion in the columns after them (blender_addon/core/splats.MOTION_COLUMNS), which Blender's own splats show
    it from at each time (blender_addon/logic/native.motion_attributes)."""
    model = read_ply_bytes(encode_ply(Gaussians(**{k: getattr(g, k) for k in Gaussians.names()}), formation))
    motion = {field: getattr(g, field).detach().cpu().float().numpy() for field in MOTION_FIELDS}
    comments = () if formation == STANDARD else (f"{FORMATION_COMMENT} {formation}",)
    return encode_ply_bytes(model, comments, motion)


def dynamic_file_bytes(g: DynamicGaussians) -> bytes:
    """The file of 4D model `g` as training writes it: by write_dynamic itself (one definition of the file), in
    a temporary folder."""
    with tempfile.TemporaryDirectory(prefix="splatwright-") as folder:
        path = Path(folder) / DYNAMIC_FILE
        write_dynamic(path, g)
        return path.read_bytes()
