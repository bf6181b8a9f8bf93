// The one file that knows torch: checks and allocates tensors, passes raw pointers and the current stream to
// the launchers in splatwright.h.
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

#include <atomic>
#include <initializer_list>
#include <limits>
#include <memory>
#include <tuple>

#include "constants.h"
#include "sh.cuh"
#include "splatwright.h"

namespace sw = splatwright;

namespace {

// When set (tests), outputs that kernels must write in full are NaN- / -1-filled instead of left
// uninitialised, so a pixel or Gaussian that no thread wrote shows up. Atomic: the kernels' bindings run
// without the GIL, on any thread.
std::atomic<bool> g_poison_outputs{false};

void set_poison_outputs(bool on) { g_poison_outputs = on; }

torch::Tensor new_output(at::IntArrayRef shape, const torch::TensorOptions& options) {
  if (!g_poison_outputs) return torch::empty(shape, options);
  if (options.dtype() == torch::kFloat32) return torch::full(shape, std::numeric_limits<float>::quiet_NaN(), options);
  return torch::full(shape, -1, options);
}

void check(cudaError_t err, const char* what) {
  TORCH_CHECK(err == cudaSuccess, "splatwright CUDA ", what, " failed: ", cudaGetErrorString(err));
}

void check_input(const torch::Tensor& t, const char* name, torch::ScalarType dtype = torch::kFloat32) {
  TORCH_CHECK(t.is_cuda(), name, " must be a CUDA tensor");
  TORCH_CHECK(t.scalar_type() == dtype, name, " has dtype ", t.scalar_type(), ", expected ", dtype);
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
}

float* fptr(const torch::Tensor& t) { return t.data_ptr<float>(); }
int32_t* iptr(const torch::Tensor& t) { return t.data_ptr<int32_t>(); }

// Scratch buffers of the given sizes in bytes, 256-byte aligned, carved out of one allocation (fewer calls into
// the allocator: the host's time is what bounds a small model's render). `owner` keeps them alive.
std::vector<void*> scratch(std::initializer_list<size_t> sizes, const torch::Tensor& like, torch::Tensor& owner) {
  auto aligned = [](size_t bytes) { return (bytes + 255) & ~(size_t)255; };
  size_t total = 0;
  for (size_t bytes : sizes) total += aligned(bytes);
  owner = torch::empty({(int64_t)total}, like.options().dtype(torch::kUInt8));
  std::vector<void*> buffers;
  char* next = static_cast<char*>(owner.data_ptr());
  for (size_t bytes : sizes) {
    buffers.push_back(next);
    next += aligned(bytes);
  }
  return buffers;
}

// The SH coefficients come in two parts, sh_head (N, K1, 3) and sh_tail (N, K2, 3), each Gaussian's K1 + K2
// coefficients in that order: a model's sh_dc and sh_rest as they are, or a whole (N, K, 3) and an empty tail.
sw::GaussianArgs gaussian_args(const torch::Tensor& means, const torch::Tensor& quats, const torch::Tensor& scales,
                               const torch::Tensor& sh_head, const torch::Tensor& sh_tail, const float* opacities,
                               int64_t sh_degree) {
  check_input(means, "means");
  check_input(quats, "quats");
  check_input(scales, "scales");
  check_input(sh_head, "sh_head");
  check_input(sh_tail, "sh_tail");
  const int64_t n = means.size(0);
  TORCH_CHECK(means.dim() == 2 && means.size(1) == 3, "means must be (N, 3)");
  TORCH_CHECK(quats.dim() == 2 && quats.size(0) == n && quats.size(1) == 4, "quats must be (N, 4)");
  TORCH_CHECK(scales.dim() == 2 && scales.size(0) == n && scales.size(1) == 3, "scales must be (N, 3)");
  for (const torch::Tensor* part : {&sh_head, &sh_tail}) {
    TORCH_CHECK(part->dim() == 3 && part->size(0) == n && part->size(2) == 3, "sh_head and sh_tail must be (N, K, 3)");
    TORCH_CHECK(part->device() == means.device(), "sh_head and sh_tail must be on the means' device");
  }
  TORCH_CHECK(sh_head.size(1) >= 1, "sh_head must hold at least the first coefficient");
  const int64_t coeffs = sh_head.size(1) + sh_tail.size(1);
  TORCH_CHECK(sh_degree >= 0 && sh_degree <= 3, "sh_degree must be 0..3");
  TORCH_CHECK(coeffs >= sw::degree_coeffs((int)sh_degree), "sh has too few coefficients for the degree");
  TORCH_CHECK(coeffs <= sw::MAX_SH_COEFFS, "sh has more than ", sw::MAX_SH_COEFFS, " coefficients");
  TORCH_CHECK(n <= std::numeric_limits<int>::max(), "too many Gaussians");
  return {fptr(means), fptr(quats), fptr(scales), fptr(sh_head), fptr(sh_tail), opacities, (int)n,
          (int)sh_head.size(1), (int)coeffs, (int)sh_degree};
}

sw::CameraArgs camera_args(const torch::Tensor& viewmat, const torch::Tensor& K, int64_t width, int64_t height) {
  check_input(viewmat, "viewmat");
  check_input(K, "K");
  TORCH_CHECK(viewmat.numel() == 16 && K.numel() == 9, "viewmat must be (4, 4) and K (3, 3)");
  TORCH_CHECK(width >= 0 && height >= 0, "image size must be non-negative");
  return {fptr(viewmat), fptr(K), (int)width, (int)height};
}

// An int64 on its way from the GPU to pinned host memory, behind an event. Not copyable: the memory goes back
// to torch's pinned pool only once the copy is done.
class PendingCount {
 public:
  PendingCount(const int64_t* source, cudaStream_t stream)
      : host_(torch::empty({1}, torch::TensorOptions().dtype(torch::kInt64).pinned_memory(true))) {
    check(cudaEventCreateWithFlags(&copied_, cudaEventDisableTiming), "creating an event");
    check(cudaMemcpyAsync(host_.data_ptr<int64_t>(), source, sizeof(int64_t), cudaMemcpyDeviceToHost, stream),
          "copying a count to the host");
    check(cudaEventRecord(copied_, stream), "recording an event");
  }
  PendingCount(const PendingCount&) = delete;
  PendingCount& operator=(const PendingCount&) = delete;
  ~PendingCount() {
    cudaEventSynchronize(copied_);
    cudaEventDestroy(copied_);
  }

  int64_t wait() const {
    check(cudaEventSynchronize(copied_), "waiting for a count");
    return host_.data_ptr<int64_t>()[0];
  }

 private:
  torch::Tensor host_;  // (1,) int64, pinned
  cudaEvent_t copied_;
};

// Where project_forward leaves the binning (its steps in splatwright.h): each Gaussian's entries' end in emit
// order (entry_ends (N,) int64), the visible depths' range (depth_range, 2 uint32 bit patterns in int32) and the
// number of entries on its way to the host (none where there are no Gaussians).
struct TileCounts {
  torch::Tensor entry_ends, depth_range;
  std::shared_ptr<const PendingCount> entries_on_host;

