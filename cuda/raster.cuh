// Splat evaluation shared by rasterize_fwd.cu and rasterize_bwd.cu, so both make the same decisions.
#pragma once

#include <cstdint>

#include "constants.h"
#include "projection.cuh"

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

}  // namespace splatwright
