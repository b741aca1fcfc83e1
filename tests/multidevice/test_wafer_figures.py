"""The figures of the documentation's wafer page (docs/_ext/wafer_figures.py), against
cerebrax itself.

``write_figures`` runs a small model's pipelined steps (GPipe and circular) and its
replica and weight-streaming steps, and draws what cerebrax recorded. Here: both SVGs
are XML with text kept as text and no date; the JSON holds exactly what
``recording_schedule()`` and ``memory_report()`` give for the same steps run again in
this process; what the page says about the data (the bubble, the memory per device)
holds for those numbers, and the figures show them.

Run in its own process:
    XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m pytest tests/multidevice
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import pathlib
import re
import types
import xml.etree.ElementTree as ET
from typing import Any

import numpy as np
import pytest

import cerebrax as cstorch
from cerebrax.wse import memory_report, recording_schedule, split_layers

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "docs" / "_ext" / "wafer_figures.py"
SVGS = ("pipeline_schedules.svg", "weight_streaming_memory.svg")
SVG_NS = "{http://www.w3.org/2000/svg}"


def _load_script() -> types.ModuleType:
    # Loaded when a test runs, not at collection: the script sets XLA_FLAGS when a
    # process has none, which must not leak into a single-device run's environment.
    spec = importlib.util.spec_from_file_location("wafer_figures", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclasses.dataclass(frozen=True)
class Drawn:
    script: types.ModuleType
    out: pathlib.Path
    data: dict[str, Any]


@pytest.fixture(scope="module")
def drawn(tmp_path_factory) -> Drawn:
    script = _load_script()
    out = tmp_path_factory.mktemp("wafer_figures")
    data = script.write_figures(out)
    cstorch.reset()
    return Drawn(script, out, data)


@pytest.fixture(autouse=True)
def _clean():
    yield
    cstorch.reset()


def _svg_texts(path: pathlib.Path) -> str:
    """All text of an SVG whose text stayed text, lines joined by spaces."""
    root = ET.parse(path).getroot()
    return " ".join(" ".join(el.itertext()) for el in root.iter(f"{SVG_NS}text"))


def _recorded(script: types.ModuleType, name: str) -> np.ndarray:
    step = script.training_step(script.PIPELINE_LAYOUTS[name])
    with recording_schedule() as records:
        float(step(*script.training_batch()))
    (record,) = records
    return record


# ---- the files --------------------------------------------------------------------------
def test_the_svgs_are_small_deterministic_xml(drawn):
    for name in SVGS:
        path = drawn.out / name
        root = ET.parse(path).getroot()
        assert root.tag == f"{SVG_NS}svg"
        text = path.read_text()
        assert "<text" in text and "@font-face" not in text and "<font" not in text
        assert "dc:date" not in text  # no date in the metadata
        assert path.stat().st_size < 200_000, (name, path.stat().st_size)
    titles = _svg_texts(drawn.out / SVGS[0]) + _svg_texts(drawn.out / SVGS[1])
    assert "recording_schedule()" in titles and "memory_report()" in titles


def test_the_json_holds_what_write_figures_returned(drawn):
    on_disk = json.loads((drawn.out / "wafer_figures.json").read_text())
    assert on_disk == json.loads(json.dumps(drawn.data))
    assert set(on_disk["pipeline"]) == {"gpipe", "circular"}
    assert set(on_disk["memory"]) == {"replica", "weight_streaming"}


# ---- the pipeline schedules -------------------------------------------------------------
@pytest.mark.parametrize("name", ["gpipe", "circular"])
def test_the_drawn_schedule_is_the_recorded_one(drawn, name):
    entry = drawn.data["pipeline"][name]
    record = _recorded(drawn.script, name)
    np.testing.assert_array_equal(np.asarray(entry["record"]), record)
    assert entry["ticks"] == record.shape[2]
    idle = record[..., 0] < 0
    assert entry["idle_slots"] == idle.sum()
    assert entry["idle_fraction"] == pytest.approx(idle.mean())
    # Each tick runs one virtual stage: its layers as pipeline mode splits them.
    stages = record.shape[1]
    repeats = entry["cluster"].get("pipeline_repeats") or 1
    ranges = split_layers(drawn.script.layer_costs(), stages * repeats)
    assert entry["virtual_stage_layers"] == [list(r) for r in ranges]
    assert entry["layers_per_tick"] == max(hi - lo for lo, hi in ranges)
    # Every virtual stage ran every micro-batch once: the figure shows a whole step.
    ran = {(int(k), int(m)) for k, m in record[0][~idle[0]]}
    micro = drawn.script.BATCH // entry["cluster"]["micro_batch_size"]
    assert ran == {(k, m) for k in range(stages * repeats) for m in range(micro)}
    assert len(ran) == (~idle).sum()


def test_the_bubble_claims_hold_for_the_recorded_data(drawn):
    """The docstring and the titles: the same number of idle (device, tick) slots,
    S * (S - 1), but circular ticks run half the layers, so less idle time and a
    smaller bubble, (S - 1) / (M * V + S - 1) against (S - 1) / (M + S - 1)."""
    gpipe, circular = (drawn.data["pipeline"][n] for n in ("gpipe", "circular"))
    records = {n: np.asarray(drawn.data["pipeline"][n]["record"]) for n in ("gpipe", "circular")}
    stages = records["gpipe"].shape[1]
    micro = drawn.script.BATCH // gpipe["cluster"]["micro_batch_size"]
    repeats = circular["cluster"]["pipeline_repeats"]
    idle = {n: int((r[..., 0] < 0).sum()) for n, r in records.items()}
    assert idle["gpipe"] == idle["circular"] == stages * (stages - 1)
    assert circular["layers_per_tick"] * repeats == gpipe["layers_per_tick"]
    assert gpipe["idle_layer_time_per_device"] > circular["idle_layer_time_per_device"]
    assert gpipe["idle_fraction"] > circular["idle_fraction"]
    assert gpipe["idle_fraction"] == pytest.approx((stages - 1) / (micro + stages - 1))
    assert circular["idle_fraction"] == pytest.approx(
        (stages - 1) / (micro * repeats + stages - 1))
    assert circular["step_layer_time"] < gpipe["step_layer_time"]
    # The figure's titles give these numbers.
    shown = _svg_texts(drawn.out / "pipeline_schedules.svg")
    for entry in (gpipe, circular):
        assert f"{entry['ticks']} ticks" in shown
        assert f"{entry['idle_slots']} idle (device, tick) slots" in shown
        assert f"bubble {entry['idle_fraction']:.0%}" in shown


def test_the_schedule_figure_labels_every_cell_that_ran(drawn):
    shown = _svg_texts(drawn.out / "pipeline_schedules.svg")
    cells = re.findall(r"\bm(\d+) k(\d+)\b", shown)
    expected = []
    for entry in drawn.data["pipeline"].values():
        record = np.asarray(entry["record"])[0]
        expected += [(str(m), str(k)) for k, m in record.reshape(-1, 2) if k >= 0]
    assert sorted(cells) == sorted(expected)


# ---- the memory per device --------------------------------------------------------------
@pytest.mark.parametrize("mode", ["replica", "weight_streaming"])
def test_the_drawn_memory_is_the_memory_report(drawn, mode):
    script = drawn.script
    step = script.training_step(script.MEMORY_LAYOUTS[mode])
    report = memory_report(step, *script.training_batch())
    assert drawn.data["memory"][mode]["report"] == dataclasses.asdict(report)
    assert report.mode == mode and report.num_devices == 8


def test_weight_streaming_holds_less_per_device_than_replica(drawn):
    replica, streaming = (drawn.data["memory"][m]["report"]
                          for m in ("replica", "weight_streaming"))
    assert replica["params_total_bytes"] == streaming["params_total_bytes"] > 0
    assert replica["params_bytes"] == replica["params_total_bytes"]  # a full copy
    assert streaming["params_bytes"] < replica["params_bytes"]
    # The page says: 1/8 of the parameters and AdamW moments per device (the layers'
    # dimensions divide by 8; scalars such as AdamW's step count stay whole on every
    # device), less temporary memory and a lower peak.
    devices = streaming["num_devices"]
    assert streaming["params_bytes"] * devices == streaming["params_total_bytes"]
    share = streaming["optimizer_total_bytes"] / devices
    assert share <= streaming["optimizer_bytes"] < share + streaming["largest_param_bytes"]
    assert streaming["optimizer_bytes"] < replica["optimizer_bytes"]
    assert streaming["temp_bytes"] < replica["temp_bytes"]
    assert streaming["peak_bytes"] < replica["peak_bytes"]
    # The bars are labelled with the reports' numbers (KiB).
    shown = _svg_texts(drawn.out / "weight_streaming_memory.svg")
    for report in (replica, streaming):
        for field in ("params_bytes", "optimizer_bytes", "temp_bytes", "peak_bytes"):
            assert f"{report[field] / 1024:,.1f}" in shown, field
