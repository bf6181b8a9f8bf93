"""The 4D model's CUDA time dependence (cuda/motion.cu) against the torch reference (backend.dynamic's
reference_motion), alone and through both rasterizers, on fresh random models.

Tolerances as for the static kernels (test_cuda_rasterizer): the motion's outputs within 1e-5 (relative to
their size); images max abs diff <= 1e-4 outside the pixels the static test also leaves out (a splat's alpha
within rounding of the 1/255 floor); every parameter group's gradient relative L2 <= 1e-3, the motion's
(velocities, accelerations, angular velocities, time centres and precisions) included.
"""
from __future__ import annotations

import pytest
import torch

from backend.dynamic import MOTION_INPUTS, DynamicGaussians, reference_motion
from backend.gaussians import Gaussians
from backend.render import cuda, reference
from cuda_helpers import DEV, GPU_TEST, GRAD_TOL, IMAGE_TOL, ambiguous_pixels, fresh_seed, random_scene, rel_l2

pytestmark = GPU_TEST

MOTION_TOL = 1e-5


def random_motion(n: int, gen: torch.Generator, means: torch.Tensor, quats: torch.Tensor,
                  logits: torch.Tensor) -> dict[str, torch.Tensor]:
    """Motion of every kind the kernel distinguishes: still Gaussians (zero motion, endless windows), turns
    small enough for the half-angle series and large ones, narrow windows, logits past the ceiling."""
    def rows(width, scale):
        return scale * torch.randn(n, width, generator=gen) if width > 1 else scale * torch.randn(n, generator=gen)
    turn_scale = torch.where(torch.rand(n, 1, generator=gen) < 0.5, 0.05, 3.0)
    motion = {"means": means, "velocities": rows(3, 0.3), "accelerations": rows(3, 0.5),
              "angular_velocities": turn_scale * torch.randn(n, 3, generator=gen), "quats": quats,
              "opacity_logits": logits, "time_centers": torch.rand(n, generator=gen),
              "time_precisions": rows(1, 8.0).abs()}
    still = torch.rand(n, generator=gen) < 0.2
    for name in ("velocities", "accelerations", "angular_velocities", "time_precisions"):
        motion[name][still] = 0.0
    motion["opacity_logits"][torch.rand(n, generator=gen) < 0.02] = 70.0
    return motion


def motion_both(motion: dict, time: float):
    """Outputs and input gradients (of a random weighting of the outputs) of the kernel and of the reference."""
    results = {}
    for name in ("cuda", "reference"):
        inputs = [motion[k].to(DEV).clone().requires_grad_(True) for k in MOTION_INPUTS]
        g = DynamicGaussians(means=inputs[0], log_scales=torch.zeros_like(inputs[0]), quats=inputs[4],
                             opacity_logits=inputs[5], sh_dc=torch.zeros(len(inputs[0]), 1, 3, device=DEV),
                             sh_rest=torch.zeros(len(inputs[0]), 0, 3, device=DEV), velocities=inputs[1],
                             accelerations=inputs[2], angular_velocities=inputs[3], time_centers=inputs[6],
                             time_precisions=inputs[7])
        if name == "cuda":
            at = g.at(time)
            outputs = (at.means, at.quats, at.opacity_logits)
        else:
            outputs = reference_motion(time, *inputs)
        gen = torch.Generator(device=DEV).manual_seed(99)
        loss = sum((o * torch.randn(o.shape, generator=gen, device=DEV)).sum() for o in outputs)
        loss.backward()
        results[name] = ([o.detach() for o in outputs], {k: t.grad for k, t in zip(MOTION_INPUTS, inputs)})
    return results


@pytest.mark.parametrize("time", [0.0, 0.37, 1.0])
def test_motion_kernel_matches_reference(time):
    seed = fresh_seed()
    gen = torch.Generator().manual_seed(seed)
    n = 20_000
    motion = random_motion(n, gen, torch.randn(n, 3, generator=gen), torch.randn(n, 4, generator=gen),
                           1.5 * torch.randn(n, generator=gen))
    results = motion_both(motion, time)
    (ours, our_grads), (ref, ref_grads) = results["cuda"], results["reference"]
    for name, a, b in zip(("means", "quats", "opacity_logits"), ours, ref):
        assert torch.isfinite(a).all(), f"{name} at t={time} not finite (seed {seed})"
        err = ((a - b).abs() / (1 + b.abs())).max().item()
        assert err <= MOTION_TOL, f"{name} at t={time}: max relative diff {err:.2e} (seed {seed})"
    for name in MOTION_INPUTS:
        assert torch.isfinite(our_grads[name]).all(), f"{name} grad not finite (seed {seed})"
        err = rel_l2(our_grads[name], ref_grads[name])
        assert err <= GRAD_TOL, f"{name} grad relative L2 {err:.2e} at t={time} (seed {seed})"


