// Splat evaluation shared by rasterize_fwd.cu and rasterize_bwd.cu, so both make the same decisions.
#pragma once

#include "constants.h"

namespace splatwright {

// Opacity-weighted Gaussian at pixel centre (px, py): alpha = min(ALPHA_MAX, opacity * exp(power)).
// Returns false where the splat is skipped (power > 0 or alpha < ALPHA_MIN).
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
  if (power > 0.f) return false;
  s.gauss = __expf(power);
  s.raw = conic_opacity.w * s.gauss;
  s.alpha = fminf(ALPHA_MAX, s.raw);
  return s.alpha >= ALPHA_MIN;
}

}  // namespace splatwright
