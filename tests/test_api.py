"""The public surface: every documented name imports from where a ported script expects it."""

from __future__ import annotations

import subprocess
import sys

import pytest

import cerebrax as cstorch

PUBLIC = {
    "cerebrax": [
        "configure", "backend", "current_backend", "reset", "compile", "trace", "compile_step",
        "backward", "step_closure", "checkpoint_closure", "save", "load", "current_executor",
        "set_half_dtype", "FunctionalModel", "CompiledModel", "ModelAdapter",
        "register_model_adapter", "Parameter", "Backend", "TracedStep", "DeferredValue",
        "CerebraxError", "RecompileError", "TensorReadError", "UnsupportedOpError",
        "CheckpointError", "ConfigError", "BackendError", "StateError", "SummaryError",
        "summarize_scalar", "summarize_tensor", "__version__",
        "backends", "current_torch_device", "use_cs", "full", "full_like", "ones",
        "ones_like", "zeros", "zeros_like", "from_numpy", "to_numpy", "make_constant",
        "name_scope",
    ],
    "cerebrax.optim": ["Optimizer", "OptaxOptimizer", "ParamGroup", "SGD", "Adam", "AdamW",
                       "Adamax", "Adadelta", "Adagrad", "ASGD", "NAdam", "RAdam", "RMSprop",
                       "Rprop", "Lamb", "Lion", "Adafactor", "Muon", "configure_optimizer",
                       "from_torch",
                       "configure_lr_scheduler",
                       "clip_grad_norm_", "clip_grad_value_", "lr_scheduler", "transforms",
                       "weight_decay_scheduler"],
    "cerebrax.optim.transforms": ["sgd", "adam", "adamw", "adamax", "adadelta", "adagrad",
                                  "asgd", "nadam", "radam", "rmsprop", "rprop", "lamb", "lion",
                                  "adafactor", "muon", "scale_by_muon", "scale_by_torch_adam",
                                  "scale_by_torch_momentum"],
    "cerebrax.optim.lr_scheduler": [
        "LRScheduler", "ConstantLR", "PolynomialLR", "LinearLR", "ExponentialLR",
        "InverseExponentialTimeDecayLR", "InverseSquareRootDecayLR", "CosineDecayLR",
        "CosineAnnealingLR", "CosineAnnealingWarmRestarts", "StepLR", "MultiStepLR",
        "MultiplicativeLR", "PiecewiseConstantLR", "LambdaLR", "CyclicLR", "OneCycleLR",
        "SequentialLR", "ChainedScheduler", "ChainedLR", "ScalePerParamLR"],
    "cerebrax.optim.weight_decay_scheduler": [
        "WeightDecayScheduler", "ConstantWD", "PolynomialWD", "LinearWD", "ExponentialWD",
        "InverseExponentialTimeDecayWD", "InverseSquareRootDecayWD", "CosineDecayWD",
        "SequentialWD", "PiecewiseConstantWD", "MultiStepWD", "StepWD", "CosineAnnealingWD",
        "LambdaWD", "CosineAnnealingWarmRestartsWD", "MultiplicativeWD", "ChainedWD",
        "CyclicWD", "OneCycleWD", "ScalePerParamWD"],
    "cerebrax.schedules": ["linear", "cosine_decay", "polynomial", "constant", "exponential",
                           "cosine_annealing", "cyclic", "one_cycle", "sequential", "chained",
                           "LRScheduler", "configure_lr_scheduler", "ScalePerParamLR",
                           "WeightDecayScheduler", "CosineDecayWD"],
    "cerebrax.amp": ["GradScaler", "optimizer_step", "set_half_dtype", "get_half_dtype",
                     "get_half_dtype_str", "mixed_precision", "autocast",
                     "enable_mixed_precision", "get_floating_point_dtype",
                     "get_floating_point_dtype_str", "isfinite", "update_if_finite",
                     "round_to_cbfloat16"],
    "cerebrax.utils.data": ["DataLoader", "DataExecutor", "compute_num_steps",
                            "RestartableDataLoader", "DataLoaderCheckpoint",
                            "DistributedSampler", "Schedule", "SyntheticDataset"],
    "cerebrax.utils.benchmark": ["benchmark_dataloader", "Metrics"],
    "cerebrax.data": ["DataLoader", "DataExecutor", "current_executor", "to_device",
                      "RestartableDataLoader", "DataLoaderCheckpoint", "DistributedSampler",
                      "Schedule", "SyntheticDataset", "RateTracker", "Profiler",
                      "use_safe_start_method"],
    "cerebrax.distributed": ["ClusterConfig", "num_streamers", "get_streaming_rank",
                             "is_streamer", "get_streaming_batch_size", "num_tasks",
                             "get_ordinal", "is_master_ordinal", "num_receivers",
                             "get_worker_state", "initialize", "shutdown"],
    "cerebrax.legacy": ["initialize", "module", "dataloader", "Session"],
    "cerebrax.estimator": ["Estimator", "EstimatorSpec"],
    "cerebrax.metrics": ["Metric", "AccuracyMetric", "MeanMetric", "PerplexityMetric",
                         "FBetaScoreMetric", "MeanIOUMetric", "DiceCoefficientMetric",
                         "MeanPerClassAccuracyMetric", "AUCMetric", "PrecisionAtKMetric",
                         "RecallAtKMetric", "get_all_metrics"],
    "cerebrax.ckpt": ["save", "load", "is_checkpoint"],
    "cerebrax.backend": ["Backend", "BackendDevice", "ClusterConfig", "backends",
                         "flags_report", "hand_over", "is_handed_over", "materialize",
                         "current_torch_device", "use_cs"],
    "cerebrax.utils.tensorboard": ["SummaryWriter", "SummaryReader", "summarize_scalar",
                                   "summarize_tensor"],
    "cerebrax.errors": ["CerebraxError", "RecompileError", "TensorReadError"],
}


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_public_names(module):
    import importlib
    import importlib.util

    mod = importlib.import_module(module)
    # SyntheticDataset is a torch IterableDataset, loaded on first use.
    names = [name for name in PUBLIC[module]
             if name != "SyntheticDataset" or importlib.util.find_spec("torch")]
    missing = [name for name in names if not hasattr(mod, name)]
    assert not missing, f"{module} lacks {missing}"


