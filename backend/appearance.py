"""Per-photo appearance: a colour transform of each training view, trained with the model, for photos whose
exposure and white balance vary from one to the next (a flash, auto exposure). The model renders the scene;
the transform maps a render to the colours of one photo, so the model need not bend its colours to each photo.

The transform is affine per colour channel, a gain and an offset (out_c = (1 + gain_c) in_c + offset_c),
starting at identity and held near it by an L2 penalty on (gain, offset). It belongs to the training views only:
novel views and the saved model have none (the PLY is the model alone); checkpoints keep it, so a resumed run
goes on exactly. A held-out photo has no trained transform: fitted_psnr scores a render as the field does for
such models, fitting the transform on the photo's left half and scoring its right half.
"""
from __future__ import annotations

import torch

from .data.images import as_float
from .metrics import psnr
from .optim import Adam

# The penalty on each drawn view's (gain, offset), added to its loss: weak, it only settles what the model's colours
# and the transforms could trade between them (all photos brighter and the model darker).
REGULARISATION = 1e-2


class Appearance:
    """The colour transforms of a dataset's training views: `params` (views, 2, 3), each view's gains and offsets
    (zero: identity), with their own Adam."""

    def __init__(self, views: int, lr: float, device: str | torch.device = "cpu"):
        self.params = torch.zeros(views, 2, 3, device=device, requires_grad=True)
        self.optimizer = Adam([{"params": [self.params], "lr": lr, "name": "appearance"}])

    def apply(self, image: torch.Tensor, view: int) -> torch.Tensor:
        """View `view`'s transform of an (H, W, 3) render."""
        return transform(image, self.params[view])

    def penalty(self, view: int) -> torch.Tensor:
        return REGULARISATION * self.params[view].square().sum()

    def gradient(self) -> torch.Tensor:
        """The step's gradient of every view's transform (zeros where no view was drawn), which a group sums."""
        if self.params.grad is None:
            self.params.grad = torch.zeros_like(self.params)
        return self.params.grad

    def step(self) -> None:
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def add_view(self) -> None:
        """One more view, at identity: the tensor and its Adam moments grow by a row of zeros."""
        old = self.params
        self.params = torch.cat([old.detach(), old.new_zeros(1, 2, 3)]).requires_grad_()
        state = self.optimizer.state.pop(old, {})
        self.optimizer.param_groups[0]["params"] = [self.params]
        if state:
            self.optimizer.state[self.params] = {
                "step": state["step"], **{k: torch.cat([state[k], state[k].new_zeros(1, 2, 3)])
                                          for k in ("exp_avg", "exp_avg_sq")}}

    def state_dict(self) -> dict:
        return {"params": self.params.detach().cpu(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """A state_dict's transforms, and identity for the views added since (a session's)."""
        views = len(self.params)
        self.params = state["params"].to(self.params.device, copy=True).requires_grad_()
        self.optimizer.param_groups[0]["params"] = [self.params]
        self.optimizer.load_state_dict(state["optimizer"])
        for _ in range(views - len(self.params)):
            self.add_view()


def transform(image: torch.Tensor, params: torch.Tensor) -> torch.Tensor:
    """(1 + gain) image + offset, per channel; params (2, 3): gains, offsets."""
    return image * (1 + params[0]) + params[1]


def fit(image: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The transform's params (2, 3) that map `image`'s pixels closest to `target`'s, by least squares per channel."""
    x, y = image.reshape(-1, 3).double(), target.reshape(-1, 3).double()
    mean_x, mean_y = x.mean(0), y.mean(0)
    dx, dy = x - mean_x, y - mean_y
    gain = (dx * dy).sum(0) / (dx * dx).sum(0).clamp_min(1e-12)
    offset = mean_y - gain * mean_x
    return torch.stack([gain - 1, offset]).to(image.dtype)


def fitted_psnr(image: torch.Tensor, target: torch.Tensor) -> float:
    """PSNR of a render of a held-out photo on the photo's right half, after the colour transform fitted on its left
    half (fit) is applied: what the model shows of the photo beyond its exposure."""
    target = as_float(target.to(image.device))
    half = image.shape[1] // 2
    params = fit(image[:, :half], target[:, :half])
    return psnr(transform(image[:, half:], params).clamp(0, 1), target[:, half:])
