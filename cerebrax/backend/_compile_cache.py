"""JAX's persistent compilation cache, on for the steps of every backend.

A traced step is compiled by XLA the first time it runs, which is most of the time a
script waits for its first step. With the cache on, XLA's executable is written to disk
and a second process that lowers the same program loads it instead of compiling. The
cache key is JAX's own: the lowered program, the compile options, the device, the jax
and jaxlib versions and XLA's flags. A changed step, shape, dtype, flag or version is
another key, so a stale program is never loaded.

Where: ``<compile_dir>/jax_cache`` when the backend (or ``cerebrax fit``'s
``runconfig.compile_dir``) names a ``compile_dir``, else the user's cache folder,
``$XDG_CACHE_HOME/cerebrax/jax_cache`` (``~/.cache/cerebrax/jax_cache``), shared by
every script, so a script run again from any directory loads its steps and none leaves
files where it runs. The folder is not pruned: delete it to free the space.

Switches, read when a backend is created:

- ``CEREBRAX_COMPILE_CACHE=0`` (or ``false``, ``off``, ``no``) leaves the cache off;
  another value that is not ``1``/``true``/``on``/``yes`` is the cache directory used
  where no ``compile_dir`` is named (in place of the user's cache folder);
- a cache directory set in JAX already (``jax.config.update("jax_compilation_cache_dir",
  ...)``, ``JAX_COMPILATION_CACHE_DIR``) is kept, and so is JAX's own switch
  ``jax_enable_compilation_cache=False``.

Exported torch graphs are kept in ``torch_export/`` inside the cache's folder
(``torch_bridge._export_cache``, ``CEREBRAX_EXPORT_CACHE=0`` turns that part off).

The first directory set in a process is the one used: JAX has one cache per process.
The cache is trusted: do not point it at a directory others can write to.
"""

from __future__ import annotations

import os
import warnings

import jax

__all__ = ["ENV", "default_directory", "enable"]

ENV = "CEREBRAX_COMPILE_CACHE"
_OFF = ("0", "false", "off", "no")
_ON = ("", "1", "true", "on", "yes")


def default_directory() -> str:
    """The user's cache folder for compiled programs (``~/.cache/cerebrax/jax_cache``)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "cerebrax", "jax_cache")


def enable(compile_dir: str | None = None) -> str | None:
    """Turns JAX's persistent compilation cache on, in ``<compile_dir>/jax_cache`` or
    (``compile_dir=None``) in :func:`default_directory`.

    Every program is cached, however small or quick to compile. Returns the directory
    the cache uses, or None where it is off (see the module's switches, and a directory
    that cannot be created, which is warned about).
    """
    setting = os.environ.get(ENV, "1").strip()
    if setting.lower() in _OFF or not jax.config.jax_enable_compilation_cache:
        return None
    if jax.config.jax_compilation_cache_dir:
        return jax.config.jax_compilation_cache_dir
    if compile_dir is not None:
        directory = os.path.join(compile_dir, "jax_cache")
    elif setting.lower() not in _ON:
        directory = setting
    else:
        directory = default_directory()
    directory = os.path.abspath(directory)
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as error:
        warnings.warn(
            f"cerebrax leaves JAX's compilation cache off: cannot create {directory} "
            f"({error}). Name a writable folder with {ENV}=/path (or {ENV}=0 to silence "
            "this).", stacklevel=3)
        return None
    jax.config.update("jax_compilation_cache_dir", directory)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return directory
