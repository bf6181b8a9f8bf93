// Rasterize forward: one block per 16x16 tile, one thread per pixel; the tile's sorted splats are staged through
// shared memory in batches of BLOCK_SIZE and composited front to back. Each warp walks only the splats that may
// touch its block of pixels (their warp masks), listed in order. Splats: raster.cuh's Conics or Rays.
#include "raster.cuh"
#include "splatwright.h"

namespace splatwright {

// Splats sampled together: their samples do not depend on the transmittance, so they overlap, and only the
// compositing is a chain. 8 measured fastest on the H200 (1, 2, 4, 8 tried).
constexpr int SPLATS_PER_STEP = 8;

// At most 64 registers, so 4 blocks fit an SM (68 gave 3): on the H200, 0.448 -> 0.424 ms at 1M Gaussians
// @1920x1080 and 0.958 -> 0.891 at 3M.
template <typename Splats>
__global__ void __launch_bounds__(BLOCK_SIZE, 4)
    rasterize_fwd_kernel(RasterArgs r, TileBatches batches, float* __restrict__ image, float* __restrict__ alpha_out,
                         float* __restrict__ depth_out, float* __restrict__ final_T, int32_t* __restrict__ n_contrib) {
  __shared__ typename Splats::Shared s_splats;
  __shared__ uint8_t s_warp_masks[BLOCK_SIZE];
  // Each warp's splats of the batch, in order; a step may read up to SPLATS_PER_STEP - 1 entries past the end.
  __shared__ uint8_t s_lists[TILE_WARPS][BLOCK_SIZE + SPLATS_PER_STEP];

  const int tile = blockIdx.y * gridDim.x + blockIdx.x;
  const int thread = threadIdx.x, lane = thread & 31, warp = thread >> 5;
  int local_x, local_y;
  tile_pixel(thread, local_x, local_y);
  const int px = blockIdx.x * TILE + local_x;
  const int py = blockIdx.y * TILE + local_y;
  const bool inside = px < r.width && py < r.height;
  const float cx = px + 0.5f, cy = py + 0.5f;
  const int start = r.ranges[2 * tile], end = r.ranges[2 * tile + 1];
  const int first_batch = batches.states ? batches.offsets[tile] : 0;
  uint8_t* list = s_lists[warp];

  float T = 1.f, red = 0.f, green = 0.f, blue = 0.f, depth = 0.f;
  int last = 0;  // entries of the tile's list up to and including the last contributor
  bool done = !inside;
  for (int batch = start; batch < end; batch += BLOCK_SIZE) {
    // Also the barrier that keeps the previous batch alive until every thread is through it.
    if (__syncthreads_count(done) == BLOCK_SIZE) break;
    if (batches.states && batch > start)  // the state at the end of the previous batch
      batches.states[first_batch + (batch - start) / BLOCK_SIZE - 1][thread] = make_float4(T, red, green, blue);
    const int idx = batch + thread;
    if (idx < end)
      s_warp_masks[thread] =
          (uint8_t)Splats::stage(s_splats, thread, r, r.gauss_ids[idx], blockIdx.x * TILE, blockIdx.y * TILE);
    __syncthreads();
    const int count = min(BLOCK_SIZE, end - batch);
    int listed = 0;
    for (int j0 = 0; j0 < count; j0 += 32) {
      const int j = j0 + lane;
      const bool mine = j < count && (s_warp_masks[j] >> warp & 1u);
      const unsigned ballot = __ballot_sync(0xffffffffu, mine);
      if (mine) list[listed + __popc(ballot & ((1u << lane) - 1u))] = (uint8_t)j;
      listed += __popc(ballot);
    }
    __syncwarp();
    for (int i0 = 0; i0 < listed && !done; i0 += SPLATS_PER_STEP) {
      typename Splats::Sample s[SPLATS_PER_STEP];
      bool hit[SPLATS_PER_STEP];
      int js[SPLATS_PER_STEP];
#pragma unroll
      for (int k = 0; k < SPLATS_PER_STEP; ++k) {  // past listed: a stale list entry, masked
        js[k] = list[i0 + k];
        hit[k] = Splats::sample(s_splats, js[k], cx, cy, s[k]) && i0 + k < listed;
      }
#pragma unroll
      for (int k = 0; k < SPLATS_PER_STEP; ++k) {
        if (!hit[k]) continue;
        const float next_T = T * (1.f - s[k].alpha);
        if (next_T < T_STOP) {  // stop before the splat that would take T below T_STOP
          done = true;
          break;
        }
        const float w = s[k].alpha * T;
        const float4 cd = Splats::color_depth(s_splats, js[k], s[k]);
        red += w * cd.x;
        green += w * cd.y;
        blue += w * cd.z;
        depth += w * cd.w;
        T = next_T;
        last = batch - start + js[k] + 1;
      }
    }
  }
  if (batches.states && end > start)  // the last batch's slot holds the final state
    batches.states[batches.offsets[tile + 1] - 1][thread] = make_float4(T, red, green, blue);
  if (!inside) return;
  const int pix = py * r.width + px;
  image[3 * pix + 0] = red + T * r.background[0];
  image[3 * pix + 1] = green + T * r.background[1];
  image[3 * pix + 2] = blue + T * r.background[2];
  alpha_out[pix] = 1.f - T;
  depth_out[pix] = depth;
  final_T[pix] = T;
  n_contrib[pix] = last;
}

cudaError_t launch_rasterize_fwd(const RasterArgs& r, const TileBatches& batches, float* image, float* alpha,
                                 float* depth, float* final_T, int32_t* n_contrib, cudaStream_t stream) {
  if (r.width == 0 || r.height == 0) return cudaSuccess;
  const dim3 grid((r.width + TILE - 1) / TILE, (r.height + TILE - 1) / TILE);
  if (r.rays)
    rasterize_fwd_kernel<Rays><<<grid, BLOCK_SIZE, 0, stream>>>(r, batches, image, alpha, depth, final_T, n_contrib);
  else
    rasterize_fwd_kernel<Conics><<<grid, BLOCK_SIZE, 0, stream>>>(r, batches, image, alpha, depth, final_T, n_contrib);
  return cudaGetLastError();
}

}  // namespace splatwright
