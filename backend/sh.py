"""Real spherical harmonics up to degree 3, in the basis and sign convention of the reference 3DGS."""
from __future__ import annotations

import torch

SH_C0 = 0.28209479177387814
SH_C1 = 0.4886025119029199
SH_C2 = (1.0925484305920792, -1.0925484305920792, 0.31539156525252005,
         -1.0925484305920792, 0.5462742152960396)
SH_C3 = (-0.5900435899266435, 2.890611442640554, -0.4570457994644658, 0.3731763325901154,
         -0.4570457994644658, 1.445305721320277, -0.5900435899266435)


def sh_basis(dirs: torch.Tensor, degree: int) -> torch.Tensor:
    """Basis values (N, (degree+1)^2) for unit directions (N, 3)."""
    x, y, z = dirs.unbind(-1)
    out = [torch.full_like(x, SH_C0)]
    if degree >= 1:
        out += [-SH_C1 * y, SH_C1 * z, -SH_C1 * x]
    if degree >= 2:
        xx, yy, zz, xy, yz, xz = x * x, y * y, z * z, x * y, y * z, x * z
        out += [SH_C2[0] * xy, SH_C2[1] * yz, SH_C2[2] * (2 * zz - xx - yy),
                SH_C2[3] * xz, SH_C2[4] * (xx - yy)]
    if degree >= 3:
        out += [SH_C3[0] * y * (3 * xx - yy), SH_C3[1] * xy * z, SH_C3[2] * y * (4 * zz - xx - yy),
                SH_C3[3] * z * (2 * zz - 3 * xx - 3 * yy), SH_C3[4] * x * (4 * zz - xx - yy),
                SH_C3[5] * z * (xx - yy), SH_C3[6] * x * (xx - 3 * yy)]
    return torch.stack(out, dim=-1)


def sh_to_rgb(sh: torch.Tensor, dirs: torch.Tensor, degree: int) -> torch.Tensor:
    """Colour (N, 3) seen along unit `dirs` from coefficients `sh` (N, K, 3): sum + 0.5, clamped at 0."""
    k = (degree + 1) ** 2
    basis = sh_basis(dirs, degree)
    return torch.clamp_min((basis[:, :, None] * sh[:, :k, :]).sum(dim=1) + 0.5, 0.0)


def rotate_sh(sh_rest: torch.Tensor, rotation: torch.Tensor) -> torch.Tensor:
    """The higher-degree coefficients `sh_rest` (N, (D+1)^2 - 1, 3) of colours turned by `rotation` (3, 3): the
    turned colour seen along R d is the old one seen along d. Each degree's coefficients mix among themselves
    by a (2l+1)^2 matrix, fitted here exactly (least squares on more directions than unknowns) from the basis."""
    degree = int(round((sh_rest.shape[1] + 1) ** 0.5)) - 1
    if degree == 0:
        return sh_rest
    gen = torch.Generator().manual_seed(0)
    dirs = torch.nn.functional.normalize(torch.randn(64, 3, generator=gen, dtype=torch.float64), dim=-1)
    basis = sh_basis(dirs, degree)[:, 1:]  # Y(d)
    turned = sh_basis(dirs @ rotation.to(torch.float64), degree)[:, 1:]  # Y(R^T d), the rows being R^T d
    out = torch.empty_like(sh_rest)
    for l in range(1, degree + 1):
        band = slice(l * l - 1, (l + 1) ** 2 - 1)
        # Y(R^T d) = Y(d) M within a band, so the colour Y(R^T d) C is Y(d) (M C).
        mix = torch.linalg.lstsq(basis[:, band], turned[:, band]).solution
        out[:, band] = torch.einsum("jk,nkc->njc", mix.to(sh_rest), sh_rest[:, band])
    return out
