"""``cerebras.appliance.storage.base_storage``: cerebrax's minimal stand-in for the storage
base classes of Cerebras' appliance package, present only under the cstorch alias.

:class:`StorageReader`, :class:`StorageWriter` and :class:`StorageDeleter` each keep the
subclasses that handle one kind of path (every subclass registers itself on definition).
Asked about a path, a base class answers for the subclass whose ``is_valid_path`` accepts
it; Model Zoo uses them as::

    StorageWriter.is_valid_path(path)        # some kind of storage takes this path
    StorageReader.path_exists(path)          # asked of that kind's subclass
    StorageReader.get_type(path) is H5Reader
    StorageDeleter.get(path).delete()        # an instance of that subclass
"""

from __future__ import annotations

import os
from typing import ClassVar

from cerebrax.errors import ConfigError

__all__ = ["StorageDeleter", "StorageReader", "StorageWriter"]

PathLike = str | os.PathLike


class _Storage:
    """What the three base classes share: a path and the registry of their subclasses.

    A subclass overrides :meth:`is_valid_path` and :meth:`path_exists` for its kind of path.
    """

    _path_kinds: ClassVar[list[type]]  # set on each base class

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if "_path_kinds" not in cls.__dict__:  # a subclass: the nearest base keeps it
            cls._path_kinds.append(cls)

    def __init__(self, path: PathLike) -> None:
        self.path = os.fspath(path)

    @classmethod
    def is_valid_path(cls, path: PathLike) -> bool:
        """Whether one of the subclasses handles ``path``."""
        return any(kind.is_valid_path(path) for kind in cls._path_kinds)

    @classmethod
    def get_type(cls, path: PathLike) -> type:
        """The subclass that handles ``path``.

        Raises:
          ConfigError: none does.
        """
        for kind in cls._path_kinds:
            if kind.is_valid_path(path):
                return kind
        kinds = ", ".join(kind.__name__ for kind in cls._path_kinds)
        raise ConfigError(f"No {cls.__name__} handles the path {os.fspath(path)!r} (known: "
                          f"{kinds}). cerebrax reads and writes checkpoints as local files: "
                          "pass a local (or mounted) path.")

    @classmethod
    def get(cls, path: PathLike) -> _Storage:
        """An instance of the subclass that handles ``path``."""
        return cls.get_type(path)(path)

    @classmethod
    def path_exists(cls, path: PathLike) -> bool:
        """Whether ``path`` exists, asked of the subclass that handles it."""
        return cls.get_type(path).path_exists(path)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.path!r})"


class StorageReader(_Storage):
    """Base class of the checkpoint readers (:class:`H5Reader`, :class:`S3Reader`)."""

    _path_kinds: ClassVar[list[type]] = []


class StorageWriter(_Storage):
    """Base class of the checkpoint writers (:class:`H5Writer`, :class:`S3Writer`)."""

    _path_kinds: ClassVar[list[type]] = []


class StorageDeleter(_Storage):
    """Base class of the checkpoint deleters (``H5Deleter``, :class:`S3Deleter`): an
    instance's ``delete()`` deletes its path."""

    _path_kinds: ClassVar[list[type]] = []

    def delete(self) -> None:
        raise NotImplementedError(f"{type(self).__name__}.delete")
