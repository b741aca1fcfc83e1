"""A torch newer than the tested range is named when torch_bridge is imported."""

from __future__ import annotations

import pytest

import torch_bridge


@pytest.mark.parametrize("version", ["2.11.0", "2.13.0+cpu", "2.14.1+cu130"])
def test_a_tested_torch_says_nothing(version):
    assert torch_bridge._untested_torch(version) is None


@pytest.mark.parametrize("version", ["2.15.0", "2.15.1+cpu", "3.0.0"])
def test_a_newer_torch_is_named_with_what_differs_and_the_fix(version):
    message = torch_bridge._untested_torch(version)
    assert f"torch {version} is installed" in message
    assert "clamp" in message and "Install torch<2.15" in message
