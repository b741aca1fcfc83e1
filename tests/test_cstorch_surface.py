"""cstorch names that Model Zoo's models, layers and data code use: each has cstorch's
meaning, checked against a reference (torch, a closed form), or, for the names that only
steer the wafer's compiler, is recorded and leaves the computation unchanged; the
features cerebrax lacks raise UnsupportedOpError when used, never run differently."""

from __future__ import annotations

import dataclasses
import fnmatch
import itertools
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import cerebrax as cstorch
from cerebrax.core.annotation import AnnotationMode, create_annotation, recorded_annotations
from cerebrax.errors import ConfigError, UnsupportedOpError


@pytest.fixture(autouse=True)
def _fresh():
    cstorch.reset()
    yield
    cstorch.reset()


# ---- compiler annotations: recorded, computation unchanged ----------------------------
@dataclasses.dataclass
class _Named(AnnotationMode.Config):
    name: str


def _attribute(config, is_backward):
    return AnnotationMode.Attribute("named", f"{config.name}.{'bwd' if is_backward else 'fwd'}")


def test_create_annotation_records_and_runs_the_function_unchanged():
    before = len(recorded_annotations())
    annotate = create_annotation(_Named, _attribute, name="mm", enable_fwd=True, enable_bwd=False)
    matmul = annotate(torch.matmul)
    a, b = torch.randn(3, 4), torch.randn(4, 2)
    assert torch.equal(matmul(a, b), torch.matmul(a, b))
    record = recorded_annotations()[before]
    assert record.config == _Named(enable_fwd=True, enable_bwd=False, name="mm")
    assert record.forward == ("named", "mm.fwd") and record.backward is None


def test_create_annotation_refuses_a_config_that_is_not_an_annotation_config():
    with pytest.raises(ConfigError, match="AnnotationMode.Config"):
        create_annotation(dict, _attribute, name="x")
    with pytest.raises(ConfigError, match="_Named"):
        create_annotation(_Named, _attribute, nmae="typo")


def test_pol_sets_current_pol_inside_the_region_and_the_flag_outside():
    assert cstorch.current_pol() == 1  # backends.csx.precision.optimization_level's default
    seen = []
    inner = cstorch.pol(level=2)(lambda: seen.append(cstorch.current_pol()) or 7)
    outer = cstorch.pol(level=0)(lambda: (seen.append(cstorch.current_pol()), inner(),
                                          seen.append(cstorch.current_pol())))
    outer()
    assert seen == [0, 2, 0] and cstorch.current_pol() == 1
    cstorch.backends.csx.precision.optimization_level = 2
    assert cstorch.current_pol() == 2
    head = torch.nn.Linear(4, 2)
    x = torch.randn(3, 4)
    assert torch.equal(cstorch.pol(bwd_level=0)(head)(x), head(x))
    with pytest.raises(ConfigError, match="0, 1 or 2"):
        cstorch.pol(level=3)


def test_kernel_and_groups_annotaters_and_set_attribute_leave_values_unchanged():
    from cerebrax.lib import cerebras_pytorch_lib
    from cerebrax.utils.kernel import kernel_annotater
    from cerebrax.utils.num_kv_groups import groups_annotater

    q, k = torch.randn(2, 3, 4), torch.randn(2, 4, 3)
    fn = groups_annotater(2)(kernel_annotater("flash")(torch.matmul))
    assert torch.equal(fn(q, k), torch.matmul(q, k))
    assert groups_annotater(None)(torch.matmul)(q, k).shape == (2, 3, 3)
    with pytest.raises(ConfigError, match="key/value"):
        groups_annotater(0)
    t = torch.ones(2)
    cerebras_pytorch_lib.set_attribute(t, "cs.internal", {"source_vars": ["x"]})
    assert cerebras_pytorch_lib.recorded_attributes()[-1] == ((2,), "cs.internal",
                                                              {"source_vars": ["x"]})
    assert torch.equal(t, torch.ones(2))


