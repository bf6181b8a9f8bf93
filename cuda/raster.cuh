// Splat evaluation shared by rasterize_fwd.cu and rasterize_bwd.cu, so both make the same decisions: each image
// formation's splats (Conics, the standard formation's; Rays, Blender's) as the two passes stage, sample and
// differentiate them.
#pragma once

#include <cstdint>

#include "constants.h"
#include "projection.cuh"
#include "splatwright.h"

namespace splatwright {

// Each warp of a tile's block takes a WARP_W x WARP_H block of the tile's pixels, so that a small splat misses
// most warps' blocks and those warps skip it without evaluating it (see warp_mask).
constexpr int WARP_W = 8, WARP_H = 4;
constexpr int WARPS_X = TILE / WARP_W;
constexpr int TILE_WARPS = BLOCK_SIZE / 32;
static_assert(WARP_W * WARP_H == 32 && TILE % WARP_W == 0 && TILE % WARP_H == 0, "warps tile the tile");
// The kernels keep each splat's warp mask and each batch position in a byte.
static_assert(TILE_WARPS <= 8 && BLOCK_SIZE <= 256, "warp masks and batch positions fit a byte");

// The pixel (x, y) within its tile that thread `thread` of the block handles.
__device__ __forceinline__ void tile_pixel(int thread, int& x, int& y) {
  const int lane = thread & 31, warp = thread >> 5;
  x = (warp % WARPS_X) * WARP_W + (lane % WARP_W);
  y = (warp / WARPS_X) * WARP_H + (lane / WARP_W);
}

// Opacity-weighted Gaussian at pixel centre (px, py): alpha = min(ALPHA_MAX, opacity * exp(power)).
// Returns false where the splat is skipped: outside its footprint (alpha < ALPHA_MIN, or beyond RADIUS_SIGMAS
// deviations), or power > 0.
struct SplatSample {
  float dx, dy;   // pixel centre - splat centre
  float gauss;    // exp(power)
  float raw;      // opacity * exp(power), before the cap
  float alpha;
};

__device__ __forceinline__ bool sample_splat(float2 xy, float4 conic_opacity, float px, float py, SplatSample& s) {
  s.dx = px - xy.x;
  s.dy = py - xy.y;
  const float power = -0.5f * (conic_opacity.x * s.dx * s.dx + conic_opacity.z * s.dy * s.dy) -
                      conic_opacity.y * s.dx * s.dy;
  if (power > 0.f || power < -0.5f * RADIUS_SIGMAS * RADIUS_SIGMAS) return false;
  s.gauss = __expf(power);
  s.raw = conic_opacity.w * s.gauss;
  s.alpha = fminf(ALPHA_MAX, s.raw);
  return s.alpha >= ALPHA_MIN;
}

// Bit w set where warp w's block of pixels (tile origin x0, y0) meets the splat's footprint (footprint_t):
// for each band of WARP_H rows, the footprint's x-extent over it, against each block's columns; a thin
// ellipse sets every bit.
__device__ __forceinline__ uint32_t warp_mask(float2 xy, float4 conic_opacity, float x0, float y0) {
  constexpr uint32_t ALL = (1u << TILE_WARPS) - 1u;
  if (conic_opacity.w < ALPHA_MIN) return 0u;
  const float A = conic_opacity.x, B = conic_opacity.y, C = conic_opacity.z;
  const float D = A * C - B * B;
  if (thin_ellipse(A, C, D)) return ALL;
  const float t = footprint_t(conic_opacity.w);
  uint32_t mask = 0u;
#pragma unroll
  for (int row = 0; row < TILE / WARP_H; ++row) {
    float left, right;
    if (!ellipse_band(A, B, C, D, t, y0 + row * WARP_H - xy.y, y0 + (row + 1) * WARP_H - xy.y, left, right)) continue;
    const float x_lo = xy.x + left, x_hi = xy.x + right;
#pragma unroll
    for (int col = 0; col < WARPS_X; ++col)
      if (x_lo <= x0 + (col + 1) * WARP_W && x_hi >= x0 + col * WARP_W) mask |= 1u << (row * WARPS_X + col);
  }
  return mask;
}

// Bit w set where warp w's block of pixels (tile origin x0, y0) meets the pixel rectangle rect (u_lo, u_hi,
// v_lo, v_hi) of a splat's footprint.
__device__ __forceinline__ uint32_t rect_warp_mask(float4 rect, float opacity, float x0, float y0) {
  if (opacity < ALPHA_MIN) return 0u;
  uint32_t mask = 0u;
#pragma unroll
  for (int row = 0; row < TILE / WARP_H; ++row) {
    if (rect.z > y0 + (row + 1) * WARP_H || rect.w < y0 + row * WARP_H) continue;
#pragma unroll
    for (int col = 0; col < WARPS_X; ++col)
      if (rect.x <= x0 + (col + 1) * WARP_W && rect.y >= x0 + col * WARP_W) mask |= 1u << (row * WARPS_X + col);
  }
  return mask;
}

// The standard formation's splats: screen-space ellipses (means2d, conics), composited in the order of their
// centres' depths. Entry gradients: d/d(mean x, mean y, conic a, b, c, red, green, blue, opacity).
struct Conics {
  static constexpr int GRADS = 9, COLOR = 5, OPACITY = 8;
  static constexpr int BWD_BLOCKS = 8;  // the backward's blocks an SM (rasterize_bwd.cu's CHUNK says why)
  using Sample = SplatSample;
  struct Shared {
    float2 xy[BLOCK_SIZE];
    float4 conic_opacity[BLOCK_SIZE];
    float4 color_depth[BLOCK_SIZE];
  };

