"""Splats drawn with the scene in a real Blender window: Debian's Blender 3.4 under Xvfb runs
tests/blender/scenarios/splats_gui.py, which adds a trained session's model to the scene and looks at it in Solid
shading past a cube in front of it and a wall through its middle. The screenshots (kept in test-artifacts/) show
the backend's frame where the splats are in front and the meshes where they are; moving the object moves the
splats; a crop box crops them, and a second session's model in front is drawn over them; drawing never waits on
Blender's main thread."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import build_addon
from blender_addon.core.codecs import camera_from_wire
from blender_addon.logic.placement import camera_in_model
from backend.dynamic import DynamicGaussians
from backend.render import render
from blender.runner import ARTIFACTS, EDGE, SCENARIOS, blender_env, run_window_scenario
from helpers import random_gaussians
from splat_helpers import (BACKGROUND, DEPTH_MARGIN, MARKER_AT, MARKER_RGB, SECOND, SESSION, depth_of_wall,
                           inside_crop, second_model, splat_model, subset, trained_session)

pytestmark = pytest.mark.blender

SCENARIO = SCENARIOS / "splats_gui.py"
WINDOW = (640, 480)
LEVEL = 1 / 255 + 1e-9  # one 8-bit level, with room for the rounding of pixel differences
UI_GAMMA = 2.2  # the power Blender's viewport blends what draw handlers draw in (overlay.py)
MOVING = "splat-moving"  # a 4D session


def moving_model() -> DynamicGaussians:
    """Gaussians that move 0.6 along x over the clip."""
    g = DynamicGaussians.from_static(random_gaussians(150, seed=9, sh_degree=0, scale=0.1))
    g.opacity_logits = g.opacity_logits + 3.0
    g.velocities = torch.tensor([[0.6, 0.0, 0.0]]).expand(len(g), 3).clone()
    return g


@pytest.fixture(scope="module")
def viewport(xvfb, tmp_path_factory) -> dict:
    home = tmp_path_factory.mktemp("blender-splats-gui")
    model = splat_model()
    trained_session(home / "sessions", model)
    trained_session(home / "sessions", second_model(), SECOND)
    trained_session(home / "sessions", moving_model(), MOVING)
    addon_zip = build_addon.build(home / "dist")
    result = run_window_scenario(SCENARIO, home, xvfb, WINDOW, "--zip", str(addon_zip), "--workdir",
                                 str(home / "sessions"), "--session", SESSION, "--second", SECOND, "--moving", MOVING,
                                 "--python", sys.executable)
    cli = subprocess.run(["blender", "-b", result["blend"], "-f", "1"], env=blender_env(home, DISPLAY=xvfb), cwd=home,
                         capture_output=True, text=True, timeout=180)
    ARTIFACTS.mkdir(exist_ok=True)
    shutil.copy(result["shown"]["screenshot"], ARTIFACTS / "viewport_splats_in_scene.png")
    return {**result, "model": model, "cli": cli}


def region_of(viewport, name: str) -> np.ndarray:
    """The 3D viewport's region of a screenshot, display values in [0, 1], rows top-down."""
    shot = np.asarray(Image.open(viewport[name]["screenshot"]).convert("RGB"), dtype=np.float64) / 255.0
    x, y, w, h = viewport["region"]  # from the window's bottom-left corner; the screenshot's rows go down
    return shot[shot.shape[0] - y - h:shot.shape[0] - y, x:x + w]


def drawn_frame(taken: dict):
    """The frame the viewport drew (as the scenario saved it), rows top-down: straight display colours (the
    background taken out), alpha and the model's view depth in the scene's units; and the camera it was asked
    through."""
    rgba = np.load(taken["rgba"])[::-1].astype(np.float64) / 255.0
    alpha = rgba[..., 3]
    shown = rgba[..., :3] - np.array(taken["background"]) * (1 - alpha[..., None])
    straight = np.clip(shown / np.maximum(alpha, 1e-6)[..., None], 0, 1)
    cam, depth_scale = camera_in_model(camera_from_wire(taken["camera"]), np.array(taken["model_matrix"]))
    return straight, alpha, np.load(taken["depth"])[::-1] * depth_scale, cam


