"""The built add-on: the zip's contents, and the add-on end to end in real Blender (the bpy module) with a real
CPU backend. The Blender part runs once per Blender version, in tests/blender/scenarios/addon.py in a subprocess,
and these tests check what it reports."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
import torch

from backend.data import load_split
from backend.formats.ply import read_ply
from blender.runner import BLENDERS, REPO, STREAMED_SPLATS, SCENARIOS, blender_env, bpy_folder, bpy_python, run_scenario
from helpers import DONUT, assert_same_model, moving_model, viewing_model
from splat_helpers import BACKGROUND, inside_crop, subset, trained_session

pytestmark = pytest.mark.blender

SCENARIO = SCENARIOS / "addon.py"
ENGINE_SCENARIO = SCENARIOS / "engine.py"
BATCH_SETUP = SCENARIOS.parent / "batch_setup.py"


def tree_files(*folders: Path) -> list[Path]:
    return [p for folder in folders for p in folder.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"]


def test_zip_holds_the_add_on_and_the_backend_and_no_path_of_this_machine(addon_zip):
    with zipfile.ZipFile(addon_zip) as z:
        zipped = {n: z.read(n) for n in z.namelist()}
    addon = REPO / "blender_addon"
    bundled = "splatwright/backend_src/"
    expected = {"splatwright/" + p.relative_to(addon).as_posix(): p for p in tree_files(addon)}
    expected |= {bundled + p.relative_to(REPO).as_posix(): p
                 for p in [*tree_files(REPO / "backend", REPO / "cuda", addon / "core"), addon / "__init__.py"]
                 if REPO / "backend" / "tools" not in p.parents}  # the tools stay out
    assert set(zipped) == set(expected) | {bundled + "requirements.txt"}
    assert [n for n, p in expected.items() if zipped[n] != p.read_bytes()] == []  # the files as in the tree
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    requirements = [line for line in zipped[bundled + "requirements.txt"].decode().splitlines()
                    if not line.startswith("#")]
    assert requirements == [f"torch=={pyproject['tool']['splatwright']['torch']}",
                            *(r for r in pyproject["project"]["dependencies"] if not r.startswith("torch"))]
    init = zipped["splatwright/__init__.py"].decode()
    manifest = tomllib.loads(zipped["splatwright/blender_manifest.toml"].decode())
    assert '"blender": (3, 4, 0)' in init and "bl_info" in init
    assert manifest["id"] == "splatwright" and manifest["type"] == "add-on"
    assert set(manifest["permissions"]) == {"files", "network"}
    assert [n for n, data in zipped.items() if str(REPO).encode() in data or b"/.venv/" in data] == []
    addon_sources = [n for n in zipped if n.endswith(".py") and not n.startswith(bundled)]
    assert not [n for n in addon_sources if b"import torch" in zipped[n]]


def test_the_zipped_backend_imports_and_finds_its_cuda_sources(addon_zip, tmp_path):
    with zipfile.ZipFile(addon_zip) as z:
        z.extractall(tmp_path)
    sources = tmp_path / "splatwright" / "backend_src"
    show = ("import json, backend, backend.kernels as k, blender_addon.core.protocol as p; print(json.dumps("
            "[backend.__file__, p.__file__, str(k.CUDA_DIR), all((k.CUDA_DIR / s).is_file() for s in k.SOURCES)]))")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run = subprocess.run([sys.executable, "-c", show], cwd=sources, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    backend_file, core_file, cuda_dir, cuda_found = json.loads(run.stdout)
    assert Path(backend_file).parent == sources / "backend" and Path(core_file).is_relative_to(sources)
    assert Path(cuda_dir) == sources / "cuda" and cuda_found


@pytest.mark.parametrize("blender", BLENDERS)
def test_blender_accepts_the_extension_manifest(addon_zip, blender):
    """Blender's own extension validator (blender_ext.py, shipped in the bpy module) accepts the zip."""
    python = bpy_python(blender)
    cli = next(bpy_folder(blender).glob("*/scripts/addons_core/bl_pkg/cli/blender_ext.py"))
    run = subprocess.run([python, str(cli), "validate", str(addon_zip)], capture_output=True, text=True)
    assert run.returncode == 0 and "Success" in run.stdout, run.stdout + run.stderr


