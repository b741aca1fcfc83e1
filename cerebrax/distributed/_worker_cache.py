"""The worker cache: a local directory where data directories are copied for fast reads
(on Cerebras systems, the SSD of the worker nodes). cerebrax's is
``$CEREBRAX_WORKER_CACHE``, by default ``~/.cache/cerebrax/worker_cache``."""

from __future__ import annotations

import os
import shutil

__all__ = ["WORKER_CACHE_ROOT", "hit_worker_cache_limit"]

#: Where workers cache copies of input files (``$CEREBRAX_WORKER_CACHE``, by default
#: ``~/.cache/cerebrax/worker_cache``).
WORKER_CACHE_ROOT: str = os.path.abspath(os.environ.get(
    "CEREBRAX_WORKER_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "cerebrax",
                                          "worker_cache")))


def _size(path: str) -> int:
    if os.path.isfile(path):
        return os.path.getsize(path)
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            full = os.path.join(root, name)
            if os.path.isfile(full) and not os.path.islink(full):
                total += os.path.getsize(full)
    return total


def hit_worker_cache_limit(src_dir: str, dest_dir: str) -> tuple[bool, int, int]:
    """Whether copying ``src_dir`` into the cache at ``dest_dir`` would not fit:
    ``(limit_hit, bytes_to_copy, bytes_available)``; what ``dest_dir`` holds now counts
    as available (it is replaced)."""
    os.makedirs(WORKER_CACHE_ROOT, exist_ok=True)
    needed = _size(src_dir)
    available = shutil.disk_usage(WORKER_CACHE_ROOT).free
    if os.path.exists(dest_dir):
        available += _size(dest_dir)
    return needed > available, needed, available
