"""Our Blender camera conversion against Blender's own projection (needs the bpy module)."""
import numpy as np
import pytest

from blender_addon.core.cameras import BlenderLens, RenderSize, from_blender_camera, from_blender_view
from blender_addon.core.errors import SplatwrightError

bpy = pytest.importorskip("bpy", reason="the bpy module (pip install bpy==4.5.*) is not installed")
from bpy_extras.object_utils import world_to_camera_view  # noqa: E402
from mathutils import Euler, Vector  # noqa: E402

pytestmark = pytest.mark.blender

# (sensor fit, resolution x, y, percentage, pixel aspect x, y, shift x, y, sensor width, height)
CASES = {
    "auto-wide": ("AUTO", 640, 480, 100, 1.0, 1.0, 0.0, 0.0, 36.0, 24.0),
    "auto-tall": ("AUTO", 300, 500, 100, 1.0, 1.0, 0.0, 0.0, 36.0, 24.0),
    "horizontal-tall": ("HORIZONTAL", 300, 500, 100, 1.0, 1.0, 0.0, 0.0, 36.0, 24.0),
    "vertical-wide": ("VERTICAL", 640, 360, 100, 1.0, 1.0, 0.0, 0.0, 36.0, 20.0),
    "shift-wide": ("AUTO", 640, 480, 100, 1.0, 1.0, 0.15, -0.1, 36.0, 24.0),
    "shift-tall-vertical": ("VERTICAL", 400, 600, 100, 1.0, 1.0, -0.2, 0.12, 30.0, 22.0),
    "percentage": ("AUTO", 800, 600, 25, 1.0, 1.0, 0.05, 0.05, 36.0, 24.0),
    # pixel aspect 2:1 makes the pixel-corrected size 1000 x 400, so AUTO fits horizontally
    "pixel-aspect": ("AUTO", 500, 400, 100, 2.0, 1.0, 0.1, 0.0, 36.0, 24.0),
    # 1:2 makes it 300 x 800: AUTO fits vertically, though the pixel grid is wider than tall
    "pixel-aspect-tall": ("AUTO", 500, 400, 100, 1.0, 2.0, 0.0, 0.1, 36.0, 24.0),
    "pixel-aspect-horizontal": ("HORIZONTAL", 320, 240, 50, 1.0, 1.5, -0.1, 0.2, 36.0, 24.0),
}


def setup_camera(fit, rx, ry, pct, ax, ay, sx, sy, sw, sh):
    scene = bpy.context.scene
    data = bpy.data.cameras.new("test")
    data.lens, data.sensor_fit, data.sensor_width, data.sensor_height = 42.0, fit, sw, sh
    data.shift_x, data.shift_y = sx, sy
    cam = bpy.data.objects.new("test", data)
    scene.collection.objects.link(cam)
    cam.location = (4.0, -5.0, 3.0)
    cam.rotation_euler = Euler((1.1, 0.05, 0.7))
    cam.scale = (1.3, 1.3, 1.3)  # Blender ignores a camera's scale; so must we
    r = scene.render
    r.resolution_x, r.resolution_y, r.resolution_percentage = rx, ry, pct
    r.pixel_aspect_x, r.pixel_aspect_y = ax, ay
    bpy.context.view_layer.update()
    return scene, cam


def to_ours(cam_obj, scene):
    d, r = cam_obj.data, scene.render
    lens = BlenderLens(d.type, d.lens, d.sensor_width, d.sensor_height, d.sensor_fit, d.shift_x, d.shift_y)
    size = RenderSize(r.resolution_x, r.resolution_y, r.resolution_percentage, r.pixel_aspect_x, r.pixel_aspect_y)
    return from_blender_camera(np.array(cam_obj.matrix_world), lens, size), size


def points_in_view(cam_obj, n=200, seed=0):
    """World points spread over and beyond the camera's frame, 2 to 12 units in front."""
    rng = np.random.default_rng(seed)
    local = np.stack([rng.uniform(-0.6, 0.6, n), rng.uniform(-0.6, 0.6, n), -np.ones(n)], 1)
    local *= rng.uniform(2.0, 12.0, n)[:, None]
    m = np.array(cam_obj.matrix_world.normalized())
    return local @ m[:3, :3].T + m[:3, 3]


@pytest.mark.parametrize("case", CASES)
def test_projection_matches_blender(case):
    scene, cam_obj = setup_camera(*CASES[case])
    try:
        ours, size = to_ours(cam_obj, scene)
        assert (ours.width, ours.height) == size.pixels
        pts = points_in_view(cam_obj)
        uv, depth = ours.world_to_pixel(pts)
        ndc = np.array([world_to_camera_view(scene, cam_obj, Vector(p)) for p in pts])
        theirs = np.stack([ndc[:, 0] * ours.width, (1.0 - ndc[:, 1]) * ours.height], 1)
        assert np.abs(uv - theirs).max() < 0.01
        assert np.allclose(depth, ndc[:, 2], atol=1e-4)
        if CASES[case][4] != CASES[case][5]:
            assert abs(ours.K[0, 0] - ours.K[1, 1]) > 1.0  # non-square pixels: fx != fy
    finally:
        bpy.data.objects.remove(cam_obj)


@pytest.mark.parametrize("case", CASES)
def test_viewport_matrices_give_the_same_camera(case):
    """A viewport looking through the camera has the camera's inverse world matrix as its view matrix
    and Blender's camera projection as its window matrix."""
    scene, cam_obj = setup_camera(*CASES[case])
    try:
        ours, size = to_ours(cam_obj, scene)
        r = scene.render
        window = cam_obj.calc_matrix_camera(bpy.context.evaluated_depsgraph_get(), x=ours.width, y=ours.height,
                                            scale_x=r.pixel_aspect_x, scale_y=r.pixel_aspect_y)
        view = from_blender_view(np.array(cam_obj.matrix_world.normalized().inverted()), np.array(window),
                                 ours.width, ours.height)
        assert np.allclose(view.K, ours.K, rtol=1e-5, atol=1e-3)
        assert np.allclose(view.c2w, ours.c2w, atol=1e-5)
    finally:
        bpy.data.objects.remove(cam_obj)


@pytest.mark.parametrize("kind", ["ORTHO", "PANO"])
def test_orthographic_and_panoramic_are_refused(kind):
    scene, cam_obj = setup_camera(*CASES["auto-wide"])
    try:
        cam_obj.data.type = kind
        with pytest.raises(SplatwrightError, match="not supported"):
            to_ours(cam_obj, scene)
        window = np.array(cam_obj.calc_matrix_camera(bpy.context.evaluated_depsgraph_get(), x=64, y=64))
        if kind == "ORTHO":
            with pytest.raises(SplatwrightError, match="not a perspective view"):
                from_blender_view(np.eye(4), window, 64, 64)
    finally:
        bpy.data.objects.remove(cam_obj)
