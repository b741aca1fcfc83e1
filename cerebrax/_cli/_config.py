"""The `cerebrax` command's YAML config: reading, overrides, and the parsed job.

A config is a Model-Zoo-style mapping in one of two layouts (see :mod:`cerebrax.cli`);
:mod:`._schema` validates it and :func:`parse` maps either layout onto one
:class:`JobConfig`. Every problem raises :class:`ConfigError` naming the key path
(``runconfig.num_steps``, ``trainer.init.optimizer``), so the command can print one
message and exit with status 2.

A section that names a Model Zoo model (``model.name``) or data processor
(``*_input.data_processor``) keeps here only the keys the command reads itself; the
others are set aside for Model Zoo's config classes, which :mod:`._modelzoo` validates
them with (:func:`cerebrax.cli._run` calls :func:`._modelzoo.prepare` after
:func:`parse`).
"""

from __future__ import annotations

import copy
import dataclasses
import os
from collections.abc import Sequence
from typing import Any

import yaml

from ..backend import ClusterConfig
from ..errors import ConfigError
from . import _modelzoo, _schema
from ._schema import METRICS

__all__ = [
    "METRICS",
    "InputSpec",
    "JobConfig",
    "MetricSpec",
    "RunSpec",
    "apply_overrides",
    "load_config",
    "parse",
    "python_paths",
    "require",
    "set_value",
]


@dataclasses.dataclass(frozen=True)
class InputSpec:
    """One input section: ``input_fn`` (an import path) called with ``kwargs``, or a
    Model Zoo ``data_processor`` whose config class takes ``kwargs``.

    ``where`` is the section's key path (``train_input``, ``trainer.fit.train_dataloader``).
    ``zoo_config`` is the data processor's validated config (:func:`._modelzoo.prepare`).
    """

    input_fn: str | None
    kwargs: dict[str, Any]
    num_steps: int | None
    where: str
    data_processor: str | None = None
    zoo_config: Any = None


@dataclasses.dataclass(frozen=True)
class MetricSpec:
    name: str
    kind: str
    kwargs: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """How the run goes (``runconfig``, or ``trainer.init``), with defaults filled in.

    ``num_steps`` is the total number of training steps (``max_steps`` in a Model Zoo
    config); ``num_epochs`` replaces it when given. ``seed`` seeds Python's, numpy's and
    torch's generators and is the ``seed`` argument of the model factory and input
    functions that take one (unless their section gives it).
    """

    num_steps: int | None
    num_epochs: int | None
    seed: int | None
    save_initial_checkpoint: bool
    precision_opt_level: int | None
    checkpoint_steps: int
    log_steps: int
    keep_last_n: int | None
    keep_every_n_steps: int | None
    model_dir: str
    compile_dir: str
    backend: str
    half_dtype: str | None
    checkpoint_path: str | None
    cluster: dict[str, Any]
    where: str = "runconfig"
    eval_frequency: int | None = None  # fit validates every this many steps


@dataclasses.dataclass(frozen=True)
class JobConfig:
    """A validated config. Only shapes and types are checked here; objects are built later.

    The model is ``model_factory(**model_kwargs)`` with the loss function ``loss``, or the
    Model Zoo model ``model_name`` whose config class takes ``model_kwargs`` (validated
    into ``zoo_model`` by :func:`._modelzoo.prepare`); such a model returns its loss.
    """

    model_factory: str | None
    model_kwargs: dict[str, Any]
    loss: str | None
    train_input: InputSpec | None
    eval_input: InputSpec | None
    optimizer: dict[str, Any] | None
    loss_scaling: dict[str, Any] | None
    max_gradient_norm: float | None
    max_gradient_value: float | None
    metrics: tuple[MetricSpec, ...]
    run: RunSpec
    # Key paths of the sections, for the messages of errors found while building.
    model_where: str = "model"
    optimizer_where: str = "optimizer"
    loss_scaling_where: str = "loss_scaling"
    model_name: str | None = None
    zoo_model: Any = None


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
    """Sets the dotted ``key`` of ``config`` to ``value``, creating mappings on the way.

    In a ``trainer:`` config, ``runconfig.model_dir`` (``--model_dir``) sets
    ``trainer.init.model_dir``.
    """
    if key == "runconfig.model_dir" and "trainer" in config and "runconfig" not in config:
        key = "trainer.init.model_dir"
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


