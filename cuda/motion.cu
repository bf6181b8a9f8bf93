// A 4D model's Gaussians at one time (backend/dynamic.py is the reference): one thread per Gaussian, one launch
// for the forward and one for the backward, in place of the dozens of elementwise torch operations the same
// formulas take. With dt = t - time_center:
//   means(t) = means + velocity dt + acceleration dt^2 / 2
//   quats(t) = q(angular_velocity dt) quats   (q(r): the unit quaternion turning by |r| about r / |r|)
//   logits(t) = logit(sigmoid(logit) exp(-precision dt^2 / 2))
#include "splatwright.h"

namespace splatwright {
namespace {

constexpr float LOGIT_CEILING = 60.f;  // as the reference: e^x overflows float32 past 88; logit 60 is opacity 1
constexpr float SERIES_BELOW = 0.5f;   // angles under which the half-angle factors come from their series

// s(a) = sin(a / 2) / a and s'(a) / a, for the quaternion (cos(a / 2), s(a) r) of a rotation vector r, a = |r|.
// The series keep both exact near a = 0, where the closed forms cancel.
__device__ void half_angle_factors(float a, float& s, float& ds_over_a) {
  const float a2 = a * a;
  if (a < SERIES_BELOW) {
    s = 0.5f + a2 * (-1.f / 48.f + a2 * (1.f / 3840.f - a2 * (1.f / 645120.f)));
    ds_over_a = -1.f / 24.f + a2 * (1.f / 960.f + a2 * (-1.f / 107520.f + a2 * (1.f / 23224320.f)));
  } else {
    float sin_half, cos_half;
    sincosf(0.5f * a, &sin_half, &cos_half);
    s = sin_half / a;
    ds_over_a = (0.5f * a * cos_half - sin_half) / (a2 * a);
  }
}

struct Quat {
  float w, x, y, z;
};

__device__ Quat load_quat(const float* q) { return {q[0], q[1], q[2], q[3]}; }

__device__ Quat multiply(const Quat& a, const Quat& b) {  // Hamilton product a b: b's rotation, then a's
  return {a.w * b.w - a.x * b.x - a.y * b.y - a.z * b.z, a.w * b.x + b.w * a.x + a.y * b.z - a.z * b.y,
          a.w * b.y + b.w * a.y + a.z * b.x - a.x * b.z, a.w * b.z + b.w * a.z + a.x * b.y - a.y * b.x};
}

__global__ void motion_fwd_kernel(MotionArgs m, float* __restrict__ means_t, float* __restrict__ quats_t,
                                  float* __restrict__ logits_t) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= m.n) return;
  const float dt = m.time - m.time_centers[i];
  for (int k = 0; k < 3; ++k) {
    means_t[3 * i + k] = m.means[3 * i + k] + dt * (m.velocities[3 * i + k] + 0.5f * dt * m.accelerations[3 * i + k]);
  }
  const float rx = m.angular_velocities[3 * i] * dt, ry = m.angular_velocities[3 * i + 1] * dt,
              rz = m.angular_velocities[3 * i + 2] * dt;
  const float angle = sqrtf(rx * rx + ry * ry + rz * rz);
  float s, ds_over_a;
  half_angle_factors(angle, s, ds_over_a);
  const Quat q = multiply({cosf(0.5f * angle), s * rx, s * ry, s * rz}, load_quat(m.quats + 4 * i));
  quats_t[4 * i] = q.w, quats_t[4 * i + 1] = q.x, quats_t[4 * i + 2] = q.y, quats_t[4 * i + 3] = q.z;
  const float x = m.opacity_logits[i], log_visibility = -0.5f * m.time_precisions[i] * dt * dt;
  logits_t[i] = x + log_visibility - log1pf(-expf(fminf(x, LOGIT_CEILING)) * expm1f(log_visibility));
}

