"""Dynamic (4D) Gaussians: the static 3DGS parameters plus an explicit dependence on time.

Each Gaussian moves along a quadratic trajectory about its time centre, turns at a constant angular velocity,
and is seen during a window of time (a Gaussian in t around the centre, as spacetime Gaussians are). `at(t)`
gives plain Gaussians at time t through differentiable torch operations, so either rasterizer renders them
unchanged and autograd carries the gradients back to the motion; on a GPU one CUDA kernel each way
(cuda/motion.cu) evaluates what reference_motion does in torch. Time is normalised to [0, 1] over the
captured frames (the D-NeRF `time`). Without motion and with an endless window (how `from_static` makes
them) the Gaussians are their static part at every time.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch

from blender_addon.core.errors import SplatwrightError
from . import torch_files
from .formats.budget import Budget
from .formats.validate import validated
from .gaussians import Gaussians, quat_multiply
from .kernels import extension, handles

DYNAMIC_FILE = "splats4d.pt"  # a trained 4D model, beside the splats.ply of its first frame
_FILE_TAG = "splatwright-4d-gaussians"
_FILE_VERSION = 1


@dataclass
class DynamicGaussians(Gaussians):
    """Gaussians whose means, rotations and opacities change with time; every field is one optimizer group."""

    velocities: torch.Tensor  # (N, 3) world units per unit of time, at the time centre
    accelerations: torch.Tensor  # (N, 3): means(t) = means + velocities dt + accelerations dt^2 / 2
    angular_velocities: torch.Tensor  # (N, 3) world-frame rotation vector (radians) per unit of time
    time_centers: torch.Tensor  # (N,) when the Gaussian has its means, quats and full opacity
    time_precisions: torch.Tensor  # (N,) 1 / width^2 of its window in time, >= 0; 0: seen at every time

    @classmethod
    def from_static(cls, g: Gaussians, time_center: float = 0.5) -> "DynamicGaussians":
        """`g` (its static part, if it is dynamic already) without motion, seen at every time."""
        static = {name: getattr(g, name) for name in Gaussians.names()}
        like = g.means
        vectors = [torch.zeros_like(like) for _ in range(3)]
        return cls(**static, velocities=vectors[0], accelerations=vectors[1], angular_velocities=vectors[2],
                   time_centers=torch.full_like(like[:, 0], time_center),
                   time_precisions=torch.zeros_like(like[:, 0]))

    def at(self, time: float) -> Gaussians:
        motion = [getattr(self, name) for name in MOTION_INPUTS]
        means, quats, logits = (_Motion.apply(float(time), *motion) if handles(self.means)
                                else reference_motion(time, *motion))
        return Gaussians(means=means, log_scales=self.log_scales, quats=quats, opacity_logits=logits,
                         sh_dc=self.sh_dc, sh_rest=self.sh_rest)

    def peak_opacities(self) -> torch.Tensor:
        """Each Gaussian's opacity at the captured time (in [0, 1]) where it is most opaque."""
        centers, precisions = self.time_centers.detach(), self.time_precisions.detach()
        dt = centers.clamp(0.0, 1.0) - centers
        return torch.sigmoid(scaled_logits(self.opacity_logits.detach(), -0.5 * precisions * dt * dt))

    def keep_valid_(self) -> None:
        """After an optimizer step: windows keep a precision >= 0 (a negative one would make a Gaussian more
        opaque away from its time centre than at it)."""
        with torch.no_grad():
            self.time_precisions.clamp_(min=0.0)


MOTION_INPUTS = ("means", "velocities", "accelerations", "angular_velocities", "quats", "opacity_logits",
                 "time_centers", "time_precisions")  # what the Gaussians at a time depend on, in the kernel's order