  int64_t entries() const { return entries_on_host ? entries_on_host->wait() : 0; }
};

// Returns means2d (N, 2), conics (N, 3), depths (N,), radii (N,) int32, colors (N, 3) and the TileCounts. The
// colours are launched after the entry count's copy, so that the GPU computes them while bin_tiles waits for it.
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor, TileCounts> project_forward(
    const torch::Tensor& means, const torch::Tensor& quats, const torch::Tensor& scales,
    const torch::Tensor& opacities, const torch::Tensor& sh_head, const torch::Tensor& sh_tail,
    const torch::Tensor& viewmat, const torch::Tensor& K, int64_t width, int64_t height, int64_t sh_degree) {
  const c10::cuda::CUDAGuard guard(means.device());
  check_input(opacities, "opacities");
  TORCH_CHECK(opacities.numel() == means.size(0), "opacities must be (N,)");
  const sw::GaussianArgs g = gaussian_args(means, quats, scales, sh_head, sh_tail, fptr(opacities), sh_degree);
  const sw::CameraArgs cam = camera_args(viewmat, K, width, height);
  const auto f32 = means.options(), i64 = f32.dtype(torch::kInt64);
  const int64_t n = g.n;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  torch::Tensor means2d = new_output({n, 2}, f32), conics = new_output({n, 3}, f32), depths = new_output({n}, f32);
  torch::Tensor radii = new_output({n}, f32.dtype(torch::kInt32)), colors = new_output({n, 3}, f32);
  TileCounts counts{torch::empty({n}, i64), torch::empty({2}, f32.dtype(torch::kInt32)), nullptr};
  const size_t scan_temp_bytes = sw::scan_temp_bytes((int)n);
  torch::Tensor owner;
  const std::vector<void*> buffers = scratch({sizeof(int64_t) * n, scan_temp_bytes}, means, owner);
  int64_t* tile_counts = static_cast<int64_t*>(buffers[0]);
  check(sw::launch_projection_fwd(g, cam, fptr(means2d), fptr(conics), fptr(depths), iptr(radii), tile_counts,
                                  reinterpret_cast<uint32_t*>(iptr(counts.depth_range)), stream),
        "projection forward");
  if (n > 0) {
    int64_t* entry_ends = counts.entry_ends.data_ptr<int64_t>();
    check(sw::launch_entry_ends(tile_counts, (int)n, entry_ends, buffers[1], scan_temp_bytes, stream),
          "tile counts' sum");
    counts.entries_on_host = std::make_shared<const PendingCount>(entry_ends + n - 1, stream);
  }
  check(sw::launch_sh_colors(g, cam, iptr(radii), false, fptr(colors), stream), "SH colours");
  return {means2d, conics, depths, radii, colors, counts};
}

// Returns grads w.r.t. means, quats, scales, sh_head and sh_tail.
std::vector<torch::Tensor> project_backward(const torch::Tensor& means, const torch::Tensor& quats,
                                            const torch::Tensor& scales, const torch::Tensor& sh_head,
                                            const torch::Tensor& sh_tail, const torch::Tensor& viewmat,
                                            const torch::Tensor& K, int64_t width, int64_t height,
                                            int64_t sh_degree, const torch::Tensor& radii,
                                            const torch::Tensor& grad_means2d, const torch::Tensor& grad_conics,
                                            const torch::Tensor& grad_colors) {
  const c10::cuda::CUDAGuard guard(means.device());
  const sw::GaussianArgs g = gaussian_args(means, quats, scales, sh_head, sh_tail, nullptr, sh_degree);
  const sw::CameraArgs cam = camera_args(viewmat, K, width, height);
  check_input(radii, "radii", torch::kInt32);
  check_input(grad_means2d, "grad_means2d");
  check_input(grad_conics, "grad_conics");
  check_input(grad_colors, "grad_colors");
  torch::Tensor gm = new_output(means.sizes(), means.options()), gq = new_output(quats.sizes(), quats.options());
  torch::Tensor gs = new_output(scales.sizes(), scales.options());
  torch::Tensor g_head = new_output(sh_head.sizes(), sh_head.options());
  torch::Tensor g_tail = new_output(sh_tail.sizes(), sh_tail.options());
  check(sw::launch_projection_bwd(g, cam, iptr(radii), fptr(grad_means2d), fptr(grad_conics), fptr(grad_colors),
                                  fptr(gm), fptr(gq), fptr(gs), fptr(g_head), fptr(g_tail),
                                  c10::cuda::getCurrentCUDAStream()),
        "projection backward");
  return {gm, gq, gs, g_head, g_tail};
}

// Blender's formation's projection (splatwright.h's launch_ray_projection_fwd): returns means2d (N, 2), rays (N,
// RAY_PARAMS), colors (N, 3) in linear light, opacities as drawn (N,), rects (N, 4) and radii (N,) int32.
std::vector<torch::Tensor> ray_project_forward(const torch::Tensor& means, const torch::Tensor& quats,
                                               const torch::Tensor& scales, const torch::Tensor& opacities,
                                               const torch::Tensor& sh_head, const torch::Tensor& sh_tail,
                                               const torch::Tensor& viewmat, const torch::Tensor& K, int64_t width,
                                               int64_t height, int64_t sh_degree) {
  const c10::cuda::CUDAGuard guard(means.device());
  check_input(opacities, "opacities");
  TORCH_CHECK(opacities.numel() == means.size(0), "opacities must be (N,)");
  const sw::GaussianArgs g = gaussian_args(means, quats, scales, sh_head, sh_tail, fptr(opacities), sh_degree);
  const sw::CameraArgs cam = camera_args(viewmat, K, width, height);
  const auto f32 = means.options();
  const int64_t n = g.n;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  torch::Tensor means2d = new_output({n, 2}, f32), rays = new_output({n, sw::RAY_PARAMS}, f32);
  torch::Tensor colors = new_output({n, 3}, f32), drawn = new_output({n}, f32), rects = new_output({n, 4}, f32);
  torch::Tensor radii = new_output({n}, f32.dtype(torch::kInt32));
  check(sw::launch_ray_projection_fwd(g, cam, fptr(means2d), fptr(rays), fptr(drawn), fptr(rects), iptr(radii),
                                      stream),
        "ray projection forward");
  check(sw::launch_sh_colors(g, cam, iptr(radii), true, fptr(colors), stream), "SH colours");
  return {means2d, rays, colors, drawn, rects, radii};
}

// Returns grads w.r.t. means, quats, scales, opacities and the SH coefficients' two parts.
std::vector<torch::Tensor> ray_project_backward(const torch::Tensor& means, const torch::Tensor& quats,
                                                const torch::Tensor& scales, const torch::Tensor& opacities,
                                                const torch::Tensor& sh_head, const torch::Tensor& sh_tail,
                                                const torch::Tensor& viewmat, const torch::Tensor& K, int64_t width,
                                                int64_t height, int64_t sh_degree, const torch::Tensor& radii,
                                                const torch::Tensor& grad_means2d, const torch::Tensor& grad_rays,
                                                const torch::Tensor& grad_colors, const torch::Tensor& grad_drawn) {
  const c10::cuda::CUDAGuard guard(means.device());
  const sw::GaussianArgs g = gaussian_args(means, quats, scales, sh_head, sh_tail, fptr(opacities), sh_degree);
  const sw::CameraArgs cam = camera_args(viewmat, K, width, height);
  check_input(radii, "radii", torch::kInt32);
  for (const torch::Tensor* grad : {&grad_means2d, &grad_rays, &grad_colors, &grad_drawn}) check_input(*grad, "grad");
  torch::Tensor gm = new_output(means.sizes(), means.options()), gq = new_output(quats.sizes(), quats.options());
  torch::Tensor gs = new_output(scales.sizes(), scales.options());
  torch::Tensor go = new_output(opacities.sizes(), opacities.options());
  torch::Tensor g_head = new_output(sh_head.sizes(), sh_head.options());
  torch::Tensor g_tail = new_output(sh_tail.sizes(), sh_tail.options());
  check(sw::launch_ray_projection_bwd(g, cam, iptr(radii), fptr(grad_means2d), fptr(grad_rays), fptr(grad_colors),
                                      fptr(grad_drawn), fptr(gm), fptr(gq), fptr(gs), fptr(go), fptr(g_head),
                                      fptr(g_tail), c10::cuda::getCurrentCUDAStream()),
        "ray projection backward");
  return {gm, gq, gs, go, g_head, g_tail};
}

sw::MotionArgs motion_args(const std::vector<torch::Tensor>& motion, double time) {
  TORCH_CHECK(motion.size() == 8, "motion: means, velocities, accelerations, angular_velocities, quats, "
              "opacity_logits, time_centers, time_precisions");
  const char* names[] = {"means", "velocities", "accelerations", "angular_velocities", "quats", "opacity_logits",
                         "time_centers", "time_precisions"};
  const int widths[] = {3, 3, 3, 3, 4, 1, 1, 1};
  const int64_t n = motion[0].size(0);
  TORCH_CHECK(n <= std::numeric_limits<int>::max(), "too many Gaussians");
  for (int k = 0; k < 8; ++k) {
    check_input(motion[k], names[k]);
    TORCH_CHECK(motion[k].numel() == n * widths[k], names[k], " must have ", widths[k], " values per Gaussian");
  }
  return {fptr(motion[0]), fptr(motion[1]), fptr(motion[2]), fptr(motion[3]), fptr(motion[4]), fptr(motion[5]),
          fptr(motion[6]), fptr(motion[7]), (int)n, (float)time};
}

// motion as motion_args takes it; returns means, quats and opacity logits at `time`.
std::vector<torch::Tensor> motion_forward(const std::vector<torch::Tensor>& motion, double time) {
  const c10::cuda::CUDAGuard guard(motion.at(0).device());
  const sw::MotionArgs m = motion_args(motion, time);
  torch::Tensor means_t = new_output(motion[0].sizes(), motion[0].options());
  torch::Tensor quats_t = new_output(motion[4].sizes(), motion[4].options());
  torch::Tensor logits_t = new_output(motion[5].sizes(), motion[5].options());
  check(sw::launch_motion_fwd(m, fptr(means_t), fptr(quats_t), fptr(logits_t), c10::cuda::getCurrentCUDAStream()),
        "motion forward");
  return {means_t, quats_t, logits_t};
}

// Returns grads w.r.t. velocities, accelerations, angular_velocities, quats, opacity_logits, time_centers and
// time_precisions (the means' is grad_means_t).
std::vector<torch::Tensor> motion_backward(const std::vector<torch::Tensor>& motion, double time,
                                           const torch::Tensor& grad_means_t, const torch::Tensor& grad_quats_t,
                                           const torch::Tensor& grad_logits_t) {
  const c10::cuda::CUDAGuard guard(motion.at(0).device());
  const sw::MotionArgs m = motion_args(motion, time);
  check_input(grad_means_t, "grad_means_t");
  check_input(grad_quats_t, "grad_quats_t");
  check_input(grad_logits_t, "grad_logits_t");
  TORCH_CHECK(grad_means_t.numel() == 3 * (int64_t)m.n && grad_quats_t.numel() == 4 * (int64_t)m.n &&
                  grad_logits_t.numel() == m.n,
              "motion_backward: one gradient row per Gaussian");
  std::vector<torch::Tensor> grads;
  for (int k = 1; k < 8; ++k) grads.push_back(new_output(motion[k].sizes(), motion[k].options()));
  check(sw::launch_motion_bwd(m, fptr(grad_means_t), fptr(grad_quats_t), fptr(grad_logits_t), fptr(grads[0]),
                              fptr(grads[1]), fptr(grads[2]), fptr(grads[3]), fptr(grads[4]), fptr(grads[5]),
                              fptr(grads[6]), c10::cuda::getCurrentCUDAStream()),
        "motion backward");
  return grads;
}

// Sorts n_entries tile entries with `sort` (launch_sort_entries or launch_sort_ray_entries, given the keys'
// buffers and the SortBuffers) in keys of key_bytes each, and cuts the tiles' lists into batches. Returns, all
// int32 but the last: tile ranges (n_tiles, 2) and the sorted Gaussian id of each entry (n_entries,), which the
// forward reads; batch offsets (n_tiles + 1,) and batch tiles (max_tile_batches,), which both passes read; and for
// the backward the sorted entries' emit positions (n_entries,) and each Gaussian's entry end (N,) int64
// (entry_ends). backend/render/cuda.py's TileBins names them.
template <typename Sort>
std::vector<torch::Tensor> sorted_bins(int64_t n_entries, size_t key_bytes, size_t sort_temp_bytes,
                                       const torch::Tensor& entry_ends, const torch::Tensor& like, int64_t width,
                                       int64_t height, Sort sort) {
  TORCH_CHECK(n_entries <= std::numeric_limits<int>::max(), "too many tile entries: ", n_entries);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const int n_tiles = sw::tile_count((int)width, (int)height);
  const auto i32 = like.options().dtype(torch::kInt32);
  const size_t id_bytes = n_entries * 4, batch_temp_bytes = sw::batch_scan_temp_bytes(n_tiles);
  torch::Tensor owner;
  const std::vector<void*> buffers = scratch({key_bytes, key_bytes, id_bytes, id_bytes, sort_temp_bytes,
                                              sizeof(int32_t) * (n_tiles + 1), batch_temp_bytes},
                                             like, owner);
  torch::Tensor sorted_ids = torch::empty({n_entries}, i32), sorted_positions = torch::empty({n_entries}, i32);
  torch::Tensor ranges = torch::empty({n_tiles, 2}, i32);
  const sw::SortBuffers out{static_cast<int32_t*>(buffers[2]), static_cast<int32_t*>(buffers[3]),
                            iptr(sorted_positions), iptr(sorted_ids), iptr(ranges), buffers[4], sort_temp_bytes};
  check(sort(buffers[0], buffers[1], out, stream), "sorting tile entries");
  torch::Tensor batch_offsets = torch::empty({n_tiles + 1}, i32);
  torch::Tensor batch_tiles = torch::empty({sw::max_tile_batches((int)n_entries, n_tiles)}, i32);
  check(sw::launch_tile_batches(iptr(ranges), n_tiles, static_cast<int32_t*>(buffers[5]), iptr(batch_offsets),
                                iptr(batch_tiles), buffers[6], batch_temp_bytes, stream),
        "tile batches");
  return {ranges, sorted_ids, batch_offsets, batch_tiles, sorted_positions, entry_ends};
}

// The standard formation's binning (sorted_bins' outputs) of projected splats; `counts`: project_forward's, for
// these splats.
std::vector<torch::Tensor> bin_tiles(const torch::Tensor& means2d, const torch::Tensor& conics,
                                     const torch::Tensor& opacities, const torch::Tensor& radii,
                                     const torch::Tensor& depths, const TileCounts& counts, int64_t width,
                                     int64_t height) {
  const c10::cuda::CUDAGuard guard(means2d.device());
  check_input(means2d, "means2d");
  check_input(conics, "conics");
  check_input(opacities, "opacities");
  check_input(radii, "radii", torch::kInt32);
  check_input(depths, "depths");
  TORCH_CHECK(conics.numel() == 3 * means2d.size(0) && opacities.numel() == means2d.size(0) &&
                  counts.entry_ends.numel() == means2d.size(0),
              "conics, opacities and the tile counts must be (N, 3), (N,) and (N,) for N means2d");
  const int64_t n_entries = counts.entries();  // the one host sync
  const sw::BinInputs in{fptr(means2d), fptr(conics), fptr(opacities), iptr(radii), fptr(depths),
                         reinterpret_cast<const uint32_t*>(iptr(counts.depth_range)), (int)means2d.size(0),
                         (int)width, (int)height};
  // Keys: bit patterns of sort_key_bytes each, which is what is sorted.
  return sorted_bins(n_entries, n_entries * sw::sort_key_bytes((int)width, (int)height),
                     sw::sort_temp_bytes((int)n_entries, (int)width, (int)height), counts.entry_ends, means2d, width,
                     height, [&](void* keys, void* sorted_keys, const sw::SortBuffers& out, cudaStream_t stream) {
                       return sw::launch_sort_entries(in, counts.entry_ends.data_ptr<int64_t>(), (int)n_entries, keys,
                                                      sorted_keys, out, stream);
                     });
}

// The splats of a rasterization in either image formation (splatwright.h's RasterArgs): `shapes` are the conics
// (N, 3) and `placement` the centres' depths (N,) in the standard formation, or the rays (N, RAY_PARAMS) and the
// footprints' pixel rectangles (N, 4) in the blender formation (`rays`).
sw::RasterArgs raster_args(const torch::Tensor& ranges, const torch::Tensor& gauss_ids, const torch::Tensor& means2d,
                           const torch::Tensor& shapes, const torch::Tensor& placement, bool rays,
                           const torch::Tensor& colors, const torch::Tensor& opacities,
                           const torch::Tensor& background, int64_t width, int64_t height) {
  check_input(ranges, "ranges", torch::kInt32);
  check_input(gauss_ids, "gauss_ids", torch::kInt32);
  check_input(means2d, "means2d");
  check_input(shapes, rays ? "rays" : "conics");
  check_input(placement, rays ? "rects" : "depths");
  check_input(colors, "colors");
  check_input(opacities, "opacities");
  check_input(background, "background");
  const int64_t n = means2d.size(0);
  TORCH_CHECK(ranges.numel() == 2 * sw::tile_count((int)width, (int)height),
              "ranges must be (n_tiles, 2) for this image size");
  TORCH_CHECK(means2d.numel() == 2 * n && colors.numel() == 3 * n, "means2d and colors must be (N, 2) and (N, 3)");
  TORCH_CHECK(shapes.numel() == (rays ? sw::RAY_PARAMS : 3) * n && placement.numel() == (rays ? 4 : 1) * n,
              rays ? "rays and rects must be (N, RAY_PARAMS) and (N, 4)" : "conics and depths must be (N, 3) and (N,)");
  TORCH_CHECK(opacities.numel() == n, "opacities must be (N,)");
  TORCH_CHECK(background.numel() == 3, "background must have 3 values");
  return {iptr(ranges), iptr(gauss_ids), fptr(means2d), rays ? nullptr : fptr(shapes), rays ? nullptr : fptr(placement),
          rays ? fptr(shapes) : nullptr, rays ? fptr(placement) : nullptr, fptr(colors), fptr(opacities),
          fptr(background), (int)width, (int)height};
}

// batch_offsets and batch_tiles come from bin_tiles; states is (batches, BLOCK_SIZE, 4) or empty (not recorded).
sw::TileBatches tile_batches(const torch::Tensor& batch_offsets, const torch::Tensor& batch_tiles,
                             const torch::Tensor& states, int64_t width, int64_t height) {
  check_input(batch_offsets, "batch_offsets", torch::kInt32);
  check_input(batch_tiles, "batch_tiles", torch::kInt32);
  TORCH_CHECK(batch_offsets.numel() == sw::tile_count((int)width, (int)height) + 1,
              "batch_offsets must be (n_tiles + 1,)");
  float4(*state_rows)[sw::BLOCK_SIZE] = nullptr;
  if (states.numel() > 0) {
    check_input(states, "batch_states");
    TORCH_CHECK(states.numel() == batch_tiles.numel() * sw::BLOCK_SIZE * 4, "batch_states must be (batches, ",
                sw::BLOCK_SIZE, ", 4)");
    state_rows = reinterpret_cast<float4(*)[sw::BLOCK_SIZE]>(fptr(states));
  }
  return {iptr(batch_offsets), iptr(batch_tiles), state_rows};
}

// Returns image (H, W, 3), alpha (H, W), depth (H, W), final T (H, W), n_contrib (H, W) int32, and the batch
// states the backward needs (empty unless record_states). The splats as raster_args takes them.
std::vector<torch::Tensor> rasterize_forward(const torch::Tensor& ranges, const torch::Tensor& gauss_ids,
                                             const torch::Tensor& batch_offsets, const torch::Tensor& batch_tiles,
                                             const torch::Tensor& means2d, const torch::Tensor& shapes,
                                             const torch::Tensor& placement, bool rays, const torch::Tensor& colors,
                                             const torch::Tensor& opacities, const torch::Tensor& background,
                                             int64_t width, int64_t height, bool record_states) {
  const c10::cuda::CUDAGuard guard(means2d.device());
  const sw::RasterArgs r = raster_args(ranges, gauss_ids, means2d, shapes, placement, rays, colors, opacities,
                                       background, width, height);
  const auto f32 = means2d.options();
  torch::Tensor states = torch::empty({record_states ? batch_tiles.size(0) : 0, sw::BLOCK_SIZE, 4}, f32);
  const sw::TileBatches batches = tile_batches(batch_offsets, batch_tiles, states, width, height);
  torch::Tensor image = new_output({height, width, 3}, f32), alpha = new_output({height, width}, f32);
  torch::Tensor depth = new_output({height, width}, f32), final_T = new_output({height, width}, f32);
  torch::Tensor n_contrib = new_output({height, width}, f32.dtype(torch::kInt32));
  check(sw::launch_rasterize_fwd(r, batches, fptr(image), fptr(alpha), fptr(depth), fptr(final_T), iptr(n_contrib),
                                 c10::cuda::getCurrentCUDAStream()),
        "rasterize forward");
  return {image, alpha, depth, final_T, n_contrib, states};
}

// The tensors a rasterization's backward reads, in this order: bin_tiles' (or bin_ray_tiles') six outputs, the
// batch states, the splats (means2d, shapes, placement, colors, opacities), the background, final T and n_contrib.
constexpr size_t SAVED_TENSORS = 15;

// Returns grads w.r.t. means2d, the shapes (conics or rays), colors and opacities.
std::vector<torch::Tensor> rasterize_backward(const std::vector<torch::Tensor>& saved, bool rays, int64_t width,
                                              int64_t height, const torch::Tensor& grad_image,
                                              const torch::Tensor& grad_alpha) {
  TORCH_CHECK(saved.size() == SAVED_TENSORS, "rasterize_backward takes the tensors a rasterization saved");
  const torch::Tensor &ranges = saved[0], &gauss_ids = saved[1], &batch_offsets = saved[2], &batch_tiles = saved[3];
  const torch::Tensor &positions = saved[4], &entry_ends = saved[5], &batch_states = saved[6], &means2d = saved[7];
  const torch::Tensor &shapes = saved[8], &colors = saved[10], &opacities = saved[11];
  const torch::Tensor &final_T = saved[13], &n_contrib = saved[14];
  const c10::cuda::CUDAGuard guard(means2d.device());
  const sw::RasterArgs r = raster_args(ranges, gauss_ids, means2d, shapes, saved[9], rays, colors, opacities,
                                       saved[12], width, height);
  TORCH_CHECK(batch_states.numel() > 0 || batch_tiles.numel() == 0,
              "rasterize_backward needs the batch states of a forward run with record_states");
  const sw::TileBatches batches = tile_batches(batch_offsets, batch_tiles, batch_states, width, height);
  check_input(positions, "positions", torch::kInt32);
  check_input(entry_ends, "entry_ends", torch::kInt64);
  TORCH_CHECK(positions.numel() == gauss_ids.numel() && entry_ends.numel() == means2d.size(0),
              "positions must be (entries,) and entry_ends (N,), as bin_tiles returns them");
  check_input(final_T, "final_T");
  check_input(n_contrib, "n_contrib", torch::kInt32);
  check_input(grad_image, "grad_image");
  check_input(grad_alpha, "grad_alpha");
  TORCH_CHECK(final_T.numel() == width * height && n_contrib.numel() == width * height &&
                  grad_image.numel() == 3 * width * height && grad_alpha.numel() == width * height,
              "final_T, n_contrib, grad_image and grad_alpha must match the image size");
  torch::Tensor entry_grads =
      torch::empty({(int64_t)sw::entry_grad_floats((int)gauss_ids.numel(), r)}, means2d.options());
  torch::Tensor gm = torch::empty_like(means2d), gs = torch::empty_like(shapes);
  torch::Tensor gcol = torch::empty_like(colors), gop = torch::empty_like(opacities);
  check(sw::launch_rasterize_bwd(r, batches, (int)batch_tiles.size(0), iptr(positions),
                                 entry_ends.data_ptr<int64_t>(), (int)means2d.size(0), fptr(final_T), iptr(n_contrib),
                                 fptr(grad_image), fptr(grad_alpha), fptr(entry_grads),
                                 {fptr(gm), fptr(gs), fptr(gcol), fptr(gop)}, c10::cuda::getCurrentCUDAStream()),
        "rasterize backward");
  return {gm, gs, gcol, gop};
}

// Composites binned splats (`bins`: bin_tiles' or bin_ray_tiles' six outputs). Returns the image (H, W, 3), alpha
// (H, W) and depth (H, W), and what rasterize_backward takes (SAVED_TENSORS).
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor, std::vector<torch::Tensor>> rasterize_binned(
    std::vector<torch::Tensor> bins, const torch::Tensor& means2d, const torch::Tensor& shapes,
    const torch::Tensor& placement, bool rays, const torch::Tensor& colors, const torch::Tensor& opacities,
    const torch::Tensor& background, int64_t width, int64_t height, bool record_states) {
  const std::vector<torch::Tensor> out = rasterize_forward(bins[0], bins[1], bins[2], bins[3], means2d, shapes,
                                                           placement, rays, colors, opacities, background, width,
                                                           height, record_states);
  bins.insert(bins.end(), {out[5], means2d, shapes, placement, colors, opacities, background, out[3], out[4]});
  return {out[0], out[1], out[2], bins};
}

// The standard formation's rasterization of projected splats: bins them (bin_tiles) and composites them.
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor, std::vector<torch::Tensor>> rasterize_projected(
    const torch::Tensor& means2d, const torch::Tensor& conics, const torch::Tensor& colors,
    const torch::Tensor& opacities, const torch::Tensor& depths, const torch::Tensor& radii, const TileCounts& counts,
    const torch::Tensor& background, int64_t width, int64_t height, bool record_states) {
  return rasterize_binned(bin_tiles(means2d, conics, opacities, radii, depths, counts, width, height), means2d, conics,
                          depths, false, colors, opacities, background, width, height, record_states);
}

// The blender formation's binning (sorted_bins' outputs; splatwright.h's RayBinInputs): the entries keyed by
// each splat's depth along a ray through the tile (splatwright.h).
std::vector<torch::Tensor> bin_ray_tiles(const torch::Tensor& means2d, const torch::Tensor& rays,
                                         const torch::Tensor& rects, const torch::Tensor& radii, int64_t width,
                                         int64_t height) {
  const c10::cuda::CUDAGuard guard(means2d.device());
  check_input(means2d, "means2d");
  check_input(rays, "rays");
  check_input(rects, "rects");
  check_input(radii, "radii", torch::kInt32);
  const int64_t n = means2d.size(0);
  TORCH_CHECK(n <= std::numeric_limits<int>::max(), "too many Gaussians");
  TORCH_CHECK(means2d.numel() == 2 * n && rays.numel() == sw::RAY_PARAMS * n && rects.numel() == 4 * n &&
                  radii.numel() == n,
              "means2d, rays, rects and radii must be (N, 2), (N, RAY_PARAMS), (N, 4) and (N,)");
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const sw::RayBinInputs in{fptr(means2d), fptr(rays), fptr(rects), iptr(radii), (int)n, (int)width, (int)height};
  torch::Tensor entry_ends = torch::empty({n}, means2d.options().dtype(torch::kInt64));
  int64_t n_entries = 0;
  if (n > 0) {
    const size_t scan_bytes = sw::scan_temp_bytes((int)n);
    torch::Tensor owner;
    const std::vector<void*> buffers = scratch({sizeof(int64_t) * n, scan_bytes}, means2d, owner);
    check(sw::launch_rect_tile_counts(in, static_cast<int64_t*>(buffers[0]), stream), "rectangle tile counts");
    check(sw::launch_entry_ends(static_cast<int64_t*>(buffers[0]), (int)n, entry_ends.data_ptr<int64_t>(), buffers[1],
                                scan_bytes, stream),
          "tile counts' sum");
    n_entries = PendingCount(entry_ends.data_ptr<int64_t>() + n - 1, stream).wait();  // the one host sync
  }
  return sorted_bins(n_entries, n_entries * sw::ray_sort_key_bytes(),
                     sw::ray_sort_temp_bytes((int)n_entries, (int)width, (int)height), entry_ends, means2d, width,
                     height, [&](void* keys, void* sorted_keys, const sw::SortBuffers& out, cudaStream_t stream) {
                       return sw::launch_sort_ray_entries(in, entry_ends.data_ptr<int64_t>(), (int)n_entries, keys,
                                                          sorted_keys, out, stream);
                     });
}

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The rasterizer's autograd is two Functions, so that means2d is a real intermediate whose gradient densification
// reads: the projection (means, quats, scales, sh -> means2d, conics, depths, radii, colors) and the rasterization
// (means2d, conics, colors, opacities -> image, alpha, depth). Both are C++ so that the backward runs on autograd's
// thread without the GIL or the interpreter: a small model's render is bound by host time.

// `opacities` (detached) only bound the footprint radius; `counts` receives the binning's TileCounts, which
// the rasterization takes and which is not a tensor.
struct Projection : torch::autograd::Function<Projection> {
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& means, const torch::Tensor& quats,
                               const torch::Tensor& scales, const torch::Tensor& sh, const torch::Tensor& opacities,
                               const torch::Tensor& viewmat, const torch::Tensor& K, int64_t width, int64_t height,
                               int64_t sh_degree, TileCounts* counts) {
    auto [means2d, conics, depths, radii, colors, tile_counts] = project_forward(
        means, quats, scales, opacities, sh, no_tail(sh), viewmat, K, width, height, sh_degree);
    *counts = tile_counts;
    ctx->save_for_backward({means, quats, scales, sh, viewmat, K, radii});
    ctx->saved_data["width"] = width;
    ctx->saved_data["height"] = height;
    ctx->saved_data["sh_degree"] = sh_degree;
    ctx->mark_non_differentiable({depths, radii});
    ctx->set_materialize_grads(false);  // no zeros made for depths and radii, which get no gradient
    return {means2d, conics, depths, radii, colors};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const torch::Tensor &means = saved[0], &sh = saved[3];
    const auto or_zeros = [&](const torch::Tensor& grad, int64_t columns) {
      return grad.defined() ? grad.contiguous() : torch::zeros({means.size(0), columns}, means.options());
    };
    const std::vector<torch::Tensor> g = project_backward(
        means, saved[1], saved[2], sh, no_tail(sh), saved[4], saved[5], ctx->saved_data["width"].toInt(),
        ctx->saved_data["height"].toInt(), ctx->saved_data["sh_degree"].toInt(), saved[6], or_zeros(grads[0], 2),
        or_zeros(grads[1], 3), or_zeros(grads[4], 3));
    return {g[0], g[1], g[2], g[3], {}, {}, {}, {}, {}, {}, {}};
  }