def test_annotated_module_in_a_traced_step_trains_as_without_annotation():
    torch.manual_seed(0)
    plain = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 1))

    class Annotated(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            h = cstorch.pol(level=0, bwd_level=0)(self.inner[0])(x)
            return self.inner[2](self.inner[1](h)) * (1.0 if cstorch.current_pol() >= 0 else 2.0)

    ref_state = {k: v.clone() for k, v in plain.state_dict().items()}
    cstorch.backend("CPU")
    model = cstorch.compile(Annotated(plain))
    opt = cstorch.optim.SGD(model.parameters(), lr=0.1)

    @cstorch.trace
    def step(x, y):
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    eager = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 1))
    eager.load_state_dict(ref_state)
    eager_opt = torch.optim.SGD(eager.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(1)
    for _ in range(3):
        x, y = torch.randn(5, 4, generator=gen), torch.randn(5, 1, generator=gen)
        got = float(step(x, y))
        want = torch.nn.functional.mse_loss(eager(x), y)
        eager_opt.zero_grad()
        want.backward()
        eager_opt.step()
        np.testing.assert_allclose(got, want.item(), rtol=1e-6)


# ---- cstorch.nn -------------------------------------------------------------------------
def test_nn_functional_matmuls_equal_the_explicit_loops():
    from cerebrax.nn import functional as F

    gen = torch.Generator().manual_seed(0)
    experts, k, d_in, d_out = 4, 2, 5, 3
    x = torch.randn(2, 3, k, d_in, generator=gen)
    idx = torch.randint(0, experts, (2, 3, k), generator=gen)
    w = torch.randn(d_out, experts, d_in, generator=gen)
    want = torch.empty(2, 3, k, d_out)
    for b, s, j in itertools.product(range(2), range(3), range(k)):
        want[b, s, j] = w[:, idx[b, s, j], :] @ x[b, s, j]
    torch.testing.assert_close(F.sparse_matmul(x, idx, w), want, rtol=1e-6, atol=1e-6)

    x2 = torch.randn(2, 3, d_in, generator=gen)
    mask = torch.tensor([[1, 0, 1], [0, 0, 1]], dtype=torch.int16)
    w2 = torch.randn(d_out, d_in, generator=gen)
    got = F.sparse_act_matmul(x2, mask, w2, dense_capacity=2)
    for b, s in itertools.product(range(2), range(3)):
        expected = x2[b, s] @ w2.T if mask[b, s] else torch.zeros(d_out)
        torch.testing.assert_close(got[b, s], expected, rtol=1e-6, atol=1e-6)
    assert torch.equal(F.one_hot(torch.tensor([2, 0]), num_classes=3),
                       torch.nn.functional.one_hot(torch.tensor([2, 0]), num_classes=3))
    with pytest.raises(ValueError, match="indices"):
        F.sparse_matmul(x, idx[..., :1], w)


def test_nn_modules():
    a, b = torch.randn(4, 3), torch.randn(4, 3)
    loss = cstorch.nn.SmoothL1Loss(reduction="none", beta=0.5)
    assert torch.equal(loss(a, b), torch.nn.SmoothL1Loss(reduction="none", beta=0.5)(a, b))
    with pytest.raises(UnsupportedOpError, match="SelectiveGrad"):
        cstorch.nn.SelectiveGrad("*.weight")


# ---- features cerebrax lacks: an error when used, never a different run ---------------
@pytest.mark.parametrize("call", [
    lambda: cstorch.sparse.SparsityAlgorithm(),
    lambda: cstorch.sparse.Group(),
    lambda: cstorch.sparse.configure({"type": "static"}),
    lambda: __import__("cerebrax.sparse.configure", fromlist=["x"]).default_sparse_param_filter(
        "w", torch.ones(2, 2)),
    lambda: cstorch.experimental.start_implicit_loop(torch.ones(2), loop_dim=1),
    lambda: cstorch.experimental.get_loop_iteration_slice(torch.ones(2)),
    lambda: cstorch.experimental.update_implicit_loop(torch.ones(2)),
    lambda: cstorch.experimental.Compression("lossless"),
])
def test_features_cerebrax_lacks_raise_when_used(call):
    with pytest.raises(UnsupportedOpError, match="not (supported|implement)|cerebrax"):
        call()


@pytest.mark.parametrize("register", [
    lambda hook: cstorch.experimental.listener.register_traced_tensor_hook(hook),
    lambda hook: __import__("cerebrax.backend.ltc_backend", fromlist=["x"])
    .register_after_tensor_to_cpu(hook),
])
def test_compiler_only_hooks_are_accepted_never_called_and_change_nothing(register):
    """Model Zoo's default callbacks register a traced-tensor listener and a lazy-tensor
    transfer hook: both are accepted (a handle whose remove() works, also twice), the hook
    is never called, and a step trained with one registered gives the same values."""
    def train(with_hook: bool) -> list[float]:
        cstorch.reset()
        torch.manual_seed(0)
        module = torch.nn.Linear(3, 1)
        model = cstorch.compile(module, "CPU")
        opt = cstorch.optim.SGD(model.parameters(), lr=0.1)
        calls = []
        handle = register(lambda *a: calls.append(a)) if with_hook else None

        @cstorch.trace
        def step(x):
            loss = model(x).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss

        x = torch.arange(6.0).reshape(2, 3)
        losses = [float(step(x)) for _ in range(3)]
        if handle is not None:
            handle.remove()
            handle.remove()
        assert calls == []
        return losses

    assert train(True) == train(False)


def test_sparse_configure_is_the_function_and_its_module_imports():
    module = sys.modules["cerebrax.sparse.configure"]  # the attribute is the function

    assert callable(cstorch.sparse.configure) and module.__name__ == "cerebrax.sparse.configure"
    assert cstorch.sparse.configure is module.configure


# ---- utilities --------------------------------------------------------------------------
def test_call_once_runs_the_first_call_only():
    from cerebrax.utils.call_once import call_once

    calls = []

    @call_once()
    def setup(x):
        calls.append(x)
        return x + 1

    assert [setup(1), setup(2), setup(3)] == [2, 2, 2] and calls == [1]
    with pytest.raises(TypeError, match=r"@call_once\(\)"):
        call_once(lambda: None)


def test_nest_walks_as_torch_pytree_flattens():
    import torch.utils._pytree as pytree

    from cerebrax.utils.nest import recurse_spec, visit_torch_tensors

    tree = {"model": {"w": torch.ones(2), "b": 3}, "opt": [torch.zeros(1), (torch.ones(3), "s")]}
    leaves, spec = pytree.tree_flatten(tree)
    paths = [".".join(p) for p in recurse_spec(spec)]
    assert paths == ["model.w", "model.b", "opt.0", "opt.1.0", "opt.1.1"]
    assert len(paths) == len(leaves)
    got = [(s, t.shape) for s, t in visit_torch_tensors(tree, scope=["top"])]
    assert got == [(["top", "model", "w"], (2,)), (["top", "opt", 0], (1,)),
                   (["top", "opt", 1, 0], (3,))]


@pytest.mark.parametrize("pattern", ["*.weight", "fc.?.bias", "layer[12].*", "emb*", "x"])
def test_param_filters_match_as_fnmatch(pattern):
    from cerebrax.utils.utils import convert_glob_to_regex, make_param_filter

    names = ["fc.1.bias", "fc.12.bias", "enc.fc.weight", "fc.weight_g", "layer1.w",
             "layer3.w", "embed", "x", "xx"]
    keep = make_param_filter(pattern)
    for name in names:
        assert keep(name, None) == fnmatch.fnmatchcase(name, pattern), name
        assert bool(convert_glob_to_regex(pattern).search(name)) == fnmatch.fnmatchcase(
            name, pattern), name


def test_infer_batch_size():
    from cerebrax.utils.data.utils import Schedule, infer_batch_size

    assert infer_batch_size({"x": torch.zeros(4, 3), "y": [np.zeros(4)], "n": 7}) == 4
    assert infer_batch_size({"n": 7, "s": torch.tensor(1.0)}) is None
    with pytest.raises(ConfigError, match=r"\['y'\]\[0\] has 5"):
        infer_batch_size({"x": torch.zeros(4), "y": [torch.zeros(5)]})
    assert Schedule is cstorch.utils.data.Schedule


def test_rate_tracker_has_cstorchs_methods():
    from cerebrax.utils.tracker import RateTracker

    now = [0.0]
    tracker = RateTracker(clock=lambda: now[0])
    now[0] = 4.0
    tracker.add(8)
    assert (tracker.total_count, tracker.rate(), tracker.global_rate(),
            tracker.elapsed_seconds()) == (8, 2.0, 2.0, 4.0)
    tracker.reset()
    assert tracker.total_count == 0


def test_data_submodules():
    from cerebrax.utils.data import data_executor, sampler

    assert sampler.pad_index not in range(10**9)
    assert data_executor.DataExecutor is cstorch.utils.data.DataExecutor


def test_optim_and_metrics_submodules_are_cerebrax_classes():
    from cerebrax.optim import scheduler
    from cerebrax.optim.optimizer import Optimizer

    assert Optimizer is cstorch.optim.Optimizer
    assert issubclass(cstorch.optim.lr_scheduler.CosineDecayLR, scheduler.Scheduler)
    assert issubclass(cstorch.optim.weight_decay_scheduler.WeightDecayScheduler,
                      scheduler.Scheduler)
    assert scheduler.SequentialScheduler is cstorch.optim.lr_scheduler.SequentialLR
    assert scheduler.ChainedScheduler is cstorch.optim.lr_scheduler.ChainedScheduler
    assert cstorch.metrics.metric.Metric is cstorch.metrics.Metric


def test_distributed_names_in_one_process():
    dist = cstorch.distributed
    assert (dist.get_rank(), dist.get_world_size()) == (0, 1)
    spec = dist.service_resolver().cluster_spec
    assert (spec.rank, spec.num_csx, spec.num_workers_per_csx, spec.num_tasks) == (0, 1, 1, 1)
    assert spec.task() == dist.cluster_resolver.TaskSpec(0, 0, 0, spec.task().node_name)


def test_service_resolver_answers_for_each_streaming_worker():
    from cerebrax.data._streamers import StreamerInfo, bind

    for rank in range(6):
        with bind(StreamerInfo(num_csx=2, workers_per_csx=3, rank=rank, streamer=True,
                               workers=True)):
            spec = cstorch.distributed.service_resolver().cluster_spec
            task = spec.task()
        assert (task.rank, task.local_rank, task.wse_id) == (rank, rank % 3, rank // 3)
        assert (spec.num_csx, spec.num_workers_per_csx, spec.num_tasks) == (2, 3, 6)


def test_worker_cache_limit(tmp_path):
    dist = cstorch.distributed
    src = tmp_path / "data"
    src.mkdir()
    (src / "a.bin").write_bytes(b"x" * 1000)
    (src / "b.bin").write_bytes(b"y" * 24)
    hit, size, available = dist.hit_worker_cache_limit(str(src), str(tmp_path / "cache"))
    assert (hit, size) == (False, 1024) and available > 1024
    assert os.path.isabs(dist.WORKER_CACHE_ROOT)


def test_backend_types_and_args():
    from cerebrax.backend import BackendType, current_backend_impl, get_backend_args

    assert BackendType.from_str("csx").is_csx and not BackendType.CPU.is_csx
    with pytest.raises(ConfigError, match="TPU"):
        BackendType.from_str("TPU")
    assert "compile_only" in get_backend_args("CSX") and "compile_only" not in get_backend_args(
        BackendType.CPU)
    assert current_backend_impl(raise_exception=False) is None
    made = cstorch.backend("CPU")
    assert current_backend_impl() is made


def test_small_top_level_names():
    assert cstorch.amp.is_cbfloat16_tensor(torch.ones(2, dtype=torch.float16)) is False
    assert cstorch._generating_docs is False
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Sequential(torch.nn.ReLU()))
    cstorch.add_debug_name(model, "net")
    assert [cstorch.get_debug_name(m) for m in model.modules()] == ["net", "net.0", "net.1",
                                                                   "net.1.0"]


def test_load_gives_torch_tensors_under_the_cstorch_alias(tmp_path):
    path = tmp_path / "c.h5"
    cstorch.save({"model": {"w": np.arange(6, dtype=np.float32).reshape(2, 3)}, "step": 2}, path)
    assert not isinstance(cstorch.load(path)["model"]["w"], torch.Tensor)  # lazy, as before
    script = textwrap.dedent(f"""
        import cerebrax, torch
        cerebrax.enable_cstorch_alias()
        import cerebras.pytorch as cstorch
        state = cstorch.load({str(path)!r})
        w = state["model"]["w"]
        assert isinstance(w, torch.Tensor), type(w)
        assert torch.equal(w.t(), torch.arange(6.0).reshape(2, 3).t()) and state["step"] == 2
        cstorch.reset()
        assert isinstance(cstorch.load({str(path)!r})["model"]["w"], torch.Tensor)
        assert not isinstance(cstorch.load({str(path)!r}, return_torch=False)["model"]["w"],
                              torch.Tensor)
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_debug_args_flag_records_merges_and_is_reported_only_once_set():
    from cerebrax.backend import DebugArgs, flags_report

    args = cstorch.backends.csx.debug.debug_args
    assert args == DebugArgs() and flags_report() == []
    args.MergeFrom(DebugArgs({"ini": {"bools": {"x": True}}}))
    args.MergeFrom(DebugArgs({"ini": {"ints": {"n": 2}}, "labels": ["a"]}))
    assert cstorch.backends.csx.debug.debug_args.to_dict() == {
        "ini": {"bools": {"x": True}, "ints": {"n": 2}}, "labels": ["a"]}
    assert [line.split(":")[0] for line in flags_report()] == ["csx.debug.debug_args"]
    with pytest.raises(TypeError, match="DebugArgs"):
        args.MergeFrom({"ini": {}})
    cstorch.reset()
    assert cstorch.backends.csx.debug.debug_args == DebugArgs()


def test_dtypes_are_torch_dtypes_under_the_cstorch_alias():
    script = textwrap.dedent("""
        import cerebrax, jax.numpy as jnp, torch
        assert cerebrax.amp.get_half_dtype() == jnp.float16      # JAX dtypes without the alias
        assert cerebrax.amp.get_floating_point_dtype() == jnp.float32
        cerebrax.enable_cstorch_alias()
        import cerebras.pytorch as cstorch
        assert cstorch.amp.get_half_dtype() is torch.float16
        assert cstorch.amp.get_floating_point_dtype() is torch.float32
        assert cstorch.amp.get_floating_point_dtype(torch.float64) is torch.float64
        cstorch.amp.set_half_dtype("bfloat16")
        cstorch.backend("CSX")
        assert cstorch.amp.get_floating_point_dtype() is torch.bfloat16
        x = torch.as_tensor([1.0], dtype=cstorch.amp.get_floating_point_dtype())
        assert x.dtype is torch.bfloat16
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_streaming_batch_size_for_a_given_rank():
    from cerebrax.data._streamers import StreamerInfo, bind

    dist = cstorch.distributed
    assert dist.get_streaming_batch_size(10, global_rank=0) == 10
    with bind(StreamerInfo(num_csx=3, workers_per_csx=2, rank=0, streamer=False, workers=True)):
        assert dist.get_streaming_batch_size(10) == 10  # the user node
        # ranks 0-1 feed system 0 (4 samples), 2-3 system 1 (3), 4-5 system 2 (3)
        assert [dist.get_streaming_batch_size(10, global_rank=r) for r in range(6)] == [
            4, 4, 3, 3, 3, 3]
        with pytest.raises(ConfigError, match=r"\[0, 6\)"):
            dist.get_streaming_batch_size(10, global_rank=6)


def test_cluster_and_storage_flags_are_recorded():
    from cerebrax.backend import flags_report

    cstorch.backends.csx.cluster.auto_taint = True
    cstorch.backends.csx.storage.s3.profile = "dev"
    assert cstorch.backends.csx.storage.s3.profile == "dev"
    assert [line.split(":")[0] for line in flags_report()] == ["csx.cluster.auto_taint",
                                                              "csx.storage.s3.profile"]
    with pytest.raises(ConfigError, match="AWS profile"):
        cstorch.backends.csx.storage.s3.profile = 3
    with pytest.raises(ConfigError, match="s3 group"):
        cstorch.backends.csx.storage = None
    cstorch.reset()
    assert cstorch.backends.csx.storage.s3.profile is None


def test_the_remaining_argument_errors_name_the_argument(tmp_path):
    from cerebrax.lib import cerebras_pytorch_lib
    from cerebrax.nn import functional as F
    from cerebrax.storage import serializers

    with pytest.raises(ConfigError, match="non-empty string"):
        cerebras_pytorch_lib.set_attribute(torch.ones(1), "", 1)
    with pytest.raises(ValueError, match=r"weight must be \(out, experts, in\)"):
        F.sparse_matmul(torch.ones(1, 2, 3), torch.zeros(1, 2, dtype=torch.long),
                        torch.ones(4, 3))
    with pytest.raises(ValueError, match="act_mask"):
        F.sparse_act_matmul(torch.ones(2, 3, 4), torch.ones(2, 2), torch.ones(5, 4))
    with pytest.raises(ConfigError, match="torch.nn.Module"):
        cstorch.add_debug_name(object())
    with pytest.raises(ConfigError, match="True or False"):
        with serializers.use_external_link("yes"):
            pass
    with serializers.use_external_link(True):
        assert serializers.settings["use_external_link"] is True
    assert serializers.settings["use_external_link"] is False
    with pytest.raises(ConfigError, match="end_step"):
        cstorch.profiler.schedule(start_step=3, end_step=2)
    with pytest.raises(UnsupportedOpError, match="jax.profiler"):
        cstorch.profiler.profile(schedule=cstorch.profiler.schedule(start_step=1, end_step=2))
    with pytest.raises(UnsupportedOpError, match="torch.topk"):
        cstorch.cirh.FusedTopK(torch.ones(2, 3), k=1, dimension=1)
