// Training kernels: the photometric loss (L1 + D-SSIM) with its gradient, Adam, and the screen-space gradient
// statistics that densification reads. Each replaces tens of small torch launches per step.
#include "splatwright.h"

namespace splatwright {

namespace {

constexpr int SSIM_RADIUS = 5;  // 11x11 Gaussian window, sigma 1.5, zero padding ("same" size), as 3DGS
constexpr float SSIM_SIGMA = 1.5f;
constexpr float SSIM_C1 = 0.01f * 0.01f;
constexpr float SSIM_C2 = 0.03f * 0.03f;
constexpr int LOSS_BLOCK_X = 16, LOSS_BLOCK_Y = 16;
constexpr int N_STATS = 15;     // per channel: mu_x, mu_y, E[x^2], E[y^2], E[xy]
constexpr int N_PARTIALS = 9;   // per channel: dS/dmu_x, dS/dE[x^2], dS/dE[xy]

__device__ void window_weights(float* w) {
  float sum = 0.f;
  for (int k = -SSIM_RADIUS; k <= SSIM_RADIUS; ++k) {
    w[k + SSIM_RADIUS] = expf(-(float)(k * k) / (2.f * SSIM_SIGMA * SSIM_SIGMA));
    sum += w[k + SSIM_RADIUS];
  }
  for (int k = 0; k <= 2 * SSIM_RADIUS; ++k) w[k] /= sum;
}

// The loss target's value i in [0, 1]: a float target as stored; an 8-bit one (a dataset's views) as v / 255,
// correctly rounded (__fdiv_rn), so it equals torch's uint8 -> float32 / 255 on the CPU.
__device__ __forceinline__ float target_value(const float* __restrict__ t, int i) { return t[i]; }
__device__ __forceinline__ float target_value(const uint8_t* __restrict__ t, int i) {
  return __fdiv_rn((float)t[i], 255.f);
}

// acc[s] = sum_k w_k src[p + k][s] over the window along a row (VERTICAL false) or a column (true), with zero
// padding; src holds N values per pixel.
template <int N, bool VERTICAL>
__device__ __forceinline__ void blur_pixel(const float* __restrict__ src, int width, int height, int col, int row,
                                           const float* w, float* acc) {
  for (int s = 0; s < N; ++s) acc[s] = 0.f;
  for (int k = -SSIM_RADIUS; k <= SSIM_RADIUS; ++k) {
    const int c = VERTICAL ? col : col + k, r = VERTICAL ? row + k : row;
    if (c < 0 || c >= width || r < 0 || r >= height) continue;
    const float wk = w[k + SSIM_RADIUS];
    const float* in = src + (size_t)N * (r * width + c);
    for (int s = 0; s < N; ++s) acc[s] += wk * in[s];
  }
}

// blur_pixel of this thread's pixel (col, row); false, with nothing done, for a thread outside the image.
template <int N, bool VERTICAL>
__device__ __forceinline__ bool blur_own_pixel(const float* __restrict__ src, int width, int height, int& col,
                                               int& row, float* acc) {
  float w[2 * SSIM_RADIUS + 1];
  window_weights(w);
  col = blockIdx.x * blockDim.x + threadIdx.x;
  row = blockIdx.y * blockDim.y + threadIdx.y;
  if (col >= width || row >= height) return false;
  blur_pixel<N, VERTICAL>(src, width, height, col, row, w, acc);
  return true;
}

// Horizontal pass of the SSIM statistics: rows[p][c*5 + s] = sum_k w_k f_s(x, y)[p + (k, 0)], channel c.
// Target (here and below): float or uint8, read through target_value.
template <typename Target>
__global__ void ssim_stats_rows_kernel(const float* __restrict__ x, const Target* __restrict__ y, int width,
                                       int height, float* __restrict__ rows) {
  float w[2 * SSIM_RADIUS + 1];
  window_weights(w);
  const int col = blockIdx.x * blockDim.x + threadIdx.x, row = blockIdx.y * blockDim.y + threadIdx.y;
  if (col >= width || row >= height) return;
  float acc[N_STATS] = {};
  for (int k = -SSIM_RADIUS; k <= SSIM_RADIUS; ++k) {
    const int c = col + k;
    if (c < 0 || c >= width) continue;
    const float wk = w[k + SSIM_RADIUS];
    const int base = 3 * (row * width + c);
    for (int ch = 0; ch < 3; ++ch) {
      const float a = x[base + ch], b = target_value(y, base + ch);
      acc[ch * 5 + 0] += wk * a;
      acc[ch * 5 + 1] += wk * b;
      acc[ch * 5 + 2] += wk * a * a;
      acc[ch * 5 + 3] += wk * b * b;
      acc[ch * 5 + 4] += wk * a * b;
    }
  }
  float* out = rows + (size_t)N_STATS * (row * width + col);
  for (int s = 0; s < N_STATS; ++s) out[s] = acc[s];
}

// Vertical pass, then the SSIM map S and its partial derivatives w.r.t. the statistics that depend on x.
// Each block writes its sums of S and |x - y| to block_sums[2b], [2b + 1] (reduced later in a fixed order,
// so the loss is deterministic).
template <typename Target>
__global__ void ssim_map_kernel(const float* __restrict__ x, const Target* __restrict__ y,
                                const float* __restrict__ rows, int width, int height, float* __restrict__ partials,
                                float* __restrict__ block_sums) {
  float w[2 * SSIM_RADIUS + 1];
  window_weights(w);
  const int col = blockIdx.x * blockDim.x + threadIdx.x, row = blockIdx.y * blockDim.y + threadIdx.y;
  float ssim_sum = 0.f, l1_sum = 0.f;
  if (col < width && row < height) {
    float acc[N_STATS];
    blur_pixel<N_STATS, true>(rows, width, height, col, row, w, acc);
    const int p = row * width + col;
    float* out = partials + (size_t)N_PARTIALS * p;
    for (int ch = 0; ch < 3; ++ch) {
      const float mx = acc[ch * 5 + 0], my = acc[ch * 5 + 1];
      const float sxx = acc[ch * 5 + 2] - mx * mx, syy = acc[ch * 5 + 3] - my * my, sxy = acc[ch * 5 + 4] - mx * my;
      const float a1 = 2.f * mx * my + SSIM_C1, a2 = 2.f * sxy + SSIM_C2;
      const float b1 = mx * mx + my * my + SSIM_C1, b2 = sxx + syy + SSIM_C2;
      const float inv = 1.f / (b1 * b2);
      const float s = a1 * a2 * inv;
      ssim_sum += s;
      out[ch * 3 + 0] = (2.f * my * (a2 - a1) - 2.f * mx * s * (b2 - b1)) * inv;  // dS/dmu_x
      out[ch * 3 + 1] = -s / b2;                                                  // dS/dE[x^2]
      out[ch * 3 + 2] = 2.f * a1 * inv;                                           // dS/dE[xy]
      l1_sum += fabsf(x[3 * p + ch] - target_value(y, 3 * p + ch));
    }
  }
  // Block reduction in shared memory, fixed order.
  __shared__ float2 sums[LOSS_BLOCK_X * LOSS_BLOCK_Y];
  const int t = threadIdx.y * blockDim.x + threadIdx.x;
  sums[t] = make_float2(ssim_sum, l1_sum);
  __syncthreads();
  for (int stride = blockDim.x * blockDim.y / 2; stride > 0; stride /= 2) {
    if (t < stride) sums[t] = make_float2(sums[t].x + sums[t + stride].x, sums[t].y + sums[t + stride].y);
    __syncthreads();
  }
  if (t == 0) {
    const int b = blockIdx.y * gridDim.x + blockIdx.x;
    block_sums[2 * b] = sums[0].x;
    block_sums[2 * b + 1] = sums[0].y;
  }
}

// loss = (1 - w) mean|x - y| + w (1 - mean S), over all 3 * width * height values.
__global__ void loss_finalize_kernel(const float* __restrict__ block_sums, int n_blocks, float inv_count,
                                     float ssim_weight, float* __restrict__ loss) {
  __shared__ double ssim_part[256], l1_part[256];
  double s = 0.0, l = 0.0;
  for (int i = threadIdx.x; i < n_blocks; i += blockDim.x) {
    s += block_sums[2 * i];
    l += block_sums[2 * i + 1];
  }
  ssim_part[threadIdx.x] = s;
  l1_part[threadIdx.x] = l;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) {
      ssim_part[threadIdx.x] += ssim_part[threadIdx.x + stride];
      l1_part[threadIdx.x] += l1_part[threadIdx.x + stride];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0)
    *loss = (float)((1.0 - ssim_weight) * l1_part[0] * inv_count + ssim_weight * (1.0 - ssim_part[0] * inv_count));
}

// Horizontal pass of the partial-derivative maps (the window is symmetric, so the adjoint of the blur is
// the same blur with zero padding).
__global__ void ssim_grad_rows_kernel(const float* __restrict__ partials, int width, int height,
                                      float* __restrict__ rows) {
  int col, row;
  float acc[N_PARTIALS];
  if (!blur_own_pixel<N_PARTIALS, false>(partials, width, height, col, row, acc)) return;
  float* out = rows + (size_t)N_PARTIALS * (row * width + col);
  for (int s = 0; s < N_PARTIALS; ++s) out[s] = acc[s];
}

// Vertical pass and the chain rule: dL/dx = g (1 - w) sign(x - y) / M - g w (B_mu + 2 x B_xx + y B_xy) / M,
// with B the blurred partials and g the incoming gradient of the loss.
template <typename Target>
__global__ void loss_grad_kernel(const float* __restrict__ x, const Target* __restrict__ y,
                                 const float* __restrict__ rows, int width, int height, float inv_count,
                                 float ssim_weight, const float* __restrict__ grad_loss, float* __restrict__ grad_x) {
  int col, row;
  float acc[N_PARTIALS];
  if (!blur_own_pixel<N_PARTIALS, true>(rows, width, height, col, row, acc)) return;
  const float g = *grad_loss * inv_count;
  const int p = row * width + col;
  for (int ch = 0; ch < 3; ++ch) {
    const float a = x[3 * p + ch], b = target_value(y, 3 * p + ch);
    const float diff = a - b;
    const float sign = (float)(diff > 0.f) - (float)(diff < 0.f);
    const float d_ssim = acc[ch * 3 + 0] + 2.f * a * acc[ch * 3 + 1] + b * acc[ch * 3 + 2];
    grad_x[3 * p + ch] = g * ((1.f - ssim_weight) * sign - ssim_weight * d_ssim);
  }
}

constexpr int ADAM_THREADS = 256, ADAM_BLOCK_VALUES = 4 * ADAM_THREADS;

// Up to ADAM_TENSORS tensors in one launch: tensor k's values go to blocks [first_block[k], first_block[k + 1]),
// ADAM_BLOCK_VALUES each.
struct AdamLaunch {
  AdamTensor tensors[ADAM_TENSORS];
  int64_t first_block[ADAM_TENSORS + 1];
  int count;
};

__global__ void __launch_bounds__(ADAM_THREADS) adam_kernel(const __grid_constant__ AdamLaunch launch) {
  int k = 0;
  while (k + 1 < launch.count && blockIdx.x >= launch.first_block[k + 1]) ++k;
  const AdamTensor& t = launch.tensors[k];
  const AdamStep& a = t.step;
  const int64_t first = (blockIdx.x - launch.first_block[k]) * ADAM_BLOCK_VALUES + threadIdx.x;
#pragma unroll
  for (int64_t i = first; i < first + ADAM_BLOCK_VALUES; i += ADAM_THREADS) {
    if (i >= t.n) break;
    const float g = t.grad[i];
    const float m = a.beta1 * t.exp_avg[i] + (1.f - a.beta1) * g;
    const float v = a.beta2 * t.exp_avg_sq[i] + (1.f - a.beta2) * g * g;
    t.exp_avg[i] = m;
    t.exp_avg_sq[i] = v;
    t.param[i] -= a.step_size * m / (sqrtf(v) * a.inv_sqrt_bias2 + a.eps);
  }
}

__global__ void grad_stats_kernel(const float2* __restrict__ grad_means2d, const int32_t* __restrict__ radii, int n,
                                  float half_width, float half_height, float* __restrict__ grad_sum,
                                  float* __restrict__ count) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n || radii[i] <= 0) return;
  const float2 g = grad_means2d[i];
  grad_sum[i] += hypotf(g.x * half_width, g.y * half_height);
  count[i] += 1.f;
}

