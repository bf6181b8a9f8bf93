// Rasterize backward: the forward's tile walk in reverse, one block per batch of a tile's entries (busy tiles'
// long lists spread over many blocks instead of one). Each pixel starts from its transmittance T at the end of
// the batch and the colour S composited behind that point (from the states the forward recorded), recovers T
// before each splat as T / (1 - alpha), and keeps S up to date. A warp skips the splats that cannot touch its
// block of pixels (warp_mask), as the forward does.
//
// The result is deterministic: no float atomics. Each splat's gradient is summed over each warp, the warps' sums
// are added in warp order into one value per entry (tile, Gaussian), and a second kernel adds each Gaussian's
// entries in emit order. Training on the GPU therefore repeats exactly, and a resumed run equals an
// uninterrupted one.
#include "raster.cuh"
#include "splatwright.h"

namespace splatwright {

constexpr unsigned FULL_MASK = 0xffffffffu;

// Sums v[0..8] over the warp; returns with lane 4k (k < 8) holding the sum of v[k] and lane 0 that of v[8].
// The first eight values are reduced by halving exchanges (each step keeps half the values and swaps the
// other half with the partner lane): 9 shuffles for 8 values instead of 40.
__device__ __forceinline__ void warp_sum9(float* v, int lane, float& mine, float& ninth) {
  const bool b4 = lane & 16, b3 = lane & 8, b2 = lane & 4;
  float u[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float keep = b4 ? v[i + 4] : v[i];
    u[i] = keep + __shfl_xor_sync(FULL_MASK, b4 ? v[i] : v[i + 4], 16);
  }
  float w[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const float keep = b3 ? u[i + 2] : u[i];
    w[i] = keep + __shfl_xor_sync(FULL_MASK, b3 ? u[i] : u[i + 2], 8);
  }
  float x = (b2 ? w[1] : w[0]) + __shfl_xor_sync(FULL_MASK, b2 ? w[0] : w[1], 4);
  x += __shfl_xor_sync(FULL_MASK, x, 2);
  x += __shfl_xor_sync(FULL_MASK, x, 1);
  mine = x;  // sum of v[lane >> 2]
  float y = v[8];
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) y += __shfl_xor_sync(FULL_MASK, y, offset);
  ninth = y;
}

constexpr int HALF = BLOCK_SIZE / 2;  // entries whose warp sums are staged in shared memory at once
constexpr int ENTRY_GRADS = 9;        // d/d(mean x, mean y, conic a, b, c, red, green, blue, opacity)

