"""Config classes built from the constructors' signatures, the way Model Zoo builds them.

Cerebras' Model Zoo turns every cstorch optimizer, LR and weight-decay scheduler and
sparsity algorithm into a pydantic model: one field per parameter of
``inspect.signature(cls.__init__)``, typed by the parameter's annotation, which is first
looked up (by hash and equality) in a mapping keyed by annotation, so ``params`` must be
annotated with ``cstorch.optim.optimizer.ParamsT`` itself and a scheduler's
``optimizer`` with ``torch.optim.Optimizer`` itself. Every subclass becomes one member of
a union discriminated by the lowercased class name. The tests below build such models with
a short builder of their own, validate configs of the shape Model Zoo's YAML files have,
and construct the real objects from the validated configs.
"""

from __future__ import annotations

import gc
import inspect
import json
import subprocess
import sys
import typing
from typing import Annotated, Any, ClassVar, List, Optional, Union

import jax.numpy as jnp
import pydantic
import pytest
from pydantic import BeforeValidator, Discriminator, Field, Tag

import cerebrax as cstorch
from cerebrax.errors import UnsupportedOpError
from cerebrax.optim.optimizer import ParamsT

try:
    import torch
except ImportError:  # the no-torch checks below run in a subprocess either way
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="Model Zoo maps torch.optim.Optimizer")

LRScheduler = cstorch.optim.lr_scheduler.LRScheduler
WeightDecayScheduler = cstorch.optim.weight_decay_scheduler.WeightDecayScheduler
SparsityAlgorithm = cstorch.sparse.SparsityAlgorithm
_NAME = "__name__"  # the key a config's class name travels under into the union


def subclasses(base: type) -> list[type]:
    """cerebrax's subclasses of ``base``, direct or not (other tests define their own)."""
    found: dict[type, None] = {}
    stack = [base]
    while stack:
        for child in type.__subclasses__(stack.pop()):
            if child not in found and child.__module__.startswith("cerebrax."):
                found[child] = None
                stack.append(child)
    return list(found)


OPTIMIZERS = subclasses(cstorch.optim.Optimizer)
SCHEDULERS = subclasses(LRScheduler)
WD_SCHEDULERS = subclasses(WeightDecayScheduler)
ALGORITHMS = subclasses(SparsityAlgorithm)
EVERY_CLASS = [cstorch.optim.Optimizer, *OPTIMIZERS, LRScheduler, *SCHEDULERS,
               SparsityAlgorithm, *ALGORITHMS]


def parameters(cls: type) -> dict[str, inspect.Parameter]:
    """The constructor's parameters, ``self`` left out (as Model Zoo reads them)."""
    found = dict(inspect.signature(cls.__init__).parameters)
    found.pop("self", None)
    return found


# ---- the signatures ------------------------------------------------------------------
def unresolved(annotation: Any) -> list[Any]:
    """The parts of ``annotation`` that are still text (a str or a ForwardRef)."""
    if isinstance(annotation, (str, typing.ForwardRef)):
        return [annotation]
    if typing.get_origin(annotation) is typing.Literal:  # its arguments are values
        return []
    return [part for arg in typing.get_args(annotation) for part in unresolved(arg)]


@pytest.mark.parametrize("cls", EVERY_CLASS, ids=lambda c: c.__name__)
def test_every_parameter_has_a_real_annotation(cls):
    for name, parameter in parameters(cls).items():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        assert parameter.annotation is not parameter.empty, f"{cls.__name__}({name})"
        assert not unresolved(parameter.annotation), f"{cls.__name__}({name}): {parameter}"


@pytest.mark.parametrize("cls", [cstorch.optim.Optimizer, *OPTIMIZERS], ids=lambda c: c.__name__)
def test_optimizer_params_are_annotated_with_params_t(cls):
    assert parameters(cls)["params"].annotation is ParamsT


@needs_torch
@pytest.mark.parametrize("cls", [LRScheduler, *SCHEDULERS], ids=lambda c: c.__name__)
def test_scheduler_optimizer_is_annotated_with_the_torch_optimizer(cls):
    found = parameters(cls)
    if "optimizer" in found:  # ChainedScheduler takes its members' optimizer
        assert found["optimizer"].annotation is torch.optim.Optimizer


