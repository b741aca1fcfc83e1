"""The live progress bar on a terminal: lines printed during a loop stay above the bar."""

from __future__ import annotations

import io
import sys

import jax.numpy as jnp
import numpy as np
from helpers import compiled_mlp

import cerebrax as cstorch
from cerebrax.data._progress import ProgressBar, write


class Terminal(io.StringIO):
    """A stream that says it is a terminal and keeps everything written to it."""

    def isatty(self) -> bool:
        return True


def screen(text: str) -> list[str]:
    """The lines a terminal shows for ``text``: ``\\r`` returns to the start of the line
    and later characters overwrite earlier ones."""
    assert "\x1b" not in text  # one bar at position 0 needs no cursor movement
    lines, col = [""], 0
    for ch in text:
        if ch == "\n":
            lines.append("")
            col = 0
        elif ch == "\r":
            col = 0
        else:
            line = lines[-1].ljust(col)
            lines[-1] = line[:col] + ch + line[col + 1 :]
            col += 1
    return [line.rstrip() for line in lines]


def test_lines_written_during_a_live_bar_stay_above_it():
    term = Terminal()
    bar = ProgressBar(3, live=True, stream=term)
    for i in range(3):
        bar.note_output(jnp.float32(1.0 / (i + 1)))
        bar.update(i + 1)
        write(f"log line {i + 1}", file=term)
        shown = [line for line in screen(term.getvalue()) if line]
        # The bar is redrawn below the line just written; no line holds both.
        assert shown[-2] == f"log line {i + 1}"
        assert shown[-1].startswith("[cerebrax]") and f"step {i + 1}/3" in shown[-1]
    bar.close()
    shown = screen(term.getvalue())
    assert shown[:3] == ["log line 1", "log line 2", "log line 3"]
    assert shown[3].startswith("[cerebrax] 100%|") and "step 3/3" in shown[3]
    assert "steps/s" in shown[3] and "loss 0.3333" in shown[3]
    assert shown[4:] == [""]  # the closed bar ends its line


def test_executor_bar_on_stderr_and_closure_lines_on_stdout_share_a_terminal(monkeypatch):
    # stdout and stderr are one terminal, as in a shell: the bar (stderr) is cleared
    # before each closure's line (stdout) and redrawn below it.
    term = Terminal()
    monkeypatch.setattr(sys, "stdout", term)
    monkeypatch.setattr(sys, "stderr", term)
    model = compiled_mlp()

    logged = []

    @cstorch.step_closure
    def log(loss):
        logged.append(float(loss))
        write(f"step {len(logged)} loss {logged[-1]:.3f}")

    @cstorch.trace
    def step(x):
        loss = model(x).sum()
        log(loss)
        return loss

    loader = cstorch.utils.data.DataLoader(lambda: [np.ones((2, 8), np.float32)], num_steps=4)
    for x in cstorch.utils.data.DataExecutor(loader, progress_bar="auto"):  # stderr: a tty
        step(x)
    shown = [line for line in screen(term.getvalue()) if line]
    assert [line.split(" loss")[0] for line in shown[:-1]] == [f"step {i}" for i in range(1, 5)]
    assert shown[-1].startswith("[cerebrax] 100%|") and "step 4/4" in shown[-1]
    assert "loss" in shown[-1]


def test_off_a_terminal_one_summary_line_and_no_carriage_returns():
    stream = io.StringIO()
    bar = ProgressBar(5, stream=stream)  # live=None: a StringIO is not a terminal
    assert not bar.live
    for i in range(5):
        bar.update(i + 1)
    bar.close()
    out = stream.getvalue()
    assert "\r" not in out and out.count("\n") == 1
    assert out.startswith("[cerebrax] step 5/5 | ") and "steps/s" in out


def test_write_without_a_bar_is_a_plain_line():
    stream = io.StringIO()
    write("saved model_dir/checkpoint_1.mdl", file=stream)
    assert stream.getvalue() == "saved model_dir/checkpoint_1.mdl\n"


def test_bar_on_stderr_is_live_only_when_stdout_is_a_terminal_too(monkeypatch):
    # `cerebrax fit ... | tee log`: the lines reach the screen through tee, after the bar.
    monkeypatch.setattr(sys, "stderr", Terminal())
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    assert not ProgressBar(3).live
    monkeypatch.setattr(sys, "stdout", Terminal())
    assert ProgressBar(3).live
    assert ProgressBar(3, stream=Terminal()).live  # another stream: its own isatty decides


def test_no_live_bar_when_the_script_logs_or_draws_its_own(monkeypatch):
    """A script that logs to the terminal (gigaGPT: logging.basicConfig() and a log line
    per step) or draws its own tqdm bar gets no live bar of cerebrax's, which would be
    redrawn into its lines: only the summary line at the end."""
    import logging

    from tqdm import tqdm

    monkeypatch.setattr(sys, "stderr", Terminal())
    monkeypatch.setattr(sys, "stdout", Terminal())
    assert ProgressBar(3).live
    handler = logging.StreamHandler(sys.stderr)
    logging.getLogger("a_script").addHandler(handler)
    try:
        assert not ProgressBar(3).live
    finally:
        logging.getLogger("a_script").removeHandler(handler)
    own = tqdm(total=3, file=io.StringIO())
    try:
        assert not ProgressBar(3).live
    finally:
        own.close()
    assert ProgressBar(3).live
    assert ProgressBar(3, live=True).live  # asked for: drawn


def test_a_terminal_of_unknown_size_still_shows_the_bar():
    """A pseudo-terminal nobody sized (0 x 0, as under `script` or some CI runners):
    tqdm alone would draw nothing there."""
    import os
    import select

    master, slave = os.openpty()
    try:
        assert os.get_terminal_size(slave).columns == 0
        with os.fdopen(os.dup(slave), "w") as stream:
            bar = ProgressBar(4, live=True, stream=stream)
            bar.update(4)
            bar.close()
        # The terminal hands the output over in pieces: read until the bar's text is
        # there or nothing more comes for a second.
        shown = ""
        while "step 4/4" not in shown and select.select([master], [], [], 1.0)[0]:
            shown += os.read(master, 65536).decode()
    finally:
        os.close(master)
        os.close(slave)
    assert "step 4/4" in shown, shown