@pytest.fixture(scope="module", params=BLENDERS)
def scenario(addon_zip, tmp_path_factory, request) -> dict:
    home = tmp_path_factory.mktemp(f"blender-{request.param}")
    return run_scenario(SCENARIO, home, "--zip", str(addon_zip), "--out", str(home / "out"), "--ply", str(DONUT),
                        "--python", sys.executable, timeout=480, blender=request.param)


def test_backend_starts_with_its_capabilities(scenario):
    caps = scenario["capabilities"]
    assert caps["torch"] and caps["python"] and caps["device"] == "cpu"


def test_capture_writes_a_dataset_the_trainer_reads_and_sends_training_views(scenario):
    assert scenario["capture"] == ["FINISHED"]
    assert scenario["views_sent"] == 8
    train, test = load_split(scenario["dataset"], "train"), load_split(scenario["dataset"], "test")
    assert (len(train), len(test)) == (8, 2)
    assert {tuple(image.shape) for image in train.images} == {(64, 64, 3)}
    assert torch.stack(train.images).float().std() > 0.05 * 255  # the objects are in view, not an empty background
    assert scenario["scene_objects"] == ["Ball", "Box", "CamA", "CamB", "Sun"]  # the orbit camera is removed


def test_training_runs_pauses_and_finishes(scenario):
    """The session's saved model after 150 steps draws its training views well above its empty start (the
    background alone): a mean over the views, as one view's PSNR in a progress event varies with the view."""
    import torch

    from backend.service.saved_models import SavedModels
    from backend.service.session import Session
    from backend.train import evaluate
    assert scenario["pause_held"]
    status, progress = scenario["status"], scenario["final_progress"]
    assert status["state"] == "finished" and status["step"] == status["iterations"] == 150
    assert progress["gaussians"] > 0
    sessions, name = Path(scenario["sessions"]), scenario["trained_session"]
    model = SavedModels(sessions, "cpu").get(name)
    views = Session.open(sessions, name, create=False).dataset(model.background)
    trained = evaluate(model.g, views, model.sh_degree, model.background, "reference", model.formation)["psnr"]
    empty = model.g.detached()
    empty.opacity_logits = torch.full_like(empty.opacity_logits, -30.0)
    background = evaluate(empty, views, 0, model.background, "reference")["psnr"]
    print(f"training views: {trained:.2f} dB trained, {background:.2f} dB the background alone")
    assert trained > background + 5.0
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
    lost = scenario["crash"]["lost_detail"]
    assert "closed" in lost and "exited with code -9" in lost
    assert scenario["stopped_exit_code"] == 0


def test_a_backend_crash_loses_no_more_than_the_last_checkpoint(scenario):
    """kill -9 while training; Start brings the session and its model back (as Start after Kill did), the
    panel does not go on showing training meanwhile, and Start Training continues from the checkpoint."""
    session, crash = scenario["trained_session"], scenario["crash"]
    after_kill = scenario["reopened_after_kill"]
    assert after_kill["session"] == session and after_kill["step"] == 150 and after_kill["gaussians"] > 0
    assert crash["asks_first"]  # Start Training over that model asks: continue from it or start over
    reopened = crash["reopened"]
    assert reopened["session"] == session and reopened["checkpoint"] and reopened["gaussians"] > 0
    assert reopened["step"] > 0 and reopened["iterations"] == 1_000_000  # the new run's checkpoint, not the old
    assert reopened["state"] not in ("training", "paused")
    assert crash["capture_blocked_when_lost"] == ""
    assert not any(t.startswith("[") or "it/s" in t for t in crash["drawn_lost"])  # no training stats left
    assert "exited with code -9" in " ".join(crash["drawn_lost"])  # wrapped over a few labels
    assert crash["continued_to"] > reopened["step"]


def test_disable_unregisters_everything(scenario):
    assert scenario["left_registered"] == []
    assert not scenario["scene_property_left"]
    assert scenario["timers_left"] == [] and scenario["threads_left"] == []