def reference_motion(time: float, means, velocities, accelerations, angular_velocities, quats, opacity_logits,
                     time_centers, time_precisions) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Means, quats and opacity logits at `time`, in torch operations (what cuda/motion.cu computes)."""
    dt = time - time_centers
    means_t = means + velocities * dt[:, None] + 0.5 * accelerations * (dt * dt)[:, None]
    quats_t = quat_multiply(rotvec_to_quat(angular_velocities * dt[:, None]), quats)
    return means_t, quats_t, scaled_logits(opacity_logits, -0.5 * time_precisions * dt * dt)


class _Motion(torch.autograd.Function):
    """reference_motion in one CUDA kernel each way (cuda/motion.cu)."""

    @staticmethod
    def forward(ctx, time, *motion):
        motion = [t.detach().contiguous() for t in motion]
        ctx.save_for_backward(*motion)
        ctx.time = time
        return tuple(extension().motion_forward(motion, time))

    @staticmethod
    def backward(ctx, grad_means, grad_quats, grad_logits):
        grads = extension().motion_backward(list(ctx.saved_tensors), ctx.time, grad_means.contiguous(),
                                            grad_quats.contiguous(), grad_logits.contiguous())
        return None, grad_means, *grads


def split_in_time(rows: dict[str, torch.Tensor], normal, divisor: float) -> dict[str, torch.Tensor]:
    """Split Gaussians' rows (one per new Gaussian) spread over their parent's window in time: each moves its
    time centre by a sample of the window (`normal(shape)`: standard normal samples, one per row), along the
    parent's trajectory (so it is where the parent was then), and its window narrows by `divisor`. Gaussians
    seen at every time stay as they are."""
    precisions = rows["time_precisions"]
    widths = torch.where(precisions > 0, torch.rsqrt(precisions), 0.0)
    dt = normal(widths.shape).to(widths.device) * widths
    moved = dict(rows)
    moved["means"] = rows["means"] + rows["velocities"] * dt[:, None] + 0.5 * rows["accelerations"] * (dt * dt)[:, None]
    moved["velocities"] = rows["velocities"] + rows["accelerations"] * dt[:, None]
    moved["quats"] = quat_multiply(rotvec_to_quat(rows["angular_velocities"] * dt[:, None]), rows["quats"])
    moved["time_centers"] = rows["time_centers"] + dt
    moved["time_precisions"] = precisions * divisor ** 2
    return moved


def rotvec_to_quat(rotvec: torch.Tensor) -> torch.Tensor:
    """Unit quaternions (w, x, y, z) of rotation vectors (..., 3): angle |v| about v / |v|; exactly
    (1, 0, 0, 0) for a zero vector, with finite gradients there."""
    half = 0.5 * torch.linalg.vector_norm(rotvec, dim=-1, keepdim=True)
    return torch.cat([torch.cos(half), 0.5 * rotvec * torch.sinc(half / math.pi)], dim=-1)  # sinc(x) = sin(pi x)/(pi x)


def scaled_logits(logits: torch.Tensor, log_factor: torch.Tensor) -> torch.Tensor:
    """logit(sigmoid(logits) * exp(log_factor)) for log_factor <= 0, stable at both ends and exactly
    `logits` where log_factor is 0. With s = sigmoid(x), f = exp(l): logit(s f) = x + l - log(1 + e^x (1 - f))."""
    odds = torch.exp(logits.clamp_max(60.0))  # e^x overflows float32 past 88; a logit of 60 is an opacity of 1
    return logits + log_factor - torch.log1p(-odds * torch.expm1(log_factor))


def gaussians_from_tensors(tensors: dict[str, torch.Tensor], name: str = "the model") -> Gaussians:
    """Static or dynamic Gaussians, as the parameter tensors (a checkpoint's, by name) say; `name` is for errors."""
    if not isinstance(tensors, dict):
        raise SplatwrightError(f"{name}: its parameters are {type(tensors).__name__}, not tensors by name")
    cls = DynamicGaussians if "velocities" in tensors else Gaussians
    missing, unknown = [k for k in cls.names() if k not in tensors], [str(k) for k in tensors if k not in cls.names()]
    if missing or unknown:
        said = [f"lack {', '.join(missing)}"] if missing else []
        said += [f"include unknown {', '.join(unknown)}"] if unknown else []
        raise SplatwrightError(f"{name}: the model's parameters {' and '.join(said)}")
    for key, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise SplatwrightError(f"{name}: {key} is {type(t).__name__}, not a tensor")
    return cls(**tensors)


def write_dynamic(path: str | Path, g: DynamicGaussians) -> None:
    """Write a 4D model (every parameter tensor, by name) to a torch file that read_dynamic reads."""
    state = {"format": _FILE_TAG, "version": _FILE_VERSION,
             "tensors": {name: t.detach().cpu() for name, t in g.tensors().items()}}
    torch_files.save(path, state, "the 4D model")


def read_dynamic(source: str | Path | bytes, name: str = "", budget: Budget = Budget()) -> DynamicGaussians:
    """The 4D model write_dynamic wrote to a file, or that file's bytes (`name` then says what they are in
    errors), as formats.validate passes it (of at most `budget`'s Gaussians); anything else is refused in one
    line."""
    name = name or (Path(source).name if not isinstance(source, bytes) else "the uploaded model")
    hint = f"training on timed views writes {DYNAMIC_FILE}"
    state = torch_files.load(source, name, "a Splatwright 4D model", hint)
    if not isinstance(state, dict) or state.get("format") != _FILE_TAG:
        raise SplatwrightError(f"{name}: not a Splatwright 4D model ({hint})")
    if state.get("version") != _FILE_VERSION:
        raise SplatwrightError(f"{name}: 4D model version {state.get('version')!r}, but this version reads "
                               f"{_FILE_VERSION}")
    if "tensors" not in state:
        raise SplatwrightError(f"{name}: the 4D model file holds no parameters ('tensors' is missing)")
    g = gaussians_from_tensors(state["tensors"], name)
    if not isinstance(g, DynamicGaussians):
        raise SplatwrightError(f"{name}: the file holds no motion parameters")
    return validated(g, name, budget)
