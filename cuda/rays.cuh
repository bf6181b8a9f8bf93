// Blender's image formation: one Gaussian's projection (the reference's project_rays and cuda.py's
// ray_parameters) and its backward. Host-and-device functions, so a CPU can check them (tests/rays_host.cpp).
//
// The splat's frame M = diag(1 / w) Rc^T turns camera-space vectors into its unit frame: Rc = R Rq are its axes
// in camera space, w its scales clamped to at least SCALE_CLAMP of the largest and widened by the film filter's
// share FILM_SPLAT_VARIANCE (in pixels^2, at its depth). Its ray parameters (raster.cuh's Rays) are m = M p, s =
// 1 / z and N0, N1 = M's first two columns over fx and fy; its opacity as drawn is lowered by the widening's
// growth of its projected area; its footprint's rectangle is the silhouette of the ellipsoid out to footprint_t.
#pragma once

#include "projection.cuh"

namespace splatwright {

constexpr int RAY_PARAMS = 10;  // a splat's ray parameters: m (3), s, N0 (3), N1 (3) (raster.cuh's Rays)

// Everything ray_forward computes on the way; ray_backward reads it.
struct RayState {
  float p[3];       // camera-space centre
  float z;          // p[2] if in front, else 1
  bool in_front;
  float mean2d[2];
  float pr[3];      // the centre again from mean2d and z, as the reference makes it (the same point)
  float cu, cv, tx, ty;  // the Jacobian's clamped tangents and z times them
  bool clamped_x, clamped_y;
  float J00, J02, J11, J12;
  float qn[4], qnorm;
  float Rc[9];      // R Rq: the splat's axes in camera space (columns)
  float s[3];       // scales
  int largest;      // the index of the largest scale
  float sc[3];      // clamped scales
  float spread;     // FILM_SPLAT_VARIANCE in camera units^2 at the splat's depth
  float w[3];       // widened scales
  float M[9];       // frame, row-major: M[k][j] = Rc[j][k] / w[k]
  float m[3];       // M pr
  float T[6];       // J Rc diag(sc) (2 x 3)
  float ca, cb, cc, det_c;  // its 2D covariance T T^T
  float wa, wb, wc, det_w;  // widened: + spread J J^T
  float area;       // sqrt(det_c / det_w), 0 where det_c <= 0
};

SW_HD void ray_forward(const Camera& cam, const float* mean, const float* quat, const float* scale, RayState& e) {
  const float* R = cam.R;
  for (int i = 0; i < 3; ++i)
    e.p[i] = R[i * 3 + 0] * mean[0] + R[i * 3 + 1] * mean[1] + R[i * 3 + 2] * mean[2] + cam.t[i];
  e.in_front = e.p[2] > NEAR_PLANE;
  e.z = e.in_front ? e.p[2] : 1.f;
  const float z = e.z;
  e.mean2d[0] = cam.fx * e.p[0] / z + cam.cx;
  e.mean2d[1] = cam.fy * e.p[1] / z + cam.cy;
  e.pr[0] = (e.mean2d[0] - cam.cx) / cam.fx * z;
  e.pr[1] = (e.mean2d[1] - cam.cy) / cam.fy * z;
  e.pr[2] = z;
  const float u_t = e.p[0] / z, v_t = e.p[1] / z;
  e.clamped_x = !(u_t >= -cam.lim_x_neg && u_t <= cam.lim_x_pos);
  e.clamped_y = !(v_t >= -cam.lim_y_neg && v_t <= cam.lim_y_pos);
  e.cu = clampf(u_t, -cam.lim_x_neg, cam.lim_x_pos);
  e.cv = clampf(v_t, -cam.lim_y_neg, cam.lim_y_pos);
  e.tx = z * e.cu;
  e.ty = z * e.cv;
  e.J00 = cam.fx / z;
  e.J02 = -cam.fx * e.tx / (z * z);
  e.J11 = cam.fy / z;
  e.J12 = -cam.fy * e.ty / (z * z);
  e.qnorm = fmaxf(sqrtf(quat[0] * quat[0] + quat[1] * quat[1] + quat[2] * quat[2] + quat[3] * quat[3]), 1e-12f);
  for (int i = 0; i < 4; ++i) e.qn[i] = quat[i] / e.qnorm;
  float Rq[9];
  quat_to_rotmat(e.qn[0], e.qn[1], e.qn[2], e.qn[3], Rq);
  for (int i = 0; i < 3; ++i)
    for (int k = 0; k < 3; ++k)
      e.Rc[i * 3 + k] = R[i * 3] * Rq[k] + R[i * 3 + 1] * Rq[3 + k] + R[i * 3 + 2] * Rq[6 + k];
  e.largest = 0;
  for (int k = 0; k < 3; ++k) {
    e.s[k] = scale[k];
    if (scale[k] > scale[e.largest]) e.largest = k;
  }
  e.spread = FILM_SPLAT_VARIANCE * z * z / (cam.fx * cam.fy);
  for (int k = 0; k < 3; ++k) {
    e.sc[k] = fmaxf(e.s[k], SCALE_CLAMP * e.s[e.largest]);
    e.w[k] = sqrtf(e.sc[k] * e.sc[k] + e.spread);
  }
  for (int k = 0; k < 3; ++k) {
    for (int j = 0; j < 3; ++j) e.M[k * 3 + j] = e.Rc[j * 3 + k] / e.w[k];
    e.m[k] = e.M[k * 3] * e.pr[0] + e.M[k * 3 + 1] * e.pr[1] + e.M[k * 3 + 2] * e.pr[2];
  }
  for (int k = 0; k < 3; ++k) {
    e.T[k] = (e.J00 * e.Rc[k] + e.J02 * e.Rc[6 + k]) * e.sc[k];
    e.T[3 + k] = (e.J11 * e.Rc[3 + k] + e.J12 * e.Rc[6 + k]) * e.sc[k];
  }
  const float* T = e.T;
  e.ca = T[0] * T[0] + T[1] * T[1] + T[2] * T[2];
  e.cb = T[0] * T[3] + T[1] * T[4] + T[2] * T[5];
  e.cc = T[3] * T[3] + T[4] * T[4] + T[5] * T[5];
  e.det_c = e.ca * e.cc - e.cb * e.cb;
  e.wa = e.ca + e.spread * (e.J00 * e.J00 + e.J02 * e.J02);
  e.wb = e.cb + e.spread * e.J02 * e.J12;
  e.wc = e.cc + e.spread * (e.J11 * e.J11 + e.J12 * e.J12);
  e.det_w = e.wa * e.wc - e.wb * e.wb;
  e.area = e.det_c > 0.f ? sqrtf(e.det_c / e.det_w) : 0.f;
}

// The kernels' ray parameters (RAY_PARAMS: m, s, N0, N1).
SW_HD void ray_parameters(const Camera& cam, const RayState& e, float* ray) {
  for (int k = 0; k < 3; ++k) {
    ray[k] = e.m[k];
    ray[4 + k] = e.M[k * 3] / cam.fx;
    ray[7 + k] = e.M[k * 3 + 1] / cam.fy;
  }
  ray[3] = 1.f / e.z;
}

// The footprint's pixel rectangle (u_lo, u_hi, v_lo, v_hi) and radius (0: not drawn) for the opacity as drawn:
// the silhouette of the ellipsoid |M x - m|^2 <= footprint_t, the conic of ray directions d = K^-1 (u, v, 1)
// with matrix C = (M^T m)(M^T m)^T - (|m|^2 - t) M^T M, bounded through its dual (its adjugate: the ratios
// below do not depend on its scale); in double, as the reference. Where the ellipsoid reaches the near plane,
// the whole image.
SW_HD void ray_footprint(const Camera& cam, const RayState& e, float drawn_opacity, float* rect, int& radius) {
  const double t = footprint_t(drawn_opacity);
  double A[9], Am[3], mm = 0.0;
  for (int i = 0; i < 3; ++i) {
    Am[i] = 0.0;
    for (int j = 0; j < 3; ++j) {
      double acc = 0.0;
      for (int k = 0; k < 3; ++k) acc += (double)e.M[k * 3 + i] * (double)e.M[k * 3 + j];
      A[i * 3 + j] = acc;
    }
    for (int k = 0; k < 3; ++k) Am[i] += (double)e.M[k * 3 + i] * (double)e.m[k];
    mm += (double)e.m[i] * (double)e.m[i];
  }
  double C[9];
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j) C[i * 3 + j] = Am[i] * Am[j] - (mm - t) * A[i * 3 + j];
  // In pixels, d = H (u, v, 1), H = K^-1: C' = H^T C H.
  const double fx = cam.fx, fy = cam.fy, cx = cam.cx, cy = cam.cy;
  const double H[9] = {1.0 / fx, 0.0, -cx / fx, 0.0, 1.0 / fy, -cy / fy, 0.0, 0.0, 1.0};
  double CH[9], P[9];
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j) CH[i * 3 + j] = C[i * 3] * H[j] + C[i * 3 + 1] * H[3 + j] + C[i * 3 + 2] * H[6 + j];
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j) P[i * 3 + j] = H[i] * CH[j] + H[3 + i] * CH[3 + j] + H[6 + i] * CH[6 + j];
  double reach = 0.0;  // the ellipsoid's depth extent: sqrt(t sum_k (Rc[2][k] w_k)^2)
  for (int k = 0; k < 3; ++k) reach += ((double)e.Rc[6 + k] * e.w[k]) * ((double)e.Rc[6 + k] * e.w[k]);
  const bool bounded = (double)e.z - sqrt(t * reach) > NEAR_PLANE;
  double box[4] = {0.0, (double)cam.width, 0.0, (double)cam.height};
  if (bounded) {
    // The adjugate of the symmetric P: the entries the bounds read.
    const double D00 = P[4] * P[8] - P[5] * P[7], D11 = P[0] * P[8] - P[2] * P[6];
    const double D22 = P[0] * P[4] - P[1] * P[3];
    const double D02 = P[1] * P[5] - P[2] * P[4], D12 = P[2] * P[3] - P[0] * P[5];
    const double Dii[2] = {D00, D11}, Di2[2] = {D02, D12};
    double found[4];
    for (int i = 0; i < 2; ++i) {
      const double mid = Di2[i] / D22, disc = (Di2[i] * Di2[i] - Dii[i] * D22) / (D22 * D22);
      const double r = sqrt(fmax(disc, 0.0));
      found[2 * i] = mid - r;
      found[2 * i + 1] = mid + r;
    }
    const double sum = found[0] + found[1] + found[2] + found[3];
    if (sum - sum == 0.0)  // finite (inf - inf and NaN are NaN)
      for (int k = 0; k < 4; ++k) box[k] = found[k];
  }
  for (int k = 0; k < 4; ++k) rect[k] = (float)box[k];
  const bool valid = e.in_front && rect[1] > 0.f && rect[0] < cam.width && rect[3] > 0.f && rect[2] < cam.height;
  const float u = e.mean2d[0], v = e.mean2d[1];
  const float half = fminf(fmaxf(fmaxf(fmaxf(u - rect[0], rect[1] - u), fmaxf(v - rect[2], rect[3] - v)), 0.f),
                           (float)(cam.width > cam.height ? cam.width : cam.height));
  radius = valid ? (int)ceilf(half) : 0;
}