  // Stages splat g as the batch's j-th; returns its warp mask.
  __device__ static uint32_t stage(Shared& sh, int j, const RasterArgs& r, int g, float x0, float y0) {
    const float2 xy = reinterpret_cast<const float2*>(r.means2d)[g];
    const float4 conic_opacity = make_float4(r.conics[3 * g], r.conics[3 * g + 1], r.conics[3 * g + 2], r.opacities[g]);
    sh.xy[j] = xy;
    sh.conic_opacity[j] = conic_opacity;
    sh.color_depth[j] = make_float4(r.colors[3 * g], r.colors[3 * g + 1], r.colors[3 * g + 2], r.depths[g]);
    return warp_mask(xy, conic_opacity, x0, y0);
  }

  __device__ static bool sample(const Shared& sh, int j, float px, float py, Sample& s) {
    return sample_splat(sh.xy[j], sh.conic_opacity[j], px, py, s);
  }

  // Colour (x, y, z) and depth (w) the sample composites.
  __device__ static float4 color_depth(const Shared& sh, int j, const Sample&) { return sh.color_depth[j]; }

  // Adds the sample's gradients w.r.t. the splat's shape and opacity to v, given dL/d(alpha) below the cap.
  __device__ static void add_shape_grads(const Shared& sh, int j, const Sample& s, float g_alpha, float* v) {
    const float4 co = sh.conic_opacity[j];
    const float g_power = g_alpha * s.raw;  // d(opacity exp(power))/d power
    v[8] += g_alpha * s.gauss;
    v[0] += g_power * (co.x * s.dx + co.y * s.dy);  // dpower/dmean = -dpower/d(dx, dy)
    v[1] += g_power * (co.z * s.dy + co.y * s.dx);
    v[2] -= 0.5f * g_power * s.dx * s.dx;
    v[3] -= g_power * s.dx * s.dy;
    v[4] -= 0.5f * g_power * s.dy * s.dy;
  }

