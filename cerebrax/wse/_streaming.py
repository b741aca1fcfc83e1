"""Weight streaming: every layer's weights gathered just in time, the batch over all devices.

In ``execution_mode="weight_streaming"`` parameters and optimizer state live split over
the ``"wgt"`` axis between steps (:class:`~._layout.Layout`), and the optimizer update
runs on those shards. :func:`streamed_apply` runs one model call inside
``jax.shard_map`` on the ``("csx", "wgt")`` mesh, data-parallel over every device and
with the weights sharded (ZeRO-3 / FSDP):

- the batch is split over all ``num_csx x max_wgt_servers`` devices;
- the model runs layer by layer (its :class:`~._pipeline.Layers`, as pipeline mode gets
  them); just before a layer runs, its parameters' shards are gathered over ``"wgt"``
  with ``jax.lax.all_gather`` (the weights stream in), and the whole layer is
  rematerialized in the backward pass, so the gathered weights are not kept from the
  forward to the backward pass: they are gathered again there;
- the transpose of ``all_gather`` is ``psum_scatter``: each layer's gradient is
  reduce-scattered back to the shards (and summed over ``"csx"``), so no device ever
  holds more than one layer's full gradient;
- consecutive layers with equal structural keys (``Layers.signature``: the blocks of a
  torch ``nn.ModuleList`` of identical blocks, equal ``FunctionalModel`` layers) run as
  one ``jax.lax.scan``, so the program does not grow with depth. The scan reads layer
  ``i``'s shards with ``jax.lax.switch`` (no stacked copy of the parameters) and has
  its own VJP (:func:`_scan_layers`): the backward scan gathers each layer's weights
  again, recomputes the layer from its saved input and writes the layer's gradient
  shard into a ``[layers, ...]`` output that the optimizer reads slice by slice.

Per device, a step holds the shards of the parameters, their gradients and the
optimizer state, at most about two layers' full weights (gathered weights and
full-size gradients before the reduce-scatter), each layer's input (the carry) for the
backward pass, and one layer's activations. The scan's gradient output holds every
scanned layer's gradient shard until the optimizer update; unrolled layers let XLA
apply each parameter's update as soon as its gradient exists, which saves that much
memory at the price of a program that grows with depth.

The call falls back to the sharded layout (one global-view call, XLA's SPMD partitioner
places it: what :func:`~._run.run_model` does otherwise) where this plan does not
apply: the model gives no layers, an input is not a batch that splits over all
devices, an output is not per-example, or a layer updates its buffers (BatchNorm in
train mode would normalize over each device's rows instead of the whole batch).

Semantics that differ from one device: a model that couples the rows of a batch
without buffers (e.g. BatchNorm without running statistics) sees each device's rows
only, and random ops draw on each device from ``fold_in(key, device)`` (per layer
``fold_in(.., layer index)``), so dropout masks differ from a one-device run.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from .._tree import combine, partition
from ..errors import ConfigError
from ._inputs import RowSplit, _fold_key, _key_data, split_inputs
from ._pipeline import Layers, Stage, _vary

__all__ = ["streamed_apply"]


class _NotStreamable(Exception):
    """Raised while tracing when the model does not fit the plan (the call falls back)."""


def streamed_apply(layers_for: Callable[[tuple, dict], Layers], layout: Any,
                   params: dict, buffers: dict, args: tuple, kwargs: dict, *,
                   key: Any = None) -> tuple[Any, dict] | None:
    """Runs one model call with streamed weights (see the module docstring).

    Args:
      layers_for: ``layers_for(args, kwargs)`` gives the model's :class:`Layers` for
        inputs like one device's rows (array leaves as ``jax.ShapeDtypeStruct``); it
        raises :class:`ConfigError` for a model without layers.
      layout: the weight-streaming :class:`~._layout.Layout` (mesh ``("csx", "wgt")``).
      params, buffers: the model's state by name, laid out as ``layout`` says.
      args, kwargs: the model's inputs; every array leaf is split along dim 0.
      key: a PRNG key (typed or raw) or None.

    Returns:
      ``(outputs, buffers)`` like a ``ModelAdapter.apply``, or None where the plan does
      not apply (the caller then runs the model as one global-view call).
    """
    inputs = _row_split(args, kwargs, layout.wafer.size)
    if inputs is None:
        return None
    try:
        layers = layers_for(*inputs.rebuild(inputs.abstract()))
    except ConfigError:
        return None  # no layers: the sharded layout runs the model
    plan = _Plan.of(layers, layout, params, buffers, inputs, key)
    try:
        outputs = plan.run(params, buffers, key)
    except _NotStreamable:
        return None
    return outputs, dict(buffers)


# ---- the inputs: rows per device ----------------------------------------------------------
def _row_split(args: tuple, kwargs: dict, devices: int) -> RowSplit | None:
    """The inputs split per device; None where they have no common batch that
    ``devices`` divides."""
    split, skeleton = split_inputs(args, kwargs)
    dims = {x.shape[0] if x.shape else None for x in split}
    if len(dims) != 1 or None in dims:
        return None
    batch = dims.pop()
    if batch % devices:
        return None
    return RowSplit(tuple(split), skeleton, batch // devices)


# ---- the plan: groups of layers, gathering ------------------------------------------------
@dataclasses.dataclass(frozen=True)
class _Group:
    """Layers ``lo..hi-1``: one scan (``stages[0]`` is the body) or unrolled stages.

    ``project``: positions of the body's carry out that the scan hands on (the last
    layer of the scan sends only those), or None for all of it.
    """

    lo: int
    hi: int
    stages: tuple[Stage, ...]
    scan: bool
    project: tuple[int, ...] | None = None


@dataclasses.dataclass(frozen=True)
class _Plan:
    layout: Any
    inputs: RowSplit
    groups: tuple[_Group, ...]
    specs: dict[str, P]  # each state leaf's PartitionSpec (its shard inside shard_map)
    typed_key: bool

    @classmethod
    def of(cls, layers: Layers, layout: Any, params: dict, buffers: dict,
           inputs: RowSplit, key: Any) -> _Plan:
        stages = [layers.stage(i, i + 1) for i in range(len(layers.names))]
        keys = ([layers.signature(i) for i in range(len(stages))]
                if layers.signature is not None else [None] * len(stages))
        specs = {n: layout.state_sharding(v).spec for n, v in {**params, **buffers}.items()}
        groups = _groups(stages, keys, layers.projection)
        return cls(layout, inputs, groups, specs, _key_data(key)[1])

    @property
    def mesh(self) -> Any:
        return self.layout.mesh

    @property
    def axes(self) -> tuple[str, ...]:
        """The mesh axes the rows split over: those of more than one device (an axis of
        one device would only add trivial collectives)."""
        return tuple(a for a in ("csx", "wgt") if self.mesh.shape[a] > 1)

    def run(self, params: dict, buffers: dict, key: Any) -> Any:
        key_data = _key_data(key)[0]
        in_specs = ({n: self.specs[n] for n in params}, {n: self.specs[n] for n in buffers},
                    [P(self.axes)] * len(self.inputs.split),
                    None if key_data is None else P())
        body = jax.shard_map(self._body, mesh=self.mesh, in_specs=in_specs,
                             out_specs=P(self.axes))
        return body(params, buffers, self.inputs.arrays(), key_data)

    # -- one device's program --
    def _body(self, params: dict, buffers: dict, dyn: list, kd: Any) -> Any:
        # Every value a layer reads varies over the data axes (one type for the
        # lowerings' custom_vjp rules); with two or more systems the transposed cast sums
        # each parameter shard's gradient over "csx", after its reduce-scatter over "wgt".
        params = {n: _vary(v, self.axes) for n, v in params.items()}
        buffers = {n: _vary(v, self.axes) for n, v in buffers.items()}
        if kd is not None:  # each device draws its own numbers for its rows
            device = 0
            for axis in self.axes:
                device = device * self.mesh.shape[axis] + jax.lax.axis_index(axis)
            kd = _vary(_key_data(_fold_key(kd, self.typed_key, device))[0], self.axes)
        carry = None
        for group in self.groups:
            if group.scan:
                carry = self._scan(group, params, buffers, carry, dyn, kd)
            else:
                for i, stage in enumerate(group.stages, start=group.lo):
                    carry = self._unrolled(i, stage, params, buffers, carry, dyn, kd)
        for leaf in jax.tree.leaves(carry):
            if not hasattr(leaf, "shape") or not leaf.shape or leaf.shape[0] != self.inputs.rows:
                raise _NotStreamable("an output is not per-example")
        return carry

    def _layer_fn(self, i_base: Any, stage: Stage) -> Callable:
        """``fn(index, p_shards, b_shards, carry, (dyn, kd)) -> carry`` for ``stage``'s
        layer; ``index`` is added to ``i_base`` for the layer's key."""

        def fn(index, ps, bs, carry, consts):
            dyn, kd = consts
            p = {n: self.gather(n, v) for n, v in zip(stage.params, ps)}
            b = {n: self.gather(n, v) for n, v in zip(stage.buffers, bs)}
            a, kw = self.inputs.rebuild(dyn)
            key = _fold_key(kd, self.typed_key, i_base + index)
            out, updates = stage.fn(p, b, carry, a, kw, key)
            if any(v is not b.get(n) for n, v in updates.items()):
                raise _NotStreamable("a layer updates its buffers")
            return out
        return fn

    def _unrolled(self, i: int, stage: Stage, params: dict, buffers: dict, carry: Any,
                  dyn: list, kd: Any) -> Any:
        ps = tuple(params[n] for n in stage.params)
        bs = tuple(buffers[n] for n in stage.buffers)
        return _scan_layers(self._layer_fn(i, stage), (ps,), (bs,), carry, (dyn, kd))

    def _scan(self, group: _Group, params: dict, buffers: dict, carry: Any, dyn: list,
              kd: Any) -> Any:
        body = group.stages[0]
        ps = tuple(tuple(params[n] for n in s.params) for s in group.stages)
        bs = tuple(tuple(buffers[n] for n in s.buffers) for s in group.stages)
        if not self._scannable(body, params, buffers, carry, dyn, kd):
            for i, stage in enumerate(group.stages, start=group.lo):
                carry = self._unrolled(i, stage, params, buffers, carry, dyn, kd)
            return carry
        carry = _scan_layers(self._layer_fn(group.lo, body), ps, bs, carry, (dyn, kd))
        return carry if group.project is None else tuple(carry[k] for k in group.project)

    def _scannable(self, stage: Stage, params: dict, buffers: dict, carry: Any, dyn: list,
                   kd: Any) -> bool:
        """Whether ``stage`` maps a carry like ``carry`` to one like it (shapes, dtypes)."""
        if carry is None or any(not jnp.issubdtype(params[n].dtype, jnp.inexact)
                                for n in stage.params):
            return False

        def full(n: str, v: Any) -> jax.ShapeDtypeStruct:  # v: this device's shard
            return jax.ShapeDtypeStruct(_gathered_shape(v.shape, self.specs[n],
                                                        self.mesh.shape["wgt"]), v.dtype)

        def probe(p, b, c, d, k):
            a, kw = self.inputs.rebuild(d)
            return stage.fn(p, b, c, a, kw, _fold_key(k, self.typed_key, 0))[0]

        spec = jax.eval_shape(
            probe, {n: full(n, params[n]) for n in stage.params},
            {n: full(n, buffers[n]) for n in stage.buffers}, _abstract(carry), _abstract(dyn),
            _abstract(kd))
        return jax.tree.structure(spec) == jax.tree.structure(carry) and all(
            (a.shape, a.dtype) == (b.shape, b.dtype)
            for a, b in zip(jax.tree.leaves(spec), jax.tree.leaves(carry)))

    def gather(self, name: str, shard: jax.Array) -> jax.Array:
        """The whole value of a state leaf from this device's shard (all-gather over "wgt")."""
        spec = tuple(self.specs[name])
        if "wgt" not in spec or self.mesh.shape["wgt"] == 1:
            return shard
        return jax.lax.all_gather(shard, "wgt", axis=spec.index("wgt"), tiled=True)