@pytest.mark.parametrize("cls, name, member", [
    (cstorch.optim.lr_scheduler.SequentialLR, "schedulers", LRScheduler),
    (cstorch.optim.lr_scheduler.ChainedScheduler, "schedulers", LRScheduler),
    (cstorch.optim.weight_decay_scheduler.SequentialWD, "schedulers", WeightDecayScheduler),
    (cstorch.optim.weight_decay_scheduler.ChainedWD, "schedulers", WeightDecayScheduler),
])
def test_nested_schedulers_are_a_list_of_the_scheduler_base(cls, name, member):
    annotation = parameters(cls)[name].annotation
    assert typing.get_origin(annotation) is list and typing.get_args(annotation) == (member,)


def test_scale_per_param_wraps_a_scheduler_of_its_kind():
    assert parameters(cstorch.optim.lr_scheduler.ScalePerParamLR)["scheduler"].annotation \
        is LRScheduler
    assert parameters(cstorch.optim.weight_decay_scheduler.ScalePerParamWD)["scheduler"] \
        .annotation is WeightDecayScheduler


def test_the_signature_of_a_class_leaves_out_self():
    # inspect builds it from the signature of __init__ (Signature.replace)
    by_class = inspect.signature(cstorch.optim.lr_scheduler.ConstantLR)
    assert list(by_class.parameters)[:2] == ["optimizer", "learning_rate"]
    assert by_class.parameters["learning_rate"].annotation is float
    assert inspect.signature(cstorch.optim.SGD).parameters["params"].annotation is ParamsT


USER_OPTIMIZER = """
from __future__ import annotations
from typing import TYPE_CHECKING
import cerebrax as cstorch
if TYPE_CHECKING:
    from elsewhere import Thing

class MyOptimizer(cstorch.optim.Optimizer):
    def __init__(self, params: cstorch.optim.optimizer.ParamsT, lr: float = 0.1,
                 thing: Thing | None = None):
        super().__init__(params, {"lr": lr})
"""


def test_a_user_optimizer_gets_what_its_module_can_resolve():
    """A subclass's annotations are evaluated in its own module; a name that module
    imports only for type checkers stays the text inspect shows without cerebrax."""
    namespace: dict[str, Any] = {}
    exec(USER_OPTIMIZER, namespace)
    try:
        found = inspect.signature(namespace["MyOptimizer"]).parameters
        assert found["params"].annotation is ParamsT and found["lr"].annotation is float
        assert found["thing"].annotation == "Thing | None"
    finally:  # configure_optimizer looks optimizers up among the subclasses alive
        namespace.clear()
        gc.collect()
    assert "MyOptimizer" not in {c.__name__ for c in type.__subclasses__(cstorch.optim.Optimizer)}


NO_TORCH = """
import inspect, json, sys, typing
sys.modules["torch"] = None  # `import torch` raises ImportError, as where it is not installed
import jax.numpy as jnp
import cerebrax as cstorch

def text(annotation):
    if isinstance(annotation, (str, typing.ForwardRef)):
        return [repr(annotation)]
    if typing.get_origin(annotation) is typing.Literal:
        return []
    return [t for a in typing.get_args(annotation) for t in text(a)]

found, classes = {}, [cstorch.optim.Optimizer, cstorch.optim.lr_scheduler.LRScheduler,
                       cstorch.sparse.SparsityAlgorithm]
for cls in classes:
    classes.extend(type.__subclasses__(cls))  # walks every subclass as the list grows
    for name, p in inspect.signature(cls.__init__).parameters.items():
        found.update({f"{cls.__name__}({name})": t for t in text(p.annotation)})
model = cstorch.compile(cstorch.FunctionalModel(lambda p, x: (p["w"] * x).sum(),
                                                {"w": jnp.zeros(2)}), "CPU")
optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)
scheduler = cstorch.optim.lr_scheduler.ConstantLR(optimizer, learning_rate=0.25)
optimizer_annotation = inspect.signature(
    cstorch.optim.lr_scheduler.ConstantLR.__init__).parameters["optimizer"].annotation
print(json.dumps({"text": found, "optimizer": repr(optimizer_annotation),
                  "lr": scheduler.get_last_lr(), "torch": sys.modules["torch"] is None}))
"""