def test_the_viewport_draws_the_backends_frame_of_the_placed_model(viewport):
    """The frame the viewport drew is the backend's render of the model through the viewport's camera taken
    into the model's space (the reference rasterizer again, from the same checkpoint), uploaded in strips (the
    screenshots check that they make up the frame)."""
    shown = viewport["shown"]
    assert shown["strips"] >= 2 and shown["rows_per_strip"] < viewport["region"][3]
    for name in ("shown", "moved"):
        straight, alpha, _, cam = drawn_frame(viewport[name])
        with torch.no_grad():
            out = render(viewport["model"], cam, 1, BACKGROUND)
        expected = (torch.cat([out.image, out.alpha[..., None]], -1).clamp(0, 1) * 255 + 0.5).to(torch.uint8)
        got = np.load(viewport[name]["rgba"])[::-1]
        assert np.abs(got.astype(int) - expected.numpy().astype(int)).max() <= 1, name
        assert viewport[name]["background"] == list(BACKGROUND)


def test_meshes_in_front_hide_the_splats_and_splats_in_front_hide_the_meshes(viewport):
    """Against the screenshot with the splat object hidden: where a mesh (the cube, or the wall through the
    model's middle) is in front, its Solid colour; where the splats are, the backend's frame, blended over what
    is behind in the viewport's blending space where they are transparent."""
    shown, hidden = region_of(viewport, "shown"), region_of(viewport, "hidden")
    straight, alpha, splat_depth, _ = drawn_frame(viewport["shown"])
    cam = camera_from_wire(viewport["shown"]["camera"])
    m = EDGE
    shown, hidden, straight, alpha, splat_depth = (a[m:-m, m:-m] for a in (shown, hidden, straight, alpha,
                                                                           splat_depth))
    wall_depth = depth_of_wall(cam)[m:-m, m:-m]
    # Blender's display transform on the GPU may miss the sRGB curve by a level.
    cube = np.all(np.abs(hidden - srgb8(viewport["cube_color"])) <= 1.5 * LEVEL, -1)
    wall = np.all(np.abs(hidden - srgb8(viewport["wall_color"])) <= 1.5 * LEVEL, -1)
    covered = alpha > 0.5
    behind_cube = cube & covered
    behind_wall = wall & covered & (splat_depth > wall_depth + DEPTH_MARGIN)
    in_front = wall & (alpha > 0.02) & (splat_depth < wall_depth - DEPTH_MARGIN)
    opaque = in_front & (alpha == 1.0)
    a = alpha[in_front][:, None]
    blended = (hidden[in_front] ** UI_GAMMA * (1 - a) + straight[in_front] ** UI_GAMMA * a) ** (1 / UI_GAMMA)
    errors = {
        "behind the cube": np.abs(shown[behind_cube] - hidden[behind_cube]).max(),
        "behind the wall": np.abs(shown[behind_wall] - hidden[behind_wall]).max(),
        "opaque in front": np.abs(shown[opaque] - straight[opaque]).max(),
        "in front, blended": np.abs(shown[in_front] - blended).max()}
    counts = {"behind the cube": behind_cube.sum(), "behind the wall": behind_wall.sum(), "opaque in front":
              opaque.sum(), "in front, blended": in_front.sum()}
    print("viewport pixels, max error in levels: " + "; ".join(f"{k}: {counts[k]} px, {255 * v:.2f}"
                                                                for k, v in errors.items()))
    assert min(counts.values()) > 50
    assert errors["behind the cube"] <= LEVEL and errors["behind the wall"] <= LEVEL
    assert errors["opaque in front"] <= 2 * LEVEL and errors["in front, blended"] <= 2 * LEVEL


def srgb8(linear) -> np.ndarray:
    from blender_addon.logic.colors import linear_to_srgb
    return np.round(linear_to_srgb(np.asarray(linear)) * 255) / 255


def marker_centre(region: np.ndarray, near: np.ndarray, radius: int = 12) -> np.ndarray:
    """The centre (pixel coordinates, y down) of the red marker Gaussian near `near`: the centroid of how much
    redder than the rest each pixel is."""
    x0, y0 = np.round(near).astype(int) - radius
    patch = region[y0:y0 + 2 * radius, x0:x0 + 2 * radius]
    weight = np.clip(patch[..., 0] - np.maximum(patch[..., 1], patch[..., 2]) - 0.2, 0, None)
    j, i = np.mgrid[0:2 * radius, 0:2 * radius] + 0.5
    return np.array([x0 + (weight * i).sum() / weight.sum(), y0 + (weight * j).sum() / weight.sum()])


