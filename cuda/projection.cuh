// Per-Gaussian projection math shared by projection_fwd.cu and projection_bwd.cu: EWA projection of a 3D
// Gaussian to a screen-space conic, the tiles its footprint meets, SH colour, and their backward.
// Host-and-device functions, so the formulas can also be checked on a CPU.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "constants.h"

#if defined(__CUDACC__)
#define SW_HD __host__ __device__ __forceinline__
#else
#define SW_HD inline
#endif

namespace splatwright {

// World-to-camera rotation R (row-major) and translation t, pinhole intrinsics, and the limits of the
// Jacobian clamp (tangent space, the reference's lim_x_neg/pos, lim_y_neg/pos).
struct Camera {
  float R[9];
  float t[3];
  float fx, fy, cx, cy;
  float lim_x_neg, lim_x_pos, lim_y_neg, lim_y_pos;
  int width, height;
};

// margin_x = float(0.3 * width) and margin_y likewise, computed on the host in double as the reference
// does with Python floats.
SW_HD Camera load_camera(const float* viewmat, const float* K, int width, int height, float margin_x,
                         float margin_y) {
  Camera c;
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < 3; ++j) c.R[i * 3 + j] = viewmat[i * 4 + j];
    c.t[i] = viewmat[i * 4 + 3];
  }
  c.fx = K[0];
  c.fy = K[4];
  c.cx = K[2];
  c.cy = K[5];
  c.lim_x_pos = (width - c.cx) / c.fx + margin_x / c.fx;
  c.lim_x_neg = c.cx / c.fx + margin_x / c.fx;
  c.lim_y_pos = (height - c.cy) / c.fy + margin_y / c.fy;
  c.lim_y_neg = c.cy / c.fy + margin_y / c.fy;
  c.width = width;
  c.height = height;
  return c;
}

SW_HD void quat_to_rotmat(float w, float x, float y, float z, float* R) {
  R[0] = 1.f - 2.f * (y * y + z * z);
  R[1] = 2.f * (x * y - w * z);
  R[2] = 2.f * (x * z + w * y);
  R[3] = 2.f * (x * y + w * z);
  R[4] = 1.f - 2.f * (x * x + z * z);
  R[5] = 2.f * (y * z - w * x);
  R[6] = 2.f * (x * z - w * y);
  R[7] = 2.f * (y * z + w * x);
  R[8] = 1.f - 2.f * (x * x + y * y);
}

// Everything the forward computes on the way to the conic; the backward recomputes it.
struct EwaState {
  float p[3];         // camera-space centre
  float z;            // p[2] if in front, else 1 (the reference's z_safe)
  bool in_front;
  float u_t, v_t;     // x / z and y / z before the clamp
  bool clamped_x, clamped_y;
  float cu, cv;       // clamped tangents
  float tx, ty;       // z * clamped tangent
  float J00, J02, J11, J12;
  float W[6];         // J R (2 x 3)
  float qn[4];        // unit quaternion
  float qnorm;
  float Rq[9];        // rotation of the unit quaternion
  float s[3];
  float T[6];         // J R Rq diag(s) (2 x 3)
  float a, b, c, det; // 2D covariance + dilation, and its determinant
};

SW_HD float clampf(float v, float lo, float hi) { return fminf(fmaxf(v, lo), hi); }

