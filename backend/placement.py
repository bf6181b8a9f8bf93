"""A model's Gaussians as a request chooses and places them (protocol.MODEL_CHOICE, protocol.placement_scale): a
4D model's at a time, those inside a crop box, and the model moved by a placement: a rotation, a translation and
one scale, or for a static model any invertible affine map (protocol.affine_placement), such as the world matrix of
a moved, unevenly scaled, sheared and parented Blender object.

The one convention of a placement A (linear part) and t: a mean m goes to A m + t; a covariance Sigma = R S^2 R^T
to A Sigma A^T, decomposed back into a rotation and scales by its eigendecomposition (the singular vectors and
values of its factor A R S, which are Sigma''s eigenvectors and the roots of its eigenvalues, found without
squaring); view-dependent colours turn by the rotation of A's polar decomposition A = Q P (a mirror, det Q < 0,
turns them by -Q and flips the odd bands' signs, which is exact). Colours are exact where P is one scale for all
axes; under an uneven scale or a shear no rotation of the coefficients is, and placement_notes says so."""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import torch

from blender_addon.core.errors import SplatwrightError
from blender_addon.core.protocol import SCALE_TOLERANCE, affine_placement, placement_scale
from . import dynamic  # the module, not its class: dynamic imports formats, whose glTF reader places splats
from .gaussians import Gaussians, quat_multiply
from .render.reference import quat_to_rotmat
from .sh import rotate_sh


def chosen(g: Gaussians, crop: np.ndarray | None, time: float | None) -> Gaussians:
    """The Gaussians a request chose of model `g` (protocol.MODEL_CHOICE): a 4D model's at `time`, cropped."""
    return cropped(g.at(0.0 if time is None else time), crop)


def cropped(g: Gaussians, crop: np.ndarray | None) -> Gaussians:
    """The Gaussians whose centres `crop` (model space into a box's unit cube) takes into [-1, 1]^3."""
    return g if crop is None else subset(g, inside(g.means, crop))


def kept(g: Gaussians, crop: np.ndarray | None, time: float | None) -> Gaussians:
    """The Gaussians of model `g` (a 4D model's with their motion) whose centres at `time` (None: 0) `crop`
    takes into [-1, 1]^3."""
    return g if crop is None else subset(g, inside(g.at(0.0 if time is None else time).means, crop))


def inside(means: torch.Tensor, crop: np.ndarray) -> torch.Tensor:
    m = torch.as_tensor(crop, dtype=means.dtype, device=means.device)
    return ((means @ m[:3, :3].T + m[:3, 3]).abs() <= 1.0).all(dim=-1)


def subset(g: Gaussians, mask: torch.Tensor) -> Gaussians:
    return type(g)(**{name: value[mask] for name, value in g.tensors().items()})


def placed(g: Gaussians, placement: np.ndarray | None) -> Gaussians:
    """The Gaussians moved by `placement` (the module's convention): a rotation, a translation and one scale
    move their means, rotations, scales and view-dependent colours, and a 4D model's motion with them (so the
    placed model at any time is the model at that time, placed); any other invertible affine map places a static
    model (affine_placed)."""
    if placement is None:
        return g
    try:
        scale = placement_scale(placement)
    except ValueError:
        if isinstance(g, dynamic.DynamicGaussians):
            raise SplatwrightError("a 4D model is placed only by a rotation, a translation and one scale for all "
                                   "axes: its motion has no uneven scale, shear or mirror") from None
        return affine_placed(g, placement)
    m = torch.as_tensor(placement, dtype=g.means.dtype, device=g.means.device)
    rotation = placement[:3, :3] / scale
    turn = torch.as_tensor(matrix_to_quat(rotation), dtype=g.quats.dtype, device=g.quats.device)
    moved = replace(g, means=g.means @ m[:3, :3].T + m[:3, 3], log_scales=g.log_scales + math.log(scale),
                    quats=quat_multiply(turn.expand_as(g.quats), g.quats),
                    sh_rest=rotate_sh(g.sh_rest, torch.as_tensor(rotation)))
    if isinstance(g, dynamic.DynamicGaussians):  # velocities and accelerations scale and turn, angular velocities turn
        turned = torch.as_tensor(rotation, dtype=g.means.dtype, device=g.means.device)
        moved = replace(moved, velocities=g.velocities @ m[:3, :3].T, accelerations=g.accelerations @ m[:3, :3].T,
                        angular_velocities=g.angular_velocities @ turned.T)
    return moved


