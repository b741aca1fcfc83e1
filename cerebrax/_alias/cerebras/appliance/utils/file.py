"""``cerebras.appliance.utils.file``: cerebrax's minimal stand-in for the file utilities of
Cerebras' appliance package, present only under the cstorch alias."""

from __future__ import annotations

import os

__all__ = ["create_symlink"]


def create_symlink(path: str | os.PathLike, target: str | os.PathLike,
                   target_is_directory: bool = False) -> None:
    """Makes ``path`` a symbolic link to ``target``, replacing a link (or file) already
    there in one step, as Model Zoo's ``latest`` and ``latest_run.log`` links are updated
    on every run. ``target`` is stored as given: a relative one is relative to ``path``'s
    folder. (``target_is_directory`` matters on Windows only, as for :func:`os.symlink`.)

    Raises:
      OSError: ``path``'s folder does not exist, or ``path`` is a folder.
    """
    path = os.fspath(path)
    temporary = f"{path}.{os.getpid()}.tmp"
    if os.path.lexists(temporary):  # left by a process with this id that died here
        os.remove(temporary)
    os.symlink(target, temporary, target_is_directory=target_is_directory)
    try:
        os.replace(temporary, path)
    except BaseException:
        os.remove(temporary)
        raise
