"""``convert(module)``: a torch ``nn.Module`` as named JAX state and a pure function."""

from __future__ import annotations

import contextlib
import functools
import inspect
import sys
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
import torch
import torch.utils._pytree as pytree

from cerebrax._filters import is_array
from cerebrax._tree import combine, partition_leaves

from . import ops as _ops  # noqa: F401  (registers the built-in lowerings)
from .ops._dtypes import export_dtype, jax_dtype, to_jax
from . import _direct, _export_cache
from ._program import Program
from ._tensor import DirectRefused, JaxTensor

__all__ = ["Converted", "call_defaults", "convert", "random_seed"]


def _named_state(
    named: list[tuple[str, torch.Tensor]],
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Tensors by their first name, and every name -> that first name (tied tensors)."""
    first: dict[int, str] = {}
    tensors: dict[str, torch.Tensor] = {}
    canonical: dict[str, str] = {}
    for name, t in named:
        owner = first.setdefault(id(t), name)
        canonical[name] = owner
        if owner == name:
            tensors[name] = t
    return tensors, canonical


# Array inputs of a call: jax, numpy and torch arrays, and anything with shape and dtype.
_is_input_array = functools.partial(is_array, torch=True, like=True)


def _leaf_signature(x: Any) -> Any:
    if _is_input_array(x):
        if isinstance(x, torch.Tensor):
            dtype = jax_dtype(x.dtype)
        else:
            dtype = jax.dtypes.canonicalize_dtype(x.dtype)
        return ("array", tuple(int(d) for d in x.shape), str(np.dtype(dtype)))
    try:
        hash(x)
    except TypeError:
        return ("value", type(x).__name__, repr(x))
    return ("value", type(x).__name__, x)


def call_defaults(module: torch.nn.Module) -> dict[str, Any]:
    """Keyword inputs the bridge passes to ``module`` when its caller leaves them out.

    A transformers ``PreTrainedModel`` whose forward takes ``use_cache`` defaults it to
    True and then returns a ``DynamicCache``, which a static graph can neither export nor
    use (the graph is exported again for every input shape): the bridge calls it with
    ``use_cache=False`` unless the call passes ``use_cache`` itself.
    """
    transformers = sys.modules.get("transformers")
    pretrained = getattr(transformers, "PreTrainedModel", None)
    if pretrained is None or not isinstance(module, pretrained):
        return {}
    if "use_cache" not in inspect.signature(module.forward).parameters:
        return {}
    return {"use_cache": False}


def random_seed() -> jax.Array:
    """A ``jax.random`` key from torch's seed (``torch.manual_seed``), without drawing
    from torch's generator."""
    seed = torch.initial_seed()  # up to 64 bits; a key holds 32 bits per fold
    return _seeded_key(seed & 0xFFFFFFFF, seed >> 32)


def _autocast_state() -> tuple:
    """The CPU autocast setting a call is exported under (its casts are in the graph,
    so a call inside ``torch.autocast`` and one outside are two graphs)."""
    if not torch.is_autocast_enabled("cpu"):
        return ()
    return ("cpu", torch.get_autocast_dtype("cpu"))


@functools.partial(jax.jit, static_argnums=(0, 1))
def _seeded_key(low: int, high: int) -> jax.Array:
    # One program (eagerly, each of the four operations would compile one).
    return jax.random.fold_in(jax.random.key(low), high)


@contextlib.contextmanager
def _cpu_stand_ins(module: torch.nn.Module):
    """While the block runs, ``module``'s tensors on torch's meta device (built there,
    or whose storage a compiled state took over) and the JaxTensors that stand for its
    parameters while a step is traced are fake tensors with no storage that report the
    CPU, as the module's tensors did when it was built.

    The export then sees what torch eager sees: ``x.device`` is the CPU in ``forward``,
    so a tensor that ``forward`` makes itself (``torch.tensor(0.125, device=x.device)``)
    holds its value, and layers that compare devices agree. Only shapes and dtypes are
    read from the module's tensors during an export.
    """
    named = _direct.state_slots(module)
    if not any(t.is_meta or isinstance(t, JaxTensor) for _, t in named):
        yield
        return
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.nn.utils import stateless

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    made: dict[int, torch.Tensor] = {}  # tied tensors get one stand-in
    stand_ins = {}
    for name, t in named:
        if id(t) not in made:
            meta = torch.empty(tuple(t.shape), dtype=t.dtype, device="meta")
            fake = mode.fake_tensor_converter.from_meta_and_device(
                mode, meta, torch.device("cpu"))
            if isinstance(t, torch.nn.Parameter):
                fake = torch.nn.Parameter(fake, requires_grad=t.requires_grad)
            made[id(t)] = fake
        stand_ins[name] = made[id(t)]
    with stateless._reparametrize_module(module, stand_ins):
        yield


class Converted:
    """A torch module converted to JAX: named state and a pure apply function.

    Attributes:
      module: the original torch module (left unchanged).
      train: the mode ``apply`` and calls run in (torch's ``module.training``).
      params: parameters by torch ``state_dict`` name; a tied parameter is stored once,
        under its first name (see ``aliases``).
      buffers: buffers by name (BatchNorm statistics, ...), non-persistent ones included.
        ``int64`` buffers are ``int32`` unless JAX's x64 mode is on.
      aliases: every state-dict name -> the name its value is stored under
        (``{"lm_head.weight": "wte.weight", "wte.weight": "wte.weight", ...}``).
      direct_refusals: call signature -> why :meth:`run_direct` exported that call
        rather than trace it op by op (``"the random op aten.bernoulli.p"``).
    """

    def __init__(self, module: torch.nn.Module, *, train: bool = False):
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"convert() takes a torch.nn.Module, got {type(module).__name__}.")
        self.module = module
        self.train = bool(train)
        p, p_names = _named_state(list(module.named_parameters(remove_duplicate=False)))
        b, b_names = _named_state(list(module.named_buffers(remove_duplicate=False)))
        self.aliases = {**p_names, **b_names}
        self.params = {name: to_jax(t) for name, t in p.items()}
        self.buffers = {name: to_jax(t) for name, t in b.items()}
        floats = [t.dtype for t in (*p.values(), *b.values()) if t.is_floating_point()]
        self._float_dtype = floats[0] if floats else None
        self._programs: dict[Any, Program] = {}
        # Why a call signature is exported rather than traced directly (run_direct).
        self.direct_refusals: dict[Any, str] = {}
        self._calls: dict[Any, Callable] = {}
        self._key = random_seed()
        self.defaults = call_defaults(module)

    # ---- exporting ---------------------------------------------------------------
    def flatten(self, args: tuple, kwargs: dict | None = None) -> tuple[list, Any]:
        """A call's inputs as torch pytree leaves and structure, with the keyword inputs
        of :func:`call_defaults` the caller left out added."""
        kwargs = {**self.defaults, **(kwargs or {})}
        return pytree.tree_flatten((tuple(args), kwargs))

    def program(self, args: tuple, kwargs: dict | None = None, *, train: bool | None = None,
                torch_dtypes: tuple | None = None) -> Program:
        """The exported graph for inputs like these (exported at the first use, cached).

        Array inputs are traced; every other input (a bool, int, string, None) is a
        constant of the graph and part of its signature: ``use_cache=False`` and
        ``use_cache=True`` are two graphs. A JAX integer input exports as ``int64``
        (JAX holds torch's ``int64`` as ``int32`` unless x64 is on) unless
        ``torch_dtypes`` (one entry per leaf of :meth:`flatten`, None where unknown)
        names the torch integer dtype it stands for: an ``int32`` tensor stays ``int32``
        in ``forward``.
        """
        train = self.train if train is None else bool(train)
        signature, leaves, _, dtypes = self._signature(args, kwargs, train, torch_dtypes)
        program = self._programs.get(signature)
        if program is None:
            program = self._programs[signature] = self._export(signature, leaves, dtypes)
        return program

    def _signature(self, args: tuple, kwargs: dict | None, train: bool,
                   torch_dtypes: tuple | None) -> tuple[tuple, list, Any, list]:
        """A call's graph signature (see :meth:`program`), its input leaves and
        structure, and the torch dtype of each integer JAX leaf (None elsewhere)."""
        leaves, spec = self.flatten(args, kwargs)
        dtypes = list(torch_dtypes) if torch_dtypes is not None else [None] * len(leaves)
        dtypes = [d if d is not None and not d.is_floating_point and _is_input_array(x)
                  and not isinstance(x, torch.Tensor) else None
                  for x, d in zip(leaves, dtypes)]
        signature = (train, spec, tuple(_leaf_signature(x) for x in leaves), tuple(dtypes),
                     _autocast_state())
        return signature, leaves, spec, dtypes

    def run_direct(self, params: dict, buffers: dict, args: tuple, kwargs: dict, *,
                   train: bool | None = None, torch_dtypes: tuple | None = None
                   ) -> tuple[list, Any, dict] | None:
        """Runs the module's forward op by op on the values, without exporting it
        (``torch_bridge._direct``): ``(output leaves, output spec, new buffers)``, or
        None where that could give another program than the exported graph's (random
        ops, custom Functions, half precision...: :attr:`direct_refusals` says why,
        per signature), and the caller runs :meth:`program` instead.

        ``CEREBRAX_TORCH_CAPTURE=export`` makes every call refuse."""
        if not _direct.enabled():
            return None
        train = self.train if train is None else bool(train)
        signature, leaves, spec, dtypes = self._signature(args, kwargs, train, torch_dtypes)
        if signature in self.direct_refusals:
            return None
        try:
            return _direct.run(self.module, params, buffers, self.aliases, leaves, spec,
                               dtypes, train=train)
        except DirectRefused as e:
            self.direct_refusals[signature] = str(e)
            return None

    def _export(self, signature: tuple, leaves: list, dtypes: list) -> Program:
        """The graph for ``signature``: the one kept from an earlier process where the
        export cache has it (``torch_bridge._export_cache``), else exported now (and
        kept where it can be)."""
        folder = _export_cache.directory()
        key = _export_cache.key(self.module, signature) if folder is not None else None
        if key is not None and (kept := _export_cache.load(folder, key)) is not None:
            return Program(kept, self.aliases)
        from ._export import export_program  # torch.export's machinery: seconds to import

        train, spec = signature[0], signature[1]
        examples = [self._example(x, dtype=d) for x, d in zip(leaves, dtypes)]
        targs, tkwargs = pytree.tree_unflatten(examples, spec)
        with _cpu_stand_ins(self.module):
            exported, side_calls = export_program(self.module, targs, tkwargs, train=train)
        if key is not None and not side_calls.calls:
            _export_cache.save(folder, key, exported)
        return Program(exported, self.aliases, side_calls)

    def _example(self, x: Any, *, dtype: torch.dtype | None = None) -> Any:
        if isinstance(x, JaxTensor):  # a value of a traced step: its shape and dtype
            return torch.zeros(tuple(x.shape), dtype=x.dtype, device="cpu")
        if isinstance(x, torch.Tensor) or not _is_input_array(x):
            return x
        dtype = dtype or export_dtype(x.dtype)
        if dtype.is_floating_point and self._float_dtype is not None:
            dtype = self._float_dtype
        return torch.zeros(tuple(x.shape), dtype=dtype, device="cpu")

    @property
    def programs(self) -> list[Program]:
        """The graphs exported so far (one per mode and input signature)."""
        return list(self._programs.values())

    # ---- running ------------------------------------------------------------------
    def run(self, params: dict, buffers: dict, args: tuple, kwargs: dict, *,
            train: bool | None = None, key: jax.Array | None = None, flat: bool = False,
            program: Program | None = None) -> tuple[Any, dict]:
        """``apply`` with the inputs as a tuple and a dict, in either mode.

        With ``flat=True`` the outputs are torch's pytree leaves (a list), for a caller
        that returns them from ``jax.jit``: JAX does not know torch-side containers such
        as a transformers ``ModelOutput``. ``self.program(args, kwargs).out_spec``
        rebuilds them (``torch.utils._pytree.tree_unflatten``). ``program``: the graph
        to run, where the caller looked it up (:meth:`program`'s ``torch_dtypes``).
        """
        program = program or self.program(args, kwargs, train=train)
        leaves, _ = self.flatten(args, kwargs)
        inputs = [to_jax(x) if _is_input_array(x) else x for x in leaves]
        outs, mutated = program.run(params, buffers, inputs, key)
        new_buffers = dict(buffers)
        for name, value in mutated.items():
            old = buffers.get(name)
            new_buffers[name] = value if old is None else value.astype(old.dtype)
        return (outs if flat else pytree.tree_unflatten(outs, program.out_spec)), new_buffers

    def apply(self, params: dict, buffers: dict, *inputs: Any, key: jax.Array | None = None,
              **kwinputs: Any) -> tuple[Any, dict]:
        """Runs the module as a pure function: ``(outputs, new_buffers)``.

        Args:
          params: like ``self.params`` (the same names; arrays or tracers).
          buffers: like ``self.buffers``.
          *inputs: the module's positional inputs (JAX, numpy or torch arrays).
          key: a ``jax.random`` key; required when the graph has random ops (dropout in
            train mode, ``torch.rand``, ...). Each random op gets its own split of it.
          **kwinputs: the module's keyword inputs.

        Returns:
          The module's outputs (same structure as torch's: a transformers ``ModelOutput``
          stays one, with JAX arrays inside; see ``run(..., flat=True)`` to return them
          from ``jax.jit``) and every buffer after the call (BatchNorm running statistics
          updated in train mode, exactly as torch).
        """
        return self.run(params, buffers, inputs, kwinputs, train=self.train, key=key)

    def __call__(self, *inputs: Any, **kwinputs: Any) -> Any:
        """Runs on this object's own params and buffers (jitted per input signature).

        Array inputs are traced; the others (bools, ints, strings, None) are constants
        of the graph. The outputs have torch's structure (a transformers ``ModelOutput``
        with ``.logits`` and ``["logits"]``), holding JAX arrays. Buffers updated by a
        train-mode call are kept, as a torch module would. Random ops draw from this
        object's own key (seeded from ``torch.manual_seed``), split on every Python
        call: inside a traced step that is one fixed key, so give models with random
        ops to ``cerebrax.compile`` (or call ``apply`` with a key) instead.
        """
        leaves, spec = self.flatten(inputs, kwinputs)
        signature = (self.train, spec, tuple(_leaf_signature(x) for x in leaves))
        program = self.program(inputs, kwinputs)
        key = None
        if program.needs_key:
            self._key, key = jax.random.split(self._key)
        fn = self._calls.get(signature)
        arrays, skeleton = partition_leaves(
            leaves, spec, lambda x: (to_jax(x), None) if _is_input_array(x) else None)
        if fn is None:
            fn = self._calls[signature] = jax.jit(functools.partial(self._call, skeleton))
        out, new_buffers = fn(self.params, self.buffers, arrays, key)
        if not any(isinstance(v, jax.core.Tracer) for v in jax.tree.leaves(new_buffers)):
            self.buffers = new_buffers
        return pytree.tree_unflatten(out, program.out_spec)

    def _call(self, skeleton, params, buffers, arrays, key):
        args, kwargs = combine(arrays, skeleton)
        return self.run(params, buffers, args, kwargs, key=key, flat=True)

    def __repr__(self) -> str:
        n = sum(int(np.prod(v.shape)) for v in self.params.values())
        mode = "train" if self.train else "eval"
        return (f"Converted({type(self.module).__name__}, {len(self.params)} parameters, "
                f"{n:,} values, {len(self.buffers)} buffers, {mode} mode)")


