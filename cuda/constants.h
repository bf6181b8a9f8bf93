// Rasterizer constants, equal to backend/render/constants.py's: checked by tests/test_kernel_constants.py.
#pragma once

namespace splatwright {

constexpr int TILE = 16;                       // tiles are TILE x TILE pixels
constexpr int BLOCK_SIZE = TILE * TILE;        // one thread per pixel of a tile
constexpr float DILATION = 0.3f;               // added to the 2D covariance's diagonal
constexpr float ALPHA_MAX = 0.99f;             // alpha cap
constexpr float ALPHA_MIN = 1.0f / 255.0f;     // contributions below this are skipped
constexpr float T_STOP = 1e-4f;                // a pixel stops before T would fall below this
constexpr float NEAR_PLANE = 0.01f;            // view-space z at or below this is culled
constexpr float RADIUS_SIGMAS = 3.0f;          // a splat is drawn out to this many standard deviations
constexpr double FOV_CLAMP_MARGIN = 0.3;       // Jacobian taken at the centre clamped to view +30%
constexpr int MIN_DEPTH_KEY_BITS = 18;         // depth key bits beside the tile in a 32-bit sort key, at least
// Blender's image formation (backend/render/formation.py):
constexpr float SCALE_CLAMP = 1e-3f;           // each scale at least this fraction of the splat's largest
constexpr float FILM_SPLAT_VARIANCE = 0.0725135920020276f;  // px^2 of the film filter that widens each splat
constexpr float FILM_TAP_SIDE = 0.0500724383374278f;        // the film filter's whole-pixel taps: side, centre, side
constexpr float FILM_TAP_CENTRE = 0.8998551233251444f;

}  // namespace splatwright
