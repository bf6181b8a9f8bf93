"""The COLMAP reconstruction of real photos (tests/data/colmap_skull) as a dataset: the held-out views are built
exactly as the training views are, so a held-out score measures novel views and nothing else. Each view's camera
projects the model's 3D points onto that photo's own 2D observations, and each view's image is its photo's
pixels as they are in the file."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from backend.data import colmap
from backend.data import load_split

DATA = Path(__file__).resolve().parent / "data" / "colmap_skull"


@pytest.fixture(scope="module")
def model() -> colmap.Model:
    return colmap.read_model(colmap.find_model(DATA))


@pytest.mark.parametrize("split", ["train", "test"])
def test_each_views_camera_projects_the_points_onto_its_photos_observations(model, split):
    data = load_split(DATA, split)
    images = colmap.split_images(model, split)
    assert data.names == [Path(im.name).stem for im in images]
    row_of = {int(point_id): row for row, point_id in enumerate(model.point_ids)}
    for cam, image, name in zip(data.cameras, images, data.names):
        observed = image.point_ids >= 0
        xyz = model.xyz[[row_of[int(p)] for p in image.point_ids[observed]]]
        uv, depth = cam.world_to_pixel(xyz)
        error = np.linalg.norm(uv - image.xys[observed], axis=1)
        assert np.all(depth > 0), name
        # The README's figures for the whole model: 0.14 px median, 96% within 1 px.
        assert np.median(error) < 0.3 and np.mean(error < 1.0) > 0.9, (name, np.median(error))


@pytest.mark.parametrize("split", ["train", "test"])
def test_each_views_image_is_its_photos_pixels(split):
    data = load_split(DATA, split)
    assert {tuple(image.shape) for image in data.images} == {(356, 534, 3)}
    for name, image in zip(data.names, data.images):
        with Image.open(DATA / "images" / f"{name}.jpg") as photo:
            pixels = np.asarray(photo.convert("RGB"))
        np.testing.assert_array_equal(image.numpy(), pixels, err_msg=name)  # the stored bytes are the photo's