def test_main_thread_never_waits_while_training(scenario):
    import numpy as np
    during = [c for c in scenario["calls"] if c["training"]]
    kinds = {c["what"] for c in during}
    assert {"timer:poll", "op:train_start", "op:train_pause", "op:train_resume", "op:render_preview",
            "op:backend_check"} <= kinds
    assert sum(c["what"] == "timer:poll" for c in during) > 20
    waits = [b for b in scenario["blocking"] if b["training"]]
    assert not waits, waits  # no socket I/O, thread, condition, process or sleep
    seconds = [c["seconds"] for c in during]
    print(f"main thread while training: {len(seconds)} calls, median {1000 * np.median(seconds):.2f} ms, "
          f"max {1000 * max(seconds):.1f} ms")  # the strict figures live in bench viewport


def test_capture_from_scene_cameras_and_animation(scenario):
    """Offline captures (no backend yet) write the dataset only; its cameras sit where Blender's are, and over
    time (the active camera, or the rig of the scene's cameras at every captured frame) each view has its frame's
    time."""
    import numpy as np
    at = {k: np.array(v) for k, v in scenario["camera_positions"].items()}
    for source, expected, times in (
            ("CAMERAS", [at["frame1"], at["CamB"]], None),
            ("ANIMATION", [at["frame1"], at["frame11"], at["frame21"]], [0.0, 0.5, 1.0]),
            ("RIG_ANIMATION", [at["frame1"], at["CamB"], at["frame11"], at["CamB"], at["frame21"], at["CamB"]],
             [0.0, 0.0, 0.5, 0.5, 1.0, 1.0])):
        assert scenario[f"capture_{source}"] == ["FINISHED"]
        data = load_split(scenario[f"dataset_{source}"], "train")
        assert np.allclose([c.position for c in data.cameras], expected, atol=1e-4), source
        assert data.times == times, source
    assert scenario["frame_after_capture"] == 1  # the scene's frame is restored


def test_an_offline_capture_is_sent_later_once(scenario):
    """Views captured while no backend ran (the animation's, with their times), and the capture's surface
    points, reach the backend by Send to Backend; sending again adds nothing."""
    assert scenario["offline_points"]
    session = Path(scenario["dataset_ANIMATION"]).name
    assert scenario["offline_frames"] == 3 and scenario["offline_times"] == [0.0, 0.5, 1.0]
    for attempt in ("sent", "resent"):
        assert scenario[f"offline_{attempt}"] == {"views": 3, "session": session, "error": ""}, attempt


def test_backend_errors_become_reports(scenario):
    """Each error is one line of Blender's reports (bpy prints them to stdout); the label clears once the
    thing works again."""
    errors = [line for line in scenario["reports"] if line.startswith("Error: ")]
    for what in ("not a PLY", "wrong token", "exited with code -9"):
        assert sum(what in line for line in errors) == 1, (what, errors)
    assert "not a PLY" in scenario["bad_ply_error"]
    assert any(line.startswith("Info: backend ready") for line in scenario["reports"])
    assert any("reopened session" in line for line in scenario["reports"])


def test_panels_and_preferences_draw_with_hints_and_progress(scenario):
    idle = scenario["drawn_disconnected"]
    assert "Start the backend first" in idle and "Disconnected" in idle
    training = scenario["drawn_training"]
    assert any(t.startswith("[") and "/150" in t for t in training)  # the progress bar
    assert any(t.startswith("Loss ") for t in training) and any(t.startswith("PSNR ") for t in training)
    assert any(t.endswith(" left") for t in training) and any("Gaussians" in t for t in training)
    assert any(t.startswith("GPU: ") for t in training) and any(t.startswith("Python 3") for t in training)


def test_remote_backend_with_token(scenario):
    remote = scenario["remote"]
    assert "wrong token" in remote["refused"]
    assert remote["kill_blocked"] == "A remote backend can only be stopped"
    assert remote["alive_after_stop"]


