"""Op coverage: the bridge against torch eager on torch's own OpInfo sample inputs.

For every OpInfo named in ``opinfo_table.TESTED`` (one test each, so pytest-xdist splits
them over its workers) its CPU samples are wrapped in one module calling the op on each,
exported through ``torch_bridge.convert`` and run under ``jax.jit``; every output must
match torch eager. What each comparison bounds:

- integer and boolean outputs: equal to torch's;
- float32 outputs (and float outputs of integer inputs): elementwise, ``|bridge - torch|
  <= rtol * |torch| + atol``, by default ``rtol=1e-5`` (about 170 units of float32
  roundoff, room for sums taken in another order), ``atol=1e-6``; wider entries of
  ``TOLERANCES`` give their reason;
- bfloat16 and float16 outputs: against the float64 result of the same inputs (the
  sample's tensors converted to float64, torch eager), the bridge's largest error is at
  most ``K`` times torch eager's own largest error, plus ``C`` units of roundoff of the
  output's dtype at the output's largest magnitude: ``max|bridge - exact| <= K *
  max|torch - exact| + C * u * max|exact|`` (``u`` = 2**-11 for float16, 2**-8 for
  bfloat16; K=2, C=2 unless ``HALF_BOUNDS`` says why not). A half-precision result is
  rounded at every operation, and where that happens depends on the CPU (XLA computes
  float16 natively where the CPU has half-precision arithmetic and fused multiply-adds,
  and emulates it in float32 elsewhere), so a distance to torch's own rounded result
  would be a property of one machine; the distance to the exact result is not. An
  output whose float64 run is unavailable (an explicit ``dtype=`` argument keeps it at
  half precision) is compared elementwise with torch at ``DTYPE_TOL``.

Sample caps (``opinfo_table``): at float32 the first 5 samples of each OpInfo
(``FLOAT32_SAMPLES``; all of them where it has fewer), at bfloat16, float16 and int64 the
first sample (``OTHER_DTYPE_SAMPLES``) where torch supports the dtype for the op; samples torch
eager itself rejects on CPU and the ones ``SKIPS`` names do not count. ``SAMPLE_CAPS``
lowers the cap of single OpInfos. The caps keep the file near four minutes of CPU;
``CEREBRAX_OPINFO_ALL=1`` lifts them all and checks every sample at every dtype.

``test_core_coverage_and_skip_lists`` enumerates torch's core ATen set (the overloads
tagged ``torch.Tag.core``), prints how many the bridge lowers and both skip lists
(``pytest -s`` or ``-rA`` shows it), and fails on a core overload with neither a
lowering nor a reason in ``CORE_SKIPS``.

    python tests/torch_bridge/test_bridge_opinfo.py --all   # every OpInfo, for triage
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import sys
import warnings
from typing import Any

import jax
import numpy as np
import pytest
import torch
import torch.utils._pytree as pytree
from opinfo_table import (CORE_SKIPS, DTYPE_TOL, DTYPES, FLOAT32_SAMPLES, HALF_BOUNDS,
                          NEEDS_TORCH, OTHER_DTYPE_SAMPLES, SAMPLE_CAPS, SKIPS, TESTED,
                          TOLERANCES, runs_here)

import torch_bridge
from cerebrax.errors import UnsupportedOpError
from torch_bridge import to_jax

DEFAULT_TOL = (1e-5, 1e-6)  # (rtol, atol)
HALF_BOUND = (2.0, 2.0)  # (K, C) of the half-precision bound (opinfo_table.HALF_BOUNDS)
UNIT_ROUNDOFF = {np.dtype(np.float16): 2.0**-11, np.dtype(jax.numpy.bfloat16): 2.0**-8}


@dataclasses.dataclass(frozen=True)
class Tolerance:
    """How one sample's outputs are compared: elementwise with torch at ``(rtol, atol)``,
    and half-precision outputs against the float64 result with ``(k, c)``."""

    rtol: float
    atol: float
    k: float = HALF_BOUND[0]
    c: float = HALF_BOUND[1]


def opinfo_db() -> list[Any]:
    """torch's OpInfo list (importing it warns about optional test dependencies)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torch.testing._internal.common_methods_invocations import op_db
    return op_db


