"""Import COLMAP, the splat formats in File > Import / Export, and sending its photos (Send to Backend, From: Photos) in real Blender:
tests/blender/scenarios/colmap.py in the bpy module of each Blender version tested, with a CPU backend, checked
against tests/data/colmap_skull, COLMAP's model of 65 real photos (see its README.md)."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import build_addon
from backend.data import load_split
from backend.formats import formation_of, read_any
from backend.formats.ply import read_ply
from backend.render import render
from blender_addon.core import colmap
from blender_addon.core.cameras import Camera, blender_intrinsics, blender_lens, intrinsics, look_at
from blender_addon.core.codecs import camera_from_wire
from blender_addon.core.errors import SplatwrightError
from blender_addon.core.settings import FAR_FIELD_POINTS
from blender.runner import BLENDERS, NATIVE_SPLATS, SCENARIOS, run_scenario
from helpers import ROOT, simple_radial_capture

pytestmark = pytest.mark.blender

SCENARIO = SCENARIOS / "colmap.py"
DATA = ROOT / "tests" / "data" / "colmap_skull"
SPLATS = ROOT / "tests" / "data" / "splats"
SCALE = 2.0  # the scenario imports the model twice as large


@pytest.fixture(scope="module")
def model() -> colmap.Model:
    return colmap.read_model(DATA / "sparse")


@pytest.mark.parametrize("K, width, height", [
    (intrinsics(1224.8, 1226.5, 267.0, 178.0), 534, 356),  # the undistorted photos': pixels a little wide
    (intrinsics(300.0, 330.0, 170.0, 95.0), 320, 180),  # tall pixels, the principal point off centre
    (intrinsics(500.0, 480.0, 100.3, 260.7), 200, 500),  # portrait
])
def test_the_blender_lens_of_intrinsics_renders_them(K, width, height):
    lens, size = blender_lens(K, width, height)
    assert min(size.pixel_aspect_x, size.pixel_aspect_y) == 1.0  # Blender allows no pixel aspect below 1
    got, got_width, got_height = blender_intrinsics(lens, size)
    assert (got_width, got_height) == (width, height) and np.allclose(got, K, rtol=0, atol=1e-9)


def test_the_placement_turns_up_axes_to_z():
    turned = colmap.placement([], np.zeros((0, 3)), "MINUS_Y", False, 1.0)[:3, :3]
    assert np.allclose(turned @ [0, -1, 0], [0, 0, 1]) and np.allclose(turned @ [0, 0, 1], [0, 1, 0])
    assert np.allclose(colmap.placement([], np.zeros((0, 3)), "KEEP", False, 1.0), np.eye(4))
    tilt = np.eye(4)  # a world whose up is (1, 1, 1), as a COLMAP model's may be
    tilt[:3, :3] = colmap.rotation_onto(np.array([0.0, 0.0, 1.0]), np.ones(3))
    level = [look_at([3 * np.cos(a), 3 * np.sin(a), 1.0], [0, 0, 0]) for a in np.linspace(0, 2 * np.pi, 7)[:-1]]
    m = colmap.placement([Camera(tilt @ c2w, np.eye(3), 4, 4) for c2w in level], np.array([[1.0, 2.0, 3.0]]),
                         "CAMERAS", True, 3.0)
    assert np.allclose(m[:3, :3] @ np.ones(3) / np.sqrt(3), [0, 0, 3])
    assert np.allclose(m[:3, :3] @ [1.0, 2.0, 3.0] + m[:3, 3], 0.0)  # the points' median at the origin
    for a in ([0.0, 0.0, -1.0], [0.3, -0.2, 0.9]):
        r = colmap.rotation_onto(np.array(a), np.array([0.0, 0.0, 1.0]))
        assert np.allclose(r @ a / np.linalg.norm(a), [0, 0, 1]) and np.allclose(r.T @ r, np.eye(3))
    with pytest.raises(SplatwrightError, match="unknown up axis"):
        colmap.placement([], np.zeros((0, 3)), "Y", False, 1.0)


def test_a_capture_folder_or_its_model_folder_is_imported(tmp_path):
    assert colmap.capture_folders(DATA) == (DATA, DATA / "sparse")
    assert colmap.capture_folders(DATA / "sparse") == (DATA, DATA / "sparse")
    (tmp_path / "scan" / "sparse" / "0").mkdir(parents=True)
    (tmp_path / "scan" / "sparse" / "0" / "cameras.txt").write_text("")
    assert colmap.capture_folders(tmp_path / "scan" / "sparse" / "0") == (tmp_path / "scan",
                                                                          tmp_path / "scan" / "sparse" / "0")
    with pytest.raises(SplatwrightError, match="no COLMAP model .* choose the capture folder or its model folder"):
        colmap.capture_folders(tmp_path)


def test_the_backend_trains_on_the_real_capture_as_the_add_on_splits_it(model):
    train, test = load_split(DATA, "train", downscale=4), load_split(DATA, "test", downscale=4)
    names = sorted(Path(image.name).stem for image in model.images.values())
    assert test.names == names[::8] and len(train) == 56 and {tuple(image.shape) for image in train.images} == {(89, 134, 3)}
    assert [colmap.split_of(i) for i in range(len(names))].count("test") == len(test) == 9


@pytest.fixture(scope="module", params=BLENDERS)
def scenario(request, tmp_path_factory) -> dict:
    home = tmp_path_factory.mktemp(f"colmap-{request.param}")
    pytest.importorskip("pycolmap", reason="pycolmap makes the distorted model")
    distorted = simple_radial_capture(home / "distorted")
    result = run_scenario(SCENARIO, home, "--zip", str(build_addon.build(home / "dist")), "--out", str(home / "out"),
                          "--colmap", str(DATA), "--distorted", str(distorted), "--python", sys.executable,
                          "--splats", str(SPLATS), timeout=300, blender=request.param)
    return {**result, "blender": request.param}


def test_file_menus_hold_the_importers_and_the_exporter_until_disabled(scenario):
    assert scenario["menus"] == {"import": ["splatwright.import_splats", "splatwright.import_colmap"],
                                 "export": ["splatwright.export_splats"]}
    assert scenario["menus_after_disable"] == {"import": [], "export": []}


def test_a_distorted_camera_model_is_undistorted_as_it_comes_in_and_trains(scenario):
    """The SIMPLE_RADIAL capture comes in from its undistorted copy, made in Blender's Python where pycolmap imports
    there (bpy 4.5 in the checkout's .venv), else by the backend's Python, as the report says; its photos train."""
    returned, message = scenario["distorted"]
    got = scenario["undistorted"]
    capture = Path(got["photos"]).parent
    assert returned == ["FINISHED"] and "imported 65 cameras" in message, message
    how = "in Blender's Python" if got["pycolmap_in_blender"] else "by the backend's Python"
    assert f"the SIMPLE_RADIAL camera's photos were undistorted {how}" in message, message
    assert capture.name == colmap.UNDISTORTED and Path(got["model"]) == capture / "sparse"
    model = colmap.read_model(got["model"])
    assert {cam.model for cam in model.cameras.values()} == {"PINHOLE"} and len(model.images) == 65
    assert sorted(p.name for p in capture.iterdir()) == ["images", "sparse"]  # no stereo/ or scripts
    trained = got["trained"]
    assert trained["status"]["views"] == 56 and trained["session"] == "colmap-distorted"
    assert trained["final_status"]["state"] == "finished" and trained["final_status"]["step"] == 5
    assert trained["errors"] == ""


def test_the_model_comes_in_as_cameras_with_their_photos_and_a_point_cloud(scenario, model):
    returned, message = scenario["import"]
    got = scenario["model"]
    assert returned == ["FINISHED"] and "imported 65 cameras and 7646 points" in message, message
    assert got["empty"] == "COLMAP colmap_skull" and got["objects"] == 66  # 65 cameras and the point cloud
    names = sorted(image.name for image in model.images.values())
    assert sorted(got["cameras"]) == names
    assert [name for name in names if got["cameras"][name]["split"] == "test"] == names[::8]  # as train holds out
    for name, cam in got["cameras"].items():
        assert cam["shows_photo"] and cam["photo"] == str(DATA / "images" / name)
    declared = model.cameras[1]
    ycor = declared.params[0] / declared.params[1]  # PINHOLE fx / fy: a pixel's height over its width
    width, height, aspect_x, aspect_y = got["render"]
    assert (width, height) == (declared.width, declared.height) and aspect_y / aspect_x == pytest.approx(ycor, 1e-6)
    assert got["scene_camera"] == "01"
    assert np.array_equal(np.array(got["colors"], np.uint8), model.rgb)  # the colour attribute keeps sRGB bytes


def test_points_land_on_their_observations_through_the_blender_cameras(scenario, model):
    """Each 3D point, where it is in Blender's world, projected through the camera Blender renders (the add-on's
    conversion of lens, sensor, shift, resolution and pixel aspect), lands where COLMAP observed it: every one
    of the model's 29261 observations, to within the reconstruction's own reprojection error."""
    got = scenario["model"]
    world = np.array(got["points"], np.float64)
    row = {int(point_id): i for i, point_id in enumerate(model.point_ids)}
    residuals, from_model = [], []
    for image in model.images.values():
        cam = camera_from_wire(got["cameras"][image.name]["camera"])
        seen = image.point_ids >= 0
        rows = [row[int(p)] for p in image.point_ids[seen]]
        uv, depth = cam.world_to_pixel(world[rows])
        assert (depth > 0).all()
        residuals.append(np.linalg.norm(uv - image.xys[seen], axis=1))
        reader_uv, _ = colmap.camera_of(model, image, image.name).world_to_pixel(model.xyz[rows].astype(np.float64))
        from_model.append(np.abs(uv - reader_uv).max())
    residuals = np.concatenate(residuals)
    assert len(residuals) == 29261
    assert max(from_model) < 0.01  # Blender's cameras see exactly what the COLMAP cameras see
    assert np.median(residuals) < 0.25 and (residuals < 1.0).mean() > 0.95, np.percentile(residuals, [50, 95, 99])


def test_the_empty_turns_the_cameras_up_scales_and_centres(scenario, model):
    got = scenario["model"]
    m = np.array(got["matrix"])
    rotation = m[:3, :3] / SCALE
    assert np.allclose(rotation.T @ rotation, np.eye(3), atol=1e-5) and np.linalg.det(rotation) > 0
    ups = [camera_from_wire(c["camera"]).c2w[:3, 1] for c in got["cameras"].values()]
    up = -np.mean(ups, axis=0)
    assert up[2] / np.linalg.norm(up) > 0.9999  # the cameras' mean up is Blender's +Z
    world, middle = np.array(got["points"]), np.median(model.xyz, axis=0)
    assert np.allclose(m[:3, :3] @ middle + m[:3, 3], 0.0, atol=1e-5)  # the points' median is at the origin
    assert np.allclose(np.linalg.norm(world, axis=1), SCALE * np.linalg.norm(model.xyz - middle, axis=1), atol=1e-4)


def test_panels_show_the_import(scenario):
    assert scenario["drawn"] == ["COLMAP colmap_skull", "56 training photos, 9 held out"]


def test_every_splat_format_imports_and_exports(scenario):
    f = scenario["formats"]
    for name, loaded in f["loaded"].items():
        assert loaded == {"gaussians": 500, "error": ""}, name
    placed = f["placed"]  # each import a session of its own, which Add Model to Scene places (5.3: the import)
    assert placed["session"].startswith("sh3-") and placed["objects"] == [placed["session"]], placed
    assert placed["types"] == (["POINTCLOUD"] if scenario["blender"] in NATIVE_SPLATS else ["EMPTY"]), placed
    assert placed["error"] == "", placed
    degrees = {"out.ply": 3, "out.compressed.ply": 3, "out.spz": 3, "out.splat": 0, "out.sog": 3,
               "out-sog/meta.json": 3, "out.glb": 3, "out.gltf": 3}
    assert sorted(f["exported"]) == sorted(degrees)
    for name, exported in f["exported"].items():
        g = read_any(exported["path"])
        assert len(g) == 500 and g.max_sh_degree == degrees[name], name
        warnings = [line for line in exported["reports"] if line.startswith("Warning: ")]
        if name == "out.splat":
            assert len(warnings) == 1 and "degree 3 view-dependent colour is dropped" in warnings[0], warnings
        else:
            assert warnings == [], warnings
    rub = f["spz_axes"]  # Import Splats' SPZ Axes: Niantic's SPZ, which does not say its axes, read as RUB
    assert rub["error"] == "" and torch.allclose(read_any(rub["path"]).means, read_ply(SPLATS / "sh3.ply").means,
                                                 atol=0.5 / 4096 + 1e-6)
    for what, words in (("bad_import", "bad.spz: a text file, not a splat file"),
                        ("bad_export", "no splat format has this name")):
        errors = [line for line in f[what] if line.startswith("Error: ")]
        assert len(errors) == 1 and words in errors[0], (what, f[what])


def test_sent_photos_train_and_the_model_lines_up_with_their_cameras(scenario):
    """The training photos, sent at 64 pixels with the point cloud as the scene holds it (thinned to every 8th
    point), train: through the imported cameras as Blender has them, held-out ones too, the model after 40 steps
    shows the photos better than after the first step, and its Gaussians are where the points are (the far
    field's, which the panel adds for photos, after them)."""
    p = scenario["photos"]
    points = np.array(p["points"], np.float32)
    assert any("sent 56 photos of COLMAP colmap_skull to session colmap-colmap_skull" in line for line in p["sent"])
    assert p["status"]["views"] == 56 and p["errors"] == ""
    assert p["final_status"]["step"] == 40 and len(points) == 956
    assert p["final_status"]["gaussians"] == len(points) + FAR_FIELD_POINTS
    cameras = scenario["model"]["cameras"]
    names = sorted(cameras)
    errors = {}
    for model_file in ("first_step.ply", "trained.ply"):
        g, formation = read_any(p[model_file]), formation_of(p[model_file])  # Blender's own on 5.3
        errors[model_file] = []
        for name in (names[8], names[16], names[20], names[30]):  # two held out, two trained on
            cam = camera_from_wire(cameras[name]["camera"]).scaled(64 / 534)
            with torch.no_grad():
                image = render(g, cam, 0, (0.0, 0.0, 0.0), formation=formation).image.clamp(0, 1)
            photo = Image.open(DATA / "images" / name).resize((cam.width, cam.height), Image.Resampling.BOX)
            errors[model_file].append(float((image - torch.from_numpy(np.asarray(photo, np.float32) / 255)).abs().mean()))
    first, trained = np.array(errors["first_step.ply"]), np.array(errors["trained.ply"])
    assert (trained < first).all() and trained.mean() < 0.75 * first.mean(), errors
    means = read_any(p["trained.ply"]).means.numpy()[:len(points)]
    nearest = np.array([np.linalg.norm(points - m, axis=1).min() for m in means])
    assert np.median(nearest) < 1e-3 * np.linalg.norm(points.max(0) - points.min(0))  # Blender's world