@pytest.fixture(scope="module", params=STREAMED_SPLATS)  # 5.3's imports are native objects: test_native_bpy.py
def f12(addon_zip, tmp_path_factory, request) -> dict:
    """An F12 render with the Splatwright engine of a generated model the add-on loaded into a CPU backend, then
    of a trained session's model placed by a splat object, in each Blender version; then a 4D model through File >
    Import and Export."""
    from backend.dynamic import write_dynamic
    home = tmp_path_factory.mktemp(f"blender-engine-{request.param}")
    model, ply = viewing_model(home)
    session = trained_session(home / "out" / "sessions", model, "placed-model")
    model4d = moving_model(120, seed=8)
    write_dynamic(home / "splats4d.pt", model4d)
    result = run_scenario(ENGINE_SCENARIO, home, "--zip", str(addon_zip), "--ply", str(ply), "--session", session,
                          "--out", str(home / "out"), "--python", sys.executable, "--model4d",
                          str(home / "splats4d.pt"), timeout=240, blender=request.param)
    return {**result, "model": model, "model4d": model4d}


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


def test_the_engine_renders_the_model_where_its_splat_object_places_it(f12):
    """With a splat object of the shown session moved, turned and scaled, F12 is the backend's render through the
    scene camera taken into the model's space, its Depth pass in the scene's units, and the viewport asks
    through the same conversion; the splats moved from where the unplaced model shows them."""
    import numpy as np
    import torch
    from PIL import Image

    from blender_addon.core.codecs import camera_from_wire
    from blender_addon.logic.placement import camera_in_model
    from backend.metrics import psnr
    from backend.render import render
    placed = f12["placed"]
    cam, depth_scale = camera_in_model(camera_from_wire(placed["camera"]), np.array(placed["model_matrix"]))
    viewport = camera_from_wire(placed["viewport_camera"])
    assert np.allclose(viewport.c2w, cam.c2w, atol=1e-6) and np.array_equal(viewport.K, cam.K)
    assert 0.79 < depth_scale < 0.81
    with torch.no_grad():
        expected = render(f12["model"], cam, 1, BACKGROUND)
        unplaced = render(f12["model"], camera_from_wire(placed["camera"]), 1, BACKGROUND)
    got = torch.from_numpy(np.asarray(Image.open(placed["png"]), dtype=np.float32)[..., :3] / 255.0)
    placed_psnr, unplaced_psnr = psnr(got, expected.image.clamp(0, 1)), psnr(got, unplaced.image.clamp(0, 1))
    alpha, depth = expected.alpha.numpy(), np.load(placed["depth"])
    covered = alpha > 0.5
    view_depth = (expected.depth / expected.alpha.clamp_min(1e-12)).numpy() * depth_scale
    print(f"placed F12: PSNR {placed_psnr:.1f} dB to the backend's render through the camera in model space, "
          f"{unplaced_psnr:.1f} dB to the model where it was trained")
    assert placed_psnr >= 40.0 and unplaced_psnr < 25.0
    assert covered.mean() > 0.05 and np.allclose(depth[covered], view_depth[covered], rtol=1e-4)
    assert np.all(depth[alpha == 0] == 1e10)


def test_the_engine_renders_only_the_splats_inside_the_objects_crop_box(f12):
    import numpy as np
    import torch
    from PIL import Image

    from blender_addon.core.codecs import camera_from_wire
    from blender_addon.logic.placement import camera_in_model
    from backend.metrics import psnr
    from backend.render import render
    placed = f12["placed"]
    cam, _ = camera_in_model(camera_from_wire(placed["camera"]), np.array(placed["model_matrix"]))
    keep = inside_crop(f12["model"], placed["crop"])
    with torch.no_grad():
        cropped = render(subset(f12["model"], keep), cam, 1, BACKGROUND).image.clamp(0, 1)
        whole = render(f12["model"], cam, 1, BACKGROUND).image.clamp(0, 1)
    got = torch.from_numpy(np.asarray(Image.open(placed["cropped_png"]), dtype=np.float32)[..., :3] / 255.0)
    print(f"cropped F12: {int(keep.sum())} of {len(keep)} Gaussians kept; PSNR {psnr(got, cropped):.1f} dB to the "
          f"backend's render of those, {psnr(got, whole):.1f} dB to the whole model's")
    assert 0 < keep.sum() < 0.8 * len(keep)
    assert psnr(got, cropped) >= 40.0 and psnr(got, whole) < 30.0


