// Rasterize backward: the forward's tile walk in reverse, one block per batch of a tile's entries (busy tiles'
// long lists spread over many blocks instead of one). Each pixel starts from its transmittance T at the end of
// the batch and the colour S composited behind that point (from the states the forward recorded), recovers T
// before each splat as T / (1 - alpha), and keeps S up to date. Each thread walks one pixel in each of
// BLOCKS_PER_WARP of the forward's pixel blocks, and skips a splat in a block that its warp_mask leaves out, as
// the forward does.
//
// The result is deterministic: no float atomics. Each splat's gradient is summed over each warp, the warps' sums
// are added in warp order into one value per entry (tile, Gaussian), and a second kernel adds each Gaussian's
// entries in a fixed order. Training on the GPU therefore repeats exactly, and a resumed run equals an
// uninterrupted one.
#include "raster.cuh"
#include "splatwright.h"

namespace splatwright {

constexpr unsigned FULL_MASK = 0xffffffffu;

// Sums each of v[0..N) over the warp, N a power of two up to 32, by halving exchanges (each step keeps half the
// values and swaps the other half with the partner lane: N - 1 shuffles for N values, then one for each lane
// bit left); lane l returns the sum of v[l / (32 / N)].
template <int N>
__device__ __forceinline__ float warp_sum_halving(const float* v, int lane) {
  static_assert(N >= 2 && N <= 32 && (N & (N - 1)) == 0, "N is a power of two up to 32");
  float u[N];  // a copy: summing in v itself spilled registers
#pragma unroll
  for (int i = 0; i < N; ++i) u[i] = v[i];
#pragma unroll
  for (int half = N / 2, bit = 16; half >= 1; half /= 2, bit /= 2) {
    const bool upper = lane & bit;
#pragma unroll
    for (int i = 0; i < half; ++i) {
      const float keep = upper ? u[i + half] : u[i];
      u[i] = keep + __shfl_xor_sync(FULL_MASK, upper ? u[i] : u[i + half], bit);
    }
  }
  float x = u[0];
#pragma unroll
  for (int bit = 16 / N; bit >= 1; bit /= 2) x += __shfl_xor_sync(FULL_MASK, x, bit);
  return x;
}

// The largest power of two at most n.
__host__ __device__ constexpr int power_of_two_below(int n) { return n < 2 ? 1 : 2 * power_of_two_below(n / 2); }

// Writes the warp's sums of v[0..GRADS) to sums: the first power of two of them by halving exchanges, the rest
// (the standard formation's ninth) by plain butterflies. For 9 values: 9 shuffles for the first 8 instead of 40.
template <int GRADS>
__device__ __forceinline__ void store_warp_sums(const float* v, int lane, float* sums) {
  constexpr int HALVED = power_of_two_below(GRADS), LANES = 32 / HALVED;
  const float mine = warp_sum_halving<HALVED>(v, lane);
  if (lane % LANES == 0) sums[lane / LANES] = mine;
#pragma unroll
  for (int k = HALVED; k < GRADS; ++k) {
    float y = v[k];
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) y += __shfl_xor_sync(FULL_MASK, y, offset);
    if (lane == 0) sums[k] = y;
  }
}

// Each warp of the backward takes BLOCKS_PER_WARP of the forward's pixel blocks, one above the other, and each
// lane one pixel of each: a splat's parameters are read and its 9 sums reduced once for all of them (a splat
// over one block usually meets the next). Each block still skips the splats its mask bit leaves out. On the
// H200, 2 took the backward at 3M Gaussians @1920x1080 from 3.10 ms (1 block per warp) to 2.60; 4 gave 2.43
// there but was slower at 100k and 1M (bench raster's scenes).
constexpr int BLOCKS_PER_WARP = 2;
constexpr int BWD_THREADS = BLOCK_SIZE / BLOCKS_PER_WARP;
constexpr int BWD_WARPS = BWD_THREADS / 32;
// Entries whose warp sums are staged in shared memory at once. 64 (20 KB of shared memory a block, standard
// formation) with at most 64 registers fits 8 blocks an SM where 128 (29 KB, 72 registers) fitted 7: on the
// H200, fwd+bwd at 3M Gaussians @1920x1080 took 4.85 -> 4.73 ms, at 1M 2.18 -> 2.16 ms.
constexpr int CHUNK = 64;
static_assert((TILE / WARP_H) % BLOCKS_PER_WARP == 0, "the forward's pixel blocks stack up by rows");

// The forward's pixel block (its warp number) that is the k-th of backward warp w.
__device__ __forceinline__ int block_of(int w, int k) {
  return ((w / WARPS_X) * BLOCKS_PER_WARP + k) * WARPS_X + w % WARPS_X;
}

