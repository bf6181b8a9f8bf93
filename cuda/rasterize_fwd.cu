// Rasterize forward: a block per 16x16 tile, a thread per pixel; the tile's depth-sorted splats are staged
// through shared memory in batches of BLOCK_SIZE and composited front to back. Each warp walks only the
// splats that may touch its block of pixels (warp_mask), listed in order.
//
// A tile's list is one chain per pixel, so its walk takes as long as the list is long, and on a small image (a
// training view of 400x400 has 625 tiles, about one block for each of the GPU's block slots) the busiest tile
// was the kernel: lego's busiest tiles walked 11-24 batches where the mean was under 2. When the batch states are
// recorded (training), a tile longer than ForwardChunks::batches is therefore cut into chunks of that many
// batches, each walked by a block of its own from T = 1, and compose_chunks_kernel composes them in order.
#include <algorithm>

#include "raster.cuh"
#include "splatwright.h"

namespace splatwright {

// Splats sampled together: their samples do not depend on the transmittance, so they overlap, and only the
// compositing is a chain. 8 measured fastest on the H200 (1, 2, 4, 8 tried).
constexpr int SPLATS_PER_STEP = 8;

// At most 64 registers, so 4 blocks fit an SM (68 gave 3): on the H200, 0.448 -> 0.424 ms at 1M Gaussians
// @1920x1080 and 0.958 -> 0.891 at 3M.
constexpr int FWD_BLOCKS_PER_SM = 4;

// A chunk is at least this many batches: a composed chunk costs a read of its states, and a re-walk of the batch
// where a pixel stops.
constexpr int MIN_CHUNK_BATCHES = 2;

int forward_chunk_batches(int n_entries, int n_tiles, int n_sms) {
  const int batches = n_entries / BLOCK_SIZE + n_tiles / 2;  // about how many there are
  const int slots = n_sms * FWD_BLOCKS_PER_SM;
  return std::max(MIN_CHUNK_BATCHES, (batches + slots - 1) / slots);
}

int forward_chunk_capacity(int max_batches, int chunk_batches) { return max_batches / chunk_batches; }

// A batch of splats in shared memory, and each warp's list of those that may touch its pixels, in order; a step
// may read up to SPLATS_PER_STEP - 1 entries past a list's end.
struct StagedBatch {
  float2 xy[BLOCK_SIZE];
  float4 conic_opacity[BLOCK_SIZE];
  float4 color_depth[BLOCK_SIZE];
  uint8_t warp_masks[BLOCK_SIZE];
  uint8_t lists[TILE_WARPS][BLOCK_SIZE + SPLATS_PER_STEP];
};

struct Pixel {
  float cx, cy;  // centre
  float T, red, green, blue, depth;
  int last;   // entries of the tile's list up to and including the last contributor
  bool done;  // stopped, or outside the image
};

struct TileWalk {
  int tile, x0, y0;  // the tile and its first pixel
  int start, end;    // its entries in gauss_ids
  int n_batches;
  int pix;  // this thread's pixel, row-major in the image
  bool inside;
};

__device__ __forceinline__ TileWalk tile_walk(const RasterArgs& r, int tile, Pixel& p) {
  TileWalk w;
  const int tiles_x = (r.width + TILE - 1) / TILE;
  w.tile = tile;
  w.x0 = (tile % tiles_x) * TILE;
  w.y0 = (tile / tiles_x) * TILE;
  w.start = r.ranges[2 * tile];
  w.end = r.ranges[2 * tile + 1];
  w.n_batches = (w.end - w.start + BLOCK_SIZE - 1) / BLOCK_SIZE;
  int local_x, local_y;
  tile_pixel(threadIdx.x, local_x, local_y);
  const int px = w.x0 + local_x, py = w.y0 + local_y;
  w.inside = px < r.width && py < r.height;
  w.pix = py * r.width + px;
  p.cx = px + 0.5f;
  p.cy = py + 0.5f;
  p.T = 1.f;
  p.red = p.green = p.blue = p.depth = 0.f;
  p.last = 0;
  p.done = !w.inside;
  return w;
}

// Stages batch `batch` of the tile's list and composites it front to back into each of the block's pixels that
// is not done. A barrier must come before it, so that no thread still reads the previous batch.
__device__ __forceinline__ void composite_batch(const RasterArgs& r, const float* __restrict__ depths,
                                                const TileWalk& w, int batch, StagedBatch& s, Pixel& p) {
  const int thread = threadIdx.x, lane = thread & 31, warp = thread >> 5;
  const int first = w.start + batch * BLOCK_SIZE, count = min(BLOCK_SIZE, w.end - first);
  if (thread < count) {
    const int g = r.gauss_ids[first + thread];
    const float2 xy = reinterpret_cast<const float2*>(r.means2d)[g];
    const float4 conic_opacity = make_float4(r.conics[3 * g], r.conics[3 * g + 1], r.conics[3 * g + 2], r.opacities[g]);
    s.xy[thread] = xy;
    s.conic_opacity[thread] = conic_opacity;
    s.color_depth[thread] = make_float4(r.colors[3 * g], r.colors[3 * g + 1], r.colors[3 * g + 2], depths[g]);
    s.warp_masks[thread] = (uint8_t)warp_mask(xy, conic_opacity, w.x0, w.y0);
  }
  __syncthreads();
  uint8_t* list = s.lists[warp];
  int listed = 0;
  for (int j0 = 0; j0 < count; j0 += 32) {
    const int j = j0 + lane;
    const bool mine = j < count && (s.warp_masks[j] >> warp & 1u);
    const unsigned ballot = __ballot_sync(0xffffffffu, mine);
    if (mine) list[listed + __popc(ballot & ((1u << lane) - 1u))] = (uint8_t)j;
    listed += __popc(ballot);
  }
  __syncwarp();
  for (int i0 = 0; i0 < listed && !p.done; i0 += SPLATS_PER_STEP) {
    SplatSample sample[SPLATS_PER_STEP];
    bool hit[SPLATS_PER_STEP];
    int js[SPLATS_PER_STEP];
#pragma unroll
    for (int k = 0; k < SPLATS_PER_STEP; ++k) {  // past listed: a stale list entry, masked
      js[k] = list[i0 + k];
      hit[k] = sample_splat(s.xy[js[k]], s.conic_opacity[js[k]], p.cx, p.cy, sample[k]) && i0 + k < listed;
    }
#pragma unroll
    for (int k = 0; k < SPLATS_PER_STEP; ++k) {
      if (!hit[k]) continue;
      const float next_T = p.T * (1.f - sample[k].alpha);
      if (next_T < T_STOP) {  // stop before the splat that would take T below T_STOP
        p.done = true;
        break;
      }
      const float weight = sample[k].alpha * p.T;
      const float4 cd = s.color_depth[js[k]];
      p.red += weight * cd.x;
      p.green += weight * cd.y;
      p.blue += weight * cd.z;
      p.depth += weight * cd.w;
      p.T = next_T;
      p.last = batch * BLOCK_SIZE + js[k] + 1;
    }
  }
}

__device__ __forceinline__ float4 composited(const Pixel& p) { return make_float4(p.T, p.red, p.green, p.blue); }

__device__ __forceinline__ void write_pixel(const RasterArgs& r, const TileWalk& w, const Pixel& p,
                                            const RasterOutputs& out) {
  if (!w.inside) return;
  out.image[3 * w.pix + 0] = p.red + p.T * r.background[0];
  out.image[3 * w.pix + 1] = p.green + p.T * r.background[1];
  out.image[3 * w.pix + 2] = p.blue + p.T * r.background[2];
  out.alpha[w.pix] = 1.f - p.T;
  out.depth[w.pix] = p.depth;
  out.final_T[w.pix] = p.T;
  out.n_contrib[w.pix] = p.last;
}

// The first batch of each chunk but the tiles' first ones, in any order (a chunk's result does not depend on
// when its block runs); the count follows the capacity's slots.
__global__ void chunk_starts_kernel(TileBatches batches, int n_tiles, int max_batches, ForwardChunks chunks) {
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= max_batches || b >= batches.offsets[n_tiles]) return;
  const int j = b - batches.offsets[batches.tiles[b]];
  if (j > 0 && j % chunks.batches == 0) chunks.starts[atomicAdd(&chunks.starts[chunks.capacity], 1)] = b;
}