def test_a_4d_model_is_imported_shown_at_the_frame_and_exported_as_a_ply_sequence(f12):
    """File > Import of splats4d.pt shows the 4D model at the scene's frame (F12 at the last frame is the model
    at time 1); Export writes one PLY per frame of the range, each the model at that frame's time (as convert
    --frames names them, nothing else left in the folder but the manifest that says the sequence is complete), one
    PLY at the current frame, and the model's own file; a static model's PLY sequence is refused and writes
    nothing. Importing a frame of a sequence whose manifest says it is incomplete warns so."""
    import numpy as np
    import torch
    from PIL import Image

    from blender_addon.core.codecs import camera_from_wire
    from blender_addon.core.files import sequence_manifest, sequence_paths, sequence_state
    from backend.dynamic import read_dynamic
    from backend.formats import read_any
    from backend.metrics import psnr
    from backend.render import render
    moving, model = f12["moving"], f12["model4d"]
    assert moving["may_move"] == [False, True]  # the status tells a 4D model from a static one
    folder = Path(moving["folder"])
    frames = sequence_paths(folder / "moving.ply", 3)
    assert moving["files"] == sorted([sequence_manifest(folder / "moving.ply").name, *(p.name for p in frames)])
    for k, frame in enumerate(frames):
        assert_same_model(read_any(frame), model.at(k / 2).detached(), atol=1e-6)
        assert sequence_state(frame).complete
    assert_same_model(read_any(moving["frame2"]), model.at(0.5).detached(), atol=1e-6)
    assert_same_model(read_dynamic(moving["copy"]), model)
    assert any(line.startswith("Info: exported 3 frames (1-3) of 120 Gaussians") for line in moving["reports"])
    errors = [line for line in moving["static_reports"] if line.startswith("Error: ")]
    assert len(errors) == 1 and "the model of placed-model is a static model, the same at every frame" in errors[0]
    warnings = [line for line in moving["incomplete_reports"] if line.startswith("Warning: ")]
    assert warnings == ["Warning: the sequence of moving_0001.ply is incomplete: its export stopped before all 3 "
                        "frames were in place (3 of their files are there, of this export or an earlier one; "
                        "moving.sequence.json says so); export the sequence again"], moving["incomplete_reports"]

    cam = camera_from_wire(moving["camera"])
    got = torch.from_numpy(np.asarray(Image.open(moving["png"]), dtype=np.float32)[..., :3] / 255.0)
    with torch.no_grad():
        last, first = (render(model.at(t), cam, 1, (1.0, 1.0, 1.0)).image.clamp(0, 1) for t in (1.0, 0.0))
    print(f"F12 of the 4D model at the last frame: {psnr(got, last):.1f} dB to its time 1, {psnr(got, first):.1f} dB "
          "to its time 0")
    assert psnr(got, last) >= 40.0 and psnr(got, first) < 30.0


def test_an_imported_models_session_is_described_as_one_also_while_show_model_loads_it(f12):
    """The Backend panel says the open session holds an imported model that Add Model to Scene places (not how
    many views it has: none); while Show Model loads that model, the panels say so and never ask for training."""
    imported = f12["imported"]
    said = f"Session {imported['session']}: an imported model; Add Model to Scene places it"
    for drawn in ("drawn", "drawn_loading", "drawn_loaded"):
        texts = " ".join(imported[drawn])  # the panels' labels, a long one wrapped over several
        assert said in texts and "Train or load a PLY first" not in texts, (drawn, imported[drawn])
    assert "Wait for Show Model to load the model" in " ".join(imported["drawn_loading"])  # wrapped at 36 characters


