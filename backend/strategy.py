"""Densification strategies: how the set of Gaussians grows and shrinks during training.

A strategy sees each step's render output after the backward pass and may clone, split, prune or reset
Gaussians; `edit_rows` keeps the optimizer's per-row state consistent with every such change.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .distributed import SINGLE, Group
from .dynamic import DynamicGaussians, split_in_time
from .gaussians import Gaussians, logit
from .kernels import extension, handles
from .render.reference import quat_to_rotmat


def edit_rows(optimizer: torch.optim.Optimizer, g: Gaussians, keep: torch.Tensor | None = None,
              append: dict[str, torch.Tensor] | None = None,
              moments: dict[str, dict[str, torch.Tensor]] | None = None) -> None:
    """Keep the rows of every parameter selected by `keep` (bool mask), then append the rows in
    `append` (one tensor per parameter name). Adam moments follow the rows; appended rows start at zero, or
    at `moments[name][key]` where given (rows that move from another process)."""
    for group in optimizer.param_groups:
        name = group["name"]
        old = group["params"][0]
        state = optimizer.state.pop(old, {})

        def edit(t: torch.Tensor, new_rows: torch.Tensor) -> torch.Tensor:
            if keep is not None:
                t = t[keep]
            return torch.cat([t, new_rows]) if append is not None else t

        extra = append[name].to(old.dtype) if append is not None else None
        new = edit(old.detach(), extra).requires_grad_(True)
        for key in ("exp_avg", "exp_avg_sq"):
            if key in state:
                start = (None if extra is None else moments[name][key].to(extra) if moments
                         else torch.zeros_like(extra))
                state[key] = edit(state[key], start)
        if state:
            optimizer.state[new] = state
        group["params"][0] = new
        setattr(g, name, new)


@dataclass
class DensifyConfig:
    grad_threshold: float = 2e-4  # mean screen-space gradient (NDC units) that marks a Gaussian for growth
    start: int = 500  # densification at steps start < s < stop; opacity resets at multiples below stop
    stop: int = 15_000
    every: int = 100
    reset_opacity_every: int = 3000
    prune_opacity: float = 0.005
    percent_dense: float = 0.01  # clone below, split above this fraction of the scene extent
    prune_scale: float = 0.1  # prune Gaussians larger than this fraction of the extent (after a reset)
    split_scale_divisor: float = 1.6
    max_gaussians: int = 0  # 0: no cap


class DefaultStrategy:
    """Adaptive density control of the original 3DGS: clone, split, prune, reset opacity."""

    def __init__(self, config: DensifyConfig, extent: float):
        self.cfg, self.extent = config, extent
        self.grad_sum: torch.Tensor | None = None
        self.count: torch.Tensor | None = None

    def state_dict(self, group: Group = SINGLE) -> dict:
        """The statistics of all the group's views; from then on its leader holds the sums so far and the
        other processes start from zero, so that the next sum counts every view once."""
        self._gather(group)
        state = {"grad_sum": self.grad_sum, "count": self.count}
        if not group.leader:
            self.grad_sum, self.count = torch.zeros_like(self.grad_sum), torch.zeros_like(self.count)
        return state

    def load_state_dict(self, state: dict, device: torch.device, group: Group = SINGLE) -> None:
        """The statistics of a checkpoint (of any number of processes): the leader holds them, the others start
        from zero, as after state_dict."""
        def place(t):
            return None if t is None else t.to(device) if group.leader else torch.zeros_like(t, device=device)
        self.grad_sum, self.count = place(state["grad_sum"]), place(state["count"])

    def accumulate(self, step: int, means2d_grad: torch.Tensor | None, radii: torch.Tensor, width: int, height: int,
                   n: int) -> None:
        """After a view's backward pass: its screen-space gradients (dL/d(means2d), in pixels, and the radii
        that say which Gaussians it drew) join the statistics. `step` counts completed steps, this one included."""
        if step >= self.cfg.stop or means2d_grad is None:
            return
        if self.grad_sum is None or self.grad_sum.shape[0] != n:
            self.grad_sum = torch.zeros(n, device=means2d_grad.device)
            self.count = torch.zeros(n, device=means2d_grad.device)
        grad = means2d_grad.detach()
        if handles(grad):  # one kernel instead of eight launches per step
            extension().accumulate_grad_stats(grad.contiguous(), radii, width, height, self.grad_sum, self.count)
            return
        ndc_norm = torch.hypot(grad[:, 0] * (0.5 * width), grad[:, 1] * (0.5 * height))  # pixels -> NDC units
        visible = radii > 0
        self.grad_sum += torch.where(visible, ndc_norm, 0.0).to(self.grad_sum.dtype)
        self.count += visible.to(self.count.dtype)

    def refine(self, step: int, g: Gaussians, optimizer: torch.optim.Optimizer, generator: torch.Generator,
               group: Group = SINGLE) -> None:
        """After a step's gradients: densify and reset opacities when the schedule says so."""
        cfg = self.cfg
        if cfg.start < step < cfg.stop and step % cfg.every == 0:
            self._gather(group)
            self._densify(step, g, optimizer, generator)
        if cfg.reset_opacity_every and step < cfg.stop and step % cfg.reset_opacity_every == 0:
            self._reset_opacity(g, optimizer)

    def _gather(self, group: Group) -> None:
        """Every process's statistics become the sums over the group's processes."""
        if self.grad_sum is not None:
            group.sum_([self.grad_sum, self.count])

    def _densify(self, step: int, g: Gaussians, optimizer, generator) -> None:
        n = len(g)
        if self.grad_sum is None or self.grad_sum.shape[0] != n:
            return
        clone, split, prune = self._decide(step, *self._densify_inputs(g))
        self._apply(g, optimizer, clone, split, prune, lambda shape: torch.randn(shape, generator=generator))

    def _densify_inputs(self, g: Gaussians) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """What densification decides on, per Gaussian: the mean screen-space gradient, the largest scale and
        the peak opacity."""
        avg = self.grad_sum / self.count.clamp_min(1)
        max_scale = torch.exp(g.log_scales.detach()).amax(dim=-1)
        return avg, max_scale, g.peak_opacities()  # a 4D model's: at its best time, so windows count

    def _decide(self, step: int, avg, max_scale, peak) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Which Gaussians to clone, split and prune (bool masks) from _densify_inputs."""
        cfg = self.cfg
        n = len(avg)
        hot = avg > cfg.grad_threshold
        if cfg.max_gaussians:
            room = max(0, cfg.max_gaussians - n)
            if int(hot.sum()) > room:  # grow only the hottest that fit under the cap
                hottest = torch.topk(torch.where(hot, avg, -1.0), room).indices
                hot = torch.zeros_like(hot)
                hot[hottest] = True
        small = max_scale <= cfg.percent_dense * self.extent
        prune = peak < cfg.prune_opacity
        if step > cfg.reset_opacity_every:
            prune |= max_scale > cfg.prune_scale * self.extent
        return hot & small, hot & ~small, prune

    def _apply(self, g: Gaussians, optimizer, clone, split, prune, normal) -> None:
        """Clone, split (placing the children with `normal(shape)`'s standard normal samples) and prune; the
        statistics start again."""
        new_rows = {name: t.detach()[clone] for name, t in g.tensors().items()}
        split_rows = self._split_samples(g, split, normal)
        for name in new_rows:
            new_rows[name] = torch.cat([new_rows[name], split_rows[name]])
        edit_rows(optimizer, g, keep=~(prune | split), append=new_rows)
        self.grad_sum = torch.zeros(len(g), device=g.means.device)
        self.count = torch.zeros(len(g), device=g.means.device)

    def _split_samples(self, g: Gaussians, split: torch.Tensor, normal) -> dict[str, torch.Tensor]:
        """Two Gaussians per split one, placed by sampling it, with scales divided by 1.6; a 4D model's also
        in time (dynamic.split_in_time)."""
        rows = {name: t.detach()[split].repeat_interleave(2, dim=0) for name, t in g.tensors().items()}
        scales = torch.exp(rows["log_scales"])
        noise = normal(scales.shape).to(scales.device) * scales
        rows["means"] = rows["means"] + (quat_to_rotmat(rows["quats"]) @ noise[..., None])[..., 0]
        rows["log_scales"] = rows["log_scales"] - math.log(self.cfg.split_scale_divisor)
        if isinstance(g, DynamicGaussians):
            rows = split_in_time(rows, normal, self.cfg.split_scale_divisor)
        return rows

    def _reset_opacity(self, g: Gaussians, optimizer) -> None:
        ceiling = float(logit(2 * self.cfg.prune_opacity))
        for group in optimizer.param_groups:
            if group["name"] == "opacity_logits":
                p = group["params"][0]
                with torch.no_grad():
                    p.clamp_(max=ceiling)
                for v in optimizer.state.get(p, {}).values():
                    if torch.is_tensor(v) and v.shape == p.shape:
                        v.zero_()
