"""``SummaryReader``: the scalars and tensors of the event files in a directory.

The files are read by TensorBoard's own event reader (:mod:`._loader`), which needs the
``tensorboard`` package: ``pip install "cerebrax[tensorboard]"``. It is imported when a
reader is made, not when cerebrax is.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from ..errors import SummaryError

__all__ = ["ScalarEvent", "SummaryError", "SummaryReader", "TensorEvent"]

MSG_NO_TENSORBOARD = """\
SummaryReader reads event files with TensorBoard's own reader, from the `tensorboard`
package, which cannot be imported here ({error}). Install it with cerebrax's extra:
    pip install "cerebrax[tensorboard]"
Writing summaries (SummaryWriter, summarize_scalar) needs only tensorboardX, which
cerebrax installs; `tensorboard --logdir DIR` needs the same extra."""


class ScalarEvent(NamedTuple):
    """One scalar summary: when it was written (``wall_time``, seconds since the
    epoch), its ``step`` and its ``value``."""

    wall_time: float
    step: int
    value: float


class TensorEvent(NamedTuple):
    """One tensor summary: when it was written (``wall_time``, seconds since the
    epoch), its ``step`` and its ``value``, a numpy array."""

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


def _read_event_file() -> Callable[[str], Any]:
    """TensorBoard's reader behind :func:`._loader.read_event_file`, or a SummaryError."""
    try:
        from ._loader import read_event_file
    except ImportError as e:
        raise SummaryError(MSG_NO_TENSORBOARD.format(error=e)) from None
    return read_event_file


class SummaryReader:
    """Reads back the summaries that a :class:`SummaryWriter` wrote.

    Every event file in ``log_dir`` (or the one file ``log_dir`` names) is read in
    file-name order by TensorBoard's event reader, which checks every record's
    checksums: a damaged or truncated file raises :class:`SummaryError` naming the file
    and the byte where damage starts. Event files of other writers (torch,
    tensorboardX, TensorFlow) read too; summaries other than scalars and tensors are
    ignored. Call :meth:`reload` to see newer summaries. Needs the ``tensorboard``
    package (``pip install "cerebrax[tensorboard]"``); without it the reader raises
    :class:`SummaryError` saying so.

    Example:
      >>> from cerebrax.utils.tensorboard import SummaryReader, SummaryWriter
      >>> with SummaryWriter("runs/demo") as writer:
      ...     writer.add_scalar("loss", 0.25, global_step=1)
      ...     writer.add_tensor("weights", np.eye(2, dtype=np.float32), global_step=1)
      >>> reader = SummaryReader("runs/demo")
      >>> reader.scalars("loss")
      [(1, 0.25)]
      >>> reader.tensors("weights")
      [(1, array([[1., 0.],
                 [0., 1.]], dtype=float32))]
      >>> reader.read_scalar("loss", step=1)
      ScalarEvent(wall_time=..., step=1, value=0.25)
    """

    def __init__(self, log_dir: str | os.PathLike):
        self.log_dir = os.fspath(log_dir)
        self.reload()

    def reload(self) -> None:
        """Reads the event files again."""
        read_event_file = _read_event_file()
        self.files = _event_files(self.log_dir)
        self.file_versions: list[str | None] = []
        self._scalars: dict[str, list[ScalarEvent]] = {}
        self._tensors: dict[str, list[TensorEvent]] = {}
        for path in self.files:
            summaries = read_event_file(path)
            self.file_versions.append(summaries.file_version)
            for tag, *entry in summaries.scalars:
                self._scalars.setdefault(tag, []).append(ScalarEvent(*entry))
            for tag, *entry in summaries.tensors:
                self._tensors.setdefault(tag, []).append(TensorEvent(*entry))

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
        """The tags of the scalar summaries."""
        return set(self._scalars)

    def tensor_names(self) -> set[str]:
        """The tags of the tensor summaries."""
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
