"""The far-field start (backend/gaussians.py's far_field): points on a sphere beyond the cameras, each where a
view's ray leaves it and in that pixel's colour, unmoved by a few stray points; `train` joins a COLMAP capture's
points with them and a Blender capture's points file with none, unless --far-field says otherwise."""
from __future__ import annotations

import json

import numpy as np
import torch

from backend.gaussians import FAR_FIELD_RADIUS, far_field
from backend.tools import cli
from blender_addon.core.settings import FAR_FIELD_POINTS
from helpers import orbit_cameras, write_capture
from server_helpers import png_bytes, wait_for

WIDTH, HEIGHT = 40, 30


def views(count: int) -> tuple[list, list[torch.Tensor]]:
    """Cameras around the origin and images of random colours."""
    generator = torch.Generator().manual_seed(0)
    return orbit_cameras(count, WIDTH, HEIGHT), [torch.randint(0, 256, (HEIGHT, WIDTH, 3), dtype=torch.uint8,
                                                               generator=generator) for _ in range(count)]


def test_far_field_points_lie_beyond_the_cameras_where_a_view_sees_them_in_its_colour():
    cameras, images = views(6)
    xyz = np.random.default_rng(1).uniform(-0.5, 0.5, (200, 3))
    points, colours = far_field(cameras, images, xyz, 300, seed=2)
    centre = np.median(xyz, axis=0)
    reach = max(np.linalg.norm(cam.position - centre) for cam in cameras)
    np.testing.assert_allclose(np.linalg.norm(points - centre, axis=1), FAR_FIELD_RADIUS * reach, rtol=1e-5)
    seen = 0
    for point, colour in zip(points, colours):
        # The view it was drawn from sees it at a pixel of its colour (a pixel of the colour seen elsewhere, by
        # chance, is as good: the colours are random).
        for cam, image in zip(cameras, images):
            (x, y), depth = (a[0] for a in cam.world_to_pixel(point[None]))
            if depth > 0 and 0 <= x < WIDTH and 0 <= y < HEIGHT and (image[int(y), int(x)].numpy() == colour).all():
                seen += 1
                break
    assert seen == len(points)


def test_a_few_stray_points_move_neither_the_centre_nor_the_radius():
    cameras, images = views(4)
    xyz = np.random.default_rng(1).uniform(-0.5, 0.5, (200, 3))
    strays = np.concatenate([xyz, [[60.0, 0, 0], [0, -90.0, 0], [0, 0, 120.0]]])
    alone, _ = far_field(cameras, images, xyz, 50, seed=2)
    with_strays, _ = far_field(cameras, images, strays, 50, seed=2)
    assert np.abs(with_strays - alone).max() < 0.05 * np.abs(alone).max()


def trained_gaussians(capsys, scene, out, *flags) -> tuple[int, str]:
    assert cli.main(["train", str(scene), "--out", str(out), "--device", "cpu", "--iterations", "1", *flags]) == 0
    return json.loads((out / "metrics.json").read_text())["gaussians"], capsys.readouterr().err


def test_train_joins_a_colmap_captures_points_with_the_far_field_and_a_points_file_with_none(
        tmp_path, capsys, mixed_size_scene):
    capture = tmp_path / "capture"
    write_capture(capture, orbit_cameras(6, 32, 32), binary=True)  # 60 points
    gaussians, err = trained_gaussians(capsys, capture, tmp_path / "colmap")
    assert f"starting from the 60 points of {capture / 'sparse' / '0'} and {FAR_FIELD_POINTS} far-field points" in err
    assert gaussians == 60 + FAR_FIELD_POINTS
    gaussians, err = trained_gaussians(capsys, capture, tmp_path / "off", "--far-field", "0")
    assert "far-field" not in err and gaussians == 60
    gaussians, err = trained_gaussians(capsys, mixed_size_scene, tmp_path / "blender")
    assert "starting from the 153 points" in err and "far-field" not in err and gaussians == 153
    gaussians, err = trained_gaussians(capsys, mixed_size_scene, tmp_path / "forced", "--far-field", "40")
    assert "and 40 far-field points" in err and gaussians == 193


def test_a_server_session_starts_far_field_points_only_where_asked(tmp_path, start_server, scene):
    """A session's points say not where they come from: none unless start_training's far_field asks."""
    model, cameras, images = scene
    client = start_server(tmp_path / "work").client()
    client.call("open_session", name="far")
    for cam, image in zip(cameras, images):
        client.add_view(cam, png_bytes(image))
    client.set_points(model.means.numpy(), np.full((len(model), 3), 128, np.uint8))
    for far, expected in ((None, len(model)), (25, len(model) + 25)):
        client.call("start_training", fresh=True, iterations=1, progress_interval=0.05,
                    **({} if far is None else {"far_field": far}))
        wait_for(client, lambda e: e["event"] == "state" and e["state"] == "finished" and e["gaussians"] == expected)
