"""H5 checkpoints against torch.save / torch.load, measured side by side in one process.

1. Save a ~1 GiB state dict of float32 torch tensors: ``cerebrax.ckpt.save`` (temporary
   file, digests of all data, seal, fsync, rename) against ``torch.save`` (no fsync),
   and against ``torch.save`` followed by an fsync (the same durability).
2. Load it and read every tensor: ``cerebrax.ckpt.load`` then ``np.asarray`` of every
   lazy array (each read checked against its digest) against
   ``torch.load(weights_only=True)``. Both files were just written, so both are read
   from the page cache.
3. Lazy open: ``cerebrax.ckpt.load`` of the 1 GiB file against a 10 MiB file with the
   same keys.

    python benchmarks/bench_checkpoint.py      # prints the table, updates RESULTS.md

Rounds alternate the order of the variants and medians are reported. Every file is
deleted at the end. The ``## Checkpoints`` section of RESULTS.md lies between the
markers ``<!-- ckpt:start -->`` and ``<!-- ckpt:end -->`` and is replaced on rerun.
"""

from __future__ import annotations

import argparse
import gc
import os
import pathlib
import platform
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable

import h5py
import numpy as np
import torch
from results import write_section

import cerebrax.ckpt as ckpt

LAYERS = 64


def state_dict(total_bytes: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """``LAYERS`` weight matrices and biases of float32 summing to ``total_bytes``."""
    rows = 1024
    cols = max(1, total_bytes // (LAYERS * rows * 4))
    generator = torch.Generator().manual_seed(seed)
    state = {}
    for i in range(LAYERS):
        state[f"layers.{i}.weight"] = torch.randn(rows, cols, generator=generator)
        state[f"layers.{i}.bias"] = torch.randn(rows, generator=generator)
    return state


def nbytes(state: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())


def fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def timed(fn: Callable[[], object]) -> float:
    """Seconds ``fn`` takes, starting with no dirty pages left by the previous step
    (otherwise the kernel throttles whichever writer comes next)."""
    gc.collect()
    os.sync()
    start = time.perf_counter()
    result = fn()
    elapsed = time.perf_counter() - start
    del result
    return elapsed


def h5_read_all(path: str) -> dict[str, np.ndarray]:
    return {key: np.asarray(value) for key, value in ckpt.load(path).items()}


def torch_read_all(path: str) -> dict[str, torch.Tensor]:
    return torch.load(path, weights_only=True)


def bench_save_load(state: dict, directory: str, repeats: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {k: [] for k in
                                     ("h5_save", "pt_save", "pt_save_fsync", "h5_load",
                                      "pt_load")}
    h5_path = os.path.join(directory, "state.h5")
    pt_path = os.path.join(directory, "state.pt")
    synced = os.path.join(directory, "synced.pt")
    for round_ in range(repeats):
        saves = [("h5_save", lambda: ckpt.save(state, h5_path)),
                 ("pt_save", lambda: torch.save(state, pt_path)),
                 ("pt_save_fsync", lambda: (torch.save(state, synced), fsync(synced)))]
        loads = [("h5_load", lambda: h5_read_all(h5_path)),
                 ("pt_load", lambda: torch_read_all(pt_path))]
        if round_ % 2:
            saves.reverse()
            loads.reverse()
        for path in (h5_path, pt_path, synced):
            if os.path.exists(path):
                os.remove(path)
        for name, fn in saves:
            times[name].append(timed(fn))
        os.remove(synced)
        for name, fn in loads:
            times[name].append(timed(fn))
    check_equal(state, h5_path)
    return times


def check_equal(state: dict, path: str) -> None:
    loaded = h5_read_all(path)
    for key, tensor in state.items():
        if not np.array_equal(loaded[key], tensor.numpy()):
            raise AssertionError(f"{key} differs after the round trip")


def bench_open(big: str, small: str, repeats: int) -> tuple[float, float]:
    opened = {big: [], small: []}
    for round_ in range(repeats):
        for path in (big, small) if round_ % 2 else (small, big):
            start = time.perf_counter()
            tree = ckpt.load(path)
            opened[path].append(time.perf_counter() - start)
            del tree  # closes the file
    return statistics.median(opened[big]), statistics.median(opened[small])


def report(size: int, small_size: int, times: dict, open_big: float, open_small: float,
           repeats: int) -> str:
    med = {k: statistics.median(v) for k, v in times.items()}
    gb = size / 1e9

    def cell(name: str) -> str:
        runs = times[name]
        return (f"{med[name]:.3f} s ({gb / med[name]:.2f} GB/s; runs "
                f"{min(runs):.2f}-{max(runs):.2f} s)")

    rows = [
        ("save", cell("h5_save"), cell("pt_save"), med["pt_save"] / med["h5_save"], ">= 1.0"),
        ("save, torch followed by fsync", cell("h5_save"), cell("pt_save_fsync"),
         med["pt_save_fsync"] / med["h5_save"], "(same durability)"),
        ("load and read every tensor", cell("h5_load"), cell("pt_load"),
         med["pt_load"] / med["h5_load"], ">= 1.0"),
    ]
    lines = [
        "## Checkpoints",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, {platform.system()}; "
        f"h5py {h5py.__version__} (HDF5 {h5py.version.hdf5_version}), torch "
        f"{torch.__version__}, numpy {np.__version__}. State dict: {LAYERS} float32 "
        f"weights and {LAYERS} biases, {size / 2**20:.0f} MiB, on a local disk. "
        f"{repeats} alternating rounds; medians. Command: "
        "`python benchmarks/bench_checkpoint.py`.",
        "",
        "| measurement | cerebrax H5 | torch | ratio torch / H5 | target |",
        "|---|---|---|---|---|",
    ]
    lines += [f"| {a} | {b} | {c} | {r:.2f} | {t} |" for a, b, c, r, t in rows]
    lines += [
        "",
        "| lazy open (`ckpt.load`, no data read) | time | target |",
        "|---|---|---|",
        f"| {size / 2**20:.0f} MiB file | {open_big * 1e3:.2f} ms | |",
        f"| {small_size / 2**20:.0f} MiB file, same keys | {open_small * 1e3:.2f} ms | |",
        f"| ratio big / small | {open_big / open_small:.2f} | <= 2.0 |",
        "",
        "H5 save writes a temporary file, computes a digest of every array, seals the "
        "metadata, fsyncs and renames it; `torch.save` does none of this, so the second "
        "row compares equal durability. H5 save starts the disk writeback of each block "
        "as soon as it is written (`sync_file_range` on Linux), so the fsync finds little "
        "left to flush, and it frees the replaced file's blocks in the background (both "
        "libraries overwrite the file of the round before). "
        "H5 load checks the seal and every array's digest. "
        "Every timing starts after `os.sync()`, so no step pays for the dirty pages of "
        "the one before. The disk and the two cores are shared with other work, so runs "
        "vary; the ranges show by how much.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=1024)
    parser.add_argument("--small-mb", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--open-repeats", type=int, default=101)
    parser.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    parser.add_argument("--output", default=str(pathlib.Path(__file__).with_name("RESULTS.md")))
    parser.add_argument("--no-write", action="store_true", help="only print the table")
    args = parser.parse_args()

    directory = tempfile.mkdtemp(prefix="bench_ckpt_", dir=args.dir)
    try:
        state = state_dict(args.size_mb * 2**20)
        size = nbytes(state)
        times = bench_save_load(state, directory, args.repeats)
        small = state_dict(args.small_mb * 2**20, seed=1)
        small_path = os.path.join(directory, "small.h5")
        ckpt.save(small, small_path)
        open_big, open_small = bench_open(os.path.join(directory, "state.h5"), small_path,
                                          args.open_repeats)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    section = report(size, nbytes(small), times, open_big, open_small, args.repeats)
    print(section)
    if not args.no_write:
        write_section(pathlib.Path(args.output), "ckpt", section)


if __name__ == "__main__":
    main()
