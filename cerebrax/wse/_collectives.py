"""The collectives of a compiled step, read from XLA's compiled HLO text.

Weight streaming promises a communication pattern (each layer's weights all-gathered
once in the forward and once in the backward pass, its gradient reduce-scattered, no
all-reduce of whole gradients); :func:`collective_report` lets a user (and the tests)
check it in the program XLA actually runs, not in what JAX was asked for.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterator
from typing import Any

__all__ = ["Collective", "CollectiveReport", "Loop", "collective_report", "parse_collectives"]

# HLO opcodes, with the asynchronous forms (a collective counts once, at its start).
_KINDS = {
    "all-gather": "all-gather", "all-gather-start": "all-gather",
    "reduce-scatter": "reduce-scatter",
    "all-reduce": "all-reduce", "all-reduce-start": "all-reduce",
    "all-to-all": "all-to-all", "collective-permute": "collective-permute",
    "collective-permute-start": "collective-permute",
}
_HEADER = re.compile(r"^(?:ENTRY )?%?([\w.\-]+) .*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%?[\w.\-]+ = (.+?) ([a-z][\w\-]*)\(")
_TRIP = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')


@dataclasses.dataclass(frozen=True)
class Collective:
    """One collective instruction: its kind, result shape (HLO text) and group size."""

    kind: str
    shape: str
    group_size: int

    @property
    def trivial(self) -> bool:
        """Whether every group holds one device (the op moves nothing)."""
        return self.group_size == 1

    @property
    def nbytes(self) -> int:
        """Bytes of the result on one device (a tuple's arrays added up)."""
        total = 0
        for dtype, dims in re.findall(r"\b([a-z]+\d*)\[([\d,]*)\]", self.shape):
            bits = int(re.sub(r"\D", "", dtype) or 8) if dtype != "pred" else 8
            total += bits // 8 * math.prod(int(d) for d in dims.split(",") if d)
        return total


@dataclasses.dataclass(frozen=True)
class Loop:
    """A ``while`` loop: its body, its known trip count and the collectives it runs
    per iteration (in the body and what the body calls, nested loops excluded)."""

    body: str
    trip_count: int | None
    collectives: tuple[Collective, ...]

    def count(self, kind: str) -> int:
        """Non-trivial collectives of ``kind`` one iteration runs."""
        return sum(c.kind == kind and not c.trivial for c in self.collectives)


@dataclasses.dataclass(frozen=True)
class CollectiveReport:
    """The collectives of a compiled program: those outside loops and per loop.

    Counts leave out trivial collectives (groups of one device), which XLA keeps for
    mesh axes of size 1.
    """

    outside: tuple[Collective, ...]
    loops: tuple[Loop, ...]

    def count(self, kind: str) -> int:
        """Non-trivial collectives of ``kind`` outside any loop."""
        return sum(c.kind == kind and not c.trivial for c in self.outside)

    def executed(self, kind: str) -> int:
        """Non-trivial collectives of ``kind`` one run executes (loops x trip counts)."""
        return self.count(kind) + sum(loop.count(kind) * (loop.trip_count or 1)
                                      for loop in self.loops)

    def executed_bytes(self, kind: str) -> int:
        """Result bytes per device of the non-trivial collectives of ``kind`` one run
        executes (loops x trip counts)."""
        def size(collectives):
            return sum(c.nbytes for c in collectives if c.kind == kind and not c.trivial)
        return size(self.outside) + sum(size(loop.collectives) * (loop.trip_count or 1)
                                        for loop in self.loops)

    def format(self) -> str:
        """The report as text: all-gather, reduce-scatter and all-reduce counts outside
        loops and per loop (also ``str(report)``)."""
        kinds = ("all-gather", "reduce-scatter", "all-reduce")
        rows = ["collectives (non-trivial; per loop: per iteration x trip count)",
                "  outside loops: " + ", ".join(f"{k} {self.count(k)}" for k in kinds)]
        for loop in self.loops:
            counts = ", ".join(f"{k} {loop.count(k)}" for k in kinds)
            rows.append(f"  loop {loop.body} x {loop.trip_count}: {counts}")
        return "\n".join(rows)

    __str__ = format


def collective_report(step: Any, *args: Any, **kwargs: Any) -> CollectiveReport:
    """Compiles ``step`` (a ``cstorch.trace`` step) for these inputs; its collectives.

    Nothing runs.

    Example:
      A step on one device has no collectives (XLA's own loops are listed too):

      >>> model = cstorch.compile(torch.nn.Linear(4, 2), cstorch.backend("CPU"))
      >>> optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)
      >>> @cstorch.trace
      ... def train_step(x, y):
      ...     loss = torch.nn.functional.mse_loss(model(x), y)
      ...     cstorch.backward(loss)
      ...     optimizer.step()
      ...     return loss
      >>> report = cstorch.wse.collective_report(train_step, torch.ones(8, 4), torch.zeros(8, 2))
      >>> print(report)
      collectives (non-trivial; per loop: per iteration x trip count)
        outside loops: all-gather 0, reduce-scatter 0, all-reduce 0
      ...
      >>> [report.executed(kind) for kind in ("all-gather", "reduce-scatter", "all-reduce")]
      [0, 0, 0]

      On the emulated wafer (8 CPU devices, ``XLA_FLAGS=--xla_force_host_platform_device_count=8``
      set before JAX starts), weight streaming gathers the weights, reduce-scatters
      their gradients and all-reduces only the loss::

          backend = cstorch.backend("CSX", cluster_config=cstorch.distributed.ClusterConfig(
              max_wgt_servers=8))
          model = cstorch.compile(torch.nn.Sequential(
              torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8)), backend)
          # ... optimizer and train_step as above
          report = cstorch.wse.collective_report(
              train_step, torch.ones(16, 64), torch.zeros(16, 8))
          [report.executed(kind) for kind in ("all-gather", "reduce-scatter", "all-reduce")]
          # [5, 4, 1]
    """
    return parse_collectives(step.lower(*args, **kwargs).compile().as_text())


def parse_collectives(hlo: str) -> CollectiveReport:
    """The :class:`CollectiveReport` of compiled HLO text (``Compiled.as_text()``)."""
    bodies = _computations(hlo)
    loops: list[tuple[str, int | None]] = []
    for lines in bodies.values():
        for line in lines:
            match = _INSTRUCTION.match(line)
            if match and match.group(2) == "while":
                trip = _TRIP.search(line)
                loops.append((_called(line, "body")[0], int(trip.group(1)) if trip else None))
    loop_bodies = {body for body, _ in loops}
    entry = next((name for name, lines in bodies.items() if lines and lines[0] == "ENTRY"),
                 None)
    outside = tuple(_collect(bodies, entry, loop_bodies)) if entry else ()
    return CollectiveReport(outside, tuple(
        Loop(body, trip, tuple(_collect(bodies, body, loop_bodies))) for body, trip in loops))


def _computations(hlo: str) -> dict[str, list[str]]:
    """``{computation name: its instruction lines}``; the entry's list starts "ENTRY"."""
    bodies: dict[str, list[str]] = {}
    current = None
    for line in hlo.splitlines():
        header = _HEADER.match(line) if not line.startswith(" ") else None
        if header:
            current = header.group(1)
            bodies[current] = ["ENTRY"] if line.startswith("ENTRY") else []
        elif line.startswith("}"):
            current = None
        elif current is not None:
            bodies[current].append(line)
    return bodies


def _called(line: str, attribute: str | None = None) -> list[str]:
    """The computations an instruction line calls (or only those of ``attribute``)."""
    names = []
    for key in ("calls", "to_apply", "body", "condition", "branch_computations",
                "true_computation", "false_computation"):
        if attribute is not None and key != attribute:
            continue
        match = re.search(rf"\b{key}=(\{{[^}}]*\}}|%?[\w.\-]+)", line)
        if match:
            names += [n.strip().lstrip("%") for n in match.group(1).strip("{}").split(",")]
    return [n for n in names if n]


def _collect(bodies: dict[str, list[str]], name: str, loop_bodies: set[str]
             ) -> Iterator[Collective]:
    """The collectives of computation ``name`` and of what it calls (not loop bodies)."""
    seen: set[str] = set()
    stack = [name]
    while stack:
        current = stack.pop()
        if current in seen or current not in bodies:
            continue
        seen.add(current)
        for line in bodies[current]:
            match = _INSTRUCTION.match(line)
            if not match:
                continue
            kind = _KINDS.get(match.group(2))
            if kind is not None:
                yield Collective(kind, match.group(1), _group_size(line))
            stack += [c for c in _called(line) if c not in loop_bodies]


def _group_size(line: str) -> int:
    """Devices per replica group of a collective instruction line (0: unknown)."""
    explicit = re.search(r"replica_groups=\{\{([^}]*)\}", line)
    if explicit:
        return len([x for x in explicit.group(1).split(",") if x.strip()])
    iota = re.search(r"replica_groups=\[(\d+),(\d+)\]<=", line)
    if iota:
        return int(iota.group(2))
    mesh = re.search(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}", line)
    if mesh:
        sizes = dict(re.findall(r"'([^']+)'=(\d+)", mesh.group(1)))
        axes = re.findall(r"'([^']+)'", mesh.group(2))
        return math.prod(int(sizes[a]) for a in axes if a in sizes)
    return 0
