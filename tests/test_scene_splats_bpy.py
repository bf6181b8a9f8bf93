"""Splats in the scene's final renders, in real Blender (the bpy modules 4.5, 5.2, 5.3): a trained session's model
added to the scene as an object and moved, rendered F12 with Cycles beside a wall through its middle and a cube
in front of it; a second session's model in front of it; the first cropped by a crop box, and exported.
tests/blender/scenarios/splats.py runs in Blender; these tests check its renders against the backend's own render
of each model through the scene camera taken into the model's space, and its exports against the model."""
from __future__ import annotations

import sys

import numpy as np
import pytest

from blender_addon.logic.colors import linear_to_srgb, srgb_to_linear
from blender_addon.core.codecs import camera_from_wire
from backend.formats.ply import read_ply
from backend.render.reference import quat_to_rotmat
from blender.runner import SCENARIOS, STREAMED_SPLATS, run_scenario
from splat_helpers import (DEPTH_MARGIN, LEVEL, SECOND, SESSION, inside_crop, placed_frame, png, second_model,
                           splat_model, srgb8, subset, trained_session)

pytestmark = pytest.mark.blender

SCENARIO = SCENARIOS / "splats.py"


@pytest.fixture(scope="module", params=STREAMED_SPLATS)
def renders(addon_zip, tmp_path_factory, request) -> dict:
    home = tmp_path_factory.mktemp(f"blender-splats-{request.param}")
    model, second = splat_model(), second_model()
    workdir = home / "sessions"
    trained_session(workdir, model)
    trained_session(workdir, second, SECOND)
    result = run_scenario(SCENARIO, home, "--zip", str(addon_zip), "--workdir", str(workdir), "--session", SESSION,
                          "--second", SECOND, "--out", str(home / "out"), "--python", sys.executable, timeout=300,
                          blender=request.param)
    placed = placed_frame(model, result["camera"], result["model_matrix"])
    return {**result, "blender": request.param, "straight": placed[0], "alpha": placed[1], "splat_depth": placed[2],
            "model": model, "second": second}


def layered(renders, shown_png: str, layers, order=None) -> tuple[float, float, np.ndarray, np.ndarray]:
    """How far an F12 render is from Blender's render with the splat frames `layers` (straight colour, alpha,
    depth each) blended over it in scene-linear, each pixel's farthest first, those behind a mesh left out (or in
    `order`, the layers' indices from the farthest, for all pixels). Returns the largest error where splats are in
    front and where only meshes are, and those pixels; pixels with splats close to a surface are left out."""
    hidden, shown = png(renders["hidden"])[..., :3], png(shown_png)[..., :3]
    scene_depth = np.load(renders["depth"])
    depths = np.stack([depth for _, _, depth in layers])
    drawn = np.stack([alpha for _, alpha, _ in layers]) > 0
    near_surface = np.any(drawn & (np.abs(depths - scene_depth) < DEPTH_MARGIN), axis=0)
    in_front = drawn & (depths < scene_depth)
    front = np.any(in_front & (np.stack([alpha for _, alpha, _ in layers]) > 0.05), axis=0) & ~near_surface
    behind = ~np.any(in_front, axis=0) & np.any(drawn, axis=0) & ~near_surface
    ranks = np.argsort(-depths, axis=0) if order is None else np.array(order)[:, None, None] * np.ones_like(depths, int)
    expected = srgb_to_linear(hidden)
    for rank in ranks:
        for i, (straight, alpha, depth) in enumerate(layers):
            here = (rank == i) & in_front[i]
            a = alpha[here][:, None]
            expected[here] = expected[here] * (1 - a) + srgb_to_linear(straight[here]) * a
    expected = linear_to_srgb(expected)
    return np.abs(shown[front] - expected[front]).max(), np.abs(shown[behind] - hidden[behind]).max(), front, behind


def test_the_model_is_added_as_a_cube_around_it(renders):
    added = renders["added"]
    assert added["display"] == "CUBE" and added["selected"]
    np.testing.assert_allclose(added["location"], [0.0, 0.0, 0.0], atol=0.1)  # the cluster's centre
    assert 0.6 < added["size"] < 0.9  # half its side (the random cluster spans about 1.5)
    assert renders["reopened_object"] == SESSION and renders["errors"] == ""
    assert f"{SESSION}: session {SESSION}" in renders["panel"]  # the sidebar lists it