def test_errors_share_one_base_and_the_builtin_kinds():
    assert issubclass(cstorch.RecompileError, cstorch.CerebraxError)
    assert issubclass(cstorch.ConfigError, ValueError)
    assert issubclass(cstorch.TensorReadError, RuntimeError)


def test_import_does_not_import_torch():
    code = "import sys, cerebrax; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"


def test_reset_forgets_what_the_process_recorded_and_keeps_its_wiring(tmp_path):
    """``cstorch.reset()`` returns the process to its state at import: recorded
    annotations, attributes, debug names and metrics are forgotten. It keeps the wiring
    modules installed once, and the checkpoint files that loaded arrays still read."""
    torch = pytest.importorskip("torch")
    import numpy as np

    from cerebrax._runtime import RUNTIME
    from cerebrax.core.annotation import recorded_annotations
    from cerebrax.lib import cerebras_pytorch_lib

    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    cstorch.add_debug_name(model, "net")
    cerebras_pytorch_lib.set_attribute(torch.ones(2), "cs.internal", 1)
    metric = cstorch.metrics.AccuracyMetric("acc")
    cstorch.ckpt.save({"w": np.ones(3, np.float32)}, tmp_path / "c.h5")
    loaded = cstorch.ckpt.load(tmp_path / "c.h5")  # its arrays read the file when used
    guards, adapters = list(RUNTIME.read_guards), list(RUNTIME.model_adapters)
    assert cstorch.get_debug_name(model[0]) == "net.0"
    assert cerebras_pytorch_lib.recorded_attributes()
    assert "acc" in cstorch.metrics.get_all_metrics()
    assert len(RUNTIME.open_checkpoints) == 1

    cstorch.reset()
    assert cstorch.get_debug_name(model[0]) == "linear"
    assert cerebras_pytorch_lib.recorded_attributes() == []
    assert recorded_annotations() == []
    assert cstorch.metrics.get_all_metrics() == {}
    assert RUNTIME.read_guards == guards and RUNTIME.model_adapters == adapters
    assert guards and adapters
    assert len(RUNTIME.open_checkpoints) == 1  # released before a save overwrites it
    cstorch.ckpt.save({"w": np.zeros(3, np.float32)}, tmp_path / "c.h5")
    np.testing.assert_array_equal(np.asarray(loaded["w"]), np.ones(3, np.float32))
    del metric


def test_a_block_open_across_reset_closes_cleanly():
    """What a with-block or a decorated call pushes on RUNTIME is taken off by that
    block, even where it ran ``cstorch.reset()`` inside."""
    from cerebrax.core.annotation import current_pol, pol
    from cerebrax.wse import recording_schedule

    with recording_schedule() as records:
        cstorch.reset()
    assert records == []

    @pol(level=2)
    def resetting():
        cstorch.reset()
        return current_pol()

    assert resetting() == 2
    assert current_pol() == 1
