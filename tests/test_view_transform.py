"""The inverse of a view transform (blender_addon/logic/view_transform.py), built from samples of synthetic
transforms as Blender would give them: one per channel, one that mixes the channels as AgX does."""
from __future__ import annotations

import numpy as np
import pytest

from blender_addon.logic import colors, view_transform
from blender_addon.logic.view_transform import Inverse, even_grid, grey_inputs, grid_inputs, invert, shaper_of, trilinear

BYTE = 1.0 / 255.0


def standard_with_exposure(x):
    """Standard with an exposure of +1: the sRGB curve of twice the value, clipped at 1 (a flat part)."""
    return colors.linear_to_srgb(2.0 * np.asarray(x, np.float64))


def tone(y):
    """A filmic-like curve per channel: a shoulder that never quite reaches 1 (the top bytes are out of
    reach) and a toe that lifts black a little."""
    y = np.maximum(y, 0.0)
    return (0.0002 + y / (y + 0.6)) ** (1 / 1.6)


def mixing(x):
    """AgX-like: each channel takes some of the others (AgX's inset matrix), then an S-curve in stops around
    middle grey that clips 16.5 stops of range; saturated colours are out of reach."""
    inset = np.array([[0.8566, 0.0951, 0.0483], [0.1373, 0.7612, 0.1014], [0.1118, 0.0767, 0.8113]])
    y = np.maximum(np.asarray(x, np.float64) @ inset.T, 1e-10)
    t = np.clip((np.log2(y / 0.18) + 12.47) / 16.5, 0.0, 1.0)
    return (t * t * (3.0 - 2.0 * t)) ** 1.4


TRANSFORMS = {"standard with exposure": standard_with_exposure, "per channel": tone, "mixing": mixing}


@pytest.fixture(scope="module", params=list(TRANSFORMS))
def sampled(request):
    """A transform and the inverse of it made from its samples, as view_colors.py makes one from Blender's."""
    transform = TRANSFORMS[request.param]
    shaper = shaper_of(transform(grey_inputs()))
    return request.param, transform, invert(shaper, transform(grid_inputs(shaper)))


def display_colors(seed: int = 0) -> np.ndarray:
    """Random display colours, the corners of the cube and every grey byte."""
    rng = np.random.default_rng(seed)
    grey = np.repeat(np.arange(256)[:, None] * BYTE, 3, axis=1)
    return np.concatenate([rng.random((20000, 3)), even_grid(2), grey])


def reachable(inverse: Inverse, d: np.ndarray, margin: float = 0.0) -> np.ndarray:
    """Which colours the samples say the transform can show, and so can colours `margin` away along each
    channel: those inside what it shows, not on its edge."""
    mask = np.abs(inverse.shown(d) - d).max(-1) < 0.5 * BYTE
    for axis in range(3 if margin else 0):
        for sign in (-1, 1):
            moved = d.copy()
            moved[:, axis] = np.clip(moved[:, axis] + sign * margin, 0.0, 1.0)
            mask &= reachable(inverse, moved)
    return mask


def test_colours_it_can_show_come_back_within_a_byte(sampled):
    name, transform, inverse = sampled
    d = display_colors()
    x = inverse(d)
    assert x.dtype == np.float32 and x.min() >= 0.0 and x.max() <= 64.0
    inside = reachable(inverse, d, margin=3 * BYTE)
    error = np.abs(transform(x) - d).max(-1)
    print(f"{name}: {inside.mean():.1%} inside what it shows, error there at most {error[inside].max() / BYTE:.3f}/255")
    assert inside.mean() > {"standard with exposure": 0.98, "per channel": 0.9, "mixing": 0.05}[name]
    assert error[inside].max() <= BYTE
    if name != "mixing":  # every grey byte a transform that works per channel shows comes back
        grey = np.arange(256) * BYTE
        grey = np.repeat(grey[(grey >= transform(np.zeros((1, 3))).max())
                              & (grey <= transform(np.full((1, 3), 64.0)).min())][:, None], 3, axis=1)
        np.testing.assert_allclose(transform(inverse(grey)), grey, atol=BYTE)


