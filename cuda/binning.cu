// Tile binning: (tile, depth)-sorted list of (tile, Gaussian) entries and each tile's range in it. A sort key
// packs the tile and a depth key (depth_key) into 32 bits where both fit (a 1920x1080 image's 13 tile bits leave
// 19), half the bytes of a 64-bit (tile, float depth) key in each of the radix sort's passes, and two passes
// fewer. The blender formation's entries are keyed per tile (each splat's depth along a ray through the tile),
// in 64-bit keys.
#include <cub/cub.cuh>

#include "projection.cuh"
#include "raster.cuh"
#include "splatwright.h"

namespace splatwright {

constexpr int EMIT_THREADS = 256;

// A visible Gaussian's depth as a sort key of depth_bits bits: its float bits (which sort like the values, depths
// being positive) less the lowest visible ones, shifted right just enough for the visible range to fit. Equal
// keys keep index order, so depths within a key's step (at depth_bits = 19, a few 1e-5 of the depth for a usual
// scene's range) are composited in index order.
__device__ __forceinline__ uint32_t depth_key(float depth, const uint32_t* depth_range, int depth_bits) {
  const uint32_t lowest = ~depth_range[0], span = depth_range[1] - lowest;
  const int shift = max(0, 32 - __clz((int)span) - depth_bits);
  return (__float_as_uint(depth) - lowest) >> shift;
}

// A Gaussian's entries are written by its own thread where it has at most THREAD_RUN of them; a longer run (a
// splat close to the camera can cover thousands of tiles) by its whole warp, a tile row per lane.
constexpr int THREAD_RUN = 16;

// One thread per Gaussian: Gaussian i's entries take emit positions [entry_ends[i - 1], entry_ends[i]) (each
// entry's own position, which the sort carries along), its tiles in row-major order (FootprintTiles::each_tile).
// Key: tile << depth_bits | depth key.
template <typename Key>
__global__ void __launch_bounds__(EMIT_THREADS)
    emit_keys_kernel(BinInputs in, const int64_t* __restrict__ entry_ends, int depth_bits, Key* __restrict__ keys,
                     int32_t* __restrict__ gauss_ids, int32_t* __restrict__ positions) {
  constexpr unsigned FULL_MASK = 0xffffffffu;
  const int i = blockIdx.x * EMIT_THREADS + threadIdx.x, lane = threadIdx.x & 31;
  const int first = i < in.n && i > 0 ? (int)entry_ends[i - 1] : 0;
  const int count = i < in.n ? (int)entry_ends[i] - first : 0;
  auto footprint = [&](int g) {
    const float2 xy = reinterpret_cast<const float2*>(in.means2d)[g];
    return FootprintTiles(xy.x, xy.y, in.conics + 3 * g, in.opacities[g], in.radii[g], in.width, in.height);
  };
  auto write = [&](int k, int tile, int g, Key depth) {
    keys[k] = ((Key)tile << depth_bits) | depth;
    gauss_ids[k] = g;
    positions[k] = k;
  };
  const bool own = count <= THREAD_RUN;
  if (own && count > 0) {
    const Key depth = depth_key(in.depths[i], in.depth_range, depth_bits);
    footprint(i).each_tile(count, [&](int j, int tile) { write(first + j, tile, i, depth); });
  }
  // The warp walks each long run 32 rows at a time, the same tiles in the same order as each_tile: a lane's row
  // starts where the rows before it end (a warp scan), and the last row takes whatever they leave.
  for (uint32_t long_lanes = __ballot_sync(FULL_MASK, !own); long_lanes; long_lanes &= long_lanes - 1) {
    const int owner = __ffs(long_lanes) - 1;
    const int g = __shfl_sync(FULL_MASK, i, owner), run_first = __shfl_sync(FULL_MASK, first, owner);
    const int run_end = run_first + __shfl_sync(FULL_MASK, count, owner);
    const FootprintTiles splat = footprint(g);
    const Key depth = depth_key(in.depths[g], in.depth_range, depth_bits);
    int rows_start = run_first;  // the position of the first row of this pass
    for (int y0 = splat.y_lo; y0 < splat.y_hi; y0 += 32) {
      const int y = y0 + lane;
      int c_lo = 0, c_hi = 0;
      if (y < splat.y_hi) splat.row(y, c_lo, c_hi);
      int through = c_hi - c_lo;  // inclusive sum over the lanes
      for (int offset = 1; offset < 32; offset <<= 1) {
        const int below = __shfl_up_sync(FULL_MASK, through, offset);
        if (lane >= offset) through += below;
      }
      const int k_start = rows_start + through - (c_hi - c_lo);
      const int row_end = y + 1 >= splat.y_hi ? run_end : min(run_end, k_start + c_hi - c_lo);
      for (int c = c_lo, k = k_start; k < row_end; ++c, ++k) write(k, splat.tile_at(y, c), g, depth);
      rows_start += __shfl_sync(FULL_MASK, through, 31);
    }
  }
}

// The tiles [x_lo, x_hi) x [y_lo, y_hi) of a blender-formation splat's footprint rectangle (u_lo, u_hi, v_lo,
// v_hi) in pixels, as the reference's bin_rects takes them.
struct RectTiles {
  int x_lo, x_hi, y_lo, y_hi;

