"""Shared helpers of the splat format tests (test_formats*.py, test_spz.py, test_ksplat.py, test_format_tools.py):
the fixture files' folder, the formats' tolerances that more than one file checks, comparing two models
attribute by attribute within a tolerance, and comparing their renders.

Tolerances, per attribute (the largest error quantisation allows, and a little float slack):
- SPZ: positions 0.5 / 2^12; log scales 0.5 / 16; opacity 0.5 / 255; SH DC 0.5 / (0.15 x 255) (DC beyond
  +-3.33 is clamped); quaternion components 0.002 (9-bit smallest three); SH 8.5 / 128 (4-bit buckets).
- .ksplat, by compression level (backend/formats/ksplat.py's docstring states the quantisation): colour and
  opacity 1/255 (the writer floors); level 0 otherwise exact; levels 1 and 2 positions half a step of
  5 m / 65534 (3.8e-5), log scales 2^-10 (float16 cut, not rounded, by three.js), quaternion components 0.001 and
  SH 2^-10 (float16); level 2 SH one 8-bit step of the SH's range.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from plyfile import PlyData

from backend import formats
from backend.formats import spz
from backend.formats.common import columns, gaussians_from_columns
from backend.gaussians import Gaussians
from backend.metrics import psnr
from backend.render import render
from backend.sh import SH_C0
from backend.tools import cli
from blender_addon.core.cameras import Camera, intrinsics_from_fov_x, look_at
from blender_addon.core.errors import SplatwrightError
from helpers import ROOT

DATA = ROOT / "tests" / "data" / "splats"
# "dc_limit": the SH DC magnitude SPZ stores; the reference's DC is clamped to it before comparing.
SPZ_TOL = dict(means=0.5 / 4096 + 1e-6, log_scales=0.5 / 16 + 1e-5, opacity=0.5 / 255 + 1e-6,
               sh_dc=0.5 / (0.15 * 255) + 1e-5, quats=0.002, sh_rest=8.5 / 128 + 1e-5, dc_limit=1 / 0.3)
_COLOUR = dict(opacity=1 / 255 + 1e-6, rgb=1 / 255 + 1e-6)
_HALF = dict(means=2.5 / 32767 / 2 + 1e-6, log_scales=2 ** -10 + 1e-5, quats=0.001, sh_rest=2 ** -10)
KSPLAT_TOL = {0: dict(means=1e-7, log_scales=1e-6, quats=1e-6, sh_rest=1e-7, **_COLOUR),
              1: dict(_HALF, **_COLOUR),
              2: dict(_HALF, **_COLOUR, sh_rest=(0.3841 + 0.3791) / 255 + 1e-5)}  # sh3.ply's degree 1-2 SH range


def rgb_of(g: Gaussians) -> torch.Tensor:
    return 0.5 + SH_C0 * g.sh_dc[:, 0]


def reordered(g: Gaussians, order) -> Gaussians:
    order = torch.as_tensor(np.asarray(order))
    return Gaussians(**{k: v[order] for k, v in g.tensors().items()})


def nearest(ref: Gaussians, got: Gaussians) -> Gaussians:
    """`got` in `ref`'s order, matching each splat to the nearest one (for writers that reorder)."""
    return reordered(got, torch.cdist(ref.means, got.means).argmin(1))


def flip_yz(g: Gaussians) -> Gaussians:
    """The model with y and z negated (RDF <-> RUB)."""
    return gaussians_from_columns(spz._flipped(columns(g), (1, -1, -1)), "flipped")


