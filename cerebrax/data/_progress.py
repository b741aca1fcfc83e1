"""A small progress bar for the DataExecutor: steps, steps/s and the last known loss."""

from __future__ import annotations

import collections
import sys
import time
from typing import Any

import jax

__all__ = ["ProgressBar"]


class ProgressBar:
    """Renders ``step i/N | x steps/s | loss y`` to stderr without waiting for the device.

    The loss shown is the step's scalar output (or the first element of its output
    tuple): the newest one whose value is already computed (``jax.Array.is_ready``), so
    drawing never blocks the dispatch of the next step; the final line waits for the
    last step. On
    a terminal the bar redraws in place a few times per second; otherwise one line is
    printed when the run ends.
    """

    def __init__(self, total: int, *, live: bool | None = None, stream: Any = None):
        self.total = total
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty() if live is None else live
        self.start = time.perf_counter()
        self._last_draw = 0.0
        self._outputs: collections.deque = collections.deque(maxlen=8)
        self.loss: float | None = None
        self.done = 0

    def note_output(self, output: Any) -> None:
        leaf = output[0] if isinstance(output, (tuple, list)) and output else output
        if isinstance(leaf, jax.Array) and leaf.ndim == 0:
            self._outputs.append(leaf)

    def _ready_loss(self) -> float | None:
        for i in range(len(self._outputs) - 1, -1, -1):
            arr = self._outputs[i]
            if not arr.is_deleted() and arr.is_ready():
                self.loss = float(arr)
                for _ in range(i + 1):
                    self._outputs.popleft()
                break
        return self.loss

    def text(self) -> str:
        elapsed = max(time.perf_counter() - self.start, 1e-9)
        rate = self.done / elapsed
        loss = self._ready_loss()
        parts = [f"step {self.done}/{self.total}", f"{rate:.1f} steps/s"]
        if loss is not None:
            parts.append(f"loss {loss:.4g}")
        return " | ".join(parts)

    def update(self, done: int) -> None:
        self.done = done
        if not self.live:
            return
        now = time.perf_counter()
        if now - self._last_draw >= 0.25:
            self._last_draw = now
            self.stream.write("\r[cerebrax] " + self.text() + "\033[K")
            self.stream.flush()

    def close(self) -> None:
        if self._outputs:
            # The run is over: wait for the last step so the final line shows its value.
            self._outputs[-1].block_until_ready()
        if self.live:
            self.stream.write("\r[cerebrax] " + self.text() + "\033[K\n")
        else:
            self.stream.write("[cerebrax] " + self.text() + "\n")
        self.stream.flush()