SW_HD void ewa_forward(const Camera& cam, const float* mean, const float* quat, const float* scale, EwaState& e) {
  const float* R = cam.R;
  for (int i = 0; i < 3; ++i)
    e.p[i] = R[i * 3 + 0] * mean[0] + R[i * 3 + 1] * mean[1] + R[i * 3 + 2] * mean[2] + cam.t[i];
  e.in_front = e.p[2] > NEAR_PLANE;
  e.z = e.in_front ? e.p[2] : 1.f;
  const float z = e.z;
  e.u_t = e.p[0] / z;
  e.v_t = e.p[1] / z;
  // torch.clamp passes gradient where lo <= v <= hi
  e.clamped_x = !(e.u_t >= -cam.lim_x_neg && e.u_t <= cam.lim_x_pos);
  e.clamped_y = !(e.v_t >= -cam.lim_y_neg && e.v_t <= cam.lim_y_pos);
  e.cu = clampf(e.u_t, -cam.lim_x_neg, cam.lim_x_pos);
  e.cv = clampf(e.v_t, -cam.lim_y_neg, cam.lim_y_pos);
  e.tx = z * e.cu;
  e.ty = z * e.cv;
  e.J00 = cam.fx / z;
  e.J02 = -cam.fx * e.tx / (z * z);
  e.J11 = cam.fy / z;
  e.J12 = -cam.fy * e.ty / (z * z);
  for (int j = 0; j < 3; ++j) {
    e.W[j] = e.J00 * R[j] + e.J02 * R[6 + j];
    e.W[3 + j] = e.J11 * R[3 + j] + e.J12 * R[6 + j];
  }
  // F.normalize: q / max(|q|, 1e-12)
  e.qnorm = fmaxf(sqrtf(quat[0] * quat[0] + quat[1] * quat[1] + quat[2] * quat[2] + quat[3] * quat[3]), 1e-12f);
  for (int i = 0; i < 4; ++i) e.qn[i] = quat[i] / e.qnorm;
  quat_to_rotmat(e.qn[0], e.qn[1], e.qn[2], e.qn[3], e.Rq);
  for (int i = 0; i < 3; ++i) e.s[i] = scale[i];
  for (int r = 0; r < 2; ++r)
    for (int k = 0; k < 3; ++k)
      e.T[r * 3 + k] =
          (e.W[r * 3 + 0] * e.Rq[k] + e.W[r * 3 + 1] * e.Rq[3 + k] + e.W[r * 3 + 2] * e.Rq[6 + k]) * e.s[k];
  const float* T = e.T;
  e.a = T[0] * T[0] + T[1] * T[1] + T[2] * T[2] + DILATION;
  e.b = T[0] * T[3] + T[1] * T[4] + T[2] * T[5];
  e.c = T[3] * T[3] + T[4] * T[4] + T[5] * T[5] + DILATION;
  e.det = e.a * e.c - e.b * e.b;
}

// A splat's footprint is the ellipse d^T conic d <= sigmas^2 around its centre: the pixels it is drawn on,
// where alpha >= ALPHA_MIN and at most RADIUS_SIGMAS deviations out (sample_splat in raster.cuh). The tiles and
// the pixel blocks a splat is listed in must hold every such pixel; they are found with footprint_t, which
// raises sigmas^2 by 1% and 0.01, far more than the float error of these tests and of the pixel's.
SW_HD float footprint_sigmas(float opacity) {
  return fminf(RADIUS_SIGMAS, sqrtf(2.f * logf(fmaxf(opacity / ALPHA_MIN, 1.f))));
}

SW_HD float footprint_t(float opacity) {
  const float sigmas = footprint_sigmas(opacity);
  return 1.01f * sigmas * sigmas + 1e-2f;
}

// Whether the ellipse A dx^2 + 2 B dx dy + C dy^2 <= t (D = A C - B^2) is too thin for ellipse_band's formulas,
// whose determinant then cancels: such a splat is given its whole square.
SW_HD bool thin_ellipse(float A, float C, float D) { return !(A > 0.f && C > 0.f && D > 1e-4f * A * C); }

// The x-extent [x_lo, x_hi] (from the centre) of that ellipse over the band of dy in [lo, hi]; false where the
// band misses it. Its slice at dy spans x_left(dy) .. x_right(dy), x_right concave and x_left convex in dy, so
// their extremes over the band are at the extreme points' dy clamped into it.
SW_HD bool ellipse_band(float A, float B, float C, float D, float t, float lo, float hi, float& x_lo, float& x_hi) {
  const float y_reach = sqrtf(A * t / D);  // |dy| on the ellipse
  lo = fmaxf(lo, -y_reach);
  hi = fminf(hi, y_reach);
  if (lo > hi) return false;
  const float dy_right = -B * sqrtf(t / (C * D));  // dy of the rightmost point (leftmost: -dy_right)
  const float dr = fminf(fmaxf(dy_right, lo), hi), dl = fminf(fmaxf(-dy_right, lo), hi);
  x_hi = (-B * dr + sqrtf(fmaxf(A * t - D * dr * dr, 0.f))) / A;
  x_lo = (-B * dl - sqrtf(fmaxf(A * t - D * dl * dl, 0.f))) / A;
  return true;
}

