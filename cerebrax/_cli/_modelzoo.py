"""Cerebras Model Zoo's models and data processors, by name, in the command's configs.

A config may name its model as a Model Zoo ``params.yaml`` does (``model.name:
fc_mnist``) and its data by one of that model's data processors
(``train_input.data_processor: MNISTDataProcessor``). Both resolve through Model Zoo's
own registry (``cerebras.modelzoo.registry``), and their sections are validated by the
config classes Model Zoo's Trainer builds for them (``create_config_class`` of the
registered class, as ``construct_trainer_config`` in
``cerebras/modelzoo/trainer/validate.py`` does): a key the class does not take is an
error, as it is in Model Zoo. The validated model config builds the model (``config()``,
as ``configure_trainer_from_config`` does); the data processor is built from its config
and its ``create_dataloader()`` is the input of cerebrax's DataLoader (as
``create_dataloader_from_config`` in ``cerebras/modelzoo/trainer/utils.py``).

Model Zoo imports ``cerebras.pytorch``: the cstorch alias
(:func:`cerebrax.enable_cstorch_alias`) is turned on before Model Zoo is imported, on
this path only.

A Model Zoo model's ``forward(batch)`` takes the whole batch and returns the loss; it
updates the cstorch metrics it holds itself (in eval mode), and the command reports those.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Callable, Iterable
from typing import Any

from pydantic import BaseModel, ValidationError

from .._cstorch_alias import enable_cstorch_alias
from ..errors import ConfigError
from ..metrics import Metric
from . import _schema

__all__ = ["build_model", "input_fn", "installed", "model_metrics", "prepare",
           "require_installed"]

MSG_NOT_INSTALLED = """\
{key}: cerebrax has no {what} registry of its own: it uses Cerebras Model Zoo's, and
Model Zoo is not installed (no module cerebras.modelzoo on the path). Either:
  - install Model Zoo from its repository, without its pinned requirements (they
    install Cerebras' own cerebras_pytorch and an older torch):
        git clone https://github.com/Cerebras/modelzoo
        pip install --no-deps -e ./modelzoo
    then what its modules import (Model Zoo's registry and configs: pydantic, PyYAML,
    annotated-types, torch; each model its own, e.g. fc_mnist torchvision, the
    language models transformers), or
  - {alternative}"""

ALTERNATIVES = {
    "model": "name the function that builds the model in {where}.factory:\n"
    "    'package.module:function' (the section's other keys are its arguments).",
    "data-processor": "name the function that builds the batches in {where}.input_fn:\n"
    "    'package.module:function' (the section's other keys are its arguments).",
}

MSG_IMPORT = """\
{key}: Model Zoo ({where}) does not import: {error}
Install what it names, or run with --debug for the traceback."""


# ---- is it there -------------------------------------------------------------------------
def installed() -> bool:
    """Whether ``cerebras.modelzoo`` is importable (it is not imported)."""
    try:
        return importlib.util.find_spec("cerebras.modelzoo") is not None
    except (ImportError, ValueError):
        return False


def require_installed(key: str, where: str) -> None:
    """Raises, naming ``key`` (``model.name``, ``train_input.data_processor``), what to
    install and the alternative, when Model Zoo is not installed."""
    if installed():
        return
    what = "model" if key.endswith(".name") else "data-processor"
    raise ConfigError(MSG_NOT_INSTALLED.format(
        key=key, what=what, alternative=ALTERNATIVES[what].format(where=where)))


def _modelzoo(key: str) -> tuple[Any, Callable[[type], type[BaseModel]]]:
    """Model Zoo's ``registry`` and ``create_config_class``, with the cstorch alias on."""
    enable_cstorch_alias()
    try:
        from cerebras.modelzoo.config import create_config_class
        from cerebras.modelzoo.registry import registry
    except ImportError as e:
        spec = importlib.util.find_spec("cerebras.modelzoo")
        origin = spec.submodule_search_locations if spec else None
        raise ConfigError(MSG_IMPORT.format(key=key, where=list(origin or ()), error=e)) from e
    return registry, create_config_class


# ---- validating the sections -------------------------------------------------------------
def prepare(job: Any) -> Any:
    """``job`` (a :class:`._config.JobConfig`) with its Model Zoo sections validated by
    Model Zoo's config classes: ``job.zoo_model`` and each input's ``zoo_config``.

    Raises :class:`ConfigError` for a name the registry does not hold (listing those it
    does) and for each key a config class refuses (naming its key path).
    """
    specs = [s for s in (job.train_input, job.eval_input) if s and s.data_processor]
    if job.model_name is None and not specs:
        return job
    key = f"{job.model_where}.name"
    registry, create_config_class = _modelzoo(key)
    model_cls = _model_class(registry, job.model_name, key)
    zoo_model = _validate(create_config_class(model_cls), model_cls,
                          {"name": job.model_name, **job.model_kwargs}, job.model_where)
    changes: dict[str, Any] = {"zoo_model": zoo_model}
    for name in ("train_input", "eval_input"):
        spec = getattr(job, name)
        if spec is not None and spec.data_processor is not None:
            cls = _data_processor(registry, job.model_name, spec, key)
            config = _validate(create_config_class(cls), cls,
                               {"data_processor": spec.data_processor, **spec.kwargs},
                               spec.where)
            changes[name] = dataclasses.replace(spec, zoo_config=config)
    return dataclasses.replace(job, **changes)


def _model_class(registry: Any, name: str, key: str) -> type:
    names = registry.get_model_names()
    if name not in names:
        raise ConfigError(
            f"{key}: {name!r} is not a model of Model Zoo's registry. It has: "
            f"{', '.join(names)}."
        )
    try:
        return registry.get_model_class(name)
    except (ImportError, RuntimeError) as e:
        raise ConfigError(f"{key}: Model Zoo's {name!r} does not import: {e}") from e


def _data_processor(registry: Any, model: str, spec: Any, key: str) -> type:
    where = f"{spec.where}.data_processor"
    try:
        found = registry.get_data_processors_map(model)
    except (ImportError, RuntimeError) as e:
        raise ConfigError(f"{where}: the data processors of Model Zoo's {model!r} do not "
                          f"import: {e}") from e
    if spec.data_processor not in found:
        raise ConfigError(
            f"{where}: {spec.data_processor!r} is not a data processor of Model Zoo's "
            f"{model!r} ({key}); it has: {', '.join(found)}."
        )
    return found[spec.data_processor]


def _validate(config_cls: type[BaseModel], cls: type, data: dict, where: str) -> BaseModel:
    """``config_cls`` validated from ``data``; its errors named by their key paths.

    The config class of a class whose ``__init__`` takes one config object (fc_mnist's
    ``MNISTModel(config: MNISTModelConfig)``) wraps that object's class in a field:
    the errors are reported against the inner class, the one the section's keys are.
    """
    inner, field = _wrapped(config_cls)
    try:
        return config_cls.model_validate(data)
    except ValidationError as e:
        errors = [
            {**error, "loc": error["loc"][1:]} if field and error["loc"][:1] == (field,)
            else error
            for error in e.errors()
        ]
        message = _schema.errors_message(inner, errors, where)
        raise ConfigError(f"{message}\n(checked by Model Zoo's {inner.__name__}, the config "
                          f"of {cls.__module__}.{cls.__qualname__})") from None


def _wrapped(config_cls: type[BaseModel]) -> tuple[type[BaseModel], str | None]:
    fields = config_cls.model_fields
    if len(fields) == 1:
        ((name, field),) = fields.items()
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            return field.annotation, name
    return config_cls, None


# ---- building ----------------------------------------------------------------------------
def build_model(job: Any) -> Any:
    """The Model Zoo model of ``job`` (a torch module): its validated config, called."""
    return job.zoo_model()


def input_fn(spec: Any) -> tuple[Callable[..., Any], dict[str, Any]]:
    """``(input_fn, kwargs)`` for cerebrax's DataLoader: the data processor built from its
    validated config, and the iterable it makes (``create_dataloader()``)."""
    config = spec.zoo_config
    cls = config.get_orig_class()

    def data_processor_fn(**kwargs: Any) -> Iterable[Any]:
        processor = cls(**kwargs)
        import torch  # Model Zoo needs torch: here it is installed

        if isinstance(processor, torch.utils.data.DataLoader):
            return processor
        if hasattr(processor, "create_dataloader"):
            return processor.create_dataloader()
        if isinstance(processor, Iterable):
            return processor
        raise ConfigError(
            f"{spec.where}.data_processor: {cls.__qualname__} is neither iterable nor has a "
            "create_dataloader() method that returns the batches"
        )

    return data_processor_fn, config.get_orig_class_args()


def model_metrics(module: Any) -> list[Metric]:
    """The cstorch metrics a torch module and its submodules hold (Model Zoo's models
    update them in ``forward``), in module order."""
    found: dict[int, Metric] = {}
    for sub in module.modules():
        # a metric is a submodule where torch is loaded; an attribute otherwise
        for value in (sub, *vars(sub).values()):
            if isinstance(value, Metric):
                found.setdefault(id(value), value)
    return list(found.values())