def test_add_model_to_scene_again_adds_another_copy_and_says_the_scene_held_one(f12):
    imported = f12["imported"]
    session = imported["session"]
    assert imported["objects"] == [session, f"{session}.001"]
    assert imported["add_reports"] == [
        f"Info: added {session}, the model of session {session}; final renders composite it through the scene's "
        "compositor",
        f"Info: added {session}.001, the model of session {session}, which the scene already held as {session} "
        f"(delete {session}.001 if one copy is enough); final renders composite it through the scene's compositor"]


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


def test_f12_shows_the_backends_frame_under_other_view_transforms(f12):
    """Under AgX and Filmic (with a look, an exposure and a gamma) the saved render is the backend's frame:
    within 2/255 where the transform can show its colours, and everywhere what the add-on's samples of the
    transform say it shows (a very saturated colour under AgX is shown as the nearest it can show)."""
    import numpy as np
    from PIL import Image

    from blender_addon.logic.view_transform import Inverse
    for view in f12["views"]:
        frame = np.load(view["frame"]).astype(np.float32)  # the backend's, top-down RGBA8
        got = np.asarray(Image.open(view["png"]), dtype=np.float32)
        assert got.shape == frame.shape == (60, 80, 4)
        inverse = Inverse(**np.load(view["inverse"]))
        display = frame[..., :3] / 255.0
        shown = inverse.shown(display) * 255.0
        reachable = np.abs(shown - frame[..., :3]).max(-1) < 0.5
        error = np.abs(got[..., :3] - frame[..., :3]).max(-1)
        print(f"{view['view']}: {reachable.mean():.1%} of the pixels' colours can be shown; on those the render "
              f"is off the backend's frame by at most {error[reachable].max():.0f}/255 (mean "
              f"{error[reachable].mean():.2f}), elsewhere off what the samples predict by at most "
              f"{np.abs(got[..., :3] - shown).max():.1f}/255; {view['seconds']:.2f} s with the inverse's build")
        assert reachable.mean() > 0.6
        assert error[reachable].max() <= 2.0
        assert np.abs(got[..., :3] - shown).max() <= 3.0
        assert (got[..., 3] == 255).all()


@pytest.mark.parametrize("scenario", ["4.5"], indirect=True)  # a session trained once is enough
def test_command_line_animation_render_reopens_the_session(scenario, addon_zip, tmp_path):
    """`blender -b scene.blend -a` in Debian's Blender 3.4: the add-on starts a backend itself, reopens the
    scene's session from its checkpoint and renders every frame of the scene camera; `-f 1` of the same scene
    under Filmic, Blender 3.4's default, renders that frame through the view transform's inverse."""
    import numpy as np
    import torch
    from PIL import Image

    from blender_addon.core.codecs import camera_from_wire
    from backend.metrics import psnr
    from backend.render import render
    if shutil.which("blender") is None:
        pytest.skip("Debian's blender is not installed (apt-get install blender); the command-line render needs it")
    env = blender_env(tmp_path)
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
        # The session's last model: the run the crash test started over and continued.
        expected = render(read_ply(scenario["crash"]["exported"]), cam, 1, (1.0, 1.0, 1.0)).image.clamp(0, 1)
    for frame in frames:
        got = np.asarray(Image.open(frame), dtype=np.float32)[..., :3] / 255.0
        assert got.shape == (48, 64, 3)
        assert psnr(torch.from_numpy(got), expected) >= 35.0, frame.name + run.stdout[-3000:] + run.stderr[-2000:]
    run = subprocess.run(["blender", "-b", str(tmp_path / "scene_filmic.blend"), "-f", "1"], env=env,
                         capture_output=True, text=True, timeout=180)
    frame = tmp_path / "filmic_0001.png"
    assert run.returncode == 0 and frame.is_file(), run.stdout[-3000:] + run.stderr[-3000:]
    got = np.asarray(Image.open(frame), dtype=np.float32)[..., :3] / 255.0
    print(f"under Filmic from the command line: {psnr(torch.from_numpy(got), expected):.1f} dB")
    assert psnr(torch.from_numpy(got), expected) >= 30.0, run.stdout[-3000:] + run.stderr[-2000:]