def python_paths(raw: dict[str, Any]) -> list[str]:
    """The config's ``python_paths`` (``runconfig.python_paths``, or
    ``trainer.init.backend.cluster_config.python_paths``), read before it is validated:
    they may hold the modules it names (Model Zoo among them). Not a list of strings: []
    (the validation reports it)."""
    where = ("trainer.init.backend.cluster_config" if "trainer" in raw else "runconfig")
    paths = (_section(raw, where) or {}).get("python_paths")
    if isinstance(paths, list) and all(isinstance(p, str) for p in paths):
        return paths
    return []


# ---- the two layouts ------------------------------------------------------------------
# The sections that may name a Model Zoo model (name) or data processor (data_processor).
ZOO_SECTIONS = {
    "v1": (("model", "name"), ("train_input", "data_processor"),
           ("eval_input", "data_processor")),
    "v2": (("trainer.init.model", "name"), ("trainer.fit.train_dataloader", "data_processor"),
           ("trainer.fit.val_dataloader", "data_processor"),
           ("trainer.validate.val_dataloader", "data_processor")),
}
# The keys of those sections that the command reads itself; the other keys are Model
# Zoo's config class's. Model Zoo's own conversion of a v1 config takes the same keys out
# of the model section (TRAINER_POST_CONVERSION_PRUNE_LIST in cerebras/modelzoo/trainer/utils.py).
ZOO_OWN_KEYS = {"name": ("name", "factory"), "data_processor": ("data_processor", "input_fn")}
ZOO_V1_MODEL_KEYS = ("mixed_precision", "fp16_type")
# Keys that Model Zoo applies with Trainer callbacks, not with the config class.
ZOO_CALLBACK_KEYS = {
    "name": {"compression": "WeightCompression", "lora_params": "Lora",
             "selective_grad": "SelectiveGrad"},
    "data_processor": {"micro_batch_size": "ScopedTrainFlags / ScopedValidateFlags"},
}
MSG_ZOO_CALLBACK = (
    "{key}: Model Zoo applies this key with its {callback} callback, not with the "
    "{what}'s config, and the cerebrax command builds no callbacks; remove the key{more}"
)


def parse(raw: dict[str, Any]) -> JobConfig:
    """Validates a config mapping of either layout (see :mod:`cerebrax.cli`)."""
    raw, zoo = _take_zoo_keys(raw)
    if "trainer" in raw:
        return _trainer_layout(_schema.check(_schema.ConfigV2, raw).trainer, zoo)
    if "model" not in raw:
        raise ConfigError(
            "model is required: model: {factory: 'package.module:function'}, or "
            "model: {name: <a Model Zoo model>} (or give the trainer: layout, with "
            "trainer.init.model)"
        )
    return _sectioned_layout(_schema.check(_schema.ConfigV1, raw), zoo)


def _take_zoo_keys(raw: dict[str, Any]) -> tuple[dict[str, Any], dict[str, dict]]:
    """``raw`` without the keys of Model Zoo's config classes, and those keys by section.

    A section that names a Model Zoo model (``name``) or data processor
    (``data_processor``) keeps only the keys the command reads (``ZOO_OWN_KEYS``; in
    the sectioned layout also ``model.mixed_precision`` and ``model.fp16_type``).
    Raises when Model Zoo is not installed, or for a key Model Zoo gives a callback.
    """
    layout = "v2" if "trainer" in raw else "v1"
    raw, taken = copy.deepcopy(raw), {}
    for where, marker in ZOO_SECTIONS[layout]:
        section = _section(raw, where)
        if section is None or section.get(marker) is None:
            continue
        _modelzoo.require_installed(f"{where}.{marker}", where)
        for key, callback in ZOO_CALLBACK_KEYS[marker].items():
            if key in section:
                raise ConfigError(MSG_ZOO_CALLBACK.format(
                    key=f"{where}.{key}", callback=callback,
                    what="model" if marker == "name" else "data processor",
                    more=" (cerebrax's pipeline micro-batches are "
                    "runconfig.micro_batch_size)" if key == "micro_batch_size" else ""))
        own = ZOO_OWN_KEYS[marker] + (ZOO_V1_MODEL_KEYS if (layout, marker) == ("v1", "name")
                                      else ())
        taken[where] = {k: section.pop(k) for k in list(section) if k not in own}
    return raw, taken


