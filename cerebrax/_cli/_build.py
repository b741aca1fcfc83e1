"""Building a run's objects from a validated config: imports, cache, backend, model, data."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import inspect
import os
import random
import sys
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np
import optax

from .. import amp, metrics, optim
from ..models import compile as compile_model
from ..backend import ClusterConfig, backend
from ..backend import _compile_cache
from .._step import as_jax
from ..data import DataLoader, compute_num_steps
from ..data._progress import write
from ..errors import ConfigError
from . import _modelzoo
from ._config import METRICS, InputSpec, JobConfig

__all__ = ["CacheCounter", "build_backend", "build_model", "resolve", "setup_compile_cache"]


# ---- imports ---------------------------------------------------------------------------
def add_python_paths(python_paths: list[str], config_path: str) -> None:
    """Makes the working directory and ``python_paths`` (the config's
    ``runconfig.python_paths``, see :func:`._config.python_paths`) importable.

    Relative ``python_paths`` are taken relative to the directory of the config file.
    """
    base = os.path.dirname(os.path.abspath(config_path))
    paths = [os.getcwd()] + [os.path.normpath(os.path.join(base, p)) for p in python_paths]
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
    """``fn(**kwargs)``, a keyword ``fn`` does not take reported against its config key."""
    check_arguments(fn, kwargs, where)
    try:
        return fn(**kwargs)
    except TypeError as e:
        if "argument" not in str(e):
            raise
        raise ConfigError(f"{where}: {e}") from None


def check_arguments(fn: Callable[..., Any], kwargs: dict[str, Any], where: str) -> None:
    """Raises naming ``where.key`` for a key of ``kwargs`` that ``fn`` does not take."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # no signature to check against: fn itself checks
        return
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return
    takes = [n for n, p in params.items() if p.kind not in (p.VAR_POSITIONAL, p.POSITIONAL_ONLY)]
    for key in kwargs:
        if key not in takes:
            name = getattr(fn, "__qualname__", type(fn).__name__)
            raise ConfigError(
                f"{where}.{key}: {name}() takes no argument {key!r}; it takes "
                f"{', '.join(takes) or 'none'}. Remove the key or add the argument."
            )


def _with_seed(fn: Callable[..., Any], kwargs: dict[str, Any], seed: int | None) -> dict:
    """``kwargs`` plus ``seed=seed`` when ``fn`` takes a ``seed`` the config left unset."""
    if seed is None or "seed" in kwargs:
        return kwargs
    try:
        takes_seed = "seed" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        takes_seed = False
    return {**kwargs, "seed": seed} if takes_seed else kwargs


def seed_generators(seed: int | None) -> None:
    """Seeds Python's, numpy's and (when installed) torch's global generators.

    JAX has no global generator: a model's initial parameters come from the keys its
    factory makes, so the factories get ``seed`` as an argument (:func:`_with_seed`).
    """
    if seed is None:
        return
    random.seed(seed)
    np.random.seed(seed)
    if importlib.util.find_spec("torch") is not None:
        import torch

        torch.manual_seed(seed)


def resolve_num_steps(job: JobConfig) -> JobConfig:
    """``job`` with ``num_steps`` counted from ``num_epochs`` passes over the train data."""
    run = job.run
    if run.num_epochs is None:
        return job
    loader = build_loader(job.train_input, seed=run.seed)
    steps = compute_num_steps(loader.source_length(), num_epochs=run.num_epochs)
    write(f"[cerebrax] {run.num_epochs} epoch(s) of {job.train_input.where}: {steps} steps")
    return dataclasses.replace(job, run=dataclasses.replace(run, num_steps=steps))


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
    """Points JAX's persistent compilation cache at ``directory/jax_cache`` (before any
    compile; see ``cerebrax.backend._compile_cache`` for the switches that keep it off).

    Every program is cached, however small or quick to compile, so a second process with
    the same config loads its executables instead of running XLA again.
    """
    _compile_cache.enable(directory)
    counter = CacheCounter()
    jax.monitoring.register_event_listener(counter)
    return counter