// Blocks [0, chunks.capacity) walk the split tiles' later chunks (those past the count exit), block
// chunks.capacity + t tile t from its first batch: the whole tile where it is not split.
__global__ void __launch_bounds__(BLOCK_SIZE, FWD_BLOCKS_PER_SM)
    rasterize_fwd_kernel(RasterArgs r, TileBatches batches, ForwardChunks chunks, const float* __restrict__ depths,
                         RasterOutputs out) {
  __shared__ StagedBatch s;
  int tile, first_batch = 0;
  if ((int)blockIdx.x < chunks.capacity) {
    if ((int)blockIdx.x >= chunks.starts[chunks.capacity]) return;
    const int b = chunks.starts[blockIdx.x];
    tile = batches.tiles[b];
    first_batch = b - batches.offsets[tile];
  } else {
    tile = blockIdx.x - chunks.capacity;
  }
  Pixel p;
  const TileWalk w = tile_walk(r, tile, p);
  const bool split = chunks.batches > 0 && w.n_batches > chunks.batches;
  const int end_batch = split ? min(w.n_batches, first_batch + chunks.batches) : w.n_batches;
  const int state0 = batches.states ? batches.offsets[tile] : 0;
  int batch = first_batch;
  for (; batch < end_batch; ++batch) {
    // Also the barrier that keeps the previous batch alive until every thread is through it.
    if (__syncthreads_count(p.done) == BLOCK_SIZE) break;
    composite_batch(r, depths, w, batch, s, p);
    if (batches.states) {
      batches.states[state0 + batch][threadIdx.x] = composited(p);
      if (split) chunks.partials[state0 + batch][threadIdx.x] = {p.depth, p.done ? -(p.last + 1) : p.last};
    }
  }
  if (split) return;  // compose_chunks_kernel finishes the tile
  if (batches.states && batch < w.n_batches)  // all stopped early: the last batch's slot holds the final state
    batches.states[state0 + w.n_batches - 1][threadIdx.x] = composited(p);
  write_pixel(r, w, p, out);
}