  // The empty second part of SH coefficients that come whole (project_forward's sh_tail).
  static torch::Tensor no_tail(const torch::Tensor& sh) { return sh.new_empty({sh.size(0), 0, 3}); }
};

// A rasterization's forward keeps what its backward reads (rasterize_binned's last result, the image size and the
// formation); the backward returns the gradients w.r.t. its first four inputs (means2d, the shapes, colors and
// opacities).
using Binned = std::tuple<torch::Tensor, torch::Tensor, torch::Tensor, std::vector<torch::Tensor>>;

variable_list keep_for_backward(AutogradContext* ctx, Binned result, bool rays, int64_t width, int64_t height) {
  auto& [image, alpha, depth, saved] = result;
  ctx->save_for_backward(saved);
  ctx->saved_data["width"] = width;
  ctx->saved_data["height"] = height;
  ctx->saved_data["rays"] = rays;
  ctx->mark_non_differentiable({depth});
  ctx->set_materialize_grads(false);  // no zeros made for the depth, nor for alpha where no loss reads it
  return {image, alpha, depth};
}

std::vector<torch::Tensor> rasterization_grads(AutogradContext* ctx, const variable_list& grads) {
  const int64_t width = ctx->saved_data["width"].toInt(), height = ctx->saved_data["height"].toInt();
  const variable_list saved = ctx->get_saved_variables();
  const auto f32 = saved[7].options();  // means2d's
  const torch::Tensor grad_image = grads[0].defined() ? grads[0].contiguous() : torch::zeros({height, width, 3}, f32);
  const torch::Tensor grad_alpha = grads[1].defined() ? grads[1].contiguous() : torch::zeros({height, width}, f32);
  return rasterize_backward(saved, ctx->saved_data["rays"].toBool(), width, height, grad_image, grad_alpha);
}

