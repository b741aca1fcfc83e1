"""DataLoader step counts, batch conversion, DataExecutor checkpoint steps and progress."""

from __future__ import annotations

import io

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import compiled_mlp

import cerebrax as cstorch
from cerebrax.data import compute_num_steps
from cerebrax.data._progress import ProgressBar


@pytest.mark.parametrize("kwargs, length, expected", [
    (dict(num_steps=7), 10, 7),
    (dict(num_steps=7, max_steps=5), 10, 5),
    (dict(num_epochs=3), 10, 30),
    (dict(num_epochs=3, steps_per_epoch=4), 10, 12),
    (dict(num_epochs=3, max_steps=25), 10, 25),
    (dict(), 10, 10),
    (dict(num_steps=4), None, 4),
])
def test_step_count_rules(kwargs, length, expected):
    assert compute_num_steps(length, **kwargs) == expected


@pytest.mark.parametrize("kwargs, length, match", [
    (dict(num_steps=3, num_epochs=2), 10, "Only one of num_steps and num_epochs"),
    (dict(num_steps=0), 10, "must be an integer > 0"),
    (dict(num_epochs=2), None, "needs steps_per_epoch"),
    (dict(num_epochs=1, steps_per_epoch=11), 10, "larger than the number of batches"),
    (dict(), None, "Could not infer the number of steps"),
])
def test_step_count_errors(kwargs, length, match):
    with pytest.raises(cstorch.ConfigError, match=match):
        compute_num_steps(length, **kwargs)


def test_dataloader_needs_a_callable():
    with pytest.raises(cstorch.ConfigError, match="callable input_fn"):
        cstorch.utils.data.DataLoader([1, 2, 3])


def test_dataloader_passes_arguments_and_restarts_epochs():
    calls = []

    def input_fn(n, *, scale):
        calls.append((n, scale))
        return [np.full((2,), i * scale, np.float32) for i in range(n)]

    loader = cstorch.utils.data.DataLoader(input_fn, 3, scale=2.0, num_steps=7)
    out = [float(b[0]) for b in loader]
    assert out == [0, 2, 4, 0, 2, 4, 0]
    assert calls == [(3, 2.0)]  # input_fn is called once


def test_batches_become_jax_arrays_nested_structures_included():
    torch = pytest.importorskip("torch")
    batch = {"x": torch.ones(2, 3, dtype=torch.bfloat16), "y": (np.arange(2), 3)}
    loader = cstorch.utils.data.DataLoader(lambda: [batch], num_steps=1)
    (got,) = list(loader)
    assert isinstance(got["x"], jax.Array) and got["x"].dtype == jnp.bfloat16
    assert isinstance(got["y"][0], jax.Array) and got["y"][1] == 3


def test_torch_dataloader_as_input_fn():
    torch = pytest.importorskip("torch")
    dataset = torch.utils.data.TensorDataset(torch.arange(10.0).reshape(10, 1),
                                             torch.arange(10))
    loader = cstorch.utils.data.DataLoader(
        lambda: torch.utils.data.DataLoader(dataset, batch_size=4, drop_last=True),
        num_epochs=2)
    assert len(loader) == 4
    xs = [np.asarray(x).ravel().tolist() for x, _ in loader]
    assert xs == [[0, 1, 2, 3], [4, 5, 6, 7]] * 2


def test_empty_input_fn_is_an_error():
    loader = cstorch.utils.data.DataLoader(lambda: [], num_steps=2)
    with pytest.raises(cstorch.ConfigError, match="produced no batches"):
        list(loader)


def test_executor_checkpoint_and_activation_steps():
    loader = cstorch.utils.data.DataLoader(lambda: [np.zeros(1)], num_steps=10)
    executor = cstorch.utils.data.DataExecutor(loader, checkpoint_steps=4, activation_steps=3,
                                               progress_bar=False)
    assert [s for s in range(10) if executor.is_checkpoint_step(s)] == [3, 7, 9]
    assert [s for s in range(10) if executor.is_activation_step(s)] == [2, 5, 8, 9]
    none = cstorch.utils.data.DataExecutor(loader, checkpoint_steps=0, progress_bar=False)
    assert [s for s in range(10) if none.is_checkpoint_step(s)] == [9]


