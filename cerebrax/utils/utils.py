"""``cstorch.utils.utils``: parameter filters from glob patterns.

A pattern is a shell-style glob over a parameter's dotted name (``*`` matches any run
of characters, dots included; ``?`` one character; ``[...]`` a set), as in the
``param_filter`` options of cstorch's optimizers and schedulers.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import ConfigError

__all__ = ["FilterCallable", "convert_glob_to_regex", "make_param_filter"]

FilterCallable = Callable[[str, Any], bool]
"""A parameter filter: ``filter(name, param) -> bool``."""


def convert_glob_to_regex(pattern: str) -> re.Pattern:
    """The compiled regular expression that matches exactly the names ``pattern``
    (a glob) matches.

    Example:
      >>> from cerebrax.utils.utils import convert_glob_to_regex
      >>> bool(convert_glob_to_regex("*.bias").search("fc.1.bias"))
      True
      >>> bool(convert_glob_to_regex("*.bias").search("fc.1.bias_scale"))
      False
    """
    if not isinstance(pattern, str):
        raise ConfigError(f"a parameter filter is a glob string, got {pattern!r}.")
    return re.compile(r"\A" + fnmatch.translate(pattern))


def make_param_filter(patterns: str | Sequence[str] | FilterCallable) -> FilterCallable:
    """A :data:`FilterCallable` true for the parameters whose name matches any of the
    glob ``patterns`` (a callable is returned as it is).

    Example:
      >>> from cerebrax.utils.utils import make_param_filter
      >>> keep = make_param_filter(["*.weight", "embed*"])
      >>> keep("fc.weight", None), keep("fc.bias", None), keep("embedding.w", None)
      (True, False, True)
    """
    if callable(patterns):
        return patterns
    if isinstance(patterns, str):
        patterns = [patterns]
    regexes = [convert_glob_to_regex(p) for p in patterns]

    def param_filter(name: str, param: Any = None) -> bool:
        return any(r.match(name) for r in regexes)

    return param_filter