def test_moving_the_model_object_moves_the_splats(viewport):
    """The marker Gaussian's centre in the screenshots is where the object's transform puts it, projected
    through the viewport's camera, before and after the object moved."""
    centres = {}
    for name in ("shown", "moved"):
        cam = camera_from_wire(viewport[name]["camera"])
        m = np.array(viewport[name]["model_matrix"])
        expected = cam.world_to_pixel((m @ [*MARKER_AT, 1.0])[None, :3])[0][0]
        found = marker_centre(region_of(viewport, name), expected)
        centres[name] = (expected, found)
    moved = np.linalg.norm(centres["moved"][0] - centres["shown"][0])
    print("marker centre, expected -> found: " + "; ".join(
        f"{k}: ({e[0]:.3f}, {e[1]:.3f}) -> ({f[0]:.3f}, {f[1]:.3f})" for k, (e, f) in centres.items())
        + f"; moved {moved:.1f} px")
    assert MARKER_RGB[0] > 0.9 and moved > 10
    for expected, found in centres.values():
        assert np.linalg.norm(found - expected) <= 1.0


def test_the_viewport_draws_a_cropped_model_and_a_second_one_in_depth_order(viewport):
    """With a crop box on the first model and a second session's model (which the backend does not show) in
    front of it: each frame drawn is the backend's render of its model, the first one cropped; where the second
    is opaque and nearer the screenshot is its frame, where only the first is, the first's over the scene; where
    the crop box took the splats away, the scene as it is without them."""
    several = viewport["several"]
    models = {"first": subset(viewport["model"], inside_crop(viewport["model"], several["crop"])),
              "second": second_model()}
    frames = {}
    for label, model in models.items():
        straight, alpha, depth, cam = frames[label] = drawn_frame(several["frames"][label])
        with torch.no_grad():
            out = render(model, cam, 1, BACKGROUND)
        expected = (torch.cat([out.image, out.alpha[..., None]], -1).clamp(0, 1) * 255 + 0.5).to(torch.uint8)
        got = np.load(several["frames"][label]["rgba"])[::-1]
        assert np.abs(got.astype(int) - expected.numpy().astype(int)).max() <= 1, label
    shot, hidden = region_of(viewport, "several"), region_of(viewport, "hidden")
    first, first_alpha, first_depth, _ = frames["first"]
    second, second_alpha, second_depth, _ = frames["second"]
    # Through the scene's camera: the first model is placed with a rotation, so the wall is not its plane y = 0.
    wall_depth = depth_of_wall(camera_from_wire(several["frames"]["first"]["camera"]))
    second_over = (second_alpha == 1.0) & (second_depth < np.minimum(first_depth, wall_depth) - DEPTH_MARGIN)
    wall = np.all(np.abs(hidden - srgb8(viewport["wall_color"])) <= 1.5 * LEVEL, -1)  # not the cube
    first_only = wall & (first_alpha > 0.1) & (second_alpha == 0) & (first_depth < wall_depth - DEPTH_MARGIN)
    a = first_alpha[first_only][:, None]
    first_blended = (hidden[first_only] ** UI_GAMMA * (1 - a) + first[first_only] ** UI_GAMMA * a) ** (1 / UI_GAMMA)
    both = second_over & (first_alpha > 0.5)
    uncropped_alpha = drawn_frame(viewport["moved"])[1]  # the same view and placement, before the crop box
    cropped_away = (uncropped_alpha > 0.5) & (first_alpha == 0) & (second_alpha == 0)
    errors = {"second over the first": np.abs(shot[both] - second[both]).max(),
              "second opaque in front": np.abs(shot[second_over] - second[second_over]).max(),
              "first alone, blended": np.abs(shot[first_only] - first_blended).max(),
              "cropped away": np.abs(shot[cropped_away] - hidden[cropped_away]).max()}
    counts = {"second over the first": both.sum(), "second opaque in front": second_over.sum(),
              "first alone, blended": first_only.sum(), "cropped away": cropped_away.sum()}
    print("several models in the viewport, max error in levels: " + "; ".join(
        f"{k}: {counts[k]} px, {255 * v:.2f}" for k, v in errors.items()))
    assert min(counts.values()) > 50
    assert errors["second over the first"] <= 2 * LEVEL and errors["second opaque in front"] <= 2 * LEVEL
    assert errors["first alone, blended"] <= 2 * LEVEL and errors["cropped away"] <= LEVEL


