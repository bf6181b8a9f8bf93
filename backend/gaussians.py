"""The Gaussian model: parameter tensors, initialisation, and the parameter groups the optimizer sees."""
from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
import torch

from .sh import SH_C0


def sh_coeff_count(degree: int) -> int:
    return (degree + 1) ** 2


def rgb_to_sh_dc(rgb: torch.Tensor) -> torch.Tensor:
    return (rgb - 0.5) / SH_C0


def logit(p: torch.Tensor | float) -> torch.Tensor:
    p = torch.as_tensor(p)
    return torch.log(p / (1 - p))


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
        return torch.sigmoid(self.opacity_logits)

    @property
    def sh(self) -> torch.Tensor:
        return torch.cat([self.sh_dc, self.sh_rest], dim=1)

    def to(self, device=None, dtype=None) -> "Gaussians":
        return Gaussians(**{k: v.to(device=device, dtype=dtype) for k, v in self.tensors().items()})

    def detached(self) -> "Gaussians":
        return Gaussians(**{k: v.detach().clone() for k, v in self.tensors().items()})

    def requires_grad_(self) -> "Gaussians":
        for v in self.tensors().values():
            v.requires_grad_(True)
        return self

    @classmethod
    def from_points(cls, points: torch.Tensor, colors: torch.Tensor, sh_degree: int = 3,
                    opacity: float = 0.1) -> "Gaussians":
        """Isotropic Gaussians at `points` (N, 3) with `colors` (N, 3) in [0, 1]; scale from the
        mean distance to the three nearest neighbours, as the reference 3DGS does."""
        points = points.float()
        n, device = points.shape[0], points.device
        scale = _nearest_neighbour_distance(points).clamp_min(1e-7)
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
    def from_point_cloud(cls, xyz: np.ndarray, rgb: np.ndarray, sh_degree: int, device) -> "Gaussians":
        """From positions (N, 3) and uint8 colours (N, 3), built on `device`: the neighbour search is quadratic."""
        points = torch.from_numpy(np.asarray(xyz, dtype=np.float32)).to(device)
        colors = torch.from_numpy(np.asarray(rgb, dtype=np.uint8)).to(device).float() / 255.0
        return cls.from_points(points, colors, sh_degree)

    @classmethod
    def random_in_box(cls, n: int, center, half_extent: float, sh_degree: int = 3,
                      seed: int = 0) -> "Gaussians":
        gen = torch.Generator().manual_seed(seed)
        center = torch.as_tensor(np.asarray(center), dtype=torch.float32)
        points = center + half_extent * (2 * torch.rand(n, 3, generator=gen) - 1)
        colors = torch.rand(n, 3, generator=gen)
        return cls.from_points(points, colors, sh_degree)


def _nearest_neighbour_distance(points: torch.Tensor, k: int = 3, budget: int = 1 << 26) -> torch.Tensor:
    """Root of the mean squared distance to the k nearest other points, on the points' device, in chunks of
    rows whose distance matrix holds at most `budget` values."""
    n, device = points.shape[0], points.device
    if n <= 1:
        return torch.full((n,), 0.01, device=device)
    k = min(k, n - 1)
    chunk = max(1, budget // n)
    out = torch.empty(n, device=device)
    all_rows = torch.arange(min(chunk, n), device=device)
    for start in range(0, n, chunk):
        d = torch.cdist(points[start:start + chunk], points)
        rows = all_rows[:d.shape[0]]
        d[rows, rows + start] = float("inf")  # not its own neighbour
        out[start:start + chunk] = d.topk(k, largest=False).values.square().mean(dim=1).sqrt()
    return out
