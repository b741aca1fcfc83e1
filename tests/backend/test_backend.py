"""Backend, configure, ClusterConfig and compile: the misuse rules raise clear errors."""

from __future__ import annotations

import jax.numpy as jnp
import pytest
from helpers import compiled_mlp, mlp_apply, mlp_params

import cerebrax as cstorch
from cerebrax.distributed import ClusterConfig


@pytest.mark.parametrize("kind", ["CPU", "cpu", "CSX", "csx"])
def test_backend_types_are_case_insensitive(kind):
    backend = cstorch.backend(kind)
    assert backend.backend_type == kind.upper()
    assert cstorch.backend() is backend
    assert cstorch.current_backend() is backend


def test_backend_without_type_returns_none_or_current():
    assert cstorch.backend() is None
    assert cstorch.current_backend(raise_exception=False) is None


def test_invalid_backend_type():
    with pytest.raises(cstorch.ConfigError, match="Invalid Cerebras PyTorch backend type"):
        cstorch.backend("TPU")


def test_backend_arguments_without_type():
    with pytest.raises(cstorch.BackendError, match="no backend type"):
        cstorch.backend(None, artifact_dir="x")


def test_second_backend_is_refused_with_the_fix():
    cstorch.backend("CPU")
    with pytest.raises(cstorch.BackendError, match="Cannot instantiate multiple backends") as info:
        cstorch.backend("CSX")
    assert "cstorch.backend() with no arguments" in str(info.value)
    assert "cstorch.reset()" in str(info.value)


def test_cpu_backend_rejects_mixed_precision():
    with pytest.raises(cstorch.ConfigError, match="set_half_dtype"):
        cstorch.backend("CPU", mixed_precision=True)


def test_unknown_backend_option():
    with pytest.raises(cstorch.ConfigError, match=r"unknown option\(s\) \['compile_dir'\]"):
        cstorch.backend("CPU", compile_dir="/tmp/x")


def test_cpu_backend_takes_a_cluster_config_and_lays_nothing_out():
    # cstorch's backends all take cluster_config; gigaGPT passes its ClusterConfig to
    # cstorch.backend(config.backend, cluster_config=cs_config) on every backend.
    backend = cstorch.backend("CPU", cluster_config=ClusterConfig(num_csx=2))
    assert backend.is_cpu and getattr(backend, "layout", None) is None
    cstorch.reset()
    with pytest.raises(cstorch.ConfigError, match="ClusterConfig"):
        cstorch.backend("CPU", cluster_config={"num_csx": 1})


def test_gpu_backend_without_a_gpu():
    with pytest.raises(cstorch.ConfigError, match="no GPU"):
        cstorch.backend("GPU")


def test_current_backend_without_backend_names_the_fix():
    with pytest.raises(cstorch.BackendError, match="No active Cerebras backend found"):
        cstorch.current_backend()


def test_csx_backend_takes_the_cluster_config():
    config = ClusterConfig(num_csx=1, num_workers_per_csx=4, execution_mode="pipeline",
                           num_stages=2)
    backend = cstorch.backend("CSX", cluster_config=config)
    assert backend.cluster_config is config
    assert backend.is_csx and backend.is_e2e_execution


def test_csx_backend_rejects_a_non_cluster_config():
    with pytest.raises(cstorch.ConfigError, match="ClusterConfig"):
        cstorch.backend("CSX", cluster_config={"num_csx": 1})


