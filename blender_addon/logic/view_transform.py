"""The inverse of a Blender view transform (bpy-free): the scene-linear colours that a scene's view transform
(with its look, exposure, gamma and curves) shows as given display values, so that Blender shows the
backend's display-referred frames as they are under any view settings.

The forward transform is known only through samples Blender makes of it (render/view_colors.py): first the grey
axis, then a grid of colours placed so that each channel's grey curve spaces them evenly on the display,
from its darkest grey to its brightest. On that grid a transform that works per channel (Standard with an
exposure) is linear, and Filmic (whose bright colours bleed into the other channels) and AgX are close to
it, so a small grid describes them well. The inverse is then
    display d -> grid coordinates s = table(d)    (a 3D table on an even grid of the grey range, trilinear)
             -> encoded input u_c = shaper_c(s_c) (per channel, linear on an even grid of s)
             -> scene-linear x_c = decode(u_c),
the same steps in numpy (F12) and in the viewport's shader (render/engine.py).

Inputs stay in [0, 64]: a colour the transform cannot produce from those (a very saturated one under AgX,
one brighter than its white after a negative exposure) is shown as the nearest one it can produce that the
solver finds from the grey axis on (the nearest of all but near the edges of what a transform that mixes
channels shows). The colours of splat renders come back within a byte under Filmic and AgX; colours at the
edge of what such a transform shows, where the inverse is steep and the grid's interpolation misses the
transform's bleeding and mixing of channels, a few bytes off.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Scene-linear inputs are sampled as x(u) = (2^(16 u) - 1) / 1024 for u in [0, 1]: 0 to 64, evenly in stops
# above 1/1024 and evenly in value below it.
ENCODING_STOPS = 16.0
ENCODING_OFFSET = 1024.0
GREY_SAMPLES = 1024  # of the grey axis, evenly in u
GRID_SIZE = 65  # forward samples per channel, evenly in each channel's grey display value
TABLE_SIZE = 33  # inverse table entries per channel, evenly in display value
SHAPER_SIZE = 4096  # entries of each channel's shaper, evenly in s
# The grid stops this far below a channel's brightest grey: a curve that nears its top slowly spends a wide range
# of inputs on that last bit, over which a colour's other channels change too much for a grid cell.
HEADROOM = 0.1 / 255.0
SOLVER_STEPS = 60
SOLVED_COST = (1e-3 / 255.0) ** 2  # the squared display error a solution may keep


def decode(u: np.ndarray) -> np.ndarray:
    """Encoded inputs u in [0, 1] to scene-linear values in [0, 64] (float32)."""
    return ((np.exp2(ENCODING_STOPS * np.asarray(u, np.float64)) - 1.0) / ENCODING_OFFSET).astype(np.float32)


def even_grid(n: int) -> np.ndarray:
    """(n ** 3, 3) points of an even grid of [0, 1]^3, red slowest, blue fastest."""
    v = np.linspace(0.0, 1.0, n)
    return np.stack(np.meshgrid(v, v, v, indexing="ij"), -1).reshape(-1, 3)


def grey_inputs() -> np.ndarray:
    """(GREY_SAMPLES, 3) scene-linear greys, evenly in u: what Blender shows first."""
    return np.repeat(decode(np.linspace(0.0, 1.0, GREY_SAMPLES))[:, None], 3, axis=1)


def shaper_of(grey_display: np.ndarray) -> np.ndarray:
    """(SHAPER_SIZE, 3) float32 from Blender's display values of grey_inputs(): for s evenly in [0, 1], the
    encoded grey input u that each channel shows as the display value s of the way from its darkest grey to
    its brightest (the smallest such u where a channel's curve is flat, clipped). So the grid spans just what
    each channel shows, and no cell of it holds a clipped part."""
    u = np.linspace(0.0, 1.0, GREY_SAMPLES)
    s = np.linspace(0.0, 1.0, SHAPER_SIZE)
    shaper = np.empty((SHAPER_SIZE, 3), np.float32)
    for c in range(3):
        curve = np.maximum.accumulate(np.asarray(grey_display, np.float64)[:, c])
        wanted = curve[0] + s * (curve[-1] - HEADROOM - curve[0])
        shaper[:, c] = np.interp(wanted, curve + u * 1e-9, u)  # strictly increasing: a flat part maps to its start
    return shaper


def shape(shaper: np.ndarray, s: np.ndarray) -> np.ndarray:
    """Grid coordinates s (P, 3) to scene-linear values (float32), through each channel's shaper."""
    p = np.clip(s, 0.0, 1.0) * (len(shaper) - 1)
    i = np.minimum(p.astype(np.int64), len(shaper) - 2)
    t = p - i
    channel = np.arange(3)
    return decode(shaper[i, channel] * (1.0 - t) + shaper[i + 1, channel] * t)


def grid_inputs(shaper: np.ndarray) -> np.ndarray:
    """(GRID_SIZE ** 3, 3) scene-linear colours whose display values Blender gives after the grey axis."""
    return shape(shaper, even_grid(GRID_SIZE))


def trilinear(table: np.ndarray, p: np.ndarray, jacobian: bool = False):
    """Values of table (n, n, n, k), a function on an even grid of [0, 1]^3 (axes red, green, blue), at
    points p (P, 3), by trilinear interpolation; with jacobian, also their derivatives (P, k, 3)."""
    n, k = table.shape[0], table.shape[-1]
    q = np.clip(p, 0.0, 1.0) * (n - 1)
    i = np.minimum(q.astype(np.int64), n - 2)
    t = [(q[:, axis] - i[:, axis])[:, None] for axis in range(3)]
    flat = table.reshape(-1, k)
    base = (i[:, 0] * n + i[:, 1]) * n + i[:, 2]

    def corner(r, g, b):
        return flat[base + (r * n + g) * n + b]
    # Along red, then green, then blue.
    low = {(g, b): corner(0, g, b) for g in (0, 1) for b in (0, 1)}
    d_r = {key: corner(1, *key) - v for key, v in low.items()}
    along_r = {key: low[key] + t[0] * d_r[key] for key in low}
    d_g = [along_r[1, b] - along_r[0, b] for b in (0, 1)]
    along_g = [along_r[0, b] + t[1] * d_g[b] for b in (0, 1)]
    value = along_g[0] + t[2] * (along_g[1] - along_g[0])
    if not jacobian:
        return value
    d_rg = [d_r[0, b] + t[1] * (d_r[1, b] - d_r[0, b]) for b in (0, 1)]
    slopes = [d_rg[0] + t[2] * (d_rg[1] - d_rg[0]), d_g[0] + t[2] * (d_g[1] - d_g[0]), along_g[1] - along_g[0]]
    return value, np.stack(slopes, -1) * (n - 1)


def grey_ends(forward: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The darkest and the brightest display value (3,) of each channel's grey curve, from the grid's samples
    (GRID_SIZE,) * 3 + (3,): the range the table spans."""
    return forward[0, 0, 0], forward[-1, -1, -1]


def table_coordinates(forward: np.ndarray, display: np.ndarray) -> np.ndarray:
    """Display values (P, 3) as coordinates in [0, 1] of the table, which spans each channel's grey range
    (beyond it a channel shows nothing, so it is clamped there)."""
    darkest, brightest = grey_ends(forward)
    return np.clip((display - darkest) / np.maximum(brightest - darkest, 1e-6), 0.0, 1.0)


@dataclass(frozen=True)
class Inverse:
    """The scene-linear colours a view transform shows as given display values (see the module's doc)."""
    table: np.ndarray  # (TABLE_SIZE,) * 3 + (3,) float32: grid coordinates s of each display value
    shaper: np.ndarray  # (SHAPER_SIZE, 3) float32: encoded input u of each s
    forward: np.ndarray  # (GRID_SIZE,) * 3 + (3,) float32: Blender's display values of the grid

    def grid_coordinates(self, display: np.ndarray) -> np.ndarray:
        return trilinear(self.table, table_coordinates(self.forward, display.reshape(-1, 3)))

    def __call__(self, display: np.ndarray) -> np.ndarray:
        """Display values (..., 3) in [0, 1] to scene-linear ones (float32)."""
        display = np.asarray(display, np.float32)
        return shape(self.shaper, self.grid_coordinates(display)).reshape(display.shape)

    def shown(self, display: np.ndarray) -> np.ndarray:
        """What Blender shows for the scene-linear colours of `display` (..., 3), as its samples tell: the
        display values themselves where the transform can produce them, the nearest it can where not."""
        display = np.asarray(display, np.float32)
        return trilinear(self.forward, self.grid_coordinates(display)).reshape(display.shape)


def invert(shaper: np.ndarray, grid_display: np.ndarray) -> Inverse:
    """The inverse of the view transform Blender sampled: `grid_display` (GRID_SIZE ** 3, 3) are its display
    values of grid_inputs(shaper), in that order.

    The table's display values span each channel's grey range evenly. Each is solved for on the trilinear
    interpolation of the samples by damped Gauss-Newton steps (Levenberg-Marquardt) kept inside the grid,
    from where the grey curves put it. A display value the transform cannot produce gets the grid
    coordinates whose display value is nearest to it (least squares) on the way from there."""
    forward = np.asarray(grid_display, np.float32).reshape((GRID_SIZE,) * 3 + (3,))
    s = even_grid(TABLE_SIZE)
    darkest, brightest = grey_ends(forward)
    target = darkest + s * (brightest - darkest)
    value, slopes = trilinear(forward, s, jacobian=True)
    residual = value - target
    cost = np.einsum("pi,pi->p", residual, residual)
    damping = np.full(len(s), 1e-3)
    active = np.flatnonzero(cost > SOLVED_COST)
    for _ in range(SOLVER_STEPS):
        if not len(active):
            break
        jt = np.swapaxes(slopes[active], 1, 2)
        normal = jt @ slopes[active] + damping[active, None, None] * np.eye(3)
        step = np.linalg.solve(normal, -(jt @ residual[active, :, None]))[:, :, 0]
        trial = np.clip(s[active] + step, 0.0, 1.0)
        trial_value, trial_slopes = trilinear(forward, trial, jacobian=True)
        trial_residual = trial_value - target[active]
        trial_cost = np.einsum("pi,pi->p", trial_residual, trial_residual)
        better = trial_cost < cost[active]
        kept = active[better]
        s[kept], slopes[kept], residual[kept], cost[kept] = (
            trial[better], trial_slopes[better], trial_residual[better], trial_cost[better])
        damping[active] = np.where(better, damping[active] / 3.0, damping[active] * 4.0)
        # Done: solved, or no step helps any more (the nearest colour it can show, or a flat part of it).
        active = active[(cost[active] > SOLVED_COST) & (damping[active] < 1e6)]
    table = s.reshape((TABLE_SIZE,) * 3 + (3,)).astype(np.float32)
    return Inverse(table, np.asarray(shaper, np.float32), forward)
