"""JAX's persistent compilation cache, on for the steps of every backend.

A traced step is compiled by XLA the first time it runs, which is most of the time a
script waits for its first step. With the cache on, XLA's executable is written to
``<compile_dir>/jax_cache`` (``compile_dir`` defaults to ``./cerebras_logs/compile``),
and a second process that lowers the same program loads it instead of compiling. The
cache key is JAX's own: the lowered program, the compile options, the device, the jax
and jaxlib versions and XLA's flags. A changed step, shape, dtype, flag or version is
another key, so a stale program is never loaded.

Switches, read when a backend is created:

- ``CEREBRAX_COMPILE_CACHE=0`` (or ``false``, ``off``, ``no``) leaves the cache off;
  another value that is not ``1``/``true``/``on``/``yes`` is the cache directory to use;
- a cache directory set in JAX already (``jax.config.update("jax_compilation_cache_dir",
  ...)``, ``JAX_COMPILATION_CACHE_DIR``) is kept, and so is JAX's own switch
  ``jax_enable_compilation_cache=False``.

The first directory set in a process is the one used: JAX has one cache per process.
The cache is trusted: do not point it at a directory others can write to.
"""

from __future__ import annotations

import os

import jax

__all__ = ["ENV", "enable"]

ENV = "CEREBRAX_COMPILE_CACHE"
_OFF = ("0", "false", "off", "no")
_ON = ("", "1", "true", "on", "yes")


def enable(compile_dir: str) -> str | None:
    """Turns JAX's persistent compilation cache on in ``<compile_dir>/jax_cache``.

    Every program is cached, however small or quick to compile. Returns the directory
    the cache uses, or None where it is off (see the module's switches).
    """
    setting = os.environ.get(ENV, "1").strip()
    if setting.lower() in _OFF or not jax.config.jax_enable_compilation_cache:
        return None
    if jax.config.jax_compilation_cache_dir:
        return jax.config.jax_compilation_cache_dir
    directory = os.path.abspath(
        os.path.join(compile_dir, "jax_cache") if setting.lower() in _ON else setting
    )
    os.makedirs(directory, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", directory)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return directory