// Walks batch `batch` of the tile's list again for the lanes of the warp whose `again` names it, from their
// composed state, until each stops or the batch ends; lanes whose `again` names other batches take their turn
// after. Warp by warp, without shared memory: each lane loads one splat of 32 at a time, and the splats that may
// touch the warp's pixels (warp_mask, as the forward lists them) are passed round the warp in order.
__device__ __forceinline__ void walk_again(const RasterArgs& r, const float* __restrict__ depths, const TileWalk& w,
                                           int again, Pixel& p) {
  constexpr unsigned FULL_MASK = 0xffffffffu;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (unsigned pending = __ballot_sync(FULL_MASK, again >= 0); pending;) {
    const int batch = __shfl_sync(FULL_MASK, again, __ffs(pending) - 1);
    const bool mine = again == batch;
    pending &= ~__ballot_sync(FULL_MASK, mine);
    const int first = w.start + batch * BLOCK_SIZE, count = min(BLOCK_SIZE, w.end - first);
    for (int e0 = 0; e0 < count && __any_sync(FULL_MASK, mine && !p.done); e0 += 32) {
      float2 xy = make_float2(0.f, 0.f);
      float4 co = make_float4(0.f, 0.f, 0.f, 0.f), cd = co;
      bool touches = false;
      if (e0 + lane < count) {
        const int g = r.gauss_ids[first + e0 + lane];
        xy = reinterpret_cast<const float2*>(r.means2d)[g];
        co = make_float4(r.conics[3 * g], r.conics[3 * g + 1], r.conics[3 * g + 2], r.opacities[g]);
        cd = make_float4(r.colors[3 * g], r.colors[3 * g + 1], r.colors[3 * g + 2], depths[g]);
        touches = warp_mask(xy, co, w.x0, w.y0) >> warp & 1u;
      }
      for (unsigned todo = __ballot_sync(FULL_MASK, touches); todo; todo &= todo - 1) {
        const int k = __ffs(todo) - 1;
        const float2 k_xy = make_float2(__shfl_sync(FULL_MASK, xy.x, k), __shfl_sync(FULL_MASK, xy.y, k));
        const float4 k_co = make_float4(__shfl_sync(FULL_MASK, co.x, k), __shfl_sync(FULL_MASK, co.y, k),
                                        __shfl_sync(FULL_MASK, co.z, k), __shfl_sync(FULL_MASK, co.w, k));
        const float4 k_cd = make_float4(__shfl_sync(FULL_MASK, cd.x, k), __shfl_sync(FULL_MASK, cd.y, k),
                                        __shfl_sync(FULL_MASK, cd.z, k), __shfl_sync(FULL_MASK, cd.w, k));
        SplatSample sample;
        if (!mine || p.done || !sample_splat(k_xy, k_co, p.cx, p.cy, sample)) continue;
        const float next_T = p.T * (1.f - sample.alpha);
        if (next_T < T_STOP) {  // stop before the splat that would take T below T_STOP
          p.done = true;
          continue;
        }
        const float weight = sample.alpha * p.T;
        p.red += weight * k_cd.x;
        p.green += weight * k_cd.y;
        p.blue += weight * k_cd.z;
        p.depth += weight * k_cd.w;
        p.T = next_T;
        p.last = batch * BLOCK_SIZE + e0 + k + 1;
      }
    }
  }
}