def test_an_uneven_scale_leaves_the_splats_out_and_says_why(renders):
    assert np.array_equal(png(renders["uneven"]), png(renders["hidden"]))
    said = [line for line in renders["reports"] if "left out of this render" in line]
    assert said == [f"Error: {SESSION} is left out of this render: it is scaled unevenly (1, 2, 1) or sheared; "
                    "splat models take one scale for all axes, so give X, Y and Z the same scale"], renders["reports"]


def test_a_render_without_the_splat_object_is_blenders_own(renders):
    hidden, raw = png(renders["hidden"]), png(renders["raw"])
    assert np.array_equal(hidden, raw)  # the muted Z Combine passes the render on as it is


def test_cycles_depth_pass_is_the_planar_distance_the_splats_depth_is(renders):
    """On the wall (the plane y = 0 facing the camera), Cycles' Depth is the distance along the camera's axis,
    as the backend's view depth is, not the distance along each pixel's ray."""
    cam, depth = camera_from_wire(renders["camera"]), np.load(renders["depth"])
    height, width = depth.shape
    j, i = np.mgrid[0:height, 0:width] + 0.5
    rays = np.stack([(i - cam.K[0, 2]) / cam.K[0, 0], (j - cam.K[1, 2]) / cam.K[1, 1], np.ones_like(i)], -1)
    directions = rays @ cam.c2w[:3, :3].T
    t = -cam.c2w[1, 3] / directions[..., 1]  # along each ray to y = 0
    on_wall = np.all(np.abs(png(renders["hidden"])[..., :3] - srgb8(renders["wall_color"])) < 0.5 * LEVEL, -1)
    planar, along_ray = t[on_wall], (t * np.linalg.norm(directions, axis=-1))[on_wall]
    planar_error = np.abs(depth[on_wall] - planar).max()
    ray_error = np.abs(depth[on_wall] - along_ray).max()
    print(f"Cycles Depth on {on_wall.sum()} wall pixels: {planar_error:.2e} from the planar depth, "
          f"{ray_error:.2e} from the ray distance ({renders['blender']})")
    assert on_wall.sum() > 1000 and planar_error < 1e-3 < ray_error


def test_f12_composites_the_splats_with_the_meshes_by_depth(renders):
    """Where the splats are in front (over the wall) the render is the backend's frame, blended over the render
    behind it where they are transparent (in scene-linear, as Blender composites); where the cube or the wall
    is in front, it is Blender's render."""
    hidden, shown = png(renders["hidden"])[..., :3], png(renders["shown"])
    straight, alpha, splat_depth = renders["straight"], renders["alpha"], renders["splat_depth"]
    scene_depth = np.load(renders["depth"])
    assert shown.shape == (60, 80, 4) and shown[..., 3].min() == 1.0
    on_cube = np.all(np.abs(hidden - srgb8(renders["cube"][2])) < 0.5 * LEVEL, -1)
    front = (splat_depth < scene_depth - DEPTH_MARGIN) & (alpha > 0.05)
    mesh_shown = (splat_depth > scene_depth + DEPTH_MARGIN) & (alpha > 0.5)
    opaque = front & (alpha == 1.0)
    a = alpha[front][:, None]
    blended = linear_to_srgb(srgb_to_linear(hidden[front]) * (1 - a) + srgb_to_linear(straight[front]) * a)
    front_error = np.abs(shown[..., :3][front] - blended).max()
    opaque_error = np.abs(shown[..., :3][opaque] - straight[opaque]).max()
    mesh_error = np.abs(shown[..., :3][mesh_shown] - hidden[mesh_shown]).max()
    print(f"F12 ({renders['blender']}): {opaque.sum()} opaque splat pixels in front of the wall, max error "
          f"{opaque_error * 255:.2f}/255 from the backend's frame; {front.sum()} splat pixels in front in all, "
          f"max error {front_error * 255:.2f}/255 from it blended over Blender's render; {mesh_shown.sum()} "
          f"behind a mesh ({(mesh_shown & on_cube).sum()} behind the cube), max error {mesh_error * 255:.2f}/255 "
          "from Blender's render")
    assert opaque.sum() > 50 and (mesh_shown & ~on_cube).sum() > 30 and (mesh_shown & on_cube).sum() > 20
    assert opaque_error <= 2 * LEVEL and front_error <= 2 * LEVEL
    assert mesh_error == 0.0