def _groups(stages: Sequence[Stage], keys: Sequence[Any],
            projection: Callable[[int, int], tuple[int, ...] | None] | None
            ) -> tuple[_Group, ...]:
    """Consecutive layers with equal non-None keys (and a last one that sends part of
    their carry on, per ``projection``) form a scan group; the others run unrolled."""
    groups: list[_Group] = []
    lo, n = 0, len(stages)
    while lo < n:
        hi = lo + 1
        while hi < n and keys[lo] is not None and keys[hi] == keys[lo]:
            hi += 1
        project = None
        if keys[lo] is not None and hi < n and projection is not None:
            project = projection(lo, hi)
            hi += project is not None
        if hi - lo > 1:
            groups.append(_Group(lo, hi, tuple(stages[lo:hi]), True, project))
        elif groups and not groups[-1].scan:
            prev = groups.pop()
            groups.append(_Group(prev.lo, hi, (*prev.stages, stages[lo]), False))
        else:
            groups.append(_Group(lo, hi, (stages[lo],), False))
        lo = hi
    return tuple(groups)


def _gathered_shape(shape: tuple[int, ...], spec: P, servers: int) -> tuple[int, ...]:
    spec = tuple(spec)
    if "wgt" not in spec:
        return tuple(shape)
    d = spec.index("wgt")
    return (*shape[:d], shape[d] * servers, *shape[d + 1:])


