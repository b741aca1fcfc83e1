"""A step closure that raises runs once: its error surfaces once, never chained to a
second run of the same closure by the executor's cleanup."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from helpers import fresh_backend

import cerebrax as cstorch


class ClosureFailed(Exception):
    pass


def _run_until_the_closure_fails(steps: int, fail_from: int):
    """Runs ``steps`` steps in a DataExecutor; the closure raises from step ``fail_from``.

    Returns the steps the closure was called for and the error the loop raised.
    """
    backend = fresh_backend()
    model = cstorch.compile(
        cstorch.FunctionalModel(lambda p, x: x @ p["w"], {"w": jnp.ones((2, 2))}), backend)
    calls = []

    @cstorch.step_closure
    def check(value, step):
        calls.append(int(step))
        if int(step) >= fail_from:
            raise ClosureFailed(f"closure failed on step {int(step)}")

    @cstorch.trace
    def step_fn(x, step):
        check(model(x).sum(), step)
        return step

    data = [np.full((4, 2), i, np.float32) for i in range(steps)]
    executor = cstorch.utils.data.DataExecutor(
        cstorch.utils.data.DataLoader(lambda: data), num_steps=steps)
    with pytest.raises(ClosureFailed) as info:
        for i, x in enumerate(executor):
            step_fn(x, np.int32(i))
    return calls, info.value


@pytest.mark.parametrize("steps, fail_from", [(2, 0), (5, 1), (5, 4)])
def test_a_failing_closure_never_runs_again(steps, fail_from):
    calls, error = _run_until_the_closure_fails(steps, fail_from)
    # Steps before the failure ran their closure; the failing call is the last call.
    assert calls == list(range(fail_from + 1)), calls
    assert str(error) == f"closure failed on step {fail_from}"
    assert error.__context__ is None and error.__cause__ is None, repr(error.__context__)


def test_the_next_loop_starts_with_an_empty_queue():
    _run_until_the_closure_fails(4, 1)
    ran = []

    @cstorch.step_closure
    def note(total):
        ran.append(float(total))

    @cstorch.trace
    def step_fn(x):
        note(x.sum())
        return x.sum()

    data = [np.full((1,), i, np.float32) for i in range(3)]
    for x in cstorch.utils.data.DataExecutor(cstorch.utils.data.DataLoader(lambda: data),
                                             num_steps=3):
        step_fn(x)
    assert ran == [0.0, 1.0, 2.0]