  __device__ RectTiles(float4 rect, int width, int height) {
    const float tiles_x = (float)((width + TILE - 1) / TILE), tiles_y = (float)((height + TILE - 1) / TILE);
    x_lo = (int)fminf(fmaxf(floorf(rect.x / TILE), 0.f), tiles_x);
    x_hi = (int)fminf(fmaxf(floorf(rect.y / TILE) + 1.f, 0.f), tiles_x);
    y_lo = (int)fminf(fmaxf(floorf(rect.z / TILE), 0.f), tiles_y);
    y_hi = (int)fminf(fmaxf(floorf(rect.w / TILE) + 1.f, 0.f), tiles_y);
  }
  __device__ int count() const { return max(0, x_hi - x_lo) * max(0, y_hi - y_lo); }
};

__global__ void rect_tile_counts_kernel(RayBinInputs in, int64_t* __restrict__ tile_counts) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= in.n) return;
  const RectTiles rect(reinterpret_cast<const float4*>(in.rects)[i], in.width, in.height);
  tile_counts[i] = in.radii[i] > 0 ? rect.count() : 0;
}

// One thread per entry: entry k belongs to the Gaussian whose entry range holds it (a binary search of
// entry_ends), its tiles in row-major order. Key: tile << 32 | the float bits of the view depth of the splat's
// maximum along the ray through the tile's pixel centre nearest to its projected centre (at least 0, so the bits
// sort like the values).
__global__ void emit_ray_keys_kernel(RayBinInputs in, const int64_t* __restrict__ entry_ends, int n_entries,
                                     uint64_t* __restrict__ keys, int32_t* __restrict__ gauss_ids,
                                     int32_t* __restrict__ positions) {
  const int k = blockIdx.x * blockDim.x + threadIdx.x;
  if (k >= n_entries) return;
  int lo = 0, hi = in.n - 1;  // the first Gaussian whose entries end past k
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (entry_ends[mid] > k) hi = mid; else lo = mid + 1;
  }
  const int g = lo, local = k - (g > 0 ? (int)entry_ends[g - 1] : 0);
  const RectTiles rect(reinterpret_cast<const float4*>(in.rects)[g], in.width, in.height);
  const int cols = rect.x_hi - rect.x_lo, tiles_x = (in.width + TILE - 1) / TILE;
  const int tx = rect.x_lo + local % cols, ty = rect.y_lo + local / cols;
  const float* ray = in.rays + (size_t)RAY_PARAMS * g;
  const float2 xy = reinterpret_cast<const float2*>(in.means2d)[g];
  // the tile's pixel centre nearest to the projected centre
  const float du = fminf(fmaxf(xy.x, tx * TILE + 0.5f), tx * TILE + TILE - 0.5f) - xy.x;
  const float dv = fminf(fmaxf(xy.y, ty * TILE + 0.5f), ty * TILE + TILE - 0.5f) - xy.y;
  const float3 m = make_float3(ray[0], ray[1], ray[2]);
  const float3 r = make_float3(ray[3] * m.x + du * ray[4] + dv * ray[7], ray[3] * m.y + du * ray[5] + dv * ray[8],
                               ray[3] * m.z + du * ray[6] + dv * ray[9]);
  const float depth = dot3(m, r) / dot3(r, r);
  keys[k] = (uint64_t)(ty * tiles_x + tx) << 32 | __float_as_uint(depth > 0.f ? depth : 0.f);
  gauss_ids[k] = g;
  positions[k] = k;
}