// Half-open tile range [x_lo, x_hi) x [y_lo, y_hi) covered by a footprint of radius r around (u, v).
SW_HD void tile_rect(float u, float v, int radius, int width, int height, int& x_lo, int& x_hi, int& y_lo,
                     int& y_hi) {
  const float tiles_x = (float)((width + TILE - 1) / TILE);
  const float tiles_y = (float)((height + TILE - 1) / TILE);
  const float r = (float)radius;
  x_lo = (int)clampf(floorf((u - r) / TILE), 0.f, tiles_x);
  x_hi = (int)clampf(floorf((u + r) / TILE) + 1.f, 0.f, tiles_x);
  y_lo = (int)clampf(floorf((v - r) / TILE), 0.f, tiles_y);
  y_hi = (int)clampf(floorf((v + r) / TILE) + 1.f, 0.f, tiles_y);
}

// The columns [c_lo, c_hi) of tile row `row` that the footprint of a splat at (u, v) with conic (A, B, C) and
// footprint_t t meets, within the columns [x_lo, x_hi) of its square.
SW_HD void footprint_row(float u, float v, float A, float B, float C, float t, int row, int x_lo, int x_hi, int& c_lo,
                         int& c_hi) {
  const float D = A * C - B * B;
  c_lo = x_lo;
  c_hi = x_hi;
  if (thin_ellipse(A, C, D)) return;
  float left, right;
  const float band_lo = (float)(row * TILE) - v;
  if (!ellipse_band(A, B, C, D, t, band_lo, band_lo + (float)TILE, left, right)) {
    c_hi = c_lo;
    return;
  }
  const int first = (int)floorf((u + left) / TILE), end = (int)floorf((u + right) / TILE) + 1;
  if (first > c_lo) c_lo = first;
  if (end < c_hi) c_hi = end;
  if (c_hi < c_lo) c_hi = c_lo;
}

// A splat's tiles: those of its square's rows (tile_rect) that its footprint meets (footprint_row), in
// row-major order. Binning counts them and finds each entry's tile with it.
struct FootprintTiles {
  float u, v, A, B, C, t;
  int x_lo, x_hi, y_lo, y_hi, tiles_x;

  SW_HD FootprintTiles(float u, float v, const float* conic, float opacity, int radius, int width, int height)
      : u(u), v(v), A(conic[0]), B(conic[1]), C(conic[2]), t(footprint_t(opacity)),
        tiles_x((width + TILE - 1) / TILE) {
    tile_rect(u, v, radius, width, height, x_lo, x_hi, y_lo, y_hi);
  }

  SW_HD void row(int y, int& c_lo, int& c_hi) const { footprint_row(u, v, A, B, C, t, y, x_lo, x_hi, c_lo, c_hi); }

  SW_HD int count() const {
    int n = 0;
    for (int y = y_lo; y < y_hi; ++y) {
      int c_lo, c_hi;
      row(y, c_lo, c_hi);
      n += c_hi - c_lo;
    }
    return n;
  }

  // Column c of row y as a tile number, kept inside the square (see each_tile).
  SW_HD int tile_at(int y, int c) const { return y * tiles_x + (c < x_hi ? c : x_hi - 1); }

  // Calls emit(j, tile) for j = 0 .. count - 1 with the tiles in row-major order. The last row takes whatever
  // the rows before leave, so that exactly `count` (count()'s result) tiles are listed even where this walk and
  // count(), compiled into different kernels, round a row differently.
  template <typename Emit>
  SW_HD void each_tile(int count, Emit&& emit) const {
    int j = 0;
    for (int y = y_lo; j < count; ++y) {
      int c_lo, c_hi;
      row(y, c_lo, c_hi);
      const int row_end = y + 1 >= y_hi || count - j < c_hi - c_lo ? count : j + c_hi - c_lo;
      for (int c = c_lo; j < row_end; ++c, ++j) emit(j, tile_at(y, c));
    }
  }
};

