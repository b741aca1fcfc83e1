"""A model call's inputs on the wafer: the batch, its micro-batches, and the PRNG key.

Shared by pipeline mode (:mod:`._pipeline`), weight streaming (:mod:`._streaming`) and
micro-batched calls (:mod:`._micro`): which input leaves split along the batch, how a
system's rows cut into micro-batches (with the ``ConfigError`` where they do not), and
how a key crosses ``shard_map`` and folds per micro-batch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh

from .._filters import is_array, is_prng_key
from .._tree import Skeleton, combine, partition
from ..errors import ConfigError


def _is_split_input(x: Any) -> bool:
    """Whether a model input leaf is split into micro-batches: an array, not a numpy scalar."""
    # A numpy scalar (np.float32(0.5) written in the step) goes to every micro-batch as
    # it is, like a Python number.
    return is_array(x) and not isinstance(x, np.generic)


def _batch_of(leaves: list, names: list[str], what: str = "Pipeline mode") -> int:
    """The rows of the call: the first dimension every split input shares (ConfigError)."""
    arrays = [(n, x) for n, x in zip(names, leaves) if _is_split_input(x)]
    if not arrays or not arrays[0][1].shape:
        raise ConfigError(
            f"{what} splits the model's inputs into micro-batches along their first "
            "dimension, but the model was called without a batched array input."
        )
    batch = arrays[0][1].shape[0]
    for name, x in arrays:
        if not x.shape or x.shape[0] != batch:
            raise ConfigError(
                f"{what} splits every array input of the model along its first "
                f"dimension (the batch, {batch} rows in `{arrays[0][0]}`), but model input "
                f"`{name}` has shape {tuple(x.shape)}. Fix: pass per-example arrays only; "
                "capture other arrays in the model instead."
            )
    return batch


def _micro_batches(batch: int, num_csx: int, micro: int | None, num_stages: int,
                   what: str = "Pipeline mode") -> int:
    """How many micro-batches each system's rows make (ConfigError where they don't split)."""
    if batch % num_csx:
        raise ConfigError(
            f"The model's batch of {batch} rows cannot be split over num_csx={num_csx} "
            f"systems. Fix: use a batch size divisible by {num_csx}."
        )
    per_system = batch // num_csx
    if micro is None:
        if per_system % num_stages:
            raise ConfigError(
                f"ClusterConfig(micro_batch_size=None) splits each system's batch "
                f"({per_system} rows) into num_stages={num_stages} micro-batches, which "
                f"does not divide it. Fix: set micro_batch_size to a divisor of "
                f"{per_system}, or use a batch size divisible by num_csx x num_stages = "
                f"{num_csx * num_stages}."
            )
        return num_stages
    if per_system % micro:
        divisors = [d for d in range(1, per_system + 1) if per_system % d == 0]
        raise ConfigError(
            f"{what} splits each system's batch into micro-batches of "
            f"micro_batch_size={micro} rows, but a system gets {per_system} rows "
            f"(batch {batch} / num_csx {num_csx}), which {micro} does not divide. Fix: "
            f"use a batch size divisible by num_csx x micro_batch_size = {num_csx * micro} "
            f"(e.g. {num_csx * micro * max(per_system // micro, 1)}), or a micro_batch_size "
            f"that divides {per_system} (one of {divisors})."
        )
    return per_system // micro


def split_inputs(args: tuple, kwargs: dict) -> tuple[list, Skeleton]:
    """The leaves of a model call that split along the batch, and the rest
    (:func:`~cerebrax._tree.partition` with :func:`_is_split_input`)."""
    return partition((args, kwargs), lambda x: (x, None) if _is_split_input(x) else None)


@dataclasses.dataclass(frozen=True)
class RowSplit:
    """A model call's inputs: the leaves split along dim 0, and the rest.

    Attributes:
      split: the split leaves, whole (``[batch, ...]``), in leaf order.
      skeleton: the call's ``(args, kwargs)`` but for those.
      rows: rows of one part.
    """

    split: tuple
    skeleton: Skeleton
    rows: int

    def arrays(self) -> list:
        """The leaves that are split, whole (``[batch, ...]``)."""
        return list(self.split)

    def abstract(self) -> list[jax.ShapeDtypeStruct]:
        """Shapes and dtypes of the split leaves for one part."""
        return [jax.ShapeDtypeStruct((self.rows, *x.shape[1:]), x.dtype) for x in self.split]

    def rebuild(self, arrays: Sequence[Any]) -> tuple[tuple, dict]:
        """``(args, kwargs)`` with the split leaves replaced by ``arrays``."""
        return combine(arrays, self.skeleton)


@dataclasses.dataclass(frozen=True, kw_only=True)
class _MicroBatchedInputs(RowSplit):
    """The model call's inputs, and how they split into micro-batches (``rows`` each).

    Attributes:
      batch: rows of the whole call.
      count: micro-batches per system (``M``).
    """

    batch: int
    count: int

    @classmethod
    def of(cls, args: tuple, kwargs: dict, mesh: Mesh, micro_batch_size: int | None
           ) -> _MicroBatchedInputs:
        """Splits the inputs and checks that the batch splits (ConfigError otherwise)."""
        names = ["inputs" + jax.tree_util.keystr(p)
                 for p, _ in jax.tree_util.tree_flatten_with_path((args, kwargs))[0]]
        num_csx, num_stages = mesh.shape["csx"], mesh.shape["stage"]
        batch = _batch_of(jax.tree.leaves((args, kwargs)), names)
        count = _micro_batches(batch, num_csx, micro_batch_size, num_stages)
        split, skeleton = split_inputs(args, kwargs)
        return cls(split=tuple(split), skeleton=skeleton, rows=batch // num_csx // count,
                   batch=batch, count=count)


def _check_circular_micro_batches(inputs: _MicroBatchedInputs, mesh: Mesh,
                                  micro: int | None) -> None:
    """The circular schedule sends micro-batches round in groups of ``num_stages``."""
    num_stages = mesh.shape["stage"]
    if inputs.count % num_stages == 0:
        return
    per_system = inputs.batch // mesh.shape["csx"]
    sizes = [d for d in range(1, per_system // num_stages + 1)
             if per_system % num_stages == 0 and (per_system // num_stages) % d == 0]
    fix = (f"set micro_batch_size to {max(d for d in sizes if d <= micro)} (any of "
           f"{sizes} gives a multiple of {num_stages})" if sizes else
           f"use a batch size divisible by num_csx x num_stages = "
           f"{mesh.shape['csx'] * num_stages}")
    raise ConfigError(
        f"ClusterConfig(pipeline_schedule='circular', num_stages={num_stages}) sends "
        f"micro-batches round the ring of stage devices in groups of {num_stages}, so "
        f"each system needs a multiple of {num_stages} micro-batches; its {per_system} "
        f"rows in micro-batches of micro_batch_size={micro} make {inputs.count}. Fix: "
        f"{fix}, or use pipeline_schedule='gpipe'."
    )


def _key_data(key: Any) -> tuple[Any, bool]:
    """``(raw key data or None, whether key is a typed key)``: raw data crosses shard_map."""
    typed = is_prng_key(key)
    data = None if key is None else (jax.random.key_data(key) if typed else key)
    return data, typed


def _fold_key(key_data: Any, typed: bool, index: Any) -> Any:
    """``fold_in(key, index)`` for the key behind ``key_data``; None without a key."""
    if key_data is None:
        return None
    k = jax.random.wrap_key_data(key_data) if typed else key_data
    return jax.random.fold_in(k, index)
