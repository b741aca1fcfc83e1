"""``ClusterConfig(device_memory=...)`` on one device, and the new config fields' checks.

The multi-device demonstration (replica refused, weight streaming fits and trains like
one device) is tests/multidevice/test_memory_budget.py.
"""

from __future__ import annotations

import pytest
from helpers import batches, fresh_backend, mlp_apply, mlp_params, rel_err, xent_step

import cerebrax as cstorch

ClusterConfig = cstorch.distributed.ClusterConfig
SIZES = (8, 256, 256, 4)


@pytest.mark.parametrize(("given", "expected"), [
    ("16GiB", 16 * 2**30), ("512MiB", 512 * 2**20), ("8GB", 8 * 10**9),
    ("1.5 MiB", 3 * 2**19), (4096, 4096),
])
def test_device_memory_takes_sizes(given, expected):
    assert ClusterConfig(device_memory=given).device_memory == expected


@pytest.mark.parametrize("bad", ["lots", "-1GiB", 0, -5, 2.5, True])
def test_device_memory_refuses_what_is_not_a_size(bad):
    with pytest.raises(cstorch.ConfigError, match="device_memory"):
        ClusterConfig(device_memory=bad)


def test_pipeline_schedule_fields_are_checked():
    cfg = ClusterConfig(execution_mode="pipeline", pipeline_schedule="circular",
                        pipeline_repeats=2)
    assert (cfg.pipeline_schedule, cfg.pipeline_repeats) == ("circular", 2)
    with pytest.raises(cstorch.ConfigError, match="one of"):
        ClusterConfig(execution_mode="pipeline", pipeline_schedule="1f1b")
    with pytest.raises(cstorch.ConfigError, match="only applies to execution_mode"):
        ClusterConfig(pipeline_schedule="circular")
    with pytest.raises(cstorch.ConfigError, match="pipeline_schedule='circular'"):
        ClusterConfig(execution_mode="pipeline", pipeline_repeats=2)


def _step(device_memory):
    backend = fresh_backend(dict(device_memory=device_memory))
    model = cstorch.compile(cstorch.FunctionalModel(mlp_apply, mlp_params(0, SIZES)),
                            backend)
    return xent_step(model, cstorch.optim.AdamW(model.parameters(), lr=1e-2))


def test_a_step_over_the_budget_is_refused_before_it_runs():
    step = _step("256KiB")
    x, y = batches(1)[0]
    with pytest.raises(cstorch.ConfigError) as info:
        step(x, y)
    report = cstorch.wse.memory_report(step, x, y)
    text = str(info.value)
    assert report.peak_bytes > 256 * 2**10
    assert f"needs {report.peak_bytes / 2**20:.2f} MiB per device" in text
    assert "'single device' layout on 1 device(s)" in text
    assert "max_wgt_servers >= " in text and "nothing ran" in text


def test_a_step_within_the_budget_trains_as_without_one():
    data = batches(5)
    within = _step("64MiB")
    losses = [float(within(x, y)) for x, y in data]
    free = _step(None)
    assert rel_err(losses, [float(free(x, y)) for x, y in data]) == 0.0
    assert within.num_compiles == 1
