"""Multi-device tests need 8 emulated CPU devices, set before JAX starts:

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m pytest tests/multidevice
"""

from __future__ import annotations

import jax
import pytest


def pytest_collection_modifyitems(config, items):
    if jax.device_count() == 8:
        return
    skip = pytest.mark.skip(
        reason="needs XLA_FLAGS=--xla_force_host_platform_device_count=8 (its own process)")
    for item in items:
        if "multidevice" in str(item.fspath):
            item.add_marker(skip)
