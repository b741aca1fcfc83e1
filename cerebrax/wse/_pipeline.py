"""Layer-pipelined execution: a GPipe schedule on the wafer's ``(csx, stage)`` mesh.

A model in pipeline mode describes itself as :class:`Layers`: an ordered list of
layers (a torch child module such as ``blocks.0``, one entry of a
``FunctionalModel(layers=...)``, one module of an ``nnx.Sequential``) and a way to run
any contiguous range of them. :func:`split_layers` cuts the list into ``num_stages``
contiguous stages of about equal cost (a layer is never cut). :func:`pipelined_apply`
then runs one model call as a GPipe schedule inside ``jax.shard_map``:

- the batch is split over ``"csx"`` (each system gets ``B / num_csx`` rows) and, inside a
  system, into ``M`` micro-batches of ``micro_batch_size`` rows;
- device ``s`` of the ``"stage"`` axis holds only stage ``s``'s parameters (packed per
  stage into one flat vector per dtype, the ``[num_stages, width]`` array is split over
  ``"stage"``) and runs only stage ``s``, chosen by ``jax.lax.switch`` on its axis index;
- at tick ``t`` (``M + S - 1`` ticks) stage ``s`` runs micro-batch ``t - s`` if there is
  one and idles otherwise (the bubble); the values crossing a stage boundary (the
  carry: one or several arrays of any dtype) are packed into one padded flat buffer per
  dtype and move to the next stage with ``jax.lax.ppermute``;
- the last stage's outputs are collected per micro-batch and summed over ``"stage"``
  (only the last stage contributes), giving the full batch back to the caller.

The loss is computed by the user's step on those outputs as usual. Differentiating the
step (the trace runtime's one ``jax.vjp``) transposes the schedule: the backward runs
the ticks in reverse, ``ppermute`` sends cotangents to the previous stage, and the
gradient of a parameter used by two stages (a tied weight) is the sum of both. Forward
of all micro-batches, then backward of all of them: the GPipe schedule. Everything is
part of the one jitted step program.

Semantics that differ from one device:

- Each stage normalizes with the statistics of the micro-batch it sees (BatchNorm in
  train mode), and updates its buffers (running statistics) once per micro-batch, in
  micro-batch order. This equals calling the model on the micro-batches one after
  the other on one device. With ``num_csx > 1`` every system does so on its own rows;
  afterwards floating-point buffers are averaged over systems (integer buffers such as
  ``num_batches_tracked`` are the same on every system and kept).
- Random keys differ per micro-batch: micro-batch ``m`` of system ``c`` uses
  ``fold_in(key, c * M + m)``.

Parameters stay replicated in the traced step's state (the optimizer sees them under
their usual names); the per-stage packing happens inside the program, so during the
forward and backward pass each device holds and computes with its own stage only.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from ..errors import ConfigError
from ._mesh import Wafer

__all__ = ["Layers", "Stage", "pipelined_apply", "split_layers"]

# stage_fn(params, buffers, carry, args, kwargs, key) -> (carry_out, buffer_updates).
# The first stage gets carry=None; the last one returns the model's outputs.
StageFn = Callable[[dict, dict, Any, tuple, dict, Any], tuple[Any, dict]]


@dataclasses.dataclass(frozen=True)
class Stage:
    """One contiguous range of layers, ready to run.

    Attributes:
      fn: ``fn(params, buffers, carry, args, kwargs, key) -> (carry_out, updates)``;
        ``params`` and ``buffers`` hold the names below, ``args``/``kwargs`` are the
        model's inputs for one micro-batch, ``updates`` the buffers it changed.
      params: names of the parameters the stage reads.
      buffers: names of the buffers the stage reads or updates.
    """

    fn: StageFn
    params: tuple[str, ...]
    buffers: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Layers:
    """The layers of a model call, in order, as pipeline mode splits them.

    Attributes:
      names: one name per layer (``"blocks.0"``, ``"fc1"``, ``"layers.2"``).
      costs: the balancing weight of each layer (e.g. its parameter count).
      stage: ``stage(lo, hi)`` builds the :class:`Stage` running layers ``lo..hi-1``.
    """

    names: Sequence[str]
    costs: Sequence[int]
    stage: Callable[[int, int], Stage]


def split_layers(costs: Sequence[float], num_stages: int, names: Sequence[str] = ()
                 ) -> list[tuple[int, int]]:
    """Cuts ``len(costs)`` layers into ``num_stages`` contiguous non-empty ranges.

    The ranges minimize the largest stage cost (linear partition, exact dynamic
    program). Returns ``[(lo, hi), ...]``, one half-open range per stage.

    Raises:
      ConfigError: more stages than layers.
    """
    n = len(costs)
    if num_stages > n:
        shown = ", ".join(names[:12]) + (", ..." if len(names) > 12 else "")
        raise ConfigError(
            f"ClusterConfig(num_stages={num_stages}) asks for more pipeline stages than "
            f"the model has layers ({n}{': ' + shown if shown else ''}). A layer is "
            f"never cut between stages. Fix: set num_stages to at most {n}, or give the "
            "model more (smaller) layers."
        )
    prefix = np.concatenate([[0.0], np.cumsum(np.asarray(costs, np.float64))])
    # best[k][i]: the smallest max-stage cost of layers [0, i) in k stages.
    best = np.full((num_stages + 1, n + 1), np.inf)
    cut = np.zeros((num_stages + 1, n + 1), np.int64)
    best[0][0] = 0.0
    for k in range(1, num_stages + 1):
        for i in range(k, n - (num_stages - k) + 1):
            for j in range(k - 1, i):
                cost = max(best[k - 1][j], prefix[i] - prefix[j])
                if cost < best[k][i]:
                    best[k][i], cut[k][i] = cost, j
    ranges, hi = [], n
    for k in range(num_stages, 0, -1):
        lo = int(cut[k][hi])
        ranges.append((lo, hi))
        hi = lo
    return ranges[::-1]


# ---- flat per-dtype packing -------------------------------------------------------------
class _Flat:
    """Lays a list of arrays of known shapes out in one flat vector per dtype."""

    def __init__(self, structs: Sequence[Any]):
        self.slots = []
        self.sizes: dict[str, int] = {}
        for s in structs:
            dtype = np.dtype(s.dtype)
            if jax.dtypes.issubdtype(s.dtype, jax.dtypes.prng_key):
                raise ConfigError("A PRNG key array cannot cross a pipeline stage boundary.")
            size = math.prod(s.shape)
            start = self.sizes.get(dtype.name, 0)
            self.slots.append((dtype.name, start, size, tuple(s.shape)))
            self.sizes[dtype.name] = start + size

    def pack(self, arrays: Sequence[Any], widths: dict[str, int]) -> dict[str, jax.Array]:
        parts: dict[str, list] = {k: [] for k in widths}
        for (k, _, _, _), a in zip(self.slots, arrays):
            parts[k].append(jnp.ravel(a).astype(k))
        out = {}
        for k, width in widths.items():
            pad = width - self.sizes.get(k, 0)
            pieces = parts[k] + ([jnp.zeros((pad,), k)] if pad else [])
            out[k] = jnp.concatenate(pieces) if len(pieces) > 1 else pieces[0]
        return out

    def unpack(self, flat: dict[str, jax.Array], lead: tuple[int, ...] = ()) -> list:
        """The arrays back; ``flat[k]`` may have leading dims ``lead`` before the vector."""
        return [jax.lax.slice_in_dim(flat[k], start, start + size, axis=len(lead))
                .reshape(*lead, *shape) for k, start, size, shape in self.slots]


def _widths(flats: Sequence[_Flat]) -> dict[str, int]:
    widths: dict[str, int] = {}
    for f in flats:
        for k, n in f.sizes.items():
            widths[k] = max(widths.get(k, 0), n)
    return {k: widths[k] for k in sorted(widths) if widths[k] > 0}


def _vary(x: jax.Array, axes: tuple[str, ...]) -> jax.Array:
    """``x`` marked as varying over every axis in ``axes`` (shard_map's type system)."""
    missing = tuple(a for a in axes if a not in jax.typeof(x).manual_axis_type.varying)
    return jax.lax.pcast(x, missing, to="varying") if missing else x


# ---- the schedule -----------------------------------------------------------------------
def _is_array(x: Any) -> bool:
    return isinstance(x, (jax.Array, np.ndarray, jax.core.Tracer))


def _batch_of(leaves: list, names: list[str], what: str = "Pipeline mode") -> int:
    arrays = [(n, x) for n, x in zip(names, leaves) if _is_array(x)]
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


def pipelined_apply(layers_for: Callable[[tuple, dict], Layers], wafer: Wafer,
                    micro_batch_size: int | None,
                    params: dict, buffers: dict, args: tuple, kwargs: dict, *,
                    key: Any = None) -> tuple[Any, dict]:
    """Runs one model call as a GPipe schedule on ``wafer`` (see the module docstring).

    Args:
      layers_for: ``layers_for(args, kwargs)`` gives the model's :class:`Layers` for
        inputs like one micro-batch's (array leaves as ``jax.ShapeDtypeStruct``).
      wafer: a pipeline :class:`Wafer` (mesh axes ``("csx", "stage")``).
      micro_batch_size: rows per micro-batch; None gives ``num_stages`` micro-batches.
      params, buffers: the model's state by name (arrays or tracers).
      args, kwargs: the model's inputs; every array leaf is split along dim 0.
      key: a PRNG key (typed or raw) or None.

    Returns:
      ``(outputs, new_buffers)`` like a ``ModelAdapter.apply``.
    """
    mesh = wafer.mesh
    num_csx, num_stages = mesh.shape["csx"], mesh.shape["stage"]
    leaves, treedef = jax.tree.flatten((args, kwargs))
    paths = [jax.tree_util.keystr(p) for p, _ in
             jax.tree_util.tree_flatten_with_path((args, kwargs))[0]]
    names = ["inputs" + p for p in paths]
    batch = _batch_of(leaves, names)
    m_count = _micro_batches(batch, num_csx, micro_batch_size, num_stages)
    micro = batch // num_csx // m_count
    dyn_index = [i for i, x in enumerate(leaves) if _is_array(x)]
    typed_key = key is not None and jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key)
    key_data = None if key is None else (jax.random.key_data(key) if typed_key else key)

    def micro_inputs(dyn: list) -> tuple[tuple, dict]:
        full = list(leaves)
        for i, x in zip(dyn_index, dyn):
            full[i] = x
        return jax.tree.unflatten(treedef, full)

    def stage_key(kd: Any, index: Any) -> Any:
        if kd is None:
            return None
        k = jax.random.wrap_key_data(kd) if typed_key else kd
        return jax.random.fold_in(k, index)

    # Shapes of every carry, from an abstract run of the stages on one micro-batch.
    def sub(d: dict, names: Sequence[str]) -> dict:
        return {n: d[n] for n in names}

    abstract = [jax.ShapeDtypeStruct((micro, *leaves[i].shape[1:]), leaves[i].dtype)
                for i in dyn_index]
    layers = layers_for(*micro_inputs(abstract))
    ranges = split_layers(layers.costs, num_stages, list(layers.names))
    stages = [layers.stage(lo, hi) for lo, hi in ranges]
    carry_shapes, carry_defs = [], []
    carry = None
    for k, stage in enumerate(stages):
        def probe(p, b, c, dyn, kd, _stage=stage):
            a, kw = micro_inputs(dyn)
            out, _ = _stage.fn(p, b, c, a, kw, stage_key(kd, 0))
            return out
        # Traced where stages run (under shard_map, every input replicated), abstractly.
        probe = jax.shard_map(probe, mesh=mesh, in_specs=P(), out_specs=P(), check_vma=False)
        carry = jax.eval_shape(probe, sub(params, stage.params), sub(buffers, stage.buffers),
                               carry, abstract, key_data)
        shapes, cdef = jax.tree.flatten(carry)
        if k == num_stages - 1:
            _check_outputs(shapes, micro, batch)
        carry_shapes.append(shapes)
        carry_defs.append(cdef)
    carry_flats = [_Flat(s) for s in carry_shapes]  # carry_flats[k]: what stage k sends
    carry_widths = _widths(carry_flats)

    param_flats = [_Flat([params[n] for n in s.params]) for s in stages]
    param_widths = _widths(param_flats)
    buffer_flats = [_Flat([buffers[n] for n in s.buffers]) for s in stages]
    buffer_widths = _widths(buffer_flats)
    packed_params = _stack([f.pack([params[n] for n in s.params], param_widths)
                            for f, s in zip(param_flats, stages)], param_widths)
    packed_buffers = _stack([f.pack([buffers[n] for n in s.buffers], buffer_widths)
                             for f, s in zip(buffer_flats, stages)], buffer_widths)
    axes = ("csx", "stage")

    def branch(k: int, dyn_inputs: list):
        stage = stages[k]

        def run(prow, brow, carry_in, m, kd):
            c_index = jax.lax.axis_index("csx") * m_count + m
            p = dict(zip(stage.params, param_flats[k].unpack(prow)))
            b = dict(zip(stage.buffers, buffer_flats[k].unpack(brow)))
            c = None if k == 0 else jax.tree.unflatten(
                carry_defs[k - 1], carry_flats[k - 1].unpack(carry_in))
            dyn = [jax.lax.dynamic_index_in_dim(x, m, keepdims=False) for x in dyn_inputs]
            a, kw = micro_inputs(dyn)
            out, updates = stage.fn(p, b, c, a, kw, stage_key(kd, c_index))
            b.update(updates)
            new_brow = buffer_flats[k].pack([b[n] for n in stage.buffers], buffer_widths)
            new_carry = carry_flats[k].pack(jax.tree.leaves(out), carry_widths)
            return (jax.tree.map(lambda x: _vary(x, axes), new_carry),
                    jax.tree.map(lambda x: _vary(x, axes), new_brow))
        return run

    def idle(prow, brow, carry_in, m, kd):
        zeros = {k: _vary(jnp.zeros((w,), k), axes) for k, w in carry_widths.items()}
        return zeros, jax.tree.map(lambda x: _vary(x, axes), brow)

    last = num_stages - 1
    perm = [(s, s + 1) for s in range(num_stages - 1)]

    def body(prows, brows, dyn, kd):
        # Everything a stage reads is marked varying over both axes once, before the
        # schedule: every value in a stage then has one type (custom_vjp rules in the
        # lowerings need that), and the transposed cast sums a parameter's gradient
        # over "csx" once per step, not once per tick.
        per_micro = [_vary(x.reshape(m_count, micro, *x.shape[1:]), axes) for x in dyn]
        branches = [branch(k, per_micro) for k in range(num_stages)] + [idle]
        s = jax.lax.axis_index("stage")
        prow = {k: _vary(v[0], axes) for k, v in prows.items()}
        brow0 = {k: _vary(v[0], axes) for k, v in brows.items()}
        carry0 = {k: _vary(jnp.zeros((w,), k), axes) for k, w in carry_widths.items()}
        outs0 = {k: _vary(jnp.zeros((m_count, w), k), axes) for k, w in carry_widths.items()}

        def tick(state, t):
            carry_in, brow, outs = state
            m_raw = t - s
            valid = (m_raw >= 0) & (m_raw < m_count)
            m = jnp.clip(m_raw, 0, m_count - 1)
            index = jnp.where(valid, s, num_stages)
            carry_out, brow = jax.lax.switch(index, branches, prow, brow, carry_in, m, kd)
            keep = valid & (s == last)
            outs = {k: jax.lax.dynamic_update_index_in_dim(
                v, jnp.where(keep, carry_out[k], v[m]), m, 0) for k, v in outs.items()}
            if perm:
                carry_out = {k: jax.lax.ppermute(v, "stage", perm)
                             for k, v in carry_out.items()}
            return (carry_out, brow, outs), None

        ticks = jnp.arange(m_count + num_stages - 1)
        (_, brow, outs), _ = jax.lax.scan(tick, (carry0, brow0, outs0), ticks)
        outs = {k: jax.lax.psum(v, "stage") for k, v in outs.items()}
        brow = {k: _across_systems(v) for k, v in brow.items()}
        return outs, {k: v[None] for k, v in brow.items()}

    dyn = [leaves[i] for i in dyn_index]
    in_specs = (
        {k: P("stage") for k in packed_params},
        {k: P("stage") for k in packed_buffers},
        [P("csx") for _ in dyn],
        None if key_data is None else P(),
    )
    out_specs = ({k: P("csx") for k in carry_widths}, {k: P("stage") for k in packed_buffers})
    run = jax.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=out_specs)
    outs, new_rows = run(packed_params, packed_buffers, dyn, key_data)

    # Outputs: [num_csx * M, width] per dtype -> leaves of [batch, ...].
    out_leaves = [x.reshape(batch, *x.shape[2:])
                  for x in carry_flats[last].unpack(outs, lead=(num_csx * m_count,))]
    out = jax.tree.unflatten(carry_defs[last], out_leaves)
    new_buffers = dict(buffers)
    for k, (flat, stage) in enumerate(zip(buffer_flats, stages)):
        row = {d: v[k] for d, v in new_rows.items()}
        for name, value in zip(stage.buffers, flat.unpack(row)):
            new_buffers[name] = value
    return out, new_buffers


def _stack(rows: list[dict], widths: dict[str, int]) -> dict[str, jax.Array]:
    return {k: jnp.stack([r[k] for r in rows]) for k in widths}


def _across_systems(x: jax.Array) -> jax.Array:
    """A stage's buffers after the step: floats averaged over systems, others kept."""
    if jnp.issubdtype(x.dtype, jnp.floating):
        return jax.lax.pmean(x, "csx")
    # Integer counters advance the same on every system; the max makes the value
    # invariant over "csx" (what out_specs need) without changing it.
    return jax.lax.pmax(x, "csx")


def _check_outputs(shapes: list, micro: int, batch: int) -> None:
    for s in shapes:
        if not s.shape or s.shape[0] != micro:
            raise ConfigError(
                f"Pipeline mode gathers the model's outputs micro-batch by micro-batch, "
                f"so every output needs the batch as its first dimension; one output has "
                f"shape {tuple(s.shape)} for a micro-batch of {micro} rows (batch {batch}). "
                "Fix: return per-example outputs from the model and reduce them (e.g. the "
                "loss) in the step."
            )

