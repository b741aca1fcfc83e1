"""What ``cerebrax.reset()`` clears besides the backend and the registered state."""

from __future__ import annotations

from . import _closures, _compile
from .amp import _precision
from .backend import _backend
from .data import _executor, _workers


def _clear() -> None:
    _closures.QUEUE.clear()
    _executor._ACTIVE.clear()
    _precision._reset()
    _compile._ALIASES.clear()
    _workers.close_all_streams()


_backend._RESET_HOOKS.append(_clear)