struct Rasterization : torch::autograd::Function<Rasterization> {
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& means2d, const torch::Tensor& conics,
                               const torch::Tensor& colors, const torch::Tensor& opacities,
                               const torch::Tensor& depths, const torch::Tensor& radii, const TileCounts& counts,
                               const torch::Tensor& background, int64_t width, int64_t height, bool record_states) {
    return keep_for_backward(ctx, rasterize_projected(means2d, conics, colors, opacities, depths, radii, counts,
                                                      background, width, height, record_states),
                             false, width, height);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const std::vector<torch::Tensor> g = rasterization_grads(ctx, grads);
    return {g[0], g[1], g[2], g[3], {}, {}, {}, {}, {}, {}, {}};
  }
};

// The blender formation's rasterization (means2d, rays, colors, opacities -> image, alpha, depth).
struct RayRasterization : torch::autograd::Function<RayRasterization> {
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& means2d, const torch::Tensor& rays,
                               const torch::Tensor& colors, const torch::Tensor& opacities, const torch::Tensor& rects,
                               const torch::Tensor& radii, const torch::Tensor& background, int64_t width,
                               int64_t height, bool record_states) {
    return keep_for_backward(ctx, rasterize_binned(bin_ray_tiles(means2d, rays, rects, radii, width, height), means2d,
                                                   rays, rects, true, colors, opacities, background, width, height,
                                                   record_states),
                             true, width, height);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const std::vector<torch::Tensor> g = rasterization_grads(ctx, grads);
    return {g[0], g[1], g[2], g[3], {}, {}, {}, {}, {}, {}};
  }
};

