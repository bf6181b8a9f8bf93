// Tile binning: (tile, depth)-sorted list of (tile, Gaussian) entries and each tile's range in it.
#include <cub/cub.cuh>

#include "projection.cuh"
#include "splatwright.h"

namespace splatwright {

__global__ void tile_counts_kernel(const float2* __restrict__ means2d, const float* __restrict__ conics,
                                   const float* __restrict__ opacities, const int32_t* __restrict__ radii, int n,
                                   int width, int height, int64_t* __restrict__ counts) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  counts[i] = radii[i] > 0
                  ? FootprintTiles(means2d[i].x, means2d[i].y, conics + 3 * i, opacities[i], radii[i], width, height)
                        .count()
                  : 0;
}

// The Gaussian whose entries hold emit position k: the first i in [lo, hi) with offsets[i] > k (offsets: the
// inclusive sum of the counts).
__device__ __forceinline__ int gaussian_of(const int64_t* __restrict__ offsets, int lo, int hi, int64_t k) {
  while (lo < hi) {
    const int mid = (lo + hi) >> 1;
    if (offsets[mid] > k) hi = mid;
    else lo = mid + 1;
  }
  return lo;
}

constexpr int EMIT_THREADS = 256;

// One thread per entry, so that a Gaussian over many tiles is spread over many threads and the writes coalesce:
// entry k (its own position, which the sort carries along) is its Gaussian's tile number k - first in row-major
// order of the Gaussian's tiles (FootprintTiles). The block's first and last entries' Gaussians bound
// every thread's search.
__global__ void __launch_bounds__(EMIT_THREADS)
    emit_keys_kernel(const float2* __restrict__ means2d, const float* __restrict__ conics,
                     const float* __restrict__ opacities, const int32_t* __restrict__ radii,
                     const float* __restrict__ depths, const int64_t* __restrict__ offsets, int n, int n_entries,
                     int width, int height, uint64_t* __restrict__ keys, int32_t* __restrict__ gauss_ids,
                     int32_t* __restrict__ positions) {
  __shared__ int s_first, s_last;
  const int block_first = blockIdx.x * EMIT_THREADS;
  const int k = block_first + threadIdx.x;
  if (threadIdx.x == 0) s_first = gaussian_of(offsets, 0, n, block_first);
  if (threadIdx.x == 1) s_last = gaussian_of(offsets, 0, n, min(block_first + EMIT_THREADS, n_entries) - 1);
  __syncthreads();
  if (k >= n_entries) return;
  const int i = gaussian_of(offsets, s_first, s_last + 1, k);
  const FootprintTiles splat(means2d[i].x, means2d[i].y, conics + 3 * i, opacities[i], radii[i], width, height);
  const int tile = splat.tile((int)(k - (i > 0 ? offsets[i - 1] : 0)));
  // Depths of visible Gaussians are positive, so their float bits sort like the values.
  keys[k] = ((uint64_t)tile << 32) | (uint64_t)__float_as_uint(depths[i]);
  gauss_ids[k] = i;
  positions[k] = k;
}

__global__ void gather_ids_kernel(const int32_t* __restrict__ gauss_ids, const int32_t* __restrict__ sorted_positions,
                                  int n_entries, int32_t* __restrict__ sorted_ids) {
  const int k = blockIdx.x * blockDim.x + threadIdx.x;
  if (k < n_entries) sorted_ids[k] = gauss_ids[sorted_positions[k]];
}

__global__ void tile_ranges_kernel(const uint64_t* __restrict__ keys, int n_entries, int32_t* __restrict__ ranges) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n_entries) return;
  const uint32_t tile = (uint32_t)(keys[i] >> 32);
  if (i == 0 || (uint32_t)(keys[i - 1] >> 32) != tile) ranges[2 * tile] = i;
  if (i == n_entries - 1 || (uint32_t)(keys[i + 1] >> 32) != tile) ranges[2 * tile + 1] = i + 1;
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

int sort_end_bit(int width, int height) {
  const int n_tiles = ((width + TILE - 1) / TILE) * ((height + TILE - 1) / TILE);
  int bits = 1;
  while ((1 << bits) < n_tiles) ++bits;
  return 32 + bits;
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

size_t sort_temp_bytes(int n_entries, int end_bit) {
  size_t bytes = 0;
  cub::DeviceRadixSort::SortPairs(nullptr, bytes, (const uint64_t*)nullptr, (uint64_t*)nullptr,
                                  (const int32_t*)nullptr, (int32_t*)nullptr, n_entries, 0, end_bit);
  return bytes;
}

cudaError_t launch_tile_counts(const float* means2d, const float* conics, const float* opacities, const int32_t* radii,
                               int n, int width, int height, int64_t* counts, int64_t* offsets, void* temp,
                               size_t temp_bytes, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const int threads = 256;
  tile_counts_kernel<<<(n + threads - 1) / threads, threads, 0, stream>>>((const float2*)means2d, conics, opacities,
                                                                           radii, n, width, height, counts);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  return cub::DeviceScan::InclusiveSum(temp, temp_bytes, counts, offsets, n, stream);
}

cudaError_t launch_emit_keys(const float* means2d, const float* conics, const float* opacities, const int32_t* radii,
                             const float* depths, const int64_t* offsets, int n, int n_entries, int width, int height,
                             uint64_t* keys, int32_t* gauss_ids, int32_t* positions, cudaStream_t stream) {
  if (n_entries == 0) return cudaSuccess;
  emit_keys_kernel<<<(n_entries + EMIT_THREADS - 1) / EMIT_THREADS, EMIT_THREADS, 0, stream>>>(
      (const float2*)means2d, conics, opacities, radii, depths, offsets, n, n_entries, width, height, keys, gauss_ids,
      positions);
  return cudaGetLastError();
}

// LSD radix sort is stable, so equal keys keep the emit order: ascending Gaussian index.
cudaError_t launch_sort_keys(const uint64_t* keys_in, uint64_t* keys_out, const int32_t* gauss_ids,
                             const int32_t* positions_in, int32_t* positions_out, int32_t* sorted_ids, int n_entries,
                             int end_bit, void* temp, size_t temp_bytes, cudaStream_t stream) {
  if (n_entries == 0) return cudaSuccess;
  cudaError_t err = cub::DeviceRadixSort::SortPairs(temp, temp_bytes, keys_in, keys_out, positions_in, positions_out,
                                                    n_entries, 0, end_bit, stream);
  if (err != cudaSuccess) return err;
  const int threads = 256;
  gather_ids_kernel<<<(n_entries + threads - 1) / threads, threads, 0, stream>>>(gauss_ids, positions_out, n_entries,
                                                                                 sorted_ids);
  return cudaGetLastError();
}

cudaError_t launch_tile_ranges(const uint64_t* sorted_keys, int n_entries, int n_tiles, int32_t* ranges,
                               cudaStream_t stream) {
  cudaError_t err = cudaMemsetAsync(ranges, 0, sizeof(int32_t) * 2 * (size_t)n_tiles, stream);
  if (err != cudaSuccess || n_entries == 0) return err;
  const int threads = 256;
  tile_ranges_kernel<<<(n_entries + threads - 1) / threads, threads, 0, stream>>>(sorted_keys, n_entries, ranges);
  return cudaGetLastError();
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