def _section(raw: dict[str, Any], where: str) -> dict[str, Any] | None:
    node: Any = raw
    for part in where.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node if isinstance(node, dict) else None


def _model(section: Any, where: str, zoo: dict[str, dict]) -> dict[str, Any]:
    """The JobConfig fields of a model section: a factory's, or a Model Zoo model's."""
    if section.name is not None:
        return {"model_factory": None, "model_kwargs": zoo[where], "loss": None,
                "model_name": section.name, "model_where": where}
    return {"model_factory": section.factory, "model_kwargs": section.kwargs,
            "loss": section.loss or "cross_entropy", "model_where": where}


def _check_zoo(job: JobConfig, metrics_where: str) -> JobConfig:
    """Refuses what a Model Zoo model or data processor cannot go with."""
    for spec in (job.train_input, job.eval_input):
        if spec is not None and spec.data_processor is not None and job.model_name is None:
            raise ConfigError(
                f"{spec.where}.data_processor: Model Zoo lists the data processors of each "
                f"of its models, and {job.model_where} names no Model Zoo model (it has "
                f"factory:). Name the function that builds the batches in "
                f"{spec.where}.input_fn, or build a Model Zoo model with "
                f"{job.model_where}.name."
            )
    if job.model_name is not None and job.metrics:
        raise ConfigError(
            f"{metrics_where}: a Model Zoo model computes its loss and updates its own "
            "metrics in its forward (fc_mnist: model.compute_eval_metrics: true), and the "
            "command prints those; it has no outputs to feed these. Remove the key."
        )
    return job


def _sectioned_layout(cfg: _schema.ConfigV1, zoo: dict[str, dict]) -> JobConfig:
    run, opt, model = cfg.runconfig, cfg.optimizer, cfg.model
    clip = opt or _schema.Clipping()
    half = model.fp16_type if model.mixed_precision is not False else "float32"
    if model.mixed_precision is False and model.fp16_type is not None:
        raise ConfigError("model.mixed_precision: false computes in float32; remove "
                          "model.fp16_type or set mixed_precision: true")
    job = JobConfig(
        **_model(model, "model", zoo),
        train_input=_input(cfg.train_input, "train_input", zoo),
        eval_input=_input(cfg.eval_input, "eval_input", zoo,
                          ("runconfig.eval_steps", run.eval_steps)),
        optimizer=_optimizer_v1(opt) if opt else None,
        loss_scaling=_one(
            ("loss_scaling", cfg.loss_scaling and cfg.loss_scaling.model_dump(exclude_unset=True)),
            ("optimizer.loss_scaling_factor", opt and opt.grad_scaler()),
        ),
        max_gradient_norm=_one(("max_gradient_norm", cfg.max_gradient_norm),
                               ("optimizer.max_gradient_norm", clip.max_gradient_norm)),
        max_gradient_value=_one(("max_gradient_value", cfg.max_gradient_value),
                                ("optimizer.max_gradient_value", clip.max_gradient_value)),
        metrics=_metrics(cfg.metrics, "metrics"),
        run=_run_spec(
            "runconfig",
            run,
            steps=(("runconfig.num_steps", run.num_steps), ("runconfig.max_steps", run.max_steps)),
            half_dtype=_one(("runconfig.half_dtype", run.half_dtype), ("model.fp16_type", half)),
            checkpoint_steps=run.checkpoint_steps,
            save_initial_checkpoint=run.save_initial_checkpoint,
            keep_last_n=run.keep_last_n,
            keep_every_n_steps=run.keep_every_n_steps,
            log_steps=run.log_steps,
            backend=run.backend,
            compile_dir=run.compile_dir,
            checkpoint_path=run.checkpoint_path,
            cluster={k: getattr(run, k) for k in _schema.CLUSTER_KEYS if k in run.model_fields_set},
        ),
    )
    return _check_zoo(job, "metrics")


