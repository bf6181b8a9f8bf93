// Real spherical harmonics up to degree 3 (backend/sh.py's basis and signs) and their backward. The
// coefficients equal backend/sh.py's: checked by tests/test_kernel_constants.py.
#pragma once

#include "projection.cuh"

namespace splatwright {

constexpr float SH_C0 = 0.28209479177387814f;
constexpr float SH_C1 = 0.4886025119029199f;
constexpr float SH_C2_0 = 1.0925484305920792f, SH_C2_1 = -1.0925484305920792f,
                SH_C2_2 = 0.31539156525252005f, SH_C2_3 = -1.0925484305920792f, SH_C2_4 = 0.5462742152960396f;
constexpr float SH_C3_0 = -0.5900435899266435f, SH_C3_1 = 2.890611442640554f, SH_C3_2 = -0.4570457994644658f,
                SH_C3_3 = 0.3731763325901154f, SH_C3_4 = -0.4570457994644658f, SH_C3_5 = 1.445305721320277f,
                SH_C3_6 = -0.5900435899266435f;

// Basis values b[0 .. (degree + 1)^2) along the unit direction (x, y, z).
SW_HD void sh_basis(int degree, float x, float y, float z, float* b) {
  b[0] = SH_C0;
  if (degree < 1) return;
  b[1] = -SH_C1 * y;
  b[2] = SH_C1 * z;
  b[3] = -SH_C1 * x;
  if (degree < 2) return;
  const float xx = x * x, yy = y * y, zz = z * z, xy = x * y, yz = y * z, xz = x * z;
  b[4] = SH_C2_0 * xy;
  b[5] = SH_C2_1 * yz;
  b[6] = SH_C2_2 * (2.f * zz - xx - yy);
  b[7] = SH_C2_3 * xz;
  b[8] = SH_C2_4 * (xx - yy);
  if (degree < 3) return;
  b[9] = SH_C3_0 * y * (3.f * xx - yy);
  b[10] = SH_C3_1 * xy * z;
  b[11] = SH_C3_2 * y * (4.f * zz - xx - yy);
  b[12] = SH_C3_3 * z * (2.f * zz - 3.f * xx - 3.f * yy);
  b[13] = SH_C3_4 * x * (4.f * zz - xx - yy);
  b[14] = SH_C3_5 * z * (xx - yy);
  b[15] = SH_C3_6 * x * (xx - 3.f * yy);
}

// Gradient w.r.t. the direction (x, y, z) given g[k] = dL/db[k], the basis taken as polynomials in
// independent x, y, z (as autograd sees them).
SW_HD void sh_basis_bwd(int degree, float x, float y, float z, const float* g, float* gd) {
  gd[0] = gd[1] = gd[2] = 0.f;
  if (degree < 1) return;
  gd[0] += -SH_C1 * g[3];
  gd[1] += -SH_C1 * g[1];
  gd[2] += SH_C1 * g[2];
  if (degree < 2) return;
  const float xx = x * x, yy = y * y, zz = z * z, xy = x * y, yz = y * z, xz = x * z;
  gd[0] += SH_C2_0 * y * g[4] - 2.f * SH_C2_2 * x * g[6] + SH_C2_3 * z * g[7] + 2.f * SH_C2_4 * x * g[8];
  gd[1] += SH_C2_0 * x * g[4] + SH_C2_1 * z * g[5] - 2.f * SH_C2_2 * y * g[6] - 2.f * SH_C2_4 * y * g[8];
  gd[2] += SH_C2_1 * y * g[5] + 4.f * SH_C2_2 * z * g[6] + SH_C2_3 * x * g[7];
  if (degree < 3) return;
  gd[0] += SH_C3_0 * 6.f * xy * g[9] + SH_C3_1 * yz * g[10] - SH_C3_2 * 2.f * xy * g[11] -
           SH_C3_3 * 6.f * xz * g[12] + SH_C3_4 * (4.f * zz - 3.f * xx - yy) * g[13] +
           SH_C3_5 * 2.f * xz * g[14] + SH_C3_6 * 3.f * (xx - yy) * g[15];
  gd[1] += SH_C3_0 * 3.f * (xx - yy) * g[9] + SH_C3_1 * xz * g[10] +
           SH_C3_2 * (4.f * zz - xx - 3.f * yy) * g[11] - SH_C3_3 * 6.f * yz * g[12] -
           SH_C3_4 * 2.f * xy * g[13] - SH_C3_5 * 2.f * yz * g[14] - SH_C3_6 * 6.f * xy * g[15];
  gd[2] += SH_C3_1 * xy * g[10] + SH_C3_2 * 8.f * yz * g[11] +
           SH_C3_3 * (6.f * zz - 3.f * xx - 3.f * yy) * g[12] + SH_C3_4 * 8.f * xz * g[13] +
           SH_C3_5 * (xx - yy) * g[14];
}

// Unit view direction from the camera centre (-R^T t) to the Gaussian: F.normalize(mean - campos).
// Returns the length used for the normalisation.
SW_HD float view_dir(const Camera& cam, const float* mean, float* dir) {
  const float* R = cam.R;
  float v[3];
  for (int j = 0; j < 3; ++j) {
    const float campos = -(R[j] * cam.t[0] + R[3 + j] * cam.t[1] + R[6 + j] * cam.t[2]);
    v[j] = mean[j] - campos;
  }
  const float len = fmaxf(sqrtf(v[0] * v[0] + v[1] * v[1] + v[2] * v[2]), 1e-12f);
  for (int j = 0; j < 3; ++j) dir[j] = v[j] / len;
  return len;
}

// colour = max(sum_k b_k sh_k + 0.5, 0); sh points at one Gaussian's (coeffs, 3) block.
SW_HD void sh_color(int degree, const float* dir, const float* sh, float* color) {
  float b[16];
  sh_basis(degree, dir[0], dir[1], dir[2], b);
  const int k_used = degree_coeffs(degree);
  for (int ch = 0; ch < 3; ++ch) {
    float acc = 0.f;
#pragma unroll
    for (int k = 0; k < 16; ++k)  // constant bounds keep b[] in registers
      if (k < k_used) acc += b[k] * sh[k * 3 + ch];
    color[ch] = fmaxf(acc + 0.5f, 0.f);
  }
}

// Backward of sh_color: writes grad_sh for all `coeffs` coefficients (zeros past the degree's) and adds the
// direction's contribution to grad_mean. grad_sh may be the same memory as sh.
SW_HD void sh_color_bwd(int degree, int coeffs, const float* mean, const Camera& cam, const float* sh,
                        const float* g_color, float* grad_sh, float* grad_mean) {
  float dir[3];
  const float len = view_dir(cam, mean, dir);
  float b[16];
  sh_basis(degree, dir[0], dir[1], dir[2], b);
  const int k_used = degree_coeffs(degree);
  float g_raw[3];
  for (int ch = 0; ch < 3; ++ch) {
    float acc = 0.f;
#pragma unroll
    for (int k = 0; k < 16; ++k)
      if (k < k_used) acc += b[k] * sh[k * 3 + ch];
    g_raw[ch] = acc + 0.5f >= 0.f ? g_color[ch] : 0.f;  // clamp_min passes gradient where v >= min
  }
  float gb[16];
#pragma unroll
  for (int k = 0; k < 16; ++k) {
    gb[k] = 0.f;
    if (k < k_used) {
      for (int ch = 0; ch < 3; ++ch) {
        gb[k] += sh[k * 3 + ch] * g_raw[ch];
        grad_sh[k * 3 + ch] = b[k] * g_raw[ch];  // after the read: grad_sh may overwrite sh in place
      }
    }
  }
  for (int k = k_used; k < coeffs; ++k)
    for (int ch = 0; ch < 3; ++ch) grad_sh[k * 3 + ch] = 0.f;
  float gd[3];
  sh_basis_bwd(degree, dir[0], dir[1], dir[2], gb, gd);
  // d normalize(v) / dv = (I - d d^T) / |v|
  const float dot = gd[0] * dir[0] + gd[1] * dir[1] + gd[2] * dir[2];
  for (int j = 0; j < 3; ++j) grad_mean[j] += (gd[j] - dir[j] * dot) / len;
}

}  // namespace splatwright