// The rasterizer with autograd, on float32 contiguous CUDA tensors (backend/render/cuda.py's rasterize checks and
// converts them): opacities (N,) or (N, 1), sh (N, K, 3) whole. Returns image (H, W, 3), alpha (H, W), depth
// (H, W), means2d (N, 2), whose .grad the backward fills where it requires grad, and radii (N,) int32.
std::vector<torch::Tensor> rasterize(const torch::Tensor& means, const torch::Tensor& quats,
                                     const torch::Tensor& scales, const torch::Tensor& opacities,
                                     const torch::Tensor& sh, const torch::Tensor& viewmat, const torch::Tensor& K,
                                     const torch::Tensor& background, int64_t width, int64_t height,
                                     int64_t sh_degree) {
  const torch::Tensor flat_opacities = opacities.dim() == 1 ? opacities : opacities.reshape({-1});
  TileCounts counts;
  const variable_list projected = Projection::apply(means, quats, scales, sh, flat_opacities.detach(), viewmat, K,
                                                    width, height, sh_degree, &counts);
  const torch::Tensor &means2d = projected[0], &conics = projected[1], &depths = projected[2];
  const torch::Tensor &radii = projected[3], &colors = projected[4];
  if (means2d.requires_grad()) means2d.retain_grad();
  // what the backward starts each batch from, recorded only where a backward can run
  const bool record_states =
      torch::GradMode::is_enabled() &&
      (means2d.requires_grad() || conics.requires_grad() || colors.requires_grad() || flat_opacities.requires_grad());
  const variable_list image = Rasterization::apply(means2d, conics, colors, flat_opacities, depths, radii, counts,
                                                   background, width, height, record_states);
  return {image[0], image[1], image[2], means2d, radii};
}