// A block per tile; the split tiles' chunks composed in order, pixel by pixel. A later chunk's recorded state
// scales by the transmittance where the chunk starts (and is rewritten so, for the backward); where a pixel stops
// within a later chunk (its walk stopped there, or the scaled T falls below T_STOP), the batch it stops in is
// walked again from the pixel's composed state (walk_again), so that it stops where one walk of the whole list
// would. The first version walked those batches with the whole block, staged in shared memory, one after another:
// on lego's views the pixels of a busy tile stop in many batches, and it took 0.15-0.17 ms.
__global__ void __launch_bounds__(BLOCK_SIZE)
    compose_chunks_kernel(RasterArgs r, TileBatches batches, ForwardChunks chunks, const float* __restrict__ depths,
                          RasterOutputs out) {
  Pixel p;
  const TileWalk w = tile_walk(r, blockIdx.x, p);
  if (w.n_batches <= chunks.batches) return;
  const int state0 = batches.offsets[w.tile];
  Pixel at_chunk = p;  // the pixel's state where the current chunk starts
  int batch = 0;
  while (__any_sync(0xffffffffu, !p.done && batch < w.n_batches)) {
    int again = -1;
    bool stopped = false;
    for (; !p.done && batch < w.n_batches; ++batch) {
      if (batch % chunks.batches == 0) at_chunk = p;
      const float4 state = batches.states[state0 + batch][threadIdx.x];
      const ChunkPartial partial = chunks.partials[state0 + batch][threadIdx.x];
      stopped = partial.last < 0;
      const int last = stopped ? -partial.last - 1 : partial.last;
      if (batch < chunks.batches) {  // the first chunk started where the tile does: its states are the pixel's
        p.T = state.x;
        p.red = state.y;
        p.green = state.z;
        p.blue = state.w;
        p.depth = partial.depth;
        p.last = last;
        p.done = stopped;
        continue;
      }
      const float T = at_chunk.T * state.x;
      if (stopped || T < T_STOP) {
        again = batch++;
        break;
      }
      p.T = T;
      p.red = at_chunk.red + at_chunk.T * state.y;
      p.green = at_chunk.green + at_chunk.T * state.z;
      p.blue = at_chunk.blue + at_chunk.T * state.w;
      p.depth = at_chunk.depth + at_chunk.T * partial.depth;
      if (last > 0) p.last = last;
      batches.states[state0 + batch][threadIdx.x] = composited(p);
    }
    walk_again(r, depths, w, again, p);
    if (again < 0) continue;
    if (stopped) {
      p.done = true;  // at the latest where its chunk's walk stopped (against rounding)
    } else if (!p.done) {
      batches.states[state0 + again][threadIdx.x] = composited(p);
    }
  }
  batches.states[state0 + w.n_batches - 1][threadIdx.x] = composited(p);
  write_pixel(r, w, p, out);
}

cudaError_t launch_rasterize_fwd(const RasterArgs& r, const TileBatches& batches, int max_batches,
                                 const ForwardChunks& chunks, const float* depths, const RasterOutputs& out,
                                 cudaStream_t stream) {
  if (r.width == 0 || r.height == 0) return cudaSuccess;
  const int n_tiles = tile_count(r.width, r.height);
  if (chunks.batches > 0) {
    cudaError_t err = cudaMemsetAsync(chunks.starts + chunks.capacity, 0, sizeof(int32_t), stream);
    if (err != cudaSuccess) return err;
    if (max_batches > 0)
      chunk_starts_kernel<<<(max_batches + 255) / 256, 256, 0, stream>>>(batches, n_tiles, max_batches, chunks);
    err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  rasterize_fwd_kernel<<<chunks.capacity + n_tiles, BLOCK_SIZE, 0, stream>>>(r, batches, chunks, depths, out);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess || chunks.batches == 0) return err;
  compose_chunks_kernel<<<n_tiles, BLOCK_SIZE, 0, stream>>>(r, batches, chunks, depths, out);
  return cudaGetLastError();
}

}  // namespace splatwright
