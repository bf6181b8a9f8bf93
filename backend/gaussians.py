"""The Gaussian model: parameter tensors, initialisation, and the parameter groups the optimizer sees."""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Callable

import numpy as np
import torch

from .sh import SH_C0


Cancelled = Callable[[], bool]  # asked by long set-ups; True stops them with InterruptedError


def sh_coeff_count(degree: int) -> int:
    return (degree + 1) ** 2


def rgb_to_sh_dc(rgb: torch.Tensor) -> torch.Tensor:
    return (rgb - 0.5) / SH_C0


def logit(p: torch.Tensor | float) -> torch.Tensor:
    p = torch.as_tensor(p)
    return torch.log(p / (1 - p))


def sigmoid(x: torch.Tensor) -> torch.Tensor:
    """torch.sigmoid on the GPU; on the CPU 1 / (1 + e^-x), whose value for an element does not depend on where it
    sits in the tensor (torch's CPU sigmoid rounds a vector's tail elements otherwise), so that a share of the rows
    gets what the whole model gets for them (backend/partition.py)."""
    return torch.sigmoid(x) if x.is_cuda else 1 / (1 + torch.exp(-x))


@dataclass
class Gaussians:
    """Trainable parameters; every field is one optimizer group (same name) with N rows."""

    means: torch.Tensor  # (N, 3) world positions
    log_scales: torch.Tensor  # (N, 3)
    quats: torch.Tensor  # (N, 4) rotation (w, x, y, z), normalised when used
    opacity_logits: torch.Tensor  # (N,)
    sh_dc: torch.Tensor  # (N, 1, 3) degree-0 SH coefficient per colour channel
    sh_rest: torch.Tensor  # (N, (D+1)^2 - 1, 3) higher-degree coefficients, D = max SH degree

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    def tensors(self) -> dict[str, torch.Tensor]:
        return {name: getattr(self, name) for name in self.names()}

    def __len__(self) -> int:
        return self.means.shape[0]

    @property
    def max_sh_degree(self) -> int:
        return int(round((self.sh_rest.shape[1] + 1) ** 0.5)) - 1

    @property
    def opacities(self) -> torch.Tensor:
        return sigmoid(self.opacity_logits)

    @property
    def sh(self) -> torch.Tensor:
        return torch.cat([self.sh_dc, self.sh_rest], dim=1)

    def to(self, device=None, dtype=None) -> "Gaussians":
        return type(self)(**{k: v.to(device=device, dtype=dtype) for k, v in self.tensors().items()})

    def detached(self) -> "Gaussians":
        return type(self)(**{k: v.detach().clone() for k, v in self.tensors().items()})

    def at(self, time: float) -> "Gaussians":
        """The Gaussians at `time` (normalised to [0, 1]): a static model is the same at every time
        (backend.dynamic's model moves)."""
        return self

    def peak_opacities(self) -> torch.Tensor:
        """Each Gaussian's highest opacity over the captured times (a static one's is its opacity)."""
        return self.opacities.detach()

    def requires_grad_(self) -> "Gaussians":
        for v in self.tensors().values():
            v.requires_grad_(True)
        return self

    @classmethod
    def from_points(cls, points: torch.Tensor, colors: torch.Tensor, sh_degree: int,
                    opacity: float = 0.1, cancelled: "Cancelled | None" = None) -> "Gaussians":
        """Isotropic Gaussians at `points` (N, 3) with `colors` (N, 3) in [0, 1]; scale from the
        mean distance to the three nearest neighbours, as the reference 3DGS does. `cancelled()`: see
        _nearest_neighbour_distance."""
        points = points.float()
        n, device = points.shape[0], points.device
        scale = _nearest_neighbour_distance(points, cancelled=cancelled).clamp_min(1e-7)
        quats = torch.zeros(n, 4, device=device)
        quats[:, 0] = 1.0
        return cls(
            means=points.clone(),
            log_scales=torch.log(scale)[:, None].repeat(1, 3),
            quats=quats,
            opacity_logits=torch.full((n,), float(logit(opacity)), device=device),
            sh_dc=rgb_to_sh_dc(colors.float())[:, None, :],
            sh_rest=torch.zeros(n, sh_coeff_count(sh_degree) - 1, 3, device=device),
        )

    @classmethod
    def from_point_cloud(cls, xyz: np.ndarray, rgb: np.ndarray, sh_degree: int, device,
                         cancelled: "Cancelled | None" = None) -> "Gaussians":
        """From positions (N, 3) and uint8 colours (N, 3), built on `device` (where the neighbour search runs)."""
        points = torch.from_numpy(np.asarray(xyz, dtype=np.float32)).to(device)
        colors = torch.from_numpy(np.asarray(rgb, dtype=np.uint8)).to(device).float() / 255.0
        return cls.from_points(points, colors, sh_degree, cancelled=cancelled)

    @classmethod
    def random_in_box(cls, n: int, center, half_extent: float, sh_degree: int, seed: int,
                      color=None) -> "Gaussians":
        """n Gaussians at uniform random positions in the cube; each of `color` ((r, g, b) in [0, 1]), or
        of a random colour where it is None."""
        gen = torch.Generator().manual_seed(seed)
        center = torch.as_tensor(np.asarray(center), dtype=torch.float32)
        points = center + half_extent * (2 * torch.rand(n, 3, generator=gen) - 1)
        colors = torch.rand(n, 3, generator=gen)
        if color is not None:
            colors[:] = torch.as_tensor(color, dtype=torch.float32)
        return cls.from_points(points, colors, sh_degree)


