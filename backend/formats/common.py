"""What the splat formats share: the model as numpy columns, the model of decoded columns (checked by
validate.py), and the quantisers used by more than one format.

Columns are the trained parameters as float32 arrays: means (N, 3), log_scales (N, 3), quats (N, 4) unit
(w, x, y, z), opacity_logits (N,), sh_dc (N, 3) and sh_rest (N, K-1, 3) (coefficient-major, channel inner).
"""
from __future__ import annotations

import numpy as np
import torch

from ..gaussians import Gaussians
from .budget import Budget
from .validate import validated

# For each index of a quaternion's largest component, the other three indices in ascending order (the
# "smallest three" that SPZ and the compressed PLY store).
OTHER_COMPONENTS = np.array([[i for i in range(4) if i != largest] for largest in range(4)])
# A stored opacity byte of 0 or 255 decodes to this far inside (0, 1), so its logit is finite and encodes back
# to the same byte.
_BYTE_MARGIN = 0.25 / 255


def columns(g: Gaussians) -> dict[str, np.ndarray]:
    """The model's parameters as float32 numpy columns, quaternions normalised."""
    t = {k: v.detach().cpu().float().numpy() for k, v in g.tensors().items()}
    t["sh_dc"] = t["sh_dc"].reshape(-1, 3)
    t["quats"] = unit_quats(t["quats"])
    return t


def unit_quats(q: np.ndarray) -> np.ndarray:
    norm = np.linalg.norm(q, axis=1, keepdims=True)
    return (q / np.where(norm > 0, norm, 1.0)).astype(np.float32)


def sh_degree_of(sh_rest: np.ndarray) -> int:
    return int(round((sh_rest.shape[1] + 1) ** 0.5)) - 1


def gaussians_from_columns(c: dict[str, np.ndarray], name: str, budget: Budget = Budget()) -> Gaussians:
    """The model of decoded columns, as validate.validated passes it."""
    n = len(c["means"])
    return validated(Gaussians(
        means=_tensor(c["means"]), log_scales=_tensor(c["log_scales"]), quats=_tensor(unit_quats(c["quats"])),
        opacity_logits=_tensor(c["opacity_logits"]), sh_dc=_tensor(c["sh_dc"]).reshape(n, 1, 3),
        sh_rest=_tensor(c["sh_rest"])), name, budget)


def _tensor(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32))


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x.astype(np.float64)))


def byte_logit(b: np.ndarray) -> np.ndarray:
    """Opacity logits of opacities stored as bytes (b / 255)."""
    p = np.clip(b.astype(np.float64) / 255.0, _BYTE_MARGIN, 1.0 - _BYTE_MARGIN)
    return np.log(p / (1.0 - p)).astype(np.float32)


def round_half_away(x: np.ndarray) -> np.ndarray:
    """Nearest integer, halves away from zero (C's round, which the formats' reference writers use)."""
    return np.sign(x) * np.floor(np.abs(x) + 0.5)


def to_byte(x: np.ndarray) -> np.ndarray:
    """The nearest uint8, clamped to [0, 255]."""
    return np.clip(round_half_away(np.asarray(x, np.float64)), 0, 255).astype(np.uint8)


def unpack_bits(words: np.ndarray, shift: int, bits: int) -> np.ndarray:
    """The unsigned `bits`-bit field at `shift` of uint32 `words`."""
    return (words >> np.uint32(shift)) & np.uint32((1 << bits) - 1)


def pack_unorm(v: np.ndarray, bits: int) -> np.ndarray:
    """Values in [0, 1] to `bits`-bit unsigned integers (nearest), as uint32."""
    top = (1 << bits) - 1
    return np.clip(np.floor(v.astype(np.float64) * top + 0.5), 0, top).astype(np.uint32)
