"""``cbtorch.Session``: a plain PyTorch loop body run as one compiled step per iteration.

Seed 003's loop keeps the body of a standard PyTorch training loop::

    with cbtorch.Session(model, optimizer, criterion, mode="train"):
        for step, (x, y) in enumerate(train_dataloader):
            optimizer.zero_grad()
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            print(loss.item())

While the Session is open, the model (a :func:`~cerebrax.legacy.module`), the criterion
and the optimizer are taken over: their calls are recorded as a :class:`Recipe` and
return lazy values. ``optimizer.step()`` ends the step: the recipe is replayed inside
ONE ``@cstorch.trace`` step (forward, backward and update in one program), compiled at
the first iteration and reused after; the lazy values resolve to that step's outputs.
Every later iteration must record the same graph, or :class:`RecompileError` says what
changed. All the runtime's rules hold: fixed input shapes, state donation, closures.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import jax

from .. import _step
from .._filters import is_torch_module
from .._runtime import RUNTIME
from ..backend import current_backend
from ..errors import ConfigError, RecompileError, StateError, TensorReadError
from ..optim import Optimizer, from_torch
from ..trace import TracedStep
from ._lazy import LazyTensor, Recipe
from ._module import LegacyModule

__all__ = ["Session", "active_session"]


MODES = ("train", "eval")

MSG_GRAPH_CHANGED = """\
The Session's step changed: {difference}.
A Session captures its loop body at the first iteration and runs it as one compiled
program (the wafer runs one static graph), so every iteration must make the same calls,
in the same order, on inputs of the same shapes. {boundary}
Fix: make every iteration's body the same, e.g.

Wrong:
    loss = criterion(model(x), y)
    if step % 10 == 0:
        loss = loss + 0.1 * reg              # a call only some iterations make
Right:
    loss = criterion(model(x), y) + 0.1 * reg
For debugging only, cstorch.backend("CPU", allow_recompile=True) compiles the new graph."""

BOUNDARY = {
    "train": "In train mode a step ends at optimizer.step().",
    "eval": ("In eval mode a step ends at the first read of a value (loss.item()), at "
             "session.mark_step(), or when the Session's cbtorch.dataloader moves to the next "
             "batch; read values at the end of the body."),
}

MSG_READ_EARLY = """\
{what} was read before optimizer.step(). In a train-mode Session the whole step
(forward, backward and update) runs as one compiled program when optimizer.step() is
called, so values exist only after it.

Wrong:
    loss.backward()
    print(loss.item())                       # the step has not run yet
    optimizer.step()
Right:
    loss.backward()
    optimizer.step()
    print(loss.item())                       # materialized by the step"""

MSG_CRITERION = """\
Session(criterion=...) takes a torch loss module (e.g. torch.nn.CrossEntropyLoss()),
which the Session converts with the torch bridge and captures while it is open, or None
when the model returns the loss itself; got {got}. Calls of a plain function cannot be
captured in the loop body. For a JAX loss, compute it inside the model
(cbtorch.module(cstorch.FunctionalModel(apply_with_loss, params)) and pass
criterion=None), or write the step with @cstorch.trace."""


def active_session() -> Session | None:
    """The Session whose ``with`` block is running, or None."""
    return RUNTIME.sessions[-1] if RUNTIME.sessions else None