# The far field's sphere lies this many times as far from the points' centre as the farthest camera, or the
# bulk of the points where they reach farther.
FAR_FIELD_RADIUS = 2.0
FAR_FIELD_BULK = 95  # the percentile of the points' distances from their centre that is their bulk's reach


def far_field(cameras, images, xyz: np.ndarray, count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """`count` points for what lies beyond a capture's sparse points (a far background the structure from motion
    left without points, as trainers of unbounded scenes start one): where rays through random pixels of random
    views (`cameras` with their uint8 (H, W, 3) `images`) leave a sphere around the points' median, of
    FAR_FIELD_RADIUS times the reach of the cameras or the points' bulk, each in its pixel's colour. A few
    points far from the rest move neither the centre nor the radius. (positions (count, 3), uint8 colours)."""
    rng = np.random.default_rng(seed)
    xyz = np.asarray(xyz, dtype=np.float64)
    centre = np.median(xyz, axis=0)
    positions = np.stack([cam.position for cam in cameras])
    reach = max(float(np.linalg.norm(positions - centre, axis=1).max()),
                float(np.percentile(np.linalg.norm(xyz - centre, axis=1), FAR_FIELD_BULK)))
    radius = FAR_FIELD_RADIUS * reach
    views = rng.integers(0, len(cameras), count)
    out_xyz, out_rgb = np.empty((count, 3), np.float32), np.empty((count, 3), np.uint8)
    for i in np.unique(views):
        rows = np.flatnonzero(views == i)
        cam, image = cameras[i], images[i]
        x, y = rng.random(len(rows)) * cam.width, rng.random(len(rows)) * cam.height  # pixel i spans [i, i + 1)
        rays = np.linalg.solve(cam.K, np.stack([x, y, np.ones_like(x)]))  # camera space, z = 1
        d = (cam.c2w[:3, :3] @ rays).T
        d /= np.linalg.norm(d, axis=1, keepdims=True)
        o = cam.position - centre  # inside the sphere: each ray leaves it once, at t > 0
        b = d @ o
        t = -b + np.sqrt(b * b - (o @ o - radius * radius))
        out_xyz[rows] = centre + o + t[:, None] * d
        out_rgb[rows] = torch.as_tensor(image)[torch.from_numpy(y.astype(np.int64)),
                                               torch.from_numpy(x.astype(np.int64))].cpu().numpy()
    return out_xyz, out_rgb


def with_far_field(xyz: np.ndarray, rgb: np.ndarray, cameras, images, count: int,
                   seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The points (positions, uint8 colours) with `count` far-field points after them (far_field)."""
    if not count:
        return xyz, rgb
    far_xyz, far_rgb = far_field(cameras, images, xyz, count, seed)
    return np.concatenate([np.asarray(xyz, np.float32), far_xyz]), np.concatenate([np.asarray(rgb, np.uint8), far_rgb])


def quat_multiply(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Hamilton product a b of quaternions (..., 4) in (w, x, y, z) order: b's rotation, then a's."""
    aw, av = a[..., :1], a[..., 1:]
    bw, bv = b[..., :1], b[..., 1:]
    w = aw * bw - (av * bv).sum(dim=-1, keepdim=True)
    return torch.cat([w, aw * bv + bw * av + torch.linalg.cross(av, bv, dim=-1)], dim=-1)


def _nearest_neighbour_distance(points: torch.Tensor, k: int = 3, cancelled: Cancelled | None = None,
                                budget: int = 1 << 22) -> torch.Tensor:
    """Root of the mean squared distance to the k nearest other points (to all of them where there are at most
    k; 0.01 for a point alone), exact, in O(n log n) for point clouds of bounded density, on the points' device.

    The points are binned in a grid; a point's candidates are the points of the 3x3x3 cells around its own,
    and its k nearest among them are the true ones when the k-th is nearer than the block's faces. Points
    for which that fails (too few candidates, or a nearer one could lie outside) are searched again with
    cells twice the size, until none are left. The first cells are about as wide as a sample of the points
    has its k-th neighbour. Candidates are compared in batches of about `budget` pairs; `cancelled()` is
    asked between batches and raises InterruptedError once it says so."""
    n, device = points.shape[0], points.device
    if n <= 1:
        return torch.full((n,), 0.01, device=device)
    k = min(k, n - 1)
    points = points.float()
    lo = points.min(dim=0).values
    extent = float((points.max(dim=0).values - lo).max())
    if extent == 0.0:  # every point in one place
        return torch.zeros(n, device=device)
    # Cells holding about two points each where there are points: the volume's cell, shrunk by the occupancy
    # seen there as for points on surfaces (the usual case; points filling a volume need one more round).
    cell = extent / n ** (1 / 3)
    coarse = ((points - lo) / cell).floor().long()  # at most n ** (1 / 3) + 1 cells a side
    occupied = len(torch.unique((coarse[:, 0] << 42) + (coarse[:, 1] << 21) + coarse[:, 2]))
    cell *= min(1.0, (2.0 * occupied / n) ** 0.5)
    result = torch.empty(n, device=device)
    pending = torch.arange(n, device=device)
    while pending.numel():
        found, done = _search_grid(points, pending, lo, cell, k, budget, cancelled)
        result[pending[done]] = found[done].mean(dim=1).sqrt()
        pending = pending[~done]
        cell *= 2.0
    return result


_ROWS = torch.tensor([(x, y) for x in (-1, 0, 1) for y in (-1, 0, 1)])  # with z -1..1: the 27 cells around


def _search_grid(points: torch.Tensor, queries: torch.Tensor, lo: torch.Tensor, cell: float, k: int,
                 budget: int, cancelled: Cancelled | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(the k smallest squared distances from each query to the other points of the 27 cells around its own,
    sorted along queries' cells; whether those are its true k nearest) with cells of side `cell`."""
    device = points.device
    coords = ((points - lo) / cell).floor().long() + 1  # from 1: the cells around have coordinates >= 0
    dims = coords.max(dim=0).values + 2
    best = torch.full((len(queries), k), float("inf"), device=device)
    if float(dims.double().prod()) >= 2**62:  # too fine to number in int64: search coarser cells
        return best, torch.zeros(len(queries), dtype=torch.bool, device=device)
    keys = (coords[:, 0] * dims[1] + coords[:, 1]) * dims[2] + coords[:, 2]
    sorted_keys, order = keys.sort()
    sorted_points = torch.cat([points[order], torch.full((1, 3), float("inf"), device=device)])
    position_of = torch.empty_like(order)
    position_of[order] = torch.arange(len(order), device=device)
    query_keys, by_cell = keys[queries].sort()
    queries = queries[by_cell]  # in cell order; the results follow that order until the end
    query_positions = position_of[queries]
    cells, per_cell = torch.unique_consecutive(query_keys, return_counts=True)
    # The three cells at z-1..z+1 of a column are consecutive keys: one range of `order` per column, 9 columns.
    column = (_ROWS.to(device)[:, 0] * dims[1] + _ROWS.to(device)[:, 1]) * dims[2]
    start = torch.searchsorted(sorted_keys, cells[:, None] + column[None] - 1)
    count = torch.searchsorted(sorted_keys, cells[:, None] + column[None] + 2) - start
    candidates_of_cell = count.sum(dim=1)  # each query itself included
    first_query = per_cell.cumsum(0) - per_cell
    pairs = (per_cell * candidates_of_cell).cumsum(0)
    bounds = torch.searchsorted(pairs, torch.arange(budget, int(pairs[-1]) + budget, budget, device=device),
                                right=True).clamp_max(len(cells)).tolist()
    begin = 0
    for end in bounds:
        end = max(end, begin + 1)
        if begin >= len(cells):
            break
        if cancelled is not None and cancelled():
            raise InterruptedError("the neighbour search was cancelled")
        rows = slice(int(first_query[begin]), int(first_query[end - 1] + per_cell[end - 1]))
        best[rows] = _k_smallest(sorted_points, query_positions[rows], start[begin:end], count[begin:end],
                                 per_cell[begin:end], k)
        begin = end
    candidates = torch.repeat_interleave(candidates_of_cell, per_cell)
    # Nothing outside the block is nearer than the gap from the query to the block's nearest face.
    inside = (points[queries] - lo) / cell - (coords[queries] - 1)
    reach = cell * (1.0 + torch.minimum(inside, 1.0 - inside).min(dim=1).values)
    whole = bool((dims <= 4).all())  # at most 2 cells a side: every block holds every point
    done = (candidates > k) & ((best[:, k - 1] <= reach.square()) | whole)
    unsorted = torch.empty_like(by_cell)
    unsorted[by_cell] = torch.arange(len(by_cell), device=device)
    return best[unsorted], done[unsorted]


def _k_smallest(sorted_points, query_positions, start, count, per_cell, k: int) -> torch.Tensor:
    """The k smallest squared distances from each query (at query_positions of sorted_points, grouped by
    cell, per_cell of each) to the points sorted_points[start:start + count] of its cell's ranges, itself
    excluded (infinity where there are fewer). The last row of sorted_points lies at infinity."""
    device = sorted_points.device
    flat_count = count.reshape(-1)
    total = int(flat_count.sum())
    of_cell = count.sum(dim=1)
    ranges = torch.repeat_interleave(torch.arange(len(flat_count), device=device), flat_count, output_size=total)
    position = torch.arange(total, device=device)
    cell = ranges // count.shape[1]
    # At least k columns: a lone point's cell may hold fewer candidates than k (-1: at infinity).
    table = torch.full((len(count), max(int(of_cell.max()), k)), -1, dtype=torch.long, device=device)
    table[cell, position - (of_cell.cumsum(0) - of_cell)[cell]] = (
        start.reshape(-1)[ranges] + position - (flat_count.cumsum(0) - flat_count)[ranges])
    candidate = table[torch.repeat_interleave(torch.arange(len(count), device=device), per_cell)]
    d2 = (sorted_points[candidate] - sorted_points[query_positions][:, None, :]).square().sum(dim=2)
    d2[candidate == query_positions[:, None]] = float("inf")
    return d2.topk(k, dim=1, largest=False).values