# ---- backend and model -----------------------------------------------------------------
def build_backend(job: JobConfig, *, compile_only: bool = False, validate_only: bool = False):
    """The process's backend; only a CSX backend takes the compile/validate-only flags."""
    run = job.run
    if run.precision_opt_level is not None:
        write(
            f"[cerebrax] {run.where}.precision_opt_level: {run.precision_opt_level} (recorded "
            "only: the emulated wafer computes in half_dtype, with no precision levels)"
        )
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
    """``(compiled model, loss function)`` from the ``model`` section.

    A Model Zoo model (``model.name``) returns its loss: its loss function is None.
    """
    where = job.model_where
    if job.model_name is not None:
        seed_generators(job.run.seed)
        return compile_model(_modelzoo.build_model(job), run_backend), None
    factory = resolve(job.model_factory, f"{where}.factory")
    seed_generators(job.run.seed)
    model = call(factory, _with_seed(factory, job.model_kwargs, job.run.seed), where)
    if job.loss == "cross_entropy":
        loss_fn = _cross_entropy
    else:
        loss_fn = resolve(job.loss, f"{where}.loss")
    return compile_model(model, run_backend), loss_fn


def _cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    logits, labels = as_jax((logits, labels))  # a torch model's outputs are torch tensors
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


def build_optimizer(job: JobConfig, compiled: Any):
    """``(optimizer, lr scheduler or None, grad scaler or None)``."""
    options = dict(job.optimizer)
    optimizer_type = options.pop("optimizer_type")
    learning_rate = options.pop("learning_rate")
    if isinstance(learning_rate, (int, float)):  # a schedule is the scheduler's
        options["learning_rate"] = learning_rate
    where = job.optimizer_where
    try:
        optimizer = optim.configure_optimizer(optimizer_type, compiled.parameters(), **options)
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None
    try:
        scheduler = optim.configure_lr_scheduler(optimizer, learning_rate)
    except ConfigError as e:
        raise ConfigError(f"{where}.learning_rate: {e}") from None
    scaler = None
    if job.loss_scaling is not None:
        kwargs = {k: v for k, v in job.loss_scaling.items() if v is not None}
        try:
            scaler = amp.GradScaler(**kwargs)
        except ConfigError as e:
            raise ConfigError(f"{job.loss_scaling_where}: {e}") from None
    return optimizer, scheduler, scaler


def build_metrics(job: JobConfig, model: Any = None) -> list[tuple[Any, str | None]]:
    """``[(metric, what it reads)]`` for the ``metrics`` section; for a Model Zoo model,
    the metrics the compiled ``model`` updates itself, each reading None."""
    if job.model_name is not None:
        return [(metric, None) for metric in _modelzoo.model_metrics(model.model)]
    built = []
    for spec in job.metrics:
        class_name, reads = METRICS[spec.kind]
        cls = getattr(metrics, class_name)
        built.append((call(cls, {"name": spec.name, **spec.kwargs}, f"metrics.{spec.name}"), reads))
    return built


# ---- data --------------------------------------------------------------------------------
def build_loader(
    spec: InputSpec, *, num_steps: int | None = None, skip: int = 0, seed: int | None = None
) -> DataLoader:
    """A DataLoader over ``spec.input_fn``; ``skip`` drops the first batches (resume).

    ``seed`` (the run's) is passed to an ``input_fn`` that takes one its section left unset.
    A Model Zoo data processor's dataloader is the input of a ``data_processor``.
    """
    if spec.data_processor is not None:
        input_fn, kwargs = _modelzoo.input_fn(spec)
    else:
        input_fn = resolve(spec.input_fn, f"{spec.where}.input_fn")
        kwargs = _with_seed(input_fn, spec.kwargs, seed)
        check_arguments(input_fn, kwargs, spec.where)
    if skip:
        input_fn = _Skipping(input_fn, skip)
    return DataLoader(input_fn, num_steps=num_steps, **kwargs)


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
