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
import functools
import math
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from .._filters import is_array
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
      signature: optional ``signature(i)``, a hashable structural key of layer ``i``
        (None: no key). Two layers with equal keys compute the same function of their
        positional inputs: the parameters and buffers in their stage's order and the
        carry. Weight streaming runs consecutive layers with equal keys as one
        ``jax.lax.scan`` (see :mod:`._streaming`); pipeline mode ignores the keys.
      projection: optional ``projection(i, j)``: where layer ``j`` computes what layer
        ``i`` computes but hands on only part of its carry (the last of a stack of
        blocks), the positions in ``i``'s carry out that ``j`` sends; else None. Such a
        layer joins the scan of the layers before it.
    """

    names: Sequence[str]
    costs: Sequence[int]
    stage: Callable[[int, int], Stage]
    signature: Callable[[int], Hashable | None] | None = None
    projection: Callable[[int, int], tuple[int, ...] | None] | None = None


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
    inputs = _MicroBatchedInputs.of(args, kwargs, wafer.mesh, micro_batch_size)
    key_data, typed_key = _key_data(key)
    plan = _plan(layers_for, wafer.mesh, inputs, params, buffers, key_data, typed_key)
    packed_params, packed_buffers = _pack_state(plan, params, buffers)
    outs, new_rows = _run_schedule(plan, packed_params, packed_buffers, key_data)
    return _gather_outputs(plan, outs), _new_buffers(plan, buffers, new_rows)


# ---- the call's inputs: micro-batches and key -------------------------------------------
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


@dataclasses.dataclass(frozen=True)
class _MicroBatchedInputs:
    """The model call's inputs as flat leaves, and how they split into micro-batches.

    Attributes:
      leaves, treedef: ``jax.tree.flatten((args, kwargs))``.
      split: indexes of the leaves split along dim 0 (the arrays); others stay as they are.
      batch: rows of the whole call.
      count: micro-batches per system (``M``).
      rows: rows per micro-batch.
    """

    leaves: tuple
    treedef: Any
    split: tuple[int, ...]
    batch: int
    count: int
    rows: int

    @classmethod
    def of(cls, args: tuple, kwargs: dict, mesh: Mesh, micro_batch_size: int | None
           ) -> _MicroBatchedInputs:
        """Flattens the inputs and checks that the batch splits (ConfigError otherwise)."""
        leaves, treedef = jax.tree.flatten((args, kwargs))
        names = ["inputs" + jax.tree_util.keystr(p)
                 for p, _ in jax.tree_util.tree_flatten_with_path((args, kwargs))[0]]
        num_csx, num_stages = mesh.shape["csx"], mesh.shape["stage"]
        batch = _batch_of(leaves, names)
        count = _micro_batches(batch, num_csx, micro_batch_size, num_stages)
        split = tuple(i for i, x in enumerate(leaves) if _is_split_input(x))
        return cls(tuple(leaves), treedef, split, batch, count, batch // num_csx // count)

    def arrays(self) -> list:
        """The leaves that are split, whole (``[batch, ...]``)."""
        return [self.leaves[i] for i in self.split]

    def abstract(self) -> list[jax.ShapeDtypeStruct]:
        """Shapes and dtypes of the split leaves for one micro-batch."""
        return [jax.ShapeDtypeStruct((self.rows, *self.leaves[i].shape[1:]),
                                     self.leaves[i].dtype) for i in self.split]

    def rebuild(self, arrays: list) -> tuple[tuple, dict]:
        """``(args, kwargs)`` with the split leaves replaced by ``arrays``."""
        full = list(self.leaves)
        for i, x in zip(self.split, arrays):
            full[i] = x
        return jax.tree.unflatten(self.treedef, full)


def _key_data(key: Any) -> tuple[Any, bool]:
    """``(raw key data or None, whether key is a typed key)``: raw data crosses shard_map."""
    typed = key is not None and jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key)
    data = None if key is None else (jax.random.key_data(key) if typed else key)
    return data, typed


def _fold_key(key_data: Any, typed: bool, index: Any) -> Any:
    """``fold_in(key, index)`` for the key behind ``key_data``; None without a key."""
    if key_data is None:
        return None
    k = jax.random.wrap_key_data(key_data) if typed else key_data
    return jax.random.fold_in(k, index)


# ---- the plan: stages and the layouts of their state and carries ------------------------
@dataclasses.dataclass(frozen=True)
class _PipelinePlan:
    """Everything about one pipelined call that is fixed before its schedule is traced.

    Stage ``k`` runs ``stages[k]``. Its parameters, its buffers and the carry it sends to
    stage ``k + 1`` (the last stage: the model's outputs) are packed by
    ``param_flats[k]``, ``buffer_flats[k]`` and ``carry_flats[k]`` into one flat vector
    per dtype, of the width ``*_widths`` gives (the largest over all stages).
    """

    mesh: Mesh
    inputs: _MicroBatchedInputs
    typed_key: bool
    stages: tuple[Stage, ...]
    carry_defs: tuple  # treedef of what stage k sends
    carry_flats: tuple[_Flat, ...]
    carry_widths: dict[str, int]
    param_flats: tuple[_Flat, ...]
    param_widths: dict[str, int]
    buffer_flats: tuple[_Flat, ...]
    buffer_widths: dict[str, int]

    @property
    def num_csx(self) -> int:
        """Systems the batch is split over (mesh axis ``"csx"``)."""
        return self.mesh.shape["csx"]

    @property
    def num_stages(self) -> int:
        """Pipeline stages (mesh axis ``"stage"``)."""
        return self.mesh.shape["stage"]

    @property
    def last(self) -> int:
        """The index of the last stage (the one producing the outputs)."""
        return self.num_stages - 1

    def received(self, k: int, flat: dict[str, jax.Array]) -> Any:
        """The carry stage ``k`` receives, unpacked from ``flat`` (None for stage 0)."""
        if k == 0:
            return None
        return jax.tree.unflatten(self.carry_defs[k - 1], self.carry_flats[k - 1].unpack(flat))


def _plan(layers_for: Callable[[tuple, dict], Layers], mesh: Mesh,
          inputs: _MicroBatchedInputs, params: dict, buffers: dict, key_data: Any,
          typed_key: bool) -> _PipelinePlan:
    """Splits the model into stages and lays out their state and carries."""
    abstract = inputs.abstract()
    layers = layers_for(*inputs.rebuild(abstract))
    ranges = split_layers(layers.costs, mesh.shape["stage"], list(layers.names))
    stages = tuple(layers.stage(lo, hi) for lo, hi in ranges)
    carries = _probe_carries(mesh, stages, inputs, abstract, params, buffers, key_data,
                             typed_key)
    _check_outputs(jax.tree.leaves(carries[-1]), inputs.rows, inputs.batch)
    carry_flats = tuple(_Flat(jax.tree.leaves(c)) for c in carries)
    param_flats = tuple(_Flat([params[n] for n in s.params]) for s in stages)
    buffer_flats = tuple(_Flat([buffers[n] for n in s.buffers]) for s in stages)
    return _PipelinePlan(
        mesh=mesh, inputs=inputs, typed_key=typed_key, stages=stages,
        carry_defs=tuple(jax.tree.structure(c) for c in carries),
        carry_flats=carry_flats, carry_widths=_widths(carry_flats),
        param_flats=param_flats, param_widths=_widths(param_flats),
        buffer_flats=buffer_flats, buffer_widths=_widths(buffer_flats),
    )


def _probe_carries(mesh: Mesh, stages: Sequence[Stage], inputs: _MicroBatchedInputs,
                   abstract: list, params: dict, buffers: dict, key_data: Any,
                   typed_key: bool) -> list:
    """What each stage returns for one micro-batch, as ``jax.ShapeDtypeStruct`` trees."""
    carries, carry = [], None
    for stage in stages:
        probe = _probe(mesh, stage, inputs, typed_key)
        carry = jax.eval_shape(probe, _sub(params, stage.params), _sub(buffers, stage.buffers),
                               carry, abstract, key_data)
        carries.append(carry)
    return carries


def _probe(mesh: Mesh, stage: Stage, inputs: _MicroBatchedInputs, typed_key: bool
           ) -> Callable:
    """``stage`` on one micro-batch under shard_map (every input replicated), for eval_shape."""

    def probe(p, b, c, dyn, kd):
        a, kw = inputs.rebuild(dyn)
        out, _ = stage.fn(p, b, c, a, kw, _fold_key(kd, typed_key, 0))
        return out
    # Traced where stages run (under shard_map), abstractly.
    return jax.shard_map(probe, mesh=mesh, in_specs=P(), out_specs=P(), check_vma=False)


def _sub(d: dict, names: Sequence[str]) -> dict:
    """The entries of ``d`` named by ``names``."""
    return {n: d[n] for n in names}


def _check_outputs(shapes: list, micro: int, batch: int) -> None:
    """Checks that every output of the last stage has the micro-batch as dim 0 (ConfigError)."""
    for s in shapes:
        if not s.shape or s.shape[0] != micro:
            raise ConfigError(
                f"Pipeline mode gathers the model's outputs micro-batch by micro-batch, "
                f"so every output needs the batch as its first dimension; one output has "
                f"shape {tuple(s.shape)} for a micro-batch of {micro} rows (batch {batch}). "
                "Fix: return per-example outputs from the model and reduce them (e.g. the "
                "loss) in the step."
            )


# ---- flat per-dtype packing -------------------------------------------------------------
class _Flat:
    """Lays a list of arrays of known shapes out in one flat vector per dtype."""

    def __init__(self, structs: Sequence[Any]):
        self.slots = []
        self.sizes: dict[str, int] = {}
        for s in structs:
            if jax.dtypes.issubdtype(s.dtype, jax.dtypes.prng_key):
                raise ConfigError(
                    "A PRNG key array cannot cross a pipeline stage boundary. Fix: let each "
                    "layer that needs randomness take `key` (it receives its own), instead "
                    "of passing a key from one layer to the next.")
            dtype = np.dtype(s.dtype)
            size = math.prod(s.shape)
            start = self.sizes.get(dtype.name, 0)
            self.slots.append((dtype.name, start, size, tuple(s.shape)))
            self.sizes[dtype.name] = start + size

    def pack(self, arrays: Sequence[Any], widths: dict[str, int]) -> dict[str, jax.Array]:
        """``arrays`` in one vector per dtype, zero-padded to ``widths``."""
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
    """The width per dtype that holds every layout in ``flats`` (dtypes sorted, none empty)."""
    widths: dict[str, int] = {}
    for f in flats:
        for k, n in f.sizes.items():
            widths[k] = max(widths.get(k, 0), n)
    return {k: widths[k] for k in sorted(widths) if widths[k] > 0}


def _pack_state(plan: _PipelinePlan, params: dict, buffers: dict) -> tuple[dict, dict]:
    """Parameters and buffers packed per stage: ``{dtype: [num_stages, width]}`` each."""
    packed_params = _pack_per_stage(plan.param_flats, [s.params for s in plan.stages],
                                    params, plan.param_widths)
    packed_buffers = _pack_per_stage(plan.buffer_flats, [s.buffers for s in plan.stages],
                                     buffers, plan.buffer_widths)
    return packed_params, packed_buffers


def _pack_per_stage(flats: Sequence[_Flat], names: Sequence[Sequence[str]], values: dict,
                    widths: dict[str, int]) -> dict[str, jax.Array]:
    """Row ``k``: the ``values`` stage ``k`` names, packed by ``flats[k]``; rows stacked."""
    rows = [f.pack([values[n] for n in ns], widths) for f, ns in zip(flats, names)]
    return {k: jnp.stack([r[k] for r in rows]) for k in widths}


# ---- the schedule -----------------------------------------------------------------------
_AXES = ("csx", "stage")


def _run_schedule(plan: _PipelinePlan, packed_params: dict, packed_buffers: dict,
                  key_data: Any) -> tuple[dict, dict]:
    """Runs the schedule on the mesh: ``({dtype: [num_csx * M, width]}, new buffer rows)``."""
    dyn = plan.inputs.arrays()
    in_specs = (
        {k: P("stage") for k in packed_params},
        {k: P("stage") for k in packed_buffers},
        [P("csx") for _ in dyn],
        None if key_data is None else P(),
    )
    out_specs = ({k: P("csx") for k in plan.carry_widths},
                 {k: P("stage") for k in packed_buffers})
    run = jax.shard_map(functools.partial(_schedule, plan), mesh=plan.mesh,
                        in_specs=in_specs, out_specs=out_specs)
    return run(packed_params, packed_buffers, dyn, key_data)


def _schedule(plan: _PipelinePlan, prows: dict, brows: dict, dyn: list, kd: Any
              ) -> tuple[dict, dict]:
    """One device's program: all ticks of its stage, then outputs and buffers reduced."""
    # Everything a stage reads is marked varying over both axes once, before the
    # schedule: every value in a stage then has one type (custom_vjp rules in the
    # lowerings need that), and the transposed cast sums a parameter's gradient
    # over "csx" once per step, not once per tick.
    per_micro = [_vary(x.reshape(plan.inputs.count, plan.inputs.rows, *x.shape[1:]), _AXES)
                 for x in dyn]
    branches = ([_stage_branch(plan, k, per_micro) for k in range(plan.num_stages)]
                + [_idle_branch(plan)])
    s = jax.lax.axis_index("stage")
    prow = {k: _vary(v[0], _AXES) for k, v in prows.items()}
    brow0 = {k: _vary(v[0], _AXES) for k, v in brows.items()}
    state0 = (_zeros(plan.carry_widths), brow0,
              _zeros(plan.carry_widths, (plan.inputs.count,)))
    tick = _tick(plan, branches, s, prow, kd)
    ticks = jnp.arange(plan.inputs.count + plan.num_stages - 1)
    (_, brow, outs), _ = jax.lax.scan(tick, state0, ticks)
    outs = {k: jax.lax.psum(v, "stage") for k, v in outs.items()}
    brow = {k: _across_systems(v) for k, v in brow.items()}
    return outs, {k: v[None] for k, v in brow.items()}


def _tick(plan: _PipelinePlan, branches: list[Callable], s: jax.Array, prow: dict, kd: Any
          ) -> Callable:
    """The scan step: at tick ``t`` stage ``s`` runs micro-batch ``t - s`` (or idles),
    the last stage keeps its outputs, and every carry moves to the next stage."""
    count = plan.inputs.count
    perm = [(i, i + 1) for i in range(plan.num_stages - 1)]

    def tick(state, t):
        carry_in, brow, outs = state
        m_raw = t - s
        valid = (m_raw >= 0) & (m_raw < count)
        m = jnp.clip(m_raw, 0, count - 1)
        index = jnp.where(valid, s, plan.num_stages)
        carry_out, brow = jax.lax.switch(index, branches, prow, brow, carry_in, m, kd)
        outs = _keep_outputs(outs, carry_out, m, valid & (s == plan.last))
        if perm:
            carry_out = {k: jax.lax.ppermute(v, "stage", perm) for k, v in carry_out.items()}
        return (carry_out, brow, outs), None
    return tick


def _keep_outputs(outs: dict, carry_out: dict, m: jax.Array, keep: jax.Array) -> dict:
    """``outs`` with row ``m`` set to ``carry_out`` where ``keep`` (and left as it is elsewhere)."""
    return {k: jax.lax.dynamic_update_index_in_dim(v, jnp.where(keep, carry_out[k], v[m]), m, 0)
            for k, v in outs.items()}


def _stage_branch(plan: _PipelinePlan, k: int, per_micro: list) -> Callable:
    """Stage ``k``'s tick: runs micro-batch ``m``; returns its packed carry and buffers."""
    stage = plan.stages[k]
    buffer_flat = plan.buffer_flats[k]

    def run(prow, brow, carry_in, m, kd):
        c_index = jax.lax.axis_index("csx") * plan.inputs.count + m
        p = dict(zip(stage.params, plan.param_flats[k].unpack(prow)))
        b = dict(zip(stage.buffers, buffer_flat.unpack(brow)))
        c = plan.received(k, carry_in)
        dyn = [jax.lax.dynamic_index_in_dim(x, m, keepdims=False) for x in per_micro]
        a, kw = plan.inputs.rebuild(dyn)
        out, updates = stage.fn(p, b, c, a, kw, _fold_key(kd, plan.typed_key, c_index))
        b.update(updates)
        new_brow = buffer_flat.pack([b[n] for n in stage.buffers], plan.buffer_widths)
        new_carry = plan.carry_flats[k].pack(jax.tree.leaves(out), plan.carry_widths)
        return _vary_tree(new_carry), _vary_tree(new_brow)
    return run


def _idle_branch(plan: _PipelinePlan) -> Callable:
    """A tick without a micro-batch (the bubble): a zero carry, buffers unchanged."""

    def idle(prow, brow, carry_in, m, kd):
        return _zeros(plan.carry_widths), _vary_tree(brow)
    return idle


def _zeros(widths: dict[str, int], lead: tuple[int, ...] = ()) -> dict[str, jax.Array]:
    """Zero vectors of ``widths`` (after dims ``lead``), varying over both mesh axes."""
    return {k: _vary(jnp.zeros((*lead, w), k), _AXES) for k, w in widths.items()}


def _vary(x: jax.Array, axes: tuple[str, ...]) -> jax.Array:
    """``x`` marked as varying over every axis in ``axes`` (shard_map's type system)."""
    missing = tuple(a for a in axes if a not in jax.typeof(x).manual_axis_type.varying)
    return jax.lax.pcast(x, missing, to="varying") if missing else x


def _vary_tree(tree: Any) -> Any:
    """Every leaf of ``tree`` marked as varying over both mesh axes."""
    return jax.tree.map(lambda x: _vary(x, _AXES), tree)


def _across_systems(x: jax.Array) -> jax.Array:
    """A stage's buffers after the step: floats averaged over systems, others kept."""
    if jnp.issubdtype(x.dtype, jnp.floating):
        return jax.lax.pmean(x, "csx")
    # Integer counters advance the same on every system; the max makes the value
    # invariant over "csx" (what out_specs need) without changing it.
    return jax.lax.pmax(x, "csx")


# ---- results ----------------------------------------------------------------------------
def _gather_outputs(plan: _PipelinePlan, outs: dict[str, jax.Array]) -> Any:
    """The model's outputs: ``[num_csx * M, width]`` per dtype to leaves of ``[batch, ...]``."""
    lead = (plan.num_csx * plan.inputs.count,)
    leaves = [x.reshape(plan.inputs.batch, *x.shape[2:])
              for x in plan.carry_flats[plan.last].unpack(outs, lead=lead)]
    return jax.tree.unflatten(plan.carry_defs[plan.last], leaves)


def _new_buffers(plan: _PipelinePlan, buffers: dict, new_rows: dict[str, jax.Array]) -> dict:
    """``buffers`` with each stage's buffers replaced by the ones in its row of ``new_rows``."""
    new_buffers = dict(buffers)
    for k, (flat, stage) in enumerate(zip(plan.buffer_flats, plan.stages)):
        row = {d: v[k] for d, v in new_rows.items()}
        new_buffers.update(zip(stage.buffers, flat.unpack(row)))
    return new_buffers
