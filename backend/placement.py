"""A model's Gaussians as a request chooses and places them (protocol.MODEL_CHOICE, protocol.placement_scale): a
4D model's at a time, those inside a crop box, and the model moved by a placement (a rotation, a translation and
one scale)."""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import torch

from blender_addon.core.protocol import placement_scale
from .dynamic import DynamicGaussians
from .gaussians import Gaussians, quat_multiply
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
    """The Gaussians moved by `placement` (a rotation, a translation and one scale: protocol.placement_scale):
    their means, rotations, scales and view-dependent colours, and a 4D model's motion with them (so the
    placed model at any time is the model at that time, placed)."""
    if placement is None:
        return g
    scale = placement_scale(placement)
    m = torch.as_tensor(placement, dtype=g.means.dtype, device=g.means.device)
    rotation = placement[:3, :3] / scale
    turn = torch.as_tensor(matrix_to_quat(rotation), dtype=g.quats.dtype, device=g.quats.device)
    moved = replace(g, means=g.means @ m[:3, :3].T + m[:3, 3], log_scales=g.log_scales + math.log(scale),
                    quats=quat_multiply(turn.expand_as(g.quats), g.quats),
                    sh_rest=rotate_sh(g.sh_rest, torch.as_tensor(rotation)))
    if isinstance(g, DynamicGaussians):  # velocities and accelerations scale and turn, angular velocities turn
        turned = torch.as_tensor(rotation, dtype=g.means.dtype, device=g.means.device)
        moved = replace(moved, velocities=g.velocities @ m[:3, :3].T, accelerations=g.accelerations @ m[:3, :3].T,
                        angular_velocities=g.angular_velocities @ turned.T)
    return moved


def matrix_to_quat(rotation: np.ndarray) -> np.ndarray:
    """The unit quaternion (w, x, y, z) of a rotation matrix (from its largest component, for accuracy)."""
    r = rotation
    trace = np.trace(r)
    candidates = [1 + trace, 1 + r[0, 0] - r[1, 1] - r[2, 2], 1 - r[0, 0] + r[1, 1] - r[2, 2],
                  1 - r[0, 0] - r[1, 1] + r[2, 2]]
    k = int(np.argmax(candidates))
    s = 2.0 * math.sqrt(candidates[k])
    if k == 0:
        q = [s / 4, (r[2, 1] - r[1, 2]) / s, (r[0, 2] - r[2, 0]) / s, (r[1, 0] - r[0, 1]) / s]
    elif k == 1:
        q = [(r[2, 1] - r[1, 2]) / s, s / 4, (r[0, 1] + r[1, 0]) / s, (r[0, 2] + r[2, 0]) / s]
    elif k == 2:
        q = [(r[0, 2] - r[2, 0]) / s, (r[0, 1] + r[1, 0]) / s, s / 4, (r[1, 2] + r[2, 1]) / s]
    else:
        q = [(r[1, 0] - r[0, 1]) / s, (r[0, 2] + r[2, 0]) / s, (r[1, 2] + r[2, 1]) / s, s / 4]
    return np.array(q) / np.linalg.norm(q)