def test_still_gaussians_are_their_static_part():
    gen = torch.Generator().manual_seed(fresh_seed())
    scene = random_scene(3000, 64, 48, gen)
    static = Gaussians(means=scene["means"], log_scales=torch.log(scene["scales"]), quats=scene["quats"],
                       opacity_logits=torch.logit(scene["opacities"]), sh_dc=scene["sh"][:, :1],
                       sh_rest=scene["sh"][:, 1:]).to(DEV)
    at = DynamicGaussians.from_static(static).at(0.8)
    assert torch.equal(at.means, static.means) and torch.equal(at.opacity_logits, static.opacity_logits)
    assert torch.equal(at.quats, static.quats)


@pytest.mark.parametrize("n, width, height, sh_degree, time", [
    (2000, 256, 192, 3, 0.25),
    (1500, 203, 141, 2, 0.9),
])
def test_moving_scene_renders_match_reference(n, width, height, sh_degree, time):
    """Image and every gradient, motion included, of a 4D model rendered at `time`: the motion kernel and the
    CUDA rasterizer against reference_motion and the reference rasterizer."""
    seed = fresh_seed()
    gen = torch.Generator().manual_seed(seed)
    scene = random_scene(n, width, height, gen)
    motion = random_motion(n, gen, scene["means"], scene["quats"], torch.logit(scene["opacities"]))
    for name in ("velocities", "accelerations"):
        motion[name] *= 0.2  # the splats stay in view
    params = {**motion, "log_scales": torch.log(scene["scales"]), "sh": scene["sh"]}
    msg = f"(seed {seed}, {n} Gaussians, {width}x{height}, t={time})"
    with torch.no_grad():
        means, quats, logits = reference_motion(time, *[params[k].to(DEV) for k in MOTION_INPUTS])
        at_time = {"means": means, "quats": quats, "scales": torch.exp(params["log_scales"]),
                   "opacities": torch.sigmoid(logits), "sh": params["sh"], "viewmat": scene["viewmat"], "K": scene["K"]}
    keep = ~ambiguous_pixels(at_time, width, height, sh_degree)
    assert keep.float().mean() >= 0.999, f"{int((~keep).sum())} ambiguous pixels {msg}"
    images, grads = {}, {}
    for name, rasterize in (("cuda", cuda.rasterize), ("reference", reference.rasterize)):
        p = {k: v.to(DEV).clone().requires_grad_(True) for k, v in params.items()}
        motion_inputs = [p[k] for k in MOTION_INPUTS]
        if name == "cuda":
            g = DynamicGaussians(means=p["means"], log_scales=p["log_scales"], quats=p["quats"],
                                 opacity_logits=p["opacity_logits"], sh_dc=p["sh"][:, :1], sh_rest=p["sh"][:, 1:],
                                 velocities=p["velocities"], accelerations=p["accelerations"],
                                 angular_velocities=p["angular_velocities"], time_centers=p["time_centers"],
                                 time_precisions=p["time_precisions"]).at(time)
            means, quats, logits = g.means, g.quats, g.opacity_logits
        else:
            means, quats, logits = reference_motion(time, *motion_inputs)
        out = rasterize(means, quats, torch.exp(p["log_scales"]), torch.sigmoid(logits), p["sh"],
                        scene["viewmat"].to(DEV), scene["K"].to(DEV), width, height, sh_degree,
                        torch.tensor((0.1, 0.5, 0.9), device=DEV))
        w = torch.randn(out.image.shape, generator=torch.Generator(device=DEV).manual_seed(7), device=DEV)
        w = w * keep[..., None]  # ambiguous pixels' gradients differ by design
        (out.image * w).sum().backward()
        images[name] = out.image.detach()
        grads[name] = {k: t.grad if t.grad is not None else torch.zeros_like(t) for k, t in p.items()}
    diff = (images["cuda"] - images["reference"]).abs()[keep].max().item()
    assert diff <= IMAGE_TOL, f"image max abs diff {diff:.2e} {msg}"
    for name in params:
        err = rel_l2(grads["cuda"][name], grads["reference"][name])
        assert torch.isfinite(grads["cuda"][name]).all(), f"{name} grad not finite {msg}"
        assert err <= GRAD_TOL, f"{name} grad relative L2 {err:.2e} {msg}"
    assert grads["reference"]["time_centers"].abs().sum() > 0, "the scene's motion must reach the image"