def test_executor_properties_and_current_executor():
    loader = cstorch.utils.data.DataLoader(lambda: [np.zeros(1)], num_steps=3)
    executor = cstorch.utils.data.DataExecutor(loader, progress_bar=False)
    seen = []
    for _ in executor:
        assert cstorch.current_executor() is executor
        seen.append((executor.iteration, executor.user_iteration, executor.is_initial_step,
                     executor.on_final_iteration))
    assert seen == [(0, 1, True, False), (1, 2, False, False), (2, 3, False, True)]
    with pytest.raises(cstorch.StateError, match="data executor was not used"):
        cstorch.current_executor()


def test_executor_takes_checkpoint_steps_from_configure():
    cstorch.configure(checkpoint_steps=2)
    loader = cstorch.utils.data.DataLoader(lambda: [np.zeros(1)], num_steps=5)
    executor = cstorch.utils.data.DataExecutor(loader, progress_bar=False)
    assert [s for s in range(5) if executor.is_checkpoint_step(s)] == [1, 3, 4]


def test_iterating_a_dataloader_directly_runs_checkpoint_closures():
    cstorch.configure(checkpoint_steps=2)
    saved = []

    @cstorch.checkpoint_closure
    def save(step):
        saved.append(step)

    loader = cstorch.utils.data.DataLoader(lambda: [np.zeros(1)], num_steps=5)
    for i, _ in enumerate(loader):
        save(i)
    assert saved == [1, 3, 4]


def test_executor_rejects_other_loaders():
    with pytest.raises(cstorch.ConfigError, match="expects a cstorch.utils.data.DataLoader"):
        cstorch.utils.data.DataExecutor([np.zeros(1)], num_steps=2)


def test_compile_only_runs_one_step():
    cstorch.backend("CSX", compile_only=True)
    loader = cstorch.utils.data.DataLoader(lambda: [np.zeros(1)], num_steps=50)
    assert len(cstorch.utils.data.DataExecutor(loader)) == 1


def test_progress_bar_shows_rate_and_the_last_ready_loss():
    stream = io.StringIO()
    bar = ProgressBar(4, live=False, stream=stream)
    for i in range(4):
        bar.note_output(jnp.float32(1.0 / (i + 1)))
        bar.update(i + 1)
    bar.close()
    line = stream.getvalue()
    assert "step 4/4" in line and "steps/s" in line and "loss 0.25" in line


def test_executor_draws_the_progress_bar(capsys):
    model = compiled_mlp()

    @cstorch.trace
    def step(x):
        return model(x).sum()

    loader = cstorch.utils.data.DataLoader(lambda: [np.ones((2, 8), np.float32)], num_steps=3)
    for x in cstorch.utils.data.DataExecutor(loader, progress_bar="auto"):
        step(x)
    err = capsys.readouterr().err
    assert "[cerebrax] step 3/3" in err and "loss" in err


def test_executor_prints_nothing_by_default_in_a_script(capsys):
    """A user script's output is its own (its own logging or tqdm bar, as gigaGPT's
    eval.py): the executor's bar is opt-in there; `cerebrax fit` and `eval` ask for it."""
    model = compiled_mlp()

    @cstorch.trace
    def step(x):
        return model(x).sum()

    loader = cstorch.utils.data.DataLoader(lambda: [np.ones((2, 8), np.float32)], num_steps=3)
    for x in cstorch.utils.data.DataExecutor(loader):
        step(x)
    captured = capsys.readouterr()
    assert "[cerebrax]" not in captured.err + captured.out


def test_a_type_error_in_input_fn_is_reported_as_itself():
    def input_fn():
        raise TypeError("bad argument inside the input function")

    loader = cstorch.utils.data.DataLoader(input_fn)
    with pytest.raises(TypeError, match="bad argument inside the input function"):
        loader.num_steps
