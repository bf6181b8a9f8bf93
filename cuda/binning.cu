// Tile binning: (tile, depth)-sorted list of (tile, Gaussian) entries and each tile's range in it.
#include <cub/cub.cuh>

#include "projection.cuh"
#include "splatwright.h"

namespace splatwright {

__global__ void tile_counts_kernel(const float2* __restrict__ means2d, const int32_t* __restrict__ radii, int n,
                                   int width, int height, int64_t* __restrict__ counts) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  int64_t count = 0;
  if (radii[i] > 0) {
    int x_lo, x_hi, y_lo, y_hi;
    tile_rect(means2d[i].x, means2d[i].y, radii[i], width, height, x_lo, x_hi, y_lo, y_hi);
    count = (int64_t)(x_hi - x_lo) * (y_hi - y_lo);
  }
  counts[i] = count;
}

// One thread per Gaussian writes its entries in row-major tile order from offset (inclusive sum - count):
// key, Gaussian and the entry's own position (which the sort carries along).
__global__ void emit_keys_kernel(const float2* __restrict__ means2d, const int32_t* __restrict__ radii,
                                 const float* __restrict__ depths, const int64_t* __restrict__ offsets, int n,
                                 int width, int height, uint64_t* __restrict__ keys, int32_t* __restrict__ gauss_ids,
                                 int32_t* __restrict__ positions) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n || radii[i] <= 0) return;
  int x_lo, x_hi, y_lo, y_hi;
  tile_rect(means2d[i].x, means2d[i].y, radii[i], width, height, x_lo, x_hi, y_lo, y_hi);
  const int tiles_x = (width + TILE - 1) / TILE;
  // Depths of visible Gaussians are positive, so their float bits sort like the values.
  const uint64_t depth_bits = (uint64_t)__float_as_uint(depths[i]);
  int64_t out = offsets[i] - (int64_t)(x_hi - x_lo) * (y_hi - y_lo);
  for (int ty = y_lo; ty < y_hi; ++ty)
    for (int tx = x_lo; tx < x_hi; ++tx, ++out) {
      keys[out] = ((uint64_t)(ty * tiles_x + tx) << 32) | depth_bits;
      gauss_ids[out] = i;
      positions[out] = (int32_t)out;
    }
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

cudaError_t launch_tile_counts(const float* means2d, const int32_t* radii, int n, int width, int height,
                               int64_t* counts, int64_t* offsets, void* temp, size_t temp_bytes, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const int threads = 256;
  tile_counts_kernel<<<(n + threads - 1) / threads, threads, 0, stream>>>((const float2*)means2d, radii, n, width,
                                                                           height, counts);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  return cub::DeviceScan::InclusiveSum(temp, temp_bytes, counts, offsets, n, stream);
}

cudaError_t launch_emit_keys(const float* means2d, const int32_t* radii, const float* depths, const int64_t* offsets,
                             int n, int width, int height, uint64_t* keys, int32_t* gauss_ids, int32_t* positions,
                             cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const int threads = 256;
  emit_keys_kernel<<<(n + threads - 1) / threads, threads, 0, stream>>>((const float2*)means2d, radii, depths,
                                                                         offsets, n, width, height, keys, gauss_ids,
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