def _abstract(tree: Any) -> Any:
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)


# ---- layers with their own VJP: a scan over identical layers, or one layer ---------------
def _pick(stack: tuple[tuple, ...], i: Any) -> tuple:
    """``stack[i]`` for a traced ``i``, without stacking (a copy) of ``stack``."""
    if len(stack) == 1 or not stack[0]:
        return stack[0]
    return jax.lax.switch(i, [functools.partial(lambda s: s, s) for s in stack])


def _after(values: tuple, tree: Any) -> tuple:
    """``values`` unchanged, computed after ``tree``: ``x - 0 * (values of tree)``.

    XLA on CPU drops ``jax.checkpoint``'s optimization barriers and would merge a
    layer's gathers in the forward and the backward pass into one (its full weights
    then stay alive in between), and may gather early. A gather of ``after(shard,
    the layer's input)`` in the forward and of ``after(shard, the incoming
    cotangent)`` in the backward is neither: XLA does not fold ``0 * x`` for floats
    (NaN), so each gather waits for its data. One element of every leaf takes part
    (one leaf may be a constant XLA folds, e.g. a causal mask). Subtracting 0 keeps
    -0.0.
    """
    leaves = [jnp.ravel(x)[0].astype(jnp.float32) for x in jax.tree.leaves(tree) if x.size]
    if not leaves:
        return values
    zero = sum(leaves[1:], leaves[0]) * 0
    return tuple(x - zero.astype(x.dtype) if _is_float(x) else x for x in values)


