"""GPT-2 124M training on one device: torch eager, torch.compile, jax.jit + optax, cerebrax.

One process trains Hugging Face's ``GPT2LMHeadModel`` (built from a ``GPT2Config`` with
random weights, dropout off, HF's default sdpa attention) with AdamW, in float32 and in
bf16 mixed precision, at sequence length 1024, four ways:

1. torch eager: ``torch.optim.AdamW`` (fused on CUDA); bf16 through ``torch.autocast``.
2. torch.compile of the module (the optimizer step stays eager), otherwise as 1. A
   failure (no C compiler, an inductor error) gives a "skipped: reason" row.
3. jax.jit + optax: the pure-JAX GPT-2 of this file (token + position embeddings, 12
   pre-LN blocks, causal attention, tanh-GELU MLP, final LN, tied head) loaded with
   the HF module's initial weights, and ``optax.adamw``; bf16 keeps float32 master
   parameters and casts them to bf16 for the forward and backward pass. On GPU the
   bf16 attention is cuDNN's flash attention where JAX accepts it, else XLA's.
4. cerebrax: ``cstorch.compile`` of the HF module, ``cstorch.optim.AdamW``, a
   ``@cstorch.trace`` step (``loss.backward(); optimizer.step(); optimizer.zero_grad()``),
   losses read in a ``@cstorch.step_closure``; bf16 through
   ``cstorch.amp.set_half_dtype("bfloat16")`` (README: float32 weights, bf16 compute).

The bf16 modes differ: torch autocast keeps the residual stream, layer norms, softmax
and loss in float32; the JAX model computes in bf16 but for the layer-norm statistics,
the attention softmax and the loss; cerebrax casts the weights and inputs of the float32
export to bf16, where HF's ``logits.float()`` is not an op (it is a no-op on float32), so
the log-softmax over the vocabulary runs in bf16 too. In float32 on GPU both
torch (``set_float32_matmul_precision("high")``, set here) and JAX (its default) run
matmuls on TF32 tensor cores, so float32 MFU is against the TF32 peak.

Each row reports steps/s and tokens/s over ``--steps`` timed steps after warm-up steps;
MFU = tokens/s * FLOPs per token / the device's dense peak, with FLOPs per token
= 6 * N + 12 * layers * seq * d_model (N: the parameters except the position
embeddings, a lookup; the token embedding counts as it is also the output head; the
second term is attention's score and value matmuls, counted without the causal half);
peaks are NVIDIA's published dense (no sparsity) bf16 and TF32 figures, matched on
``torch.cuda.get_device_name()``, or ``--peak-tflops``; on CPU MFU is n/a unless given.
"first step" is the time from building the system (copying the model to it, tracing,
compiling) to the end of its first step. Peak memory: torch rows
``torch.cuda.max_memory_allocated`` (reset per row); JAX rows the JAX allocator's
``peak_bytes_in_use``, which only grows in a process: a row whose run did not raise it
is marked "<=" (a process-wide bound); on CPU the process's resident-set peak, also
process-wide. ``loss[0]`` and ``loss[-1]`` are each row's first and last loss: all rows
start from the same weights and run the same steps on the same four batches (their first
``batch`` sequences), and in the float32 CPU run the rows at torch eager's batch must
agree with it to 1e-5 relative (else exit status 1).

``--cache-rows bf16`` (or ``float32``, or both) adds, at those precisions, the cerebrax
row built twice more, before every other row, each in a fresh process; the two share a
new compile cache (``CEREBRAX_COMPILE_CACHE``; the main rows run without one where it
is set to 0): "cerebrax, cache cold" fills it and "cerebrax, cache warm" is what a rerun
of an unchanged script gets. Their "first step" is what they are for
(their one timed step is no throughput figure).

``--batch auto`` (the default) tries decreasing powers of two from ``--max-batch`` per
row on GPU until one fits (torch OOM or XLA RESOURCE_EXHAUSTED); on CPU it is the tiny
batch. Without a GPU the default is ``--tiny`` (2 layers, d_model 64, vocab 512, seq 32,
batch 2, 3 timed steps), which CI runs to prove every path.

Install on a CUDA 12 machine (versions from constraints.txt) and run:

    pip install -c constraints.txt -e ".[dev]"
    pip install -c constraints.txt "jax[cuda12]==0.10.2"
    python benchmarks/bench_gpu.py --out gpu.json --results   # RESULTS.md, section "gpu"
    python benchmarks/bench_gpu.py --tiny                     # CPU smoke run, seconds
"""