// Backward warp w's blocks as a warp mask.
__device__ __forceinline__ uint32_t blocks_of(int w) {
  uint32_t bits = 0u;
#pragma unroll
  for (int k = 0; k < BLOCKS_PER_WARP; ++k) bits |= 1u << block_of(w, k);
  return bits;
}

// One pixel's state in the reverse walk.
struct PixelWalk {
  float cx, cy;        // pixel centre
  int last;            // entries of the tile's list up to and including the last contributor
  float T_final, g_T;  // dL/dT_final: image = C + T_final * background, alpha = 1 - T_final
  float g_rgb[3];      // dL/d(image) at the pixel
  float T;             // transmittance behind the current splat
  float S[3];          // colour composited behind the current splat
};

__device__ __forceinline__ void start_walk(PixelWalk& p, int fwd_thread, int tile_x0, int tile_y0, int batch,
                                           int last_batch, int batch_end_entry, const RasterArgs& r,
                                           const TileBatches& batches, const float* __restrict__ final_T,
                                           const int32_t* __restrict__ n_contrib,
                                           const float* __restrict__ grad_image,
                                           const float* __restrict__ grad_alpha) {
  int local_x, local_y;
  tile_pixel(fwd_thread, local_x, local_y);
  const int px = tile_x0 + local_x, py = tile_y0 + local_y, pix = py * r.width + px;
  const bool inside = px < r.width && py < r.height;
  p.cx = px + 0.5f;
  p.cy = py + 0.5f;
  p.last = inside ? n_contrib[pix] : 0;
  p.T_final = inside ? final_T[pix] : 1.f;
  p.g_T = 0.f;
  for (int ch = 0; ch < 3; ++ch) {
    p.g_rgb[ch] = inside ? grad_image[3 * pix + ch] : 0.f;
    p.g_T += p.g_rgb[ch] * r.background[ch];
    p.S[ch] = 0.f;
  }
  if (inside) p.g_T -= grad_alpha[pix];
  p.T = p.T_final;
  if (p.last > batch_end_entry) {  // contributors follow this batch: start from its end state
    const float4 at_end = batches.states[batch][fwd_thread], final_state = batches.states[last_batch][fwd_thread];
    p.T = at_end.x;
    p.S[0] = final_state.y - at_end.y;
    p.S[1] = final_state.z - at_end.z;
    p.S[2] = final_state.w - at_end.w;
  }
}

// Adds the splat's gradient at the pixel to v and steps the pixel's walk back over it, where entry (relative
// to the tile's start) is at most its last contributor and the splat (the batch's j-th) reaches it. Returns
// whether it did.
template <typename Splats>
__device__ __forceinline__ bool add_splat(PixelWalk& p, int entry, const typename Splats::Shared& sh, int j,
                                          float* v) {
  typename Splats::Sample s;
  if (!(entry < p.last && Splats::sample(sh, j, p.cx, p.cy, s))) return false;
  const float inv_one_minus = __fdividef(1.f, 1.f - s.alpha);  // 1 - alpha >= 0.01
  p.T *= inv_one_minus;  // transmittance in front of this splat
  const float w = s.alpha * p.T;
  const float4 color = Splats::color_depth(sh, j, s);
  const float c[3] = {color.x, color.y, color.z};
  float g_alpha = -p.T_final * inv_one_minus * p.g_T;
  for (int ch = 0; ch < 3; ++ch) {
    v[Splats::COLOR + ch] += p.g_rgb[ch] * w;
    g_alpha += p.g_rgb[ch] * (c[ch] * p.T - p.S[ch] * inv_one_minus);
    p.S[ch] += c[ch] * w;
  }
  // clamp_max passes gradient only where the uncapped value is <= the cap
  if (s.raw <= ALPHA_MAX) Splats::add_shape_grads(sh, j, s, g_alpha, v);
  return true;
}

