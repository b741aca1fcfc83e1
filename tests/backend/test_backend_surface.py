"""The cstorch 2.x backend surface: Backend attributes, ``to_cpu``, the
``cstorch.backends.csx`` flags, ClusterConfig's 2.10 fields and the top-level helpers.

References: torch's own factories and conversions, the training run without
micro-batches (micro-batched gradients equal whole-batch ones), and the compiled
program's text (constants, named scopes).
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import torch
from helpers import batches, mlp_apply, mlp_params, rel_err, xent_step

import cerebrax as cstorch
from cerebrax.backend import flags_report
from cerebrax.distributed import ClusterConfig

# ---- Backend attributes ---------------------------------------------------------------


def test_cpu_backend_attributes():
    backend = cstorch.backend("CPU", artifact_dir="logs")
    assert (backend.is_cpu, backend.is_gpu, backend.is_csx) == (True, False, False)
    assert backend.is_e2e_execution and not backend.is_tracing
    assert backend.torch_device == torch.device("cpu") == cstorch.current_torch_device()
    assert backend.cluster is None and backend.cluster_config is None
    assert backend.artifact_dir == os.path.abspath("logs")
    assert backend.device == jax.local_devices(backend="cpu")[0] == backend.jax_device
    assert hash(backend.device) == hash(backend.jax_device)
    assert backend.device.platform == "cpu" and backend.device.type == "CPU"
    assert not cstorch.use_cs()


def test_csx_backend_attributes():
    cluster = ClusterConfig(num_csx=1, num_workers_per_csx=2)
    backend = cstorch.backend("CSX", cluster_config=cluster, compile_only=True)
    assert (backend.is_cpu, backend.is_gpu, backend.is_csx) == (False, False, True)
    assert not backend.is_e2e_execution
    assert backend.cluster == backend.cluster_config == cluster
    assert cstorch.use_cs()


def test_is_tracing_is_true_while_a_step_is_traced():
    backend = cstorch.backend("CPU")
    seen = []

    @cstorch.trace
    def step(x):
        seen.append(backend.is_tracing)
        return x * 2

    step(jnp.ones(2))
    assert seen == [True] and not backend.is_tracing


def test_to_cpu_returns_host_values_like_in_like_out():
    backend = cstorch.backend("CPU")
    t = torch.arange(6.0).reshape(2, 3).bfloat16()
    got = backend.to_cpu({"t": t, "j": jnp.arange(3), "n": 4})
    assert isinstance(got["t"], torch.Tensor) and torch.equal(got["t"], t)
    assert isinstance(got["j"], np.ndarray)
    np.testing.assert_array_equal(got["j"], np.arange(3))
    assert got["n"] == 4

    @cstorch.trace
    def step(x):
        return backend.to_cpu(x)

    with pytest.raises(cstorch.TensorReadError, match="step_closure"):
        step(jnp.ones(2))


def test_device_works_where_jax_wants_its_device():
    backend = cstorch.backend("CPU")
    x = jax.device_put(np.ones(3), backend.jax_device)
    assert x.devices() == {backend.device}


# ---- cstorch.backends.csx flags ----------------------------------------------------------


def test_flags_are_set_by_assignment_and_read_back():
    csx = cstorch.backends.csx
    assert csx.debug.execute_crd_memory_gi is None  # the default
    csx.debug.execute_crd_memory_gi = 10
    csx.performance.micro_batch_size = 4
    csx.precision.optimization_level = 2
    csx.performance.transfer_processes = 3
    assert csx.debug.execute_crd_memory_gi == 10
    assert csx.performance.micro_batch_size == 4
    assert csx.precision.optimization_level == 2
    cstorch.reset()
    assert csx.precision.optimization_level == 1  # reset restores the defaults


@pytest.mark.parametrize(
    "group, name, value, match",
    [("debug", "execute_crd_memori_gi", 10, "Did you mean 'execute_crd_memory_gi'"),
     ("performance", "microbatch_size", 4, "Did you mean 'micro_batch_size'"),
     ("precision", "opt_level", 1, "Known flags: optimization_level")],
)
def test_an_unknown_flag_is_refused_with_the_known_ones(group, name, value, match):
    with pytest.raises(cstorch.ConfigError, match=match):
        setattr(getattr(cstorch.backends.csx, group), name, value)
    with pytest.raises(AttributeError, match=match):
        getattr(getattr(cstorch.backends.csx, group), name)


@pytest.mark.parametrize(
    "group, name, value",
    [("precision", "optimization_level", 3), ("performance", "micro_batch_size", 0),
     ("performance", "micro_batch_size", "fast"), ("debug", "drop_data", "yes"),
     ("debug", "wgt_memory_gi", -1)],
)
def test_a_bad_flag_value_is_refused(group, name, value):
    with pytest.raises(cstorch.ConfigError, match=f"{group}.{name} expects"):
        setattr(getattr(cstorch.backends.csx, group), name, value)


def test_a_group_cannot_be_replaced():
    with pytest.raises(cstorch.ConfigError, match="group of flags"):
        cstorch.backends.csx.debug = {}
    with pytest.raises(cstorch.ConfigError, match="debug, performance, precision"):
        cstorch.backends.csx.perf = {}


def _losses(micro_flag):
    cstorch.reset()
    cstorch.amp.set_half_dtype("float32")
    if micro_flag is not None:
        cstorch.backends.csx.performance.micro_batch_size = micro_flag
    backend = cstorch.backend("CSX", cluster_config=ClusterConfig())
    model = cstorch.compile(cstorch.FunctionalModel(mlp_apply, mlp_params(0)), backend)
    step = xent_step(model, cstorch.optim.SGD(model.parameters(), lr=0.1))
    data = batches(5)
    losses = np.array([float(step(x, y)) for x, y in data])
    loops = step.lower(*data[0]).as_text().count("while")
    return losses, backend, loops


def test_micro_batch_size_flag_is_applied_to_the_csx_cluster():
    ref, _, ref_loops = _losses(None)
    losses, backend, loops = _losses(8)  # batches of 32 rows: 4 micro-batches
    assert backend.cluster_config.micro_batch_size == 8
    assert rel_err(losses, ref) <= 1e-6, (losses, ref)
    assert loops > ref_loops  # the model call runs as a loop over micro-batches


def test_micro_batch_flag_statuses_in_the_report():
    cstorch.backends.csx.performance.micro_batch_size = "explore"
    cstorch.backends.csx.debug.act_memory_gi = 4
    backend = cstorch.backend("CSX", cluster_config=ClusterConfig(micro_batch_size=2))
    assert backend.cluster_config.micro_batch_size == 2  # "explore" applies nothing
    report = "\n".join(flags_report(backend))
    assert "csx.performance.micro_batch_size: 'explore' (recorded, not applied" in report
    assert "csx.debug.act_memory_gi: 4 (recorded, not applied" in report
    cstorch.backends.csx.performance.micro_batch_size = 4
    assert any("ClusterConfig(micro_batch_size=2) sets it" in line
               for line in flags_report(backend))


def test_flags_and_appliance_fields_are_recorded_in_the_compile_report(tmp_path):
    cstorch.backends.csx.precision.optimization_level = 0
    cstorch.backends.csx.performance.micro_batch_size = 16
    cluster = ClusterConfig(mgmt_address="mgmt:9000", job_priority="p2")
    backend = cstorch.backend("CSX", cluster_config=cluster, compile_only=True,
                              compile_dir=str(tmp_path / "compile"))
    model = cstorch.compile(cstorch.FunctionalModel(mlp_apply, mlp_params(0)), backend)
    step = xent_step(model, cstorch.optim.SGD(model.parameters(), lr=0.1))
    step(*batches(1)[0])
    report = (tmp_path / "compile" / "training_step.memory.txt").read_text()
    assert "csx.precision.optimization_level: 0 (recorded, not applied" in report
    assert ("csx.performance.micro_batch_size: 16 (applied: "
            "ClusterConfig.micro_batch_size)") in report
    assert "cluster_config.mgmt_address: 'mgmt:9000' (recorded, not applied" in report
    assert "cluster_config.job_priority: 'p2'" in report


# ---- ClusterConfig 2.10 fields ------------------------------------------------------------


def test_cluster_config_accepts_the_2_10_fields_and_applies_none():
    fields = dict(mgmt_address="host:443", mgmt_namespace="ns", credentials_path="/c.pem",
                  cbcore_image="img:1", job_priority="p1", job_time_sec=3600,
                  automount=True, mount_all=False, disable_mount_check=True,
                  disable_version_check=True, workflow_id="wf", notifications=[{"x": 1}])
    cluster = ClusterConfig(num_csx=1, max_wgt_servers=0, max_act_per_csx=0, **fields)
    assert cluster.appliance_settings() == fields
    assert (cluster.max_wgt_servers, cluster.max_act_per_csx) == (24, 1)  # the system's
    backend = cstorch.backend("CSX", cluster_config=cluster)
    assert backend.cluster_config.appliance_settings() == fields


def test_cluster_config_takes_none_from_a_config_dict():
    runconfig = {}  # cstorch scripts pass runconfig.get(...) for every field
    cluster = ClusterConfig(num_csx=runconfig.get("num_csx"),
                            max_wgt_servers=runconfig.get("num_wgt_servers"),
                            num_workers_per_csx=runconfig.get("num_workers_per_csx"),
                            max_act_per_csx=runconfig.get("num_act_servers"))
    assert (cluster.num_csx, cluster.max_wgt_servers, cluster.num_workers_per_csx,
            cluster.max_act_per_csx) == (1, 24, 1, 1)


# ---- top-level helpers ----------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [None, torch.float16, torch.int32])
def test_full_ones_zeros_match_torch(dtype):
    assert torch.equal(cstorch.full((2, 3), 7, dtype=dtype), torch.full((2, 3), 7, dtype=dtype))
    assert torch.equal(cstorch.ones((4,), dtype=dtype), torch.ones((4,), dtype=dtype))
    assert torch.equal(cstorch.zeros(3, dtype=dtype), torch.zeros(3, dtype=dtype))
    t = torch.arange(6, dtype=torch.float64).reshape(2, 3)
    pairs = ((cstorch.full_like(t, 2.5, dtype=dtype), torch.full_like(t, 2.5, dtype=dtype)),
             (cstorch.ones_like(t, dtype=dtype), torch.ones_like(t, dtype=dtype)),
             (cstorch.zeros_like(t, dtype=dtype), torch.zeros_like(t, dtype=dtype)))
    for ours, theirs in pairs:
        assert ours.dtype == theirs.dtype and torch.equal(ours, theirs)


def test_helpers_give_jax_arrays_for_jax_values():
    model = cstorch.compile(cstorch.FunctionalModel(mlp_apply, mlp_params(0)), "CPU")
    p = model.parameters()[0]
    z = cstorch.zeros_like(p)
    assert isinstance(z, jax.Array) and z.shape == p.shape and z.dtype == jnp.float32
    np.testing.assert_array_equal(cstorch.full_like(jnp.ones(2, jnp.bfloat16), 3),
                                  np.full(2, 3, ml_dtypes.bfloat16))
    f = cstorch.full((2,), 1.5, dtype=jnp.float32)
    assert isinstance(f, jax.Array)
    np.testing.assert_array_equal(f, [1.5, 1.5])


def test_from_numpy_and_to_numpy_round_trip():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = cstorch.from_numpy(a)
    assert torch.equal(t, torch.from_numpy(a))
    t[0, 0] = 9  # shares a writable array's memory, as torch.from_numpy
    assert a[0, 0] == 9
    frozen = np.arange(3.0)
    frozen.flags.writeable = False
    assert torch.equal(cstorch.from_numpy(frozen), torch.arange(3.0, dtype=torch.float64))
    b = np.arange(4, dtype=np.float32).astype(ml_dtypes.bfloat16)
    tb = cstorch.from_numpy(b)
    assert tb.dtype == torch.bfloat16 and torch.equal(tb, torch.arange(4.0).bfloat16())
    back = cstorch.to_numpy(tb)
    assert back.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(back, b)
    np.testing.assert_array_equal(cstorch.to_numpy(jnp.arange(3)), np.arange(3))


def test_make_constant_is_a_constant_of_the_graph():
    cstorch.backend("CPU")
    table = np.array([1.5, -2.25, 3.125], np.float32)

    @cstorch.trace
    def step(x):
        return x * cstorch.make_constant(table)

    np.testing.assert_array_equal(step(jnp.ones(3)), table)
    text = step.lower(jnp.ones(3)).as_text()
    assert "1.500000e+00, -2.250000e+00, 3.125000e+00" in text  # folded in as a literal
    t = torch.tensor([1.0, 2.0], requires_grad=True)
    c = cstorch.make_constant(t)
    assert isinstance(c, torch.Tensor) and not c.requires_grad and torch.equal(c, t.detach())

    @cstorch.trace
    def bad(x):
        return cstorch.make_constant(x * 2)

    with pytest.raises(cstorch.ConfigError, match="make_constant.*computes"):
        bad(jnp.ones(3))


def test_name_scope_names_the_ops_under_it():
    cstorch.backend("CPU")

    @cstorch.trace
    def step(x):
        with cstorch.name_scope("attention_block"):
            y = jnp.sin(x)
        return y + 1

    np.testing.assert_allclose(step(jnp.ones(2)), np.sin(1.0) + 1, rtol=1e-6)
    text = step.lower(jnp.ones(2)).as_text(debug_info=True)
    assert "attention_block" in text
    with pytest.raises(cstorch.ConfigError, match="name_scope"):
        cstorch.name_scope("")
