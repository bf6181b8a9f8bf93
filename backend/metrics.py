"""Image losses and metrics on (H, W, 3) tensors in [0, 1]. A target (gt) may also be a dataset's stored uint8
view (backend.data.images: v / 255)."""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from .data.images import as_float
from .kernels import extension, handles


def psnr(img: torch.Tensor, gt: torch.Tensor) -> float:
    mse = torch.mean((img.detach().float() - as_float(gt).float()) ** 2).clamp_min(1e-12)
    return float(-10.0 * torch.log10(mse))


@functools.lru_cache(maxsize=8)
def _window(size: int, sigma: float, device, dtype, channels: int) -> torch.Tensor:
    x = torch.arange(size, dtype=torch.float64) - (size - 1) / 2
    g = torch.exp(-x ** 2 / (2 * sigma ** 2))
    g = (g / g.sum()).to(device=device, dtype=dtype)
    return (g[:, None] * g[None, :]).expand(channels, 1, size, size).contiguous()


def ssim(img: torch.Tensor, gt: torch.Tensor, window: int = 11, sigma: float = 1.5) -> torch.Tensor:
    """Mean structural similarity with an 11x11 Gaussian window (sigma 1.5), as in 3DGS; differentiable.
    The five local statistics are blurred in one grouped convolution (fewer kernel launches per step)."""
    x = img.permute(2, 0, 1)
    y = as_float(gt).permute(2, 0, 1)
    stats = torch.cat([x, y, x * x, y * y, x * y])[None]  # (1, 15, H, W)
    blurred = F.conv2d(stats, _window(window, sigma, img.device, img.dtype, 15), padding=window // 2, groups=15)
    mu_x, mu_y, xx, yy, xy = blurred[0].split(3)
    mu_xy = mu_x * mu_y
    mu_xx, mu_yy = mu_x * mu_x, mu_y * mu_y
    c1, c2 = 0.01 ** 2, 0.03 ** 2
    s = ((2 * mu_xy + c1) * (2 * (xy - mu_xy) + c2)) / ((mu_xx + mu_yy + c1) * (xx - mu_xx + yy - mu_yy + c2))
    return s.mean()


def photometric_loss(img: torch.Tensor, gt: torch.Tensor, ssim_weight: float = 0.2) -> torch.Tensor:
    """(1 - w) L1 + w (1 - SSIM), the 3DGS training loss; differentiable w.r.t. img. On CUDA (float32) it runs
    as five fused kernels (cuda/training.cu) instead of some sixty torch launches, reading a uint8 target as it
    is; elsewhere in torch, on the target as float (as_float)."""
    if handles(img) and img.dtype == torch.float32:
        gt = gt if gt.dtype == torch.uint8 else gt.float()
        return _FusedPhotometricLoss.apply(img.contiguous(), gt.contiguous(), float(ssim_weight))
    return torch_photometric_loss(img, gt, ssim_weight)


def torch_photometric_loss(img: torch.Tensor, gt: torch.Tensor, ssim_weight: float = 0.2) -> torch.Tensor:
    """The loss in plain torch: the CPU path and the fused kernels' reference."""
    gt = as_float(gt)
    return (1 - ssim_weight) * (img - gt).abs().mean() + ssim_weight * (1 - ssim(img, gt))


class _FusedPhotometricLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, img, gt, ssim_weight):
        loss, partials = extension().loss_forward(img, gt, ssim_weight)
        ctx.save_for_backward(img, gt, partials)
        ctx.ssim_weight = ssim_weight
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        img, gt, partials = ctx.saved_tensors
        grad_img = extension().loss_backward(img, gt, partials, ctx.ssim_weight, grad_loss.float().contiguous())
        return grad_img, None, None