def test_two_frames_of_the_timeline_show_the_4d_model_at_their_times(viewport):
    """At the scene's first and last frames the viewport draws the backend's renders of the 4D model at times 0
    and 1, and the screenshots differ where the splats moved."""
    model = moving_model()
    for name, time in (("frame_1", 0.0), ("frame_24", 1.0)):
        assert viewport[name]["time"] == time
        _, _, _, cam = drawn_frame(viewport[name])
        with torch.no_grad():
            out = render(model.at(time), cam, 0, BACKGROUND)
        expected = (torch.cat([out.image, out.alpha[..., None]], -1).clamp(0, 1) * 255 + 0.5).to(torch.uint8)
        got = np.load(viewport[name]["rgba"])[::-1]
        assert np.abs(got.astype(int) - expected.numpy().astype(int)).max() <= 1, name
    first, last = region_of(viewport, "frame_1"), region_of(viewport, "frame_24")
    changed = (np.abs(first - last).max(-1) > 10 * LEVEL).mean()
    print(f"the 4D model between the first and the last frame: {100 * changed:.1f}% of the viewport changed")
    assert changed > 0.01


def test_drawing_the_splats_never_waits_on_the_main_thread(viewport):
    draws = viewport["draws"]
    print(f"splat drawing: {draws['draws']} draws, median {1000 * float(np.median(viewport['draw_seconds'])):.2f} "
          f"ms, max {1000 * max(viewport['draw_seconds']):.2f} ms")
    assert draws["draws"] >= 3 and draws["blocking"] == []
    assert viewport["errors"] == ""
    assert "/splatwright/" not in viewport["stderr"], viewport["stderr"][-3000:]  # no traceback through the add-on


def test_final_renders_composite_the_splats_in_a_window_and_from_the_command_line(viewport):
    """F12 with Cycles as a render job (its thread fetches the splats): the backend's frame where the splats
    are in front of the wall, the cube where it is in front of them, the render without them where there are
    none; `blender -b scene.blend -f 1` starts a backend, reopens the session and renders the same image."""
    shown, hidden = png(viewport["f12"]), png(viewport["f12_hidden"])
    cam = camera_from_wire(viewport["render_camera"])
    placed, depth_scale = camera_in_model(cam, np.array(viewport["render_model_matrix"]))
    with torch.no_grad():
        out = render(viewport["model"], placed, 1, BACKGROUND)
    rgba = (torch.cat([out.image, out.alpha[..., None]], -1).clamp(0, 1) * 255 + 0.5).to(torch.uint8).numpy() / 255
    alpha = rgba[..., 3]
    straight = np.clip((rgba[..., :3] - np.array(BACKGROUND) * (1 - alpha[..., None]))
                       / np.maximum(alpha, 1e-6)[..., None], 0, 1)
    splat_depth = np.where(alpha > 0, (out.depth / out.alpha.clamp_min(1e-12)).numpy() * depth_scale, np.inf)
    on_wall = np.all(hidden == srgb8(viewport["wall_color"]), -1)
    on_cube = np.all(hidden == srgb8(viewport["cube_color"]), -1)
    in_front = on_wall & (alpha == 1.0) & (splat_depth < depth_of_wall(cam) - DEPTH_MARGIN)
    behind_cube = on_cube & (alpha > 0.5)
    splat_error = np.abs(shown[in_front] - straight[in_front]).max()
    cli_error = np.abs(png(cli_render(viewport)) - shown).max()
    print(f"F12 in the window: {in_front.sum()} opaque splat pixels in front of the wall, max error "
          f"{255 * splat_error:.2f}/255; {behind_cube.sum()} behind the cube as rendered; the command line's "
          f"render differs by {255 * cli_error:.2f}/255")
    assert in_front.sum() > 30 and behind_cube.sum() > 10 and splat_error <= 2 * LEVEL
    assert np.array_equal(shown[behind_cube], hidden[behind_cube])
    assert np.array_equal(shown[alpha == 0], hidden[alpha == 0]) and not np.array_equal(shown, hidden)
    assert cli_error == 0.0


def png(path) -> np.ndarray:
    return np.asarray(Image.open(path).convert("RGB"), dtype=np.float64) / 255.0


def cli_render(viewport) -> str:
    cli = viewport["cli"]
    frame = Path(viewport["blend"]).with_name("cli_0001.png")
    assert cli.returncode == 0 and frame.is_file(), cli.stdout[-3000:] + cli.stderr[-3000:]
    return str(frame)
