"""The backend's device, and how a torch module's weights move into the compiled state.

``backend.device`` is the JAX device that holds the run's state, wrapped so that it is
also cstorch's context manager::

    with backend.device:
        model = GPTModel(config)          # built and initialized by torch, as written
    compiled = cstorch.compile(model, backend)

What the context does: every parameter and buffer a torch module registers inside it
is marked for hand-over. ``compile`` converts a torch module's tensors to JAX without
copying them (the JAX array reads the tensor's CPU memory), copies each one into the
compiled state and then, for a marked tensor, swaps the module's tensor for an empty
one on torch's ``meta`` device (same object, shape and dtype, no storage), so its
memory is freed as soon as it is copied. The weights are then held once, by the
compiled model; without the context the module keeps its own copy next to it (twice
the memory). The module stays the user's handle: its ``state_dict()`` and
``load_state_dict()`` read and write the compiled state, optimizers take its
``parameters()``, and torch code in a traced step sees gradients on them.

A model too big to build on the CPU can be built on torch's meta device
(``with torch.device("meta"):``), which allocates nothing. ``compile`` then
initializes it (:func:`materialize`): module by module, children before parents (the
order in which torch's constructors run them), it gives the meta tensors of the
module's subtree CPU storage and calls the module's ``reset_parameters()`` (or
``_reset_parameters()``). With the same ``torch.manual_seed`` the values are those an
ordinary build gives, for modules whose constructors initialize through those
methods (torch's own layers do). Initialization written elsewhere (a custom
``__init__`` loop, ``model.apply(init_fn)``) cannot be replayed from meta tensors: a
tensor that no ``reset_parameters`` covers is refused with its name. The tensors are
then handed over like marked ones.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import jax

from ..errors import ConfigError

__all__ = ["BackendDevice", "hand_over", "is_handed_over", "materialize"]

_MARK = "_cerebrax_hand_over"  # attribute set on a tensor to hand over at compile
_RESET_METHODS = ("reset_parameters", "_reset_parameters")


class BackendDevice:
    """The device of a backend: a JAX device, and cstorch's device context manager.

    It compares equal to (and hashes like) its JAX device, and answers the JAX
    device's attributes (``platform``, ``id``, ...). Pass :attr:`jax_device` where JAX
    needs a ``jax.Device`` itself (``jax.device_put``).

    Attributes:
      type: the backend type, ``"CPU"``, ``"GPU"`` or ``"CSX"``.
      jax_device: the JAX device.
    """

    def __init__(self, backend_type: str, jax_device: jax.Device):
        self.type = backend_type
        self.jax_device = jax_device
        self._handles: list[list[Any]] = []

    @property
    def torch_device(self) -> Any:
        """The torch device of the run's torch tensors: the CPU (the state lives in JAX)."""
        import torch

        return torch.device("cpu")

    def __enter__(self) -> BackendDevice:
        """Marks every torch parameter and buffer registered inside for hand-over."""
        handles = []
        if _torch_available():
            from torch.nn.modules import module as torch_module

            handles = [torch_module.register_module_parameter_registration_hook(_mark_hook),
                       torch_module.register_module_buffer_registration_hook(_mark_hook)]
        self._handles.append(handles)
        return self

    def __exit__(self, *exc: Any) -> None:
        for handle in self._handles.pop():
            handle.remove()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, BackendDevice):
            return self.jax_device == other.jax_device
        return self.jax_device == other

    def __hash__(self) -> int:
        return hash(self.jax_device)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.jax_device, name)

    def __repr__(self) -> str:
        return f"BackendDevice({self.type!r}, {self.jax_device})"


def _torch_available() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def _mark_hook(module: Any, name: str, tensor: Any) -> None:
    if tensor is not None:
        setattr(tensor, _MARK, True)


def is_handed_over(tensor: Any) -> bool:
    """Whether ``compile`` frees ``tensor``'s storage once the compiled state holds it."""
    return bool(getattr(tensor, _MARK, False))


# ---- meta modules ---------------------------------------------------------------------

MSG_UNINITIALIZED = """\
{module} was built on torch's meta device, and cstorch.compile initializes such a model
by calling reset_parameters() (or _reset_parameters()) on each of its modules, children
first, as torch's constructors do. No such method covers {names}{more}, so their values
are unknown. Fix, one of:
  - build the model normally (on the CPU) inside `with backend.device:` instead; it is
    initialized as written and its memory is handed to the compiled model at compile;
  - give the module that owns each of them a reset_parameters() that initializes it;
  - assign them real tensors before compiling (e.g. `model.x = nn.Parameter(...)`)."""