def test_compile_only_and_validate_only_are_exclusive():
    with pytest.raises(cstorch.ConfigError, match="exclusive"):
        cstorch.backend("CSX", compile_only=True, validate_only=True)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"num_csx": 0}, "num_csx must be an integer >= 1"),
        ({"num_csx": -2}, "num_csx"),
        ({"max_wgt_servers": -1}, "max_wgt_servers"),
        ({"mgmt_address": 5}, "mgmt_address must be a string"),
        ({"disable_version_check": "yes"}, "disable_version_check must be a bool"),
        ({"job_time_sec": -3}, "job_time_sec"),
        ({"num_workers_per_csx": -1}, "num_workers_per_csx"),
        ({"transfer_processes": 1.5}, "transfer_processes"),
        ({"mount_dirs": "/data"}, "mount_dirs must be a list of strings"),
        ({"job_labels": ["owner"]}, "key=value"),
        ({"execution_mode": "tensor_parallel"}, "execution_mode must be one of"),
        ({"num_stages": 2}, "only applies to execution_mode='pipeline'"),
        ({"execution_mode": "pipeline", "num_replicas": 2}, "num_replicas"),
        ({"execution_mode": "pipeline", "num_stages": 0}, "num_stages"),
        ({"micro_batch_size": 0}, "micro_batch_size"),
    ],
)
def test_cluster_config_validation(kwargs, match):
    with pytest.raises(cstorch.ConfigError, match=match):
        ClusterConfig(**kwargs)


def test_cluster_config_accepts_mode_aliases():
    assert ClusterConfig(execution_mode="wse_replica", num_replicas=4).execution_mode == "replica"


def test_configure_every_seed_field():
    config = cstorch.configure(
        model_dir="./m", compile_dir="./c", compile_only=False, validate_only=False,
        checkpoint_steps=100, num_csx=2, max_wgt_servers=8, mount_dirs=["/data"],
        python_paths=["/code"], transfer_processes=3, num_workers_per_csx=2,
        job_labels=["team=ml"], max_act_per_csx=2,
    )
    assert config.checkpoint_steps == 100
    cluster = config.cluster_config
    assert (cluster.num_csx, cluster.max_wgt_servers, cluster.num_workers_per_csx) == (2, 8, 2)
    assert cluster.mount_dirs == ["/data"] and cluster.job_labels == ["team=ml"]
    compiled = cstorch.compile(cstorch.FunctionalModel(mlp_apply, mlp_params()), "wse_ws")
    assert compiled.backend.is_csx
    assert compiled.backend.cluster_config.num_csx == 2
    assert compiled.backend.cluster_config.execution_mode == "weight_streaming"


def test_configure_twice_is_refused():
    cstorch.configure()
    with pytest.raises(cstorch.BackendError, match="already called"):
        cstorch.configure()


def test_configure_after_the_model_is_refused():
    cstorch.FunctionalModel(mlp_apply, mlp_params())  # a plain template registers nothing
    metric = cstorch.metrics.AccuracyMetric("acc")  # noqa: F841 (registered state)
    with pytest.raises(cstorch.BackendError, match="before the model is instantiated"):
        cstorch.configure()


def test_configure_after_the_backend_is_refused():
    cstorch.backend("CPU")
    with pytest.raises(cstorch.BackendError, match="before the backend is created"):
        cstorch.configure()


def test_configure_rejects_a_bad_checkpoint_interval():
    with pytest.raises(cstorch.ConfigError, match="checkpoint_steps"):
        cstorch.configure(checkpoint_steps=-1)


def test_compile_with_another_backend_object_is_refused():
    from cerebrax.backend import Backend

    cstorch.backend("CPU")
    stranger = Backend("CPU")
    with pytest.raises(cstorch.BackendError, match="different backend"):
        cstorch.compile(cstorch.FunctionalModel(mlp_apply, mlp_params()), stranger)


def test_compile_with_another_backend_type_is_refused():
    cstorch.backend("CPU")
    with pytest.raises(cstorch.BackendError, match="asks for a CSX backend"):
        cstorch.compile(cstorch.FunctionalModel(mlp_apply, mlp_params()), "CSX")


def test_compile_with_another_execution_mode_is_refused():
    cstorch.compile(cstorch.FunctionalModel(mlp_apply, mlp_params()), "wse_pipeline")
    with pytest.raises(cstorch.BackendError, match="execution_mode='replica'"):
        cstorch.compile(cstorch.FunctionalModel(mlp_apply, mlp_params()), "wse_replica")


