"""The `cerebrax` command's YAML config: reading, overrides, and validation.

A config is a Model-Zoo-style mapping. Every problem raises :class:`ConfigError` naming
the key path (``runconfig.num_steps``, ``optimizer.optimizer_type``), so the command can
print one line and exit with status 2.
"""

from __future__ import annotations

import copy
import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from .._filters import is_strict_int
from ..backend import ClusterConfig
from ..errors import ConfigError

__all__ = [
    "InputSpec",
    "JobConfig",
    "MetricSpec",
    "RunSpec",
    "apply_overrides",
    "load_config",
    "parse",
    "require",
    "set_value",
]

TOP_LEVEL_KEYS = (
    "model",
    "train_input",
    "eval_input",
    "optimizer",
    "loss_scaling",
    "max_gradient_norm",
    "max_gradient_value",
    "metrics",
    "runconfig",
)
CLUSTER_KEYS = tuple(f.name for f in dataclasses.fields(ClusterConfig))
RUNCONFIG_KEYS = (
    "num_steps",
    "checkpoint_steps",
    "log_steps",
    "model_dir",
    "compile_dir",
    "backend",
    "half_dtype",
    "checkpoint_path",
) + CLUSTER_KEYS
BACKENDS = ("CPU", "GPU", "CSX")
HALF_DTYPES = ("float16", "bfloat16", "float32", "cbfloat16")
# Metrics the eval loop knows how to feed: name -> (cstorch.metrics class, what it reads).
METRICS = {
    "accuracy": ("AccuracyMetric", "predictions"),
    "fbeta_score": ("FBetaScoreMetric", "predictions"),
    "mean_iou": ("MeanIOUMetric", "predictions"),
    "mean_per_class_accuracy": ("MeanPerClassAccuracyMetric", "predictions"),
    "dice_coefficient": ("DiceCoefficientMetric", "predictions"),
    "perplexity": ("PerplexityMetric", "loss"),
}


@dataclasses.dataclass(frozen=True)
class InputSpec:
    """One input section: ``input_fn`` (an import path) called with ``kwargs``."""

    input_fn: str
    kwargs: dict[str, Any]
    num_steps: int | None
    where: str


@dataclasses.dataclass(frozen=True)
class MetricSpec:
    name: str
    kind: str
    kwargs: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """The ``runconfig`` section, with defaults filled in."""

    num_steps: int | None
    checkpoint_steps: int
    log_steps: int
    model_dir: str
    compile_dir: str
    backend: str
    half_dtype: str | None
    checkpoint_path: str | None
    cluster: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class JobConfig:
    """A validated config. Only shapes and types are checked here; objects are built later."""

    model_factory: str
    model_kwargs: dict[str, Any]
    loss: str
    train_input: InputSpec | None
    eval_input: InputSpec | None
    optimizer: dict[str, Any] | None
    loss_scaling: dict[str, Any] | None
    max_gradient_norm: float | None
    max_gradient_value: float | None
    metrics: tuple[MetricSpec, ...]
    run: RunSpec