// Screen-space centre, conic and radius (0 when culled) of one Gaussian: the radius bounds its footprint's
// major axis, so the square of that radius holds the footprint (binning lists only the footprint's tiles).
SW_HD void project_gaussian(const Camera& cam, const float* mean, const float* quat, const float* scale,
                            float opacity, EwaState& e, float* mean2d, float* conic, int& radius) {
  ewa_forward(cam, mean, quat, scale, e);
  mean2d[0] = cam.fx * e.p[0] / e.z + cam.cx;
  mean2d[1] = cam.fy * e.p[1] / e.z + cam.cy;
  radius = 0;
  conic[0] = conic[1] = conic[2] = 0.f;
  if (!(e.in_front && e.det > 0.f)) return;
  conic[0] = e.c / e.det;
  conic[1] = -e.b / e.det;
  conic[2] = e.a / e.det;
  const float mid = 0.5f * (e.a + e.c);
  const float lambda_max = mid + sqrtf(fmaxf(mid * mid - e.det, 0.1f));
  const int r = (int)ceilf(footprint_sigmas(opacity) * sqrtf(lambda_max));
  int x_lo, x_hi, y_lo, y_hi;
  tile_rect(mean2d[0], mean2d[1], r, cam.width, cam.height, x_lo, x_hi, y_lo, y_hi);
  if (r > 0 && x_hi > x_lo && y_hi > y_lo) radius = r;
}