def test_signatures_resolve_and_schedulers_work_without_torch():
    out = subprocess.run([sys.executable, "-c", NO_TORCH], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found["text"] == {}
    assert found["optimizer"] == "typing.Any" and found["torch"]
    assert found["lr"] == [0.25]


LAZY_TORCH = """
import inspect, json, sys
import jax.numpy as jnp
import cerebrax as cstorch

model = cstorch.compile(cstorch.FunctionalModel(lambda p, x: (p["w"] * x).sum(),
                                                {"w": jnp.zeros(2)}), "CPU")
optimizer = cstorch.optim.configure_optimizer("SGD", model.parameters(), learning_rate=0.1)
cstorch.optim.configure_lr_scheduler(optimizer, {"scheduler": "Linear", "total_iters": 2,
    "initial_learning_rate": 0.0, "end_learning_rate": 0.1})
configured = "torch" in sys.modules
annotation = inspect.signature(cstorch.optim.lr_scheduler.LinearLR).parameters["optimizer"]
print(json.dumps({"configured": configured, "inspected": "torch" in sys.modules,
                  "annotation": repr(annotation.annotation)}))
"""


@needs_torch
def test_torch_is_imported_when_a_signature_is_first_inspected_not_before():
    """configure_lr_scheduler reads the parameters' names and defaults only: it evaluates
    no annotation, so a script that uses no torch does not pay for importing it."""
    out = subprocess.run([sys.executable, "-c", LAZY_TORCH], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found == {"configured": False, "inspected": True,
                     "annotation": "<class 'torch.optim.optimizer.Optimizer'>"}


# ---- config classes, as Model Zoo builds them ---------------------------------------------
class Config(pydantic.BaseModel):
    """A config of one class: its constructor's arguments, the class in ``target``."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True, populate_by_name=True,
                                       arbitrary_types_allowed=True)
    target: ClassVar[type]

    def build(self, **given: Any) -> Any:
        """The object: the fields (nested configs built first, with ``given``), where
        ``given`` names a field its value instead (the optimizer, the params)."""
        fields = {name: given.get(name, getattr(self, name)) for name in type(self).model_fields}
        fields.update(self.model_extra or {})
        return self.target(**{k: build(v, given) for k, v in fields.items()})


class OpenConfig(Config):
    """The config of a constructor with ``**kwargs``: it keeps every other key."""

    model_config = pydantic.ConfigDict(extra="allow")


def build(value: Any, given: dict) -> Any:
    if isinstance(value, Config):
        return value.build(**given)
    if isinstance(value, list):
        return [build(v, given) for v in value]
    return value


def field_type(annotation: Any, name: str, mapping: dict) -> Any:
    """The field type of an annotation: mapped by the annotation (alone, then with the
    parameter's name), else rebuilt from its mapped arguments. Like Model Zoo's builder it
    looks inside list, tuple, dict and typing.Union only, so what it cannot map fails here
    as it fails there."""
    if annotation is inspect.Parameter.empty:
        return Any
    for key in (annotation, (annotation, name)):
        if key in mapping:
            return mapping[key]
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (list, tuple, dict) and args:
        return origin[tuple(field_type(arg, "", mapping) for arg in args)]
    if origin is Union:
        return Union[tuple(field_type(arg, "", mapping) for arg in args)]
    return annotation


def mapped_default(kind: Any) -> Any:
    """The default an ``Annotated[..., Field(default=...)]`` mapped type carries, else
    ``...`` (required)."""
    for meta in getattr(kind, "__metadata__", ()):
        if isinstance(meta, pydantic.fields.FieldInfo) and not meta.is_required():
            return meta.default
    return ...


def config_class(cls: type, mapping: dict) -> type[Config]:
    fields, base = {}, Config
    for name, parameter in parameters(cls).items():
        if parameter.kind is parameter.VAR_KEYWORD:
            base = OpenConfig
        elif parameter.kind is not parameter.VAR_POSITIONAL:
            # Without a default of its own a field is required, unless its mapped type
            # has one (Field(default=...)), which it keeps: given as the default too, so
            # that pydantic 2.8 (Model Zoo's pin) and 2.10+ read it alike.
            kind = field_type(parameter.annotation, name, mapping)
            default = (mapped_default(kind) if parameter.default is parameter.empty
                       else parameter.default)
            fields[name] = (kind, default)
    model = pydantic.create_model(cls.__name__, __base__=base, __module__=__name__, **fields)
    model.target = cls
    return model


def unpack(value: Any) -> Any:
    """``{"SGD": {...}}`` (a YAML entry) as the dict the union validates."""
    if isinstance(value, dict) and len(value) == 1 and isinstance(next(iter(value.values())),
                                                                  dict):
        (name, arguments), = value.items()
        return {_NAME: name, **arguments}
    return value


def class_tag(value: Any) -> str:
    return value.pop(_NAME).lower() if isinstance(value, dict) else type(value).__name__.lower()


def members(classes: list[type], mapping: dict) -> tuple:
    return tuple(Annotated[config_class(cls, mapping), Tag(cls.__name__.lower())]
                 for cls in classes)


def union(choices: tuple) -> Any:
    return Annotated[Union[choices], Discriminator(class_tag), BeforeValidator(unpack)]


def rebuilt(choices: tuple, **namespace: Any) -> tuple:
    """``choices`` with their forward references (nested schedulers) resolved."""
    for choice in choices:
        typing.get_args(choice)[0].model_rebuild(force=True, _types_namespace=namespace)
    return choices


@pytest.fixture(scope="module")
def trainer_config():
    """The part of Model Zoo's trainer config that these classes make: the optimizer,
    the schedulers (LR and weight-decay ones in one list) and the sparsity."""
    optimizers = members(OPTIMIZERS, {
        ParamsT: Annotated[List[dict], Field(default=[])],
        (float, "lr"): Annotated[float, Field(default=0.1, alias="learning_rate")],
        (Optional[float], "lr"): Annotated[Optional[float],
                                           Field(default=None, alias="learning_rate")],
    })
    no_optimizer = Annotated[Optional[torch.optim.Optimizer], Field(default=None, exclude=True)]
    lr = members(SCHEDULERS, {torch.optim.Optimizer: no_optimizer,
                              LRScheduler: "LRSchedulerConfig"})
    wd = members(WD_SCHEDULERS, {torch.optim.Optimizer: no_optimizer,
                                 WeightDecayScheduler: "WeightDecaySchedulerConfig"})
    rebuilt(lr + wd, LRSchedulerConfig=union(lr), WeightDecaySchedulerConfig=union(wd))
    algorithms = members([c for c in ALGORITHMS if not inspect.isabstract(c)], {})
    by_algorithm = Discriminator(lambda s: s.get("algorithm", "static").lower()
                                 if isinstance(s, dict) else type(s).__name__.lower())

    class TrainerConfig(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="forbid")
        optimizer: union(optimizers)
        schedulers: List[union(lr + wd)] = []
        sparsity: Optional[List[Annotated[Union[algorithms], by_algorithm]]] = None

    return TrainerConfig


def compiled_model() -> Any:
    return cstorch.compile(cstorch.FunctionalModel(
        lambda p, x: (p["w"] * x).sum() + p["b"].sum(),
        {"w": jnp.zeros(3), "b": jnp.zeros(1)}), "CPU")


@needs_torch
def test_an_optimizer_config_builds_the_optimizer(trainer_config):
    config = trainer_config.model_validate(
        {"optimizer": {"SGD": {"learning_rate": 0.01, "momentum": 0.9}}})
    optimizer = config.optimizer.build(params=list(compiled_model().parameters()))
    assert type(optimizer) is cstorch.optim.SGD
    group = optimizer.param_groups[0]
    assert (group["lr"], group["momentum"], group["nesterov"]) == (0.01, 0.9, False)


@needs_torch
def test_an_adamw_config_with_param_groups(trainer_config):
    config = trainer_config.model_validate({"optimizer": {"AdamW": {
        "lr": 2e-4, "betas": [0.9, 0.95], "weight_decay": 0.1, "correct_bias": True}}})
    params = dict(compiled_model().named_parameters())
    optimizer = config.optimizer.build(params=[
        {"params": [params["w"]]}, {"params": [params["b"]], "weight_decay": 0.0}])
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.1, 0.0]
    assert optimizer.param_groups[0]["betas"] == (0.9, 0.95)
    assert optimizer.param_groups[1]["lr"] == 2e-4


@needs_torch
def test_an_unknown_optimizer_argument_is_refused(trainer_config):
    with pytest.raises(pydantic.ValidationError, match="momentun"):
        trainer_config.model_validate({"optimizer": {"SGD": {"lr": 0.1, "momentun": 0.9}}})


def _optimizer(config: Any, **groups: Any) -> Any:
    params = dict(compiled_model().named_parameters())
    return config.optimizer.build(params=[{"params": [params[name]], **group}
                                          for name, group in groups.items()])


@needs_torch
def test_a_constant_lr_config_builds_the_scheduler(trainer_config):
    config = trainer_config.model_validate({
        "optimizer": {"SGD": {"lr": 0.1}},
        "schedulers": [{"ConstantLR": {"learning_rate": 0.01}}]})
    optimizer = _optimizer(config, w={}, b={})
    scheduler = config.schedulers[0].build(optimizer=optimizer)
    assert type(scheduler) is cstorch.optim.lr_scheduler.ConstantLR
    assert scheduler.get_last_lr() == pytest.approx([0.01, 0.01])
    assert "optimizer" not in config.schedulers[0].model_dump()


def _lrs(scheduler: Any, steps: int) -> list[float]:
    lrs = []
    for _ in range(steps):
        lrs.append(round(scheduler.get_last_lr()[0], 5))
        scheduler.step()
    return lrs


WARMUP_THEN_DECAY = {"SequentialLR": {
    "schedulers": [
        {"LinearLR": {"initial_learning_rate": 0.0, "end_learning_rate": 0.1,
                      "total_iters": 2}},
        {"CosineDecayLR": {"initial_learning_rate": 0.1, "end_learning_rate": 0.0,
                           "total_iters": 4}}],
    "milestones": [2]}}


@needs_torch
def test_a_sequential_lr_config_builds_its_nested_schedulers(trainer_config):
    config = trainer_config.model_validate({"optimizer": {"SGD": {"lr": 0.1}},
                                            "schedulers": [WARMUP_THEN_DECAY]})
    nested = config.schedulers[0].schedulers
    assert [type(c).target for c in nested] == [cstorch.optim.lr_scheduler.LinearLR,
                                                cstorch.optim.lr_scheduler.CosineDecayLR]
    scheduler = config.schedulers[0].build(optimizer=_optimizer(config, w={}))
    assert type(scheduler) is cstorch.optim.lr_scheduler.SequentialLR
    assert _lrs(scheduler, 7) == [0.0, 0.05, 0.1, 0.08536, 0.05, 0.01464, 0.0]


@needs_torch
def test_a_scale_per_param_config_wraps_its_nested_scheduler(trainer_config):
    config = trainer_config.model_validate({
        "optimizer": {"AdamW": {"lr": 0.1}},
        "schedulers": [{"ScalePerParamLR": {"scheduler": WARMUP_THEN_DECAY}}]})
    optimizer = _optimizer(config, w={"adjust_learning_rate": 0.5}, b={})
    scheduler = config.schedulers[0].build(optimizer=optimizer)
    for _ in range(2):
        scheduler.step()
    assert scheduler.get_last_lr() == pytest.approx([0.05, 0.1])


@needs_torch
def test_a_chained_scheduler_config_gets_the_optimizer_through_its_members(trainer_config):
    config = trainer_config.model_validate({
        "optimizer": {"SGD": {"lr": 0.1}},
        "schedulers": [{"ChainedScheduler": {"schedulers": [
            {"ConstantLR": {"learning_rate": 0.1}},
            {"ExponentialLR": {"initial_learning_rate": 1.0, "total_iters": 1,
                               "decay_rate": 0.5}}]}}]})
    scheduler = config.schedulers[0].build(optimizer=_optimizer(config, w={}))
    assert _lrs(scheduler, 3) == [0.1, 0.05, 0.025]


@needs_torch
def test_weight_decay_and_lr_schedulers_in_one_list(trainer_config):
    config = trainer_config.model_validate({
        "optimizer": {"AdamW": {"lr": 0.1, "weight_decay": 0.0}},
        "schedulers": [
            {"CosineDecayWD": {"initial_val": 0.04, "end_val": 0.4, "total_iters": 100,
                               "param_group_tags": "wd_params"}},
            {"SequentialWD": {"schedulers": [  # the untagged groups, as its members
                {"ConstantWD": {"val": 0.5, "total_iters": 2, "param_group_tags": [None]}},
                {"LinearWD": {"initial_val": 0.5, "end_val": 0.0, "total_iters": 2,
                              "param_group_tags": [None]}}],
                "milestones": [2], "param_group_tags": [None]}},
            {"CyclicLR": {"base_lr": 0.01, "max_lr": 0.1, "step_size_up": 2,
                          "mode": "triangular2"}}]})
    optimizer = _optimizer(config, w={"tags": {"wd_params"}}, b={})
    built = [c.build(optimizer=optimizer) for c in config.schedulers]
    assert [type(s).__name__ for s in built] == ["CosineDecayWD", "SequentialWD", "CyclicLR"]
    assert [g["weight_decay"] for g in optimizer.param_groups] == pytest.approx([0.04, 0.5])
    assert [g["lr"] for g in optimizer.param_groups] == pytest.approx([0.01, 0.01])


@needs_torch
@pytest.mark.parametrize("entry, error", [
    ({"CyclicLR": {"base_lr": 0.1, "max_lr": 1.0, "mode": "sawtooth"}}, "mode"),
    ({"OneCycleLR": {"initial_learning_rate": 0.1, "max_lr": 1.0,
                     "anneal_strategy": "cosine"}}, "anneal_strategy"),
    ({"MultiStepLR": {"initial_learning_rate": 0.1, "gamma": 0.5, "milestones": "10"}},
     "milestones"),
    ({"NoSuchLR": {"learning_rate": 0.1}}, "nosuchlr"),
])
def test_a_scheduler_config_is_checked_against_the_signature(trainer_config, entry, error):
    with pytest.raises(pydantic.ValidationError, match=error):
        trainer_config.model_validate({"optimizer": {"SGD": {"lr": 0.1}},
                                       "schedulers": [entry]})


# ---- sparsity ---------------------------------------------------------------------------
def test_the_sparsity_algorithms_of_cstorch_exist():
    names = {cls.__name__ for cls in ALGORITHMS if not inspect.isabstract(cls)}
    assert {"Static", "GMP", "SET", "RigL", "Group"} <= names
    assert inspect.isabstract(cstorch.sparse.DynamicSparsityAlgorithm)
    assert parameters(cstorch.sparse.Static)["sparsity"].annotation == Optional[float]
    assert list(parameters(cstorch.sparse.RigL))[:3] == [
        "drop_fraction", "balance_in_groups", "balance_out_groups"]


@needs_torch
def test_a_config_without_sparsity_validates(trainer_config):
    assert trainer_config.model_validate({"optimizer": {"SGD": {"lr": 0.1}}}).sparsity is None


@needs_torch
def test_a_sparsity_config_validates_and_is_refused_when_built(trainer_config):
    config = trainer_config.model_validate({
        "optimizer": {"SGD": {"lr": 0.1}},
        "sparsity": [
            {"sparsity": 0.75, "init_method": "random", "param_filter": ["*.weight"]},
            {"sparsity": 0.75, "algorithm": "rigl", "update": {"freq": 100, "stop": 3584},
             "drop_fraction": {"type": "cosine", "init": 0.3, "half_period": 3584}}]})
    assert [type(c).target for c in config.sparsity] == [cstorch.sparse.Static,
                                                         cstorch.sparse.RigL]
    for algorithm in config.sparsity:
        with pytest.raises(UnsupportedOpError, match="does not implement weight sparsity"):
            algorithm.build()


@pytest.mark.parametrize("make", [
    lambda: cstorch.sparse.Static(sparsity=0.5),
    lambda: cstorch.sparse.GMP(sparsity={"type": "linear", "init": 0.0, "slope": 0.1}),
    lambda: cstorch.sparse.SET(sparsity=0.9, drop_fraction=0.3),
    lambda: cstorch.sparse.RigL(sparsity=0.9, update={"freq": 10}),
    lambda: cstorch.sparse.Group({"fc*": cstorch.sparse.Static}),
], ids=["Static", "GMP", "SET", "RigL", "Group"])
def test_creating_a_sparsity_algorithm_is_refused(make):
    with pytest.raises(UnsupportedOpError, match=r"cstorch\.sparse\.\w+: cerebrax does not"):
        make()