def convert(module: torch.nn.Module, example_inputs: Any = None, train: bool = False, *,
            example_kwargs: dict[str, Any] | None = None) -> Converted:
    """Converts a torch module to named JAX state and a pure function.

    The module is exported with ``torch.export`` and decomposed to core ATen; every ATen
    op is lowered by the registry (see :func:`torch_bridge.lowering`). One export is
    kept per mode and input signature; without example inputs the first call exports.
    Array inputs are traced; bools, ints, strings and None are constants of the graph.
    A transformers model is called with ``use_cache=False`` unless the call passes
    ``use_cache`` (see :func:`call_defaults`).

    Args:
      module: any ``torch.nn.Module``, parameter-free ones (losses) included.
      example_inputs: a tensor or a tuple of positional inputs to export with now
        (useful to surface unsupported ops early), or None.
      train: run in train mode (dropout active, BatchNorm batch statistics and
        running-statistic updates) or eval mode.
      example_kwargs: keyword inputs to export with now, e.g.
        ``{"input_ids": ids, "labels": ids}``; alone or with ``example_inputs``.

    Returns:
      A :class:`Converted`: ``.params``, ``.buffers``, pure ``.apply(params, buffers,
      *inputs, key=None) -> (outputs, new_buffers)``, and callable on inputs itself.

    Raises:
      TensorReadError: the module's forward branches on a tensor's value, which a static
        graph cannot hold; the message names the source line.

    Example:
      >>> import torch_bridge
      >>> linear = torch_bridge.convert(torch.nn.Linear(3, 2))
      >>> linear
      Converted(Linear, 2 parameters, 8 values, 0 buffers, eval mode)
      >>> def loss(params, x):                   # apply is pure: jit it, differentiate it
      ...     outputs, new_buffers = linear.apply(params, linear.buffers, x)
      ...     return (outputs**2).sum()
      >>> grads = jax.grad(loss)(linear.params, jnp.ones((4, 3)))
      >>> {name: g.shape for name, g in grads.items()}   # the state dict's names
      {'bias': (2,), 'weight': (2, 3)}
      >>> loss_fn = torch_bridge.convert(torch.nn.CrossEntropyLoss())
      >>> logits, labels = jnp.array([[2.0, 0.0, -1.0], [0.0, 3.0, 0.0]]), jnp.array([0, 1])
      >>> loss_fn(logits, labels)                # JAX arrays in, JAX array out
      Array(0.1323..., dtype=float32)
      >>> loss_fn(input=logits, target=labels)   # keyword inputs, as the forward names them
      Array(0.1323..., dtype=float32)

      A Hugging Face language model (``transformers``) takes its usual keyword inputs
      and returns its ``ModelOutput``, holding JAX arrays::

          lm = torch_bridge.convert(gpt2, example_kwargs={"input_ids": ids, "labels": ids})
          lm(input_ids=ids, labels=ids).loss
    """
    converted = Converted(module, train=train)
    if example_inputs is not None or example_kwargs is not None:
        if example_inputs is None:
            example_inputs = ()
        elif not isinstance(example_inputs, tuple):
            example_inputs = (example_inputs,)
        converted.program(example_inputs, example_kwargs)
    return converted
