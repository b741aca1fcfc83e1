"""The wafer mesh over 2 processes x 4 CPU devices (``cstorch.distributed.initialize``).

The test starts two copies of this file as worker processes (``python
test_two_process.py WORKER ...``), each with its own 4 emulated CPU devices; they join
through JAX's multi-process runtime on a free localhost port and train the same MLP in
several layouts of the 8-device mesh; in weight-streaming mode also a deeper MLP given
as ``FunctionalModel(layers=...)``, which streams its weights layer by layer and scans
its equal layers, and the same MLP in pipeline mode (2 systems x 4 stages). Both must give the losses and final parameters of a single-device
run (fp32, rel <= 1e-5), and the same values as each other.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import pathlib
import socket
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # tests/helpers.py, also in the worker processes

from helpers import batches, mlp_apply, mlp_params, rel_err, xent  # noqa: E402

import cerebrax as cstorch  # noqa: E402

STEPS = 20
PROCESSES = 2
DEVICES_PER_PROCESS = 4
TIMEOUT_S = 120  # a hang (a process waiting on a collective) fails within this
HANG_DUMP_S = int(os.environ.get("CEREBRAX_TEST_HANG_DUMP_S", TIMEOUT_S - 20))
# name: (ClusterConfig fields, how batches reach the step)
LAYOUTS = {
    "replica8": (dict(execution_mode="replica", num_replicas=8), "executor"),
    "replica2x4": (dict(execution_mode="replica", num_csx=2, num_replicas=4), "numpy"),
    "ws8": (dict(execution_mode="weight_streaming", max_wgt_servers=8), "executor"),
    "ws2x4": (dict(execution_mode="weight_streaming", num_csx=2, max_wgt_servers=4), "numpy"),
    "ws8_layers": (dict(execution_mode="weight_streaming", max_wgt_servers=8), "executor"),
    "pipe2x4": (dict(execution_mode="pipeline", num_csx=2, num_stages=4), "executor"),
}
# The model a layout trains: "mlp" is FunctionalModel(mlp_apply, ...), whose weights stay
# sharded while XLA places the call; "layers" is a deeper MLP of the same math given as
# FunctionalModel(layers=...), which weight streaming runs layer by layer, its weights
# gathered just in time, its two equal hidden layers as one scan. Pipeline mode runs it
# as four stages, its state split over the stage devices of both processes.
MODELS = {"ws8_layers": "layers", "pipe2x4": "layers"}
LAYERED_SIZES = (8, 16, 16, 16, 4)


def _dense(p, x):
    return jnp.tanh(x @ p["weight"] + p["bias"])


def _linear(p, x):
    return x @ p["weight"] + p["bias"]


def _model(kind: str, compiled: bool):
    """The model of ``kind``; for "layers", the one-device reference is the same MLP as
    one function (same names, same math)."""
    if kind == "mlp":
        return cstorch.FunctionalModel(mlp_apply, mlp_params(0))
    params = mlp_params(0, LAYERED_SIZES)
    if not compiled:
        return cstorch.FunctionalModel(mlp_apply, params)
    n = len(params)
    return cstorch.FunctionalModel(layers={
        f"fc{i + 1}": (_dense if i < n - 1 else _linear, params[f"fc{i + 1}"]) for i in range(n)})


def _train(layout: str | None, feed: str = "executor", kind: str = "mlp"):
    """20 steps of AdamW with a linear warm-up from one initial state.

    Batches come from a DataExecutor (placed in its data thread) or are passed to the
    step as numpy arrays (placed by the step). Returns the losses read in a step
    closure, the same losses read with ``float`` after each step, the final parameters
    and optimizer state, and the traced step.
    """
    cstorch.reset()
    cstorch.amp.set_half_dtype("float32")
    if layout is None:
        backend = cstorch.backend("CPU")
    else:
        config = cstorch.distributed.ClusterConfig(**LAYOUTS[layout][0])
        backend = cstorch.backend("CSX", cluster_config=config)
    model = cstorch.compile(_model(MODELS.get(layout, kind), layout is not None), backend)
    optimizer = cstorch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    scheduler = cstorch.optim.lr_scheduler.LinearLR(
        optimizer, initial_learning_rate=1e-3, end_learning_rate=1e-2, total_iters=10)
    closure_losses = []

    @cstorch.step_closure
    def record(loss):
        closure_losses.append(float(loss))

    @cstorch.trace
    def training_step(x, y):
        loss = xent(model(x), y)
        cstorch.backward(loss)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        record(loss)
        return loss

    @cstorch.checkpoint_closure
    def save_checkpoint():
        state = {"model": model.state_dict()}  # every process reads (gathers) the state
        if jax.process_index() == 0:  # one process writes
            cstorch.save(state, f"{layout}.mdl")

    losses = []
    if feed == "executor":
        loader = cstorch.utils.data.DataLoader(lambda: batches(STEPS), num_steps=STEPS)
        for x, y in cstorch.utils.data.DataExecutor(loader, progress_bar=False):
            losses.append(float(training_step(x, y)))
            save_checkpoint()  # runs on the final step
    else:
        for x, y in batches(STEPS):  # every process passes the same global batch
            losses.append(float(training_step(x, y)))
    state = {f"model.{k}": v for k, v in model.state_dict().items()}
    for i, leaf in enumerate(_leaves(optimizer.state_dict()["state"])):
        state[f"optimizer.{i}"] = leaf
    return np.array(closure_losses), np.array(losses), state, training_step


def _leaves(tree) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


# ---- the worker processes --------------------------------------------------------------------
def _worker(port: int, rank: int, out: str) -> None:
    # A hang prints every thread's stack (shown by the test) before the test kills it.
    faulthandler.dump_traceback_later(HANG_DUMP_S, exit=True)
    cstorch.distributed.initialize(f"localhost:{port}", num_processes=PROCESSES,
                                   process_id=rank, initialization_timeout=TIMEOUT_S)
    assert jax.process_count() == PROCESSES, jax.process_count()
    assert jax.device_count() == PROCESSES * DEVICES_PER_PROCESS, jax.devices()
    assert jax.local_device_count() == DEVICES_PER_PROCESS, jax.local_devices()
    results = {}
    for layout, (_, feed) in LAYOUTS.items():
        closure_losses, losses, state, step = _train(layout, feed)
        wafer = cstorch.backend().wafer
        assert wafer is not None and wafer.size == 8, wafer
        processes = {d.process_index for d in wafer.mesh.devices.flat}
        assert processes == set(range(PROCESSES)), processes
        # The state lives on the whole mesh, across both processes, as the mode says.
        values = [p._value for p in step._diff_refs]
        assert all(len(v.sharding.device_set) == 8 for v in values)
        assert not any(v.is_fully_addressable for v in values)
        split = [not v.sharding.is_fully_replicated for v in values]
        assert any(split) if wafer.mode != "replica" else not any(split), layout
        if wafer.mode == "weight_streaming" and layout in MODELS:  # streamed: the equal hidden layers are one loop each way
            x, y = batches(1)[0]
            loops = cstorch.wse.collective_report(step, x, y).loops
            results[f"{layout}/trips"] = np.array(
                [loop.trip_count for loop in loops if loop.count("all-gather")])
        results[f"{layout}/closure_losses"] = closure_losses
        results[f"{layout}/losses"] = losses
        results.update({f"{layout}/{k}": v for k, v in state.items()})
    # A mesh that leaves out a process is refused on every process.
    cstorch.reset()
    try:
        cstorch.backend("CSX", cluster_config=cstorch.distributed.ClusterConfig(
            execution_mode="replica", num_replicas=4))
        results["left_out"] = np.array("no error")
    except cstorch.ConfigError as e:
        results["left_out"] = np.array(str(e))
    # So is a layout of one device: every process would train alone.
    cstorch.reset()
    try:
        cstorch.backend("CSX", cluster_config=cstorch.distributed.ClusterConfig())
        results["one_device"] = np.array("no error")
    except cstorch.ConfigError as e:
        results["one_device"] = np.array(str(e))
    np.savez(out, **results)
    cstorch.distributed.shutdown()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _run_workers(tmp_path: pathlib.Path) -> list[dict]:
    env = dict(os.environ)
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={DEVICES_PER_PROCESS}"
    env["JAX_PLATFORMS"] = "cpu"
    port = _free_port()
    outs = [tmp_path / f"rank{rank}.npz" for rank in range(PROCESSES)]
    with contextlib.ExitStack() as stack:
        logs = [stack.enter_context(open(tmp_path / f"rank{rank}.log", "w+"))
                for rank in range(PROCESSES)]
        _wait_for_workers(port, outs, logs, env, tmp_path)
    return [dict(np.load(out)) for out in outs]


def _wait_for_workers(port: int, outs: list, logs: list, env: dict, cwd: pathlib.Path) -> None:
    procs = [
        subprocess.Popen([sys.executable, __file__, "WORKER", str(port), str(rank), str(out)],
                         env=env, stdout=log, stderr=subprocess.STDOUT, cwd=cwd)
        for rank, (out, log) in enumerate(zip(outs, logs))
    ]
    deadline = time.monotonic() + TIMEOUT_S
    try:
        # A failed process leaves the other waiting on a collective: stop at the first.
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            if any(p.poll() not in (None, 0) for p in procs):
                break
            time.sleep(0.2)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    codes = [p.returncode for p in procs]
    if codes != [0] * PROCESSES:
        report = []
        for rank, log in enumerate(logs):
            log.seek(0)
            text = "".join(ln for ln in log if not ln.startswith("[Gloo]"))  # peer chatter
            report.append(f"---- process {rank} (exit {codes[rank]}) ----\n{text[-6000:]}")
        timed_out = time.monotonic() >= deadline
        pytest.fail((f"timed out after {TIMEOUT_S} s\n" if timed_out else "")
                    + "\n".join(report), pytrace=False)


def test_two_processes_train_like_one_device(tmp_path):
    references = {kind: _train(None, kind=kind)[:3] for kind in {"mlp", *MODELS.values()}}
    reference_closure, reference, reference_state = references["mlp"]
    np.testing.assert_allclose(reference_closure, reference, rtol=0)
    ranks = _run_workers(tmp_path)
    # Both processes read the same values (replicated outputs, gathered state).
    assert set(ranks[0]) == set(ranks[1])
    for key in ranks[0]:
        np.testing.assert_array_equal(ranks[0][key], ranks[1][key], err_msg=key)
    got = ranks[0]
    message = str(got.pop("left_out"))
    for words in ["4 of the 8 devices", "process(es) [1]", "num_replicas or max_wgt_servers = 8"]:
        assert words in message, message
    message = str(got.pop("one_device"))
    for words in ["2-process run", "train the whole model alone", "num_replicas=8"]:
        assert words in message, message
    np.testing.assert_array_equal(got.pop("ws8_layers/trips"), [2, 2])
    for layout in LAYOUTS:
        _, reference, reference_state = references[MODELS.get(layout, "mlp")]
        losses = got[f"{layout}/losses"]
        assert losses.shape == (STEPS,)
        assert rel_err(losses, reference) <= 1e-5, (layout, losses, reference)
        np.testing.assert_array_equal(got[f"{layout}/closure_losses"], losses)
        for name, value in reference_state.items():
            assert rel_err(got[f"{layout}/{name}"], value) <= 1e-5, (layout, name)
    # Checkpoints written by process 0 from state that both processes read.
    for layout in [name for name, (_, feed) in LAYOUTS.items() if feed == "executor"]:
        _, _, reference_state = references[MODELS.get(layout, "mlp")]
        saved = cstorch.load(str(tmp_path / f"{layout}.mdl"))["model"]
        for name, value in reference_state.items():
            if name.startswith("model."):
                assert rel_err(saved[name[len("model."):]], value) <= 1e-5, (layout, name)


def test_initialize_after_jax_started_names_the_fix():
    jax.devices()  # this pytest process has started JAX
    with pytest.raises(cstorch.BackendError) as info:
        cstorch.distributed.initialize("localhost:1234", num_processes=2, process_id=0)
    message = str(info.value)
    assert "before JAX starts" in message and "first thing in the script" in message
    assert not jax.distributed.is_initialized()


@pytest.mark.parametrize("args, words", [
    (("localhost", 2, 0), ["host:port", "'localhost'"]),
    (("localhost:1234", 0, 0), ["num_processes", ">= 1"]),
    (("localhost:1234", 2, 2), ["process_id", "0..1", "its own rank"]),
    (("localhost:1234", 2, -1), ["process_id", "0..1"]),
])
def test_initialize_bad_arguments_are_config_errors(args, words):
    with pytest.raises(cstorch.ConfigError) as info:
        cstorch.distributed.initialize(*args)
    for word in words:
        assert word in str(info.value), str(info.value)


def test_initialize_after_a_backend_exists_is_an_error():
    cstorch.backend("CPU")
    with pytest.raises(cstorch.BackendError, match="a CPU backend exists already"):
        cstorch.distributed.initialize("localhost:1234", num_processes=2, process_id=1)


if __name__ == "__main__" and sys.argv[1:2] == ["WORKER"]:
    _worker(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