dim3 loss_grid(int width, int height) {
  return dim3((width + LOSS_BLOCK_X - 1) / LOSS_BLOCK_X, (height + LOSS_BLOCK_Y - 1) / LOSS_BLOCK_Y);
}

// The launchers' one body for either target type.
template <typename Target>
cudaError_t loss_fwd(const float* image, const Target* target, int width, int height, float ssim_weight,
                     float* workspace, float* partials, float* loss, cudaStream_t stream) {
  const dim3 block(LOSS_BLOCK_X, LOSS_BLOCK_Y), grid = loss_grid(width, height);
  float* rows = workspace;
  float* block_sums = workspace + (size_t)N_STATS * width * height;  // (ssim, l1) per block
  ssim_stats_rows_kernel<Target><<<grid, block, 0, stream>>>(image, target, width, height, rows);
  ssim_map_kernel<Target><<<grid, block, 0, stream>>>(image, target, rows, width, height, partials, block_sums);
  loss_finalize_kernel<<<1, 256, 0, stream>>>(block_sums, grid.x * grid.y, 1.f / (3.f * width * height),
                                              ssim_weight, loss);
  return cudaGetLastError();
}

template <typename Target>
cudaError_t loss_bwd(const float* image, const Target* target, const float* partials, int width, int height,
                     float ssim_weight, const float* grad_loss, float* workspace, float* grad_image,
                     cudaStream_t stream) {
  const dim3 block(LOSS_BLOCK_X, LOSS_BLOCK_Y), grid = loss_grid(width, height);
  ssim_grad_rows_kernel<<<grid, block, 0, stream>>>(partials, width, height, workspace);
  loss_grad_kernel<Target><<<grid, block, 0, stream>>>(image, target, workspace, width, height,
                                                       1.f / (3.f * width * height), ssim_weight, grad_loss,
                                                       grad_image);
  return cudaGetLastError();
}

}  // namespace