def full_name(info: Any) -> str:
    return info.name + (f".{info.variant_test_name}" if info.variant_test_name else "")


def is_core(op: Any) -> bool:
    return isinstance(op, torch._ops.OpOverload) and torch.Tag.core in op.tags


class _Calls(torch.nn.Module):
    """Calls ``fn`` on several samples; every tensor of every sample is a module input."""

    def __init__(self, fn, samples):
        super().__init__()
        self.fn = fn
        self.calls = []
        for sample in samples:
            leaves, spec = pytree.tree_flatten(
                (sample.input, tuple(sample.args), dict(sample.kwargs)))
            slots = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]
            self.calls.append((leaves, spec, slots))

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return tuple(leaves[i].detach().clone()
                     for leaves, _, slots in self.calls for i in slots)

    def forward(self, *tensors):
        given = iter(tensors)
        outputs = []
        for leaves, spec, slots in self.calls:
            leaves = list(leaves)
            for i in slots:
                leaves[i] = next(given)
            x, args, kwargs = pytree.tree_unflatten(leaves, spec)
            outputs.append(self.fn(x, *args, **kwargs))
        return tuple(outputs)


@dataclasses.dataclass
class Result:
    """What happened to one OpInfo's samples.

    status: "pass", "mismatch", "unsupported" (an op without a lowering), "export"
    (torch.export refused: data-dependent shapes, ...), "random" (the graph has random
    ops, so values cannot match torch's generator), "error" (the lowering raised).
    """

    status: str
    ops: tuple = ()
    detail: str = ""
    samples: dict = dataclasses.field(default_factory=dict)  # dtype -> samples checked


def _to_numpy(x: Any) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().resolve_conj().resolve_neg()
        return (x.float() if x.dtype in (torch.bfloat16, torch.float16) else x).numpy()
    return np.asarray(x)


def compare(actual: list, expected: list, rtol: float, atol: float) -> str:
    """'' when every output matches, else a description of the first difference."""
    if len(actual) != len(expected):
        return f"{len(actual)} outputs, torch gives {len(expected)}"
    for i, (a, e) in enumerate(zip(actual, expected)):
        a, e = np.asarray(a), _to_numpy(e)
        if a.dtype != e.dtype and e.dtype == np.float32:  # bfloat16, float16
            a = a.astype(np.float32)
        if a.shape != e.shape:
            return f"output {i}: shape {a.shape}, torch gives {e.shape}"
        if e.dtype == np.bool_ or np.issubdtype(e.dtype, np.integer):
            if not np.array_equal(a.astype(e.dtype), e):
                return f"output {i}: integer values differ"
            continue
        if np.iscomplexobj(e) or np.iscomplexobj(a):
            a, e = np.stack([a.real, a.imag]), np.stack([e.real, e.imag])
        a64, e64 = a.astype(np.float64), e.astype(np.float64)
        if not np.array_equal(np.isnan(a64), np.isnan(e64)):
            return f"output {i}: NaN positions differ"
        ok = np.isclose(a64, e64, rtol=rtol, atol=atol, equal_nan=True)
        if not ok.all():
            err = np.abs(a64 - e64)[~ok].max()
            return f"output {i}: max abs error {err:.3g} over rtol={rtol:g} atol={atol:g}"
    return ""


def _half_dtype(x: Any) -> np.dtype | None:
    """The output's dtype where it is bfloat16 or float16, else None."""
    if isinstance(x, torch.Tensor) and x.dtype in (torch.float16, torch.bfloat16):
        return np.dtype(np.float16) if x.dtype == torch.float16 else np.dtype(jax.numpy.bfloat16)
    return None


