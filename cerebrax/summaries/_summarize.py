"""``summarize_scalar`` / ``summarize_tensor``: values of a step into the run's writer.

A summary is a step closure with its own kind, ``"summary"``: inside a traced step the
value becomes an output of the step's program; the write happens on the host after the
step, one step behind inside a DataExecutor (the closure queue), so the next step is
dispatched before the value is fetched. The queue skips summaries on steps that are not
activation steps and whenever the executor has no writer, without fetching anything.

The step written is ``writer.base_step + s`` for the executor's 0-based step ``s``.
cstorch's ``SummaryWriter`` defaults ``base_step`` to 1, so the first step is logged as
step 1 (the 1-based ``user_iteration``); a writer without ``base_step`` (torch's) is
treated the same way.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from .. import _step
from .._placement import to_host
from .._step import DeferredValue
from ..errors import ConfigError, StateError

__all__ = ["summarize_scalar", "summarize_tensor"]

MSG_PYTHON_NUMBER = """\
summarize_{kind}({name!r}, {value!r}) got a Python number inside the traced step
`{step}`. The step is traced once, so the number would be frozen at its first value.
Summarize an array computed in the step instead, e.g.

    cstorch.summarize_scalar("lr", jnp.asarray(lr))   # wrong if lr is a Python float
    cstorch.summarize_scalar("loss", loss)             # right: an output of the step"""


def _writer_and_step() -> tuple[Any, int] | None:
    executor = _step.current_executor()
    step = _step.running_step()
    if executor is None or executor.writer is None or step is None:
        return None
    return executor.writer, getattr(executor.writer, "base_step", 1) + step


def _write_scalar(name: str, value: Any) -> None:
    target = _writer_and_step()
    if target is None:
        return
    writer, step = target
    array = np.asarray(value)
    if array.size != 1:
        raise ConfigError(
            f"summarize_scalar({name!r}, ...) needs a single value, got shape "
            f"{array.shape}. Reduce it (e.g. .mean()) or use summarize_tensor."
        )
    writer.add_scalar(name, float(array.reshape(())), step)


def _write_tensor(name: str, value: Any) -> None:
    target = _writer_and_step()
    if target is None:
        return
    writer, step = target
    _check_add_tensor(writer)
    writer.add_tensor(name, np.asarray(value), step)


def _check_add_tensor(writer: Any) -> None:
    if not callable(getattr(writer, "add_tensor", None)):
        raise ConfigError(
            f"summarize_tensor needs a writer with add_tensor(tag, array, step), but the "
            f"DataExecutor's writer is a {type(writer).__name__}. Pass "
            "cstorch.utils.tensorboard.SummaryWriter(log_dir) as DataExecutor(writer=...)."
        )


def _check(kind: str, name: Any, value: Any) -> None:
    if not isinstance(name, str) or not name:
        raise ConfigError(f"summarize_{kind} needs a non-empty string name, got {name!r}.")
    ctx = _step.active_context()
    python_number = isinstance(value, (int, float, complex)) and not isinstance(value, np.generic)
    if ctx is not None and python_number:
        raise StateError(
            MSG_PYTHON_NUMBER.format(kind=kind, name=name, value=value, step=ctx.step.__name__)
        )
    size = 1 if isinstance(value, DeferredValue) else int(np.prod(np.shape(value)))
    if kind == "scalar" and size != 1:
        raise ConfigError(
            f"summarize_scalar({name!r}, ...) needs a single value, got shape "
            f"{np.shape(value)}. Reduce it (e.g. .mean()) or use summarize_tensor."
        )
    executor = _step.current_executor()
    if kind == "tensor" and executor is not None and executor.writer is not None:
        _check_add_tensor(executor.writer)


def _submit(write: Any, name: str, value: Any) -> None:
    if _step.running_step() is not None:
        # Called from inside a running closure: its values are already on the host.
        write(name, to_host(value))
        return
    _step.record_closure(write, (name, value), {}, "summary")


def summarize_scalar(name: str, value: jax.typing.ArrayLike) -> None:
    """Writes ``value`` to the DataExecutor's writer as scalar summary ``name``.

    Inside a traced step ``value`` (an array of one element, or the result of a
    gradient-consuming call such as ``clip_grad_norm_``) becomes an output of the step;
    it is fetched and written after the step on activation steps, at step
    ``writer.base_step + executor.iteration`` (the 1-based ``user_iteration`` by
    default). Between steps inside the loop it is written for the current step. With no
    writer, or outside a DataExecutor loop, the call does nothing.

    Example:
      >>> model = cstorch.compile(torch.nn.Linear(4, 1), cstorch.backend("CPU"))
      >>> optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)
      >>> @cstorch.trace
      ... def training_step(x, y):
      ...     loss = torch.nn.functional.mse_loss(model(x), y)
      ...     cstorch.backward(loss)
      ...     optimizer.step()
      ...     cstorch.summarize_scalar("train/loss", loss)
      ...     return loss
      >>> loader = cstorch.utils.data.DataLoader(
      ...     lambda: [(torch.ones(8, 4), torch.zeros(8, 1))] * 3)
      >>> writer = cstorch.utils.tensorboard.SummaryWriter("model_dir/train")
      >>> for x, y in cstorch.utils.data.DataExecutor(loader, writer=writer):
      ...     loss = training_step(x, y)
      >>> reader = cstorch.utils.tensorboard.SummaryReader("model_dir/train")
      >>> [step for step, value in reader.scalars("train/loss")]   # 1-based steps
      [1, 2, 3]
    """
    _check("scalar", name, value)
    _submit(_write_scalar, name, value)


def summarize_tensor(name: str, value: jax.typing.ArrayLike) -> None:
    """Writes the array ``value`` to the DataExecutor's writer as tensor summary ``name``.

    Same timing and steps as :func:`summarize_scalar`; dtype and shape are kept exactly
    (``SummaryReader.tensors(name)`` returns the arrays). The writer needs an
    ``add_tensor(tag, array, step)`` method, as ``cstorch.utils.tensorboard.SummaryWriter``
    has.
    """
    _check("tensor", name, value)
    _submit(_write_tensor, name, value)
