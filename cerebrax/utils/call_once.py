"""``cstorch.utils.call_once``: a decorator that runs a function on its first call only."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["call_once"]


def call_once(return_last: bool = True) -> Callable[[Callable], Callable]:
    """``@call_once()``: the function runs on its first call only; later calls return
    the first call's result (``return_last=False``: None) without running it.

    Example:
      >>> from cerebrax.utils.call_once import call_once
      >>> calls = []
      >>> @call_once()
      ... def setup(x):
      ...     calls.append(x)
      ...     return x * 2
      >>> setup(1), setup(5), calls
      (2, 2, [1])
    """
    if callable(return_last) and not isinstance(return_last, bool):
        raise TypeError("call_once is a decorator factory: write @call_once(), not "
                        "@call_once.")

    def decorator(fn: Callable) -> Callable:
        lock = threading.Lock()
        done: list[Any] = []

        @functools.wraps(fn)
        def once(*args: Any, **kwargs: Any) -> Any:
            with lock:
                if not done:
                    done.append(fn(*args, **kwargs))
            return done[0] if return_last else None

        return once

    return decorator