def test_compile_without_backend_creates_a_cpu_backend():
    compiled = cstorch.compile(cstorch.FunctionalModel(mlp_apply, mlp_params()))
    assert cstorch.backend().backend_type == "CPU"
    assert compiled.backend is cstorch.backend()


def test_compile_rejects_unknown_models():
    with pytest.raises(cstorch.ConfigError, match="does not know how to compile a dict"):
        cstorch.compile({"w": jnp.ones(3)}, "CPU")


def test_state_from_before_a_reset_is_refused():
    model = compiled_mlp()
    stale = model.parameters()
    cstorch.reset()
    with pytest.raises(cstorch.StateError, match="reset"):
        cstorch.optim.SGD(stale, lr=0.1)
        model.parameters()[0].check_generation()


def test_model_from_before_a_reset_cannot_be_stepped():
    model = compiled_mlp()
    cstorch.reset()

    @cstorch.trace
    def step(x):
        return model(x).sum()

    with pytest.raises(cstorch.StateError, match="reset"):
        step(jnp.ones((2, 8)))


def test_compiled_model_surface():
    model = compiled_mlp()
    names = [n for n, _ in model.named_parameters()]
    assert names == ["fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight"]
    state = model.state_dict()
    assert list(state) == names
    state["fc1.bias"] = state["fc1.bias"] + 1.0
    result = model.load_state_dict(state)
    assert result.missing_keys == [] and result.unexpected_keys == []
    assert (model.state_dict()["fc1.bias"] == state["fc1.bias"]).all()
    with pytest.raises(cstorch.StateError, match="missing keys"):
        model.load_state_dict({"fc1.bias": state["fc1.bias"]})
    with pytest.raises(cstorch.StateError, match="size mismatch for 'fc1.bias'"):
        model.load_state_dict({**state, "fc1.bias": jnp.ones(3)})
    assert model.train() is model and model.training
    assert model.eval() is model and not model.training


def test_torch_module_without_bridge_names_the_fix():
    torch = pytest.importorskip("torch")
    import importlib.util

    if importlib.util.find_spec("torch_bridge") is not None:
        pytest.skip("the torch bridge is installed")
    with pytest.raises(cstorch.ConfigError, match="torch bridge"):
        cstorch.compile(torch.nn.Linear(2, 2), "CPU")


def test_backend_impl_is_the_backend_as_cstorch_code_reads_it():
    """Model Zoo reads ``trainer.backend._impl.is_e2e_execution``."""
    backend = cstorch.backend("CPU")
    assert backend._impl is backend
    assert backend._impl.is_e2e_execution is True
    assert backend._impl.device is backend.device


@pytest.mark.parametrize("kind", ["CPU", "CSX"])
def test_backend_takes_the_backend_type_enum_and_artifact_dir_positionally(kind, tmp_path):
    """Model Zoo passes ``BackendType.CPU`` (``BackendType.from_str``) and
    ``cstorch.backend(device, artifact_dir)``; ``backend_type`` is the enum member, which is
    also the string of its name."""
    from cerebrax.backend import BackendType

    kind = BackendType[kind]
    backend = cstorch.backend(BackendType.from_str(kind.name.lower()), str(tmp_path))
    assert backend.backend_type is kind and backend.backend_type == kind.name
    assert backend.backend_type.name.lower() == kind.name.lower()
    assert backend.artifact_dir == str(tmp_path)
    assert getattr(backend, f"is_{kind.name.lower()}")


def test_backend_refuses_two_positional_options_naming_the_one_it_takes(tmp_path):
    with pytest.raises(cstorch.ConfigError, match="one positional option, artifact_dir"):
        cstorch.backend("CPU", str(tmp_path), True)
    with pytest.raises(cstorch.ConfigError, match="and artifact_dir="):
        cstorch.backend("CPU", str(tmp_path), artifact_dir=str(tmp_path))