# ---- reading ---------------------------------------------------------------------------
def load_config(path: str, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """Reads the YAML file at ``path`` and applies ``key.path=value`` overrides."""
    try:
        with open(path) as f:
            raw = yaml.safe_load(f)
    except OSError as e:
        raise ConfigError(f"cannot read the config file {path!r}: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path} is not valid YAML: {e}") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(
            f"{path} must hold a mapping (model:, train_input:, optimizer:, runconfig: ...), "
            f"got a {type(raw).__name__}"
        )
    return apply_overrides(raw, overrides)


def apply_overrides(config: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Sets each ``a.b.c=value`` (value parsed as YAML) in a copy of ``config``."""
    config = copy.deepcopy(config)
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not all(key.split(".")):
            raise ConfigError(
                f"override {item!r} must look like key.path=value, e.g. runconfig.num_steps=100"
            )
        try:
            value = yaml.safe_load(text) if text else None
        except yaml.YAMLError:
            value = text
        set_value(config, key, value, item)
    return config


def set_value(config: dict[str, Any], key: str, value: Any, item: str | None = None) -> None:
    """Sets the dotted ``key`` of ``config`` to ``value``, creating mappings on the way."""
    parts = key.split(".")
    node = config
    for depth, part in enumerate(parts[:-1]):
        child = node.setdefault(part, {})
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            where = ".".join(parts[: depth + 1])
            raise ConfigError(
                f"override {item or key!r}: {where} is a {type(child).__name__}, not a mapping"
            )
        node = child
    node[parts[-1]] = value


# ---- checks ----------------------------------------------------------------------------
def _mapping(value: Any, where: str, *, optional: bool = False) -> dict[str, Any]:
    if value is None and optional:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where} must be a mapping, got {_show(value)}")
    for key in value:
        if not isinstance(key, str):
            raise ConfigError(f"{where} has a non-string key {key!r}")
    return dict(value)


def _int(value: Any, where: str, minimum: int) -> int:
    if not is_strict_int(value) or value < minimum:
        relation = f">= {minimum}" if minimum != 1 else "> 0"
        raise ConfigError(f"{where} must be an integer {relation}, got {_show(value)}")
    return value


def _positive(value: Any, where: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ConfigError(f"{where} must be a number > 0, got {_show(value)}")
    return float(value)


def _string(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where} must be a non-empty string, got {_show(value)}")
    return value


def _import_path(value: Any, where: str) -> str:
    text = _string(value, where)
    module, sep, attr = text.partition(":")
    if not sep or not module or not attr:
        raise ConfigError(
            f"{where} must be an import path 'package.module:name' (or "
            f"'path/to/file.py:name'), got {text!r}"
        )
    return text


def _unknown(section: Mapping[str, Any], allowed: Sequence[str], where: str) -> None:
    extra = [k for k in section if k not in allowed]
    if extra:
        raise ConfigError(
            f"{where}.{extra[0]} is not a known key; {where} takes {', '.join(allowed)}"
            if where
            else f"{extra[0]} is not a known top-level key; a config takes {', '.join(allowed)}"
        )


def _show(value: Any) -> str:
    """A value as the message shows it: numbers bare, anything else with its type."""
    if value is None:
        return "nothing (null)"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return repr(value)
    return f"{type(value).__name__} {value!r}"


# ---- the sections ----------------------------------------------------------------------
def _input(raw: Any, where: str) -> InputSpec | None:
    if raw is None:
        return None
    section = _mapping(raw, where)
    if "input_fn" not in section:
        raise ConfigError(
            f"{where}.input_fn is required: the import path of the function "
            "that builds the batches, e.g. examples.digits:input_fn"
        )
    input_fn = _import_path(section.pop("input_fn"), f"{where}.input_fn")
    num_steps = section.pop("num_steps", None)
    if num_steps is not None:
        num_steps = _int(num_steps, f"{where}.num_steps", 1)
    if "batch_size" in section:
        _int(section["batch_size"], f"{where}.batch_size", 1)
    return InputSpec(input_fn, section, num_steps, where)


def _optimizer(raw: Any) -> dict[str, Any] | None:
    if raw is None:
        return None
    section = _mapping(raw, "optimizer")
    _string(section.get("optimizer_type"), "optimizer.optimizer_type")
    rate = section.get("learning_rate", section.get("lr"))
    if rate is None or isinstance(rate, bool):
        raise ConfigError(
            "optimizer.learning_rate must be a number or a schedule such as "
            "{scheduler: CosineDecay, initial_learning_rate: 0.05, end_learning_rate: "
            f"0.0025, total_iters: 600}}, got {_show(rate)}"
        )
    return section


def _metrics(raw: Any) -> tuple[MetricSpec, ...]:
    if raw is None:
        return ()
    if isinstance(raw, (str, Mapping)):
        raw = [raw]
    if not isinstance(raw, list):
        raise ConfigError(f"metrics must be a list of metric names, got {_show(raw)}")
    specs, names = [], set()
    for i, item in enumerate(raw):
        where = f"metrics[{i}]"
        if isinstance(item, str):
            item = {"type": item}
        item = _mapping(item, where)
        kind = _string(item.pop("type", None), f"{where}.type")
        kind = kind.lower().removesuffix("metric").rstrip("_")
        if kind not in METRICS:
            raise ConfigError(
                f"{where}: unknown metric {kind!r}; known metrics: {', '.join(METRICS)}"
            )
        name = item.pop("name", kind)
        if name in names:
            raise ConfigError(f"{where}: a second metric named {name!r}; give it another name: ...")
        names.add(name)
        specs.append(MetricSpec(_string(name, f"{where}.name"), kind, item))
    return tuple(specs)


def _runconfig(raw: Any) -> RunSpec:
    section = _mapping(raw, "runconfig", optional=True)
    _unknown(section, RUNCONFIG_KEYS, "runconfig")
    num_steps = section.get("num_steps")
    if num_steps is not None:
        num_steps = _int(num_steps, "runconfig.num_steps", 1)
    backend = section.get("backend", "CSX")
    if not isinstance(backend, str) or backend.upper() not in BACKENDS:
        raise ConfigError(
            f"runconfig.backend must be one of {', '.join(BACKENDS)}, got {_show(backend)}"
        )
    half = section.get("half_dtype")
    if half is not None and half not in HALF_DTYPES:
        raise ConfigError(
            f"runconfig.half_dtype must be one of {', '.join(HALF_DTYPES)}, got {_show(half)}"
        )
    model_dir = _string(section.get("model_dir", "./model_dir"), "runconfig.model_dir")
    compile_dir = section.get("compile_dir") or os.path.join(model_dir, "compile")
    checkpoint_path = section.get("checkpoint_path")
    if checkpoint_path is not None:
        _string(checkpoint_path, "runconfig.checkpoint_path")
    cluster = {k: section[k] for k in CLUSTER_KEYS if k in section}
    try:
        ClusterConfig(**cluster)
    except ConfigError as e:
        raise ConfigError(str(e).replace("ClusterConfig.", "runconfig.")) from None
    return RunSpec(
        num_steps=num_steps,
        checkpoint_steps=_int(section.get("checkpoint_steps", 0), "runconfig.checkpoint_steps", 0),
        log_steps=_int(section.get("log_steps", 1), "runconfig.log_steps", 1),
        model_dir=model_dir,
        compile_dir=_string(compile_dir, "runconfig.compile_dir"),
        backend=backend.upper(),
        half_dtype=half,
        checkpoint_path=checkpoint_path,
        cluster=cluster,
    )


def parse(raw: Mapping[str, Any]) -> JobConfig:
    """Validates a config mapping (see the module docstring of :mod:`cerebrax.cli`)."""
    _unknown(raw, TOP_LEVEL_KEYS, "")
    if "model" not in raw:
        raise ConfigError("model is required: model: {factory: 'package.module:function'}")
    model = _mapping(raw["model"], "model")
    factory = _import_path(model.pop("factory", None), "model.factory")
    loss = model.pop("loss", "cross_entropy")
    if loss != "cross_entropy":
        _import_path(loss, "model.loss")
    loss_scaling = raw.get("loss_scaling")
    if loss_scaling is not None:
        loss_scaling = _mapping(loss_scaling, "loss_scaling")
    norm = _positive(raw.get("max_gradient_norm"), "max_gradient_norm")
    value = _positive(raw.get("max_gradient_value"), "max_gradient_value")
    if norm is not None and value is not None:
        raise ConfigError("max_gradient_norm and max_gradient_value are exclusive; give one")
    return JobConfig(
        model_factory=factory,
        model_kwargs=model,
        loss=loss,
        train_input=_input(raw.get("train_input"), "train_input"),
        eval_input=_input(raw.get("eval_input"), "eval_input"),
        optimizer=_optimizer(raw.get("optimizer")),
        loss_scaling=loss_scaling,
        max_gradient_norm=norm,
        max_gradient_value=value,
        metrics=_metrics(raw.get("metrics")),
        run=_runconfig(raw.get("runconfig")),
    )


def require(job: JobConfig, command: str, *, step: str = "train") -> None:
    """Checks that the sections ``command`` needs are present."""
    if command == "eval" or step == "eval":
        if job.eval_input is None:
            raise ConfigError(f"`cerebrax {command}` needs an eval_input section")
        return
    if job.train_input is None:
        raise ConfigError(f"`cerebrax {command}` needs a train_input section")
    if job.optimizer is None:
        raise ConfigError(f"`cerebrax {command}` needs an optimizer section")
    if command == "fit" and job.run.num_steps is None:
        raise ConfigError(
            "runconfig.num_steps is required for `cerebrax fit`: the total number of training steps"
        )