template <typename Splats>
__global__ void __launch_bounds__(BWD_THREADS, Splats::BWD_BLOCKS)
    rasterize_bwd_kernel(RasterArgs r, TileBatches batches, const int32_t* __restrict__ positions,
                         const float* __restrict__ final_T, const int32_t* __restrict__ n_contrib,
                         const float* __restrict__ grad_image, const float* __restrict__ grad_alpha,
                         float* __restrict__ entry_grads) {
  constexpr int GRADS = Splats::GRADS;
  __shared__ typename Splats::Shared s_splats;
  __shared__ uint8_t s_warp_masks[BLOCK_SIZE];
  __shared__ float s_warp_sums[BWD_WARPS][CHUNK][GRADS];
  __shared__ int s_walk;
  __shared__ int s_warp_walk[BWD_WARPS];

  const int tiles_x = (r.width + TILE - 1) / TILE, n_tiles = tiles_x * ((r.height + TILE - 1) / TILE);
  const int batch = blockIdx.x;
  if (batch >= batches.offsets[n_tiles]) return;  // the grid is sized by an upper bound
  const int tile = batches.tiles[batch];
  const int batch_in_tile = batch - batches.offsets[tile];
  const int last_batch = batches.offsets[tile + 1] - 1;

  const int thread = threadIdx.x, lane = thread & 31, warp = thread >> 5;
  const uint32_t my_blocks = blocks_of(warp);
  const int tile_x0 = (tile % tiles_x) * TILE, tile_y0 = (tile / tiles_x) * TILE;
  const int start = r.ranges[2 * tile];
  const int batch_start = start + batch_in_tile * BLOCK_SIZE;
  const int batch_end_entry = (batch_in_tile + 1) * BLOCK_SIZE;  // relative to start, past the tile's end maybe
  PixelWalk pixels[BLOCKS_PER_WARP];
  int furthest = 0;
#pragma unroll
  for (int k = 0; k < BLOCKS_PER_WARP; ++k) {
    start_walk(pixels[k], block_of(warp, k) * 32 + lane, tile_x0, tile_y0, batch, last_batch, batch_end_entry, r,
               batches, final_T, n_contrib, grad_image, grad_alpha);
    furthest = max(furthest, pixels[k].last);
  }

  // The walk (back to front) starts at the batch's furthest last contributor, and each warp's at its own
  // pixels' furthest; entries past them keep zero gradients (from those warps).
  if (thread == 0) s_walk = 0;
  __syncthreads();
  const int warp_last = (int)__reduce_max_sync(FULL_MASK, (unsigned)furthest);
  if (lane == 0) {
    atomicMax(&s_walk, warp_last);
    s_warp_walk[warp] = warp_last - (batch_start - start);  // relative to batch_start
  }
  __syncthreads();
  const int batch_len = min(BLOCK_SIZE, r.ranges[2 * tile + 1] - batch_start);
  const int batch_end = min(batch_start + batch_len, start + s_walk);
  // Entries past the walk get zeros here, so the workspace needs no clearing (at 3M Gaussians @1920x1080 the
  // clearing and the backward took 0.1 ms more).
  for (int j = max(0, batch_end - batch_start) + thread; j < batch_len; j += BWD_THREADS) {
    float* out = entry_grads + (size_t)positions[batch_start + j] * GRADS;
    for (int k = 0; k < GRADS; ++k) out[k] = 0.f;
  }
  if (batch_end <= batch_start) return;

  const int count = batch_end - batch_start, warp_count = min(count, s_warp_walk[warp]);
  for (int j = thread; j < count; j += BWD_THREADS)
    s_warp_masks[j] = (uint8_t)Splats::stage(s_splats, j, r, r.gauss_ids[batch_start + j], tile_x0, tile_y0);
  __syncthreads();
  for (int chunk = (count - 1) / CHUNK; chunk >= 0; --chunk) {  // back to front, as the walk goes
    const int j_lo = chunk * CHUNK;
    for (int j = min(warp_count, j_lo + CHUNK) - 1; j >= j_lo; --j) {
      const uint32_t mask = s_warp_masks[j];
      if (!(mask & my_blocks)) continue;  // the sums below skip this warp's
      float* sums = s_warp_sums[warp][j - j_lo];
      const int entry = batch_start + j - start;
      float v[GRADS];
#pragma unroll
      for (int k = 0; k < GRADS; ++k) v[k] = 0.f;
      int hit = 0;  // an int, not a bool: no byte conversions in the loop
#pragma unroll
      for (int k = 0; k < BLOCKS_PER_WARP; ++k)
        if (mask >> block_of(warp, k) & 1u) hit |= (int)add_splat<Splats>(pixels[k], entry, s_splats, j, v);
      if (!__any_sync(FULL_MASK, hit)) {
        if (lane < GRADS) sums[lane] = 0.f;
        continue;
      }
      store_warp_sums<GRADS>(v, lane, sums);
    }
    __syncthreads();
    // One thread per entry adds the sums of the warps it may touch in warp order and stores them at the
    // entry's emit position.
    for (int j = j_lo + thread; j < min(count, j_lo + CHUNK); j += BWD_THREADS) {
      float* out = entry_grads + (size_t)positions[batch_start + j] * GRADS;
      const uint32_t mask = s_warp_masks[j];
      for (int k = 0; k < GRADS; ++k) {
        float total = 0.f;
        for (int w = 0; w < BWD_WARPS; ++w)
          if ((mask & blocks_of(w)) && j < s_warp_walk[w]) total += s_warp_sums[w][j - j_lo][k];
        out[k] = total;
      }
    }
    __syncthreads();  // the sums are read before the next chunk overwrites them
  }
}

