"""The config interface of Model Zoo's ``cerebras.modelzoo.config``: pydantic config
classes that refuse unknown keys, and ``create_config_class(cls)``, the config class
of a model or data processor class, made from its ``__init__`` signature."""

from __future__ import annotations

import inspect
import typing
from typing import Any

from pydantic import BaseModel, ConfigDict, create_model, model_validator


class BaseConfig(BaseModel):
    """A frozen config that refuses keys it does not declare."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)


def create_config_class(cls: type) -> type[BaseConfig]:
    """A config class whose fields are the arguments of ``cls.__init__``.

    Where ``__init__`` takes one config object (``Model(config: ModelConfig)``) the
    config class also reads that object's keys at its top level. An instance builds
    ``cls`` when called.
    """
    hints = typing.get_type_hints(cls.__init__)
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    fields = {
        p.name: (hints.get(p.name, Any), ... if p.default is p.empty else p.default)
        for p in params
    }
    single = next(iter(fields)) if len(fields) == 1 else None
    wraps = single is not None and inspect.isclass(fields[single][0]) and issubclass(
        fields[single][0], BaseConfig)

    class _Config(BaseConfig):
        @model_validator(mode="before")
        @classmethod
        def _wrap(cls_, data: Any) -> Any:
            if wraps and isinstance(data, dict) and set(data) != {single}:
                return {single: data}
            return data

        @classmethod
        def get_orig_class(cls_) -> type:
            return cls

        def get_orig_class_args(self) -> dict[str, Any]:
            return {name: getattr(self, name) for name in type(self).model_fields}

        def __call__(self) -> Any:
            return cls(**self.get_orig_class_args())

    return create_model(f"{cls.__name__}Config", __base__=_Config, **fields)