__global__ void gather_ids_kernel(const int32_t* __restrict__ gauss_ids, const int32_t* __restrict__ sorted_positions,
                                  int n_entries, int32_t* __restrict__ sorted_ids) {
  const int k = blockIdx.x * blockDim.x + threadIdx.x;
  if (k < n_entries) sorted_ids[k] = gauss_ids[sorted_positions[k]];
}

template <typename Key>
__global__ void tile_ranges_kernel(const Key* __restrict__ keys, int n_entries, int depth_bits,
                                   int32_t* __restrict__ ranges) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n_entries) return;
  const uint32_t tile = (uint32_t)(keys[i] >> depth_bits);
  if (i == 0 || (uint32_t)(keys[i - 1] >> depth_bits) != tile) ranges[2 * tile] = i;
  if (i == n_entries - 1 || (uint32_t)(keys[i + 1] >> depth_bits) != tile) ranges[2 * tile + 1] = i + 1;
}

// Batches of BLOCK_SIZE entries per tile; batch_counts has n_tiles + 1 slots, the last one 0 so that the
// exclusive sum's last element is the total.
__global__ void tile_batch_counts_kernel(const int32_t* __restrict__ ranges, int n_tiles,
                                         int32_t* __restrict__ batch_counts) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t > n_tiles) return;
  batch_counts[t] = t < n_tiles ? (ranges[2 * t + 1] - ranges[2 * t] + BLOCK_SIZE - 1) / BLOCK_SIZE : 0;
}

__global__ void batch_tiles_kernel(const int32_t* __restrict__ batch_offsets, int n_tiles,
                                   int32_t* __restrict__ batch_tiles) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= n_tiles) return;
  for (int b = batch_offsets[t]; b < batch_offsets[t + 1]; ++b) batch_tiles[b] = t;
}

int tile_bits(int width, int height) {
  const int n_tiles = tile_count(width, height);
  int bits = 1;
  while ((1 << bits) < n_tiles) ++bits;
  return bits;
}

int depth_key_bits(int width, int height) {
  const int short_depth = 32 - tile_bits(width, height);
  return short_depth >= MIN_DEPTH_KEY_BITS ? short_depth : 32;
}

size_t scan_temp_bytes(int n) {
  size_t bytes = 0;
  cub::DeviceScan::InclusiveSum(nullptr, bytes, (const int64_t*)nullptr, (int64_t*)nullptr, n);
  return bytes;
}

size_t batch_scan_temp_bytes(int n_tiles) {
  size_t bytes = 0;
  cub::DeviceScan::ExclusiveSum(nullptr, bytes, (const int32_t*)nullptr, (int32_t*)nullptr, n_tiles + 1);
  return bytes;
}

int max_tile_batches(int n_entries, int n_tiles) { return n_entries / BLOCK_SIZE + n_tiles; }

template <typename Key>
size_t sort_temp_bytes_for(int n_entries, int end_bit) {
  size_t bytes = 0;
  cub::DeviceRadixSort::SortPairs(nullptr, bytes, (const Key*)nullptr, (Key*)nullptr, (const int32_t*)nullptr,
                                  (int32_t*)nullptr, n_entries, 0, end_bit);
  return bytes;
}

size_t sort_temp_bytes(int n_entries, int width, int height) {
  const int depth_bits = depth_key_bits(width, height), end_bit = depth_bits + tile_bits(width, height);
  return depth_bits < 32 ? sort_temp_bytes_for<uint32_t>(n_entries, end_bit)
                         : sort_temp_bytes_for<uint64_t>(n_entries, end_bit);
}

cudaError_t launch_entry_ends(const int64_t* tile_counts, int n, int64_t* entry_ends, void* temp, size_t temp_bytes,
                              cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return cub::DeviceScan::InclusiveSum(temp, temp_bytes, tile_counts, entry_ends, n, stream);
}

// Sort the emitted entries (LSD radix sort is stable, so equal keys keep the emit order: ascending Gaussian
// index), gather the ids and find each tile's range, with keys of type Key whose tile starts at bit depth_bits.
template <typename Key>
cudaError_t sort_emitted(int n_entries, int depth_bits, int end_bit, Key* keys, Key* sorted_keys,
                         const SortBuffers& out, cudaStream_t stream) {
  const int threads = 256;
  size_t temp_bytes = out.temp_bytes;
  cudaError_t err = cub::DeviceRadixSort::SortPairs(out.temp, temp_bytes, keys, sorted_keys, out.positions,
                                                    out.sorted_positions, n_entries, 0, end_bit, stream);
  if (err != cudaSuccess) return err;
  gather_ids_kernel<<<(n_entries + threads - 1) / threads, threads, 0, stream>>>(out.gauss_ids, out.sorted_positions,
                                                                                 n_entries, out.sorted_ids);
  err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  tile_ranges_kernel<Key><<<(n_entries + threads - 1) / threads, threads, 0, stream>>>(sorted_keys, n_entries,
                                                                                       depth_bits, out.ranges);
  return cudaGetLastError();
}

