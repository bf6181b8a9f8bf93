"""CUDA rasterizer: the kernels in cuda/ behind the reference rasterizer's interface, in both image formations.

rasterize (the standard formation) runs the extension's autograd Functions (cuda/bindings.cpp: the projection,
then the rasterization), so the output's means2d receives dL/d(means2d) in .grad, which densification reads; the
depth image carries no gradient. The projection also counts the tiles each footprint meets and starts the
binning's entry count on its way to the host (the extension's TileCounts), which the rasterization's binning
waits for. rasterize_blender (Blender's formation) runs the extension's three Functions of that formation: the
ray projection, the rasterization over black, and the film (the splats over the background in linear light,
through the film filter, into display values). gradient_step runs the same kernels without autograd, in either.
"""
from __future__ import annotations

import functools
import math
from typing import NamedTuple

import torch

from blender_addon.core.errors import SplatwrightError
from ..gaussians import Gaussians
from ..kernels import extension
from .formation import BLENDER, STANDARD
from .reference import RasterOutput


class TileBins(NamedTuple):
    """The extension's bin_tiles outputs, in its order (which rasterize_projected saves them in); int32 but
    entry_ends. The forward reads the first four, the backward all six."""
    ranges: torch.Tensor  # (n_tiles, 2) [start, end) of each tile's entries in gauss_ids
    gauss_ids: torch.Tensor  # (n_entries,) Gaussian of each entry, sorted by (tile, depth)
    batch_offsets: torch.Tensor  # (n_tiles + 1,) each tile's first batch of BLOCK_SIZE entries; last: the count
    batch_tiles: torch.Tensor  # (max_tile_batches,) the tile of each batch
    positions: torch.Tensor  # (n_entries,) each sorted entry's position in emit order
    entry_ends: torch.Tensor  # (N,) int64, Gaussian i's entries end there in emit order


def bin_tiles(means2d, conics, opacities, radii, depths, tile_counts, width: int, height: int) -> TileBins:
    """Sorted (tile, Gaussian) entries of projected Gaussians (the tiles their footprints meet), and the tiles'
    batches; `tile_counts`: the extension's TileCounts that project_forward returned with them."""
    return TileBins(*extension().bin_tiles(means2d, conics, opacities, radii, depths, tile_counts, width, height))


def project_and_bin(means, quats, scales, opacities, sh, viewmat, K, width: int, height: int,
                    sh_degree: int) -> TileBins:
    """The tile bins a render of these Gaussians composites, without autograd; contiguous float32 CUDA tensors,
    opacities (N,) and the SH coefficients whole (N, K, 3)."""
    means2d, conics, depths, radii, _, tile_counts = extension().project_forward(
        means, quats, scales, opacities, sh, no_tail(sh), viewmat, K, width, height, sh_degree)
    return bin_tiles(means2d, conics, opacities, radii, depths, tile_counts, width, height)


def no_tail(sh: torch.Tensor) -> torch.Tensor:
    """The empty second part of SH coefficients that come whole: the projection kernels take each Gaussian's
    coefficients in two parts (a model's sh_dc and sh_rest, read where they are, in gradient_step)."""
    return sh.new_empty((sh.shape[0], 0, 3))


# A training run asks for the same constants every step (the loss's unit gradient, the zero alpha gradient of
# its view's size), so none is made or filled a step. Only the kernels read them, and nothing writes them.
@functools.lru_cache(maxsize=4)
def constant(shape: tuple, value: float, device: torch.device) -> torch.Tensor:
    """A float32 tensor filled with `value`, shared."""
    return torch.full(shape, value, device=device)


_zero_buffers: dict[torch.device, torch.Tensor] = {}


def zeros(shape: tuple, device: torch.device) -> torch.Tensor:
    """A float32 zero tensor of `shape`, shared: a view of one buffer per device that grows to the largest shape
    asked, so views of many sizes take no more memory than the largest, nor a new tensor a step."""
    count = math.prod(shape)
    buffer = _zero_buffers.get(device)
    if buffer is None or buffer.numel() < count:
        buffer = _zero_buffers[device] = torch.zeros(count, device=device)
    return buffer[:count].view(shape)


