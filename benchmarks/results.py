"""Writes one benchmark's section of RESULTS.md between its markers, keeping the rest."""

from __future__ import annotations

import pathlib

HEADER = (
    "# Benchmark results\n\n"
    "Each section is written by the script it names; rerunning one replaces only its section.\n"
)


def write_section(path: pathlib.Path, name: str, text: str) -> None:
    """Replaces the text between ``<!-- name:start -->`` and ``<!-- name:end -->``."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    block = f"{start}\n{text.rstrip()}\n{end}\n"
    current = path.read_text() if path.exists() else HEADER
    if start in current and end in current:
        before = current[: current.index(start)]
        after = current[current.index(end) + len(end):].lstrip("\n")
        current = before + block + ("\n" + after if after else "")
    else:
        current = current.rstrip() + "\n\n" + block
    path.write_text(current)