from __future__ import annotations

import os

# torch shares the GPU: JAX allocates as it goes, up to 95% (its default caps it at 75%).
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.95")

import argparse
import copy
import dataclasses
import functools
import gc
import json
import pathlib
import platform
import re
import resource
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import jaxlib
import numpy as np
import optax
import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "torch_bridge"))
import vision

vision.load()  # a CUDA torchvision wheel beside the CPU torch: transformers imports it
import transformers
from results import write_section

import cerebrax as cstorch

SYSTEMS = ("torch eager", "torch.compile", "jax.jit + optax", "cerebrax")
CACHE_ROWS = ("cerebrax, cache cold", "cerebrax, cache warm")
PRECISIONS = ("float32", "bf16")
ADAMW = {"lr": 6e-4, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1}
LOSS_RTOL = 1e-5
GIB = 1 << 30

# Published dense peaks in TFLOPS (bf16, tf32), first match of the device name wins.
PEAKS = [
    (r"H200 NVL", 835.5, 417.5),
    (r"H200", 989.4, 494.7),  # also GH200: the same H100-class compute
    (r"H100 NVL", 835.5, 417.5),
    (r"H100 PCIe", 756.5, 378.0),
    (r"H100|H800", 989.4, 494.7),  # SXM
    (r"A100|A800", 312.0, 156.0),
    (r"L40S", 362.1, 183.0),
    (r"L40\b", 181.0, 90.5),
    (r"L4\b", 121.0, 60.0),
    (r"A10\b", 125.0, 62.5),
    (r"RTX 4090", 165.2, 82.6),
]


@dataclasses.dataclass(frozen=True)
class Size:
    layers: int
    d_model: int
    heads: int
    vocab: int
    seq: int
    batch: int  # the batch on CPU; GPU rows search from --max-batch
    steps: int
    warmup: int


FULL = Size(layers=12, d_model=768, heads=12, vocab=50257, seq=1024, batch=8, steps=20,
            warmup=3)
TINY = Size(layers=2, d_model=64, heads=2, vocab=512, seq=32, batch=2, steps=3, warmup=1)


@dataclasses.dataclass
class Run:
    """What every row shares: the model, the data and the devices."""

    size: Size
    module: torch.nn.Module  # the initial weights every system starts from
    tokens: np.ndarray  # (batches, largest batch, seq) int64
    torch_device: torch.device
    backend: str  # cerebrax's: "GPU" or "CPU"

    @property
    def cuda(self) -> bool:
        return self.torch_device.type == "cuda"


@dataclasses.dataclass
class Row:
    system: str
    precision: str
    batch: int | None = None
    steps_per_s: float | None = None
    tokens_per_s: float | None = None
    mfu: float | None = None
    first_step_s: float | None = None
    peak_mem_gib: float | None = None
    mem_scope: str = ""
    loss0: float | None = None
    loss_last: float | None = None  # after 1 + warmup + steps steps
    oom_batches: list[int] = dataclasses.field(default_factory=list)
    note: str = ""
    skipped: str | None = None


# ---- the hand-written JAX GPT-2 -------------------------------------------------------

def jax_params(module: torch.nn.Module) -> dict[str, jax.Array]:
    """The HF module's weights keyed by their HF names without ``transformer.`` (the
    tied ``lm_head.weight`` is ``wte.weight``); Conv1D weights are (in, out)."""
    return {name.removeprefix("transformer."): jnp.asarray(p.detach().cpu().numpy())
            for name, p in module.named_parameters()}


def _layer_norm(x: jax.Array, p: dict, name: str) -> jax.Array:
    x32 = x.astype(jnp.float32)  # statistics in float32 at any compute dtype
    mean = x32.mean(-1, keepdims=True)
    var = jnp.square(x32 - mean).mean(-1, keepdims=True)
    y = (x32 - mean) * jax.lax.rsqrt(var + 1e-5)
    return (y * p[f"{name}.weight"] + p[f"{name}.bias"]).astype(x.dtype)