// Blender's formation's projection with autograd: (means, quats, scales, opacities, sh) -> means2d, rays, colors,
// opacities as drawn, rects, radii.
struct RayProjection : torch::autograd::Function<RayProjection> {
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& means, const torch::Tensor& quats,
                               const torch::Tensor& scales, const torch::Tensor& opacities, const torch::Tensor& sh,
                               const torch::Tensor& viewmat, const torch::Tensor& K, int64_t width, int64_t height,
                               int64_t sh_degree) {
    variable_list out = ray_project_forward(means, quats, scales, opacities, sh, Projection::no_tail(sh), viewmat, K,
                                            width, height, sh_degree);
    ctx->save_for_backward({means, quats, scales, opacities, sh, viewmat, K, out[5]});
    ctx->saved_data["width"] = width;
    ctx->saved_data["height"] = height;
    ctx->saved_data["sh_degree"] = sh_degree;
    ctx->mark_non_differentiable({out[4], out[5]});
    ctx->set_materialize_grads(false);
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const torch::Tensor& means = saved[0];
    const auto or_zeros = [&](const torch::Tensor& grad, int64_t columns) {
      return grad.defined() ? grad.contiguous() : torch::zeros({means.size(0), columns}, means.options());
    };
    const std::vector<torch::Tensor> g = ray_project_backward(
        means, saved[1], saved[2], saved[3], saved[4], Projection::no_tail(saved[4]), saved[5], saved[6],
        ctx->saved_data["width"].toInt(), ctx->saved_data["height"].toInt(), ctx->saved_data["sh_degree"].toInt(),
        saved[7], or_zeros(grads[0], 2),
        or_zeros(grads[1], sw::RAY_PARAMS), or_zeros(grads[2], 3), or_zeros(grads[3], 1).reshape({-1}));
    return {g[0], g[1], g[2], g[3], g[4], {}, {}, {}, {}, {}};
  }
};

// Blender's formation's film (splatwright.h's launch_film_fwd): the splats' linear composite (color (H, W, 3), alpha
// and depth (H, W)) over `background` (3 display values) into the image in display values, alpha and depth. Returns
// those and the filtered linear colour, which film_backward reads.
std::vector<torch::Tensor> film_forward(const torch::Tensor& color, const torch::Tensor& alpha,
                                        const torch::Tensor& depth, const torch::Tensor& background) {
  const c10::cuda::CUDAGuard guard(color.device());
  for (const torch::Tensor* t : {&color, &alpha, &depth, &background}) check_input(*t, "film input");
  TORCH_CHECK(color.dim() == 3 && color.size(2) == 3 && alpha.sizes() == color.sizes().slice(0, 2) &&
                  depth.sizes() == alpha.sizes() && background.numel() == 3,
              "film: color (H, W, 3), alpha and depth (H, W), background (3,)");
  const int height = (int)color.size(0), width = (int)color.size(1);
  torch::Tensor image = new_output(color.sizes(), color.options()), filtered = new_output(color.sizes(), color.options());
  torch::Tensor alpha_out = new_output(alpha.sizes(), alpha.options()), depth_out = new_output(depth.sizes(), depth.options());
  check(sw::launch_film_fwd(fptr(color), fptr(alpha), fptr(depth), fptr(background), width, height, fptr(image),
                            fptr(alpha_out), fptr(depth_out), fptr(filtered), c10::cuda::getCurrentCUDAStream()),
        "film forward");
  return {image, alpha_out, depth_out, filtered};
}

// Returns the gradients w.r.t. film_forward's color and alpha, from those w.r.t. its image and alpha.
std::vector<torch::Tensor> film_backward(const torch::Tensor& filtered, const torch::Tensor& background,
                                         const torch::Tensor& grad_image, const torch::Tensor& grad_alpha) {
  const c10::cuda::CUDAGuard guard(filtered.device());
  for (const torch::Tensor* t : {&filtered, &background, &grad_image, &grad_alpha}) check_input(*t, "film backward input");
  TORCH_CHECK(grad_image.sizes() == filtered.sizes() && grad_alpha.sizes() == filtered.sizes().slice(0, 2),
              "film backward: grad_image (H, W, 3) and grad_alpha (H, W) of the filtered image's size");
  const int height = (int)filtered.size(0), width = (int)filtered.size(1);
  torch::Tensor grad_color = new_output(filtered.sizes(), filtered.options());
  torch::Tensor grad_alpha_in = new_output(grad_alpha.sizes(), grad_alpha.options());
  check(sw::launch_film_bwd(fptr(filtered), fptr(background), fptr(grad_image), fptr(grad_alpha), width, height,
                            fptr(grad_color), fptr(grad_alpha_in), c10::cuda::getCurrentCUDAStream()),
        "film backward");
  return {grad_color, grad_alpha_in};
}

// The film with autograd: (color, alpha, depth) -> image, alpha, depth; depth takes no gradient, as the
// rasterization's does not.
struct Film : torch::autograd::Function<Film> {
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& color, const torch::Tensor& alpha,
                               const torch::Tensor& depth, const torch::Tensor& background) {
    std::vector<torch::Tensor> out = film_forward(color, alpha, depth, background);
    ctx->save_for_backward({out[3], background});
    ctx->mark_non_differentiable({out[2]});
    ctx->set_materialize_grads(false);
    return {out[0], out[1], out[2]};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const torch::Tensor& filtered = saved[0];
    const auto f32 = filtered.options();
    const torch::Tensor grad_image = grads[0].defined() ? grads[0].contiguous() : torch::zeros(filtered.sizes(), f32);
    const torch::Tensor grad_alpha =
        grads[1].defined() ? grads[1].contiguous() : torch::zeros(filtered.sizes().slice(0, 2), f32);
    const std::vector<torch::Tensor> g = film_backward(filtered, saved[1], grad_image, grad_alpha);
    return {g[0], g[1], {}, {}};
  }
};

