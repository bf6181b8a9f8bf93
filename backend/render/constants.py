"""Rasterizer constants of the reference renderer; the CUDA kernels' cuda/constants.h holds the same values,
checked equal by tests/test_kernel_constants.py."""

TILE = 16  # tiles are TILE x TILE pixels
DILATION = 0.3  # added to the 2D covariance's diagonal (anti-aliasing low-pass)
ALPHA_MAX = 0.99  # alpha cap, which keeps 1 - alpha invertible in the backward walk
ALPHA_MIN = 1.0 / 255.0  # contributions below this are skipped
T_STOP = 1e-4  # a pixel stops before a splat that would drop its transmittance below this
NEAR_PLANE = 0.01  # Gaussians whose centre is nearer than this (view z) are culled
RADIUS_SIGMAS = 3.0  # a splat is drawn out to this many standard deviations (d^T conic d <= 9), at most
FOV_CLAMP_MARGIN = 0.3  # the Jacobian is taken at the centre clamped to the view +30% each side
MIN_DEPTH_KEY_BITS = 18  # tile entries sort by (tile, depth key) in 32 bits where the depth key keeps this many
