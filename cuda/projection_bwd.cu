// Projection backward: one thread per Gaussian, recomputing the forward's intermediates.
#include "projection.cuh"
#include "sh.cuh"
#include "splatwright.h"

namespace splatwright {

__global__ void projection_bwd_kernel(GaussianArgs g, CameraArgs cam_args, float margin_x, float margin_y,
                                      const int32_t* __restrict__ radii, const float* __restrict__ grad_means2d,
                                      const float* __restrict__ grad_conics, const float* __restrict__ grad_colors,
                                      float* __restrict__ grad_means, float* __restrict__ grad_quats,
                                      float* __restrict__ grad_scales, float* __restrict__ grad_sh) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= g.n) return;
  float* g_mean = grad_means + 3 * i;
  float* g_quat = grad_quats + 4 * i;
  float* g_scale = grad_scales + 3 * i;
  float* g_sh = grad_sh + (size_t)i * g.sh_coeffs * 3;
  if (radii[i] == 0) {  // culled: it reached no pixel
    for (int j = 0; j < 3; ++j) g_mean[j] = g_scale[j] = 0.f;
    for (int j = 0; j < 4; ++j) g_quat[j] = 0.f;
    for (int k = 0; k < g.sh_coeffs * 3; ++k) g_sh[k] = 0.f;
    return;
  }
  const Camera cam = load_camera(cam_args.viewmat, cam_args.K, cam_args.width, cam_args.height, margin_x, margin_y);
  const float* mean = g.means + 3 * i;
  EwaState e;
  ewa_forward(cam, mean, g.quats + 4 * i, g.scales + 3 * i, e);
  float gm[3] = {0.f, 0.f, 0.f};
  project_gaussian_bwd(cam, e, grad_means2d + 2 * i, grad_conics + 3 * i, gm, g_quat, g_scale);
  sh_color_bwd(g.sh_degree, g.sh_coeffs, mean, cam, g.sh + (size_t)i * g.sh_coeffs * 3, grad_colors + 3 * i,
               g_sh, gm);
  for (int j = 0; j < 3; ++j) g_mean[j] = gm[j];
}

cudaError_t launch_projection_bwd(const GaussianArgs& g, const CameraArgs& cam, const int32_t* radii,
                                  const float* grad_means2d, const float* grad_conics, const float* grad_colors,
                                  float* grad_means, float* grad_quats, float* grad_scales, float* grad_sh,
                                  cudaStream_t stream) {
  if (g.n == 0) return cudaSuccess;
  const float margin_x = (float)(FOV_CLAMP_MARGIN * cam.width);
  const float margin_y = (float)(FOV_CLAMP_MARGIN * cam.height);
  const int threads = 256;
  projection_bwd_kernel<<<(g.n + threads - 1) / threads, threads, 0, stream>>>(
      g, cam, margin_x, margin_y, radii, grad_means2d, grad_conics, grad_colors, grad_means, grad_quats,
      grad_scales, grad_sh);
  return cudaGetLastError();
}

}  // namespace splatwright
