"""A small progress bar for long CLI work (stderr; redrawn in place on a terminal, periodic lines otherwise)."""
from __future__ import annotations

import math
import sys
import time


class Progress:
    def __init__(self, total: int, desc: str, stream=None):
        self.total, self.desc = max(1, total), desc
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.start = self.last_draw = time.monotonic()
        self.done = self.drawn = 0
        self.fields: dict = {}

    def update(self, done: int, **fields) -> None:
        self.done, self.fields = done, fields  # formatted only when drawn
        now = time.monotonic()
        interval = 0.25 if self.tty else 10.0
        if now - self.last_draw >= interval or done >= self.total:
            self.last_draw = now
            self._draw(now)

    def _draw(self, now: float) -> None:
        self.drawn = self.done
        frac = min(1.0, self.done / self.total)
        elapsed = now - self.start
        rate = self.done / elapsed if elapsed > 0 else 0.0
        eta = (self.total - self.done) / rate if rate > 0 else 0.0
        bar = "#" * int(24 * frac) + "-" * (24 - int(24 * frac))
        line = (f"{self.desc} [{bar}] {self.done}/{self.total}  {rate:.1f} it/s  "
                f"eta {eta:4.0f}s  " + "  ".join(f"{k} {_fmt(v)}" for k, v in self.fields.items()))
        self.stream.write(("\r" + line + "\033[K") if self.tty else line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.drawn != self.done:
            self._draw(time.monotonic())
        if self.tty:
            self.stream.write("\n")
        self.stream.flush()


class StageProgress:
    """A bar per stage of work that reports (stage, done, total), as structure from motion does: each closed once it
    reaches its total, a stage reported again after that left alone; close() ends those still open."""

    def __init__(self):
        self.bars: dict[str, Progress] = {}
        self.closed: set[str] = set()

    def __call__(self, stage: str, done: int, total: int) -> None:
        if stage in self.closed:
            return
        if stage not in self.bars:
            self.bars[stage] = Progress(total, stage)
        self.bars[stage].update(done)
        if done >= total:
            self.bars[stage].close()
            self.closed.add(stage)

    def close(self) -> None:
        for stage in self.bars.keys() - self.closed:
            self.bars[stage].close()
        self.closed |= self.bars.keys()


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}" if math.isfinite(v) else "-"  # not measured yet (NaN)
    return str(v)