def _linear(x: jax.Array, p: dict, name: str) -> jax.Array:
    return x @ p[f"{name}.weight"] + p[f"{name}.bias"]  # HF's Conv1D: y = x W + b


def _attention(x: jax.Array, p: dict, name: str, heads: int, impl: str) -> jax.Array:
    b, t, d = x.shape
    q, k, v = jnp.split(_linear(x, p, f"{name}.c_attn"), 3, axis=-1)
    q, k, v = (z.reshape(b, t, heads, d // heads) for z in (q, k, v))
    y = jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation=impl)
    return _linear(y.reshape(b, t, d), p, f"{name}.c_proj")


def gpt2_loss(params: dict, tokens: jax.Array, *, layers: int, heads: int,
              dtype: Any, attention: str) -> jax.Array:
    """Mean next-token cross-entropy of GPT-2 on ``tokens`` (B, T), as HF's
    ``GPT2LMHeadModel(input_ids=tokens, labels=tokens).loss``; computes in ``dtype``."""
    p = jax.tree.map(lambda w: w.astype(dtype), params)
    x = p["wte.weight"][tokens] + p["wpe.weight"][: tokens.shape[1]]
    for i in range(layers):
        x = x + _attention(_layer_norm(x, p, f"h.{i}.ln_1"), p, f"h.{i}.attn", heads,
                           attention)
        h = jax.nn.gelu(_linear(_layer_norm(x, p, f"h.{i}.ln_2"), p, f"h.{i}.mlp.c_fc"),
                        approximate=True)
        x = x + _linear(h, p, f"h.{i}.mlp.c_proj")
    logits = (_layer_norm(x, p, "ln_f") @ p["wte.weight"].T)[:, :-1]
    return optax.softmax_cross_entropy_with_integer_labels(
        logits.astype(jnp.float32), tokens[:, 1:]).mean()


# ---- the four systems: build, step(i) -> handle, read(handle) -> loss ------------------

class TorchEager:
    note = ""

    def __init__(self, run: Run, batch: int, precision: str, *, compiled: bool = False):
        self.device = run.torch_device
        self.model = copy.deepcopy(run.module).to(self.device).train()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), **ADAMW,
                                           fused=run.cuda or None)
        if compiled:
            torch._dynamo.reset()  # a fresh cache: batch retries would hit its size limit
        self.forward = torch.compile(self.model) if compiled else self.model
        self.bf16 = precision == "bf16"
        self.batches = [torch.from_numpy(t[:batch]).to(self.device) for t in run.tokens]

    def step(self, i: int) -> torch.Tensor:
        x = self.batches[i % len(self.batches)]
        with torch.autocast(self.device.type, torch.bfloat16, enabled=self.bf16):
            loss = self.forward(input_ids=x, labels=x, use_cache=False).loss
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    def read(self, loss: torch.Tensor) -> float:
        return loss.item()  # a host-device sync point


class JaxOptax:
    def __init__(self, run: Run, batch: int, precision: str):
        size, bf16 = run.size, precision == "bf16"
        self.batches = [jnp.asarray(t[:batch], jnp.int32) for t in run.tokens]
        self.params = jax_params(run.module)
        tx = optax.adamw(ADAMW["lr"], *ADAMW["betas"], eps=ADAMW["eps"],
                         weight_decay=ADAMW["weight_decay"])
        self.opt_state = tx.init(self.params)

        def train_step(params, opt_state, tokens, *, attention):
            loss, grads = jax.value_and_grad(gpt2_loss)(
                params, tokens, layers=size.layers, heads=size.heads,
                dtype=jnp.bfloat16 if bf16 else jnp.float32, attention=attention)
            updates, opt_state = tx.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state, loss

        def compiled(attention: str) -> Any:
            step = functools.partial(train_step, attention=attention)
            return jax.jit(step, donate_argnums=(0, 1)).lower(
                self.params, self.opt_state, self.batches[0]).compile()

        attention = "cudnn" if bf16 and jax.default_backend() == "gpu" else "xla"
        try:  # cuDNN flash attention checks its shapes, dtypes and version
            self.train_step = compiled(attention)
            self.note = f"attention: {attention}"
        except Exception as e:  # any refusal falls back to XLA's
            if attention == "xla" or _is_oom(e):
                raise
            self.train_step = compiled("xla")
            self.note = f"attention: xla (cudnn refused: {_first_line(e)})"

    def step(self, i: int) -> jax.Array:
        self.params, self.opt_state, loss = self.train_step(
            self.params, self.opt_state, self.batches[i % len(self.batches)])
        return loss

    def read(self, loss: jax.Array) -> float:
        return float(loss)  # a host-device sync point