def compare_half(actual: Any, expected: torch.Tensor, exact: torch.Tensor, k: float,
                 c: float) -> str:
    """'' when a half-precision output is as close to the float64 result as the bound of
    the module docstring allows, else what is wrong.

    NaN and infinite elements (overflow at half precision) must sit where torch's are,
    with torch's values; the bound is taken over the elements finite in all three."""
    u = UNIT_ROUNDOFF[_half_dtype(expected)]
    a = np.asarray(actual).astype(np.float64)
    e, r = _to_numpy(expected).astype(np.float64), _to_numpy(exact).astype(np.float64)
    if a.shape != e.shape:
        return f"shape {a.shape}, torch gives {e.shape}"
    if not np.array_equal(np.isnan(a), np.isnan(e)):
        return "NaN positions differ"
    if not np.array_equal(a[np.isinf(e)], e[np.isinf(e)]):
        return "infinities differ"
    finite = np.isfinite(e) & np.isfinite(r)
    if not finite.any():
        return ""
    ours = float(np.abs(a - r)[finite].max())
    torch_s = float(np.abs(e - r)[finite].max())
    scale = float(np.abs(r[finite]).max())
    bound = k * torch_s + c * u * scale
    if not ours <= bound:
        return (f"error against float64 {ours:.3g} over the bound {bound:.3g} "
                f"({k:g} x torch's {torch_s:.3g} + {c:g} x {u:.3g} x {scale:.3g})")
    return ""


def compare_sample(actual: list, expected: list, exact: list | None, tol: Tolerance) -> str:
    """'' when one sample's outputs match torch eager (module docstring), else the first
    difference. ``exact``: the outputs of the same call on float64 inputs, or None."""
    if len(actual) != len(expected):
        return f"{len(actual)} outputs, torch gives {len(expected)}"
    for i, (a, e) in enumerate(zip(actual, expected)):
        r = exact[i] if exact is not None and len(exact) == len(expected) else None
        if (_half_dtype(e) is not None and isinstance(r, torch.Tensor)
                and r.dtype == torch.float64):
            problem = compare_half(a, e, r, tol.k, tol.c)
            if problem:
                return f"output {i}: {problem}"
            continue
        problem = compare([a], [e], tol.rtol, tol.atol)
        if problem:
            return problem.replace("output 0", f"output {i}", 1)
    return ""


def _in_float64(x: Any) -> Any:
    if isinstance(x, torch.Tensor) and x.dtype in (torch.float16, torch.bfloat16,
                                                   torch.float32):
        return x.double()
    return x


def _exact(fn: Any, sample: Any) -> list | None:
    """The sample's outputs on float64 copies of its floating inputs (torch eager), or
    None where the sample has no half-precision input or torch refuses it at float64."""
    module = _Calls(fn, [sample])
    tensors = module.tensors()
    if not any(x.dtype in (torch.float16, torch.bfloat16) for x in tensors):
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            (out,) = module(*map(_in_float64, tensors))
    except Exception:  # noqa: BLE001  (no float64 kernel, or mixed-dtype arguments)
        return None
    return [x for x in pytree.tree_leaves(out) if x is not None]


def _first_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}".splitlines()[0][:200]


def run_samples(info: Any, samples: list, tols: list[Tolerance]) -> Result:
    """Exports one module calling the OpInfo on every sample, runs it through the bridge
    under ``jax.jit`` and compares each sample's outputs with torch eager."""
    module = _Calls(info.op, samples)
    tensors = module.tensors()
    expected = module(*module.tensors())
    exact = [_exact(info.op, sample) for sample in samples]
    conv = torch_bridge.convert(module)
    try:
        program = conv.program(tensors)
    except UnsupportedOpError as e:
        return Result("unsupported", detail=str(e).splitlines()[0][:200])
    except Exception as e:  # noqa: BLE001  (torch.export refused the call)
        return Result("export", detail=_first_line(e))
    ops = tuple(sorted({n.target for n in program.nodes
                        if isinstance(n.target, torch._ops.OpOverload)}, key=str))
    if program.needs_key:
        return Result("random", ops)

    def run(*xs):
        outputs, _ = conv.apply({}, {}, *xs)
        return [pytree.tree_leaves(out) for out in outputs]

    try:
        actual = jax.jit(run)(*map(to_jax, tensors))
    except Exception as e:  # noqa: BLE001
        return Result("error", ops, _first_line(e))
    for i, (got, want) in enumerate(zip(actual, expected)):
        problem = compare_sample(got, [x for x in pytree.tree_leaves(want) if x is not None],
                                 exact[i], tols[i])
        if problem:
            return Result("mismatch", ops, f"sample {i}: {problem}")
    return Result("pass", ops)