// The rasterizer with autograd in Blender's formation (backend/render/cuda.py's rasterize_blender), on what
// rasterize takes. Returns the image (H, W, 3) in display values (the splats over the background in linear light,
// through the film), alpha (H, W) and depth (H, W) filtered alike, means2d (N, 2), whose .grad the backward fills
// where it requires grad (the screen-space gradient: raster.cuh's Rays::store), and radii (N,) int32.
std::vector<torch::Tensor> rasterize_blender(const torch::Tensor& means, const torch::Tensor& quats,
                                             const torch::Tensor& scales, const torch::Tensor& opacities,
                                             const torch::Tensor& sh, const torch::Tensor& viewmat,
                                             const torch::Tensor& K, const torch::Tensor& background, int64_t width,
                                             int64_t height, int64_t sh_degree) {
  const torch::Tensor flat_opacities = opacities.dim() == 1 ? opacities : opacities.reshape({-1});
  const variable_list projected =
      RayProjection::apply(means, quats, scales, flat_opacities, sh, viewmat, K, width, height, sh_degree);
  const torch::Tensor &means2d = projected[0], &rays = projected[1], &colors = projected[2];
  const torch::Tensor &drawn = projected[3], &rects = projected[4], &radii = projected[5];
  if (means2d.requires_grad()) means2d.retain_grad();
  const bool record_states = torch::GradMode::is_enabled() && (means2d.requires_grad() || rays.requires_grad() ||
                                                               colors.requires_grad() || drawn.requires_grad());
  const torch::Tensor black = torch::zeros({3}, means.options());
  const variable_list splats = RayRasterization::apply(means2d, rays, colors, drawn, rects, radii, black, width,
                                                       height, record_states);
  const variable_list image = Film::apply(splats[0], splats[1], splats[2], background);
  return {image[0], image[1], image[2], means2d, radii};
}

// The loss target: float32 in [0, 1], or uint8 (a dataset's stored views, which the kernels read as v / 255).
// Checks it and calls launch(pointer) with a const float* or a const uint8_t*.
template <typename Launch>
cudaError_t with_target(const torch::Tensor& target, Launch launch) {
  const bool bytes = target.scalar_type() == torch::kUInt8;
  check_input(target, "target", bytes ? torch::kUInt8 : torch::kFloat32);
  if (bytes) return launch(static_cast<const uint8_t*>(target.data_ptr<uint8_t>()));
  return launch(static_cast<const float*>(fptr(target)));
}

// Returns the loss (scalar) and the SSIM partial derivatives the backward needs.
std::vector<torch::Tensor> loss_forward(const torch::Tensor& image, const torch::Tensor& target, double ssim_weight) {
  const c10::cuda::CUDAGuard guard(image.device());
  check_input(image, "image");
  TORCH_CHECK(image.dim() == 3 && image.size(2) == 3, "image must be (H, W, 3)");
  TORCH_CHECK(target.sizes() == image.sizes(), "target must have the image's shape");
  const int height = (int)image.size(0), width = (int)image.size(1);
  const auto f32 = image.options();
  torch::Tensor block_sums = torch::empty({(int64_t)sw::loss_block_sums_floats(width, height)}, f32);
  torch::Tensor partials = torch::empty({(int64_t)sw::loss_partials_floats(width, height)}, f32);
  torch::Tensor loss = torch::empty({}, f32);
  check(with_target(target, [&](auto target_ptr) {
          return sw::launch_loss_fwd(fptr(image), target_ptr, width, height, (float)ssim_weight, fptr(block_sums),
                                     fptr(partials), fptr(loss), c10::cuda::getCurrentCUDAStream());
        }),
        "loss forward");
  return {loss, partials};
}

torch::Tensor loss_backward(const torch::Tensor& image, const torch::Tensor& target, const torch::Tensor& partials,
                            double ssim_weight, const torch::Tensor& grad_loss) {
  const c10::cuda::CUDAGuard guard(image.device());
  check_input(image, "image");
  check_input(partials, "partials");
  check_input(grad_loss, "grad_loss");
  TORCH_CHECK(image.dim() == 3 && image.size(2) == 3, "image must be (H, W, 3)");
  TORCH_CHECK(target.sizes() == image.sizes(), "target must have the image's shape");
  const int height = (int)image.size(0), width = (int)image.size(1);
  TORCH_CHECK(partials.numel() == (int64_t)sw::loss_partials_floats(width, height), "partials has the wrong size");
  torch::Tensor grad_image = new_output(image.sizes(), image.options());
  check(with_target(target, [&](auto target_ptr) {
          return sw::launch_loss_bwd(fptr(image), target_ptr, fptr(partials), width, height, (float)ssim_weight,
                                     fptr(grad_loss), fptr(grad_image),
                                     c10::cuda::getCurrentCUDAStream());
        }),
        "loss backward");
  return grad_image;
}

// Adds each gradient to its parameter's .grad (or makes it the .grad), as autograd accumulates them.
void add_grads(const std::vector<torch::Tensor>& params, const std::vector<torch::Tensor>& grads) {
  for (size_t i = 0; i < params.size(); ++i) {
    torch::Tensor& slot = params[i].mutable_grad();
    if (slot.defined()) {
      slot.add_(grads[i]);
    } else {
      slot = grads[i];
    }
  }
}

// One view's photometric loss of a static model and its gradients, added to each parameter's .grad: the loss's and
// the rasterizer's kernels forward and backward, then the chain rule of the activations (scales = exp(log_scales),
// opacities = sigmoid(opacity_logits)). The same kernels and operations in the same order as autograd through
// rasterize, so the gradients are bit-equal to its, for less host time a step (what bounds a step on a fast GPU).
// grad_loss (a scalar 1) and grad_alpha ((H, W) zeros) are the caller's, kept from step to step. Returns the loss,
// the image, dL/d(means2d) and the radii.
std::vector<torch::Tensor> gradient_step(const torch::Tensor& means, const torch::Tensor& quats,
                                         const torch::Tensor& log_scales, const torch::Tensor& opacity_logits,
                                         const torch::Tensor& sh_head, const torch::Tensor& sh_tail,
                                         const torch::Tensor& viewmat, const torch::Tensor& K, int64_t width,
                                         int64_t height, int64_t sh_degree, const torch::Tensor& background,
                                         const torch::Tensor& target, double ssim_weight,
                                         const torch::Tensor& grad_loss, const torch::Tensor& grad_alpha) {
  const torch::NoGradGuard no_grad;
  const torch::Tensor scales = log_scales.exp(), opacities = opacity_logits.sigmoid();
  const auto [means2d, conics, depths, radii, colors, counts] = project_forward(
      means, quats, scales, opacities, sh_head, sh_tail, viewmat, K, width, height, sh_degree);
  const auto [image, alpha, depth, saved] = rasterize_projected(means2d, conics, colors, opacities, depths, radii,
                                                                counts, background, width, height, true);
  const std::vector<torch::Tensor> loss = loss_forward(image, target, ssim_weight);
  const torch::Tensor grad_image = loss_backward(image, target, loss[1], ssim_weight, grad_loss);
  const std::vector<torch::Tensor> g2d = rasterize_backward(saved, false, width, height, grad_image, grad_alpha);
  std::vector<torch::Tensor> g3d = project_backward(means, quats, scales, sh_head, sh_tail, viewmat, K, width,
                                                    height, sh_degree, radii, g2d[0], g2d[1], g2d[2]);
  add_grads({means, quats, log_scales, opacity_logits, sh_head, sh_tail},
            {g3d[0], g3d[1], g3d[2].mul_(scales), at::sigmoid_backward(g2d[3], opacities), g3d[3], g3d[4]});
  return {loss[0], image, g2d[0], radii};
}

