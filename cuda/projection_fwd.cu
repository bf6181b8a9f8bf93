// Projection forward, one thread per Gaussian, in two kernels: the footprint (screen-space centre, conic, depth,
// radius), with the tiles it meets and the visible depths' range, which the binning starts from; then the SH
// colours, which the caller launches once it has asked for the binning's entry count, so that the GPU computes
// them while the host waits for that count (splatwright.h).
#include "projection.cuh"
#include "rays.cuh"
#include "sh.cuh"
#include "splatwright.h"

namespace splatwright {

// Also the range of the visible Gaussians' depth bits: depth_range[0] = max of ~bits (the complement of the
// lowest), depth_range[1] = max of bits, both zeroed before; one atomic per block and value.
__global__ void __launch_bounds__(PROJ_THREADS)
    footprint_kernel(GaussianArgs g, CameraArgs cam_args, float margin_x, float margin_y, float* __restrict__ means2d,
                     float* __restrict__ conics, float* __restrict__ depths, int32_t* __restrict__ radii,
                     int64_t* __restrict__ tile_counts, uint32_t* __restrict__ depth_range) {
  __shared__ uint32_t s_lowest, s_highest;
  if (threadIdx.x == 0) s_lowest = s_highest = 0u;
  __syncthreads();
  const int i = blockIdx.x * PROJ_THREADS + threadIdx.x;
  int radius = 0;
  uint32_t depth_bits = 0u;
  if (i < g.n) {
    const Camera cam =
        load_camera(cam_args.viewmat, cam_args.K, cam_args.width, cam_args.height, margin_x, margin_y);
    EwaState e;
    float mean2d[2], conic[3];
    project_gaussian(cam, g.means + 3 * i, g.quats + 4 * i, g.scales + 3 * i, g.opacities[i], e, mean2d, conic,
                     radius);
    for (int k = 0; k < 2; ++k) means2d[2 * i + k] = mean2d[k];
    for (int k = 0; k < 3; ++k) conics[3 * i + k] = conic[k];
    depths[i] = e.p[2];
    radii[i] = radius;
    tile_counts[i] =
        radius > 0
            ? FootprintTiles(mean2d[0], mean2d[1], conic, g.opacities[i], radius, cam.width, cam.height).count()
            : 0;
    if (radius > 0) depth_bits = __float_as_uint(e.p[2]);
  }
  const bool visible = radius > 0;
  const uint32_t lowest = __reduce_max_sync(0xffffffffu, visible ? ~depth_bits : 0u);
  const uint32_t highest = __reduce_max_sync(0xffffffffu, depth_bits);
  if ((threadIdx.x & 31) == 0 && highest > 0u) {
    atomicMax(&s_lowest, lowest);
    atomicMax(&s_highest, highest);
  }
  __syncthreads();
  if (threadIdx.x == 0 && s_highest > 0u) {
    atomicMax(depth_range, s_lowest);
    atomicMax(depth_range + 1, s_highest);
  }
}

// Blender's formation (rays.cuh), one thread per Gaussian.
__global__ void __launch_bounds__(PROJ_THREADS)
    ray_projection_kernel(GaussianArgs g, CameraArgs cam_args, float margin_x, float margin_y,
                          float* __restrict__ means2d, float* __restrict__ rays, float* __restrict__ drawn_opacities,
                          float* __restrict__ rects, int32_t* __restrict__ radii) {
  const int i = blockIdx.x * PROJ_THREADS + threadIdx.x;
  if (i >= g.n) return;
  const Camera cam = load_camera(cam_args.viewmat, cam_args.K, cam_args.width, cam_args.height, margin_x, margin_y);
  RayState e;
  ray_forward(cam, g.means + 3 * i, g.quats + 4 * i, g.scales + 3 * i, e);
  const float drawn = g.opacities[i] * e.area;
  int radius;
  ray_footprint(cam, e, drawn, rects + 4 * i, radius);
  ray_parameters(cam, e, rays + (size_t)RAY_PARAMS * i);
  for (int k = 0; k < 2; ++k) means2d[2 * i + k] = e.mean2d[k];
  drawn_opacities[i] = drawn;
  radii[i] = radius;
}

__global__ void __launch_bounds__(PROJ_THREADS)
    sh_colors_kernel(GaussianArgs g, CameraArgs cam_args, const int32_t* __restrict__ radii, bool linear,
                     float* __restrict__ colors) {
  extern __shared__ float s_sh[];  // (PROJ_THREADS, stride): this block's SH rows
  const int first = blockIdx.x * PROJ_THREADS;
  const int stride = sh_row_stride(g.sh_coeffs);
  load_sh_rows(s_sh, g.sh_head, g.sh_tail, g.sh_head_coeffs, g.sh_coeffs - g.sh_head_coeffs, g.sh_degree, first,
               min(PROJ_THREADS, g.n - first), stride);
  __syncthreads();

  const int i = first + threadIdx.x;
  if (i >= g.n) return;
  float* color = colors + 3 * i;
  if (radii[i] == 0) {  // culled: nothing reads its colour
    color[0] = color[1] = color[2] = 0.f;
    return;
  }
  // Only the camera's pose matters for the view direction; the clamp's margins do not.
  const Camera cam = load_camera(cam_args.viewmat, cam_args.K, cam_args.width, cam_args.height, 0.f, 0.f);
  float dir[3];
  view_dir(cam, g.means + 3 * i, dir);
  sh_color(g.sh_degree, dir, s_sh + threadIdx.x * stride, color);
  if (linear)
    for (int ch = 0; ch < 3; ++ch) color[ch] = srgb_to_linear(color[ch]);
}

cudaError_t launch_projection_fwd(const GaussianArgs& g, const CameraArgs& cam, float* means2d, float* conics,
                                  float* depths, int32_t* radii, int64_t* tile_counts, uint32_t* depth_range,
                                  cudaStream_t stream) {
  const cudaError_t err = cudaMemsetAsync(depth_range, 0, 2 * sizeof(uint32_t), stream);
  if (err != cudaSuccess || g.n == 0) return err;
  const float margin_x = (float)(FOV_CLAMP_MARGIN * cam.width);
  const float margin_y = (float)(FOV_CLAMP_MARGIN * cam.height);
  footprint_kernel<<<projection_blocks(g.n), PROJ_THREADS, 0, stream>>>(g, cam, margin_x, margin_y, means2d, conics,
                                                                       depths, radii, tile_counts, depth_range);
  return cudaGetLastError();
}

cudaError_t launch_ray_projection_fwd(const GaussianArgs& g, const CameraArgs& cam, float* means2d, float* rays,
                                      float* drawn_opacities, float* rects, int32_t* radii, cudaStream_t stream) {
  if (g.n == 0) return cudaSuccess;
  ray_projection_kernel<<<projection_blocks(g.n), PROJ_THREADS, 0, stream>>>(
      g, cam, (float)(FOV_CLAMP_MARGIN * cam.width), (float)(FOV_CLAMP_MARGIN * cam.height), means2d, rays,
      drawn_opacities, rects, radii);
  return cudaGetLastError();
}

cudaError_t launch_sh_colors(const GaussianArgs& g, const CameraArgs& cam, const int32_t* radii, bool linear,
                             float* colors, cudaStream_t stream) {
  if (g.n == 0) return cudaSuccess;
  sh_colors_kernel<<<projection_blocks(g.n), PROJ_THREADS, sh_rows_bytes(g.sh_coeffs), stream>>>(g, cam, radii,
                                                                                                  linear, colors);
  return cudaGetLastError();
}

}  // namespace splatwright
