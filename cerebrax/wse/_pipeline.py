"""Layer-pipelined execution: GPipe and circular schedules on the ``(csx, stage)`` mesh.

A model in pipeline mode describes itself as :class:`Layers`: an ordered list of
layers (a torch child module such as ``blocks.0``, one entry of a
``FunctionalModel(layers=...)``, one module of an ``nnx.Sequential``) and a way to run
any contiguous range of them. :func:`split_layers` cuts the list into contiguous
*virtual stages* of about equal cost (a layer is never cut). :func:`pipelined_apply`
then runs one model call as a pipeline schedule inside ``jax.shard_map``. With ``S``
stage devices, ``M`` micro-batches and ``V`` virtual stages per device
(``ClusterConfig.pipeline_schedule``):

- ``"gpipe"`` (``V = 1``): ``S`` virtual stages, device ``s`` runs stage ``s``;
- ``"circular"`` (``V = pipeline_repeats``, default 2; as MaxText's and praxis'
  circular pipelining): ``S * V`` virtual stages, device ``s`` runs stages
  ``s, s + S, ..., s + (V - 1) * S``, so every micro-batch goes round the ring of
  devices ``V`` times. ``M`` must be a multiple of ``S``.

Both are one schedule, in which micro-batch ``m`` runs its repeat ``v`` (virtual stage
``v * S + s``) on device ``s`` at tick

    t = (m mod S) + (m div S) * S * V + v * S + s,

for ``M * V + S - 1`` ticks (``V = 1``: ``t = m + s``, GPipe). Micro-batches go round the
ring in groups of ``S``: a group fills the ring for ``S * V`` ticks, then the next one
follows. Every device is idle ``S - 1`` ticks per step, the bubble
``(S - 1) / (M * V + S - 1)`` in units of one virtual stage's work (GPipe:
``(S - 1) / (M + S - 1)``). In detail:

- the batch is split over ``"csx"`` (each system gets ``B / num_csx`` rows) and, inside a
  system, into ``M`` micro-batches of ``micro_batch_size`` rows;
- between steps every parameter is stored split over ``"stage"`` (:mod:`._layout`).
  At the start of the call one ``all_to_all`` per dtype sends each shard to the device
  whose virtual stages read the parameter, which joins them and packs its stages'
  parameters per virtual stage into one flat vector per dtype (``[V, width]``);
- device ``s`` of the ``"stage"`` axis then holds only its virtual stages' parameters
  and at each tick runs one of them, chosen by ``jax.lax.switch`` on the stage it is due
  to run, or idles (the bubble);
- the values crossing a stage boundary (the carry: one or several arrays of any dtype)
  are packed into one padded flat buffer per dtype and move to the next device with
  ``jax.lax.ppermute`` (circular: device ``S - 1`` sends to device 0, which starts the
  micro-batch's next repeat one tick later);
- the last virtual stage's outputs are collected per micro-batch and summed over
  ``"stage"`` (only device ``S - 1`` contributes), giving the full batch back.

The loss is computed by the user's step on those outputs as usual. Differentiating the
step (the trace runtime's one ``jax.vjp``) transposes the schedule: the backward runs
the ticks in reverse, ``ppermute`` sends cotangents to the previous device, and the
gradient of a parameter used by two stages (a tied weight) is the sum of both, and the
transposed ``all_to_all`` returns each parameter's gradient split over ``"stage"`` as the
parameter is stored, where the optimizer update runs. Forward of all micro-batches, then
backward of all of them; each tick is rematerialized (``jax.checkpoint``), so the
backward keeps only the ticks' carries, not a stage's activations or unpacked
parameters per tick. Everything is part of the one
jitted step program. :func:`recording_schedule` makes the program also report which
virtual stage and micro-batch each device ran at each tick (tests, benchmarks).

Semantics that differ from one device (the same for both schedules):

- Each stage normalizes with the statistics of the micro-batch it sees (BatchNorm in
  train mode), and updates its buffers (running statistics) once per micro-batch, in
  micro-batch order. This equals calling the model on the micro-batches one after
  the other on one device. With ``num_csx > 1`` every system does so on its own rows;
  afterwards floating-point buffers are averaged over systems (integer buffers such as
  ``num_batches_tracked`` are the same on every system and kept).
- Random keys differ per micro-batch: micro-batch ``m`` of system ``c`` uses
  ``fold_in(key, c * M + m)``.

Per device, between steps: ``1 / S`` of every parameter and optimizer state leaf (the
optimizer sees them under their usual names, each split like the parameter), which for
stages balanced by parameter count is about the bytes of the device's own stages.
During the step: its own stages' parameters and their gradients, packed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from .._runtime import RUNTIME
from ..errors import ConfigError
from ._inputs import (
    _check_circular_micro_batches,
    _fold_key,
    _key_data,
    _MicroBatchedInputs,
)
from ._layout import Layout
from ._mesh import Wafer

__all__ = ["Layers", "Stage", "pipelined_apply", "recording_schedule", "split_layers"]

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
    """Runs one model call as the wafer's pipeline schedule (see the module docstring).

    Args:
      layers_for: ``layers_for(args, kwargs)`` gives the model's :class:`Layers` for
        inputs like one micro-batch's (array leaves as ``jax.ShapeDtypeStruct``).
      wafer: a pipeline :class:`Wafer` (mesh axes ``("csx", "stage")``); its
        ``schedule`` (``"gpipe"`` or ``"circular"``) and ``repeats`` choose the schedule.
      micro_batch_size: rows per micro-batch; None gives ``num_stages`` micro-batches.
      params, buffers: the model's state by name (arrays or tracers).
      args, kwargs: the model's inputs; every array leaf is split along dim 0.
      key: a PRNG key (typed or raw) or None.

    Returns:
      ``(outputs, new_buffers)`` like a ``ModelAdapter.apply``.
    """
    inputs = _MicroBatchedInputs.of(args, kwargs, wafer.mesh, micro_batch_size)
    if wafer.schedule == "circular":
        _check_circular_micro_batches(inputs, wafer.mesh, micro_batch_size)
    key_data, typed_key = _key_data(key)
    plan = _plan(layers_for, wafer, inputs, params, buffers, key_data, typed_key)
    packed_buffers = _pack_buffers(plan, buffers)
    stored = {n: params[n] for n in plan.param_specs}
    records = RUNTIME.schedule_records[-1] if RUNTIME.schedule_records else None
    outs, new_rows, ran = _run_schedule(plan, stored, packed_buffers, key_data,
                                        record=records is not None)
    if records is not None:
        # A host callback when the program runs: the schedule each device executed.
        jax.debug.callback(functools.partial(_append_record, records), ran)
    return _gather_outputs(plan, outs), _new_buffers(plan, buffers, new_rows)


# ---- recording what ran -----------------------------------------------------------------


@contextlib.contextmanager
def recording_schedule() -> Iterator[list[np.ndarray]]:
    """Pipelined calls traced inside report, each time they run, what every device ran.

    For tests and benchmarks; calls traced outside run without it. Yields a list to
    which every run of such a call appends an int32 array
    ``[num_csx, num_stages, ticks, 2]``: at tick ``t`` device ``(c, s)`` ran virtual
    stage ``[c, s, t, 0]`` on micro-batch ``[c, s, t, 1]``, or idled (both -1). The
    values come from the executed program: each branch of the schedule's switch
    reports its own stage.

    Example (``step`` traced and run inside)::

        with recording_schedule() as records:
            step(x, y)
        idle = (records[-1][..., 0] < 0).mean()
    """
    records: list[np.ndarray] = []
    RUNTIME.schedule_records.append(records)
    try:
        yield records
    finally:
        RUNTIME.schedule_records.remove(records)


def _append_record(records: list[np.ndarray], ran: Any) -> None:
    """The host side of the recording callback."""
    records.append(np.asarray(ran))


# ---- the plan: stages and the layouts of their state and carries ------------------------
@dataclasses.dataclass(frozen=True)
class _PipelinePlan:
    """Everything about one pipelined call that is fixed before its schedule is traced.

    Virtual stage ``k`` runs ``stages[k]`` on device ``k % num_stages`` (its chunk
    ``k // num_stages`` there). Its parameters, its buffers and the carry it sends to
    stage ``k + 1`` (the last stage: the model's outputs) are packed by
    ``param_flats[k]``, ``buffer_flats[k]`` and ``carry_flats[k]`` into one flat vector
    per dtype, of the width ``*_widths`` gives (the largest over all stages).
    """

    mesh: Mesh
    inputs: _MicroBatchedInputs
    typed_key: bool
    repeats: int  # V: virtual stages per device (GPipe: 1)
    stages: tuple[Stage, ...]
    carry_defs: tuple  # treedef of what stage k sends
    carry_flats: tuple[_Flat, ...]
    carry_widths: dict[str, int]
    param_flats: tuple[_Flat, ...]
    param_widths: dict[str, int]
    param_specs: dict[str, P]  # how each parameter is stored (split over "stage" or whole)
    shard_flats: tuple[_Flat, ...]  # stage k's split parameters: one device's shards
    shard_widths: dict[str, int]
    buffer_flats: tuple[_Flat, ...]
    buffer_widths: dict[str, int]

    @property
    def num_csx(self) -> int:
        """Systems the batch is split over (mesh axis ``"csx"``)."""
        return self.mesh.shape["csx"]

    @property
    def num_stages(self) -> int:
        """Pipeline stage devices (mesh axis ``"stage"``)."""
        return self.mesh.shape["stage"]

    @property
    def last(self) -> int:
        """The index of the last virtual stage (the one producing the outputs)."""
        return len(self.stages) - 1

    @property
    def ticks(self) -> int:
        """The schedule's length: ``M * V + S - 1``."""
        return self.inputs.count * self.repeats + self.num_stages - 1

    def received(self, k: int, flat: dict[str, jax.Array]) -> Any:
        """The carry stage ``k`` receives, unpacked from ``flat`` (None for stage 0)."""
        if k == 0:
            return None
        return jax.tree.unflatten(self.carry_defs[k - 1], self.carry_flats[k - 1].unpack(flat))


def _plan(layers_for: Callable[[tuple, dict], Layers], wafer: Wafer,
          inputs: _MicroBatchedInputs, params: dict, buffers: dict, key_data: Any,
          typed_key: bool) -> _PipelinePlan:
    """Splits the model into virtual stages and lays out their state and carries."""
    mesh, repeats = wafer.mesh, _repeats(wafer)
    abstract = inputs.abstract()
    layers = layers_for(*inputs.rebuild(abstract))
    ranges = _virtual_stage_ranges(layers, mesh.shape["stage"], repeats, wafer.schedule)
    stages = tuple(layers.stage(lo, hi) for lo, hi in ranges)
    carries = _probe_carries(mesh, stages, inputs, abstract, params, buffers, key_data,
                             typed_key)
    _check_outputs(jax.tree.leaves(carries[-1]), inputs.rows, inputs.batch)
    carry_flats = tuple(_Flat(jax.tree.leaves(c)) for c in carries)
    param_flats = tuple(_Flat([params[n] for n in s.params]) for s in stages)
    buffer_flats = tuple(_Flat([buffers[n] for n in s.buffers]) for s in stages)
    layout = Layout(wafer)
    specs = {n: layout.state_sharding(params[n]).spec for s in stages for n in s.params}
    shard_flats = tuple(_Flat([_shard_struct(params[n], specs[n], mesh) for n in s.params
                               if _split_dim(specs[n]) is not None]) for s in stages)
    return _PipelinePlan(
        mesh=mesh, inputs=inputs, typed_key=typed_key, repeats=repeats, stages=stages,
        carry_defs=tuple(jax.tree.structure(c) for c in carries),
        carry_flats=carry_flats, carry_widths=_widths(carry_flats),
        param_flats=param_flats, param_widths=_widths(param_flats), param_specs=specs,
        shard_flats=shard_flats, shard_widths=_widths(shard_flats),
        buffer_flats=buffer_flats, buffer_widths=_widths(buffer_flats),
    )


def _split_dim(spec: P) -> int | None:
    """The dimension a stored leaf is split along over ``"stage"`` (None: stored whole)."""
    spec = tuple(spec)
    return spec.index("stage") if "stage" in spec else None


def _shard_struct(x: Any, spec: P, mesh: Mesh) -> jax.ShapeDtypeStruct:
    """The shape of one device's shard of ``x`` stored under ``spec``."""
    d, shape = _split_dim(spec), list(x.shape)
    shape[d] //= mesh.shape["stage"]
    return jax.ShapeDtypeStruct(tuple(shape), x.dtype)


def _repeats(wafer: Wafer) -> int:
    """Virtual stages per device: ``pipeline_repeats`` (default 2) when circular, else 1."""
    if wafer.schedule != "circular":
        return 1
    return 2 if wafer.repeats is None else wafer.repeats


def _virtual_stage_ranges(layers: Layers, num_stages: int, repeats: int, schedule: str
                          ) -> list[tuple[int, int]]:
    """The layer range of each of the ``num_stages * repeats`` virtual stages (ConfigError)."""
    n = len(layers.costs)
    if schedule == "circular" and num_stages * repeats > n:
        shown = ", ".join(list(layers.names)[:12]) + (", ..." if n > 12 else "")
        fixes = ([f"set pipeline_repeats to at most {n // num_stages}"]
                 if n // num_stages >= 2 else [])
        fixes += [f"lower num_stages to {n // repeats}"] if n // repeats >= 2 else []
        raise ConfigError(
            f"ClusterConfig(num_stages={num_stages}, pipeline_schedule='circular', "
            f"pipeline_repeats={repeats}) cuts the model into num_stages x "
            f"pipeline_repeats = {num_stages * repeats} virtual stages, but it has only "
            f"{n} layers ({shown}), and a layer is never cut. Fix: "
            + ", or ".join(fixes + ["use pipeline_schedule='gpipe'",
                                    "give the model more (smaller) layers"]) + "."
        )
    return split_layers(layers.costs, num_stages * repeats, list(layers.names))


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
        pieces = {k: iter(_pieces(flat[k], tuple(size for d, _, size, _ in self.slots
                                                 if d == k)))
                  for k in self.sizes}
        return [next(pieces[k]).reshape(*lead, *shape) for k, _, _, shape in self.slots]


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _pieces(x: jax.Array, sizes: tuple[int, ...]) -> list[jax.Array]:
    """The consecutive pieces of ``sizes`` elements at the start of ``x``'s last axis.

    Its gradient is one concatenation of the pieces' cotangents (padded to ``x``'s
    width), not a padded copy of ``x`` per piece summed: a stage with many parameters
    would otherwise hold one vector of its whole width per parameter in the backward.
    """
    out, start = [], 0
    for size in sizes:
        out.append(jax.lax.slice_in_dim(x, start, start + size, axis=x.ndim - 1))
        start += size
    return out


def _pieces_fwd(x: jax.Array, sizes: tuple[int, ...]) -> tuple[list, jax.Array]:
    # The residual: a zero-size array of x's leading shape and width (the shape rides
    # along; no data is kept).
    return _pieces(x, sizes), jnp.zeros((*x.shape[:-1], 0, x.shape[-1]), x.dtype)


def _pieces_bwd(sizes: tuple[int, ...], shape_of: jax.Array, cts: list) -> tuple[jax.Array]:
    *lead, _, width = shape_of.shape
    parts = list(cts)
    if width > sum(sizes):
        parts.append(jnp.zeros((*lead, width - sum(sizes)), shape_of.dtype))
    return (jnp.concatenate(parts, axis=-1) if len(parts) > 1 else parts[0],)


_pieces.defvjp(_pieces_fwd, _pieces_bwd)


def _widths(flats: Sequence[_Flat]) -> dict[str, int]:
    """The width per dtype that holds every layout in ``flats`` (dtypes sorted, none empty)."""
    widths: dict[str, int] = {}
    for f in flats:
        for k, n in f.sizes.items():
            widths[k] = max(widths.get(k, 0), n)
    return {k: widths[k] for k in sorted(widths) if widths[k] > 0}


def _pack_buffers(plan: _PipelinePlan, buffers: dict) -> dict:
    """Buffers packed per device: ``{dtype: [num_stages, V, width]}``."""
    packed = _pack_per_stage(plan.buffer_flats, [s.buffers for s in plan.stages], buffers,
                             plan.buffer_widths)
    return _by_device(plan, packed)


def _pack_per_stage(flats: Sequence[_Flat], names: Sequence[Sequence[str]], values: dict,
                    widths: dict[str, int]) -> dict[str, jax.Array]:
    """Row ``k``: the ``values`` stage ``k`` names, packed by ``flats[k]``; rows stacked."""
    rows = [f.pack([values[n] for n in ns], widths) for f, ns in zip(flats, names)]
    return {k: jnp.stack([r[k] for r in rows]) for k in widths}


def _by_device(plan: _PipelinePlan, rows: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """``[S * V, width]`` rows by virtual stage as ``[S, V, width]``: row ``[s, v]`` is
    virtual stage ``v * S + s``, so device ``s`` gets its own chunks."""
    shape = (plan.repeats, plan.num_stages)
    return {k: x.reshape(*shape, x.shape[-1]).swapaxes(0, 1) for k, x in rows.items()}


# ---- the schedule -----------------------------------------------------------------------
_AXES = ("csx", "stage")


def _run_schedule(plan: _PipelinePlan, params: dict, packed_buffers: dict,
                  key_data: Any, *, record: bool = False) -> tuple[dict, dict, Any]:
    """Runs the schedule on the mesh; ``params`` as stored (``plan.param_specs``).

    Returns:
      ``({dtype: [num_csx * M, width]}, new buffer rows, ran)``; ``ran`` is None, or
      with ``record`` the ``[num_csx, num_stages, ticks, 2]`` array of
      :func:`recording_schedule`.
    """
    dyn = plan.inputs.arrays()
    in_specs = (
        dict(plan.param_specs),
        {k: P("stage") for k in packed_buffers},
        [P("csx") for _ in dyn],
        None if key_data is None else P(),
    )
    out_specs = ({k: P("csx") for k in plan.carry_widths},
                 {k: P("stage") for k in packed_buffers},
                 P() if record else None)
    run = jax.shard_map(functools.partial(_schedule, plan, record=record), mesh=plan.mesh,
                        in_specs=in_specs, out_specs=out_specs)
    return run(params, packed_buffers, dyn, key_data)


def _schedule(plan: _PipelinePlan, params: dict, brows: dict, dyn: list, kd: Any, *,
              record: bool) -> tuple[dict, dict, Any]:
    """One device's program: all ticks of its stages, then outputs and buffers reduced."""
    # Everything a stage reads is marked varying over both axes once, before the
    # schedule: every value in a stage then has one type (custom_vjp rules in the
    # lowerings need that), and the transposed cast sums a parameter's gradient
    # over "csx" once per step, not once per tick.
    per_micro = [_vary(x.reshape(plan.inputs.count, plan.inputs.rows, *x.shape[1:]), _AXES)
                 for x in dyn]
    branches = ([_stage_branch(plan, k, per_micro) for k in range(len(plan.stages))]
                + [_idle_branch(plan)])
    s = jax.lax.axis_index("stage")
    # This device's chunks: [V, width] per dtype, row v for virtual stage v * S + s.
    prow = {k: _vary(v, _AXES) for k, v in _own_stages(plan, params, s).items()}
    brow0 = {k: _vary(v[0], _AXES) for k, v in brows.items()}
    state0 = (_zeros(plan.carry_widths), brow0,
              _zeros(plan.carry_widths, (plan.inputs.count,)))
    tick = jax.checkpoint(_tick(plan, branches, s, prow, kd, record=record))
    (_, brow, outs), ran = jax.lax.scan(tick, state0, jnp.arange(plan.ticks))
    outs = {k: jax.lax.psum(v, "stage") for k, v in outs.items()}
    brow = {k: _across_systems(v) for k, v in brow.items()}
    return outs, {k: v[None] for k, v in brow.items()}, None if ran is None else _everywhere(ran)


def _tick(plan: _PipelinePlan, branches: list[Callable], s: jax.Array, prow: dict, kd: Any,
          *, record: bool) -> Callable:
    """The scan step: device ``s`` runs what :func:`_slot` says (or idles), the last
    virtual stage keeps its outputs, and every carry moves to the next device.

    With ``record`` the step also returns ``[virtual stage, micro-batch]`` as the
    branch that ran reports them (``[-1, -1]``: idle)."""
    perm = _ring(plan)

    def tick(state, t):
        carry_in, brow, outs = state
        index, m = _slot(plan, t, s)
        carry_out, brow, ran = jax.lax.switch(index, branches, prow, brow, carry_in, m, kd)
        outs = _keep_outputs(outs, carry_out, m, index == plan.last)
        if perm:
            carry_out = {k: jax.lax.ppermute(v, "stage", perm) for k, v in carry_out.items()}
        ys = _vary(jnp.stack([ran, jnp.where(ran < 0, -1, m)]), _AXES) if record else None
        return (carry_out, brow, outs), ys
    return tick


def _slot(plan: _PipelinePlan, t: jax.Array, s: jax.Array) -> tuple[jax.Array, jax.Array]:
    """What device ``s`` runs at tick ``t``: ``(branch index, micro-batch)``.

    Inverts ``t = (m mod S) + (m div S) * S * V + v * S + s``: the branch is virtual
    stage ``v * S + s``, or ``S * V`` (the idle branch) where no micro-batch is due;
    the micro-batch is clipped into range. With ``V = 1``, ``m = t - s`` (GPipe).
    """
    num_stages, count = plan.num_stages, plan.inputs.count
    round_trip = num_stages * plan.repeats
    u = t - s
    group, pos = u // round_trip, u % round_trip  # floor division: u < 0 stays < 0
    m = group * num_stages + pos % num_stages
    valid = (u >= 0) & (m < count)
    index = jnp.where(valid, pos - pos % num_stages + s, round_trip)
    return index, jnp.clip(m, 0, count - 1)


def _everywhere(ran: jax.Array) -> jax.Array:
    """Every device's ``[ticks, 2]`` record, on every device:
    ``[num_csx, num_stages, ticks, 2]``."""
    shape = (jax.lax.axis_size("csx"), jax.lax.axis_size("stage"), *ran.shape)
    mine = jnp.zeros(shape, ran.dtype).at[
        jax.lax.axis_index("csx"), jax.lax.axis_index("stage")].set(ran)
    return jax.lax.psum(mine, _AXES)  # each entry is written by one device only


def _ring(plan: _PipelinePlan) -> list[tuple[int, int]]:
    """The ``ppermute`` pairs that move carries on: device ``s`` to ``s + 1``, and, where
    micro-batches go round more than once, the last device back to the first."""
    n = plan.num_stages
    if n == 1:
        return []  # every virtual stage is on the one device: the carry stays
    return [(i, (i + 1) % n) for i in range(n if plan.repeats > 1 else n - 1)]


def _keep_outputs(outs: dict, carry_out: dict, m: jax.Array, keep: jax.Array) -> dict:
    """``outs`` with row ``m`` set to ``carry_out`` where ``keep`` (and left as it is elsewhere)."""
    return {k: jax.lax.dynamic_update_index_in_dim(v, jnp.where(keep, carry_out[k], v[m]), m, 0)
            for k, v in outs.items()}


def _stage_branch(plan: _PipelinePlan, k: int, per_micro: list) -> Callable:
    """Virtual stage ``k``'s tick: runs micro-batch ``m`` with its device's chunk
    ``k // S`` of the parameters and buffers; returns its packed carry, the buffers and
    ``k``."""
    stage = plan.stages[k]
    chunk = k // plan.num_stages
    buffer_flat = plan.buffer_flats[k]

    def run(prow, brow, carry_in, m, kd):
        c_index = jax.lax.axis_index("csx") * plan.inputs.count + m
        p = dict(zip(stage.params, plan.param_flats[k].unpack(_row(prow, chunk))))
        b = dict(zip(stage.buffers, buffer_flat.unpack(_row(brow, chunk))))
        c = plan.received(k, carry_in)
        dyn = [jax.lax.dynamic_index_in_dim(x, m, keepdims=False) for x in per_micro]
        a, kw = plan.inputs.rebuild(dyn)
        out, updates = stage.fn(p, b, c, a, kw, _fold_key(kd, plan.typed_key, c_index))
        b.update(updates)
        new_row = buffer_flat.pack([b[n] for n in stage.buffers], plan.buffer_widths)
        new_brow = {d: v.at[chunk].set(new_row[d]) for d, v in brow.items()}
        new_carry = plan.carry_flats[k].pack(jax.tree.leaves(out), plan.carry_widths)
        return _vary_tree(new_carry), _vary_tree(new_brow), jnp.int32(k)
    return run


def _idle_branch(plan: _PipelinePlan) -> Callable:
    """A tick without a micro-batch (the bubble): a zero carry, buffers unchanged, -1."""

    def idle(prow, brow, carry_in, m, kd):
        return _zeros(plan.carry_widths), _vary_tree(brow), jnp.int32(-1)
    return idle


def _own_stages(plan: _PipelinePlan, params: dict, s: jax.Array) -> dict[str, jax.Array]:
    """Device ``s``'s parameters packed per virtual stage: ``{dtype: [V, width]}``.

    A parameter stored split over ``"stage"`` arrives as this device's shard. One
    all-to-all per dtype sends each shard to the device whose stages read the
    parameter (each device receives, from every device, the shards of its own stages'
    parameters), where the shards are joined. A parameter stored whole (too small to
    split) is on every device already. In the backward pass the transposed all-to-all
    returns each shard's gradient to the device that stores the shard.
    """
    num, received = plan.num_stages, {}
    if plan.shard_widths:
        rows = [flat.pack([params[n] for n in _split_names(plan, stage)], plan.shard_widths)
                for flat, stage in zip(plan.shard_flats, plan.stages)]
        for d in plan.shard_widths:  # [S, V, width]: row [o, v] is stage v * S + o's
            send = jnp.stack([r[d] for r in rows]).reshape(plan.repeats, num, -1)
            received[d] = jax.lax.all_to_all(send.swapaxes(0, 1), "stage", 0, 0, tiled=True)
    whole = {n: v for n, v in params.items() if _split_dim(plan.param_specs[n]) is None}
    # Marked varying here, before the switch on the device's stage index: the backward
    # pass transposes the cast into a psum over the mesh, which every device must run.
    # Inside a branch, devices that took different branches would wait forever on
    # each other's different collectives (a parameter stored whole: a 0-dim gate).
    received, whole = _vary_tree(received), _vary_tree(whole)
    branches = [functools.partial(_join_stages, plan, o) for o in range(num)]
    return jax.lax.switch(s, branches, received, whole)


def _split_names(plan: _PipelinePlan, stage: Stage) -> list[str]:
    """The parameters of ``stage`` that are stored split over ``"stage"``."""
    return [n for n in stage.params if _split_dim(plan.param_specs[n]) is not None]


def _join_stages(plan: _PipelinePlan, o: int, received: dict, whole: dict) -> dict:
    """Device ``o``'s packed rows, from the shards it received (``[S, V, width]``: row
    ``[i, v]`` from device ``i``) and the parameters stored whole."""
    rows = []
    for v in range(plan.repeats):
        k = v * plan.num_stages + o
        stage = plan.stages[k]
        split = _split_names(plan, stage)
        shards = plan.shard_flats[k].unpack({d: x[:, v] for d, x in received.items()},
                                            lead=(plan.num_stages,))
        joined = {n: _joined(x, _split_dim(plan.param_specs[n])) for n, x in zip(split, shards)}
        values = [joined[n] if n in joined else whole[n] for n in stage.params]
        rows.append(plan.param_flats[k].pack(values, plan.param_widths))
    return {d: _vary(jnp.stack([r[d] for r in rows]), _AXES) for d in plan.param_widths}


def _joined(shards: jax.Array, dim: int) -> jax.Array:
    """The whole array from its ``[S, *shard]`` shards, split along ``dim`` in order."""
    shape = list(shards.shape[1:])
    shape[dim] *= shards.shape[0]
    return jnp.moveaxis(shards, 0, dim).reshape(shape)


def _row(rows: dict[str, jax.Array], i: int) -> dict[str, jax.Array]:
    """Row ``i`` of each ``[V, width]`` array: one virtual stage's packed vectors."""
    return {k: v[i] for k, v in rows.items()}


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
    """``buffers`` with each virtual stage's buffers replaced by its row of ``new_rows``
    (``[S, V, width]``, row ``[k % S, k // S]``)."""
    new_buffers = dict(buffers)
    for k, (flat, stage) in enumerate(zip(plan.buffer_flats, plan.stages)):
        row = {d: v[k % plan.num_stages, k // plan.num_stages] for d, v in new_rows.items()}
        new_buffers.update(zip(stage.buffers, flat.unpack(row)))
    return new_buffers
