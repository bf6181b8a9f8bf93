"""Our PLY and SPZ (versions 4 and 3) in Blender 5.3's own importers (bpy.ops.wm.ply_import and spz_import, the
bpy module in .venv-bpy53; tests/blender/scenarios/importers.py runs them): every splat lands where our model has
it, to the format's quantisation, with its scale, rotation and opacity.

Blender's PLY importer takes a PLY's axes as its own world's, as they are. Its SPZ importer takes SPZ as RUB
(y up, as the specification says; it skips the coordinate-system record) and turns that to its Z up: our SPZ,
our model's RDF as RUB (y and z negated), lands turned -90 degrees about x, (x, y, z) -> (x, z, -y); each
splat's axes may come out pointing the other way (the same ellipsoid)."""
from __future__ import annotations

import numpy as np
import pytest

from backend import formats
from backend.formats.ply import encode_ply
from blender.runner import SCENARIOS, run_scenario
from helpers import random_gaussians

pytestmark = pytest.mark.blender

SPZ_TURN = np.array([[1.0, 0, 0], [0, 0, 1], [0, -1, 0]])  # Blender's SPZ import of our SPZ: -90 degrees about x
# The largest error quantisation allows (SPZ: format_helpers.py's SPZ_TOL), as Blender's attributes state them.
SPZ_TOL = dict(position=0.5 / 4096 + 1e-6, log_scale=0.5 / 16 + 1e-5, opacity=0.5 / 255 + 1e-6, rotation=0.006)


def rotation_matrices(q: np.ndarray) -> np.ndarray:
    """Rotation matrices of unit quaternions (w, x, y, z)."""
    w, x, y, z = (q / np.linalg.norm(q, axis=1, keepdims=True)).T
    return np.stack([1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y),
                     2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x),
                     2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)], 1).reshape(-1, 3, 3)


@pytest.fixture(scope="module")
def imported(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("importers")
    model = random_gaussians(400, seed=21, sh_degree=3)
    files = {"model.ply": encode_ply(model), "model-v4.spz": formats.encode_any(model, "spz"),
             "model-v3.spz": formats.encode_any(model, "spz", spz_version=3)}
    for name, data in files.items():
        (folder / name).write_bytes(data)
    result = run_scenario(SCENARIOS / "importers.py", folder, "--out", str(folder / "out"),
                          *[str(folder / name) for name in files], timeout=300, blender="5.3")
    return {"model": model, **result}


def attributes(result: dict, name: str) -> dict[str, np.ndarray]:
    assert result[name]["points"] == 400 and result[name]["matrix"] == np.eye(4).tolist()
    with np.load(result[name]["attributes"]) as data:
        return {key.replace("__", ":"): data[key] for key in data.files}


def expected(model, turn: np.ndarray) -> dict[str, np.ndarray]:
    t = {k: v.detach().numpy().astype(np.float64) for k, v in model.tensors().items()}
    return {"position": t["means"] @ turn.T, "log_scale": t["log_scales"],
            "opacity": 1 / (1 + np.exp(-t["opacity_logits"])), "rotation": turn @ rotation_matrices(t["quats"])}


def errors(shown: dict, want: dict) -> dict[str, float]:
    return {"position": np.abs(shown["position"] - want["position"]).max(),
            "log_scale": np.abs(np.log(shown["scale"]) - want["log_scale"]).max(),
            "opacity": np.abs(shown["radiance:base"][:, 3] - want["opacity"]).max(),
            # The same ellipsoid: its axes may point either way (Blender's SPZ importer turns each a half turn
            # about its own x), so the rotations agree up to the signs of their columns.
            "rotation": np.abs(np.abs(rotation_matrices(shown["rotation"]).transpose(0, 2, 1) @ want["rotation"])
                               - np.eye(3)).max()}


def test_our_ply_lands_as_our_model_in_blenders_ply_importer(imported):
    e = errors(attributes(imported, "model.ply"), expected(imported["model"], np.eye(3)))
    assert e["position"] == 0.0 and max(e.values()) < 1e-5, e


@pytest.mark.parametrize("name", ["model-v4.spz", "model-v3.spz"])
def test_our_spz_lands_as_our_model_turned_to_blenders_z_up_in_its_spz_importer(imported, name):
    e = errors(attributes(imported, name), expected(imported["model"], SPZ_TURN))
    over = {k: (round(float(v), 6), SPZ_TOL[k]) for k, v in e.items() if v > SPZ_TOL[k]}
    assert not over, f"errors over tolerance (error, tolerance): {over}"
    # Taken as the PLY's axes instead, as a reader that ignored SPZ's axes would, nothing lines up.
    assert errors(attributes(imported, name), expected(imported["model"], np.eye(3)))["position"] > 0.1
