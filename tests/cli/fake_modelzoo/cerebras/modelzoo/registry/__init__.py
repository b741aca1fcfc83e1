"""The registry interface of Model Zoo's ``cerebras.modelzoo.registry.registry``:
models by name, each with the data processors it may read."""

from __future__ import annotations

import importlib

# name -> (the model class, its data processor classes), as dotted paths.
_MODELS = {
    "tiny_mlp": ("cerebras.modelzoo.models.tiny.TinyModel",
                 ("cerebras.modelzoo.models.tiny.TinyDataProcessor",)),
    "tiny_mlp_unused": ("cerebras.modelzoo.models.tiny.TinyModel",
                        ("cerebras.modelzoo.models.tiny.TinyDataProcessor",)),
}


def _import(path: str) -> type:
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


class _Registry:
    def get_model_names(self) -> list[str]:
        """The registered model names, sorted."""
        return sorted(_MODELS)

    def get_model_class(self, model_name: str) -> type:
        """The model class registered as ``model_name``."""
        if model_name not in _MODELS:
            raise ValueError(f"Model {model_name} not found in registry.")
        return _import(_MODELS[model_name][0])

    def get_data_processors_map(self, model_name: str) -> dict[str, type]:
        """``{class name: class}`` of the data processors of ``model_name``."""
        classes = [_import(path) for path in _MODELS[model_name][1]]
        return {cls.__name__: cls for cls in classes}


registry = _Registry()
