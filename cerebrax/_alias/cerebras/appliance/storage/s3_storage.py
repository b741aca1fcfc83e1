"""``cerebras.appliance.storage.s3_storage``: cerebrax's minimal stand-in for the S3 storage
of Cerebras' appliance package, present only under the cstorch alias.

cerebrax has no S3 storage. These classes recognise ``s3://`` paths, so that Model Zoo's
``S3Writer.is_valid_path(path)`` checks answer (False for local paths, so local runs go
on), and refuse to use one: opening, writing, deleting or asking whether an ``s3://`` path
exists raises :class:`~cerebrax.errors.ConfigError` saying what to do instead.
"""

from __future__ import annotations

import os
from typing import NoReturn

from cerebrax.errors import ConfigError

from .base_storage import PathLike, StorageDeleter, StorageReader, StorageWriter

__all__ = ["S3Deleter", "S3Reader", "S3Writer"]

MSG_NO_S3 = """\
{path!r} is an S3 path, and cerebrax has no S3 storage: Cerebras' appliance package reads \
and writes s3:// checkpoints, and cerebrax's stand-in for it reads and writes local files \
only.
Fix, one of:
  - copy the checkpoint to a local file first (e.g. `aws s3 cp {path} ./`) and pass that path;
  - mount the bucket as a folder (e.g. with mountpoint-s3 or s3fs) and pass the mounted path;
  - save checkpoints to a local or mounted folder (model_dir, checkpoint_root)."""


def _no_s3(path: PathLike) -> NoReturn:
    raise ConfigError(MSG_NO_S3.format(path=os.fspath(path)))


class _S3Path:
    """An ``s3://bucket/key`` path, recognised and refused."""

    @classmethod
    def is_valid_path(cls, path: PathLike) -> bool:
        # pathlib.Path("s3://b/k") is "s3:/b/k"
        return os.fspath(path).startswith("s3:/")

    @classmethod
    def path_exists(cls, path: PathLike) -> bool:
        _no_s3(path)

    def __init__(self, path: PathLike) -> None:
        _no_s3(path)


class S3Reader(_S3Path, StorageReader):
    """Reads ``s3://`` checkpoints on Cerebras' appliance; refused here (see the module)."""


class S3Writer(_S3Path, StorageWriter):
    """Writes ``s3://`` checkpoints on Cerebras' appliance; refused here (see the module)."""


class S3Deleter(_S3Path, StorageDeleter):
    """Deletes ``s3://`` checkpoints on Cerebras' appliance; refused here (see the module)."""