class Cerebrax:
    note = ""

    def __init__(self, run: Run, batch: int, precision: str):
        cstorch.reset()  # drops the state of earlier rows: one backend per process
        backend = cstorch.backend(run.backend)
        cstorch.amp.set_half_dtype("bfloat16" if precision == "bf16" else "float32")
        model = copy.deepcopy(run.module).train()
        compiled = cstorch.compile(model, backend)
        optimizer = cstorch.optim.AdamW(model.parameters(), **ADAMW)
        self.batches = [torch.from_numpy(t[:batch]) for t in run.tokens]
        self.losses: list[float] = []

        @cstorch.trace
        def training_step(input_ids):
            loss = compiled(input_ids=input_ids, labels=input_ids).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            return loss

        @cstorch.step_closure
        def record_loss(loss):
            self.losses.append(float(loss))

        self.training_step, self.record_loss = training_step, record_loss

    def step(self, i: int) -> Any:
        return self.training_step(self.batches[i % len(self.batches)])

    def read(self, loss: Any) -> float:
        self.record_loss(loss)  # between steps it runs at once: a host-device sync point
        return self.losses[-1]


BUILDERS: dict[str, Callable[[Run, int, str], Any]] = {
    "torch eager": TorchEager,
    "torch.compile": lambda run, b, p: TorchEager(run, b, p, compiled=True),
    "jax.jit + optax": JaxOptax,
    "cerebrax": Cerebrax,
}


# ---- measuring one row ----------------------------------------------------------------

def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:200]


def _is_oom(e: BaseException | None) -> bool:
    while e is not None:  # cerebrax may raise its own error from XLA's
        if isinstance(e, torch.OutOfMemoryError) or "RESOURCE_EXHAUSTED" in str(e):
            return True
        e = e.__cause__ or e.__context__
    return False


def _free(run: Run) -> None:
    gc.collect()
    if run.cuda:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def _jax_peak() -> int | None:
    stats = jax.devices()[0].memory_stats()
    return None if stats is None else stats.get("peak_bytes_in_use")


def _memory(run: Run, system: str, jax_before: int | None) -> tuple[float, str]:
    """The row's peak memory in GiB and what it covers (see the module docs)."""
    if system.startswith("torch") and run.cuda:
        return torch.cuda.max_memory_allocated() / GIB, "row, torch allocator"
    peak = _jax_peak()
    if not system.startswith("torch") and peak is not None:
        scope = "row, JAX allocator" if peak > (jax_before or 0) else "<=, process JAX peak"
        return peak / GIB, scope
    return (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB,
            "process RSS peak")


def _batches_to_try(run: Run, batch: int | None, max_batch: int) -> list[int]:
    if batch is not None:
        return [batch]
    if not run.cuda and jax.default_backend() != "gpu":
        return [run.size.batch]
    return [max_batch >> k for k in range(max_batch.bit_length()) if max_batch >> k]


def _time(run: Run, system: str, precision: str, batch: int) -> tuple:
    """Builds the system and runs it: (system, first loss, first step s, timed s, last
    loss)."""
    size = run.size
    start = time.perf_counter()
    state = BUILDERS[system](run, batch, precision)
    loss0 = state.read(state.step(0))
    first_step_s = time.perf_counter() - start
    for i in range(1, 1 + size.warmup):
        loss = state.step(i)
    state.read(loss)
    start = time.perf_counter()
    for i in range(1 + size.warmup, 1 + size.warmup + size.steps):
        loss = state.step(i)
    last = state.read(loss)  # waits for the last step
    return state, loss0, first_step_s, time.perf_counter() - start, last


