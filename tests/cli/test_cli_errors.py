"""Failures of `cerebrax fit` print one message, not a traceback.

Each test runs the digits config (`configs/digits_mlp.yaml`) on the CPU backend in a
subprocess and breaks one thing: the checkpoint, the model config, model_dir, the disk,
the data, or the run itself (Ctrl-C). The command must exit with one short message on
stderr that names what failed (a path, a key, an argument) and no traceback.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import cerebrax as cstorch

pytest.importorskip("sklearn")  # the digits data

REPO = pathlib.Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "digits_mlp.yaml"
NUM_STEPS = 10

# Input functions that hand the step Python lists instead of arrays.
LIST_JOB = '''
import jax.numpy as jnp
import optax
from flax import nnx

from examples.digits import input_fn, mlp, split_digits


def nested_lists(**kwargs):
    """Images as Python lists of floats: each pixel a constant of the graph."""
    return [(x.tolist(), y) for x, y in input_fn(**kwargs)]


def lists_of_samples(batch_size=64, **kwargs):
    """Lists of per-sample arrays, the last list shorter (3 batches)."""
    (x, y), _ = split_digits()
    n = 2 * batch_size + 7
    return [
        ([x[j] for j in range(i, min(i + batch_size, n))],
         [y[j] for j in range(i, min(i + batch_size, n))])
        for i in range(0, n, batch_size)
    ]


class Stacking(nnx.Module):
    def __init__(self, hidden, seed):
        self.inner = mlp(hidden, seed)

    def __call__(self, samples):
        return self.inner(jnp.stack(samples))


def stacking(hidden=128, seed=0):
    return Stacking(hidden, seed)


def stacked_loss(logits, labels):
    labels = jnp.stack(labels)
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
'''


def _fit(*args, cwd, compile_dir, file_size_limit=None) -> subprocess.CompletedProcess:
    command = _command(*args, compile_dir=compile_dir)
    if file_size_limit is not None:
        # The shell sets the limit, then becomes the command: no Python runs between fork
        # and exec in this (multithreaded) test process.
        command = ["sh", "-c", f'ulimit -f {file_size_limit} && exec "$@"', "sh", *command]
    return subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=180,
        cwd=cwd,
        env=_env(),
    )


def _command(*args, compile_dir, num_steps=NUM_STEPS, checkpoint_steps=NUM_STEPS) -> list:
    overrides = [
        "runconfig.backend=CPU",
        f"runconfig.num_steps={num_steps}",
        f"runconfig.checkpoint_steps={checkpoint_steps}",
        f"runconfig.log_steps={NUM_STEPS}",
        f"runconfig.compile_dir={compile_dir}",
    ]
    return [sys.executable, "-m", "cerebrax", "fit", CONFIG, *overrides, *map(str, args)]


def _env() -> dict:
    # This checkout first on the path: the command under test is its cerebrax.
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path}


def _assert_one_message(out: subprocess.CompletedProcess, *names: str, status: int = 1):
    assert out.returncode == status, out.stderr[-3000:]
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    assert len(out.stderr.splitlines()) < 15, out.stderr
    assert "cerebrax fit: error: " in out.stderr
    for name in names:
        assert name in out.stderr, out.stderr


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[pathlib.Path, pathlib.Path]:
    """``(working directory, compile_dir)`` after a 10-step run into ``run/``."""
    tmp_path = tmp_path_factory.mktemp("cli_errors")
    out = _fit("--model_dir", tmp_path / "run", cwd=tmp_path, compile_dir=tmp_path / "compile")
    assert out.returncode == 0, out.stderr[-3000:]
    assert (tmp_path / "run" / f"checkpoint_{NUM_STEPS}.mdl").is_file()
    return tmp_path, tmp_path / "compile"


def _checkpoint(tmp_path: pathlib.Path) -> pathlib.Path:
    return tmp_path / "run" / f"checkpoint_{NUM_STEPS}.mdl"


def _truncated(tmp_path: pathlib.Path) -> pathlib.Path:
    path = tmp_path / "truncated.mdl"
    path.write_bytes(_checkpoint(tmp_path).read_bytes()[:3000])
    return path


def _not_a_model(tmp_path: pathlib.Path) -> pathlib.Path:
    path = tmp_path / "weights_only.mdl"
    cstorch.save({"w": np.ones(3, np.float32)}, path)
    return path


def _two_layers(tmp_path: pathlib.Path) -> pathlib.Path:
    """A model of another size: the digits MLP without its third layer."""
    model = cstorch.load(_checkpoint(tmp_path))["model"]
    path = tmp_path / "two_layers.mdl"
    kept = {k: np.asarray(v) for k, v in model.items() if not k.startswith("fc3.")}
    cstorch.save({"model": kept, "global_step": 5}, path)
    return path


@pytest.mark.parametrize(
    "make, overrides, names",
    [
        (lambda t: t / "nope.mdl", [], ["nope.mdl", "no such file", "--checkpoint"]),
        (_truncated, [], ["truncated.mdl", "truncated", "--checkpoint"]),
        (_not_a_model, [], ["weights_only.mdl", "holds no model state", "['w']"]),
        (_checkpoint, ["model.hidden=64"], ["checkpoint_10.mdl", "'fc1.bias'", "(128,)",
                                            "model.hidden"]),
        (_two_layers, [], ["two_layers.mdl", "missing keys", "fc3.kernel"]),
    ],
    ids=["missing", "truncated", "not_a_model", "hidden_changed", "other_model_size"],
)
def test_bad_checkpoint_prints_one_message(trained, make, overrides, names):
    tmp_path, compile_dir = trained
    path = make(tmp_path)
    out = _fit("--checkpoint", path, "--model_dir", tmp_path / "resumed", *overrides,
               cwd=tmp_path, compile_dir=compile_dir)  # fmt: skip
    _assert_one_message(out, *names)


def test_debug_prints_the_traceback_too(trained):
    tmp_path, compile_dir = trained
    out = _fit("--checkpoint", "nope.mdl", "--debug", cwd=tmp_path, compile_dir=compile_dir)
    assert out.returncode == 1
    assert "Traceback" in out.stderr
    assert out.stderr.rstrip().splitlines()[-1].startswith("cerebrax fit: error: No checkpoint")


@contextlib.contextmanager
def _read_only(path: pathlib.Path):
    """``path``, a new directory that no one may write to (mode bits, or, for root,
    the immutable attribute); skips the test where neither is possible."""
    path.mkdir()
    path.chmod(0o555)
    immutable = False
    try:
        if os.geteuid() == 0:  # root writes through the mode bits
            chattr = shutil.which("chattr")
            immutable = bool(chattr) and subprocess.run(
                [chattr, "+i", str(path)], capture_output=True
            ).returncode == 0
            if not immutable:
                pytest.skip("cannot make a directory read-only for root here (chattr +i)")
        yield path
    finally:
        if immutable:
            subprocess.run([shutil.which("chattr"), "-i", str(path)], check=True)
        path.chmod(0o755)


def test_read_only_model_dir_fails_before_training(trained, tmp_path):
    _, compile_dir = trained
    with _read_only(tmp_path / "read_only") as model_dir:
        out = _fit("--model_dir", model_dir, cwd=tmp_path, compile_dir=compile_dir)
    _assert_one_message(out, str(model_dir), "runconfig.model_dir", "writable")
    assert "step" not in out.stdout  # nothing trained


def test_file_where_model_dir_should_be(trained, tmp_path):
    _, compile_dir = trained
    (tmp_path / "a_file").write_text("")
    model_dir = tmp_path / "a_file" / "run"
    out = _fit("--model_dir", model_dir, cwd=tmp_path, compile_dir=compile_dir)
    _assert_one_message(out, str(model_dir), "Not a directory", "A file stands where")


def test_full_disk_at_the_first_checkpoint(trained, tmp_path):
    # The compile cache is warm (the same programs, the same compile_dir: a copy would
    # be another cache key), so the run writes nothing there, and its first file write
    # is the checkpoint's.
    _, compile_dir = trained
    # A file size limit of 64 blocks (32 or 64 KiB): the TensorBoard events (a few
    # hundred bytes) are written, the checkpoint (220 KB) fails (EFBIG) as on a full
    # disk; pipes still work.
    out = _fit("--model_dir", tmp_path / "run", cwd=tmp_path, compile_dir=compile_dir,
               file_size_limit=64)
    _assert_one_message(out, str(tmp_path / "run" / "checkpoint_10.mdl"), "File too large")
    assert f"step {NUM_STEPS:6d}" in out.stdout  # it trained, then could not save
    left = [p.name for p in (tmp_path / "run").iterdir()]
    assert len(left) == 1 and left[0].startswith("events.out.tfevents."), left  # no partial file


def test_full_disk_at_the_start_names_the_event_file(trained, tmp_path):
    _, compile_dir = trained
    # A file size limit of 0: the first write, the TensorBoard event file's, fails.
    out = _fit("--model_dir", tmp_path / "run", cwd=tmp_path, compile_dir=compile_dir,
               file_size_limit=0)
    _assert_one_message(out, "Could not write the TensorBoard event file",
                        str(tmp_path / "run" / "events.out.tfevents."), "File too large",
                        "ulimit -f")
    assert "step " not in out.stdout  # before the first step
    assert not list((tmp_path / "run").iterdir())  # and nothing left behind


def _list_job(tmp_path: pathlib.Path) -> pathlib.Path:
    module = tmp_path / "list_job.py"
    module.write_text(LIST_JOB)
    return module


def test_python_numbers_in_a_list_batch_name_the_argument(trained, tmp_path):
    _, compile_dir = trained
    job = _list_job(tmp_path)
    out = _fit(f"train_input.input_fn={job}:nested_lists", "--model_dir", tmp_path / "run",
               cwd=tmp_path, compile_dir=compile_dir)  # fmt: skip
    _assert_one_message(out, "argument `inputs[0][2]`", "Python list", "np.asarray(inputs)")


def test_list_batches_of_another_length_name_the_argument(trained, tmp_path):
    _, compile_dir = trained
    job = _list_job(tmp_path)
    out = _fit(
        f"train_input.input_fn={job}:lists_of_samples",
        f"model.factory={job}:stacking",
        f"model.loss={job}:stacked_loss",
        "--model_dir",
        tmp_path / "run",
        cwd=tmp_path,
        compile_dir=compile_dir,
    )
    _assert_one_message(
        out, "argument `inputs` as a list of 64 items", "a list of 7 items", "np.stack"
    )
    assert "PyTreeDef" not in out.stderr


def test_ctrl_c_names_the_last_checkpoint(trained, tmp_path):
    _, compile_dir = trained
    model_dir = tmp_path / "run"
    command = _command("--model_dir", model_dir, compile_dir=compile_dir,
                       num_steps=100_000, checkpoint_steps=5)  # fmt: skip
    # As from a terminal: SIGINT reaches Python's handler. A test run started in the
    # background of a non-interactive shell inherits SIGINT ignored (POSIX), and the
    # command, like any program, would then ignore Ctrl-C; a small launcher resets it
    # and execs the command (a preexec_fn would fork the multithreaded test process).
    launcher = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
                "os.execv(sys.argv[1], sys.argv[1:])")
    process = subprocess.Popen(
        [sys.executable, "-c", launcher, *map(str, command)], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=_env(),
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not list(model_dir.glob("checkpoint_*.mdl")):
            assert process.poll() is None, process.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "no checkpoint within 120 s"
            time.sleep(0.1)
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=180)  # a loaded 2-core CI machine
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 130, stderr[-3000:]
    assert "Traceback" not in stderr and len(stderr.splitlines()) < 15, stderr
    newest = max(model_dir.glob("checkpoint_*.mdl"), key=lambda p: int(p.stem.split("_")[1]))
    assert f"The last checkpoint is {newest}" in stderr
    assert f"--checkpoint {newest}" in stderr
    assert int(np.asarray(cstorch.load(newest)["global_step"])) > 0  # a complete file
