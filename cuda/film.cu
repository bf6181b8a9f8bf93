// Blender's image formation's last steps (backend/render/formation.py's blender_image), one thread per pixel: the
// splats' composite in linear light over the background's linear colour, through the film filter's whole-pixel
// taps (FILM_TAP_SIDE, FILM_TAP_CENTRE, FILM_TAP_SIDE along rows and columns, the edges' pixels standing in for
// what lies beyond), into display values by the sRGB encoding; alpha and depth filtered alike.
#include "splatwright.h"

namespace splatwright {

namespace {

constexpr int FILM_BLOCK = 256;
constexpr int FILM_CHANNELS = 5;  // linear r, g, b, alpha, depth

// The sRGB encoding (formation.linear_to_srgb) and its derivative, which autograd takes on the same branch.
__device__ __forceinline__ float linear_to_srgb(float x) {
  return x <= 0.0031308f ? 12.92f * x : 1.055f * powf(x, 1.f / 2.4f) - 0.055f;
}
__device__ __forceinline__ float linear_to_srgb_slope(float x) {
  return x <= 0.0031308f ? 12.92f : 1.055f / 2.4f * powf(x, 1.f / 2.4f - 1.f);
}

__device__ __forceinline__ float tap(int offset) { return offset == 0 ? FILM_TAP_CENTRE : FILM_TAP_SIDE; }

// The weight with which the film carries input row (or column) p into output row q, where q is p's neighbour or p
// itself: the taps whose clamped source is p. Inside the image that is tap(p - q); at an edge the taps that fall
// beyond it add to the edge's own.
__device__ __forceinline__ float carried(int p, int q, int n) {
  float w = 0.f;
  for (int offset = -1; offset <= 1; ++offset) {
    if (min(max(q + offset, 0), n - 1) == p) w += tap(offset);
  }
  return w;
}

__global__ void film_fwd_kernel(const float* __restrict__ color, const float* __restrict__ alpha,
                                const float* __restrict__ depth, const float* __restrict__ background, int width,
                                int height, float* __restrict__ image, float* __restrict__ alpha_out,
                                float* __restrict__ depth_out, float* __restrict__ filtered) {
  const int pixel = blockIdx.x * blockDim.x + threadIdx.x;
  if (pixel >= width * height) return;
  const int x = pixel % width, y = pixel / width;
  float bg[3];
  for (int c = 0; c < 3; ++c) bg[c] = srgb_to_linear(background[c]);
  float sum[FILM_CHANNELS] = {0.f, 0.f, 0.f, 0.f, 0.f};
  for (int dy = -1; dy <= 1; ++dy) {
    const int row = min(max(y + dy, 0), height - 1);
    for (int dx = -1; dx <= 1; ++dx) {
      const int source = row * width + min(max(x + dx, 0), width - 1);
      const float w = tap(dy) * tap(dx), a = alpha[source];
      for (int c = 0; c < 3; ++c) sum[c] += w * (color[3 * source + c] + (1.f - a) * bg[c]);
      sum[3] += w * a;
      sum[4] += w * depth[source];
    }
  }
  for (int c = 0; c < 3; ++c) {
    filtered[3 * pixel + c] = sum[c];
    image[3 * pixel + c] = linear_to_srgb(sum[c]);
  }
  alpha_out[pixel] = sum[3];
  depth_out[pixel] = sum[4];
}

// The adjoint of the forward, gathered per input pixel (no atomics): the image's gradient through the encoding at
// each neighbour's filtered value, carried back through the taps, and the filtered alpha's gradient likewise; the
// composite gives the colour that gradient and alpha minus its share of the background's.
__global__ void film_bwd_kernel(const float* __restrict__ filtered, const float* __restrict__ background,
                                const float* __restrict__ grad_image, const float* __restrict__ grad_alpha_out,
                                int width, int height, float* __restrict__ grad_color,
                                float* __restrict__ grad_alpha) {
  const int pixel = blockIdx.x * blockDim.x + threadIdx.x;
  if (pixel >= width * height) return;
  const int x = pixel % width, y = pixel / width;
  float g[4] = {0.f, 0.f, 0.f, 0.f};
  for (int row = max(y - 1, 0); row <= min(y + 1, height - 1); ++row) {
    const float wy = carried(y, row, height);
    for (int column = max(x - 1, 0); column <= min(x + 1, width - 1); ++column) {
      const int target = row * width + column;
      const float w = wy * carried(x, column, width);
      for (int c = 0; c < 3; ++c) {
        g[c] += w * grad_image[3 * target + c] * linear_to_srgb_slope(filtered[3 * target + c]);
      }
      g[3] += w * grad_alpha_out[target];
    }
  }
  float through_background = 0.f;
  for (int c = 0; c < 3; ++c) {
    grad_color[3 * pixel + c] = g[c];
    through_background += g[c] * srgb_to_linear(background[c]);
  }
  grad_alpha[pixel] = g[3] - through_background;
}

int film_blocks(int width, int height) { return (width * height + FILM_BLOCK - 1) / FILM_BLOCK; }

}  // namespace

cudaError_t launch_film_fwd(const float* color, const float* alpha, const float* depth, const float* background,
                            int width, int height, float* image, float* alpha_out, float* depth_out, float* filtered,
                            cudaStream_t stream) {
  if (width * height == 0) return cudaSuccess;
  film_fwd_kernel<<<film_blocks(width, height), FILM_BLOCK, 0, stream>>>(color, alpha, depth, background, width,
                                                                         height, image, alpha_out, depth_out,
                                                                         filtered);
  return cudaGetLastError();
}

cudaError_t launch_film_bwd(const float* filtered, const float* background, const float* grad_image,
                            const float* grad_alpha_out, int width, int height, float* grad_color, float* grad_alpha,
                            cudaStream_t stream) {
  if (width * height == 0) return cudaSuccess;
  film_bwd_kernel<<<film_blocks(width, height), FILM_BLOCK, 0, stream>>>(filtered, background, grad_image,
                                                                         grad_alpha_out, width, height, grad_color,
                                                                         grad_alpha);
  return cudaGetLastError();
}

}  // namespace splatwright