size_t loss_workspace_floats(int width, int height) {
  const dim3 grid = loss_grid(width, height);
  return (size_t)N_STATS * width * height + 2 * (size_t)grid.x * grid.y;
}

size_t loss_partials_floats(int width, int height) { return (size_t)N_PARTIALS * width * height; }

cudaError_t launch_loss_fwd(const float* image, const float* target, int width, int height, float ssim_weight,
                            float* workspace, float* partials, float* loss, cudaStream_t stream) {
  return loss_fwd(image, target, width, height, ssim_weight, workspace, partials, loss, stream);
}

cudaError_t launch_loss_fwd(const float* image, const uint8_t* target, int width, int height, float ssim_weight,
                            float* workspace, float* partials, float* loss, cudaStream_t stream) {
  return loss_fwd(image, target, width, height, ssim_weight, workspace, partials, loss, stream);
}

cudaError_t launch_loss_bwd(const float* image, const float* target, const float* partials, int width, int height,
                            float ssim_weight, const float* grad_loss, float* workspace, float* grad_image,
                            cudaStream_t stream) {
  return loss_bwd(image, target, partials, width, height, ssim_weight, grad_loss, workspace, grad_image, stream);
}

cudaError_t launch_loss_bwd(const float* image, const uint8_t* target, const float* partials, int width, int height,
                            float ssim_weight, const float* grad_loss, float* workspace, float* grad_image,
                            cudaStream_t stream) {
  return loss_bwd(image, target, partials, width, height, ssim_weight, grad_loss, workspace, grad_image, stream);
}

cudaError_t launch_adam(const AdamTensor* tensors, int count, cudaStream_t stream) {
  for (int start = 0; start < count; start += ADAM_TENSORS) {
    AdamLaunch launch{};
    launch.count = count - start < ADAM_TENSORS ? count - start : ADAM_TENSORS;
    for (int k = 0; k < launch.count; ++k) {
      const AdamTensor& t = tensors[start + k];
      launch.tensors[k] = t;
      launch.first_block[k + 1] = launch.first_block[k] + (t.n + ADAM_BLOCK_VALUES - 1) / ADAM_BLOCK_VALUES;
    }
    const int64_t blocks = launch.first_block[launch.count];
    if (blocks == 0) continue;
    adam_kernel<<<(unsigned)blocks, ADAM_THREADS, 0, stream>>>(launch);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

cudaError_t launch_grad_stats(const float* grad_means2d, const int32_t* radii, int n, int width, int height,
                              float* grad_sum, float* count, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const int threads = 256;
  grad_stats_kernel<<<(n + threads - 1) / threads, threads, 0, stream>>>(
      reinterpret_cast<const float2*>(grad_means2d), radii, n, 0.5f * width, 0.5f * height, grad_sum, count);
  return cudaGetLastError();
}

}  // namespace splatwright