def measure(run: Run, system: str, precision: str, batch: int | None,
            max_batch: int) -> Row:
    """One row, at the largest batch that fits (see the module docs)."""
    row = Row(system, precision)
    for b in _batches_to_try(run, batch, max_batch):
        _free(run)  # also what a failed try left, now that its traceback is gone
        if run.cuda:
            torch.cuda.reset_peak_memory_stats()
        jax_before = _jax_peak()
        try:
            state, row.loss0, row.first_step_s, elapsed, row.loss_last = _time(
                run, system, precision, b)
            break
        except Exception as e:  # noqa: BLE001 - every failure becomes a row
            if not _is_oom(e):
                traceback.print_exc()
                row.skipped = _first_line(e)
                return row
            row.oom_batches.append(b)
    else:
        row.skipped = f"out of memory at every batch tried ({row.oom_batches})"
        return row
    row.batch, row.note = b, state.note
    row.steps_per_s = run.size.steps / elapsed
    row.tokens_per_s = row.steps_per_s * b * run.size.seq
    row.peak_mem_gib, row.mem_scope = _memory(run, system, jax_before)
    del state
    _free(run)
    return row


def cache_rows(precision: str, batch: int | None, max_batch: int, size: Size) -> list[Row]:
    """The cerebrax row twice more, each in a fresh process, over one new compile cache:
    the first fills it, the second starts from it (see the module docs). They run
    before this process holds any device memory: JAX keeps what a row allocated."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="cerebrax_cache_") as cache:
        for name in CACHE_ROWS:
            with tempfile.NamedTemporaryFile(suffix=".json") as out:
                command = [sys.executable, __file__, "--full" if size.seq > 32 else "--tiny",
                           "--skip", ",".join(s for s in SYSTEMS if s != "cerebrax"),
                           "--precisions", precision, "--batch", str(batch or "auto"),
                           "--max-batch", str(max_batch), "--steps", "1", "--out", out.name]
                env = {**os.environ, "CEREBRAX_COMPILE_CACHE": cache}
                proc = subprocess.run(command, env=env, capture_output=True, text=True,
                                      check=False)
                if proc.returncode != 0:
                    lines = (proc.stderr or proc.stdout).strip().splitlines()
                    rows.append(Row(name, precision,
                                    skipped=f"exit {proc.returncode}: "
                                            f"{lines[-1][:150] if lines else ''}"))
                    continue
                found = [r for r in json.loads(pathlib.Path(out.name).read_text())["rows"]
                         if r["system"] == "cerebrax"]
                rows.append(dataclasses.replace(Row(**found[0]), system=name,
                                                note="one timed step"))
    return rows


# ---- the device, MFU and the report ---------------------------------------------------

def device_name(run: Run) -> str:
    jax_kind = jax.devices()[0].device_kind
    if run.cuda:
        return f"{torch.cuda.get_device_name()} (JAX: {jax_kind})"
    return f"CPU, {platform.machine()}, {os.cpu_count()} cores (JAX: {jax_kind})"


def peak_tflops(run: Run, precision: str, override: float | None) -> float | None:
    if override is not None:
        return override
    if not run.cuda:
        return None
    name = torch.cuda.get_device_name()
    for pattern, bf16, tf32 in PEAKS:
        if re.search(pattern, name):
            return bf16 if precision == "bf16" else tf32
    return None


def flops_per_token(run: Run) -> int:
    size, module = run.size, run.module
    n = sum(p.numel() for p in module.parameters()) - module.transformer.wpe.weight.numel()
    return 6 * n + 12 * size.layers * size.seq * size.d_model


def loss_check(rows: list[Row], run: Run) -> dict[str, Any]:
    """The largest relative difference of each float32 row's first and last loss to
    torch eager's, where the batch is the same; ``ok`` only on CPU, where float32 is
    float32 everywhere (GPU matmuls run in TF32)."""
    f32 = {r.system: r for r in rows if r.precision == "float32" and not r.skipped}
    ref = f32.get("torch eager")
    diffs = {name: max(abs(r.loss0 - ref.loss0) / abs(ref.loss0),
                       abs(r.loss_last - ref.loss_last) / abs(ref.loss_last))
             for name, r in f32.items()
             if ref and name != "torch eager" and r.batch == ref.batch}
    cpu = not run.cuda and jax.default_backend() == "cpu"
    ok = all(d <= LOSS_RTOL for d in diffs.values()) if cpu and diffs else None
    return {"rel_diff_to_torch_eager": diffs, "rtol": LOSS_RTOL, "ok": ok}


def _fmt(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


COLUMNS = ("system", "precision", "batch", "steps/s", "tokens/s", "MFU", "first step s",
           "peak mem GiB (scope)", "loss[0]", "loss[-1]")


def table(rows: list[Row]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|---" * len(COLUMNS) + "|"]
    for r in rows:
        if r.skipped:
            cells = [r.system, r.precision, f"skipped: {r.skipped}"]
        else:
            cells = [r.system, r.precision, str(r.batch), f"{r.steps_per_s:.3g}",
                     f"{r.tokens_per_s:,.0f}", _fmt(r.mfu, ".1%"), f"{r.first_step_s:.3g}",
                     f"{r.peak_mem_gib:.2f} ({r.mem_scope})", f"{r.loss0:.6f}",
                     f"{r.loss_last:.6f}"]
        cells += [""] * (len(COLUMNS) - len(cells))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def report(run: Run, rows: list[Row], check: dict) -> str:
    s = run.size
    versions = (f"jax {jax.__version__}, jaxlib {jaxlib.__version__}, torch "
                f"{torch.__version__}, transformers {transformers.__version__}, optax "
                f"{optax.__version__}, cerebrax {cstorch.__version__}")
    setup = (f"Device: {device_name(run)}. Versions: {versions}. Model: HF GPT2LMHeadModel, "
             f"{s.layers} layers, d_model {s.d_model}, {s.heads} heads, vocab {s.vocab}, "
             f"seq {s.seq}, dropout 0; AdamW {ADAMW}; {s.steps} timed steps after "
             f"{s.warmup + 1} untimed. FLOPs/token = 6N + 12*layers*seq*d_model = "
             f"{flops_per_token(run):,}. Command: `python benchmarks/bench_gpu.py "
             f"{' '.join(sys.argv[1:])}`.")
    diffs = ", ".join(f"{k} {v:.1e}" for k, v in check["rel_diff_to_torch_eager"].items())
    verdict = {True: "agree", False: "DISAGREE",
               None: "not checked: TF32 on GPU, or no rows to compare"}[check["ok"]]
    losses = (f"float32 loss[0] and loss[-1], largest difference relative to torch eager "
              f"at the same batch: {diffs or 'n/a'} (tolerance {LOSS_RTOL:g}: {verdict}). "
              "Memory: torch rows are reset per row; '<=' and 'process' mark "
              "process-wide peaks.")
    notes = [f"- {r.system}, {r.precision}: {r.note}"
             + (f"; out of memory at batch {r.oom_batches}" if r.oom_batches else "")
             for r in rows if r.note or r.oom_batches]
    title = "## GPT-2 training: torch eager, torch.compile, jax.jit + optax, cerebrax"
    return "\n".join([title, "", setup, "", table(rows), "", losses, *notes])


def build_run(size: Size, batch_rows: int) -> Run:
    """The initial module (seed 0) and four batches of ``batch_rows`` sequences; a row
    at a smaller batch uses the first rows of each."""
    transformers.logging.set_verbosity_error()
    config = transformers.GPT2Config(
        n_layer=size.layers, n_embd=size.d_model, n_head=size.heads,
        vocab_size=size.vocab, n_positions=size.seq, resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    module = transformers.GPT2LMHeadModel(config)
    tokens = np.random.default_rng(0).integers(0, size.vocab, (4, batch_rows, size.seq))
    cuda = torch.cuda.is_available()
    return Run(size, module, tokens, torch.device("cuda" if cuda else "cpu"),
               "GPU" if jax.default_backend() == "gpu" else "CPU")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    size_group = parser.add_mutually_exclusive_group()
    size_group.add_argument("--tiny", action="store_true", help="the CI-sized model")
    size_group.add_argument("--full", action="store_true", help="GPT-2 124M, seq 1024")
    parser.add_argument("--batch", default="auto", help="an int, or auto (see docs)")
    parser.add_argument("--max-batch", type=int, default=64, help="where auto starts")
    parser.add_argument("--steps", type=int, help="timed steps per row")
    parser.add_argument("--skip", default="", help="comma-separated systems to skip")
    parser.add_argument("--precisions", default="bf16,float32",
                        help="comma-separated: bf16, float32")
    parser.add_argument("--cache-rows", default="",
                        help="precisions at which to add cerebrax's first step with a cold "
                             "and a warm compile cache")
    parser.add_argument("--peak-tflops", type=float, help="peak for MFU, every row")
    parser.add_argument("--out", help="write the rows as JSON here")
    parser.add_argument("--results", action="store_true",
                        help="write the table into benchmarks/RESULTS.md (section gpu)")
    args = parser.parse_args()
    def listed(flag: str, text: str, allowed: tuple[str, ...]) -> list[str]:
        names = [name.strip() for name in text.split(",") if name.strip()]
        if set(names) - set(allowed):
            parser.error(f"{flag} takes {', '.join(allowed)}; got {text!r}")
        return names

    skip = set(listed("--skip", args.skip, SYSTEMS))
    precisions = listed("--precisions", args.precisions, PRECISIONS)
    if not precisions:
        parser.error("--precisions takes at least one of " + ", ".join(PRECISIONS))
    cache_precisions = listed("--cache-rows", args.cache_rows, PRECISIONS)

    gpu = torch.cuda.is_available() or jax.default_backend() == "gpu"
    size = FULL if args.full or (gpu and not args.tiny) else TINY
    if args.steps:
        size = dataclasses.replace(size, steps=args.steps)
    if args.batch != "auto" and not args.batch.isdigit():
        parser.error(f"--batch takes a positive int or auto, got {args.batch!r}")
    batch = None if args.batch == "auto" else int(args.batch)
    run = build_run(size, batch or (args.max_batch if gpu else size.batch))
    if run.cuda:
        torch.set_float32_matmul_precision("high")  # TF32, as JAX's default on GPU
    if run.cuda != (run.backend == "GPU"):
        print(f"warning: torch on {run.torch_device}, JAX on {jax.default_backend()}")
    print(f"device: {device_name(run)}; {size}")

    rows = []
    for precision in cache_precisions:
        for extra in cache_rows(precision, batch, args.max_batch, size):
            print(f"{extra.system}, {precision}: first step "
                  f"{_fmt(extra.first_step_s, '.3g')} s {extra.skipped or ''}", flush=True)
            rows.append(extra)
    # torch rows first (their memory is returned between rows), then JAX's, bf16 before
    # float32 so that the larger peak comes later (JAX's peak only grows).
    for system in SYSTEMS:
        for precision in [p for p in PRECISIONS[::-1] if p in precisions]:
            if system in skip:
                rows.append(Row(system, precision, skipped="--skip"))
                continue
            row = measure(run, system, precision, batch, args.max_batch)
            peak = peak_tflops(run, precision, args.peak_tflops)
            if row.tokens_per_s and peak:
                row.mfu = row.tokens_per_s * flops_per_token(run) / (peak * 1e12)
            print(f"{system}, {precision}: "
                  + (f"skipped: {row.skipped}" if row.skipped else
                     f"{row.steps_per_s:.3g} steps/s, loss[0] {row.loss0:.6f}"), flush=True)
            rows.append(row)
    order = SYSTEMS + CACHE_ROWS
    rows.sort(key=lambda r: (PRECISIONS.index(r.precision), order.index(r.system)))
    check = loss_check(rows, run)
    text = report(run, rows, check)
    print("\n" + text)
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps({
            "device": device_name(run), "size": dataclasses.asdict(size),
            "flops_per_token": flops_per_token(run), "loss_check": check,
            "rows": [dataclasses.asdict(r) for r in rows]}, indent=1))
    if args.results:
        write_section(ROOT / "benchmarks" / "RESULTS.md", "gpu", text)
    return 1 if check["ok"] is False else 0


if __name__ == "__main__":
    sys.exit(main())