template <typename Key>
cudaError_t sort_entries(const BinInputs& in, const int64_t* entry_ends, int n_entries, int depth_bits, Key* keys,
                         Key* sorted_keys, const SortBuffers& out, cudaStream_t stream) {
  emit_keys_kernel<Key><<<(in.n + EMIT_THREADS - 1) / EMIT_THREADS, EMIT_THREADS, 0, stream>>>(
      in, entry_ends, depth_bits, keys, out.gauss_ids, out.positions);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  return sort_emitted(n_entries, depth_bits, depth_bits + tile_bits(in.width, in.height), keys, sorted_keys, out,
                      stream);
}

cudaError_t launch_sort_entries(const BinInputs& in, const int64_t* entry_ends, int n_entries, void* keys,
                                void* sorted_keys, const SortBuffers& out, cudaStream_t stream) {
  const int n_tiles = tile_count(in.width, in.height);
  const cudaError_t err = cudaMemsetAsync(out.ranges, 0, sizeof(int32_t) * 2 * (size_t)n_tiles, stream);
  if (err != cudaSuccess || n_entries == 0) return err;
  const int depth_bits = depth_key_bits(in.width, in.height);
  if (depth_bits < 32)
    return sort_entries(in, entry_ends, n_entries, depth_bits, (uint32_t*)keys, (uint32_t*)sorted_keys, out, stream);
  return sort_entries(in, entry_ends, n_entries, depth_bits, (uint64_t*)keys, (uint64_t*)sorted_keys, out, stream);
}

size_t ray_sort_temp_bytes(int n_entries, int width, int height) {
  return sort_temp_bytes_for<uint64_t>(n_entries, 32 + tile_bits(width, height));
}

cudaError_t launch_rect_tile_counts(const RayBinInputs& in, int64_t* tile_counts, cudaStream_t stream) {
  if (in.n == 0) return cudaSuccess;
  const int threads = 256;
  rect_tile_counts_kernel<<<(in.n + threads - 1) / threads, threads, 0, stream>>>(in, tile_counts);
  return cudaGetLastError();
}

cudaError_t launch_sort_ray_entries(const RayBinInputs& in, const int64_t* entry_ends, int n_entries, void* keys,
                                    void* sorted_keys, const SortBuffers& out, cudaStream_t stream) {
  const int n_tiles = tile_count(in.width, in.height), threads = 256;
  cudaError_t err = cudaMemsetAsync(out.ranges, 0, sizeof(int32_t) * 2 * (size_t)n_tiles, stream);
  if (err != cudaSuccess || n_entries == 0) return err;
  emit_ray_keys_kernel<<<(n_entries + threads - 1) / threads, threads, 0, stream>>>(
      in, entry_ends, n_entries, (uint64_t*)keys, out.gauss_ids, out.positions);
  err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  return sort_emitted(n_entries, 32, 32 + tile_bits(in.width, in.height), (uint64_t*)keys, (uint64_t*)sorted_keys,
                      out, stream);
}

cudaError_t launch_tile_batches(const int32_t* ranges, int n_tiles, int32_t* batch_counts,
                                int32_t* batch_offsets, int32_t* batch_tiles, void* temp, size_t temp_bytes,
                                cudaStream_t stream) {
  const int threads = 256, blocks = (n_tiles + 1 + threads - 1) / threads;
  tile_batch_counts_kernel<<<blocks, threads, 0, stream>>>(ranges, n_tiles, batch_counts);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  err = cub::DeviceScan::ExclusiveSum(temp, temp_bytes, batch_counts, batch_offsets, n_tiles + 1, stream);
  if (err != cudaSuccess) return err;
  batch_tiles_kernel<<<blocks, threads, 0, stream>>>(batch_offsets, n_tiles, batch_tiles);
  return cudaGetLastError();
}

}  // namespace splatwright