  // Gaussian i's summed entry gradients into the outputs: grads.shapes is (n, 3), the conics'.
  __device__ static void store(int i, const float* total, const RasterArgs&, const SplatGrads& grads) {
    for (int k = 0; k < 2; ++k) grads.means2d[2 * i + k] = total[k];
    for (int k = 0; k < 3; ++k) grads.shapes[3 * i + k] = total[2 + k];
    for (int k = 0; k < 3; ++k) grads.colors[3 * i + k] = total[COLOR + k];
    grads.opacities[i] = total[OPACITY];
  }
};

// The blender formation's splats (backend/render/formation.py), each at its maximum response along the pixel's
// ray, from its RAY_PARAMS ray parameters (rays.cuh's ray_parameters), in the splat's unit frame:
// its centre m, s = 1 / view depth, and N0, N1, the rays' change per pixel in x and in y. For the pixel's offset
// (du, dv) from the projected centre the ray is r = s m + v, v = du N0 + dv N1; the squared distance from the
// centre to it is |m x v|^2 / |r|^2 and the view depth of the maximum m.r / |r|^2. Entry gradients: d/d(mean
// x, mean y, m (3), s, N0 (3), N1 (3), red, green, blue, opacity).
struct RaySample {
  float du, dv;
  float3 v, r, c;  // v, the ray r and the cross product c = m x v
  float inv_r2;    // 1 / |r|^2
  float dist;      // squared distance |c|^2 / |r|^2
  float depth;     // of the maximum
  float gauss, raw, alpha;
};

__device__ __forceinline__ float dot3(float3 a, float3 b) { return a.x * b.x + a.y * b.y + a.z * b.z; }
__device__ __forceinline__ float3 cross3(float3 a, float3 b) {
  return make_float3(a.y * b.z - a.z * b.y, a.z * b.x - a.x * b.z, a.x * b.y - a.y * b.x);
}
__device__ __forceinline__ float3 xyz(float4 a) { return make_float3(a.x, a.y, a.z); }

struct Rays {
  static constexpr int GRADS = 16, COLOR = 12, OPACITY = 15;
  static constexpr int BWD_BLOCKS = 6;  // the backward's shared memory (35 KB a block) fits 6 an SM
  using Sample = RaySample;
  struct Shared {
    float2 xy[BLOCK_SIZE];
    float4 m_s[BLOCK_SIZE];        // m, s
    float4 n0_opacity[BLOCK_SIZE]; // N0, opacity
    float4 n1[BLOCK_SIZE];         // N1
    float4 color[BLOCK_SIZE];
  };

  __device__ static uint32_t stage(Shared& sh, int j, const RasterArgs& r, int g, float x0, float y0) {
    const float* ray = r.rays + (size_t)RAY_PARAMS * g;
    const float opacity = r.opacities[g];
    sh.xy[j] = reinterpret_cast<const float2*>(r.means2d)[g];
    sh.m_s[j] = make_float4(ray[0], ray[1], ray[2], ray[3]);
    sh.n0_opacity[j] = make_float4(ray[4], ray[5], ray[6], opacity);
    sh.n1[j] = make_float4(ray[7], ray[8], ray[9], 0.f);
    sh.color[j] = make_float4(r.colors[3 * g], r.colors[3 * g + 1], r.colors[3 * g + 2], 0.f);
    return rect_warp_mask(reinterpret_cast<const float4*>(r.rects)[g], opacity, x0, y0);
  }

  // Skipped (false) beyond RADIUS_SIGMAS deviations, at or before the near plane, or below ALPHA_MIN.
  __device__ static bool sample(const Shared& sh, int j, float px, float py, Sample& s) {
    const float2 xy = sh.xy[j];
    const float4 m_s = sh.m_s[j], n0o = sh.n0_opacity[j];
    const float3 m = xyz(m_s), n0 = xyz(n0o), n1 = xyz(sh.n1[j]);
    s.du = px - xy.x;
    s.dv = py - xy.y;
    s.v = make_float3(s.du * n0.x + s.dv * n1.x, s.du * n0.y + s.dv * n1.y, s.du * n0.z + s.dv * n1.z);
    s.r = make_float3(m_s.w * m.x + s.v.x, m_s.w * m.y + s.v.y, m_s.w * m.z + s.v.z);
    s.c = cross3(m, s.v);
    const float r2 = dot3(s.r, s.r);
    if (!(r2 > 0.f)) return false;
    s.inv_r2 = __fdividef(1.f, r2);
    s.dist = dot3(s.c, s.c) * s.inv_r2;
    if (s.dist > RADIUS_SIGMAS * RADIUS_SIGMAS) return false;
    s.depth = dot3(m, s.r) * s.inv_r2;
    if (s.depth <= NEAR_PLANE) return false;
    s.gauss = __expf(-0.5f * s.dist);
    s.raw = n0o.w * s.gauss;
    s.alpha = fminf(ALPHA_MAX, s.raw);
    return s.alpha >= ALPHA_MIN;
  }