class Session:
    """Runs a standard PyTorch loop body as one compiled step per iteration.

    Args:
      model: the model, wrapped by :func:`cerebrax.legacy.module`.
      optimizer: a ``cstorch.optim`` optimizer over the model's parameters, or a
        ``torch.optim`` one (run as its cerebrax equivalent, see
        :func:`cerebrax.optim.from_torch`; the torch optimizer gets the trained state
        back when the block ends); required in train mode. Inside the block its
        ``step()`` ends (and runs) the step and its ``zero_grad()`` is part of the step.
      criterion: a torch loss module (converted with the torch bridge), or None when
        the model returns the loss.
      mode: ``"train"`` (the model is put in train mode; a step ends at
        ``optimizer.step()``) or ``"eval"`` (eval mode, no backward; a step ends at
        the first read of a value, at :meth:`mark_step`, or when a
        :func:`cerebrax.legacy.dataloader` moves to the next batch).

    Inside the block the model's and criterion's calls return
    :class:`~cerebrax.legacy.LazyTensor` values; ``loss.backward()`` marks the loss.
    The first step compiles; later steps reuse the program. A body whose graph
    changes raises :class:`cerebrax.RecompileError`.

    Attributes:
      num_compiles: how many programs the Session built (1 for a well-formed loop).
      num_steps: how many steps ran.
    """

    def __init__(self, model: Any, optimizer: Any = None, criterion: Any = None, *,
                 mode: str = "train"):
        if not isinstance(model, LegacyModule):
            raise ConfigError(
                f"Session(model, ...) expects the model wrapped by cbtorch.module(), got "
                f"{type(model).__name__}. Write: model = cbtorch.module(Model())."
            )
        if mode not in MODES:
            raise ConfigError(f"Session(mode=...) must be 'train' or 'eval', got {mode!r}.")
        # The optimizer the loop body calls (a torch one is taken over like a cerebrax
        # one), and the cerebrax optimizer the compiled step runs.
        self._user_optimizer = optimizer
        if optimizer is not None and not isinstance(optimizer, Optimizer):
            if not type(optimizer).__module__.startswith("torch.optim"):
                raise ConfigError(
                    f"Session(optimizer=...) expects a cerebrax or torch.optim optimizer, "
                    f"got {type(optimizer).__name__}. Write e.g. "
                    "cstorch.optim.SGD(model.parameters(), lr=...)."
                )
            optimizer = from_torch(optimizer)
        if mode == "train" and optimizer is None:
            raise ConfigError("Session(mode='train') needs the optimizer that trains the model.")
        if criterion is not None and not is_torch_module(criterion):
            raise ConfigError(MSG_CRITERION.format(got=type(criterion).__name__))
        self.model = model
        self.optimizer = optimizer
        self.criterion = criterion
        self.mode = mode
        self.num_steps = 0
        self._converted_criterion: Any = None
        self._pending: Recipe | None = None
        self._compiled: Recipe | None = None
        self._steps: list[TracedStep] = []
        self._after_step: list[tuple] = []
        self._open = False

    @property
    def num_compiles(self) -> int:
        """How many programs the Session built (1 for a well-formed loop)."""
        return sum(step.num_compiles for step in self._steps)

    # ---- the block ---------------------------------------------------------------------
    def __enter__(self) -> Session:
        if RUNTIME.sessions:
            raise StateError("A cbtorch.Session is already open; Sessions do not nest.")
        self.model.train(self.mode == "train")
        RUNTIME.sessions.append(self)
        self._open = True
        self._take_over()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            # An eval step ends with the block; a train step ends at optimizer.step(),
            # so a train body left before it (a `break`) records nothing that runs.
            if exc_type is None and self._pending is not None and self.mode == "eval":
                self.mark_step()
        finally:
            self._release()
            self._open = False
            self._pending = None
            RUNTIME.sessions.remove(self)
        if exc_type is None and self._user_optimizer is not self.optimizer:
            # The torch optimizer the script holds gets the trained state back, so
            # saving it (optimizer.state_dict()) after the block saves this run.
            from ..ckpt import to_torch

            self._user_optimizer.load_state_dict(to_torch(self.optimizer.state_dict()))

    def _take_over(self) -> None:
        """Points the optimizer's and criterion's methods at the Session while it is open."""
        for optimizer in self._optimizers():
            optimizer.step = self._on_step
            optimizer.zero_grad = self._on_zero_grad
        if self.criterion is not None:
            self.criterion.forward = self._on_criterion

    def _optimizers(self) -> list:
        """The optimizer objects the body may call: the user's and the one that runs."""
        found = []
        for optimizer in (self._user_optimizer, self.optimizer):
            if optimizer is not None and all(optimizer is not f for f in found):
                found.append(optimizer)
        return found

    def _release(self) -> None:
        for optimizer in self._optimizers():
            for name in ("step", "zero_grad"):
                optimizer.__dict__.pop(name, None)
        if self.criterion is not None:
            self.criterion.__dict__.pop("forward", None)

    @contextlib.contextmanager
    def _released(self) -> Iterator[None]:
        """The real methods, while the step traces (torch.export calls ``forward``)."""
        self._release()
        try:
            yield
        finally:
            self._take_over()

    # ---- recording -------------------------------------------------------------------
    def _recipe(self) -> Recipe:
        if not self._open:
            raise StateError("This cbtorch.Session is closed; open it with `with`.")
        if self._pending is None:
            self._pending = Recipe()
        return self._pending

    def _record_value(self, kind: str, target: Any, label: str, args: tuple,
                      kwargs: dict) -> LazyTensor:
        recipe = self._recipe()
        recipe.add(kind, target, label, args, kwargs)
        return LazyTensor(self, recipe, len(recipe.nodes) - 1)

    def _record_model_call(self, model: LegacyModule, args: tuple, kwargs: dict) -> LazyTensor:
        return self._record_value("call", model.compiled, "model", args, kwargs)

    def _on_criterion(self, *args: Any, **kwargs: Any) -> Any:
        if not any(isinstance(x, LazyTensor) for x in (*args, *kwargs.values())):
            # Plain torch tensors: the criterion runs eagerly, as torch would.
            return type(self.criterion).forward(self.criterion, *args, **kwargs)
        if self._converted_criterion is None:
            import torch_bridge

            self._converted_criterion = torch_bridge.convert(
                self.criterion, train=self.criterion.training)
        return self._record_value("call", self._converted_criterion, "criterion", args, kwargs)

    def _record_backward(self, loss: LazyTensor) -> None:
        if self.mode != "train":
            raise StateError(
                "loss.backward() was called in a Session in eval mode, which computes no "
                "gradients. Open the Session with mode='train' to train."
            )
        self._recipe().add("backward", None, "backward", (loss,), {})

    def _on_zero_grad(self, *args: Any, **kwargs: Any) -> None:
        self._recipe().add("zero_grad", self.optimizer, "zero_grad", args, kwargs)

    def _on_step(self, closure: Any = None) -> None:
        if closure is not None:
            raise ConfigError(
                "optimizer.step(closure) is not supported in a Session: the step is one "
                "static graph. Compute the loss in the loop body and call step()."
            )
        if self.mode != "train":
            raise StateError("optimizer.step() was called in a Session in eval mode.")
        self._recipe().add("step", self.optimizer, "step", (), {})
        self.mark_step()

    # ---- running ---------------------------------------------------------------------
    def mark_step(self) -> None:
        """Ends the step: runs everything recorded since the last step as one program."""
        recipe, self._pending = self._pending, None
        if recipe is None:
            self._run_closures()
            return
        step = self._step_for(recipe)
        with self._released():
            outputs = step(recipe.inputs)
        for node, value in zip(recipe.nodes, outputs):
            node.value, node.resolved = value, True
        self.num_steps += 1
        self._run_closures()

    def _step_for(self, recipe: Recipe) -> TracedStep:
        if self._compiled is None:
            return self._new_step(recipe)
        difference = self._compiled.difference(recipe)
        if difference is None:
            return self._steps[-1]
        backend = current_backend(raise_exception=False)
        if backend is not None and backend.allow_recompile:
            return self._new_step(recipe)
        raise RecompileError(MSG_GRAPH_CHANGED.format(
            difference=difference, boundary=BOUNDARY[self.mode]))

    def _new_step(self, recipe: Recipe) -> TracedStep:
        graph = recipe.skeleton()  # holds no batch and no output of this step

        def session_step(inputs: dict) -> list:
            return graph.replay(inputs)

        self._compiled = graph
        self._steps.append(TracedStep(session_step))
        return self._steps[-1]

    def _materialize(self, value: LazyTensor) -> None:
        if value._recipe is not self._pending or not self._open:
            raise StateError(
                f"{value!r} was never computed: its Session ended before the step that "
                "computes it ran. Read values inside the Session, after the step."
            )
        if self.mode == "train":
            raise TensorReadError(MSG_READ_EARLY.format(what=repr(value)))
        self.mark_step()

    # ---- closures --------------------------------------------------------------------
    def add_step_closure(self, fn: Any, args: tuple = (), kwargs: dict | None = None) -> None:
        """Runs ``fn(*args, **kwargs)`` after the current step, with materialized values.

        Lazy values among the arguments are read once their step ran. Called between
        steps, it runs as a ``cstorch.step_closure`` right away (inside a
        ``DataExecutor`` loop, one step behind; read model state in a
        ``cstorch.checkpoint_closure`` there).
        """
        self._after_step.append((fn, tuple(args), dict(kwargs or {})))
        if self._pending is None:
            self._run_closures()

    def _run_closures(self) -> None:
        pending, self._after_step = self._after_step, []
        for fn, args, kwargs in pending:
            args, kwargs = _values((args, kwargs))
            _step.step_closure(fn)(*args, **kwargs)


def _values(tree: Any) -> Any:
    """``tree`` with every lazy value replaced by its materialized value."""
    return jax.tree.map(lambda x: x.value if isinstance(x, LazyTensor) else x, tree,
                        is_leaf=lambda x: isinstance(x, LazyTensor))
