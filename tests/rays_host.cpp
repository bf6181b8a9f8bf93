// Blender's formation's projection and its backward (cuda/rays.cuh), compiled for the host so a CPU test can
// compare them with the reference's project_rays and its autograd. Reads n, width, height (int32), the camera's
// viewmat (16) and K (9), then per Gaussian: mean (3), quat (4), scale (3), opacity, and the gradients w.r.t.
// mean2d (2), the ray parameters (RAY_PARAMS) and the opacity as drawn (float32). Writes per Gaussian: mean2d (2),
// ray parameters, opacity as drawn, rect (4), radius, and the gradients w.r.t. mean (3), quat (4), scale (3) and
// opacity (float32).
#include <cstdint>
#include <cstdio>
#include <vector>

#include "rays.cuh"

namespace sw = splatwright;

int main(int argc, char** argv) {
  if (argc != 3) return 2;
  FILE* in = std::fopen(argv[1], "rb");
  int32_t header[3];
  if (!in || std::fread(header, 4, 3, in) != 3) return 1;
  const int n = header[0], width = header[1], height = header[2];
  float camera[25];
  if (std::fread(camera, 4, 25, in) != 25) return 1;
  constexpr int IN = 11 + 2 + sw::RAY_PARAMS + 1, OUT = 2 + sw::RAY_PARAMS + 1 + 4 + 1 + 11;
  std::vector<float> rows((size_t)n * IN);
  if (std::fread(rows.data(), 4, rows.size(), in) != rows.size()) return 1;
  std::fclose(in);
  const sw::Camera cam = sw::load_camera(camera, camera + 16, width, height, (float)(sw::FOV_CLAMP_MARGIN * width),
                                         (float)(sw::FOV_CLAMP_MARGIN * height));
  std::vector<float> out((size_t)n * OUT, 0.f);
  for (int i = 0; i < n; ++i) {
    const float* r = &rows[(size_t)i * IN];
    float* o = &out[(size_t)i * OUT];
    sw::RayState e;
    sw::ray_forward(cam, r, r + 3, r + 7, e);
    const float drawn = r[10] * e.area;
    int radius;
    o[0] = e.mean2d[0];
    o[1] = e.mean2d[1];
    sw::ray_parameters(cam, e, o + 2);
    o[2 + sw::RAY_PARAMS] = drawn;
    sw::ray_footprint(cam, e, drawn, o + 3 + sw::RAY_PARAMS, radius);
    o[7 + sw::RAY_PARAMS] = (float)radius;
    float* grads = o + 8 + sw::RAY_PARAMS;
    if (radius > 0)
      sw::ray_backward(cam, e, r[10], r + 11, r + 13, r[13 + sw::RAY_PARAMS], grads, grads + 3, grads + 7,
                       grads[10]);
  }
  FILE* result = std::fopen(argv[2], "wb");
  if (!result || std::fwrite(out.data(), 4, out.size(), result) != out.size()) return 1;
  return std::fclose(result) == 0 ? 0 : 1;
}
