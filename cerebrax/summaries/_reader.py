"""``SummaryReader``: the scalars and tensors of the event files in a directory."""

from __future__ import annotations

import os
import struct
from typing import Any, NamedTuple

import numpy as np

from ..errors import SummaryError
from ._event import Event, ProtoError, decode_event
from ._records import FramingError, unframe

__all__ = ["ScalarEvent", "SummaryError", "SummaryReader", "TensorEvent"]

MSG_CORRUPT = """\
The event file {path} is damaged at byte {offset}: {problem}.
Summaries before that byte are intact. If the run is still writing this file, read it
again after writer.flush() or writer.close(); if the run crashed mid-write, the file is
truncated. Copy the intact prefix to a new file to keep what was written, e.g.
    head -c {offset} {path} > {path}.intact"""


class ScalarEvent(NamedTuple):
    wall_time: float
    step: int
    value: float


class TensorEvent(NamedTuple):
    wall_time: float
    step: int
    value: np.ndarray


def _event_files(path: str) -> list[str]:
    if os.path.isfile(path):
        return [path]
    if not os.path.isdir(path):
        raise SummaryError(f"No such directory of event files: {path!r}.")
    names = sorted(n for n in os.listdir(path) if "tfevents" in n)
    if not names:
        raise SummaryError(
            f"No event files (events.out.tfevents.*) in {path!r}. Pass the directory "
            "given to SummaryWriter(log_dir)."
        )
    return [os.path.join(path, n) for n in names]


def _read_file(path: str) -> list[Event]:
    with open(path, "rb") as f:
        data = f.read()
    events = []
    offset = 0
    try:
        for payload in unframe(data):
            try:
                events.append(decode_event(payload))
            except (ProtoError, struct.error, TypeError, UnicodeDecodeError) as e:
                raise FramingError(offset, f"a record is not an Event ({e})") from None
            offset += len(payload) + 16
    except FramingError as e:
        raise SummaryError(
            MSG_CORRUPT.format(path=path, offset=e.offset, problem=e.problem)
        ) from None
    return events


class SummaryReader:
    """Reads back the summaries that a :class:`SummaryWriter` wrote.

    Every event file in ``log_dir`` (or the one file ``log_dir`` names) is read in
    file-name order and every record's CRCs are checked: a damaged or truncated file
    raises :class:`SummaryError` naming the file and the byte where damage starts.
    Event files of other writers (torch, tensorboardX) read too; summaries other than
    scalars and tensors are ignored. Call :meth:`reload` to see newer summaries.

    Example:
      >>> reader = SummaryReader("runs/demo")
      >>> reader.scalars("loss")
      [(1, 0.25)]
    """

    def __init__(self, log_dir: str | os.PathLike):
        self.log_dir = os.fspath(log_dir)
        self.reload()

    def reload(self) -> None:
        """Reads the event files again."""
        self.files = _event_files(self.log_dir)
        self.file_versions: list[str | None] = []
        self._scalars: dict[str, list[ScalarEvent]] = {}
        self._tensors: dict[str, list[TensorEvent]] = {}
        for path in self.files:
            events = _read_file(path)
            self.file_versions.append(events[0].file_version if events else None)
            for event in events:
                for tag, value in event.values:
                    if isinstance(value, float):
                        entry = ScalarEvent(event.wall_time, event.step, value)
                        self._scalars.setdefault(tag, []).append(entry)
                    else:
                        entry = TensorEvent(event.wall_time, event.step, value)
                        self._tensors.setdefault(tag, []).append(entry)

    # ---- the short forms ----------------------------------------------------------------
    def tags(self) -> dict[str, list[str]]:
        """``{"scalars": [...], "tensors": [...]}``, each sorted."""
        return {"scalars": sorted(self._scalars), "tensors": sorted(self._tensors)}

    def scalars(self, tag: str) -> list[tuple[int, float]]:
        """``[(step, value), ...]`` of scalar ``tag``, in the order written."""
        return [(e.step, e.value) for e in self._lookup(self._scalars, "scalar", tag)]

    def tensors(self, tag: str) -> list[tuple[int, np.ndarray]]:
        """``[(step, array), ...]`` of tensor ``tag``, in the order written."""
        return [(e.step, e.value) for e in self._lookup(self._tensors, "tensor", tag)]

    # ---- cstorch's names ----------------------------------------------------------------
    def scalar_names(self) -> set[str]:
        return set(self._scalars)

    def tensor_names(self) -> set[str]:
        return set(self._tensors)

    def read_scalar(self, name: str, step: int | None = None) -> Any:
        """Every :class:`ScalarEvent` of ``name``, or the last one at ``step``."""
        return self._at(self._lookup(self._scalars, "scalar", name), name, step)

    def read_tensor(self, name: str, step: int | None = None) -> Any:
        """Every :class:`TensorEvent` of ``name``, or the last one at ``step``."""
        return self._at(self._lookup(self._tensors, "tensor", name), name, step)

    # ---- helpers ------------------------------------------------------------------------
    def _lookup(self, table: dict, kind: str, tag: str) -> list:
        if tag not in table:
            raise SummaryError(
                f"No {kind} summary named {tag!r} in {self.log_dir!r}. "
                f"{kind.capitalize()} tags there: {sorted(table)}."
            )
        return table[tag]

    @staticmethod
    def _at(events: list, name: str, step: int | None) -> Any:
        if step is None:
            return list(events)
        matches = [e for e in events if e.step == step]
        if not matches:
            raise SummaryError(
                f"{name!r} was not summarized at step {step}; its steps are "
                f"{sorted({e.step for e in events})}."
            )
        return matches[-1]

    def __repr__(self) -> str:
        return f"SummaryReader({self.log_dir!r})"