def samples_of(info: Any, dtype: torch.dtype, limit: int | None) -> list[tuple[int, Any]]:
    """The OpInfo's CPU samples at ``dtype`` (at most ``limit``; None: all) that torch
    eager itself accepts, with their positions, less the ones the skip list names
    (``"name[i]"``).

    They are drawn on a thread of their own. torch's sample iterators walk the calling
    thread's stack at every sample (to name the running unittest, and, in a CUDA build of
    torch with no GPU, to record where each reseed was queued), at a cost that grows with
    the stack's depth; under pytest that was two thirds of this file's time. A new
    thread's stack holds no unittest either, so the samples are the same."""
    with concurrent.futures.ThreadPoolExecutor(1) as thread:
        return thread.submit(_accepted_samples, info, dtype, limit).result()


def _accepted_samples(info: Any, dtype: torch.dtype, limit: int | None
                      ) -> list[tuple[int, Any]]:
    with warnings.catch_warnings():  # the check's own filter, in the sampling thread too
        warnings.simplefilter("ignore")
        name = full_name(info)
        torch.manual_seed(0)
        kept = []
        generator = info.sample_inputs("cpu", dtype, requires_grad=False)
        try:
            for i, sample in enumerate(generator):
                if limit is not None and len(kept) >= limit:
                    break
                if f"{name}[{i}]" in SKIPS:
                    continue
                try:
                    _Calls(info.op, [sample])(*_Calls(info.op, [sample]).tensors())
                except Exception:  # noqa: BLE001  (e.g. a sample for another device)
                    continue
                kept.append((i, sample))
        finally:
            # Run to its end: left to the garbage collector, a sample generator stopped at the
            # cap can be finalized inside torch.export's tracing, which raises in its cleanup.
            for _ in generator:
                pass
        return kept


@functools.cache
def xla_compiles_float16() -> bool:
    """Whether XLA's CPU compiler can build float16 arithmetic in this process.

    Below the F16C instruction set (``XLA_FLAGS=--xla_cpu_max_isa=SSE4_2``, or a CPU
    from before 2012) jaxlib's JIT cannot link the float16 conversion routines
    (``__extendhfsf2``, ``__truncsfhf2``) and every float16 program fails to compile."""
    try:
        jax.jit(lambda x: x * x + x)(np.ones(4, np.float16)).block_until_ready()
    except jax.errors.JaxRuntimeError:
        return False
    return True


def dtypes_of(info: Any) -> list[torch.dtype]:
    """The dtypes of ``DTYPES`` that torch supports for this OpInfo on CPU, less the
    ones the skip list names (``"name@bfloat16"``), and float16 where XLA cannot compile
    it (:func:`xla_compiles_float16`)."""
    supported = info.supported_dtypes("cpu")
    name = full_name(info)
    return [d for d in DTYPES if d in supported and f"{name}@{_short(d)}" not in SKIPS
            and (d != torch.float16 or xla_compiles_float16())]


