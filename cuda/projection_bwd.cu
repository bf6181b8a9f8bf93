// Projection backward: one thread per Gaussian, recomputing the forward's intermediates.
#include "projection.cuh"
#include "rays.cuh"
#include "sh.cuh"
#include "splatwright.h"

namespace splatwright {

__global__ void __launch_bounds__(PROJ_THREADS)
    projection_bwd_kernel(GaussianArgs g, CameraArgs cam_args, float margin_x, float margin_y,
                          const int32_t* __restrict__ radii, const float* __restrict__ grad_means2d,
                          const float* __restrict__ grad_conics, const float* __restrict__ grad_colors,
                          float* __restrict__ grad_means, float* __restrict__ grad_quats,
                          float* __restrict__ grad_scales, float* __restrict__ grad_sh_head,
                          float* __restrict__ grad_sh_tail) {
  extern __shared__ float s_sh[];  // (PROJ_THREADS, stride): SH rows in, their gradients out (in place)
  const int first = blockIdx.x * PROJ_THREADS;
  const int rows = min(PROJ_THREADS, g.n - first);
  const int row_len = g.sh_coeffs * 3, stride = sh_row_stride(g.sh_coeffs);
  const int tail_coeffs = g.sh_coeffs - g.sh_head_coeffs;
  load_sh_rows(s_sh, g.sh_head, g.sh_tail, g.sh_head_coeffs, tail_coeffs, g.sh_degree, first, rows, stride);
  __syncthreads();

  const int i = first + threadIdx.x;
  float* row = s_sh + threadIdx.x * stride;
  if (i < g.n) {
    float* g_mean = grad_means + 3 * i;
    float* g_quat = grad_quats + 4 * i;
    float* g_scale = grad_scales + 3 * i;
    if (radii[i] == 0) {  // culled: it reached no pixel
      for (int j = 0; j < 3; ++j) g_mean[j] = g_scale[j] = 0.f;
      for (int j = 0; j < 4; ++j) g_quat[j] = 0.f;
      for (int k = 0; k < row_len; ++k) row[k] = 0.f;
    } else {
      const Camera cam =
          load_camera(cam_args.viewmat, cam_args.K, cam_args.width, cam_args.height, margin_x, margin_y);
      const float* mean = g.means + 3 * i;
      EwaState e;
      ewa_forward(cam, mean, g.quats + 4 * i, g.scales + 3 * i, e);
      float gm[3] = {0.f, 0.f, 0.f};
      project_gaussian_bwd(cam, e, grad_means2d + 2 * i, grad_conics + 3 * i, gm, g_quat, g_scale);
      sh_color_bwd(g.sh_degree, g.sh_coeffs, mean, cam, row, grad_colors + 3 * i, row, gm);
      for (int j = 0; j < 3; ++j) g_mean[j] = gm[j];
    }
  }
  __syncthreads();
  store_sh_rows(grad_sh_head, grad_sh_tail, s_sh, g.sh_head_coeffs, tail_coeffs, first, rows, stride);
}

// Blender's formation (rays.cuh): the same walk over ray_backward, and the colours' decoding from sRGB.
__global__ void __launch_bounds__(PROJ_THREADS)
    ray_projection_bwd_kernel(GaussianArgs g, CameraArgs cam_args, float margin_x, float margin_y,
                              const int32_t* __restrict__ radii, const float* __restrict__ grad_means2d,
                              const float* __restrict__ grad_rays, const float* __restrict__ grad_colors,
                              const float* __restrict__ grad_drawn, float* __restrict__ grad_means,
                              float* __restrict__ grad_quats, float* __restrict__ grad_scales,
                              float* __restrict__ grad_opacities, float* __restrict__ grad_sh_head,
                              float* __restrict__ grad_sh_tail) {
  extern __shared__ float s_sh[];  // (PROJ_THREADS, stride): SH rows in, their gradients out (in place)
  const int first = blockIdx.x * PROJ_THREADS;
  const int rows = min(PROJ_THREADS, g.n - first);
  const int row_len = g.sh_coeffs * 3, stride = sh_row_stride(g.sh_coeffs);
  const int tail_coeffs = g.sh_coeffs - g.sh_head_coeffs;
  load_sh_rows(s_sh, g.sh_head, g.sh_tail, g.sh_head_coeffs, tail_coeffs, g.sh_degree, first, rows, stride);
  __syncthreads();

  const int i = first + threadIdx.x;
  float* row = s_sh + threadIdx.x * stride;
  if (i < g.n) {
    float* g_mean = grad_means + 3 * i;
    float* g_quat = grad_quats + 4 * i;
    float* g_scale = grad_scales + 3 * i;
    if (radii[i] == 0) {  // culled: it reached no pixel
      for (int j = 0; j < 3; ++j) g_mean[j] = g_scale[j] = 0.f;
      for (int j = 0; j < 4; ++j) g_quat[j] = 0.f;
      grad_opacities[i] = 0.f;
      for (int k = 0; k < row_len; ++k) row[k] = 0.f;
    } else {
      const Camera cam =
          load_camera(cam_args.viewmat, cam_args.K, cam_args.width, cam_args.height, margin_x, margin_y);
      const float* mean = g.means + 3 * i;
      RayState e;
      ray_forward(cam, mean, g.quats + 4 * i, g.scales + 3 * i, e);
      float gm[3] = {0.f, 0.f, 0.f};
      ray_backward(cam, e, g.opacities[i], grad_means2d + 2 * i, grad_rays + (size_t)RAY_PARAMS * i, grad_drawn[i],
                   gm, g_quat, g_scale, grad_opacities[i]);
      // the colour before its decoding, whose slope scales the gradient
      float dir[3], srgb[3], g_srgb[3];
      view_dir(cam, mean, dir);
      sh_color(g.sh_degree, dir, row, srgb);
      for (int ch = 0; ch < 3; ++ch) g_srgb[ch] = grad_colors[3 * i + ch] * srgb_to_linear_slope(srgb[ch]);
      sh_color_bwd(g.sh_degree, g.sh_coeffs, mean, cam, row, g_srgb, row, gm);
      for (int j = 0; j < 3; ++j) g_mean[j] = gm[j];
    }
  }
  __syncthreads();
  store_sh_rows(grad_sh_head, grad_sh_tail, s_sh, g.sh_head_coeffs, tail_coeffs, first, rows, stride);
}

cudaError_t launch_ray_projection_bwd(const GaussianArgs& g, const CameraArgs& cam, const int32_t* radii,
                                      const float* grad_means2d, const float* grad_rays, const float* grad_colors,
                                      const float* grad_drawn, float* grad_means, float* grad_quats,
                                      float* grad_scales, float* grad_opacities, float* grad_sh_head,
                                      float* grad_sh_tail, cudaStream_t stream) {
  if (g.n == 0) return cudaSuccess;
  ray_projection_bwd_kernel<<<projection_blocks(g.n), PROJ_THREADS, sh_rows_bytes(g.sh_coeffs), stream>>>(
      g, cam, (float)(FOV_CLAMP_MARGIN * cam.width), (float)(FOV_CLAMP_MARGIN * cam.height), radii, grad_means2d,
      grad_rays, grad_colors, grad_drawn, grad_means, grad_quats, grad_scales, grad_opacities, grad_sh_head,
      grad_sh_tail);
  return cudaGetLastError();
}

cudaError_t launch_projection_bwd(const GaussianArgs& g, const CameraArgs& cam, const int32_t* radii,
                                  const float* grad_means2d, const float* grad_conics, const float* grad_colors,
                                  float* grad_means, float* grad_quats, float* grad_scales, float* grad_sh_head,
                                  float* grad_sh_tail, cudaStream_t stream) {
  if (g.n == 0) return cudaSuccess;
  const float margin_x = (float)(FOV_CLAMP_MARGIN * cam.width);
  const float margin_y = (float)(FOV_CLAMP_MARGIN * cam.height);
  projection_bwd_kernel<<<projection_blocks(g.n), PROJ_THREADS, sh_rows_bytes(g.sh_coeffs), stream>>>(
      g, cam, margin_x, margin_y, radii, grad_means2d, grad_conics, grad_colors, grad_means, grad_quats,
      grad_scales, grad_sh_head, grad_sh_tail);
  return cudaGetLastError();
}

}  // namespace splatwright
