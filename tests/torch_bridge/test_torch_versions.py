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


def test_the_bridge_imports_on_a_torch_without_boxed_grads_call():
    """torch 2.11 and 2.12 have no ``Function.boxed_grads_call`` (2.13 added it), and the
    bridge did not import there (KeyError), though 2.11 is in the tested range. A fresh
    process without the attribute imports it and converts a module."""
    import subprocess
    import sys

    code = (
        "import torch\n"
        "level = torch.autograd.function._SingleLevelFunction\n"
        "if 'boxed_grads_call' in level.__dict__:\n"
        "    delattr(level, 'boxed_grads_call')\n"
        "import torch_bridge\n"
        "converted = torch_bridge.convert(torch.nn.Linear(3, 2), (torch.ones(1, 3),))\n"
        "print(converted(torch.ones(1, 3)).shape)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "(1, 2)" in result.stdout, result.stdout