// Backward of project_gaussian's mean2d and conic (for a Gaussian with radius > 0): accumulates into
// grad_mean (3) and writes grad_quat (4) and grad_scale (3).
SW_HD void project_gaussian_bwd(const Camera& cam, const EwaState& e, const float* g_mean2d, const float* g_conic,
                                float* grad_mean, float* grad_quat, float* grad_scale) {
  const float a = e.a, b = e.b, c = e.c;
  const float id = 1.f / e.det, id2 = id * id;
  // conic = (c, -b, a) / det
  const float ga = g_conic[0] * (-c * c * id2) + g_conic[1] * (b * c * id2) + g_conic[2] * (id - a * c * id2);
  const float gb = g_conic[0] * (2.f * b * c * id2) + g_conic[1] * (-id - 2.f * b * b * id2) +
                   g_conic[2] * (2.f * a * b * id2);
  const float gc = g_conic[0] * (id - a * c * id2) + g_conic[1] * (a * b * id2) + g_conic[2] * (-a * a * id2);
  // cov = T T^T; a, b, c read cov[0][0], cov[0][1], cov[1][1]
  float gT[6];
  for (int k = 0; k < 3; ++k) {
    gT[k] = 2.f * ga * e.T[k] + gb * e.T[3 + k];
    gT[3 + k] = gb * e.T[k] + 2.f * gc * e.T[3 + k];
  }
  // T = W M with M = Rq diag(s)
  float gW[6], gRq[9];
  for (int r = 0; r < 2; ++r)
    for (int j = 0; j < 3; ++j) {
      float acc = 0.f;
      for (int k = 0; k < 3; ++k) acc += gT[r * 3 + k] * e.Rq[j * 3 + k] * e.s[k];
      gW[r * 3 + j] = acc;
    }
  for (int k = 0; k < 3; ++k) {
    float gs = 0.f;
    for (int j = 0; j < 3; ++j) {
      const float gM = e.W[j] * gT[k] + e.W[3 + j] * gT[3 + k];
      gs += gM * e.Rq[j * 3 + k];
      gRq[j * 3 + k] = gM * e.s[k];
    }
    grad_scale[k] = gs;
  }
  // rotation matrix -> unit quaternion -> raw quaternion
  const float w = e.qn[0], x = e.qn[1], y = e.qn[2], z = e.qn[3];
  const float* g = gRq;
  float gq[4];
  gq[0] = 2.f * (-z * g[1] + y * g[2] + z * g[3] - x * g[5] - y * g[6] + x * g[7]);
  gq[1] = 2.f * (y * g[1] + z * g[2] + y * g[3] - 2.f * x * g[4] - w * g[5] + z * g[6] + w * g[7] - 2.f * x * g[8]);
  gq[2] = 2.f * (-2.f * y * g[0] + x * g[1] + w * g[2] + x * g[3] + z * g[5] - w * g[6] + z * g[7] - 2.f * y * g[8]);
  gq[3] = 2.f * (-2.f * z * g[0] - w * g[1] + x * g[2] + w * g[3] - 2.f * z * g[4] + y * g[5] + x * g[6] + y * g[7]);
  const float dot = gq[0] * w + gq[1] * x + gq[2] * y + gq[3] * z;
  for (int i = 0; i < 4; ++i) grad_quat[i] = (gq[i] - e.qn[i] * dot) / e.qnorm;
  // W = J R
  const float* R = cam.R;
  const float gJ00 = gW[0] * R[0] + gW[1] * R[1] + gW[2] * R[2];
  const float gJ02 = gW[0] * R[6] + gW[1] * R[7] + gW[2] * R[8];
  const float gJ11 = gW[3] * R[3] + gW[4] * R[4] + gW[5] * R[5];
  const float gJ12 = gW[3] * R[6] + gW[4] * R[7] + gW[5] * R[8];
  // J = [[fx/z, 0, -fx tx/z^2], [0, fy/z, -fy ty/z^2]], tx = z clamp(x/z); mean2d = (fx x/z + cx, fy y/z + cy)
  const float zz = e.z, iz = 1.f / zz, iz2 = iz * iz, iz3 = iz2 * iz;
  float gp[3];
  gp[0] = g_mean2d[0] * cam.fx * iz;
  gp[1] = g_mean2d[1] * cam.fy * iz;
  gp[2] = -g_mean2d[0] * cam.fx * e.p[0] * iz2 - g_mean2d[1] * cam.fy * e.p[1] * iz2 - gJ00 * cam.fx * iz2 -
          gJ11 * cam.fy * iz2 + 2.f * gJ02 * cam.fx * e.tx * iz3 + 2.f * gJ12 * cam.fy * e.ty * iz3;
  const float g_tx = -gJ02 * cam.fx * iz2;
  const float g_ty = -gJ12 * cam.fy * iz2;
  // unclamped: tx = x exactly (its z terms cancel); clamped: tx = z * limit, no gradient to x
  if (e.clamped_x) gp[2] += g_tx * e.cu;
  else gp[0] += g_tx;
  if (e.clamped_y) gp[2] += g_ty * e.cv;
  else gp[1] += g_ty;
  // p = R mean + t
  for (int j = 0; j < 3; ++j) grad_mean[j] += R[j] * gp[0] + R[3 + j] * gp[1] + R[6 + j] * gp[2];
}

// SH coefficients are staged through shared memory: a thread per Gaussian reading its own 48 floats straight
// from global memory makes every warp access 32 rows 192 bytes apart, which is several times slower than
// copying the block's contiguous rows with whole warps. Rows are padded to an odd stride against bank
// conflicts.
constexpr int PROJ_THREADS = 128;
constexpr int LOADS_IN_FLIGHT = 8;  // 16-byte loads each thread issues before storing any of them

// The launch shape of the projection's kernels, a thread per Gaussian: the blocks, and the shared memory that
// holds a block's SH rows, each sh_row_stride floats (odd, against bank conflicts).
SW_HD int sh_row_stride(int sh_coeffs) { return (sh_coeffs * 3) | 1; }
// The SH coefficients a degree reads.
SW_HD int degree_coeffs(int sh_degree) { return (sh_degree + 1) * (sh_degree + 1); }
inline int projection_blocks(int n) { return (n + PROJ_THREADS - 1) / PROJ_THREADS; }
inline size_t sh_rows_bytes(int sh_coeffs) { return sizeof(float) * PROJ_THREADS * sh_row_stride(sh_coeffs); }

