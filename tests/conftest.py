"""Shared fixtures: a fresh cerebrax process state per test, and a compile counter.

Property tests (hypothesis) run under the "cerebrax" profile: no example database on
disk, no deadline (the first example of a test pays for XLA compiles) and a fixed seed,
so the suite is the same on every run; each test sets its own small ``max_examples``.

Multi-device tests live in tests/multidevice/ and run in their own pytest process with
XLA_FLAGS=--xla_force_host_platform_device_count=8 (set before JAX starts); without that
flag they are not collected.

cerebrax itself does not depend on torch. Where torch is not installed (CI's pass on the
newest JAX), a test module that imports torch, torchvision, transformers, timm or
torch_bridge, itself or through a helper module of tests/, is reported as skipped; a test
that needs torch only in its body calls ``pytest.importorskip("torch")``. A module that
fails because cerebrax's own code imports torch still fails.
"""

from __future__ import annotations

import ast
import atexit
import functools
import importlib.util
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


TESTS = pathlib.Path(__file__).parent
TORCH_PACKAGES = ("torch", "torchvision", "transformers", "timm", "torch_bridge")
HAVE_TORCH = importlib.util.find_spec("torch") is not None


@functools.cache
def _torch_import(path: pathlib.Path) -> str | None:
    """The torch package ``path`` imports at module level, itself or through a helper
    module of tests/ (found beside it or in tests/ itself), or None."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        for name in (n.split(".")[0] for n in names):
            if name in TORCH_PACKAGES:
                return name
            for helper in (path.parent / f"{name}.py", TESTS / f"{name}.py"):
                if helper.is_file() and helper != path and (found := _torch_import(helper)):
                    return found
    return None


class _NeedsTorch(pytest.Module):
    def collect(self):
        pytest.skip(f"imports {_torch_import(self.path)}, and torch is not installed",
                    allow_module_level=True)


def pytest_pycollect_makemodule(module_path: pathlib.Path, parent):
    if not HAVE_TORCH and _torch_import(module_path):
        return _NeedsTorch.from_parent(parent, path=module_path)
    return None


class CompileCounter:
    """Counts the XLA programs the process builds: those XLA compiles (JAX's backend
    compile event) and those loaded from the test run's compilation cache (JAX's cache
    hit event), which a process without that cache would have compiled."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, event: str, duration: float | None = None, **kwargs) -> None:
        if event in ("/jax/core/compile/backend_compile_duration",
                     "/jax/compilation_cache/cache_hits"):
            self.count += 1


COMPILES = CompileCounter()
jax.monitoring.register_event_duration_secs_listener(COMPILES)
jax.monitoring.register_event_listener(COMPILES)


def _run_folder(variable: str, prefix: str) -> str:
    """A folder for this pytest run, named by ``variable``: made by the process that
    starts first (xdist's workers inherit it) and removed when that process exits."""
    if variable not in os.environ:
        os.environ[variable] = tempfile.mkdtemp(prefix=prefix)
        atexit.register(shutil.rmtree, os.environ[variable], ignore_errors=True)
    return os.environ[variable]


# JAX's persistent compilation cache, shared by the run's test processes (xdist's
# workers): a program that several tests build (the same optimizer update, model or
# step at the same shapes) is compiled once. CompileCounter counts what it loads, so the
# tests that count compiles count every program. Backends keep a directory JAX already
# has (cerebrax.backend._compile_cache); the user's cache folder is not touched.
jax.config.update("jax_compilation_cache_dir",
                  _run_folder("CEREBRAX_TEST_JAX_CACHE", "jax_cache_"))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
# The scripts, commands and notebooks the tests run in subprocesses share another folder
# of this run, not the user's ~/.cache (tests/test_startup.py and tests/cli test the
# cache itself in fresh processes).
_run_folder("CEREBRAX_COMPILE_CACHE", "cerebrax_cache_")


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