def test_a_saved_and_reopened_file_renders_the_splats_again(renders):
    assert np.array_equal(png(renders["reopened"]), png(renders["shown"]))


def test_two_models_render_in_depth_order_the_one_not_shown_from_its_saved_model(renders):
    """The second session's model, which the backend does not show, is drawn from its checkpoint in front of
    the first; in each pixel the splats and meshes are layered in their order."""
    first = placed_frame(renders["model"], renders["camera"], renders["matrices"][SESSION])
    second = placed_frame(renders["second"], renders["camera"], renders["matrices"][SECOND])
    both = (first[1] > 0.5) & (second[1] > 0.5)
    second_nearer = both & (second[2] < first[2])
    front_error, mesh_error, front, behind = layered(renders, renders["several"], [first, second])
    wrong_error = layered(renders, renders["several"], [first, second], order=[1, 0])[0]  # the first over the second
    print(f"several models ({renders['blender']}): {both.sum()} pixels where both have splats ({second_nearer.sum()} "
          f"with the second nearer); {front.sum()} splat pixels in front, max error {front_error * 255:.2f}/255 "
          f"(drawn in the other order: {wrong_error * 255:.1f}/255); {behind.sum()} behind meshes, max error "
          f"{mesh_error * 255:.2f}/255")
    assert second_nearer.sum() > 20 and (second[1] > 0.5).sum() > 100 and behind.sum() > 30
    assert front_error <= 2 * LEVEL and mesh_error == 0.0 and wrong_error > 20 * LEVEL


def test_a_crop_box_hides_the_splats_outside_it_in_f12(renders):
    box = renders["crop_box"]
    assert box["parent"] == SESSION and box["display"] == "CUBE" and box["size"] == box["model_size"]
    assert f"cropped to {box['name']}" in renders["crop_panel"]
    keep = inside_crop(renders["model"], renders["crop"])
    assert 30 < int(keep.sum()) < len(keep) - 30
    cropped = placed_frame(subset(renders["model"], keep), renders["camera"], renders["model_matrix"])
    front_error, mesh_error, front, _ = layered(renders, renders["cropped"], [cropped])
    outside = (renders["alpha"] > 0.05) & (cropped[1] == 0)  # splats the box took away
    hidden, shown = png(renders["hidden"]), png(renders["cropped"])
    outside_error = np.abs(shown[outside] - hidden[outside]).max()
    print(f"crop box ({renders['blender']}): {int(keep.sum())} of {len(keep)} Gaussians kept; {outside.sum()} pixels "
          f"lost their splats and show Blender's render (max error {outside_error * 255:.1f}/255); {front.sum()} "
          f"kept splat pixels in front, max error {front_error * 255:.2f}/255")
    assert outside.sum() > 100 and outside_error == 0.0
    assert front.sum() > 50 and front_error <= 2 * LEVEL and mesh_error == 0.0


def test_export_splats_writes_the_cropped_model_and_the_model_in_world_space(renders):
    model = renders["model"]
    cropped = read_ply(renders["exports"]["cropped"])
    keep = inside_crop(model, renders["crop"])
    assert len(cropped) == int(keep.sum())
    np.testing.assert_allclose(cropped.means.numpy(), model.means[keep].numpy(), atol=1e-6)
    world = read_ply(renders["exports"]["world"])
    placement = np.array(renders["model_matrix"])
    assert len(world) == len(model)
    np.testing.assert_allclose(world.means.numpy(), model.means.double().numpy() @ placement[:3, :3].T
                               + placement[:3, 3], atol=1e-5)
    np.testing.assert_allclose(quat_to_rotmat(world.quats.double()).numpy(),
                               placement[:3, :3] @ quat_to_rotmat(model.quats.double()).numpy(), atol=1e-5)
    np.testing.assert_allclose(world.log_scales.numpy(), model.log_scales.numpy(), atol=1e-5)  # MOVE keeps scale