def test_what_it_shows_is_what_the_samples_predict_and_the_nearest_it_can(sampled):
    """Everywhere, the colour shown is the one the samples predict (but for a few at the edge of what a
    transform that mixes channels shows); where the transform cannot show the wanted one, few colours it can
    show (from a dense random sampling of its inputs) are nearer."""
    name, transform, inverse = sampled
    d = display_colors(seed=1)
    shown = transform(inverse(d))
    predicted = np.abs(shown - inverse.shown(d)).max(-1)
    assert np.percentile(predicted, 99) <= BYTE and predicted.max() <= 4 * BYTE
    unreachable = np.flatnonzero(~reachable(inverse, d))[:100]
    if name == "standard with exposure":
        assert len(unreachable) == 0
        return
    rng = np.random.default_rng(2)
    candidates = transform((np.exp2(16 * rng.random((100000, 3))) - 1) / 1024)
    nearest = np.array([np.sqrt(((candidates - d[i]) ** 2).sum(-1)).min() for i in unreachable])
    got = np.sqrt(((shown[unreachable] - d[unreachable]) ** 2).sum(-1))
    farther = (got - nearest) / BYTE
    print(f"{name}: {len(unreachable)} unreachable colours, shown {np.median(farther):.2f}/255 (median), at most "
          f"{farther.max():.2f}/255 farther than the nearest of the random sample")
    assert len(unreachable) > 10
    if name == "mixing":  # the solver's nearest, from the grey axis on, is not always the nearest of all
        assert np.median(farther) <= 0.5 and np.percentile(farther, 90) <= 1.0 and farther.max() <= 8.0
    else:
        assert farther.max() <= 1.0


def test_trilinear_slopes_are_the_derivatives():
    rng = np.random.default_rng(3)
    table = rng.random((5, 5, 5, 3))
    p = rng.uniform(0.05, 0.95, (50, 3))
    value, slopes = trilinear(table, p, jacobian=True)
    np.testing.assert_allclose(value, trilinear(table, p))
    h = 1e-6
    for axis in range(3):
        step = np.zeros(3)
        step[axis] = h
        numeric = (trilinear(table, p + step) - trilinear(table, p - step)) / (2 * h)
        np.testing.assert_allclose(slopes[:, :, axis], numeric, atol=1e-5)
    np.testing.assert_allclose(trilinear(table, even_grid(5)), table.reshape(-1, 3), atol=1e-12)  # on the nodes


def test_combined_pass_takes_the_inverse_with_and_without_a_transparent_film():
    shaper = shaper_of(tone(grey_inputs()))
    inverse = invert(shaper, tone(grid_inputs(shaper)))
    background = [1.0, 1.0, 1.0]
    rgba = np.array([[[200, 120, 40, 255], [230, 190, 150, 128]]], dtype=np.uint8)
    opaque = colors.combined_pass(rgba, background, False, inverse).reshape(-1, 4)
    np.testing.assert_allclose(opaque[:, :3], inverse(rgba[0, :, :3] / 255.0), rtol=1e-6)
    assert (opaque[:, 3] == 1.0).all()
    clear = colors.combined_pass(rgba, background, True, inverse).reshape(-1, 4)
    alpha = rgba[0, :, 3:] / 255.0
    straight = (rgba[0, :, :3] / 255.0 - (1 - alpha)) / alpha
    np.testing.assert_allclose(clear[:, :3], inverse(straight) * alpha, rtol=1e-5)
    np.testing.assert_allclose(clear[:, 3], alpha[:, 0], rtol=1e-6)


def test_the_inverse_is_a_plain_value_the_viewport_can_upload():
    shaper = shaper_of(standard_with_exposure(grey_inputs()))
    inverse = invert(shaper, standard_with_exposure(grid_inputs(shaper)))
    assert isinstance(inverse, Inverse)
    size, grid = view_transform.TABLE_SIZE, view_transform.GRID_SIZE
    assert inverse.table.shape == (size, size, size, 3) and inverse.table.dtype == np.float32
    assert inverse.shaper.shape == (view_transform.SHAPER_SIZE, 3) and inverse.shaper.dtype == np.float32
    assert inverse.forward.shape == (grid, grid, grid, 3)
    assert 0.0 <= inverse.table.min() and inverse.table.max() <= 1.0