#if defined(__CUDACC__)
// Copies the block's rows between global memory, where they lie contiguous (row_len floats each), and shared
// memory, where each takes stride floats: global to shared where TO_SHARED, else back. The rows are copied as
// one flat array, 16 bytes a thread at a time where the global array is 16-byte aligned, the rest a float at a
// time. Global loads go LOADS_IN_FLIGHT at a time before their stores, so that they overlap; the other way,
// one at a time (more in flight took the projection backward from 80 registers to 128).
template <bool TO_SHARED>
__device__ __forceinline__ void copy_rows(float* smem, std::conditional_t<TO_SHARED, const float*, float*> global,
                                          int rows, int row_len, int stride) {
  constexpr int IN_FLIGHT = TO_SHARED ? LOADS_IN_FLIGHT : 1;
  const int n = rows * row_len;
  // The shared-memory positions of the four floats at flat position 4q.
  auto quad = [&](int q, int (&at)[4]) {
    int row = (4 * q) / row_len, col = 4 * q - row * row_len;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      at[k] = row * stride + col;
      if (++col == row_len) col = 0, ++row;
    }
  };
  int done = 0;
  if ((reinterpret_cast<uintptr_t>(global) & 15u) == 0) {
    const int n4 = n >> 2;
    for (int q0 = threadIdx.x; q0 < n4; q0 += IN_FLIGHT * blockDim.x) {
      float4 v[IN_FLIGHT];
#pragma unroll
      for (int u = 0; u < IN_FLIGHT; ++u) {
        const int q = q0 + u * blockDim.x;
        if (q >= n4) continue;
        if constexpr (TO_SHARED) {
          v[u] = reinterpret_cast<const float4*>(global)[q];
        } else {
          int at[4];
          quad(q, at);
          v[u] = make_float4(smem[at[0]], smem[at[1]], smem[at[2]], smem[at[3]]);
        }
      }
#pragma unroll
      for (int u = 0; u < IN_FLIGHT; ++u) {
        const int q = q0 + u * blockDim.x;
        if (q >= n4) continue;
        if constexpr (TO_SHARED) {
          int at[4];
          quad(q, at);
          smem[at[0]] = v[u].x;
          smem[at[1]] = v[u].y;
          smem[at[2]] = v[u].z;
          smem[at[3]] = v[u].w;
        } else {
          reinterpret_cast<float4*>(global)[q] = v[u];
        }
      }
    }
    done = n4 << 2;
  }
  for (int i = done + threadIdx.x; i < n; i += blockDim.x) {
    float& shared = smem[(i / row_len) * stride + i % row_len];
    if constexpr (TO_SHARED) shared = global[i];
    else global[i] = shared;
  }
}

__device__ __forceinline__ void load_rows(float* smem, const float* global, int rows, int row_len, int stride) {
  copy_rows<true>(smem, global, rows, row_len, stride);
}

__device__ __forceinline__ void store_rows(float* global, float* smem, int rows, int row_len, int stride) {
  copy_rows<false>(smem, global, rows, row_len, stride);
}

// The SH rows of Gaussians first .. first + rows - 1 from their two parts in global memory (head_coeffs and
// tail_coeffs coefficients a row, as GaussianArgs holds them) into shared memory, one row of stride floats each,
// the head's coefficients first; the tail only where the coefficients sh_degree reads reach into it.
__device__ __forceinline__ void load_sh_rows(float* smem, const float* head, const float* tail, int head_coeffs,
                                             int tail_coeffs, int sh_degree, int first, int rows, int stride) {
  load_rows(smem, head + (size_t)first * head_coeffs * 3, rows, head_coeffs * 3, stride);
  if (degree_coeffs(sh_degree) > head_coeffs)
    load_rows(smem + head_coeffs * 3, tail + (size_t)first * tail_coeffs * 3, rows, tail_coeffs * 3, stride);
}

// The other way, whole rows: shared memory's rows back to the two parts.
__device__ __forceinline__ void store_sh_rows(float* head, float* tail, float* smem, int head_coeffs,
                                              int tail_coeffs, int first, int rows, int stride) {
  store_rows(head + (size_t)first * head_coeffs * 3, smem, rows, head_coeffs * 3, stride);
  if (tail_coeffs > 0)
    store_rows(tail + (size_t)first * tail_coeffs * 3, smem + head_coeffs * 3, rows, tail_coeffs * 3, stride);
}
#endif

}  // namespace splatwright
