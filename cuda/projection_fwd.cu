// Projection forward: one thread per Gaussian.
#include "projection.cuh"
#include "sh.cuh"
#include "splatwright.h"

namespace splatwright {

__global__ void __launch_bounds__(PROJ_THREADS)
    projection_fwd_kernel(GaussianArgs g, CameraArgs cam_args, float margin_x, float margin_y,
                          float* __restrict__ means2d, float* __restrict__ conics, float* __restrict__ depths,
                          int32_t* __restrict__ radii, float* __restrict__ colors) {
  extern __shared__ float s_sh[];  // (PROJ_THREADS, stride): this block's SH rows
  const int first = blockIdx.x * PROJ_THREADS;
  const int row_len = g.sh_coeffs * 3, stride = row_len | 1;
  load_rows(s_sh, g.sh + (size_t)first * row_len, min(PROJ_THREADS, g.n - first), row_len, stride);
  __syncthreads();

  const int i = first + threadIdx.x;
  if (i >= g.n) return;
  const Camera cam = load_camera(cam_args.viewmat, cam_args.K, cam_args.width, cam_args.height, margin_x, margin_y);
  const float* mean = g.means + 3 * i;
  EwaState e;
  int radius;
  project_gaussian(cam, mean, g.quats + 4 * i, g.scales + 3 * i, g.opacities[i], e, means2d + 2 * i, conics + 3 * i,
                   radius);
  depths[i] = e.p[2];
  radii[i] = radius;
  float* color = colors + 3 * i;
  if (radius == 0) {  // culled: nothing reads its colour
    color[0] = color[1] = color[2] = 0.f;
    return;
  }
  float dir[3];
  view_dir(cam, mean, dir);
  sh_color(g.sh_degree, dir, s_sh + threadIdx.x * stride, color);
}

cudaError_t launch_projection_fwd(const GaussianArgs& g, const CameraArgs& cam, float* means2d, float* conics,
                                  float* depths, int32_t* radii, float* colors, cudaStream_t stream) {
  if (g.n == 0) return cudaSuccess;
  const float margin_x = (float)(FOV_CLAMP_MARGIN * cam.width);
  const float margin_y = (float)(FOV_CLAMP_MARGIN * cam.height);
  const size_t smem = sizeof(float) * PROJ_THREADS * ((g.sh_coeffs * 3) | 1);
  projection_fwd_kernel<<<(g.n + PROJ_THREADS - 1) / PROJ_THREADS, PROJ_THREADS, smem, stream>>>(
      g, cam, margin_x, margin_y, means2d, conics, depths, radii, colors);
  return cudaGetLastError();
}

}  // namespace splatwright
