"""The schema of the `cerebrax` command's config, as pydantic models.

Two layouts are read (see :mod:`cerebrax.cli`): the sectioned layout (``model``,
``train_input``, ``eval_input``, ``optimizer``, ``runconfig``) and the ``trainer:``
layout (``trainer.init`` and ``trainer.fit``). Every section refuses keys it does not
know; a few known keys that cerebrax cannot honour are declared :func:`refused`, so the
error says why and what to do instead. :func:`check` turns pydantic's errors into one
:class:`ConfigError` whose lines read ``<key path> must be <expected>, got <value>``.

Sections whose other keys are arguments of a user function (``model``, the inputs)
allow extra keys; :mod:`._build` checks them against that function's signature.

Every key has a ``Field`` description (a key that means the same in both layouts takes
it from :data:`SAME_IN_BOTH`), and a section that allows other keys says what they are
in a paragraph of its docstring that starts with "Other keys"; :mod:`._reference` makes
the config-key reference of the docs from them.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from collections.abc import Callable, Mapping
from typing import Annotated, Any, TypeVar

from pydantic import (BaseModel, BeforeValidator, ConfigDict, Field, PlainValidator,
                      ValidationError, create_model, model_validator)
from pydantic_core import PydanticCustomError, PydanticUndefined

from .. import optim
from .._filters import is_strict_int
from ..backend import EXECUTION_MODES, ClusterConfig
from ..errors import ConfigError

__all__ = ["METRICS", "ConfigV1", "ConfigV2", "Expected", "Refused", "check", "errors_message",
           "optimizer_options", "refused"]

Model = TypeVar("Model", bound=BaseModel)
BACKENDS = ("CPU", "GPU", "CSX")
HALF_DTYPES = ("float16", "bfloat16", "float32", "cbfloat16")
CLUSTER_KEYS = tuple(f.name for f in dataclasses.fields(ClusterConfig))
_APPLIANCE = ("an appliance setting of cstorch: checked and recorded, not applied (there is "
              "no appliance)")
# What each ClusterConfig field (a runconfig key) must be, and what it does.
CLUSTER_HELP = {
    "num_csx": ("an integer > 0", (
        "The number of CS systems: the outer data-parallel axis of the emulated wafer, "
        "each system with its own copy of the model. Not set: 1.")),
    "max_wgt_servers": ("an integer > 0", (
        "In weight_streaming and sharded mode, how many devices (weight servers) the "
        "parameters and optimizer state are sharded over. Not set, or 0: 24.")),
    "num_workers_per_csx": ("an integer >= 0", (
        "The streaming workers (threads) per system, each calling the input function for "
        "its own shard of the data; 0: one streamer, the main thread. Not set: 1.")),
    "max_act_per_csx": ("an integer > 0", (
        "Cerebras' activation servers per system: accepted for cstorch's configs, not "
        "applied by the emulation. Not set, or 0: 1.")),
    "transfer_processes": ("an integer > 0", (
        "Cerebras' data transfer processes: accepted for cstorch's configs, not applied "
        "by the emulation. Not set: 5.")),
    "mount_dirs": ("a list of strings", (
        f"Directories to mount into the appliance's containers, {_APPLIANCE}.")),
    "python_paths": ("a list of strings", (
        "Directories put on Python's import path before the config's functions are "
        "imported (a relative one is taken from the config file's directory); Model Zoo's "
        "can be one.")),
    "job_labels": ("a list of 'key=value' strings", (
        f"Labels of the appliance job, {_APPLIANCE}.")),
    "execution_mode": (f"one of {', '.join(EXECUTION_MODES)}", (
        "How the emulated wafer lays the model out over the devices: weight_streaming "
        "shards the parameters over `max_wgt_servers` devices, pipeline splits the layers "
        "into `num_stages` stages, replica runs `num_replicas` data-parallel copies, "
        "sharded lets XLA partition the model. Not set: weight_streaming.")),
    "num_stages": ("an integer > 0", (
        "In pipeline mode, the number of stages (devices) the model's layers are split "
        "into. Not set: one stage.")),
    "num_replicas": ("an integer > 0", (
        "In replica mode, the number of data-parallel copies of the model. Not set: 1.")),
    "micro_batch_size": ("an integer > 0", (
        "In pipeline mode, the rows of each micro-batch (not set: `num_stages` "
        "micro-batches per system); in weight_streaming and replica mode, each model call "
        "runs its rows in micro-batches of this size, recomputing their activations in "
        "the backward pass (not set: the whole batch at once).")),
    "pipeline_schedule": ("one of gpipe, circular", (
        "In pipeline mode, the order of the stages' work: gpipe runs all forward passes, "
        "then all backward passes; circular gives each device `pipeline_repeats` stages "
        "for a smaller bubble. Not set: gpipe.")),
    "pipeline_repeats": ("an integer > 0", (
        "With `pipeline_schedule: circular`, the stages each device runs. Not set: 2.")),
    "device_memory": ("a byte count or a size such as 16GiB", (
        "A per-device memory budget: the step is compiled ahead of time, and a step whose "
        "peak memory exceeds it is refused with the fixes. Not set: no budget.")),
    "mgmt_address": ("a string", f"The cluster management address, {_APPLIANCE}."),
    "mgmt_namespace": ("a string", f"The cluster management namespace, {_APPLIANCE}."),
    "credentials_path": ("a string", f"The cluster's TLS certificate, {_APPLIANCE}."),
    "cbcore_image": ("a string", f"The Cerebras software image to run, {_APPLIANCE}."),
    "job_priority": ("a string", f"The appliance job's priority, {_APPLIANCE}."),
    "job_time_sec": ("an integer >= 0", f"The appliance job's time limit, {_APPLIANCE}."),
    "automount": ("true or false", (
        f"Whether the appliance mounts the job's directories itself, {_APPLIANCE}.")),
    "mount_all": ("true or false", (
        f"Whether the appliance mounts all of the user's directories, {_APPLIANCE}.")),
    "disable_mount_check": ("true or false", (
        f"Whether the appliance skips its check of the mounts, {_APPLIANCE}.")),
    "disable_version_check": ("true or false", (
        f"Whether the appliance skips its software version check, {_APPLIANCE}.")),
    "workflow_id": ("a string", f"The appliance workflow to join, {_APPLIANCE}."),
    "notifications": ("any value", f"Notifications of the appliance job, {_APPLIANCE}."),
}
# The descriptions of the keys that mean the same in both layouts, by their name in the
# sectioned layout (`runconfig.checkpoint_steps` is `trainer.init.checkpoint.steps`);
# see :func:`_same_in_both`.
SAME_IN_BOTH = {
    "model": (
        "The model: `factory`, your function that builds it, or `name`, a Model Zoo "
        "model."),
    "metrics": (
        "The metrics `cerebrax eval` and validation compute besides the mean loss. Not "
        "with a Model Zoo model, which updates its own."),
    "num_steps": (
        "The total number of training steps of the run: a resumed run trains the steps "
        "that remain. `cerebrax fit` needs it (or `max_steps`, or `num_epochs`)."),
    "max_steps": "Model Zoo's name for `num_steps` (give one, or the same value).",
    "num_epochs": (
        "Train for this many passes over the training data instead of a number of steps "
        "(not with `num_steps` or `max_steps`)."),
    "seed": (
        "Seeds Python's, numpy's and torch's generators, and is the `seed` argument of a "
        "model factory or input function that takes one (unless its section sets it). "
        "Not set: unseeded."),
    "checkpoint_steps": (
        "`cerebrax fit` saves `model_dir/checkpoint_<step>.mdl` every this many steps and "
        "after the last one; 0: after the last step only."),
    "log_steps": (
        "`cerebrax fit` prints the loss, and writes it to TensorBoard, every this many "
        "steps."),
    "save_initial_checkpoint": (
        "`true`: save `checkpoint_0.mdl`, the initial weights, before the first step."),
    "keep_last_n": (
        "Once a checkpoint is written, delete those older than the newest this many, "
        "except the ones `keep_every_n_steps` keeps. Not set: keep every checkpoint."),
    "keep_every_n_steps": (
        "With `keep_last_n`: never delete the checkpoints whose step is a multiple of "
        "this. Not set: none is kept apart."),
    "model_dir": (
        "The run's directory: its checkpoints, recorded config, TensorBoard events and "
        "logs. `cerebrax fit` resumes the run it holds; `--model_dir` overrides it."),
    "compile_dir": (
        "Where `cerebrax compile` writes the HLO text and memory reports, and where JAX's "
        "compilation cache lives. Not set: `model_dir/compile`."),
    "precision_opt_level": (
        "Cerebras' precision optimization level: printed in the log, with no effect on "
        "the emulation, which computes in the half dtype."),
}
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
@dataclasses.dataclass(frozen=True)
class Expected:
    """A field type's metadata: what its value must be, as the error (and the config
    reference, :mod:`._reference`) says it."""

    text: str


@dataclasses.dataclass(frozen=True)
class Refused:
    """A refused key's metadata (see :func:`refused`): not listed among the keys a
    section takes."""

    reason: str


def _expect(expected: str, convert: Callable[[Any], Any]) -> Any:
    """A field type: ``convert(value)``, or the error ``must be <expected>``."""

    def validate(value: Any) -> Any:
        try:
            return convert(value)
        except (TypeError, ValueError):
            raise PydanticCustomError("expected", expected) from None

    return Annotated[Any, PlainValidator(validate), Expected(expected)]


def refused(reason: str, what: str) -> Any:
    """A known key that cerebrax cannot honour: any value is an error saying ``reason``.

    ``what`` says what the key is for; the key's description is ``what`` and ``reason``.
    """

    def validate(value: Any) -> Any:
        raise PydanticCustomError("refused", reason)

    return Annotated[Any, PlainValidator(validate), Refused(reason),
                     Field(description=f"{what} Refused: {reason}.")]


def _one_of(section: Model, first: str, second: str, *, both: str,
            neither: str | None = None) -> Model:
    """``section``, refused with the message ``both`` where it gives the keys ``first``
    and ``second`` both, and with ``neither`` (where given) where it gives neither."""
    given = [getattr(section, key) is not None for key in (first, second)]
    if neither is not None and not any(given):
        raise PydanticCustomError("refused", neither)
    if all(given):
        raise PydanticCustomError("refused", both)
    return section


def _same_in_both(key: str, default: Any = PydanticUndefined) -> Any:
    """The ``Field`` of a key that means the same in both layouts, described by
    ``SAME_IN_BOTH[key]``; required without a ``default``."""
    return Field(default, description=SAME_IN_BOTH[key])


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
# Model Zoo's switches that a command of its own replaces, refused in both layouts.
CompileOnly = refused("run `cerebrax compile CONFIG.yaml` instead",
                      "Model Zoo's switch to compile without running.")
ValidateOnly = refused("run `cerebrax validate CONFIG.yaml` instead",
                       "Model Zoo's switch to check the model without compiling it.")


# ---- sections shared by both layouts ---------------------------------------------------
# Keys such as ``model_dir`` are the config's own names: pydantic before 2.10 warns about
# fields that start with ``model_`` unless its protected namespaces are cleared.
class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, protected_namespaces=())


class Arguments(BaseModel):
    """A section whose other keys are arguments of a user function."""

    model_config = ConfigDict(extra="allow", frozen=True, protected_namespaces=())

    @property
    def kwargs(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class ModelSection(Arguments):
    """``factory`` (a function's import path, its arguments the other keys) or ``name``
    (a model of Cerebras Model Zoo's registry: :mod:`._modelzoo` gives the other keys
    to the model's config class, see :func:`._config.parse`).

    Other keys: with ``factory``, the arguments of that function (``hidden: 128`` calls
    ``factory(hidden=128)``), checked against its signature before it is called; with
    ``name``, the fields of the Model Zoo model's config class (``MNISTModelConfig`` for
    ``fc_mnist``), which refuses the keys it does not take, as in Model Zoo.
    """

    factory: ImportPath | None = Field(None, description=(
        "The function that builds the model (a flax nnx module, a torch module, ...), "
        "called with the section's other keys and with `seed` when it takes one. Give "
        "`factory` or `name`, not both."))
    name: Text | None = Field(None, description=(
        "A model of Cerebras Model Zoo's registry (`fc_mnist`), built from its config "
        "class with the section's other keys; it computes its own loss. Needs Model Zoo "
        "installed (or on `python_paths`); give `factory` or `name`, not both."))
    loss: Loss | None = Field(None, description=(
        "With `factory`: the loss, `cross_entropy` (softmax cross-entropy of the outputs "
        "against integer labels) or the import path of a function `fn(outputs, targets)` "
        "that returns a scalar. Not set: `cross_entropy`."))

    @model_validator(mode="after")
    def _one_model(self) -> ModelSection:
        return _one_of(self, "factory", "name", neither=MSG_NO_MODEL, both=(
            "factory and name both say which model to build; give one "
            "(name: a Model Zoo model, factory: 'package.module:function')"))


class InputSection(Arguments):
    """``input_fn`` (a function's import path, its arguments the other keys) or
    ``data_processor`` (one of the Model Zoo model's data processors: its config class
    takes the other keys).

    Other keys: with ``input_fn``, the arguments of that function (``split: test``),
    checked against its signature before it is called; with ``data_processor``, the
    fields of the data processor's Model Zoo config class, which refuses the keys it
    does not take.
    """

    input_fn: ImportPath | None = Field(None, description=(
        "The function that builds the batches: called with the section's other keys (and "
        "`seed` when it takes one), it returns an iterable of `(inputs, targets)` pairs. "
        "Give `input_fn` or `data_processor`, not both."))
    num_steps: Count | None = Field(None, description=(
        "In an evaluation section (`eval_input`, `val_dataloader`): how many batches an "
        "evaluation reads, the same key as the run's `eval_steps`. Not set: one pass over "
        "the data. A training section's length is the run's `num_steps`."))
    batch_size: Count | None = Field(None, description=(
        "The number of rows per batch, passed as the `batch_size` argument of `input_fn` "
        "(or to the data processor's config). Not set: the function's own default."))
    data_processor: Text | None = Field(None, description=(
        "One of the Model Zoo model's data processors (`MNISTDataProcessor`), configured "
        "with the section's other keys; its dataloader gives the batches. Needs a Model "
        "Zoo model (`name`); give `input_fn` or `data_processor`, not both."))

    @model_validator(mode="after")
    def _one_source(self) -> InputSection:
        return _one_of(self, "input_fn", "data_processor", neither=MSG_NO_INPUT, both=(
            "input_fn and data_processor both say where the batches come from; give one"))

    @property
    def kwargs(self) -> dict[str, Any]:
        extra = dict(self.model_extra or {})
        return extra if self.batch_size is None else {"batch_size": self.batch_size, **extra}


class Metric(Arguments):
    """One metric of a ``metrics`` list: a name (``accuracy``), or a mapping with ``type``.

    Other keys: the arguments of the metric's ``cstorch.metrics`` class, e.g.
    ``num_classes`` of ``fbeta_score``, ``mean_iou``, ``mean_per_class_accuracy`` and
    ``dice_coefficient``, checked against its signature.
    """

    type: MetricName = Field(description=(
        "Which metric (case-insensitive, a `Metric` suffix allowed: `AccuracyMetric`). "
        "`perplexity` reads the loss; the others compare the argmax of the model's "
        "outputs with the targets."))
    name: Text | None = Field(None, description=(
        "The name the metric is printed and logged under (`eval/<name>` in TensorBoard); "
        "two metrics need different names. Not set: its type."))

    @model_validator(mode="before")
    @classmethod
    def _from_name(cls, value: Any) -> Any:
        return {"type": value} if isinstance(value, str) else value


class Clipping(Section):
    max_gradient_norm: Positive | None = Field(None, description=(
        "Clip the gradients to this global L2 norm before every optimizer update. Not "
        "set: no clipping; not with `max_gradient_value`."))
    max_gradient_value: Positive | None = Field(None, description=(
        "Clip every gradient element into `[-value, value]` before every optimizer "
        "update. Not set: no clipping; not with `max_gradient_norm`."))

    @model_validator(mode="after")
    def _one_clip(self) -> Clipping:
        return _one_of(self, "max_gradient_norm", "max_gradient_value",
                       both="max_gradient_norm and max_gradient_value are exclusive; give one")


class LossScaling(Clipping):
    """The loss-scaling keys of an ``optimizer`` (or ``precision``) section."""

    loss_scaling_factor: LossScale | None = Field(None, description=(
        "Scale the loss before the backward pass (`cstorch.amp.GradScaler`), against "
        "half-precision gradients that underflow: `dynamic` adapts the scale, a number "
        "fixes it. Active on the CSX backend only. Not set: no loss scaling."))
    initial_loss_scale: Positive | None = Field(None, description=(
        "The first dynamic loss scale; needs `loss_scaling_factor: dynamic`. Not set: "
        "`2**15` (`2**31` for cbfloat16), capped by `max_loss_scale`."))
    max_loss_scale: Positive | None = Field(None, description=(
        "The largest dynamic loss scale; needs `loss_scaling_factor: dynamic`. Not set: "
        "`2**15` (`2**31` for cbfloat16)."))
    min_loss_scale: Positive | None = Field(None, description=(
        "The smallest dynamic loss scale; needs `loss_scaling_factor: dynamic`. Not set: "
        "`2**-14`."))
    steps_per_increase: Count | None = Field(None, description=(
        "After this many steps with finite gradients the dynamic loss scale doubles; "
        "needs `loss_scaling_factor: dynamic`. Not set: 2000."))

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
    mixed_precision: Flag | None = Field(None, description=(
        "`false`: compute in float32 (as `runconfig.half_dtype: float32`; not with "
        "`fp16_type`). Not set or `true`: mixed precision, in the half dtype of "
        "`fp16_type` or `runconfig.half_dtype`."))
    fp16_type: HalfDtype | None = Field(None, description=(
        "The half dtype the model computes in under mixed precision, the same key as "
        "`runconfig.half_dtype` (give one, or the same value). Not set: as "
        "`runconfig.half_dtype`."))


class OptimizerV1(LossScaling):
    """The ``optimizer`` section of the sectioned layout (its hyperparameters are checked
    by :func:`optimizer_options`).

    Other keys: the optimizer's hyperparameters (``momentum: 0.9``, ``weight_decay``,
    ``betas``), the arguments of its ``cstorch.optim`` class; a key the class does not
    take is an error that lists the ones it does.
    """

    model_config = ConfigDict(extra="allow", frozen=True)
    optimizer_type: Text = Field(description=(
        "The optimizer: the name of a `cstorch.optim` class, case-insensitive (`SGD`, "
        "`Adam`, `AdamW`, ...)."))
    learning_rate: Schedule | None = Field(None, description=(
        "The learning rate: a number, or a schedule of `cstorch.optim.configure_lr_scheduler` "
        "(a mapping, or a list of them run one after the other). The same key as `lr` "
        "(give one). Not set: the optimizer's default rate (0.1 where it has none)."))
    lr: Schedule | None = Field(None, description=(
        "The same key as `learning_rate` (give one)."))
    optim_params: Mapping_ | None = Field(None, description=(
        "More hyperparameters, as a mapping (Model Zoo's older spelling); each is read as "
        "if given as an other key of the section, and a key given both ways is an error."))
    adjust_learning_rate: refused(
        "per-parameter learning-rate factors are not built in the cerebrax command; "
        "give those parameters their own param group in a hand-written cstorch loop",
        "Model Zoo's per-parameter learning-rate factors.",
    ) = None
    log_summaries: refused("cerebrax writes no optimizer summaries; remove the key",
                           "Model Zoo's switch for optimizer summaries.") = None


class GradScalerV1(Section):
    """``loss_scaling:``: ``cstorch.amp.GradScaler``'s own arguments."""

    loss_scale: LossScale | None = Field(None, description=(
        "`dynamic` for a dynamic loss scale, or a number for a fixed one (GradScaler's "
        "`loss_scale`). Not set: no loss scaling."))
    init_scale: Positive | None = Field(None, description=(
        "The first dynamic loss scale. Not set: `2**15` (`2**31` for cbfloat16), capped by "
        "`max_loss_scale`."))
    steps_per_increase: Count | None = Field(None, description=(
        "After this many steps with finite gradients the dynamic loss scale doubles. Not "
        "set: 2000."))
    min_loss_scale: Positive | None = Field(None, description=(
        "The smallest dynamic loss scale. Not set: `2**-14`."))
    max_loss_scale: Positive | None = Field(None, description=(
        "The largest dynamic loss scale. Not set: `2**15` (`2**31` for cbfloat16)."))
    overflow_tolerance: NonNegative | None = Field(None, description=(
        "The fraction of steps with overflowing gradients tolerated before the dynamic "
        "loss scale is halved. Not set: 0."))


class _RunConfigV1(Section):
    num_steps: Count | None = _same_in_both("num_steps", None)
    max_steps: Count | None = _same_in_both("max_steps", None)
    num_epochs: Count | None = _same_in_both("num_epochs", None)
    seed: Integer | None = _same_in_both("seed", None)
    eval_steps: Count | None = Field(None, description=(
        "How many batches an evaluation reads, the same key as `eval_input.num_steps` "
        "(give one, or the same value). Not set: one pass over the eval data."))
    eval_frequency: Count | None = Field(None, description=(
        "`cerebrax fit` validates on the eval data every this many steps and after the "
        "last one; needs an `eval_input` section. Not set: no validation during fit."))
    checkpoint_steps: Count0 = _same_in_both("checkpoint_steps", 0)
    log_steps: Count = _same_in_both("log_steps", 1)
    save_initial_checkpoint: Flag = _same_in_both("save_initial_checkpoint", False)
    keep_last_n: Count | None = _same_in_both("keep_last_n", None)
    keep_every_n_steps: Count | None = _same_in_both("keep_every_n_steps", None)
    model_dir: Text = _same_in_both("model_dir", "./model_dir")
    compile_dir: Text | None = _same_in_both("compile_dir", None)
    backend: Backend = Field("CSX", description=(
        "Where the run computes: `CPU`, `GPU`, or `CSX`, the emulated Cerebras wafer over "
        "JAX's devices (case-insensitive)."))
    half_dtype: HalfDtype | None = Field(None, description=(
        "The dtype the model computes in under mixed precision (`cstorch.amp.set_half_dtype`); "
        "`float32` computes in float32. Not set: float16 on CSX, float32 on CPU and GPU."))
    checkpoint_path: Text | None = Field(None, description=(
        "The checkpoint `cerebrax fit` starts from or `cerebrax eval` evaluates; "
        "`--checkpoint` overrides it. Not set: the newest checkpoint of `model_dir`."))
    precision_opt_level: Count0 | None = _same_in_both("precision_opt_level", None)
    mode: refused("the command sets the mode: `cerebrax fit` trains, `cerebrax eval` "
                  "evaluates; remove the key",
                  "Model Zoo's run mode (train, eval, ...).") = None
    target_device: refused("use runconfig.backend: CPU, GPU or CSX",
                           "Model Zoo's device to run on.") = None
    compile_only: CompileOnly = None
    validate_only: ValidateOnly = None


def _cluster_key(name: str) -> tuple[Any, Any]:
    """A ``ClusterConfig`` field as a ``runconfig`` key (ClusterConfig checks its value)."""
    expected, description = CLUSTER_HELP.get(name, (None, None))
    kind = Annotated[Any, Expected(expected)] if expected else Any
    return kind, Field(None, description=description)


# ClusterConfig's fields too, checked by ClusterConfig itself.
RunConfigV1 = create_model(
    "RunConfigV1", __base__=_RunConfigV1, **{k: _cluster_key(k) for k in CLUSTER_KEYS}
)
Metrics = Annotated[
    list[Metric], BeforeValidator(lambda v: [v] if isinstance(v, (str, Mapping)) else v),
    Expected("a metric (a name or a mapping) or a list of them"),
]


class ConfigV1(Section):
    """The sectioned layout of Model Zoo's ``params.yaml``: a ``model`` section, the
    ``train_input`` and ``eval_input`` data, the ``optimizer`` and the ``runconfig``,
    each a mapping of its keys (``configs/digits_mlp.yaml`` is an example). A config
    without a top-level ``trainer`` key is read in this layout."""

    model: ModelV1 = _same_in_both("model")
    train_input: InputSection | None = Field(None, description=(
        "The training data; `cerebrax fit` needs it, as do `validate` and `compile` of "
        "the train step."))
    eval_input: InputSection | None = Field(None, description=(
        "The evaluation data, read by `cerebrax eval` and by validation during fit "
        "(`runconfig.eval_frequency`)."))
    optimizer: OptimizerV1 | None = Field(None, description=(
        "The optimizer, its learning rate, gradient clipping and loss scaling; `cerebrax "
        "fit` needs it."))
    loss_scaling: GradScalerV1 | None = Field(None, description=(
        "Loss scaling as `cstorch.amp.GradScaler`'s own arguments, instead of "
        "`optimizer.loss_scaling_factor` (give one). Not set: as the optimizer section "
        "says."))
    max_gradient_norm: Positive | None = Field(None, description=(
        "Clip the gradients to this global L2 norm before every update, the same key as "
        "`optimizer.max_gradient_norm` (give one). Not set: no clipping."))
    max_gradient_value: Positive | None = Field(None, description=(
        "Clip every gradient element into `[-value, value]` before every update, the "
        "same key as `optimizer.max_gradient_value` (give one). Not set: no clipping."))
    metrics: Metrics = _same_in_both("metrics", [])
    runconfig: RunConfigV1 = Field(RunConfigV1(), description=(
        "How the run goes: its length, checkpoints, logging, directories and backend, "
        "and, from `num_csx` on, the fields of the CSX backend's `ClusterConfig`."))


# ---- the trainer: layout ---------------------------------------------------------------
class BackendV2(Section):
    backend_type: Backend = Field("CSX", description=(
        "Where the run computes: `CPU`, `GPU`, or `CSX`, the emulated Cerebras wafer over "
        "JAX's devices (case-insensitive); the same key as `trainer.init.device` (give "
        "one, or the same value)."))
    cluster_config: Mapping_ | None = Field(None, description=(
        "The cluster of a CSX run: `ClusterConfig`'s fields, as listed under "
        "`runconfig` (`num_csx`, `execution_mode`, `python_paths`, ...). Not set: their "
        "defaults."))
    compile_dir: Text | None = _same_in_both("compile_dir", None)
    compile_only: CompileOnly = None
    validate_only: ValidateOnly = None


class PrecisionV2(LossScaling):
    enabled: Flag = Field(True, description=(
        "`true`: mixed precision, the model computes in the half dtype of `fp16_type`; "
        "`false`: it computes in float32 (not with `fp16_type`)."))
    fp16_type: HalfDtype | None = Field(None, description=(
        "The dtype the model computes in under mixed precision (`cstorch.amp.set_half_dtype`). "
        "Not set: float16 on CSX, float32 on CPU and GPU."))
    precision_opt_level: Count0 | None = _same_in_both("precision_opt_level", None)


class LoopV2(Section):
    num_steps: Count | None = _same_in_both("num_steps", None)
    max_steps: Count | None = _same_in_both("max_steps", None)
    num_epochs: Count | None = _same_in_both("num_epochs", None)
    eval_steps: Count | None = Field(None, description=(
        "How many batches an evaluation reads, the same key as the val_dataloader's "
        "`num_steps` (give one, or the same value). Not set: one pass over the data."))
    eval_frequency: Count | None = Field(None, description=(
        "`cerebrax fit` validates on `trainer.fit.val_dataloader` every this many steps "
        "and after the last one. Not set: no validation during fit."))
    grad_accum_steps: refused(
        "gradient accumulation is not built in the cerebrax command; lower the batch "
        "size or accumulate in a hand-written cstorch loop",
        "Model Zoo's number of micro-steps whose gradients make one update.",
    ) = None


class CheckpointV2(Section):
    steps: Count0 = _same_in_both("checkpoint_steps", 0)
    save_initial_checkpoint: Flag = _same_in_both("save_initial_checkpoint", False)
    keep_last_n: Count | None = _same_in_both("keep_last_n", None)
    keep_every_n_steps: Count | None = _same_in_both("keep_every_n_steps", None)


class LoggingV2(Section):
    log_steps: Count = _same_in_both("log_steps", 1)


def _one_optimizer(value: Any) -> Any:
    if not isinstance(value, Mapping) or len(value) != 1:
        raise ValueError(value)
    ((name, options),) = value.items()
    if not isinstance(name, str) or not isinstance(options, Mapping):
        raise ValueError(value)
    return value


class InitV2(Section):
    device: Backend | None = Field(None, description=(
        "Where the run computes: `CPU`, `GPU` or `CSX` (case-insensitive), the same key "
        "as `backend.backend_type` (give one, or the same value). Not set: `CSX`."))
    backend: BackendV2 | None = Field(None, description=(
        "The backend: its type, the cluster of a CSX run and the compile directory. Not "
        "set: a CSX backend with `ClusterConfig`'s defaults."))
    model_dir: Text = _same_in_both("model_dir", "./model_dir")
    seed: Integer | None = _same_in_both("seed", None)
    model: ModelSection = _same_in_both("model")
    optimizer: _expect("a mapping {NAME: {hyperparameters}}, e.g. {SGD: {lr: 0.01}}",
                       _one_optimizer) = Field(None, description=(
        "The optimizer: the name of a `cstorch.optim` class (case-insensitive) and its "
        "hyperparameters, `lr` among them. `cerebrax fit` needs it."))
    schedulers: _expect("a list of {NAME: {arguments}} mappings",
                        _test(lambda v: isinstance(v, list) and v)) = Field(None, description=(
        "Learning-rate schedules of `cstorch.optim.configure_lr_scheduler`, run one after "
        "the other; they replace the optimizer's `lr`. Not set: a constant rate."))
    precision: PrecisionV2 = Field(PrecisionV2(), description=(
        "Mixed precision, loss scaling and gradient clipping."))
    loop: LoopV2 = Field(LoopV2(), description=(
        "How long the run trains and evaluates, and how often fit validates."))
    checkpoint: CheckpointV2 = Field(CheckpointV2(), description=(
        "When `cerebrax fit` saves checkpoints, and which ones it keeps."))
    logging: LoggingV2 = Field(LoggingV2(), description="How often `cerebrax fit` logs.")
    metrics: Metrics = _same_in_both("metrics", [])
    callbacks: refused("callbacks are not built in cerebrax; remove the key",
                       "Model Zoo's Trainer callbacks.") = None
    loggers: refused("cerebrax logs to stdout (and a progress bar); remove the key",
                     "Model Zoo's Trainer loggers.") = None


class FitV2(Section):
    train_dataloader: InputSection = Field(description="The training data.")
    val_dataloader: InputSection | None = Field(None, description=(
        "The evaluation data, read by `cerebrax eval` and by validation during fit "
        "(`trainer.init.loop.eval_frequency`); the same section as "
        "`trainer.validate.val_dataloader` (give one, or the same keys)."))
    ckpt_path: Text | None = Field(None, description=(
        "The checkpoint `cerebrax fit` starts from or `cerebrax eval` evaluates, the same "
        "key as `trainer.validate.ckpt_path` (give one, or the same value); `--checkpoint` "
        "overrides it. Not set: the newest checkpoint of `model_dir`."))


class ValidateV2(Section):
    val_dataloader: InputSection = Field(description=(
        "The evaluation data, read by `cerebrax eval` and by validation during fit; the "
        "same section as `trainer.fit.val_dataloader` (give one, or the same keys)."))
    ckpt_path: Text | None = Field(None, description=(
        "The checkpoint `cerebrax eval` evaluates (or `cerebrax fit` starts from), the "
        "same key as `trainer.fit.ckpt_path` (give one, or the same value). Not set: the "
        "newest checkpoint of `model_dir`."))


class TrainerV2(Section):
    init: InitV2 = Field(description=(
        "How the model, optimizer and run are built: Model Zoo's `Trainer` arguments."))
    fit: FitV2 | None = Field(None, description=(
        "The data `cerebrax fit` trains on (and validates on), and the checkpoint to "
        "start from."))
    # Named validate_: BaseModel has .validate.
    validate_: ValidateV2 | None = Field(None, alias="validate", description=(
        "The evaluation data and checkpoint, in place of `trainer.fit.val_dataloader` "
        "and `trainer.fit.ckpt_path`."))


class ConfigV2(Section):
    """The ``trainer:`` layout of Model Zoo 2.x: one top-level ``trainer`` key, whose
    ``init`` says how the model, optimizer and run are built, and whose ``fit`` and
    ``validate`` say which data to read. A config with a top-level ``trainer`` key is
    read in this layout."""

    trainer: TrainerV2 = Field(description="The whole job: `init`, `fit` and `validate`.")


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
        and not any(isinstance(m, Refused) for m in field.metadata)
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
