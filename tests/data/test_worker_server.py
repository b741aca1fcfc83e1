"""DataLoader workers never fork from a process in which JAX's runtime runs.

cerebrax forks a worker server from the script when the first backend is made, before
JAX's runtime starts (``cerebrax._fork_server``); workers fork from it. Each case runs a
script in a fresh process: the server is taken once per process, and only where JAX has
not started yet. Each worker reports, from its own copy of its parent's memory, whether
its parent had started JAX's runtime, and how many threads its parent runs."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch")

REPO = pathlib.Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent('''
    import json, os, sys
    import torch
    import cerebrax as cstorch

    def threads(pid):
        return len(os.listdir(f"/proc/{pid}/task"))

    def jax_started():  # in a worker: whether the process it was forked from had
        bridge = sys.modules.get("jax._src.xla_bridge")
        return bool(bridge is not None and bridge.backends_are_initialized())

    class Report(torch.utils.data.Dataset):
        def __len__(self):
            return 8

        def __getitem__(self, i):
            parent = os.getppid()
            with open(f"/proc/{parent}/cmdline", "rb") as f:
                python_server = b"multiprocessing.forkserver" in f.read()
            return torch.tensor([i, parent, threads(parent), jax_started(), python_server])

    def loader():
        return torch.utils.data.DataLoader(Report(), batch_size=2, num_workers=2)


    def main():
        if "--jax-first" in sys.argv:
            import jax
            jax.devices()  # the runtime starts before any backend is made
        backend = cstorch.backend("CPU")
        model = torch.nn.Linear(2, 1)
        compiled = cstorch.compile(model, backend)
        optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)

        @cstorch.trace
        def step(x):
            loss = compiled(x).square().mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            return loss

        step(torch.ones(4, 2))  # JAX's runtime runs here from now on
        import jax
        rows = []
        for batch in cstorch.utils.data.DataLoader(loader):
            rows += batch.tolist()
        print(json.dumps({"pid": os.getpid(), "threads": threads(os.getpid()),
                          "jax_started": jax.devices() is not None and jax_started(),
                          "rows": rows}))

    if __name__ == "__main__":
        main()
''')


def run(tmp_path: pathlib.Path, *args: str, script: str = SCRIPT, check: bool = True,
        **env: str) -> subprocess.CompletedProcess:
    path = tmp_path / "train.py"
    path.write_text(script)
    environment = {**os.environ, "CEREBRAX_COMPILE_CACHE": "0", **env}
    result = subprocess.run([sys.executable, "-m", "cerebrax", "run", str(path), *args],
                            cwd=tmp_path, capture_output=True, text=True, timeout=300,
                            env=environment)
    if check:
        assert result.returncode == 0, result.stderr[-3000:]
    return result


def report(result: subprocess.CompletedProcess) -> dict:
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_workers_fork_from_the_script_as_it_was_before_jax_started(tmp_path):
    out = report(run(tmp_path))
    assert out["jax_started"] and out["threads"] > 4  # JAX's threads run in the script
    rows = out["rows"]
    assert sorted(r[0] for r in rows) == list(range(8))  # every sample, once
    servers = {r[1] for r in rows}
    assert len(servers) == 1 and out["pid"] not in servers
    for _, _, parent_threads, parent_jax, python_server in rows:
        assert parent_jax == 0  # the parent had not started JAX's runtime
        assert parent_threads == 1  # nor any other thread
        assert python_server == 0  # a fork of the script, not Python's forkserver


@pytest.mark.parametrize("how", ["runtime started first", "turned off"])
def test_elsewhere_pythons_forkserver_starts_the_workers(tmp_path, how):
    # JAX started before the backend was made, or CEREBRAX_WORKER_SERVER=0: the script
    # cannot (or may not) be copied, and Python's forkserver, a new interpreter, serves.
    if how == "turned off":
        out = report(run(tmp_path, CEREBRAX_WORKER_SERVER="0"))
    else:
        out = report(run(tmp_path, "--jax-first"))
    rows = out["rows"]
    assert sorted(r[0] for r in rows) == list(range(8))
    for _, parent, _, parent_jax, python_server in rows:
        assert parent != out["pid"] and parent_jax == 0 and python_server == 1


def test_a_dataset_class_defined_after_the_backend_names_the_fix(tmp_path):
    late = SCRIPT.replace("DataLoader(Report(),", "DataLoader(Late(),").replace(
        "    step(torch.ones(4, 2))",
        "    global Late\n\n"
        "    class Late(Report):  # defined after the backend was made\n"
        "        pass\n\n"
        "    step(torch.ones(4, 2))")
    assert "class Late" in late and "DataLoader(Late()," in late
    result = run(tmp_path, script=late, check=False)
    assert result.returncode != 0
    message = " ".join(result.stderr.split())
    assert message.startswith("cerebrax run: error: The torch DataLoader uses num_workers=2")
    assert "lacks Late (defined or redefined after the backend was made)" in message
    assert "define Late in a module of its own" in message


def test_a_thread_blocked_on_stdin_does_not_stop_the_server(tmp_path):
    # A thread reading stdin holds its buffer's lock when the server is forked; the
    # server must not wait for it (Python's forkserver loop closes stdin first).
    reader = SCRIPT.replace("    backend = cstorch.backend(\"CPU\")", textwrap.indent(
        "import threading\n"
        "threading.Thread(target=sys.stdin.read, daemon=True).start()\n"
        "import time; time.sleep(0.5)\n"
        "backend = cstorch.backend(\"CPU\")", "    "))
    assert "threading.Thread(target=sys.stdin.read" in reader
    path = tmp_path / "train.py"
    path.write_text(reader)
    stdin, keep_open = os.pipe()  # nothing is ever written, and it is not closed early
    try:
        result = subprocess.run([sys.executable, "-m", "cerebrax", "run", str(path)],
                                cwd=tmp_path, stdin=stdin, capture_output=True, text=True,
                                env={**os.environ, "CEREBRAX_COMPILE_CACHE": "0"},
                                timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("the workers never started: the server waited for stdin's lock")
    finally:
        os.close(stdin)
        os.close(keep_open)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = report(result)["rows"]
    assert sorted(r[0] for r in rows) == list(range(8))
    assert all(r[4] == 0 for r in rows)  # served by the worker server