__global__ void __launch_bounds__(BLOCK_SIZE)
    rasterize_bwd_kernel(RasterArgs r, TileBatches batches, const int32_t* __restrict__ positions,
                         const float* __restrict__ final_T, const int32_t* __restrict__ n_contrib,
                         const float* __restrict__ grad_image, const float* __restrict__ grad_alpha,
                         float* __restrict__ entry_grads) {
  __shared__ float2 s_xy[BLOCK_SIZE];
  __shared__ float4 s_conic_opacity[BLOCK_SIZE];
  __shared__ float4 s_color[BLOCK_SIZE];
  __shared__ uint8_t s_warp_masks[BLOCK_SIZE];
  __shared__ float s_warp_sums[TILE_WARPS][HALF][ENTRY_GRADS];
  __shared__ int s_walk;

  const int tiles_x = (r.width + TILE - 1) / TILE, n_tiles = tiles_x * ((r.height + TILE - 1) / TILE);
  const int batch = blockIdx.x;
  if (batch >= batches.offsets[n_tiles]) return;  // the grid is sized by an upper bound
  const int tile = batches.tiles[batch];
  const int batch_in_tile = batch - batches.offsets[tile];
  const int last_batch = batches.offsets[tile + 1] - 1;

  const int thread = threadIdx.x, lane = thread & 31, warp = thread >> 5;
  int local_x, local_y;
  tile_pixel(thread, local_x, local_y);
  const int tile_x0 = (tile % tiles_x) * TILE, tile_y0 = (tile / tiles_x) * TILE;
  const int px = tile_x0 + local_x, py = tile_y0 + local_y;
  const bool inside = px < r.width && py < r.height;
  const float cx = px + 0.5f, cy = py + 0.5f;
  const int start = r.ranges[2 * tile];
  const int batch_start = start + batch_in_tile * BLOCK_SIZE;
  const int pix = py * r.width + px;

  const int last = inside ? n_contrib[pix] : 0;  // relative to start

  // Walk only as far back as the batch's furthest last contributor; entries past it keep zero gradients.
  if (thread == 0) s_walk = 0;
  __syncthreads();
  const int warp_last = (int)__reduce_max_sync(FULL_MASK, (unsigned)last);
  if (lane == 0) atomicMax(&s_walk, warp_last);
  __syncthreads();
  const int batch_end = min(min(batch_start + BLOCK_SIZE, r.ranges[2 * tile + 1]), start + s_walk);
  if (batch_end <= batch_start) return;

  const float T_final = inside ? final_T[pix] : 1.f;
  float g_rgb[3] = {0.f, 0.f, 0.f};
  float g_T = 0.f;  // dL/dT_final: image = C + T_final * background, alpha = 1 - T_final
  if (inside) {
    for (int ch = 0; ch < 3; ++ch) {
      g_rgb[ch] = grad_image[3 * pix + ch];
      g_T += g_rgb[ch] * r.background[ch];
    }
    g_T -= grad_alpha[pix];
  }
  float T = T_final;
  float S[3] = {0.f, 0.f, 0.f};  // colour composited behind the current splat
  if (start + last > batch_start + BLOCK_SIZE) {  // contributors follow this batch: start from its end state
    const float4 at_end = batches.states[batch][thread], final_state = batches.states[last_batch][thread];
    T = at_end.x;
    S[0] = final_state.y - at_end.y;
    S[1] = final_state.z - at_end.z;
    S[2] = final_state.w - at_end.w;
  }

  const int count = batch_end - batch_start;
  if (thread < count) {
    const int g = r.gauss_ids[batch_start + thread];
    const float2 xy = reinterpret_cast<const float2*>(r.means2d)[g];
    const float4 conic_opacity =
        make_float4(r.conics[3 * g], r.conics[3 * g + 1], r.conics[3 * g + 2], r.opacities[g]);
    s_xy[thread] = xy;
    s_conic_opacity[thread] = conic_opacity;
    s_color[thread] = make_float4(r.colors[3 * g], r.colors[3 * g + 1], r.colors[3 * g + 2], 0.f);
    s_warp_masks[thread] = (uint8_t)warp_mask(xy, conic_opacity, tile_x0, tile_y0);
  }
  __syncthreads();
  for (int half = (count - 1) / HALF; half >= 0; --half) {  // back to front, as the walk goes
    const int j_lo = half * HALF;
    for (int j = min(count, j_lo + HALF) - 1; j >= j_lo; --j) {
      float* sums = s_warp_sums[warp][j - j_lo];
      if (!(s_warp_masks[j] >> warp & 1u)) continue;  // the sums below skip this warp's
      SplatSample s;
      const bool valid = batch_start + j - start < last && sample_splat(s_xy[j], s_conic_opacity[j], cx, cy, s);
      if (!__any_sync(FULL_MASK, valid)) {
        if ((lane & 3) == 0) sums[lane >> 2] = 0.f;
        if (lane == 0) sums[8] = 0.f;
        continue;
      }
      float v[ENTRY_GRADS] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
      if (valid) {
        const float inv_one_minus = __frcp_rn(1.f - s.alpha);
        T = T * inv_one_minus;  // transmittance in front of this splat
        const float w = s.alpha * T;
        const float4 color = s_color[j];
        const float c[3] = {color.x, color.y, color.z};
        float g_alpha = -T_final * inv_one_minus * g_T;
        for (int ch = 0; ch < 3; ++ch) {
          v[5 + ch] = g_rgb[ch] * w;
          g_alpha += g_rgb[ch] * (c[ch] * T - S[ch] * inv_one_minus);
          S[ch] += c[ch] * w;
        }
        // clamp_max passes gradient only where the uncapped value is <= the cap
        if (s.raw <= ALPHA_MAX) {
          const float4 co = s_conic_opacity[j];
          const float g_power = g_alpha * s.raw;  // d(opacity exp(power))/d power
          v[8] = g_alpha * s.gauss;
          v[0] = g_power * (co.x * s.dx + co.y * s.dy);  // dpower/dmean = -dpower/d(dx, dy)
          v[1] = g_power * (co.z * s.dy + co.y * s.dx);
          v[2] = -0.5f * g_power * s.dx * s.dx;
          v[3] = -g_power * s.dx * s.dy;
          v[4] = -0.5f * g_power * s.dy * s.dy;
        }
      }
      float mine, ninth;
      warp_sum9(v, lane, mine, ninth);
      if ((lane & 3) == 0) sums[lane >> 2] = mine;
      if (lane == 0) sums[8] = ninth;
    }
    __syncthreads();
    // One thread per entry adds the sums of the warps it may touch in warp order and stores them at the
    // entry's emit position.
    const int j = j_lo + thread;
    if (thread < HALF && j < count) {
      float* out = entry_grads + (size_t)positions[batch_start + j] * ENTRY_GRADS;
      const uint32_t warps = s_warp_masks[j];
      for (int k = 0; k < ENTRY_GRADS; ++k) {
        float total = 0.f;
        for (int w = 0; w < TILE_WARPS; ++w)
          if (warps >> w & 1u) total += s_warp_sums[w][thread][k];
        out[k] = total;
      }
    }
    __syncthreads();  // the sums are read before the next half overwrites them
  }
}