__global__ void motion_bwd_kernel(MotionArgs m, const float* __restrict__ grad_means_t,
                                  const float* __restrict__ grad_quats_t, const float* __restrict__ grad_logits_t,
                                  float* __restrict__ grad_velocities, float* __restrict__ grad_accelerations,
                                  float* __restrict__ grad_angular_velocities, float* __restrict__ grad_quats,
                                  float* __restrict__ grad_logits, float* __restrict__ grad_time_centers,
                                  float* __restrict__ grad_time_precisions) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= m.n) return;
  const float dt = m.time - m.time_centers[i];
  float grad_dt = 0.f;

  // means(t): the means' own gradient is grad_means_t unchanged (the caller passes it on)
  for (int k = 0; k < 3; ++k) {
    const float g = grad_means_t[3 * i + k], v = m.velocities[3 * i + k], a = m.accelerations[3 * i + k];
    grad_velocities[3 * i + k] = g * dt;
    grad_accelerations[3 * i + k] = g * 0.5f * dt * dt;
    grad_dt += g * (v + a * dt);
  }

  // quats(t) = turn b with turn = (cos(angle / 2), s r), r = w dt
  const float wx = m.angular_velocities[3 * i], wy = m.angular_velocities[3 * i + 1],
              wz = m.angular_velocities[3 * i + 2];
  const float rx = wx * dt, ry = wy * dt, rz = wz * dt;
  const float angle = sqrtf(rx * rx + ry * ry + rz * rz);
  float s, ds_over_a;
  half_angle_factors(angle, s, ds_over_a);
  const Quat a{cosf(0.5f * angle), s * rx, s * ry, s * rz}, b = load_quat(m.quats + 4 * i);
  const Quat g = load_quat(grad_quats_t + 4 * i);
  // d(a b)/da and d(a b)/db, transposed onto g = dL/d(a b)
  const float ga_w = g.w * b.w + g.x * b.x + g.y * b.y + g.z * b.z;
  const float ga_x = -g.w * b.x + b.w * g.x + (b.y * g.z - b.z * g.y);
  const float ga_y = -g.w * b.y + b.w * g.y + (b.z * g.x - b.x * g.z);
  const float ga_z = -g.w * b.z + b.w * g.z + (b.x * g.y - b.y * g.x);
  grad_quats[4 * i] = g.w * a.w + g.x * a.x + g.y * a.y + g.z * a.z;
  grad_quats[4 * i + 1] = -g.w * a.x + a.w * g.x - (a.y * g.z - a.z * g.y);
  grad_quats[4 * i + 2] = -g.w * a.y + a.w * g.y - (a.z * g.x - a.x * g.z);
  grad_quats[4 * i + 3] = -g.w * a.z + a.w * g.z - (a.x * g.y - a.y * g.x);
  // a(r): d cos(angle / 2)/dr = -s r / 2; d(s r)/dr = s I + (s'(angle) / angle) r r^T
  const float radial = ds_over_a * (rx * ga_x + ry * ga_y + rz * ga_z) - 0.5f * s * ga_w;
  const float gr_x = s * ga_x + radial * rx, gr_y = s * ga_y + radial * ry, gr_z = s * ga_z + radial * rz;
  grad_angular_velocities[3 * i] = gr_x * dt;
  grad_angular_velocities[3 * i + 1] = gr_y * dt;
  grad_angular_velocities[3 * i + 2] = gr_z * dt;
  grad_dt += gr_x * wx + gr_y * wy + gr_z * wz;

  // logits(t) = x + l - log(1 - e^x expm1(l)), l = -precision dt^2 / 2
  const float x = m.opacity_logits[i], precision = m.time_precisions[i];
  const float l = -0.5f * precision * dt * dt;
  const float odds = expf(fminf(x, LOGIT_CEILING)), denominator = 1.f - odds * expm1f(l);
  const float gl = grad_logits_t[i];
  grad_logits[i] = gl * (x <= LOGIT_CEILING ? 1.f + odds * expm1f(l) / denominator : 1.f);
  const float grad_l = gl * (1.f + odds * expf(l) / denominator);
  grad_time_precisions[i] = grad_l * (-0.5f * dt * dt);
  grad_dt += grad_l * (-precision * dt);

  grad_time_centers[i] = -grad_dt;
}

constexpr int MOTION_THREADS = 256;

}  // namespace

cudaError_t launch_motion_fwd(const MotionArgs& m, float* means_t, float* quats_t, float* logits_t,
                              cudaStream_t stream) {
  if (m.n == 0) return cudaSuccess;
  motion_fwd_kernel<<<(m.n + MOTION_THREADS - 1) / MOTION_THREADS, MOTION_THREADS, 0, stream>>>(m, means_t, quats_t,
                                                                                                logits_t);
  return cudaGetLastError();
}

cudaError_t launch_motion_bwd(const MotionArgs& m, const float* grad_means_t, const float* grad_quats_t,
                              const float* grad_logits_t, float* grad_velocities, float* grad_accelerations,
                              float* grad_angular_velocities, float* grad_quats, float* grad_logits,
                              float* grad_time_centers, float* grad_time_precisions, cudaStream_t stream) {
  if (m.n == 0) return cudaSuccess;
  motion_bwd_kernel<<<(m.n + MOTION_THREADS - 1) / MOTION_THREADS, MOTION_THREADS, 0, stream>>>(
      m, grad_means_t, grad_quats_t, grad_logits_t, grad_velocities, grad_accelerations, grad_angular_velocities,
      grad_quats, grad_logits, grad_time_centers, grad_time_precisions);
  return cudaGetLastError();
}

}  // namespace splatwright