def _is_float(x: Any) -> bool:
    return jnp.issubdtype(x.dtype, jnp.inexact)


def _loop(step: Callable, init: Any, n: int, xs: Any = None, *, reverse: bool = False
          ) -> tuple[Any, Any]:
    """``jax.lax.scan`` of ``step(state, (i, x))`` over ``i < n``; one call for one layer."""
    if n == 1:
        return step(init, (0, xs))
    return jax.lax.scan(step, init, (jnp.arange(n), xs), reverse=reverse)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _scan_layers(layer: Callable, params: tuple, buffers: tuple, carry: Any, consts: Any
                 ) -> Any:
    """``carry`` through ``layer(i, params[i], buffers[i], carry, consts)`` for every ``i``.

    Its VJP keeps only each layer's input carry. The backward runs the layers in
    reverse: recomputes layer ``i`` under ``jax.vjp`` (gathering its weights again),
    sends the carry's cotangent on, adds up the constants' cotangents, and emits
    layer ``i``'s parameter cotangents (shards; one ``[layers, ...]`` scan output per
    parameter for a scan).
    """
    return _scan_fwd(layer, params, buffers, carry, consts)[0]


def _scan_fwd(layer, params, buffers, carry, consts):
    n = len(params)

    def step(c, xs):
        i, _ = xs
        out = layer(i, _after(_pick(params, i), c), _after(_pick(buffers, i), c), c, consts)
        outs, ins = jax.tree.leaves(out), jax.tree.leaves(c)
        # The first carry is a residual already; in a scan, a value handed on unchanged
        # (an attention mask) is the first carry's too: neither is saved again.
        same = [n == 1 or (j < len(outs) and outs[j] is x) for j, x in enumerate(ins)]
        return out, [None if s else x for x, s in zip(ins, same)]

    out, saved = _loop(step, carry, n)
    return out, (params, buffers, carry, saved, consts)


