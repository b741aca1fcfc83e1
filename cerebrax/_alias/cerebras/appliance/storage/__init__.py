"""``cerebras.appliance.storage``: cerebrax's minimal stand-in for the checkpoint storage of
Cerebras' appliance package, present only under the cstorch alias.

The base classes :class:`StorageReader`, :class:`StorageWriter` and :class:`StorageDeleter`
answer for the subclass that handles a path (see :mod:`.base_storage`): local paths are H5
files (:mod:`.h5_storage`), and ``s3://`` paths are recognised and refused with what to do
instead (:mod:`.s3_storage`).
"""

from __future__ import annotations

from .base_storage import StorageDeleter, StorageReader, StorageWriter
from .h5_storage import H5Reader
from .s3_storage import S3Reader, S3Writer

__all__ = ["H5Reader", "S3Reader", "S3Writer", "StorageDeleter", "StorageReader",
           "StorageWriter"]