def affine_placed(g: Gaussians, placement: np.ndarray) -> Gaussians:
    """Static Gaussians `g` moved by any invertible affine `placement` (4x4), by the module's convention."""
    m = affine_placement(placement)
    dtype, device = g.means.dtype, g.means.device
    linear = torch.as_tensor(m[:3, :3], dtype=torch.float64, device=device)
    means = g.means.double() @ linear.T + torch.as_tensor(m[:3, 3], dtype=torch.float64, device=device)
    factor = linear @ quat_to_rotmat(g.quats.double()) * torch.exp(g.log_scales.double())[:, None, :]
    axes, scales, _ = torch.linalg.svd(factor)  # Sigma' = factor factor^T = axes diag(scales^2) axes^T
    axes = torch.cat([axes[..., :2], axes[..., 2:] * torch.linalg.det(axes)[:, None, None]], dim=-1)  # a rotation
    turn, mirrored = polar_rotation(m[:3, :3])
    rest = rotate_sh(g.sh_rest.double(), torch.as_tensor(turn))
    if mirrored:  # -I takes band l's coefficients to (-1)^l times themselves
        degree = round((rest.shape[1] + 1) ** 0.5) - 1
        signs = torch.tensor([(-1.0) ** l for l in range(1, degree + 1) for _ in range(2 * l + 1)], dtype=rest.dtype)
        rest = rest * signs.to(rest.device)[None, :, None]
    return replace(g, means=means.to(dtype), log_scales=torch.log(scales.clamp_min(1e-30)).to(dtype),
                   quats=matrices_to_quats(axes).to(dtype), sh_rest=rest.to(g.sh_rest.dtype))


def polar_rotation(linear: np.ndarray) -> tuple[np.ndarray, bool]:
    """The rotation of `linear`'s polar decomposition (linear = Q P, P symmetric positive definite): Q, or -Q
    where Q mirrors; and whether it mirrors."""
    u, _, vt = np.linalg.svd(np.asarray(linear, dtype=np.float64))
    q = u @ vt
    mirrored = bool(np.linalg.det(q) < 0)
    return (-q if mirrored else q), mirrored


def placement_notes(g: Gaussians, placement: np.ndarray | None) -> list[str]:
    """What placing `g` by `placement` cannot keep exactly: view-dependent colours under an uneven scale or a
    shear (the module's convention)."""
    if placement is None or g.sh_rest.shape[1] == 0:
        return []
    stretch = np.linalg.svd(np.asarray(placement, dtype=np.float64)[:3, :3], compute_uv=False)
    if stretch.max() - stretch.min() <= SCALE_TOLERANCE * stretch.mean():
        return []
    return [f"the placement scales unevenly or shears (its principal scales {', '.join(f'{x:.4g}' for x in stretch)}): "
            "view-dependent colours (SH) are turned by its rotation part only, which is exact for one scale on all "
            "axes, so they differ somewhat from the model's seen through the placement"]


def matrix_to_quat(rotation: np.ndarray) -> np.ndarray:
    """The unit quaternion (w, x, y, z) of a rotation matrix (matrices_to_quats)."""
    return matrices_to_quats(torch.as_tensor(np.asarray(rotation, dtype=np.float64))[None])[0].numpy()


def matrices_to_quats(r: torch.Tensor) -> torch.Tensor:
    """The unit quaternions (N, 4: w, x, y, z) of rotation matrices `r` (N, 3, 3), each from its largest
    component, for accuracy."""
    trace = r[:, 0, 0] + r[:, 1, 1] + r[:, 2, 2]
    candidates = torch.stack([1 + trace, 1 + r[:, 0, 0] - r[:, 1, 1] - r[:, 2, 2],
                              1 - r[:, 0, 0] + r[:, 1, 1] - r[:, 2, 2], 1 - r[:, 0, 0] - r[:, 1, 1] + r[:, 2, 2]], -1)
    k = candidates.argmax(-1)
    s = 2.0 * torch.sqrt(candidates.gather(-1, k[:, None])[:, 0].clamp_min(1e-30))
    a, b, c = r[:, 2, 1] - r[:, 1, 2], r[:, 0, 2] - r[:, 2, 0], r[:, 1, 0] - r[:, 0, 1]
    d, e, f = r[:, 0, 1] + r[:, 1, 0], r[:, 0, 2] + r[:, 2, 0], r[:, 1, 2] + r[:, 2, 1]
    q = torch.stack([torch.stack([s / 4, a / s, b / s, c / s], -1), torch.stack([a / s, s / 4, d / s, e / s], -1),
                     torch.stack([b / s, d / s, s / 4, f / s], -1), torch.stack([c / s, e / s, f / s, s / 4], -1)], 1)
    q = q[torch.arange(len(r), device=r.device), k]
    return q / q.norm(dim=-1, keepdim=True)
