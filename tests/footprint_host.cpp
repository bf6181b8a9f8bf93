// The binning kernels' footprint tiles (cuda/projection.cuh's FootprintTiles), compiled for the host so a CPU
// test can compare them with the reference's bin_tiles. Reads n, width, height (int32) and per splat u, v,
// conic (3), opacity, radius (float32); writes (splat, tile) int32 pairs in emit order.
#include <cstdint>
#include <cstdio>
#include <vector>

#include "projection.cuh"

int main(int argc, char** argv) {
  if (argc != 3) return 2;
  FILE* in = std::fopen(argv[1], "rb");
  int32_t header[3];
  if (!in || std::fread(header, 4, 3, in) != 3) return 1;
  const int n = header[0], width = header[1], height = header[2];
  std::vector<float> splats((size_t)n * 7);
  if (std::fread(splats.data(), 4, splats.size(), in) != splats.size()) return 1;
  std::fclose(in);
  FILE* out = std::fopen(argv[2], "wb");
  if (!out) return 1;
  for (int i = 0; i < n; ++i) {
    const float* s = &splats[(size_t)i * 7];
    if (s[6] <= 0.f) continue;  // culled
    const splatwright::FootprintTiles tiles(s[0], s[1], s + 2, s[5], (int)s[6], width, height);
    tiles.each_tile(tiles.count(), [&](int, int tile) {
      const int32_t pair[2] = {i, tile};
      std::fwrite(pair, 4, 2, out);
    });
  }
  return std::fclose(out) == 0 ? 0 : 1;
}