def _short(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def tolerance(name: str, dtype: torch.dtype) -> Tolerance:
    """The elementwise ``(rtol, atol)``: ``TOLERANCES["name@dtype"]``, else the dtype's,
    else the op's float32 one; the half-precision ``(K, C)``: ``HALF_BOUNDS["name"]``,
    else ``HALF_BOUND``."""
    if f"{name}@{_short(dtype)}" in TOLERANCES:
        rtol, atol = TOLERANCES[f"{name}@{_short(dtype)}"]
    else:
        rtol, atol = DTYPE_TOL.get(dtype) or TOLERANCES.get(name, DEFAULT_TOL)
    return Tolerance(rtol, atol, *HALF_BOUNDS.get(name, HALF_BOUND))


def check_opinfo(info: Any) -> Result:
    """One Result for all the OpInfo's samples at all its dtypes, run as one program; on
    a failure, the first failing (dtype, sample)'s."""
    name = full_name(info)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        caps = {d: (FLOAT32_SAMPLES if d == torch.float32 else OTHER_DTYPE_SAMPLES)
                for d in DTYPES}
        if name in SAMPLE_CAPS and FLOAT32_SAMPLES is not None:
            caps = {d: min(SAMPLE_CAPS[name], c or SAMPLE_CAPS[name])
                    for d, c in caps.items()}
        by_dtype = {d: samples_of(info, d, caps[d]) for d in dtypes_of(info)}
        by_dtype = {d: s for d, s in by_dtype.items() if s}
        if not by_dtype:
            return Result("error", detail="no sample that torch eager accepts")
        everything = [(d, s) for d, samples in by_dtype.items() for _, s in samples]
        result = run_samples(info, [s for _, s in everything],
                             [tolerance(name, d) for d, _ in everything])
        if result.status == "pass":
            result.samples = {d: len(s) for d, s in by_dtype.items()}
            return result
        for d, samples in by_dtype.items():  # name the dtype and the sample that fail
            tols = [tolerance(name, d)] * len(samples)
            if run_samples(info, [s for _, s in samples], tols).status == "pass":
                continue
            # The first failing sample, by bisection over prefixes (a prefix fails when
            # it holds a failing sample): a few programs, not one per sample.
            lo, hi = 0, len(samples) - 1
            while lo < hi:
                mid = (lo + hi) // 2
                prefix = [s for _, s in samples[:mid + 1]]
                if run_samples(info, prefix, tols[:mid + 1]).status == "pass":
                    lo = mid + 1
                else:
                    hi = mid
            i, sample = samples[lo]
            single = run_samples(info, [sample], [tolerance(name, d)])
            detail = single.detail.removeprefix("sample 0: ")
            single.detail = f"{_short(d)} sample {i}: {detail}"
            return single if single.status != "pass" else result
        return result


def core_aten_ops() -> list[Any]:
    """Every overload of an aten operator tagged ``torch.Tag.core`` (the core ATen set).

    The operator names come from torch's schema registry: ``dir(torch.ops.aten)`` lists
    only the packets already looked up in this process. Overloads are read with
    ``getattr``: calling a packet's ``__getattr__`` directly builds a new OpOverload and
    replaces torch's cached one, after which every table keyed by the old object (the
    bridge's lowerings, torch's own decompositions) misses it."""
    names = {s.name.removeprefix("aten::") for s in torch._C._jit_get_all_schemas()
             if s.name.startswith("aten::")}
    ops = set()
    for packet in filter(None, (getattr(torch.ops.aten, n, None) for n in names)):
        ops.update(op for op in (getattr(packet, name) for name in packet.overloads())
                   if is_core(op))
    return sorted(ops, key=str)


@functools.cache
def _by_name() -> dict[str, Any]:
    return {full_name(info): info for info in opinfo_db()}


@pytest.mark.parametrize("name", [
    name if runs_here(name) else pytest.param(name, marks=pytest.mark.skip(
        reason=f"needs torch {'.'.join(map(str, NEEDS_TORCH[name][0]))}: "
               f"{NEEDS_TORCH[name][1]}")) for name in TESTED])
def test_opinfo(name):
    """One OpInfo's samples (within the caps) through the bridge match torch eager."""
    result = check_opinfo(_by_name()[name])
    print(f"{name}: {result.status}; samples checked: "
          + ", ".join(f"{_short(d)} {n}" for d, n in result.samples.items())
          + ("" if xla_compiles_float16() else
             " (no float16: XLA cannot compile float16 on this instruction set)")
          + "; overloads: " + " ".join(map(str, result.ops)))
    assert result.status == "pass", f"{name}: {result.status}: {result.detail}"


def test_core_coverage_and_skip_lists():
    """Prints the core ATen overloads lowered out of torch's core set and both skip lists;
    fails on a core overload with neither a lowering nor a reason in ``CORE_SKIPS``, and
    on table entries that name no OpInfo of this torch."""
    by_name = _by_name()
    unknown = sorted(n for n in [*TESTED, *(k.split("[")[0].split("@")[0] for k in SKIPS),
                                 *SAMPLE_CAPS, *(k.split("@")[0] for k in TOLERANCES),
                                 *HALF_BOUNDS]
                     if n not in by_name and runs_here(n))
    assert not unknown, f"not OpInfo names in this torch: {unknown}"
    assert set(NEEDS_TORCH) <= set(TESTED), set(NEEDS_TORCH) - set(TESTED)
    assert not set(TESTED) & set(SKIPS), "an OpInfo is both tested and skipped"
    core = core_aten_ops()
    lowered = set(torch_bridge.lowered_ops())
    covered = [str(op) for op in core if str(op) in lowered]
    unaccounted = [str(op) for op in core
                   if str(op) not in lowered and str(op) not in CORE_SKIPS]
    report = [
        f"torch_bridge core ATen coverage: {len(covered)}/{len(core)} core overloads of "
        f"torch {torch.__version__} lowered, {len(CORE_SKIPS)} skipped with a reason; "
        f"{len(TESTED)} OpInfos compared with torch eager ("
        + ("every sample at float32, bfloat16, float16 and int64"
           if FLOAT32_SAMPLES is None else
           f"float32: up to {FLOAT32_SAMPLES} samples each, bfloat16/float16/int64: the "
           f"first {OTHER_DTYPE_SAMPLES}; CEREBRAX_OPINFO_ALL=1 checks every sample")
        + ")"]
    report.append(f"core ATen skip list ({len(CORE_SKIPS)}):")
    report += [f"  {op}: {reason}" for op, reason in sorted(CORE_SKIPS.items())]
    report.append(f"OpInfo sample caps below {FLOAT32_SAMPLES} ({len(SAMPLE_CAPS)}): "
                  + ", ".join(f"{n} {c}" for n, c in sorted(SAMPLE_CAPS.items())))
    report.append(f"OpInfo skip list ({len(SKIPS)}):")
    report += [f"  {name}: {reason}" for name, reason in sorted(SKIPS.items())]
    print("\n".join(report))
    assert not unaccounted, (
        f"core ATen overloads with neither a lowering nor an entry in CORE_SKIPS: "
        f"{unaccounted}")


def test_the_half_precision_bound_holds_torch_s_rounding_and_refuses_more():
    """The float64 bound passes torch's own float16 result and one a unit of roundoff
    away, and fails a result eight units away at the largest magnitude, and one computed
    at bfloat16 where torch computes at float16."""
    exact = torch.linspace(-3.0, 3.0, 101, dtype=torch.float64).exp()
    torch_half = exact.half()
    assert not compare_half(torch_half.numpy(), torch_half, exact, *HALF_BOUND)
    u = UNIT_ROUNDOFF[np.dtype(np.float16)]
    scale = float(exact.max())
    off = torch_half.double().numpy() + u * scale
    assert not compare_half(off, torch_half, exact, *HALF_BOUND)
    off[-1] += 8 * u * scale
    assert "over the bound" in compare_half(off, torch_half, exact, *HALF_BOUND)
    coarse = exact.bfloat16().double().numpy()
    assert "over the bound" in compare_half(coarse, torch_half, exact, *HALF_BOUND)
    nan = torch_half.double().numpy().copy()
    nan[3] = np.nan
    assert compare_half(nan, torch_half, exact, *HALF_BOUND) == "NaN positions differ"


def _triage() -> None:
    """Runs every OpInfo (not only the tested ones) and prints one line per OpInfo."""
    import time

    for info in opinfo_db():
        if torch.float32 not in info.supported_dtypes("cpu"):
            continue
        name = full_name(info)
        t = time.perf_counter()
        try:
            r = check_opinfo(info)
        except Exception as e:  # noqa: BLE001
            r = Result("error", detail=f"samples: {_first_line(e)}")
        ops = " ".join(str(op) for op in r.ops)
        print(f"{name}\t{r.status}\t{time.perf_counter() - t:.2f}\t{ops}\t{r.detail}",
              flush=True)


if __name__ == "__main__":
    if "--all" in sys.argv:
        _triage()
    else:
        for name in TESTED:
            test_opinfo(name)
        test_core_coverage_and_skip_lists()
