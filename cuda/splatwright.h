// Launchers of the Splatwright CUDA kernels. They take raw device pointers (float32, contiguous,
// row-major) and a stream, so this header and the kernel files need no torch headers. Each returns the
// launch's error status (cudaSuccess, or what the launch or CUB reported).
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

#include "constants.h"
#include "rays.cuh"

namespace splatwright {

constexpr int MAX_SH_COEFFS = 16;  // degree 3; the projection kernels stage this many per Gaussian at most

struct GaussianArgs {
  const float* means;   // (n, 3) world space
  const float* quats;   // (n, 4) w, x, y, z; need not be unit length
  const float* scales;  // (n, 3)
  // Each Gaussian's SH coefficients in two parts, so that a model's sh_dc and sh_rest are read where they are:
  const float* sh_head;  // (n, sh_head_coeffs, 3) the first coefficients (sh_dc, or all of them)
  const float* sh_tail;  // (n, sh_coeffs - sh_head_coeffs, 3) the others (sh_rest, or none)
  const float* opacities;  // (n,) in [0, 1], for the footprint radius; null in the backward (it reads radii)
  int n;
  int sh_head_coeffs;   // 1 .. sh_coeffs
  int sh_coeffs;        // coefficients stored per Gaussian, (sh_degree + 1)^2 .. MAX_SH_COEFFS
  int sh_degree;        // 0..3
};

struct CameraArgs {
  const float* viewmat;  // (4, 4) world-to-camera, device memory
  const float* K;        // (3, 3) intrinsics in pixels, device memory
  int width;
  int height;
};

// Projection, one thread per Gaussian, in two launches so that the GPU has the colours to compute while the host
// waits for the binning's entry count (the binning's steps below):
//   launch_projection_fwd: screen-space means, conics (a, b, c) of the inverse 2D covariance, view depths and
//     footprint radii (0 = culled); and for the binning, the tiles each footprint meets (tile_counts, see
//     projection.cuh's FootprintTiles) and the range of the visible Gaussians' depths (depth_range, 2 values);
//   launch_sh_colors: the SH colours of the Gaussians with radii > 0 (0 for the others).
cudaError_t launch_projection_fwd(const GaussianArgs& g, const CameraArgs& cam, float* means2d, float* conics,
                                  float* depths, int32_t* radii, int64_t* tile_counts, uint32_t* depth_range,
                                  cudaStream_t stream);
// linear: the colours decoded from sRGB to linear light (Blender's image formation).
cudaError_t launch_sh_colors(const GaussianArgs& g, const CameraArgs& cam, const int32_t* radii, bool linear,
                             float* colors, cudaStream_t stream);

// Blender's image formation's projection (rays.cuh), one thread per Gaussian: the forward writes means2d (n, 2),
// the ray parameters (n, RAY_PARAMS), the opacities as drawn (n,) (g.opacities are the model's), the footprints'
// pixel rectangles (n, 4) and radii (n,) (0: not drawn); launch_sh_colors with linear set gives the colours. The
// backward takes the gradients w.r.t. those (grad_means2d holding the part through the ray parameters' centre:
// raster.cuh's Rays::store) and the colours, and writes every element of the gradients w.r.t. means, quats,
// scales, opacities and the SH coefficients' two parts.
cudaError_t launch_ray_projection_fwd(const GaussianArgs& g, const CameraArgs& cam, float* means2d, float* rays,
                                      float* drawn_opacities, float* rects, int32_t* radii, cudaStream_t stream);
cudaError_t launch_ray_projection_bwd(const GaussianArgs& g, const CameraArgs& cam, const int32_t* radii,
                                      const float* grad_means2d, const float* grad_rays, const float* grad_colors,
                                      const float* grad_drawn, float* grad_means, float* grad_quats,
                                      float* grad_scales, float* grad_opacities, float* grad_sh_head,
                                      float* grad_sh_tail, cudaStream_t stream);

// Blender's image formation's film (film.cu), one thread per pixel: the splats' linear composite color (h, w, 3)
// with its alpha and depth (h, w) over the background (3 display values), through the film filter's whole-pixel
// taps, into the image (h, w, 3) in display values, with alpha and depth filtered alike; `filtered` (h, w, 3) keeps
// the linear values for the backward, which gives the gradients w.r.t. color and alpha from those w.r.t. the image
// and the filtered alpha.
cudaError_t launch_film_fwd(const float* color, const float* alpha, const float* depth, const float* background,
                            int width, int height, float* image, float* alpha_out, float* depth_out, float* filtered,
                            cudaStream_t stream);
cudaError_t launch_film_bwd(const float* filtered, const float* background, const float* grad_image,
                            const float* grad_alpha_out, int width, int height, float* grad_color, float* grad_alpha,
                            cudaStream_t stream);

// Gradients of a loss w.r.t. means, quats, scales and the two parts of the SH coefficients, given those w.r.t.
// means2d, conics and colors. Every output element is written (zeros for culled Gaussians and unused SH
// coefficients).
cudaError_t launch_projection_bwd(const GaussianArgs& g, const CameraArgs& cam, const int32_t* radii,
                                  const float* grad_means2d, const float* grad_conics, const float* grad_colors,
                                  float* grad_means, float* grad_quats, float* grad_scales, float* grad_sh_head,
                                  float* grad_sh_tail, cudaStream_t stream);

// A 4D model's Gaussians at `time` (motion.cu; backend/dynamic.py's reference): means, quats and opacity
// logits at that time from the static part and the motion, one thread per Gaussian.
struct MotionArgs {
  const float* means;               // (n, 3) at the time centre
  const float* velocities;          // (n, 3)
  const float* accelerations;       // (n, 3)
  const float* angular_velocities;  // (n, 3) rotation vector per unit of time
  const float* quats;               // (n, 4) at the time centre
  const float* opacity_logits;      // (n,) at the time centre
  const float* time_centers;        // (n,)
  const float* time_precisions;     // (n,) >= 0
  int n;
  float time;
};
cudaError_t launch_motion_fwd(const MotionArgs& m, float* means_t, float* quats_t, float* logits_t,
                              cudaStream_t stream);
// Gradients w.r.t. every motion input but the means (whose gradient is grad_means_t itself), every element
// written, from those w.r.t. the outputs.
cudaError_t launch_motion_bwd(const MotionArgs& m, const float* grad_means_t, const float* grad_quats_t,
                              const float* grad_logits_t, float* grad_velocities, float* grad_accelerations,
                              float* grad_angular_velocities, float* grad_quats, float* grad_logits,
                              float* grad_time_centers, float* grad_time_precisions, cudaStream_t stream);

// Tiles in a width x height image.
inline int tile_count(int width, int height) { return ((width + TILE - 1) / TILE) * ((height + TILE - 1) / TILE); }

// Tile binning, in steps so the caller can allocate between them:
//   1. launch_projection_fwd's tile counts and depth range;
//   2. launch_entry_ends: the counts' inclusive sum (entry_ends): Gaussian i's entries are
//      [entry_ends[i - 1], entry_ends[i]) in emit order;
//   3. the caller reads entry_ends[n - 1] = number of (tile, Gaussian) entries;
//   4. launch_sort_entries: key (tile, depth key), Gaussian id and emit position per entry; a stable radix sort
//      of the keys carrying the emit positions; the Gaussian ids in sorted order; [start, end) of each tile's
//      entries in the sorted list. Keys are 32-bit where the depth keeps at least MIN_DEPTH_KEY_BITS bits beside
//      the tile (up to 2^14 tiles, a 2048x2048 image), else 64-bit with the depth's full 32 bits
//      (sort_key_bytes(width, height) each).
int depth_key_bits(int width, int height);
inline int sort_key_bytes(int width, int height) { return depth_key_bits(width, height) < 32 ? 4 : 8; }
size_t scan_temp_bytes(int n);
size_t sort_temp_bytes(int n_entries, int width, int height);
cudaError_t launch_entry_ends(const int64_t* tile_counts, int n, int64_t* entry_ends, void* temp, size_t temp_bytes,
                              cudaStream_t stream);
struct BinInputs {
  const float* means2d;
  const float* conics;
  const float* opacities;
  const int32_t* radii;
  const float* depths;
  const uint32_t* depth_range;  // launch_projection_fwd's
  int n, width, height;
};
struct SortBuffers {
  int32_t* gauss_ids;         // (n_entries) in emit order
  int32_t* positions;         // (n_entries) emit positions, in emit order
  int32_t* sorted_positions;  // (n_entries) emit position of each sorted entry
  int32_t* sorted_ids;        // (n_entries) Gaussian of each sorted entry
  int32_t* ranges;            // (n_tiles, 2)
  void* temp;                 // sort_temp_bytes
  size_t temp_bytes;
};
cudaError_t launch_sort_entries(const BinInputs& in, const int64_t* entry_ends, int n_entries, void* keys,
                                void* sorted_keys, const SortBuffers& out, cudaStream_t stream);
// The blender formation's binning, in the same steps: 1. launch_rect_tile_counts, the tiles of each splat's
// footprint rectangle (RayBinInputs.rects; 0 where radii is 0); 2. and 3. as above; 4. launch_sort_ray_entries,
// each entry keyed by (tile, the view depth of the splat's maximum along the ray through the tile's pixel nearest
// to its projected centre, at least 0), 64-bit keys of ray_sort_key_bytes each, sorted as above.
struct RayBinInputs {
  const float* means2d;
  const float* rays;   // (n, RAY_PARAMS)
  const float* rects;  // (n, 4)
  const int32_t* radii;
  int n, width, height;
};
constexpr int ray_sort_key_bytes() { return 8; }
size_t ray_sort_temp_bytes(int n_entries, int width, int height);
cudaError_t launch_rect_tile_counts(const RayBinInputs& in, int64_t* tile_counts, cudaStream_t stream);
cudaError_t launch_sort_ray_entries(const RayBinInputs& in, const int64_t* entry_ends, int n_entries, void* keys,
                                    void* sorted_keys, const SortBuffers& out, cudaStream_t stream);
//   5. launch_tile_batches: each tile's list cut into batches of BLOCK_SIZE entries (TileBatches below), at most
//      max_tile_batches(n_entries, n_tiles) of them; batch_counts and batch_offsets hold n_tiles + 1 values.
int max_tile_batches(int n_entries, int n_tiles);
size_t batch_scan_temp_bytes(int n_tiles);
cudaError_t launch_tile_batches(const int32_t* ranges, int n_tiles, int32_t* batch_counts, int32_t* batch_offsets,
                                int32_t* batch_tiles, void* temp, size_t temp_bytes, cudaStream_t stream);

// The tiles' entry lists in batches of BLOCK_SIZE. The backward runs one block per batch, so a busy tile's long
// list is spread over many blocks; the forward records where each batch leaves every pixel of its tile.
struct TileBatches {
  const int32_t* offsets;        // (n_tiles + 1) each tile's first batch; offsets[n_tiles] = the number of batches
  const int32_t* tiles;          // (max_tile_batches) the tile of each batch
  float4 (*states)[BLOCK_SIZE];  // per batch and pixel: (T, red, green, blue composited) after the batch's
                                 // entries; the tile's last batch holds the final values. Null: not recorded.
};

// The splats a rasterization composites, in one of the two image formations (backend/render/formation.py):
// standard (conics and depths set, rays and rects null) or blender (rays and rects set, conics and depths null).
struct RasterArgs {
  const int32_t* ranges;    // (n_tiles, 2) [start, end) into gauss_ids
  const int32_t* gauss_ids; // sorted entries
  const float* means2d;     // (n, 2)
  const float* conics;      // (n, 3) standard
  const float* depths;      // (n,) standard: the view depths of the centres
  const float* rays;        // (n, RAY_PARAMS) blender
  const float* rects;       // (n, 4) blender: the footprints' pixel rectangles (u_lo, u_hi, v_lo, v_hi)
  const float* colors;      // (n, 3)
  const float* opacities;   // (n,)
  const float* background;  // (3,)
  int width;
  int height;
};

// Front-to-back compositing, one block per tile. Outputs per pixel: image (h, w, 3) over the background,
// alpha = 1 - T_final, depth = sum w_i z_i, T_final, and n_contrib = how many of the tile's entries the
// pixel walked through up to its last contributor.
// With batches.states set it also records the batch states (for the backward).
cudaError_t launch_rasterize_fwd(const RasterArgs& r, const TileBatches& batches, float* image, float* alpha,
                                 float* depth, float* final_T, int32_t* n_contrib, cudaStream_t stream);

// The gradients of a rasterization, every element written: w.r.t. means2d (n, 2), the splats' shapes (the
// conics (n, 3), or the rays (n, RAY_PARAMS) in the blender formation), colors (n, 3) and opacities (n,).
struct SplatGrads {
  float* means2d;
  float* shapes;
  float* colors;
  float* opacities;
};

// Reverse tile walk over the forward's batches (states recorded), deterministic, from the gradients w.r.t. image
// and alpha. positions maps sorted entries to emit positions and entry_ends is binning's inclusive sum (Gaussian
// i's entries end there); entry_grads is a workspace of entry_grad_floats(n_entries, r) floats, every one of
// which the backward writes.
size_t entry_grad_floats(int n_entries, const RasterArgs& r);
cudaError_t launch_rasterize_bwd(const RasterArgs& r, const TileBatches& batches, int max_batches,
                                 const int32_t* positions, const int64_t* entry_ends, int n, const float* final_T,
                                 const int32_t* n_contrib, const float* grad_image, const float* grad_alpha,
                                 float* entry_grads, const SplatGrads& grads, cudaStream_t stream);

// Training (training.cu). The photometric loss (1 - w) mean|x - y| + w (1 - mean SSIM) of an image against a
// target, both (height, width, 3): the forward writes the scalar loss and the SSIM map's partial derivatives
// (loss_partials_floats), with loss_block_sums_floats of scratch for its blocks' sums; the backward turns them
// into dL/d(image) given dL/d(loss) in device memory. The target is float in [0, 1], or uint8 (a dataset's
// stored views), read as v / 255.
size_t loss_block_sums_floats(int width, int height);
size_t loss_partials_floats(int width, int height);
cudaError_t launch_loss_fwd(const float* image, const float* target, int width, int height, float ssim_weight,
                            float* block_sums, float* partials, float* loss, cudaStream_t stream);
cudaError_t launch_loss_fwd(const float* image, const uint8_t* target, int width, int height, float ssim_weight,
                            float* block_sums, float* partials, float* loss, cudaStream_t stream);
cudaError_t launch_loss_bwd(const float* image, const float* target, const float* partials, int width, int height,
                            float ssim_weight, const float* grad_loss, float* grad_image, cudaStream_t stream);
cudaError_t launch_loss_bwd(const float* image, const uint8_t* target, const float* partials, int width, int height,
                            float ssim_weight, const float* grad_loss, float* grad_image, cudaStream_t stream);

// One Adam step on each of `count` tensors of n values: m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
// p -= step_size m / (sqrt(v) inv_sqrt_bias2 + eps), with step_size = lr / (1 - b1^t), inv_sqrt_bias2 = 1 / sqrt(1 - b2^t).
// One launch per ADAM_TENSORS tensors.
struct AdamStep {
  float step_size;
  float inv_sqrt_bias2;
  float beta1;
  float beta2;
  float eps;
};
struct AdamTensor {
  float* param;
  const float* grad;
  float* exp_avg;
  float* exp_avg_sq;
  int64_t n;
  AdamStep step;
};
constexpr int ADAM_TENSORS = 8;
cudaError_t launch_adam(const AdamTensor* tensors, int count, cudaStream_t stream);

// Densification statistics: for each Gaussian drawn this step (radii > 0), grad_sum += |dL/d(means2d)| in NDC
// units (pixels times half the image size) and count += 1.
cudaError_t launch_grad_stats(const float* grad_means2d, const int32_t* radii, int n, int width, int height,
                              float* grad_sum, float* count, cudaStream_t stream);

}  // namespace splatwright
