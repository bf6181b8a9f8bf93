"""The built add-on: the zip's contents, and the add-on end to end in real Blender (the bpy module) with a real
CPU backend. The Blender part runs once, in tests/blender_scenario.py in a subprocess, and these tests check
what it reports."""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

import build_addon
from backend.data import load_split
from backend.ply import read_ply
from conftest import DONUT

REPO = Path(__file__).resolve().parent.parent
SCENARIO = REPO / "tests" / "blender_scenario.py"
ENGINE_SCENARIO = REPO / "tests" / "blender_engine_scenario.py"
BATCH_SETUP = REPO / "tests" / "blender_batch_setup.py"
MAIN_THREAD_BUDGET = 0.05  # seconds any timer callback or operator call may take while training runs
BLENDER_EXT_CLI = "4.5/scripts/addons_core/bl_pkg/cli/blender_ext.py"


@pytest.fixture(scope="module")
def addon_zip(tmp_path_factory) -> Path:
    return build_addon.build(tmp_path_factory.mktemp("dist"))


def test_zip_holds_the_add_on_tree_as_it_is(addon_zip):
    with zipfile.ZipFile(addon_zip) as z:
        names = set(z.namelist())
        init = z.read("splatwright/__init__.py").decode()
        manifest = tomllib.loads(z.read("splatwright/blender_manifest.toml").decode())
        defaults = json.loads(z.read("splatwright/core/defaults.json"))
        sources = {n: z.read(n).decode() for n in names if n.endswith(".py")}
    tree = {"splatwright/" + p.relative_to(REPO / "blender_addon").as_posix(): p.read_text()
            for p in (REPO / "blender_addon").rglob("*.py")}
    assert sources == tree  # the add-on's files, the shared core among them, and nothing else
    assert '"blender": (3, 4, 0)' in init and "bl_info" in init
    assert manifest["id"] == "splatwright" and manifest["type"] == "add-on"
    assert set(manifest["permissions"]) == {"files", "network"}
    assert defaults["python"] == str(REPO / ".venv" / "bin" / "python")
    assert defaults["backend_root"] == str(REPO)
    assert not [n for n, text in sources.items() if "import torch" in text]


def test_blender_accepts_the_extension_manifest(addon_zip):
    spec = importlib.util.find_spec("bpy")
    if spec is None:
        pytest.skip("the bpy module is not installed; its extension validator comes with it")
    cli = Path(spec.origin).parent / BLENDER_EXT_CLI
    run = subprocess.run([sys.executable, str(cli), "validate", str(addon_zip)], capture_output=True, text=True)
    assert run.returncode == 0 and "Success" in run.stdout, run.stdout + run.stderr


