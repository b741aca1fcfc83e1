"""Building a run's objects from a validated config: imports, cache, backend, model, data."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

import jax
import optax

from .. import amp, metrics, optim
from ..models import compile as compile_model
from ..backend import ClusterConfig, backend
from ..data import DataLoader
from ..errors import ConfigError
from ._config import METRICS, InputSpec, JobConfig

__all__ = ["CacheCounter", "build_backend", "build_model", "resolve", "setup_compile_cache"]


# ---- imports ---------------------------------------------------------------------------
def add_python_paths(job: JobConfig, config_path: str) -> None:
    """Makes the working directory and ``runconfig.python_paths`` importable.

    Relative ``python_paths`` are taken relative to the directory of the config file.
    """
    base = os.path.dirname(os.path.abspath(config_path))
    paths = [os.getcwd()] + [
        os.path.normpath(os.path.join(base, p)) for p in job.run.cluster.get("python_paths") or ()
    ]
    for path in reversed(paths):
        if path not in sys.path:
            sys.path.insert(0, path)


def resolve(target: str, where: str) -> Any:
    """The object named by ``'package.module:name'`` or ``'path/to/file.py:name'``."""
    module_name, _, attr = target.partition(":")
    try:
        if module_name.endswith(".py"):
            module = _module_from_file(module_name)
        else:
            module = importlib.import_module(module_name)
    except (ImportError, FileNotFoundError) as e:
        raise ConfigError(
            f"{where}: cannot import {module_name!r} ({e}). Run the command from the "
            "directory that holds it, or list that directory in runconfig.python_paths."
        ) from None
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"{where}: {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ConfigError(f"{where}: {target!r} is a {type(obj).__name__}, not a callable")
    return obj


def _module_from_file(path: str) -> Any:
    path = os.path.abspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no file {path}")
    name = "_cerebrax_config_" + str(abs(hash(path)))
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def call(fn: Callable[..., Any], kwargs: dict[str, Any], where: str) -> Any:
    """``fn(**kwargs)``, a wrong keyword reported against the config key."""
    try:
        return fn(**kwargs)
    except TypeError as e:
        if "argument" not in str(e):
            raise
        raise ConfigError(f"{where}: {e}") from None


# ---- the compile cache -----------------------------------------------------------------
class CacheCounter:
    """Counts JAX persistent-cache hits and misses (JAX's own monitoring events)."""

    def __init__(self) -> None:
        self.hits = 0
        self.misses = 0

    def __call__(self, event: str, **kwargs: Any) -> None:
        if event == "/jax/compilation_cache/cache_hits":
            self.hits += 1
        elif event == "/jax/compilation_cache/cache_misses":
            self.misses += 1


def setup_compile_cache(directory: str) -> CacheCounter:
    """Points JAX's persistent compilation cache at ``directory`` (before any compile).

    Every program is cached, however small or quick to compile, so a second process with
    the same config loads its executables instead of running XLA again.
    """
    directory = os.path.abspath(os.path.join(directory, "jax_cache"))
    os.makedirs(directory, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", directory)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    counter = CacheCounter()
    jax.monitoring.register_event_listener(counter)
    return counter


# ---- backend and model -----------------------------------------------------------------
def build_backend(job: JobConfig, *, compile_only: bool = False, validate_only: bool = False):
    """The process's backend; only a CSX backend takes the compile/validate-only flags."""
    run = job.run
    if run.half_dtype is not None:
        amp.set_half_dtype(run.half_dtype)
    artifact_dir = os.path.join(run.model_dir, "cerebras_logs")
    if run.backend != "CSX":
        return backend(run.backend, artifact_dir=artifact_dir)
    return backend(
        "CSX",
        cluster_config=ClusterConfig(**run.cluster),
        artifact_dir=artifact_dir,
        compile_dir=run.compile_dir,
        compile_only=compile_only,
        validate_only=validate_only,
    )


def build_model(job: JobConfig, run_backend: Any):
    """``(compiled model, loss function)`` from the ``model`` section."""
    factory = resolve(job.model_factory, "model.factory")
    model = call(factory, job.model_kwargs, "model")
    if job.loss == "cross_entropy":
        loss_fn = _cross_entropy
    else:
        loss_fn = resolve(job.loss, "model.loss")
    return compile_model(model, run_backend), loss_fn


def _cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


def build_optimizer(job: JobConfig, compiled: Any):
    """``(optimizer, lr scheduler or None, grad scaler or None)``."""
    options = dict(job.optimizer)
    optimizer_type = options.pop("optimizer_type")
    learning_rate = options.pop("learning_rate", options.pop("lr", None))
    if isinstance(learning_rate, (int, float)) and not isinstance(learning_rate, bool):
        options["learning_rate"] = learning_rate
    try:
        optimizer = optim.configure_optimizer(optimizer_type, compiled.parameters(), **options)
    except ConfigError as e:
        raise ConfigError(f"optimizer: {e}") from None
    try:
        scheduler = optim.configure_lr_scheduler(optimizer, learning_rate)
    except ConfigError as e:
        raise ConfigError(f"optimizer.learning_rate: {e}") from None
    scaler = None
    if job.loss_scaling is not None:
        scaler = call(amp.GradScaler, job.loss_scaling, "loss_scaling")
    return optimizer, scheduler, scaler


def build_metrics(job: JobConfig) -> list[tuple[Any, str]]:
    """``[(metric, what it reads)]`` for the ``metrics`` section."""
    built = []
    for spec in job.metrics:
        class_name, reads = METRICS[spec.kind]
        cls = getattr(metrics, class_name)
        built.append((call(cls, {"name": spec.name, **spec.kwargs}, f"metrics.{spec.name}"), reads))
    return built


# ---- data --------------------------------------------------------------------------------
def build_loader(spec: InputSpec, *, num_steps: int | None = None, skip: int = 0) -> DataLoader:
    """A DataLoader over ``spec.input_fn``; ``skip`` drops the first batches (resume)."""
    input_fn = resolve(spec.input_fn, f"{spec.where}.input_fn")
    if skip:
        input_fn = _Skipping(input_fn, skip)
    return DataLoader(input_fn, num_steps=num_steps, **spec.kwargs)


class _Skipping:
    """Wraps an ``input_fn`` so its data starts ``skip`` batches in (across epochs).

    Used to resume when the DataLoader keeps no state of its own: the skipped batches
    are drawn from the source and dropped, so a source that reshuffles every epoch from
    a seeded generator still yields the uninterrupted run's sequence. Exact with one
    streamer (CPU, GPU, or one CSX worker); with several streaming workers each skips
    ``skip`` of its own batches, which only approximates the uninterrupted run.
    """

    def __init__(self, input_fn: Callable[..., Any], skip: int):
        self.input_fn = input_fn
        self.skip = skip

    def __call__(self, *args: Any, **kwargs: Any) -> _SkippingIterable:
        return _SkippingIterable(self.input_fn(*args, **kwargs), self.skip)


class _SkippingIterable:
    def __init__(self, source: Any, skip: int):
        self.source = source
        self.skip = skip

    def __len__(self) -> int:
        return len(self.source)

    def __iter__(self) -> Iterator[Any]:
        skip, self.skip = self.skip, 0
        while True:
            it = iter(self.source)
            empty = True
            for batch in it:
                empty = False
                if skip:
                    skip -= 1
                    continue
                yield batch
            if not skip or empty:
                return


def check_batch(batch: Any, spec: InputSpec) -> None:
    """Raises unless ``batch`` is an ``(inputs, targets)`` pair."""
    if not isinstance(batch, (tuple, list)) or len(batch) != 2:
        raise ConfigError(
            f"{spec.where}.input_fn must yield (inputs, targets) pairs, got a "
            f"{type(batch).__name__}"
            + (f" of length {len(batch)}" if isinstance(batch, (tuple, list)) else "")
        )