// gradient_step in Blender's formation: the ray projection, the rasterization over black, the film, the loss, and
// back, the same kernels in the same order as autograd through rasterize_blender and the loss.
std::vector<torch::Tensor> gradient_step_blender(const torch::Tensor& means, const torch::Tensor& quats,
                                                 const torch::Tensor& log_scales, const torch::Tensor& opacity_logits,
                                                 const torch::Tensor& sh_head, const torch::Tensor& sh_tail,
                                                 const torch::Tensor& viewmat, const torch::Tensor& K, int64_t width,
                                                 int64_t height, int64_t sh_degree, const torch::Tensor& background,
                                                 const torch::Tensor& target, double ssim_weight,
                                                 const torch::Tensor& grad_loss, const torch::Tensor& grad_alpha) {
  const torch::NoGradGuard no_grad;
  const torch::Tensor scales = log_scales.exp(), opacities = opacity_logits.sigmoid();
  const std::vector<torch::Tensor> p = ray_project_forward(means, quats, scales, opacities, sh_head, sh_tail, viewmat,
                                                           K, width, height, sh_degree);
  const torch::Tensor &means2d = p[0], &rays = p[1], &colors = p[2], &drawn = p[3], &rects = p[4], &radii = p[5];
  const torch::Tensor black = torch::zeros({3}, means.options());
  const auto [color, alpha, depth, saved] =
      rasterize_binned(bin_ray_tiles(means2d, rays, rects, radii, width, height), means2d, rays, rects, true, colors,
                       drawn, black, width, height, true);
  const std::vector<torch::Tensor> film = film_forward(color, alpha, depth, background);
  const std::vector<torch::Tensor> loss = loss_forward(film[0], target, ssim_weight);
  const torch::Tensor grad_image = loss_backward(film[0], target, loss[1], ssim_weight, grad_loss);
  const std::vector<torch::Tensor> g_film = film_backward(film[3], background, grad_image, grad_alpha);
  const std::vector<torch::Tensor> g2d = rasterize_backward(saved, true, width, height, g_film[0], g_film[1]);
  std::vector<torch::Tensor> g3d = ray_project_backward(means, quats, scales, opacities, sh_head, sh_tail, viewmat,
                                                        K, width, height, sh_degree, radii, g2d[0], g2d[1], g2d[2],
                                                        g2d[3]);
  add_grads({means, quats, log_scales, opacity_logits, sh_head, sh_tail},
            {g3d[0], g3d[1], g3d[2].mul_(scales), at::sigmoid_backward(g3d[3], opacities), g3d[4], g3d[5]});
  return {loss[0], film[0], g2d[0], radii};
}

// One Adam step for every parameter tensor, in place, in one launch; step_sizes and inv_sqrt_bias2s are per
// tensor.
void adam_step(const std::vector<torch::Tensor>& params, const std::vector<torch::Tensor>& grads,
               const std::vector<torch::Tensor>& exp_avgs, const std::vector<torch::Tensor>& exp_avg_sqs,
               const std::vector<double>& step_sizes, const std::vector<double>& inv_sqrt_bias2s, double beta1,
               double beta2, double eps) {
  const size_t n = params.size();
  TORCH_CHECK(grads.size() == n && exp_avgs.size() == n && exp_avg_sqs.size() == n && step_sizes.size() == n &&
                  inv_sqrt_bias2s.size() == n,
              "adam_step: one grad, state pair and step size per parameter");
  if (n == 0) return;
  const c10::cuda::CUDAGuard guard(params[0].device());
  std::vector<torch::Tensor> contiguous_grads;  // slices of a concatenation's gradient are strided
  std::vector<sw::AdamTensor> tensors;
  contiguous_grads.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    TORCH_CHECK(params[i].device() == params[0].device(), "adam_step: every parameter on one device");
    check_input(params[i], "param");
    check_input(exp_avgs[i], "exp_avg");
    check_input(exp_avg_sqs[i], "exp_avg_sq");
    contiguous_grads.push_back(grads[i].contiguous());
    const torch::Tensor& grad = contiguous_grads.back();
    check_input(grad, "grad");
    TORCH_CHECK(grad.numel() == params[i].numel() && exp_avgs[i].numel() == params[i].numel() &&
                    exp_avg_sqs[i].numel() == params[i].numel(),
                "adam_step: grad and state must have the parameter's size");
    const sw::AdamStep step{(float)step_sizes[i], (float)inv_sqrt_bias2s[i], (float)beta1, (float)beta2, (float)eps};
    tensors.push_back({fptr(params[i]), fptr(grad), fptr(exp_avgs[i]), fptr(exp_avg_sqs[i]), params[i].numel(), step});
  }
  check(sw::launch_adam(tensors.data(), (int)n, c10::cuda::getCurrentCUDAStream()), "adam");
}

// grad_sum += NDC-scaled |dL/d(means2d)| and count += 1 for every Gaussian with radii > 0, in place.
void accumulate_grad_stats(const torch::Tensor& grad_means2d, const torch::Tensor& radii, int64_t width,
                           int64_t height, const torch::Tensor& grad_sum, const torch::Tensor& count) {
  const c10::cuda::CUDAGuard guard(grad_means2d.device());
  check_input(grad_means2d, "grad_means2d");
  check_input(radii, "radii", torch::kInt32);
  check_input(grad_sum, "grad_sum");
  check_input(count, "count");
  const int64_t n = radii.numel();
  TORCH_CHECK(grad_means2d.numel() == 2 * n && grad_sum.numel() == n && count.numel() == n,
              "accumulate_grad_stats: one row per Gaussian");
  check(sw::launch_grad_stats(fptr(grad_means2d), iptr(radii), (int)n, (int)width, (int)height, fptr(grad_sum),
                              fptr(count), c10::cuda::getCurrentCUDAStream()),
        "gradient statistics");
}

// The kernels' compile-time constants, which tests/test_kernel_constants.py checks against the Python ones.
pybind11::dict constants() {
  pybind11::dict c;
  c["TILE"] = sw::TILE;
  c["DILATION"] = sw::DILATION;
  c["ALPHA_MAX"] = sw::ALPHA_MAX;
  c["ALPHA_MIN"] = sw::ALPHA_MIN;
  c["T_STOP"] = sw::T_STOP;
  c["NEAR_PLANE"] = sw::NEAR_PLANE;
  c["RADIUS_SIGMAS"] = sw::RADIUS_SIGMAS;
  c["FOV_CLAMP_MARGIN"] = sw::FOV_CLAMP_MARGIN;
  c["MIN_DEPTH_KEY_BITS"] = sw::MIN_DEPTH_KEY_BITS;
  c["SCALE_CLAMP"] = sw::SCALE_CLAMP;
  c["FILM_SPLAT_VARIANCE"] = sw::FILM_SPLAT_VARIANCE;
  c["FILM_TAP_SIDE"] = sw::FILM_TAP_SIDE;
  c["FILM_TAP_CENTRE"] = sw::FILM_TAP_CENTRE;
  c["SH_C0"] = sw::SH_C0;
  return c;
}

}  // namespace

// The tensor functions run without the GIL: bin_tiles waits for the GPU (its one host sync), and the server's
// other threads (its socket, a frame's render) go on meanwhile.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  const auto without_gil = pybind11::call_guard<pybind11::gil_scoped_release>();
  pybind11::class_<TileCounts>(m, "TileCounts");  // project_forward's, for bin_tiles
  m.def("project_forward", &project_forward, without_gil);
  m.def("project_backward", &project_backward, without_gil);
  m.def("motion_forward", &motion_forward, without_gil);
  m.def("motion_backward", &motion_backward, without_gil);
  m.def("bin_tiles", &bin_tiles, without_gil);
  m.def("rasterize", &rasterize, without_gil);
  m.def("rasterize_blender", &rasterize_blender, without_gil);
  m.def("loss_forward", &loss_forward, without_gil);
  m.def("loss_backward", &loss_backward, without_gil);
  m.def("gradient_step", &gradient_step, without_gil);
  m.def("gradient_step_blender", &gradient_step_blender, without_gil);
  m.def("adam_step", &adam_step, without_gil);
  m.def("accumulate_grad_stats", &accumulate_grad_stats, without_gil);
  m.def("set_poison_outputs", &set_poison_outputs);
  m.def("constants", &constants);
}
