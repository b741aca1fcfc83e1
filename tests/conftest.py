"""Shared fixtures: a fresh cerebrax process state per test, and a compile counter.

Property tests (hypothesis) run under the "cerebrax" profile: no example database on
disk, no deadline (the first example of a test pays for XLA compiles) and a fixed seed,
so the suite is the same on every run; each test sets its own small ``max_examples``.

Multi-device tests live in tests/multidevice/ and run in their own pytest process with
XLA_FLAGS=--xla_force_host_platform_device_count=8 (set before JAX starts); without that
flag they are not collected.
"""

from __future__ import annotations

import atexit
import os
import pathlib
import shutil
import tempfile

import chex
import jax
import pytest
from hypothesis import settings

import cerebrax as cstorch

settings.register_profile("cerebrax", database=None, deadline=None, derandomize=True)
settings.load_profile("cerebrax")

EIGHT_DEVICES = "--xla_force_host_platform_device_count=8" in os.environ.get("XLA_FLAGS", "")


def pytest_ignore_collect(collection_path: pathlib.Path, config) -> bool | None:
    if collection_path.name == "multidevice" and not EIGHT_DEVICES:
        return True
    return None


class CompileCounter:
    """Counts XLA backend compiles (JAX's own monitoring event)."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, event: str, duration: float, **kwargs) -> None:
        if event == "/jax/core/compile/backend_compile_duration":
            self.count += 1


COMPILES = CompileCounter()
jax.monitoring.register_event_duration_secs_listener(COMPILES)

# Backends turn JAX's persistent compilation cache on (cerebrax.backend._compile_cache).
# In the test process it stays off, as JAX's own switch says: a program loaded from an
# earlier run is not compiled, and the tests that count compiles would count too few.
# The cache is tested in fresh processes (tests/test_startup.py, tests/cli). The scripts,
# commands and notebooks the tests run in subprocesses share one folder of this test
# process, not the user's ~/.cache.
jax.config.update("jax_enable_compilation_cache", False)
os.environ.setdefault("CEREBRAX_COMPILE_CACHE", tempfile.mkdtemp(prefix="cerebrax_cache_"))
atexit.register(shutil.rmtree, os.environ["CEREBRAX_COMPILE_CACHE"], ignore_errors=True)


@pytest.fixture
def compiles() -> CompileCounter:
    return COMPILES


@pytest.fixture(autouse=True)
def fresh_cerebrax(tmp_path, monkeypatch):
    """Every test starts with no backend, no configuration and no registered state,
    and with chex's trace counter (``chex.assert_max_traces``) at zero."""
    monkeypatch.chdir(tmp_path)
    cstorch.reset()
    chex.clear_trace_counter()
    yield
    cstorch.reset()


def pytest_configure(config) -> None:
    config.addinivalue_line(
        "markers", "zoo_slow: a slow model-zoo case, run only with CEREBRAX_ZOO_ALL=1")
