"""How long a run of steps has left (bpy-free): a prior estimate before the first steps, then the rate the steps
are measured at, which corrects the estimate as it goes. Training and capture both use it."""
from __future__ import annotations

from collections import deque

MIN_STEPS = 3  # measured steps before the measured rate replaces the prior
MIN_SECONDS = 1.0  # and seconds measured
WINDOW_SHARE = 0.5  # the rate is measured over the newest half of the run so far (steps slow down as it grows)
WINDOW_MIN_SECONDS = 5.0  # but over at least this long where the run has lasted that long
MAX_SAMPLES = 4096


class StepClock:
    """Steps done over time: observe(step, total, now) as progress comes in; remaining(now) the seconds left.

    Before MIN_STEPS steps over MIN_SECONDS are measured, the estimate is the prior (seconds per step, from the
    device's table); after, it is the measured rate over the newer part of the run, which follows a run whose
    steps get slower (more Gaussians) or faster. A step going back, another total, or a pause starts over."""

    def __init__(self, prior_step_seconds: float | None = None):
        self.prior = prior_step_seconds
        self.total = 0
        self._samples: deque[tuple[float, int]] = deque(maxlen=MAX_SAMPLES)

    def reset(self, prior_step_seconds: float | None = None) -> None:
        if prior_step_seconds is not None:
            self.prior = prior_step_seconds
        self.total = 0
        self._samples.clear()

    def observe(self, step: int, total: int, now: float) -> None:
        if total != self.total or (self._samples and step < self._samples[-1][1]):
            self._samples.clear()
            self.total = total
        if self._samples and step == self._samples[-1][1]:
            return  # no news: a later sample of the same step would shorten the measured time
        self._samples.append((now, step))

    def pause(self) -> None:
        """Time paused is no step time: measure again from the next step."""
        self._samples.clear()

    @property
    def step(self) -> int:
        return self._samples[-1][1] if self._samples else 0

    def measured_step_seconds(self) -> float | None:
        """Seconds a step takes now as measured over the newer part of the run, or None before enough is."""
        if len(self._samples) < 2:
            return None
        t_last, s_last = self._samples[-1]
        t_first, s_first = self._samples[0]
        if s_last - s_first < MIN_STEPS or t_last - t_first < MIN_SECONDS:
            return None
        span = max((t_last - t_first) * WINDOW_SHARE, min(WINDOW_MIN_SECONDS, t_last - t_first))
        t0, s0 = t_first, s_first
        for t, s in reversed(self._samples):  # the oldest sample in the window with MIN_STEPS steps after it
            if s_last - s >= MIN_STEPS:
                t0, s0 = t, s
                if t < t_last - span:
                    break
        return (t_last - t0) / (s_last - s0)

    def step_seconds(self) -> float | None:
        """Seconds a step takes now: measured once there is enough of the run, else the prior (or None)."""
        measured = self.measured_step_seconds()
        return measured if measured is not None else self.prior

    def remaining(self, now: float) -> float | None:
        """Seconds left to `total` from `now`: the steps left at the rate, less the time since the last step."""
        per_step = self.step_seconds()
        if per_step is None or not self.total:
            return None
        left = (self.total - self.step) * per_step
        if self._samples:
            left -= min(now - self._samples[-1][0], per_step)  # within the step running now
        return max(0.0, left)


def error_at_a_tenth(samples: list[tuple[float, int, int, float | None]]) -> tuple[float, float, float]:
    """How good the time left was during a run, from (time, step, total, seconds left shown) samples taken up to
    its end: (the time left shown once a tenth of the steps were done, the time the run took from there, the
    error as a share of the latter)."""
    end = samples[-1][0]
    at, _, _, shown = next(s for s in samples if s[1] >= s[2] / 10 and s[3] is not None)
    actual = end - at
    return shown, actual, abs(shown - actual) / actual