  __device__ static float4 color_depth(const Shared& sh, int j, const Sample& s) {
    const float4 c = sh.color[j];
    return make_float4(c.x, c.y, c.z, s.depth);
  }

  __device__ static void add_shape_grads(const Shared& sh, int j, const Sample& s, float g_alpha, float* v) {
    const float4 m_s = sh.m_s[j];
    const float3 m = xyz(m_s), n0 = xyz(sh.n0_opacity[j]), n1 = xyz(sh.n1[j]);
    v[15] += g_alpha * s.gauss;
    const float g_dist = -0.5f * g_alpha * s.raw;  // d alpha / d dist
    const float gc = 2.f * g_dist * s.inv_r2, gr = -2.f * g_dist * s.dist * s.inv_r2;
    const float3 g_c = make_float3(gc * s.c.x, gc * s.c.y, gc * s.c.z);  // dL/dc
    const float3 g_r = make_float3(gr * s.r.x, gr * s.r.y, gr * s.r.z);  // dL/dr
    // c = m x v, r = s m + v
    const float3 vxg = cross3(s.v, g_c), gxm = cross3(g_c, m);
    const float3 g_v = make_float3(gxm.x + g_r.x, gxm.y + g_r.y, gxm.z + g_r.z);
    v[2] += vxg.x + m_s.w * g_r.x;
    v[3] += vxg.y + m_s.w * g_r.y;
    v[4] += vxg.z + m_s.w * g_r.z;
    v[5] += dot3(m, g_r);
    v[6] += s.du * g_v.x;
    v[7] += s.du * g_v.y;
    v[8] += s.du * g_v.z;
    v[9] += s.dv * g_v.x;
    v[10] += s.dv * g_v.y;
    v[11] += s.dv * g_v.z;
    v[0] -= dot3(g_v, n0);  // d/d(mean) = -d/d(du, dv)
    v[1] -= dot3(g_v, n1);
  }

  // grads.shapes is (n, RAY_PARAMS), the ray parameters'. The gradient w.r.t. means2d also holds the part through
  // the centre m, which is the mean's camera-space point recomputed from means2d and its depth, as the reference
  // makes it: moving the projected centre by (du, dv) at depth 1 / s moves m by (du N0 + dv N1) / s. So it is
  // the screen-space gradient that densification reads, and rays.cuh's ray_backward leaves that part out.
  __device__ static void store(int i, const float* total, const RasterArgs& r, const SplatGrads& grads) {
    const float* ray = r.rays + (size_t)RAY_PARAMS * i;
    const float depth = 1.f / ray[3];
    grads.means2d[2 * i] = total[0] + depth * (total[2] * ray[4] + total[3] * ray[5] + total[4] * ray[6]);
    grads.means2d[2 * i + 1] = total[1] + depth * (total[2] * ray[7] + total[3] * ray[8] + total[4] * ray[9]);
    for (int k = 0; k < RAY_PARAMS; ++k) grads.shapes[(size_t)RAY_PARAMS * i + k] = total[2 + k];
    for (int k = 0; k < 3; ++k) grads.colors[3 * i + k] = total[COLOR + k];
    grads.opacities[i] = total[OPACITY];
  }
};

}  // namespace splatwright
