"""The self-correcting time left (logic/eta.py): the prior before the first steps, the measured rate after."""
from __future__ import annotations

import pytest

from blender_addon.logic.eta import StepClock


def run(clock: StepClock, seconds_per_step, steps: int, total: int, start: float = 0.0) -> float:
    """Feed `steps` steps whose durations `seconds_per_step(step)` gives; returns the time after them."""
    now = start
    clock.observe(0, total, now)
    for step in range(1, steps + 1):
        now += seconds_per_step(step)
        clock.observe(step, total, now)
    return now


def test_the_prior_until_steps_are_measured():
    clock = StepClock(prior_step_seconds=0.1)
    assert clock.remaining(0.0) is None  # no run yet
    clock.observe(0, 300, 0.0)
    assert clock.remaining(0.0) == pytest.approx(30.0)
    clock.observe(1, 300, 0.8)  # one step is not enough to measure
    assert clock.step_seconds() == 0.1


def test_a_steady_rate_replaces_a_wrong_prior():
    clock = StepClock(prior_step_seconds=0.1)  # the table's guess; the machine is 8 times slower
    now = run(clock, lambda step: 0.8, 30, 300)
    assert clock.remaining(now) == pytest.approx(270 * 0.8)


def test_a_run_that_slows_down_is_followed():
    clock = StepClock(prior_step_seconds=0.1)
    now = run(clock, lambda step: 0.5 if step <= 50 else 1.0, 100, 300)  # twice as slow from step 50
    assert clock.remaining(now) == pytest.approx(200 * 1.0, rel=0.05)


def test_a_pause_is_not_step_time():
    clock = StepClock()
    now = run(clock, lambda step: 0.5, 20, 100)
    clock.pause()
    now += 60.0  # paused for a minute
    clock.observe(20, 100, now)
    for step in range(21, 30):
        now += 0.5
        clock.observe(step, 100, now)
    assert clock.remaining(now) == pytest.approx(71 * 0.5)


def test_a_new_run_starts_over():
    clock = StepClock()
    now = run(clock, lambda step: 2.0, 20, 100)
    run(clock, lambda step: 0.1, 10, 50, start=now)  # another total: another run
    assert clock.total == 50 and clock.step_seconds() == pytest.approx(0.1)