def errors(ref: Gaussians, got: Gaussians, dc_limit: float = math.inf) -> dict[str, float]:
    """The largest error of each attribute of `got` against `ref` (SH only up to `got`'s degree; `ref`'s SH DC
    clamped to `dc_limit`)."""
    assert len(ref) == len(got)
    q_ref = torch.nn.functional.normalize(ref.quats, dim=-1)
    quat_error = torch.minimum((q_ref - got.quats).abs().amax(1), (q_ref + got.quats).abs().amax(1))
    out = {"means": (ref.means - got.means).abs().max(), "log_scales": (ref.log_scales - got.log_scales).abs().max(),
           "quats": quat_error.max(), "opacity": (ref.opacities - got.opacities).abs().max(),
           "sh_dc": (ref.sh_dc.clamp(-dc_limit, dc_limit) - got.sh_dc).abs().max(),
           "rgb": (rgb_of(ref).clamp(0, 1) - rgb_of(got).clamp(0, 1)).abs().max()}
    if got.sh_rest.shape[1]:
        out["sh_rest"] = (ref.sh_rest[:, :got.sh_rest.shape[1]] - got.sh_rest).abs().max()
    return {k: float(v) for k, v in out.items()}


def assert_within(ref: Gaussians, got: Gaussians, tol: dict) -> None:
    """Each attribute of `got` within `tol` of `ref`'s. A per-axis position tolerance (SOG's) is in log-mapped
    units, sign(v) log(1 + |v|), with 1% slack for float32's rounding of the positions."""
    e = errors(ref, got, tol.get("dc_limit", math.inf))
    if np.ndim(tol.get("means", 0)):
        log = lambda v: torch.sign(v) * torch.log1p(v.double().abs())  # noqa: E731
        e["means"] = float(((log(ref.means) - log(got.means)).abs() / torch.as_tensor(tol["means"])).max())
        tol = {**tol, "means": 1.01}
    over = {k: (round(e[k], 7), t) for k, t in tol.items() if k in e and e[k] > t}
    assert not over, f"errors over tolerance (error, tolerance): {over}"


def donut_cameras(n: int = 3, size: int = 48) -> list[Camera]:
    K = intrinsics_from_fov_x(0.8, size, size)
    return [Camera(look_at([0.32 * math.cos(a), 0.32 * math.sin(a), 0.2], [0.0, 0.0, 0.03]), K, size, size)
            for a in np.linspace(0, 2 * math.pi, n, endpoint=False)]


def renders(g: Gaussians, cameras: list[Camera]) -> list[torch.Tensor]:
    with torch.no_grad():
        return [render(g, c, 3, (1.0, 1.0, 1.0)).image for c in cameras]


def render_psnr(a: Gaussians | list[torch.Tensor], b: Gaussians, cameras: list[Camera]) -> float:
    """The lowest PSNR of `b`'s renders against `a`'s (or against renders of `a` already made)."""
    reference = a if isinstance(a, list) else renders(a, cameras)
    return min(psnr(image, truth) for image, truth in zip(renders(b, cameras), reference))


def splat_transform_ply(path) -> Gaussians:
    """A PLY splat-transform wrote when decoding (its opacities of bytes 0 and 255 are infinite)."""
    v = PlyData.read(str(path))["vertex"]
    rest = [n for n in v.data.dtype.names if n.startswith("f_rest_")]
    col = lambda *cs: torch.from_numpy(np.stack([v[c] for c in cs], 1).astype(np.float32))  # noqa: E731
    return Gaussians(means=col("x", "y", "z"), log_scales=col("scale_0", "scale_1", "scale_2"),
                     quats=col("rot_0", "rot_1", "rot_2", "rot_3"), opacity_logits=col("opacity")[:, 0].clamp(-20, 20),
                     sh_dc=col("f_dc_0", "f_dc_1", "f_dc_2")[:, None],
                     sh_rest=col(*rest).reshape(len(v.data), 3, -1).transpose(1, 2) if rest
                     else torch.zeros(len(v.data), 0, 3))


def assert_refused(path, message: str, capsys) -> None:
    """The file at `path` is refused with `message` in one line, by the reader and by `convert`."""
    with pytest.raises(SplatwrightError) as e:
        formats.read_any(path)
    assert message in str(e.value) and "\n" not in str(e.value)
    assert cli.main(["convert", str(path), str(path.parent / "out.ply")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0]
