"""The schema of the `cerebrax` command's config, as pydantic models.

Two layouts are read (see :mod:`cerebrax.cli`): the sectioned layout (``model``,
``train_input``, ``eval_input``, ``optimizer``, ``runconfig``) and the ``trainer:``
layout (``trainer.init`` and ``trainer.fit``). Every section refuses keys it does not
know; a few known keys that cerebrax cannot honour are declared :func:`refused`, so the
error says why and what to do instead. :func:`check` turns pydantic's errors into one
:class:`ConfigError` whose lines read ``<key path> must be <expected>, got <value>``.

Sections whose other keys are arguments of a user function (``model``, the inputs)
allow extra keys; :mod:`._build` checks them against that function's signature.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from collections.abc import Callable, Mapping
from typing import Annotated, Any, TypeVar

from pydantic import (BaseModel, BeforeValidator, ConfigDict, Field, PlainValidator,
                      ValidationError, create_model, model_validator)
from pydantic_core import PydanticCustomError

from .. import optim
from .._filters import is_strict_int
from ..backend import ClusterConfig
from ..errors import ConfigError

__all__ = ["METRICS", "ConfigV1", "ConfigV2", "check", "errors_message", "optimizer_options"]

Model = TypeVar("Model", bound=BaseModel)
BACKENDS = ("CPU", "GPU", "CSX")
HALF_DTYPES = ("float16", "bfloat16", "float32", "cbfloat16")
CLUSTER_KEYS = tuple(f.name for f in dataclasses.fields(ClusterConfig))
# Metrics the eval loop knows how to feed: name -> (cstorch.metrics class, what it reads).
METRICS = {
    "accuracy": ("AccuracyMetric", "predictions"),
    "fbeta_score": ("FBetaScoreMetric", "predictions"),
    "mean_iou": ("MeanIOUMetric", "predictions"),
    "mean_per_class_accuracy": ("MeanPerClassAccuracyMetric", "predictions"),
    "dice_coefficient": ("DiceCoefficientMetric", "predictions"),
    "perplexity": ("PerplexityMetric", "loss"),
}
# Optimizer hyperparameters that are never negative.
NON_NEGATIVE = {"lr", "momentum", "dampening", "weight_decay", "eps", "lambd", "alpha",
                "rho", "lr_decay", "initial_accumulator_value", "momentum_decay"}
MISSING_HINTS = {"optimizer_type": "the optimizer's name, e.g. SGD or AdamW"}
MSG_NO_MODEL = (
    "give factory: the import path of the function that builds the model, e.g. "
    "examples.digits:mlp (the other keys are its arguments), or name: a model of "
    "Cerebras Model Zoo's registry, e.g. fc_mnist (the other keys are its config's)"
)
MSG_NO_INPUT = (
    "give input_fn: the import path of the function that builds the batches, e.g. "
    "examples.digits:input_fn (the other keys are its arguments), or data_processor: "
    "one of the Model Zoo model's data processors, e.g. MNISTDataProcessor"
)


# ---- value types: each a validator with the text its error shows -----------------------
def _expect(expected: str, convert: Callable[[Any], Any]) -> Any:
    """A field type: ``convert(value)``, or the error ``must be <expected>``."""

    def validate(value: Any) -> Any:
        try:
            return convert(value)
        except (TypeError, ValueError):
            raise PydanticCustomError("expected", expected) from None

    return Annotated[Any, PlainValidator(validate)]


def refused(reason: str) -> Any:
    """A known key that cerebrax cannot honour: any value is an error saying ``reason``."""

    def validate(value: Any) -> Any:
        raise PydanticCustomError("refused", reason)

    validate.refused = True  # not listed among the keys a section takes
    return Annotated[Any, PlainValidator(validate)]


def _number(value: Any, *, ge: float | None = None, gt: float | None = None) -> float:
    if isinstance(value, str):
        value = float(value)  # YAML 1.1 reads 1e-4 (no dot) as a string
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(value)
    if (ge is not None and not value >= ge) or (gt is not None and not value > gt):
        raise ValueError(value)
    return value


def _integer(value: Any, *, ge: int | None = None) -> int:
    if not is_strict_int(value) or (ge is not None and value < ge):
        raise ValueError(value)
    return value


def _test(predicate: Callable[[Any], bool]) -> Callable[[Any], Any]:
    def convert(value: Any) -> Any:
        if not predicate(value):
            raise ValueError(value)
        return value

    return convert


def _choice(choices: Any, normalize: Callable[[str], str] = str.upper) -> Any:
    def convert(value: Any) -> str:
        if not isinstance(value, str) or normalize(value) not in choices:
            raise ValueError(value)
        return normalize(value)

    return _expect(f"one of {', '.join(choices)}", convert)


def _import_path(value: Any) -> str:
    module, sep, attr = value.partition(":") if isinstance(value, str) else ("", "", "")
    if not (module and sep and attr):
        raise ValueError(value)
    return value


def _loss_scale(value: Any) -> Any:
    return value if value == "dynamic" else _number(value, gt=0)


def _schedule(value: Any) -> Any:
    if isinstance(value, (Mapping, list)):
        return value
    return _number(value, ge=0)


Number = _expect("a number", _number)
Positive = _expect("a number > 0", lambda v: _number(v, gt=0))
NonNegative = _expect("a number >= 0", lambda v: _number(v, ge=0))
Integer = _expect("an integer", _integer)
Count = _expect("an integer > 0", lambda v: _integer(v, ge=1))
Count0 = _expect("an integer >= 0", lambda v: _integer(v, ge=0))
Numbers = _expect(
    "a list of numbers",
    lambda v: tuple(_number(x) for x in _test(lambda v: isinstance(v, (list, tuple)))(v)),
)
Flag = _expect("true or false", _test(lambda v: isinstance(v, bool)))
Text = _expect("a non-empty string", _test(lambda v: isinstance(v, str) and bool(v)))
Mapping_ = _expect("a mapping", _test(lambda v: isinstance(v, Mapping)))
ImportPath = _expect(
    "an import path 'package.module:name' (or 'path/to/file.py:name')", _import_path
)
Loss = _expect("cross_entropy or an import path 'module:fn'",
               lambda v: v if v == "cross_entropy" else _import_path(v))
LossScale = _expect("'dynamic' or a number > 0", _loss_scale)
Schedule = _expect("a number >= 0, a schedule mapping or a list of them", _schedule)
Backend = _choice(BACKENDS)
HalfDtype = _choice(HALF_DTYPES, str)
MetricName = _choice(METRICS, lambda s: s.lower().removesuffix("metric").rstrip("_"))


# ---- sections shared by both layouts ---------------------------------------------------
class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Arguments(BaseModel):
    """A section whose other keys are arguments of a user function."""

    model_config = ConfigDict(extra="allow", frozen=True)

    @property
    def kwargs(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class ModelSection(Arguments):
    """``factory`` (a function's import path, its arguments the other keys) or ``name``
    (a model of Cerebras Model Zoo's registry: :mod:`._modelzoo` gives the other keys
    to the model's config class, see :func:`._config.parse`)."""

    factory: ImportPath | None = None
    name: Text | None = None
    loss: Loss | None = None  # with factory; default cross_entropy

    @model_validator(mode="after")
    def _one_model(self) -> ModelSection:
        if self.factory is None and self.name is None:
            raise PydanticCustomError("refused", MSG_NO_MODEL)
        if self.factory is not None and self.name is not None:
            raise PydanticCustomError(
                "refused", "factory and name both say which model to build; give one "
                "(name: a Model Zoo model, factory: 'package.module:function')")
        return self


class InputSection(Arguments):
    """``input_fn`` (a function's import path, its arguments the other keys) or
    ``data_processor`` (one of the Model Zoo model's data processors: its config class
    takes the other keys)."""

    input_fn: ImportPath | None = None
    num_steps: Count | None = None
    batch_size: Count | None = None
    data_processor: Text | None = None

    @model_validator(mode="after")
    def _one_source(self) -> InputSection:
        if self.input_fn is None and self.data_processor is None:
            raise PydanticCustomError("refused", MSG_NO_INPUT)
        if self.input_fn is not None and self.data_processor is not None:
            raise PydanticCustomError(
                "refused", "input_fn and data_processor both say where the batches come "
                "from; give one")
        return self

    @property
    def kwargs(self) -> dict[str, Any]:
        extra = dict(self.model_extra or {})
        return extra if self.batch_size is None else {"batch_size": self.batch_size, **extra}


class Metric(Arguments):
    type: MetricName
    name: Text | None = None

    @model_validator(mode="before")
    @classmethod
    def _from_name(cls, value: Any) -> Any:
        return {"type": value} if isinstance(value, str) else value


class Clipping(Section):
    max_gradient_norm: Positive | None = None
    max_gradient_value: Positive | None = None

    @model_validator(mode="after")
    def _one_clip(self) -> Clipping:
        if self.max_gradient_norm is not None and self.max_gradient_value is not None:
            raise PydanticCustomError(
                "refused", "max_gradient_norm and max_gradient_value are exclusive; give one"
            )
        return self


class LossScaling(Clipping):
    """The loss-scaling keys of an ``optimizer`` (or ``precision``) section."""

    loss_scaling_factor: LossScale | None = None
    initial_loss_scale: Positive | None = None
    max_loss_scale: Positive | None = None
    min_loss_scale: Positive | None = None
    steps_per_increase: Count | None = None

    @model_validator(mode="after")
    def _dynamic_only(self) -> LossScaling:
        dynamic = ("initial_loss_scale", "max_loss_scale", "min_loss_scale",
                   "steps_per_increase")
        given = [k for k in dynamic if getattr(self, k) is not None]
        if given and self.loss_scaling_factor != "dynamic":
            raise PydanticCustomError(
                "refused",
                f"{', '.join(given)} configure(s) dynamic loss scaling, but "
                f"loss_scaling_factor is {_show(self.loss_scaling_factor)}; set "
                "loss_scaling_factor: dynamic (or remove them)",
            )
        return self

    def grad_scaler(self) -> dict[str, Any] | None:
        """``cstorch.amp.GradScaler`` arguments, None without ``loss_scaling_factor``."""
        if self.loss_scaling_factor is None:
            return None
        return {"loss_scale": self.loss_scaling_factor, "init_scale": self.initial_loss_scale,
                "max_loss_scale": self.max_loss_scale, "min_loss_scale": self.min_loss_scale,
                "steps_per_increase": self.steps_per_increase}


# ---- the sectioned layout --------------------------------------------------------------
class ModelV1(ModelSection):
    mixed_precision: Flag | None = None  # false: compute in float32 (half_dtype float32)
    fp16_type: HalfDtype | None = None  # the half dtype (runconfig.half_dtype)


class OptimizerV1(LossScaling):
    """Other keys are the optimizer's hyperparameters (see :func:`optimizer_options`)."""

    model_config = ConfigDict(extra="allow", frozen=True)
    optimizer_type: Text
    learning_rate: Schedule | None = None
    lr: Schedule | None = None
    optim_params: Mapping_ | None = None
    adjust_learning_rate: refused(
        "per-parameter learning-rate factors are not built in the cerebrax command; "
        "give those parameters their own param group in a hand-written cstorch loop"
    ) = None
    log_summaries: refused("cerebrax writes no optimizer summaries; remove the key") = None


class GradScalerV1(Section):
    """``loss_scaling:``: ``cstorch.amp.GradScaler``'s own arguments."""

    loss_scale: LossScale | None = None
    init_scale: Positive | None = None
    steps_per_increase: Count | None = None
    min_loss_scale: Positive | None = None
    max_loss_scale: Positive | None = None
    overflow_tolerance: NonNegative | None = None


class _RunConfigV1(Section):
    num_steps: Count | None = None
    max_steps: Count | None = None
    num_epochs: Count | None = None
    seed: Integer | None = None
    eval_steps: Count | None = None
    eval_frequency: Count | None = None  # validate every this many steps of fit
    checkpoint_steps: Count0 = 0
    log_steps: Count = 1
    save_initial_checkpoint: Flag = False
    keep_last_n: Count | None = None
    keep_every_n_steps: Count | None = None
    model_dir: Text = "./model_dir"
    compile_dir: Text | None = None
    backend: Backend = "CSX"
    half_dtype: HalfDtype | None = None
    checkpoint_path: Text | None = None
    precision_opt_level: Count0 | None = None
    mode: refused("the command sets the mode: `cerebrax fit` trains, `cerebrax eval` "
                  "evaluates; remove the key") = None
    target_device: refused("use runconfig.backend: CPU, GPU or CSX") = None
    compile_only: refused("run `cerebrax compile CONFIG.yaml` instead") = None
    validate_only: refused("run `cerebrax validate CONFIG.yaml` instead") = None


# ClusterConfig's fields too, checked by ClusterConfig itself.
RunConfigV1 = create_model(
    "RunConfigV1", __base__=_RunConfigV1, **{k: (Any, None) for k in CLUSTER_KEYS}
)
Metrics = Annotated[
    list[Metric], BeforeValidator(lambda v: [v] if isinstance(v, (str, Mapping)) else v)
]


class ConfigV1(Section):
    model: ModelV1
    train_input: InputSection | None = None
    eval_input: InputSection | None = None
    optimizer: OptimizerV1 | None = None
    loss_scaling: GradScalerV1 | None = None
    max_gradient_norm: Positive | None = None
    max_gradient_value: Positive | None = None
    metrics: Metrics = []
    runconfig: RunConfigV1 = RunConfigV1()


# ---- the trainer: layout ---------------------------------------------------------------
class BackendV2(Section):
    backend_type: Backend = "CSX"
    cluster_config: Mapping_ | None = None
    compile_dir: Text | None = None
    compile_only: refused("run `cerebrax compile CONFIG.yaml` instead") = None
    validate_only: refused("run `cerebrax validate CONFIG.yaml` instead") = None


class PrecisionV2(LossScaling):
    enabled: Flag = True  # false: compute in float32
    fp16_type: HalfDtype | None = None
    precision_opt_level: Count0 | None = None


class LoopV2(Section):
    num_steps: Count | None = None
    max_steps: Count | None = None
    num_epochs: Count | None = None
    eval_steps: Count | None = None
    eval_frequency: Count | None = None  # validate every this many steps of fit
    grad_accum_steps: refused(
        "gradient accumulation is not built in the cerebrax command; lower the batch "
        "size or accumulate in a hand-written cstorch loop"
    ) = None


class CheckpointV2(Section):
    steps: Count0 = 0
    save_initial_checkpoint: Flag = False
    keep_last_n: Count | None = None
    keep_every_n_steps: Count | None = None


class LoggingV2(Section):
    log_steps: Count = 1


def _one_optimizer(value: Any) -> Any:
    if not isinstance(value, Mapping) or len(value) != 1:
        raise ValueError(value)
    ((name, options),) = value.items()
    if not isinstance(name, str) or not isinstance(options, Mapping):
        raise ValueError(value)
    return value


class InitV2(Section):
    device: Backend | None = None
    backend: BackendV2 | None = None
    model_dir: Text = "./model_dir"
    seed: Integer | None = None
    model: ModelSection
    optimizer: _expect("a mapping {NAME: {hyperparameters}}, e.g. {SGD: {lr: 0.01}}",
                       _one_optimizer) = None
    schedulers: _expect("a list of {NAME: {arguments}} mappings",
                        _test(lambda v: isinstance(v, list) and v)) = None
    precision: PrecisionV2 = PrecisionV2()
    loop: LoopV2 = LoopV2()
    checkpoint: CheckpointV2 = CheckpointV2()
    logging: LoggingV2 = LoggingV2()
    metrics: Metrics = []
    callbacks: refused("callbacks are not built in cerebrax; remove the key") = None
    loggers: refused("cerebrax logs to stdout (and a progress bar); remove the key") = None


class FitV2(Section):
    train_dataloader: InputSection
    val_dataloader: InputSection | None = None
    ckpt_path: Text | None = None


class ValidateV2(Section):
    val_dataloader: InputSection
    ckpt_path: Text | None = None


class TrainerV2(Section):
    init: InitV2
    fit: FitV2 | None = None
    validate_: ValidateV2 | None = Field(None, alias="validate")  # BaseModel has .validate


class ConfigV2(Section):
    trainer: TrainerV2


# ---- optimizer hyperparameters ---------------------------------------------------------
def _optimizers() -> dict[str, type]:
    found = {}
    for name in dir(optim):
        cls = getattr(optim, name)
        if isinstance(cls, type) and issubclass(cls, optim.Optimizer) and not (
            inspect.isabstract(cls) or cls is optim.Optimizer
        ):
            params = inspect.signature(cls.__init__).parameters.values()
            # The learning rate comes from the config's learning_rate section, so an
            # optimizer whose lr has no default (cstorch's SGD, Adafactor) is listed too.
            if all(p.default is not p.empty or p.name == "lr" for p in list(params)[2:]):
                found[name.lower()] = cls
    return found


def _hyperparameter_type(name: str, default: Any) -> Any:
    if name in NON_NEGATIVE and not isinstance(default, tuple):
        return NonNegative
    if isinstance(default, bool):
        return Flag
    if isinstance(default, (int, float)):
        return Number
    if isinstance(default, tuple) and all(isinstance(x, (int, float)) for x in default):
        return Numbers
    return Any


def optimizer_options(name: str, options: Mapping[str, Any], where: str) -> dict[str, Any]:
    """``options`` checked against the arguments of the optimizer class ``name``."""
    table = _optimizers()
    cls = table.get(name.lower())
    if cls is None:
        raise ConfigError(f"{where}: Invalid optimizer type {name!r}; expected one of "
                          f"{', '.join(sorted(table))}")
    fields = {
        p.name: (_hyperparameter_type(p.name, p.default), p.default)
        if p.default is not p.empty else (NonNegative | None, None)
        for p in list(inspect.signature(cls.__init__).parameters.values())[2:]
        if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    }
    model = check(create_model(cls.__name__, __base__=Section, **fields), options, where)
    return model.model_dump(exclude_unset=True)


# ---- errors ----------------------------------------------------------------------------
def check(model: type[Model], data: Any, where: str = "") -> Model:
    """``model`` validated from ``data``; a :class:`ConfigError` naming each bad key."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise ConfigError(errors_message(model, e.errors(), where)) from None


def errors_message(model: type[BaseModel], errors: list[dict], where: str = "") -> str:
    """One line per pydantic error of ``model`` (``errors()``), each naming its key path
    under ``where``; also used for the errors of Model Zoo's config classes."""
    return "\n".join(dict.fromkeys(_message(model, error, where) for error in errors))


def _path(loc: tuple, where: str) -> str:
    text = where
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else f".{part}" if text else part
    return text


def _message(model: type[BaseModel], error: Any, where: str) -> str:
    kind, loc, msg = error["type"], error["loc"], error["msg"]
    path, got = _path(loc, where), _show(error.get("input"))
    if kind == "extra_forbidden":
        parent = _model_at(model, loc[:-1])
        keys = ", ".join(_known_keys(parent)) if parent else "other keys"
        if not loc[:-1] and not where:
            return f"{path} is not a known top-level key; a config takes {keys}"
        return f"{path} is not a known key; {_path(loc[:-1], where)} takes {keys}"
    if kind == "missing":
        hint = MISSING_HINTS.get(str(loc[-1]))
        return f"{path} is required" + (f": {hint}" if hint else "")
    if kind in ("expected", "model_type", "model_attributes_type", "list_type"):
        expected = msg if kind == "expected" else "a mapping" if kind != "list_type" else "a list"
        return f"{path} must be {expected}, got {got}"
    if kind == "refused":
        return f"{path}: {msg}"
    if kind in ("value_error", "assertion_error"):  # a validator's own message
        return f"{path}: {msg.removeprefix('Value error, ').removeprefix('Assertion failed, ')}"
    return f"{path}: {msg}, got {got}"


def _known_keys(model: type[BaseModel]) -> list[str]:
    return [
        field.validation_alias if isinstance(field.validation_alias, str)
        else field.alias or name
        for name, field in model.model_fields.items()
        if not field.deprecated
        and not any(getattr(getattr(m, "func", None), "refused", False) for m in field.metadata)
    ]


def _model_at(model: type[BaseModel], loc: tuple) -> type[BaseModel] | None:
    for part in loc:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part)
        model = _inner_model(field.annotation) if field else None
        if model is None:
            return None
    return model


def _inner_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _inner_model(arg)
        if found is not None:
            return found
    return None


def _show(value: Any) -> str:
    if value is None:
        return "null"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
