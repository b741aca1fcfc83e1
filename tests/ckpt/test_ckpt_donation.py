"""A jax CPU buffer read on the host stays donatable to the next step.

A training step donates its state: XLA reuses the buffers instead of allocating new
ones. A background checkpoint and the host reads of state (``state_dict``, step
closures' values) must leave nothing that keeps a CPU buffer alive, or the next step
silently copies it instead (no warning says so). On jax 0.11, ``copy_to_host_async`` of
a CPU array did exactly that; cerebrax starts host copies only off the CPU.
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import cerebrax.ckpt as ckpt
from cerebrax import _placement


def _donated_after(read) -> bool:
    params = jnp.arange(1000, dtype=jnp.float32)
    step = jax.jit(lambda p: p + 1, donate_argnums=0)
    read(params)
    out = step(params)
    np.testing.assert_array_equal(np.asarray(out), np.arange(1000, dtype=np.float32) + 1)
    return params.is_deleted()


def test_a_step_donates_a_buffer_nobody_read() -> None:
    assert _donated_after(lambda params: None)  # the premise of the tests below


def test_a_background_save_leaves_the_buffer_donatable(tmp_path: Path) -> None:
    handles = []
    assert _donated_after(lambda params: handles.append(
        ckpt.save({"p": params}, tmp_path / "c.h5", background=True)))
    handles[0].wait()
    np.testing.assert_array_equal(ckpt.load(tmp_path / "c.h5")["p"], np.arange(1000.0))


def test_a_host_read_of_several_arrays_leaves_them_donatable() -> None:
    sums = []  # the host values themselves are views of the buffers: not kept
    assert _donated_after(lambda params: sums.append(
        {k: float(v.sum()) for k, v in _placement.to_host({"p": params, "q": params * 2}).items()}))
    assert sums == [{"p": 499500.0, "q": 999000.0}]


def test_a_state_dict_leaves_the_model_state_donatable() -> None:
    import cerebrax as cstorch

    model = cstorch.compile(
        cstorch.FunctionalModel(lambda p, x: x @ p["w"], {"w": np.ones((4, 2), np.float32)}),
        cstorch.backend("CPU"))
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)

    @cstorch.trace
    def step(x):
        loss = model(x).sum()
        cstorch.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        return loss

    x = np.ones((3, 4), np.float32)
    step(x)
    before = [ref.value for ref in model._slots().values()]
    model.state_dict()
    step(x)
    assert before and all(leaf.is_deleted() for leaf in before)