def kernel_inputs(means, quats, scales, opacities, sh, viewmat, K) -> list[torch.Tensor]:
    """A model and a camera as the extension takes them: float32, contiguous, on the means' CUDA device (the
    camera detached). Raises SplatwrightError for means elsewhere or in another precision."""
    if means.device.type != "cuda":
        raise SplatwrightError(f"the CUDA rasterizer needs its inputs on a CUDA device, got {means.device}")
    if means.dtype != torch.float32:
        raise SplatwrightError(f"the CUDA rasterizer works in float32, got {means.dtype}")
    tensors = [torch.as_tensor(t, dtype=torch.float32, device=means.device).contiguous()
               for t in (means, quats, scales, opacities, sh, viewmat, K)]
    return tensors[:5] + [t.detach() for t in tensors[5:]]


def rasterize(means, quats, scales, opacities, sh, viewmat, K, width: int, height: int,
              sh_degree: int, background) -> RasterOutput:
    """Same contract as reference.rasterize, on float32 CUDA tensors. Gradients flow to means, quats, scales,
    opacities and sh; the output's means2d gets dL/d(means2d) in .grad after backward."""
    inputs = kernel_inputs(means, quats, scales, opacities, sh, viewmat, K)
    return RasterOutput(*extension().rasterize(*inputs, background_tensor(background, inputs[0].device), int(width),
                                               int(height), int(sh_degree)))


def rasterize_blender(means, quats, scales, opacities, sh, viewmat, K, width: int, height: int,
                      sh_degree: int, background) -> RasterOutput:
    """reference.rasterize's contract in Blender's image formation, on float32 CUDA tensors."""
    inputs = kernel_inputs(means, quats, scales, opacities, sh, viewmat, K)
    return RasterOutput(*extension().rasterize_blender(*inputs, background_tensor(background, inputs[0].device),
                                                       int(width), int(height), int(sh_degree)))


def background_tensor(background, device: torch.device) -> torch.Tensor:
    """A background colour (3 values, or one for all) as the kernels take it: float32 (3,) on `device`."""
    return torch.broadcast_to(torch.as_tensor(background, dtype=torch.float32, device=device),
                              (3,)).detach().contiguous()


class ViewGradients(NamedTuple):
    """What a training step needs from one view's gradient_step besides the parameters' gradients."""
    loss: torch.Tensor  # 0-dim
    image: torch.Tensor  # (H, W, 3), as rendered
    means2d_grad: torch.Tensor  # (N, 2) dL/d(means2d), in pixels
    radii: torch.Tensor  # (N,) int32, 0 where not drawn


def gradient_step(g: Gaussians, viewmat, K, width: int, height: int, sh_degree: int, background, target,
                  ssim_weight: float, formation: str = STANDARD) -> ViewGradients:
    """One view's photometric loss (metrics.photometric_loss) of a static model drawn in `formation` and its
    gradients, added to each parameter's .grad, without autograd, in one call of the extension (its gradient_step or
    gradient_step_blender: the same kernels in the same order as loss.backward() through rasterize or
    rasterize_blender, so the gradients are bit-equal to autograd's, tests/test_cuda_training.py, for less host time
    a step, which is what bounds a step on a fast GPU); the kernels read sh_dc and sh_rest where they are and write
    their gradients apart. `target`: the view as the loss takes it (uint8 or float32, (H, W, 3))."""
    device = g.means.device
    step = extension().gradient_step_blender if formation == BLENDER else extension().gradient_step
    return ViewGradients(*step(
        g.means, g.quats, g.log_scales, g.opacity_logits, g.sh_dc, g.sh_rest, viewmat, K, width, height, sh_degree,
        background, target, ssim_weight, constant((), 1.0, device), zeros((height, width), device)))