// Entries of a Gaussian that its own thread adds; a longer run is added by its whole warp. A splat close to a
// camera can cover thousands of tiles: added by one thread, its entries alone took 2 ms of a 5 ms training step
// (a furnished room at 1920x1080 on an H200), while the other threads had long finished.
constexpr int THREAD_ENTRIES = 16;

// Each Gaussian's entries summed in a fixed order: a short run by its thread in emit order, a long one by the
// warp (lane l adds entries l, l + 32, ... in turn, then the lanes' sums meet in a butterfly).
template <typename Splats>
__global__ void sum_entry_grads_kernel(RasterArgs r, const float* __restrict__ entry_grads,
                                       const int64_t* __restrict__ entry_ends, int n, SplatGrads grads) {
  constexpr int GRADS = Splats::GRADS;
  const int i = blockIdx.x * blockDim.x + threadIdx.x, lane = threadIdx.x & 31;
  const int64_t first = i < n && i > 0 ? entry_ends[i - 1] : 0, end = i < n ? entry_ends[i] : 0;
  const bool own = end - first <= THREAD_ENTRIES;
  float total[GRADS];
  for (int k = 0; k < GRADS; ++k) total[k] = 0.f;
  if (own)
    for (int64_t e = first; e < end; ++e)
      for (int k = 0; k < GRADS; ++k) total[k] += entry_grads[e * GRADS + k];
  for (uint32_t long_lanes = __ballot_sync(FULL_MASK, !own); long_lanes; long_lanes &= long_lanes - 1) {
    const int owner = __ffs(long_lanes) - 1;
    const int64_t run_first = __shfl_sync(FULL_MASK, first, owner), run_end = __shfl_sync(FULL_MASK, end, owner);
    float part[GRADS];
    for (int k = 0; k < GRADS; ++k) part[k] = 0.f;
#pragma unroll 4
    for (int64_t e = run_first + lane; e < run_end; e += 32)
      for (int k = 0; k < GRADS; ++k) part[k] += entry_grads[e * GRADS + k];
    for (int offset = 16; offset > 0; offset >>= 1)
      for (int k = 0; k < GRADS; ++k) part[k] += __shfl_xor_sync(FULL_MASK, part[k], offset);
    if (lane == owner)
      for (int k = 0; k < GRADS; ++k) total[k] = part[k];
  }
  if (i < n) Splats::store(i, total, r, grads);
}

size_t entry_grad_floats(int n_entries, const RasterArgs& r) {
  return (size_t)n_entries * (r.rays ? Rays::GRADS : Conics::GRADS);
}

template <typename Splats>
cudaError_t rasterize_bwd(const RasterArgs& r, const TileBatches& batches, int max_batches, const int32_t* positions,
                          const int64_t* entry_ends, int n, const float* final_T, const int32_t* n_contrib,
                          const float* grad_image, const float* grad_alpha, float* entry_grads,
                          const SplatGrads& grads, cudaStream_t stream) {
  if (r.width > 0 && r.height > 0 && max_batches > 0) {
    rasterize_bwd_kernel<Splats><<<max_batches, BWD_THREADS, 0, stream>>>(r, batches, positions, final_T, n_contrib,
                                                                          grad_image, grad_alpha, entry_grads);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  if (n == 0) return cudaSuccess;
  const int threads = 256;
  sum_entry_grads_kernel<Splats><<<(n + threads - 1) / threads, threads, 0, stream>>>(r, entry_grads, entry_ends, n,
                                                                                     grads);
  return cudaGetLastError();
}

cudaError_t launch_rasterize_bwd(const RasterArgs& r, const TileBatches& batches, int max_batches,
                                 const int32_t* positions, const int64_t* entry_ends, int n, const float* final_T,
                                 const int32_t* n_contrib, const float* grad_image, const float* grad_alpha,
                                 float* entry_grads, const SplatGrads& grads, cudaStream_t stream) {
  if (r.rays)
    return rasterize_bwd<Rays>(r, batches, max_batches, positions, entry_ends, n, final_T, n_contrib, grad_image,
                               grad_alpha, entry_grads, grads, stream);
  return rasterize_bwd<Conics>(r, batches, max_batches, positions, entry_ends, n, final_T, n_contrib, grad_image,
                               grad_alpha, entry_grads, grads, stream);
}

}  // namespace splatwright
