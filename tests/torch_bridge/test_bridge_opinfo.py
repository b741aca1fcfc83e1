"""Op coverage: the bridge against torch eager on torch's own OpInfo sample inputs.

For every OpInfo named in ``opinfo_table.TESTED`` the first few float32 samples are each
wrapped in a one-op module, exported through ``torch_bridge.convert`` and run under
``jax.jit``; the outputs must match torch eager within the op's tolerance. The core ATen
overloads that appear in the graphs of matching samples are the covered overloads; the
test asserts there are at least 120 of them and prints them with the skip list
(``pytest -s`` or ``-rA`` shows it).

    python tests/torch_bridge/test_bridge_opinfo.py --all   # every OpInfo, for triage
"""

from __future__ import annotations

import dataclasses
import sys
import warnings
from typing import Any

import jax
import numpy as np
import torch
import torch.utils._pytree as pytree
from opinfo_table import SKIPS, TESTED, TOLERANCES

import torch_bridge
from cerebrax.errors import UnsupportedOpError
from torch_bridge import to_jax

DEFAULT_TOL = (1e-5, 1e-6)  # (rtol, atol)
MIN_COVERED = 120
DEFAULT_SAMPLES = 5


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


def _overload(name: str) -> Any:
    """``"aten.add.Tensor"`` -> the OpOverload (None for other namespaces)."""
    namespace, packet, overload = name.split(".")
    if namespace != "aten":
        return None
    return getattr(getattr(torch.ops.aten, packet), overload)


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


def _first_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}".splitlines()[0][:200]


def run_samples(info: Any, samples: list, tol: tuple[float, float]) -> Result:
    """Exports one module calling the OpInfo on every sample, runs it through the bridge
    under ``jax.jit`` and compares each sample's outputs with torch eager."""
    module = _Calls(info.op, samples)
    tensors = module.tensors()
    expected = module(*module.tensors())
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
        problem = compare(got, [x for x in pytree.tree_leaves(want) if x is not None], *tol)
        if problem:
            return Result("mismatch", ops, f"sample {i}: {problem}")
    return Result("pass", ops)


def samples_of(info: Any, limit: int) -> list[tuple[int, Any]]:
    """The OpInfo's first ``limit`` float32 CPU samples (with their positions) that torch
    eager itself accepts, less the ones the skip list names (``"name[i]"``)."""
    name = full_name(info)
    torch.manual_seed(0)
    kept = []
    for i, sample in enumerate(info.sample_inputs("cpu", torch.float32, requires_grad=False)):
        if i >= limit:
            break
        if f"{name}[{i}]" in SKIPS:
            continue
        try:
            _Calls(info.op, [sample])(*_Calls(info.op, [sample]).tensors())
        except Exception:  # noqa: BLE001  (e.g. a sample for another device)
            continue
        kept.append((i, sample))
    return kept


def check_opinfo(info: Any, limit: int) -> Result:
    """One Result for the OpInfo's samples; on a failure, the first failing sample's."""
    tol = TOLERANCES.get(full_name(info), DEFAULT_TOL)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        samples = samples_of(info, limit)
        if not samples:
            return Result("error", detail="no sample that torch eager accepts")
        result = run_samples(info, [s for _, s in samples], tol)
        if result.status == "pass":
            return result
        for i, sample in samples:  # name the sample that fails
            single = run_samples(info, [sample], tol)
            if single.status != "pass":
                single.detail = f"sample {i}: {single.detail.removeprefix('sample 0: ')}"
                return single
        return result


def test_opinfo_coverage():
    by_name = {full_name(info): info for info in opinfo_db()}
    unknown = sorted(n for n in [*TESTED, *(k.split("[")[0] for k in SKIPS)]
                     if n not in by_name)
    assert not unknown, f"not OpInfo names in this torch: {unknown}"
    assert not set(TESTED) & set(SKIPS), "an OpInfo is both tested and skipped"
    covered: dict[Any, list[str]] = {}
    failures = []
    for name in TESTED:
        result = check_opinfo(by_name[name], DEFAULT_SAMPLES)
        if result.status != "pass":
            failures.append(f"{name}: {result.status}: {result.detail}")
            continue
        for op in result.ops:
            covered.setdefault(op, []).append(name)
    core = sorted((op for op in covered if is_core(op)), key=str)
    report = [f"torch_bridge op coverage: {len(core)} core ATen overloads verified against "
              f"torch eager on OpInfo samples ({len(TESTED)} OpInfos tested, "
              f"{len(covered) - len(core)} non-core overloads also exercised)"]
    report += [f"  {op}" for op in core]
    verified = {str(op) for op in core}
    unverified = [name for name in torch_bridge.lowered_ops()
                  if name not in verified and is_core(_overload(name))]
    report.append(f"lowered core overloads no tested OpInfo sample reaches ({len(unverified)}): "
                  + ", ".join(unverified))
    report.append(f"skip list ({len(SKIPS)}):")
    report += [f"  {name}: {reason}" for name, reason in sorted(SKIPS.items())]
    print("\n".join(report))
    assert not failures, "\n".join(failures)
    assert len(core) >= MIN_COVERED, report[0]


def _triage(limit: int = DEFAULT_SAMPLES) -> None:
    """Runs every OpInfo (not only the tested ones) and prints one line per OpInfo."""
    import time

    for info in opinfo_db():
        if torch.float32 not in info.supported_dtypes("cpu"):
            continue
        name = full_name(info)
        t = time.perf_counter()
        try:
            r = check_opinfo(info, limit)
        except Exception as e:  # noqa: BLE001
            r = Result("error", detail=f"samples: {_first_line(e)}")
        ops = " ".join(str(op) for op in r.ops)
        print(f"{name}\t{r.status}\t{time.perf_counter() - t:.2f}\t{ops}\t{r.detail}",
              flush=True)


if __name__ == "__main__":
    if "--all" in sys.argv:
        _triage()
    else:
        test_opinfo_coverage()