// One thread per Gaussian adds its entries' gradients in emit order.
__global__ void sum_entry_grads_kernel(const float* __restrict__ entry_grads, const int64_t* __restrict__ entry_ends,
                                       int n, float* __restrict__ grad_means2d, float* __restrict__ grad_conics,
                                       float* __restrict__ grad_colors, float* __restrict__ grad_opacities) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float total[ENTRY_GRADS] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  for (int64_t e = i > 0 ? entry_ends[i - 1] : 0; e < entry_ends[i]; ++e)
    for (int k = 0; k < ENTRY_GRADS; ++k) total[k] += entry_grads[e * ENTRY_GRADS + k];
  for (int k = 0; k < 2; ++k) grad_means2d[2 * i + k] = total[k];
  for (int k = 0; k < 3; ++k) grad_conics[3 * i + k] = total[2 + k];
  for (int k = 0; k < 3; ++k) grad_colors[3 * i + k] = total[5 + k];
  grad_opacities[i] = total[8];
}

size_t entry_grad_floats(int n_entries) { return (size_t)n_entries * ENTRY_GRADS; }

cudaError_t launch_rasterize_bwd(const RasterArgs& r, const TileBatches& batches, int max_batches,
                                 const int32_t* positions, const int64_t* entry_ends, int n, const float* final_T,
                                 const int32_t* n_contrib, const float* grad_image, const float* grad_alpha,
                                 float* entry_grads, float* grad_means2d, float* grad_conics, float* grad_colors,
                                 float* grad_opacities, cudaStream_t stream) {
  if (r.width > 0 && r.height > 0 && max_batches > 0) {
    rasterize_bwd_kernel<<<max_batches, BLOCK_SIZE, 0, stream>>>(r, batches, positions, final_T, n_contrib, grad_image,
                                                            grad_alpha, entry_grads);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  if (n == 0) return cudaSuccess;
  const int threads = 256;
  sum_entry_grads_kernel<<<(n + threads - 1) / threads, threads, 0, stream>>>(
      entry_grads, entry_ends, n, grad_means2d, grad_conics, grad_colors, grad_opacities);
  return cudaGetLastError();
}

}  // namespace splatwright
