// Training kernels: the photometric loss (L1 + D-SSIM) with its gradient, Adam, and the screen-space gradient
// statistics that densification reads. Each replaces tens of small torch launches per step.
#include "splatwright.h"

namespace splatwright {

namespace {

constexpr int SSIM_RADIUS = 5;  // 11x11 Gaussian window, sigma 1.5, zero padding ("same" size), as 3DGS
constexpr float SSIM_SIGMA = 1.5f;
constexpr float SSIM_C1 = 0.01f * 0.01f;
constexpr float SSIM_C2 = 0.03f * 0.03f;
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

// A block of the loss kernels takes LOSS_TILE x LOSS_TILE pixels, one thread each, and stages in shared memory
// what the 11x11 window reaches from them: a HALO x HALO square, blurred along its rows first (the HALO rows'
// LOSS_TILE middle columns), then along the columns. Positions outside the image are skipped, as zero padding
// would leave the sums: the same sums in the same order as a row pass and a column pass over the whole image.
constexpr int LOSS_TILE = 16, LOSS_THREADS = LOSS_TILE * LOSS_TILE;
constexpr int HALO = LOSS_TILE + 2 * SSIM_RADIUS;

// Stages N values per pixel of the block's HALO x HALO square from `read(pixel index, value index)` into
// `staged`; positions outside the image are left unset (the passes never read them).
template <int N, typename Read>
__device__ __forceinline__ void stage_halo(int width, int height, float (*staged)[HALO][N], Read read) {
  const int x0 = blockIdx.x * LOSS_TILE - SSIM_RADIUS, y0 = blockIdx.y * LOSS_TILE - SSIM_RADIUS;
  for (int i = threadIdx.y * LOSS_TILE + threadIdx.x; i < HALO * HALO * N; i += LOSS_THREADS) {
    const int hr = i / (HALO * N), hc = i / N % HALO, s = i % N;  // consecutive threads, consecutive values
    const int r = y0 + hr, c = x0 + hc;
    if (r >= 0 && r < height && c >= 0 && c < width) staged[hr][hc][s] = read(r * width + c, s);
  }
}

// The row pass over the staged square: rows[hr][tc][s] = sum_k w_k f(values at (hr, tc + k)), for each of the
// HALO rows inside the image and the block's LOSS_TILE columns; `blur(hr, tc, col, acc)` adds one row's taps.
template <int N, typename Blur>
__device__ __forceinline__ void row_pass(int width, int height, float (*rows)[LOSS_TILE][N], Blur blur) {
  const int y0 = blockIdx.y * LOSS_TILE - SSIM_RADIUS;
  for (int i = threadIdx.y * LOSS_TILE + threadIdx.x; i < HALO * LOSS_TILE; i += LOSS_THREADS) {
    const int hr = i / LOSS_TILE, tc = i % LOSS_TILE, r = y0 + hr, col = blockIdx.x * LOSS_TILE + tc;
    if (r < 0 || r >= height || col >= width) continue;
    float acc[N] = {};
    blur(hr, tc, col, acc);
    for (int s = 0; s < N; ++s) rows[hr][tc][s] = acc[s];
  }
}

// The column pass for this thread's pixel (col, row): acc[s] = sum_k w_k rows[row + k][s].
template <int N>
__device__ __forceinline__ void column_pass(const float (*rows)[LOSS_TILE][N], int height, int row, const float* w,
                                            float* acc) {
  for (int s = 0; s < N; ++s) acc[s] = 0.f;
  for (int k = -SSIM_RADIUS; k <= SSIM_RADIUS; ++k) {
    if (row + k < 0 || row + k >= height) continue;
    const float wk = w[k + SSIM_RADIUS];
    const float* in = rows[threadIdx.y + SSIM_RADIUS + k][threadIdx.x];
    for (int s = 0; s < N; ++s) acc[s] += wk * in[s];
  }
}

// The SSIM statistics (per channel: mu_x, mu_y, E[x^2], E[y^2], E[xy]) blurred over the window, the SSIM map S
// and its partial derivatives w.r.t. the statistics that depend on x. Each block writes its sums of S and
// |x - y| to block_sums[2b], [2b + 1] (reduced later in a fixed order, so the loss is deterministic).
// Target (here and below): float or uint8, read through target_value.
template <typename Target>
__global__ void __launch_bounds__(LOSS_THREADS)
    ssim_map_kernel(const float* __restrict__ x, const Target* __restrict__ y, int width, int height,
                    float* __restrict__ partials, float* __restrict__ block_sums) {
  __shared__ float s_x[HALO][HALO][3], s_y[HALO][HALO][3];
  __shared__ float s_rows[HALO][LOSS_TILE][N_STATS];
  __shared__ float2 sums[LOSS_THREADS];
  float w[2 * SSIM_RADIUS + 1];
  window_weights(w);
  stage_halo<3>(width, height, s_x, [&](int p, int ch) { return x[3 * p + ch]; });
  stage_halo<3>(width, height, s_y, [&](int p, int ch) { return target_value(y, 3 * p + ch); });
  __syncthreads();
  row_pass<N_STATS>(width, height, s_rows, [&](int hr, int tc, int col, float* acc) {
    for (int k = -SSIM_RADIUS; k <= SSIM_RADIUS; ++k) {
      if (col + k < 0 || col + k >= width) continue;
      const float wk = w[k + SSIM_RADIUS];
      for (int ch = 0; ch < 3; ++ch) {
        const float a = s_x[hr][tc + SSIM_RADIUS + k][ch], b = s_y[hr][tc + SSIM_RADIUS + k][ch];
        acc[ch * 5 + 0] += wk * a;
        acc[ch * 5 + 1] += wk * b;
        acc[ch * 5 + 2] += wk * a * a;
        acc[ch * 5 + 3] += wk * b * b;
        acc[ch * 5 + 4] += wk * a * b;
      }
    }
  });
  __syncthreads();
  const int col = blockIdx.x * LOSS_TILE + threadIdx.x, row = blockIdx.y * LOSS_TILE + threadIdx.y;
  float ssim_sum = 0.f, l1_sum = 0.f;
  if (col < width && row < height) {
    float acc[N_STATS];
    column_pass<N_STATS>(s_rows, height, row, w, acc);
    float* out = partials + (size_t)N_PARTIALS * (row * width + col);
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
      const float* own_x = s_x[threadIdx.y + SSIM_RADIUS][threadIdx.x + SSIM_RADIUS];
      const float* own_y = s_y[threadIdx.y + SSIM_RADIUS][threadIdx.x + SSIM_RADIUS];
      l1_sum += fabsf(own_x[ch] - own_y[ch]);
    }
  }
  // Block reduction in shared memory, fixed order.
  const int t = threadIdx.y * LOSS_TILE + threadIdx.x;
  sums[t] = make_float2(ssim_sum, l1_sum);
  __syncthreads();
  for (int stride = LOSS_THREADS / 2; stride > 0; stride /= 2) {
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

// The partial-derivative maps blurred over the window (it is symmetric, so the adjoint of the blur is the same
// blur with zero padding), then the chain rule: dL/dx = g (1 - w) sign(x - y) / M - g w (B_mu + 2 x B_xx +
// y B_xy) / M, with B the blurred partials and g the incoming gradient of the loss.
template <typename Target>
__global__ void __launch_bounds__(LOSS_THREADS)
    loss_grad_kernel(const float* __restrict__ x, const Target* __restrict__ y, const float* __restrict__ partials,
                     int width, int height, float inv_count, float ssim_weight, const float* __restrict__ grad_loss,
                     float* __restrict__ grad_x) {
  __shared__ float s_partials[HALO][HALO][N_PARTIALS];
  __shared__ float s_rows[HALO][LOSS_TILE][N_PARTIALS];
  float w[2 * SSIM_RADIUS + 1];
  window_weights(w);
  stage_halo<N_PARTIALS>(width, height, s_partials, [&](int p, int s) { return partials[N_PARTIALS * p + s]; });
  __syncthreads();
  row_pass<N_PARTIALS>(width, height, s_rows, [&](int hr, int tc, int col, float* acc) {
    for (int k = -SSIM_RADIUS; k <= SSIM_RADIUS; ++k) {
      if (col + k < 0 || col + k >= width) continue;
      const float wk = w[k + SSIM_RADIUS];
      const float* in = s_partials[hr][tc + SSIM_RADIUS + k];
      for (int s = 0; s < N_PARTIALS; ++s) acc[s] += wk * in[s];
    }
  });
  __syncthreads();
  const int col = blockIdx.x * LOSS_TILE + threadIdx.x, row = blockIdx.y * LOSS_TILE + threadIdx.y;
  if (col >= width || row >= height) return;
  float acc[N_PARTIALS];
  column_pass<N_PARTIALS>(s_rows, height, row, w, acc);
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
  return dim3((width + LOSS_TILE - 1) / LOSS_TILE, (height + LOSS_TILE - 1) / LOSS_TILE);
}

// The launchers' one body for either target type.
template <typename Target>
cudaError_t loss_fwd(const float* image, const Target* target, int width, int height, float ssim_weight,
                     float* block_sums, float* partials, float* loss, cudaStream_t stream) {
  const dim3 block(LOSS_TILE, LOSS_TILE), grid = loss_grid(width, height);
  ssim_map_kernel<Target><<<grid, block, 0, stream>>>(image, target, width, height, partials, block_sums);
  loss_finalize_kernel<<<1, 256, 0, stream>>>(block_sums, grid.x * grid.y, 1.f / (3.f * width * height),
                                              ssim_weight, loss);
  return cudaGetLastError();
}

template <typename Target>
cudaError_t loss_bwd(const float* image, const Target* target, const float* partials, int width, int height,
                     float ssim_weight, const float* grad_loss, float* grad_image, cudaStream_t stream) {
  const dim3 block(LOSS_TILE, LOSS_TILE), grid = loss_grid(width, height);
  loss_grad_kernel<Target><<<grid, block, 0, stream>>>(image, target, partials, width, height,
                                                       1.f / (3.f * width * height), ssim_weight, grad_loss,
                                                       grad_image);
  return cudaGetLastError();
}

}  // namespace

size_t loss_block_sums_floats(int width, int height) {
  const dim3 grid = loss_grid(width, height);
  return 2 * (size_t)grid.x * grid.y;
}

size_t loss_partials_floats(int width, int height) { return (size_t)N_PARTIALS * width * height; }

cudaError_t launch_loss_fwd(const float* image, const float* target, int width, int height, float ssim_weight,
                            float* block_sums, float* partials, float* loss, cudaStream_t stream) {
  return loss_fwd(image, target, width, height, ssim_weight, block_sums, partials, loss, stream);
}

cudaError_t launch_loss_fwd(const float* image, const uint8_t* target, int width, int height, float ssim_weight,
                            float* block_sums, float* partials, float* loss, cudaStream_t stream) {
  return loss_fwd(image, target, width, height, ssim_weight, block_sums, partials, loss, stream);
}

cudaError_t launch_loss_bwd(const float* image, const float* target, const float* partials, int width, int height,
                            float ssim_weight, const float* grad_loss, float* grad_image, cudaStream_t stream) {
  return loss_bwd(image, target, partials, width, height, ssim_weight, grad_loss, grad_image, stream);
}

cudaError_t launch_loss_bwd(const float* image, const uint8_t* target, const float* partials, int width, int height,
                            float ssim_weight, const float* grad_loss, float* grad_image, cudaStream_t stream) {
  return loss_bwd(image, target, partials, width, height, ssim_weight, grad_loss, grad_image, stream);
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