def _trainer_layout(trainer: _schema.TrainerV2, zoo: dict[str, dict]) -> JobConfig:
    init, fit, check = trainer.init, trainer.fit, trainer.validate_
    prec, loop, backend = init.precision, init.loop, init.backend or _schema.BackendV2()
    where = "trainer.init"
    if not prec.enabled and prec.fp16_type is not None:
        raise ConfigError(f"{where}.precision.enabled: false computes in float32; remove "
                          f"{where}.precision.fp16_type or set enabled: true")
    optimizer = None
    if init.optimizer is not None:  # {NAME: {hyperparameters}}; schedulers set the rate
        ((name, options),) = init.optimizer.items()
        optimizer = _optimizer(name, dict(options), init.schedulers, f"{where}.optimizer.{name}")
    val = ("trainer.validate.val_dataloader", check and check.val_dataloader)
    job = JobConfig(
        **_model(init.model, f"{where}.model", zoo),
        train_input=_input(fit and fit.train_dataloader, "trainer.fit.train_dataloader", zoo),
        eval_input=_input(
            _one(("trainer.fit.val_dataloader", _zoo_view(fit and fit.val_dataloader,
                                                          "trainer.fit.val_dataloader", zoo)),
                 ("trainer.validate.val_dataloader",
                  _zoo_view(val[1], "trainer.validate.val_dataloader", zoo))),
            "trainer.validate.val_dataloader" if val[1] else "trainer.fit.val_dataloader",
            zoo,
            (f"{where}.loop.eval_steps", loop.eval_steps),
        ),
        optimizer=optimizer,
        loss_scaling=prec.grad_scaler(),
        max_gradient_norm=prec.max_gradient_norm,
        max_gradient_value=prec.max_gradient_value,
        metrics=_metrics(init.metrics, f"{where}.metrics"),
        run=_run_spec(
            where,
            loop,
            steps=((f"{where}.loop.num_steps", loop.num_steps),
                   (f"{where}.loop.max_steps", loop.max_steps)),
            seed=init.seed,
            model_dir=init.model_dir,
            precision_opt_level=prec.precision_opt_level,
            half_dtype=prec.fp16_type if prec.enabled else "float32",
            checkpoint_steps=init.checkpoint.steps,
            save_initial_checkpoint=init.checkpoint.save_initial_checkpoint,
            keep_last_n=init.checkpoint.keep_last_n,
            keep_every_n_steps=init.checkpoint.keep_every_n_steps,
            log_steps=init.logging.log_steps,
            backend=_one((f"{where}.device", init.device),
                         (f"{where}.backend.backend_type",
                          backend.backend_type if "backend_type" in backend.model_fields_set
                          else None)),
            compile_dir=backend.compile_dir,
            checkpoint_path=_one(("trainer.fit.ckpt_path", fit and fit.ckpt_path),
                                 ("trainer.validate.ckpt_path", check and check.ckpt_path)),
            cluster=dict(backend.cluster_config or {}),
            cluster_where=f"{where}.backend.cluster_config",
        ),
        optimizer_where=f"{where}.optimizer",
        loss_scaling_where=f"{where}.precision",
    )
    return _check_zoo(job, f"{where}.metrics")


# ---- pieces of both ----------------------------------------------------------------------
def _one(*given: tuple[str, Any]) -> Any:
    """The value of the keys that say the same thing; an error when two disagree."""
    found = [(key, value) for key, value in given if value is not None]
    if len({repr(value) for _, value in found}) > 1:
        keys = " and ".join(f"{key} ({value!r})" for key, value in found)
        raise ConfigError(f"{keys} set the same thing; give one of them")
    return found[0][1] if found else None


def _input(section: Any, where: str, zoo: dict[str, dict],
           steps: tuple[str, Any] = ("", None)) -> InputSpec | None:
    if isinstance(section, _ZooView):
        section = section.section
    if section is None:
        return None
    num_steps = _one((f"{where}.num_steps", section.num_steps), steps)
    if section.data_processor is not None:
        return InputSpec(None, zoo[where], num_steps, where, section.data_processor)
    return InputSpec(section.input_fn, section.kwargs, num_steps, where)