def _scan_bwd(layer, res, ct):
    params, buffers, carry0, saved, consts = res
    c0, cdef = jax.tree.flatten(carry0)
    kf0, k_skeleton = partition(consts, _float_leaf)

    def step(state, xs):
        ct_c, ct_k = state
        i, sv = xs
        carry = jax.tree.unflatten(cdef, [c if s is None else s for c, s in zip(c0, sv)])
        cf, c_skeleton = partition(carry, _float_leaf)
        b = _after(_pick(buffers, i), ct_c)

        def f(p, cf, kf):
            out = layer(i, p, b, combine(cf, c_skeleton), combine(kf, k_skeleton))
            return [x for x, m in zip(jax.tree.leaves(out), omask) if m]

        _, vjp = jax.vjp(f, _after(_pick(params, i), ct_c), cf, kf0)
        g_p, g_c, g_k = vjp(ct_c)
        return (g_c, [a + g for a, g in zip(ct_k, g_k)]), g_p

    n = len(params)
    # The layers' output: the next carry (a scan's carry has one structure throughout).
    omask = [x.dtype != jax.dtypes.float0 for x in jax.tree.leaves(ct)]
    ct_floats = [x for x, m in zip(jax.tree.leaves(ct), omask) if m]
    zeros_k = [_zeros_like(x) for x in kf0]
    (g_c, g_k), g_p = _loop(step, (ct_floats, zeros_k), n, saved, reverse=True)
    g_params = (g_p,) if n == 1 else tuple(tuple(g[k] for g in g_p) for k in range(n))
    g_buffers = jax.tree.map(_zero_cotangent, buffers)
    # The other leaves' cotangents are float0 zeros.
    g_carry = combine(g_c, partition(jax.tree.map(_zero_cotangent, carry0), _float_leaf)[1])
    g_consts = combine(g_k, partition(jax.tree.map(_zero_cotangent, consts), _float_leaf)[1])
    return g_params, g_buffers, g_carry, g_consts


def _float_leaf(x: Any) -> tuple[Any, None] | None:
    """What the backward pass differentiates: the floating-point leaves."""
    return (x, None) if _is_float(x) else None


def _zeros_like(x: jax.Array) -> jax.Array:
    """Zeros of ``x``'s shape, dtype and shard_map type (the axes it varies over)."""
    return _vary(jnp.zeros_like(x), tuple(jax.typeof(x).manual_axis_type.varying))


def _zero_cotangent(x: Any) -> Any:
    if _is_float(x):
        return _zeros_like(x)
    return np.zeros(x.shape, jax.dtypes.float0)


_scan_layers.defvjp(_scan_fwd, _scan_bwd)