def run_scenario(script: Path, home: Path, *args: str, timeout: float = 240) -> dict:
    """Run a Blender scenario script with the bpy module in a subprocess with its own user folders; its
    RESULT line."""
    if importlib.util.find_spec("bpy") is None:
        pytest.skip("the bpy module (pip install bpy==4.5.*) is not installed")
    env = {**os.environ, "BLENDER_USER_SCRIPTS": str(home / "scripts"), "BLENDER_USER_CONFIG": str(home / "config"),
           "BLENDER_USER_EXTENSIONS": str(home / "extensions")}
    run = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=timeout,
                         env=env, cwd=home)
    lines = [line for line in run.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, f"the scenario printed no result (exit code {run.returncode}):\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    result = json.loads(lines[-1][len("RESULT "):])
    assert "failure" not in result, result.get("traceback")
    return result


@pytest.fixture(scope="module")
def scenario(addon_zip, tmp_path_factory) -> dict:
    home = tmp_path_factory.mktemp("blender")
    return run_scenario(SCENARIO, home, "--zip", str(addon_zip), "--out", str(home / "out"), "--ply", str(DONUT))


def test_backend_starts_with_its_capabilities(scenario):
    assert scenario["default_python"].endswith(".venv/bin/python")
    caps = scenario["capabilities"]
    assert caps["torch"] and caps["python"] and caps["device"] == "cpu"


def test_capture_writes_a_dataset_the_trainer_reads_and_sends_training_views(scenario):
    assert scenario["capture"] == ["FINISHED"]
    assert scenario["views_sent"] == 8
    train, test = load_split(scenario["dataset"], "train"), load_split(scenario["dataset"], "test")
    assert (len(train), len(test)) == (8, 2)
    assert tuple(train.images.shape[1:3]) == (64, 64)
    assert train.images.std() > 0.05  # the objects are in view, not an empty background
    assert scenario["scene_objects"] == ["Ball", "Box", "CamA", "CamB", "Sun"]  # the orbit camera is removed


def test_training_runs_pauses_and_finishes(scenario):
    assert scenario["pause_held"]
    status, progress = scenario["status"], scenario["final_progress"]
    assert status["state"] == "finished" and status["step"] == status["iterations"] == 150
    assert progress["psnr"] > 15 and progress["gaussians"] > 0
    assert scenario["errors_before_kill"] == ""


def test_exported_ply_reads_back(scenario):
    g = read_ply(scenario["exported"])
    assert len(g) == scenario["status"]["gaussians"] and g.max_sh_degree == 1


def test_a_ply_is_viewed_through_the_backend(scenario):
    if not DONUT.is_file():
        pytest.skip(f"{DONUT} is not here")
    assert scenario["loaded_gaussians"] == len(read_ply(DONUT))
    assert scenario["preview_size"][0] > 0 and scenario["preview_max"] > 0


def test_kill_frees_the_backend_and_a_lost_one_restarts(scenario):
    assert scenario["killed_exit_code"] == -9
    assert "closed" in scenario["lost_detail"] and "exited with code -9" in scenario["lost_detail"]
    assert scenario["stopped_exit_code"] == 0


def test_disable_unregisters_everything(scenario):
    assert scenario["left_registered"] == []
    assert not scenario["scene_property_left"]
    assert scenario["timers_left"] == [] and scenario["threads_left"] == []


def test_main_thread_never_waits_while_training(scenario):
    during = [c for c in scenario["calls"] if c["training"]]
    kinds = {c["what"] for c in during}
    assert {"timer:poll", "op:train_start", "op:train_pause", "op:train_resume", "op:render_preview",
            "op:backend_check"} <= kinds
    assert sum(c["what"] == "timer:poll" for c in during) > 20
    slow = [c for c in during if c["seconds"] > MAIN_THREAD_BUDGET]
    assert not slow, slow


def test_capture_from_scene_cameras_and_animation(scenario):
    """Offline captures (no backend yet) write the dataset only; its cameras sit where Blender's are."""
    import numpy as np
    at = {k: np.array(v) for k, v in scenario["camera_positions"].items()}
    for source, expected in (("CAMERAS", [at["frame1"], at["CamB"]]),
                             ("ANIMATION", [at["frame1"], at["frame11"], at["frame21"]])):
        assert scenario[f"capture_{source}"] == ["FINISHED"]
        data = load_split(scenario[f"dataset_{source}"], "train")
        assert np.allclose([c.position for c in data.cameras], expected, atol=1e-4), source
    assert scenario["frame_after_capture"] == 1  # the scene's frame is restored


def test_an_offline_capture_is_sent_later_once(scenario):
    """Views captured while no backend ran, and the capture's surface points, reach the backend by Send Views;
    sending again adds nothing."""
    assert scenario["offline_points"]
    session = Path(scenario["dataset_ANIMATION"]).name
    assert scenario["offline_frames"] == 3
    for attempt in ("sent", "resent"):
        assert scenario[f"offline_{attempt}"] == {"views": 3, "session": session, "error": ""}, attempt


def test_backend_errors_become_reports(scenario):
    assert "not a PLY" in scenario["bad_ply_error"]


def test_panels_and_preferences_draw_with_hints_and_progress(scenario):
    idle = scenario["drawn_disconnected"]
    assert "Start the backend first" in idle and "Disconnected" in idle
    training = scenario["drawn_training"]
    assert any(t.startswith("[") and "/150" in t for t in training)  # the progress bar
    assert any(t.startswith("Loss ") and "PSNR" in t for t in training)
    assert any("it/s" in t and "ETA" in t for t in training) and any("Gaussians" in t for t in training)
    assert any(t.startswith("GPU: ") for t in training) and any(t.startswith("Python 3") for t in training)


def test_setup_button_runs_the_checkout_setup_and_shows_its_log(scenario):
    setup = scenario["setup"]
    assert setup["returncode"] == 0 and setup["log"] == ["installing into .venv", "ready: setup"]
    assert "./run setup: done" in setup["drawn"] and "ready: setup" in setup["drawn"]


def test_remote_backend_with_token(scenario):
    remote = scenario["remote"]
    assert "wrong token" in remote["refused"]
    assert remote["kill_blocked"] == "A remote backend can only be stopped"
    assert remote["alive_after_stop"]


@pytest.fixture(scope="module")
def f12(addon_zip, tmp_path_factory) -> dict:
    """An F12 render with the Splatwright engine of a generated model the add-on loaded into a CPU backend."""
    from conftest import viewing_model
    home = tmp_path_factory.mktemp("blender-engine")
    model, ply = viewing_model(home)
    result = run_scenario(ENGINE_SCENARIO, home, "--zip", str(addon_zip), "--ply", str(ply),
                          "--out", str(home / "out"), timeout=180)
    return {**result, "model": model}


def test_f12_render_is_the_backends_frame_with_a_depth_pass(f12):
    import numpy as np
    import torch
    from PIL import Image

    from blender_addon.core.codecs import camera_from_wire
    from backend.metrics import psnr
    from backend.render import render
    cam = camera_from_wire(f12["camera"])
    assert (cam.width, cam.height) == (80, 60)  # the scene's output size
    with torch.no_grad():
        expected = render(f12["model"], cam, 1, (1.0, 1.0, 1.0))
    got = np.asarray(Image.open(f12["png"]), dtype=np.float32) / 255.0
    assert got.shape == (60, 80, 4) and got[..., 3].min() == 1.0  # opaque film: composited over white
    assert psnr(torch.from_numpy(got[..., :3]), expected.image.clamp(0, 1)) >= 40.0
    depth, alpha = np.load(f12["depth"]), expected.alpha.numpy()
    view_depth = (expected.depth / expected.alpha.clamp_min(1e-12)).numpy()
    covered = alpha > 0.5
    assert covered.mean() > 0.1 and (alpha == 0).any()
    assert np.allclose(depth[covered], view_depth[covered], rtol=1e-4)
    distance = np.linalg.norm(cam.position)  # the model sits around the origin, within about 2 of it
    assert distance - 2.5 < depth[covered].min() and depth[covered].max() < distance + 2.5
    assert np.all(depth[alpha == 0] == 1e10)  # the background, as Blender's Depth pass has it
    assert f12["errors"] == ""


def test_f12_with_a_render_border_renders_that_part(f12):
    """Cropped to the border, the image is that part of the full frame; uncropped, the full frame with only the
    border's pixels rendered (Blender leaves the rest transparent)."""
    import numpy as np
    from PIL import Image

    def load(name: str) -> np.ndarray:
        return np.asarray(Image.open(Path(f12["png"]).with_name(name)), dtype=np.int32)
    full, cropped, uncropped = load("f12.png"), load("border_crop1.png"), load("border_crop0.png")
    height, width = full.shape[:2]
    min_x, max_x, min_y, max_y = f12["border"]
    x0, x1 = int(min_x * width), int(max_x * width)
    rows = slice(height - int(max_y * height), height - int(min_y * height))  # top-down
    part = full[rows, x0:x1]
    assert cropped.shape == part.shape == (30, 44, 4)
    assert np.abs(cropped - part).max() <= 2  # the same splats through a shifted principal point
    assert uncropped.shape == full.shape and np.abs(uncropped[rows, x0:x1] - part).max() <= 2
    outside = np.ones((height, width), bool)
    outside[rows, x0:x1] = False
    assert (uncropped[outside][:, 3] == 0).all()


def test_command_line_animation_render_reopens_the_session(scenario, addon_zip, tmp_path):
    """`blender -b scene.blend -a` in Debian's Blender 3.4: the add-on starts a backend itself, reopens the
    scene's session from its checkpoint and renders every frame of the scene camera."""
    import numpy as np
    import torch
    from PIL import Image

    from blender_addon.core.codecs import camera_from_wire
    from backend.metrics import psnr
    from backend.render import render
    if shutil.which("blender") is None:
        pytest.skip("Debian's blender is not installed (apt-get install blender); the command-line render needs it")
    env = {**os.environ, "BLENDER_USER_SCRIPTS": str(tmp_path / "scripts"),
           "BLENDER_USER_CONFIG": str(tmp_path / "config")}
    workdir = Path(scenario["exported"]).parent / "sessions"
    setup = subprocess.run(["blender", "-b", "--python", str(BATCH_SETUP), "--", "--zip", str(addon_zip),
                            "--python", sys.executable, "--workdir", str(workdir),
                            "--session", scenario["trained_session"], "--out", str(tmp_path)],
                           env=env, capture_output=True, text=True, timeout=120)
    assert (tmp_path / "scene.blend").is_file(), setup.stdout[-3000:] + setup.stderr[-3000:]
    run = subprocess.run(["blender", "-b", str(tmp_path / "scene.blend"), "-a"], env=env, capture_output=True,
                         text=True, timeout=180)
    frames = sorted(tmp_path.glob("frame_*.png"))
    assert run.returncode == 0 and len(frames) == 2, run.stdout[-3000:] + run.stderr[-3000:]
    cam = camera_from_wire(json.loads((tmp_path / "setup.json").read_text()))
    with torch.no_grad():
        expected = render(read_ply(scenario["exported"]), cam, 1, (1.0, 1.0, 1.0)).image.clamp(0, 1)
    for frame in frames:
        got = np.asarray(Image.open(frame), dtype=np.float32)[..., :3] / 255.0
        assert got.shape == (48, 64, 3)
        assert psnr(torch.from_numpy(got), expected) >= 35.0, frame.name + run.stdout[-3000:] + run.stderr[-2000:]