@dataclasses.dataclass(frozen=True)
class _ZooView:
    """An input section with its Model Zoo keys, compared as a whole by :func:`_one`."""

    section: Any
    zoo: dict[str, Any] | None

    def __repr__(self) -> str:  # the section's keys, as the config gives them
        if self.zoo is None:
            return repr(self.section)
        return repr({**self.section.model_dump(exclude_unset=True), **self.zoo})


def _zoo_view(section: Any, where: str, zoo: dict[str, dict]) -> _ZooView | None:
    return None if section is None else _ZooView(section, zoo.get(where))


def _optimizer_v1(section: _schema.OptimizerV1) -> dict[str, Any]:
    options = dict(section.model_extra or {})
    for key, value in (section.optim_params or {}).items():
        if key in options:
            raise ConfigError(f"optimizer.{key} is given both directly and in optim_params")
        options[key] = value
    rate = _one(("optimizer.learning_rate", section.learning_rate), ("optimizer.lr", section.lr))
    return _optimizer(section.optimizer_type, options, rate, "optimizer")


def _optimizer(name: str, options: dict[str, Any], rate: Any, where: str) -> dict[str, Any]:
    """``configure_optimizer``'s arguments; ``learning_rate``: a rate or schedule, or None."""
    options = _schema.optimizer_options(name, options, where)
    return {"optimizer_type": name, "learning_rate": rate, **options}


def _metrics(items: list[_schema.Metric], where: str) -> tuple[MetricSpec, ...]:
    specs = tuple(MetricSpec(m.name or m.type, m.type, m.kwargs) for m in items)
    names = [spec.name for spec in specs]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise ConfigError(f"{where}[{i}]: a second metric named {name!r}; give it "
                              "another name: ...")
    return specs


def _run_spec(where: str, section: Any, *, steps: tuple, cluster: dict[str, Any],
              cluster_where: str | None = None, **fields: Any) -> RunSpec:
    num_steps = _one(*steps)
    if num_steps is not None and section.num_epochs is not None:
        raise ConfigError(f"{where}: give the number of steps ({steps[0][0]}) or "
                          "num_epochs, not both")
    cluster_where = cluster_where or where
    try:
        ClusterConfig(**cluster)
    except (ConfigError, TypeError) as e:
        raise ConfigError(str(e).replace("ClusterConfig.", f"{cluster_where}.")) from None
    fields.setdefault("seed", getattr(section, "seed", None))
    fields.setdefault("model_dir", getattr(section, "model_dir", None))
    fields.setdefault("precision_opt_level", getattr(section, "precision_opt_level", None))
    fields.setdefault("eval_frequency", getattr(section, "eval_frequency", None))
    return RunSpec(
        num_steps=num_steps,
        num_epochs=section.num_epochs,
        cluster=cluster,
        where=where,
        **{**fields, "backend": fields["backend"] or "CSX",
           "compile_dir": fields["compile_dir"] or os.path.join(fields["model_dir"], "compile")},
    )


def require(job: JobConfig, command: str, *, step: str = "train") -> None:
    """Checks that the sections ``command`` needs are present."""
    if command == "eval" or step == "eval":
        if job.eval_input is None:
            raise ConfigError(f"`cerebrax {command}` needs an eval_input section "
                              "(trainer.fit.val_dataloader in a trainer: config)")
        return
    if job.train_input is None:
        raise ConfigError(f"`cerebrax {command}` needs a train_input section "
                          "(trainer.fit.train_dataloader in a trainer: config)")
    if job.optimizer is None:
        raise ConfigError(f"`cerebrax {command}` needs an optimizer section "
                          "(trainer.init.optimizer in a trainer: config)")
    run = job.run
    if command == "fit" and run.eval_frequency is not None and job.eval_input is None:
        key = "runconfig" if run.where == "runconfig" else f"{run.where}.loop"
        raise ConfigError(
            f"{key}.eval_frequency: validation during fit reads the eval data, and the "
            "config has none. Add an eval_input section (trainer.fit.val_dataloader in "
            "a trainer: config), or remove the key."
        )
    if command == "fit" and run.num_steps is None and run.num_epochs is None:
        raise ConfigError(
            f"{run.where}.num_steps is required for `cerebrax fit`: the total number of "
            f"training steps (or give {run.where}.max_steps or num_epochs)"
        )