// The backward of ray_forward's ray parameters and opacity as drawn (for a Gaussian with radius > 0), given
// their gradients and that of mean2d from the rasterization, which holds the part through m (the centre
// recomputed from mean2d, reaching mean2d: raster.cuh's Rays::store). Adds to grad_mean; writes grad_quat,
// grad_scale and grad_opacity.
SW_HD void ray_backward(const Camera& cam, const RayState& e, float opacity, const float* g_mean2d,
                        const float* g_ray, float g_drawn, float* grad_mean, float* grad_quat, float* grad_scale,
                        float& grad_opacity) {
  const float z = e.z, fx = cam.fx, fy = cam.fy;
  float gM[9], gRc[9] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f}, gsc[3] = {0.f, 0.f, 0.f};
  float g_z = -g_ray[3] / (z * z), g_spread = 0.f;
  // m = M pr; N0 = M[:, 0] / fx; N1 = M[:, 1] / fy
  float gpr[3] = {0.f, 0.f, 0.f};
  for (int k = 0; k < 3; ++k) {
    for (int j = 0; j < 3; ++j) {
      gM[k * 3 + j] = g_ray[k] * e.pr[j];
      gpr[j] += e.M[k * 3 + j] * g_ray[k];
    }
    gM[k * 3] += g_ray[4 + k] / fx;
    gM[k * 3 + 1] += g_ray[7 + k] / fy;
  }
  // M[k][j] = Rc[j][k] / w[k]; w[k] = sqrt(sc[k]^2 + spread)
  for (int k = 0; k < 3; ++k) {
    float g_w = 0.f;
    for (int j = 0; j < 3; ++j) {
      gRc[j * 3 + k] += gM[k * 3 + j] / e.w[k];
      g_w -= gM[k * 3 + j] * e.M[k * 3 + j] / e.w[k];
    }
    gsc[k] += g_w * e.sc[k] / e.w[k];
    g_spread += g_w / (2.f * e.w[k]);
  }
  // drawn = opacity * area, area = sqrt(det_c / det_w)
  grad_opacity = g_drawn * e.area;
  float gJ00 = 0.f, gJ02 = 0.f, gJ11 = 0.f, gJ12 = 0.f;
  if (e.det_c > 0.f) {
    const float g_area = g_drawn * opacity;
    const float g_det_c = g_area * e.area / (2.f * e.det_c), g_det_w = -g_area * e.area / (2.f * e.det_w);
    const float g_wa = g_det_w * e.wc, g_wc = g_det_w * e.wa, g_wb = -2.f * g_det_w * e.wb;
    const float g_ca = g_det_c * e.cc + g_wa, g_cc = g_det_c * e.ca + g_wc, g_cb = -2.f * g_det_c * e.cb + g_wb;
    g_spread += g_wa * (e.J00 * e.J00 + e.J02 * e.J02) + g_wb * e.J02 * e.J12 + g_wc * (e.J11 * e.J11 + e.J12 * e.J12);
    gJ00 += 2.f * e.spread * g_wa * e.J00;
    gJ02 += e.spread * (2.f * g_wa * e.J02 + g_wb * e.J12);
    gJ11 += 2.f * e.spread * g_wc * e.J11;
    gJ12 += e.spread * (2.f * g_wc * e.J12 + g_wb * e.J02);
    // (ca, cb, cc) = (|T0|^2, T0.T1, |T1|^2); T[r][k] = (J Rc)[r][k] sc[k]
    for (int k = 0; k < 3; ++k) {
      const float gT0 = 2.f * g_ca * e.T[k] + g_cb * e.T[3 + k], gT1 = g_cb * e.T[k] + 2.f * g_cc * e.T[3 + k];
      gJ00 += gT0 * e.Rc[k] * e.sc[k];
      gJ02 += gT0 * e.Rc[6 + k] * e.sc[k];
      gJ11 += gT1 * e.Rc[3 + k] * e.sc[k];
      gJ12 += gT1 * e.Rc[6 + k] * e.sc[k];
      gRc[k] += gT0 * e.J00 * e.sc[k];
      gRc[6 + k] += (gT0 * e.J02 + gT1 * e.J12) * e.sc[k];
      gRc[3 + k] += gT1 * e.J11 * e.sc[k];
      gsc[k] += gT0 * (e.J00 * e.Rc[k] + e.J02 * e.Rc[6 + k]) + gT1 * (e.J11 * e.Rc[3 + k] + e.J12 * e.Rc[6 + k]);
    }
  }
  // spread = FILM_SPLAT_VARIANCE z^2 / (fx fy)
  g_z += g_spread * 2.f * FILM_SPLAT_VARIANCE * z / (fx * fy);
  // sc[k] = max(s[k], SCALE_CLAMP s[largest])
  for (int k = 0; k < 3; ++k) grad_scale[k] = 0.f;
  for (int k = 0; k < 3; ++k) {
    if (e.s[k] >= SCALE_CLAMP * e.s[e.largest]) grad_scale[k] += gsc[k];
    else grad_scale[e.largest] += SCALE_CLAMP * gsc[k];
  }
  // Rc = R Rq -> the unit quaternion -> the raw one
  const float* R = cam.R;
  float g[9];
  for (int i = 0; i < 3; ++i)
    for (int k = 0; k < 3; ++k) g[i * 3 + k] = R[i] * gRc[k] + R[3 + i] * gRc[3 + k] + R[6 + i] * gRc[6 + k];
  const float w = e.qn[0], x = e.qn[1], y = e.qn[2], qz = e.qn[3];
  float gq[4];
  gq[0] = 2.f * (-qz * g[1] + y * g[2] + qz * g[3] - x * g[5] - y * g[6] + x * g[7]);
  gq[1] = 2.f * (y * g[1] + qz * g[2] + y * g[3] - 2.f * x * g[4] - w * g[5] + qz * g[6] + w * g[7] - 2.f * x * g[8]);
  gq[2] = 2.f * (-2.f * y * g[0] + x * g[1] + w * g[2] + x * g[3] + qz * g[5] - w * g[6] + qz * g[7] - 2.f * y * g[8]);
  gq[3] = 2.f * (-2.f * qz * g[0] - w * g[1] + x * g[2] + w * g[3] - 2.f * qz * g[4] + y * g[5] + x * g[6] + y * g[7]);
  const float dot = gq[0] * w + gq[1] * x + gq[2] * y + gq[3] * qz;
  for (int i = 0; i < 4; ++i) grad_quat[i] = (gq[i] - e.qn[i] * dot) / e.qnorm;
  // pr = ((u - cx) / fx z, (v - cy) / fy z, z): its part through mean2d is in g_mean2d already
  g_z += gpr[0] * (e.mean2d[0] - cam.cx) / fx + gpr[1] * (e.mean2d[1] - cam.cy) / fy + gpr[2];
  // J (the reference's perspective_jacobian) and mean2d = (fx x / z + cx, fy y / z + cy) from p
  const float iz = 1.f / z, iz2 = iz * iz, iz3 = iz2 * iz;
  float gp[3];
  gp[0] = g_mean2d[0] * fx * iz;
  gp[1] = g_mean2d[1] * fy * iz;
  gp[2] = g_z - g_mean2d[0] * fx * e.p[0] * iz2 - g_mean2d[1] * fy * e.p[1] * iz2 - gJ00 * fx * iz2 -
          gJ11 * fy * iz2 + 2.f * gJ02 * fx * e.tx * iz3 + 2.f * gJ12 * fy * e.ty * iz3;
  const float g_tx = -gJ02 * fx * iz2, g_ty = -gJ12 * fy * iz2;
  if (e.clamped_x) gp[2] += g_tx * e.cu;
  else gp[0] += g_tx;
  if (e.clamped_y) gp[2] += g_ty * e.cv;
  else gp[1] += g_ty;
  for (int j = 0; j < 3; ++j) grad_mean[j] += R[j] * gp[0] + R[3 + j] * gp[1] + R[6 + j] * gp[2];
}

// sRGB decoding (formation.srgb_to_linear) of a colour in [0, inf) and its derivative.
SW_HD float srgb_to_linear(float c) {
  return c <= 0.04045f ? c / 12.92f : powf((c + 0.055f) / 1.055f, 2.4f);
}
SW_HD float srgb_to_linear_slope(float c) {
  return c <= 0.04045f ? 1.f / 12.92f : 2.4f / 1.055f * powf((c + 0.055f) / 1.055f, 1.4f);
}

}  // namespace splatwright
