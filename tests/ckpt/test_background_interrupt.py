"""Ctrl-C (a KeyboardInterrupt in the main thread) while a background save starts.

The interrupt can land inside ``Thread.start()``, before or after the writer thread came
to exist. Either way ``ckpt.wait()`` must then tell the truth without hanging: the file
is complete when it returns if the thread ran, and absent if it never started. (Before
this was handled, ``cerebrax fit`` named an older checkpoint than the one that appeared
after its message, or failed with "cannot join thread before it is started".)
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

import cerebrax.ckpt as ckpt
from cerebrax.ckpt import _background


def _interrupting_start(patch, *, after_start: bool):
    real_start = threading.Thread.start

    def start(thread):
        if thread.name == "cerebrax-save":
            if after_start:
                real_start(thread)
            raise KeyboardInterrupt
        real_start(thread)

    patch.setattr(threading.Thread, "start", start)


def test_interrupt_after_the_thread_started_waits_for_the_file(tmp_path, monkeypatch):
    path = tmp_path / "late.mdl"
    with monkeypatch.context() as patch, pytest.raises(KeyboardInterrupt):
        _interrupting_start(patch, after_start=True)
        ckpt.save({"w": np.arange(1000.0)}, path, background=True)
    ckpt.wait()  # the save is still pending: the file is complete when this returns
    np.testing.assert_array_equal(ckpt.load(path)["w"], np.arange(1000.0))


def test_interrupt_before_the_thread_existed_does_not_hang(tmp_path, monkeypatch):
    path = tmp_path / "never.mdl"
    monkeypatch.setattr(_background, "_START_TIMEOUT", 0.5)
    with monkeypatch.context() as patch, pytest.raises(KeyboardInterrupt):
        _interrupting_start(patch, after_start=False)
        ckpt.save({"w": np.ones(3)}, path, background=True)
    ckpt.wait()  # returns: nothing was written, and nothing will be
    assert not path.exists()
    ckpt.save({"w": np.zeros(2)}, path, background=True).wait()  # the writer still works
    np.testing.assert_array_equal(ckpt.load(path)["w"], np.zeros(2))
