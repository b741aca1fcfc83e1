"""The DataExecutor's progress bar (drawn by tqdm) and ``write``, for lines printed under it.

A bar redraws its line in place with carriage returns, so a line printed with ``print``
while a bar is live lands on the bar's line: the two overwrite each other. ``write``
clears the bar, prints the line and redraws the bar below it, so the log stays above
the bar and the bar stays at the bottom. The bar goes to stderr and the lines to stdout
(a pipe reading stdout gets only the log); tqdm clears a bar on stderr before a line
goes to stdout because a terminal shows both streams.

Off a terminal (a pipe, a file, a notebook's captured stream) no bar is drawn: one
summary line goes to the bar's stream when the loop ends. A bar on stderr is live only
when stdout is a terminal too: with ``cerebrax fit ... | tee log`` the lines reach the
screen through ``tee``, later than the bar, and would land on the bar's line.
"""

from __future__ import annotations

import collections
import logging
import os
import sys
import time
from typing import Any, TextIO

import jax
from tqdm import tqdm

__all__ = ["BAR_FORMAT", "ProgressBar", "write"]

# ``{loss}`` is cerebrax's own field (see _Bar.format_dict): " | loss 0.25" or "".
BAR_FORMAT = (
    "[cerebrax] {percentage:3.0f}%|{bar:20}| step {n}/{total} | {rate_noinv_fmt}{loss}"
    " [{elapsed}<{remaining}]"
)


def write(line: str, *, file: TextIO | None = None) -> None:
    """Prints ``line`` above any live progress bar, which redraws below it.

    Use it instead of ``print`` for anything printed while a DataExecutor loop runs (a
    step closure's log line, for instance): ``print`` would write over the bar.

    Args:
      line: the text, without its newline.
      file: where the line goes (default: ``sys.stdout`` at the time of the call).
    """
    file = sys.stdout if file is None else file
    with tqdm.external_write_mode(file=file):
        file.write(line + "\n")
        file.flush()


def _isatty(stream: Any) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty()) if callable(isatty) else False


def _width(stream: Any) -> int:
    """The width of the terminal ``stream`` writes to (0: unknown or not a terminal)."""
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, OSError, ValueError):
        return 0


def _live_by_default(stream: Any) -> bool:
    """A live bar on a terminal; on stderr, only when stdout's lines go straight there
    too; never when the script draws its own bar or logs to a terminal (see
    :func:`_script_writes_progress`)."""
    if _script_writes_progress():
        return False
    if stream is sys.stderr:
        return _isatty(sys.stderr) and _isatty(sys.stdout)
    return _isatty(stream)


def _script_writes_progress() -> bool:
    """Whether the running script shows its own progress on the terminal: a tqdm bar of
    its own is open, or a ``logging`` handler writes to stdout or stderr (gigaGPT logs
    each step with ``logging.basicConfig()``). A bar of cerebrax's would be redrawn into
    those lines, so the executor then prints only its summary line at the end."""
    if any(not isinstance(bar, _Bar) for bar in list(getattr(tqdm, "_instances", ()))):
        return True
    loggers = [logging.getLogger()] + [
        logger for logger in logging.Logger.manager.loggerDict.values()
        if isinstance(logger, logging.Logger)]
    return any(isinstance(handler, logging.StreamHandler)
               and getattr(handler, "stream", None) in (sys.stdout, sys.stderr)
               and _isatty(handler.stream)
               for logger in loggers for handler in logger.handlers)


class _Bar(tqdm):
    """tqdm with a ``{loss}`` field in ``bar_format``, read when the bar is drawn."""

    monitor_interval = 0  # no monitor thread: the bar is drawn only from the loop's thread

    def __init__(self, *args: Any, loss_text: Any, **kwargs: Any):
        self._loss_text = loss_text
        super().__init__(*args, **kwargs)

    @property
    def format_dict(self) -> dict[str, Any]:
        return {**super().format_dict, "loss": self._loss_text()}


class ProgressBar:
    """Shows ``step i/N | x steps/s | loss y`` without waiting for the device.

    The loss shown is the step's scalar output (or the first element of its output
    tuple): the newest one whose value is already computed (``jax.Array.is_ready``), so
    drawing never blocks the dispatch of the next step; closing waits for the last step
    so the final line shows its value. The live rate is tqdm's recent average; the
    summary line's is the average over the whole loop.

    Args:
      total: the number of steps.
      live: True draws a live bar (tqdm, redrawn at most 4 times a second), False prints
        one summary line when the bar closes; None draws a live bar when ``stream`` is a
        terminal (for ``sys.stderr``: when stdout is one too).
      stream: where the bar goes (default: ``sys.stderr``).
    """

    def __init__(self, total: int, *, live: bool | None = None, stream: Any = None):
        self.total = total
        self.stream = sys.stderr if stream is None else stream
        self.live = _live_by_default(self.stream) if live is None else live
        self.start = time.perf_counter()
        self._outputs: collections.deque = collections.deque(maxlen=8)
        self.loss: float | None = None
        self.done = 0
        sized = _width(self.stream) > 0
        self._bar = _Bar(
            total=total,
            file=self.stream,
            disable=not self.live,
            loss_text=self._loss_text,
            bar_format=BAR_FORMAT,
            unit=" steps",
            mininterval=0.25,
            # Follow the terminal's size; a terminal that reports none (a pseudo-terminal
            # nobody sized, as under `script` or some CI runners) is taken as 100 x 24,
            # where tqdm would draw nothing.
            dynamic_ncols=sized,
            ncols=None if sized else 100,
            nrows=None if sized else 24,
        )

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

    def _loss_text(self) -> str:
        loss = self._ready_loss()
        return "" if loss is None else f" | loss {loss:.4g}"

    def text(self) -> str:
        """The summary line, without the ``[cerebrax]`` prefix."""
        elapsed = max(time.perf_counter() - self.start, 1e-9)
        rate = self.done / elapsed
        return f"step {self.done}/{self.total} | {rate:.1f} steps/s{self._loss_text()}"

    def update(self, done: int) -> None:
        """Notes that ``done`` steps have been dispatched; redraws a live bar if due."""
        if done > self.done:
            self._bar.update(done - self.done)
        self.done = done

    def close(self) -> None:
        if self._outputs:
            # The run is over: wait for the last step so the final line shows its value.
            self._outputs[-1].block_until_ready()
        self._bar.close()  # a live bar draws itself a last time and ends its line
        if not self.live:
            self.stream.write("[cerebrax] " + self.text() + "\n")
            self.stream.flush()