def materialize(module: Any) -> list[str]:
    """Initializes the meta tensors of ``module`` on the CPU; returns their names.

    See the module docs. The tensors are swapped in place (the same Parameter objects),
    marked for hand-over, and initialized by the modules' ``reset_parameters()``.

    Raises:
      ConfigError: a meta tensor that no ``reset_parameters()`` initializes (named).
    """
    import torch

    named = _named_tensors(module)
    if not any(t.is_meta for t in named.values()):
        return []
    pending = {id(t) for t in named.values() if t.is_meta}
    with torch.no_grad():
        for _, sub in _post_order(module):
            reset = next((getattr(sub, m) for m in _RESET_METHODS
                          if callable(getattr(sub, m, None))), None)
            if reset is None:
                continue
            for tensor in _named_tensors(sub).values():
                if tensor.is_meta:
                    _swap(tensor, torch.empty_like(tensor, device="cpu"))
            reset()
    left = [name for name, t in named.items() if t.is_meta]
    if left:
        raise ConfigError(MSG_UNINITIALIZED.format(
            module=type(module).__name__, names=", ".join(repr(n) for n in left[:5]),
            more=f" and {len(left) - 5} more" if len(left) > 5 else ""))
    done = [name for name, t in named.items() if id(t) in pending]
    for name in done:
        setattr(named[name], _MARK, True)
    return done


def _named_tensors(module: Any) -> dict[str, Any]:
    """Parameters and buffers of ``module`` by first name (tied tensors once)."""
    out: dict[str, Any] = {}
    seen: set[int] = set()
    for name, t in [*module.named_parameters(), *module.named_buffers()]:
        if t is not None and id(t) not in seen:
            seen.add(id(t))
            out[name] = t
    return out


def _post_order(module: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    for name, child in module.named_children():
        yield from _post_order(child, f"{prefix}{name}.")
    yield prefix.rstrip("."), module


def _swap(tensor: Any, data: Any) -> bool:
    """Makes ``tensor`` (the same Python object) hold ``data``; False if torch refuses
    (another reference holds the tensor, e.g. an autograd graph or a weak reference)."""
    import torch

    if isinstance(tensor, torch.nn.Parameter):
        data = torch.nn.Parameter(data, requires_grad=tensor.requires_grad)
    try:
        torch.utils.swap_tensors(tensor, data)
    except RuntimeError:
        return False
    return True


# ---- hand-over at compile -------------------------------------------------------------

def hand_over(module: Any, converted: dict[str, Any]) -> Mapping[str, Any]:
    """``converted`` (state-dict name -> JAX array of ``module``'s tensor), as a mapping
    whose ``items()`` releases each marked tensor once the consumer has taken it.

    ``compile`` builds its state slots with ``{name: slot(v) for name, v in
    mapping.items()}``: when the iteration moves on from a name, the slot holds its own
    copy, so the module's tensor is swapped for a storage-less ``meta`` one and the
    array in ``converted`` (which reads the tensor's memory) is replaced by its
    ``jax.ShapeDtypeStruct``. Unmarked tensors are left alone.
    """
    tensors = _named_tensors(module)
    marked = {n for n in converted if n in tensors and is_handed_over(tensors[n])}
    if not marked:
        return converted
    return _HandOver(converted, {n: tensors[n] for n in marked})


class _HandOver(Mapping):
    def __init__(self, arrays: dict[str, Any], tensors: dict[str, Any]):
        self._arrays, self._tensors = arrays, tensors

    def __getitem__(self, name: str) -> Any:
        return self._arrays[name]

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._arrays))

    def __len__(self) -> int:
        return len(self._arrays)

    def items(self) -> Iterator[tuple[str, Any]]:  # type: ignore[override]
        for name in list(self._arrays):
            yield name, self._arrays[name]
            self._release(name)

    def _release(self, name: str) -> None:
        tensor = self._tensors.get(name)
        if tensor is None or tensor.is_meta:
            return
        import torch

        if _swap(tensor, torch.empty_like(tensor, device="meta")):
            array = self._arrays[name]
            self._arrays[name] = jax.ShapeDtypeStruct(array.shape, array.dtype)
