"""torchvision and timm on a CPU-only torch, for the tests.

PyPI's torchvision (0.28.0 for torch 2.13, 0.29.1 for torch 2.14) is a CUDA build: its
C++ operators do not load next to a CPU torch wheel (they do next to PyPI's torch 2.14.1,
itself a CUDA build, which CI installs), and ``import torchvision`` then fails
registering shape functions for two of them (``torchvision::nms`` and
``torchvision::qnms``). Its models are plain Python and need none of its operators.
:func:`load` declares the two operators' schemas, with no kernel, when the extension did
not load, so that the import succeeds; calling them raises torch's "no kernel" error.
Users install the CPU build instead (see README).
"""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

import torch

_SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor qdets, Tensor qscores, float iou_threshold) -> Tensor",
)
_LIBRARY: list[torch.library.Library] = []  # kept alive: dropping it removes the schemas


def load() -> tuple[ModuleType, ModuleType]:
    """``(torchvision, timm)``, imported."""
    if "torchvision" not in sys.modules and not _LIBRARY and not _extension_loads():
        library = torch.library.Library("torchvision", "DEF")
        for schema in _SCHEMAS:
            library.define(schema)
        _LIBRARY.append(library)
    import timm
    import torchvision

    return torchvision, timm


def _extension_loads() -> bool:
    """Whether torchvision's own C++ operators load (a CPU build of torchvision)."""
    spec = importlib.util.find_spec("torchvision")
    if spec is None or not spec.submodule_search_locations:
        return False
    import glob
    import os

    (root,) = spec.submodule_search_locations
    found = glob.glob(os.path.join(root, "_C*.so"))
    if not found:
        return False
    try:
        torch.ops.load_library(found[0])
    except (OSError, RuntimeError):
        return False
    return True
