"""``RunConfig``: the Estimator's run settings, and the ones it does not support."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .._filters import is_strict_int
from ..errors import ConfigError

__all__ = ["RunConfig"]

# Seed 002, "Parameters not supported" (TensorFlow spells the first save_checkpoints_secs).
UNSUPPORTED = (
    "save_checkpoint_secs", "save_checkpoints_secs", "train_distribute", "device_fn",
    "protocol", "eval_distribute", "experimental_distribute",
    "experimental_max_worker_delay_secs",
)

MSG_UNSUPPORTED = """\
The Estimator does not support the config parameter `{name}` (given {value!r}).
{reason}
Unsupported parameters: {names}."""

REASONS = {
    "save_checkpoint_secs": "Checkpoints are saved by step: set save_checkpoints_steps.",
    "save_checkpoints_secs": "Checkpoints are saved by step: set save_checkpoints_steps.",
}
DEFAULT_REASON = ("cerebrax places the computation itself (the backend and its "
                  "ClusterConfig); remove it from the config.")


class RunConfig:
    """How an Estimator runs: where it saves checkpoints, and how often.

    Args:
      model_dir: where checkpoints go (the Estimator's ``model_dir`` argument may
        repeat it; two different directories are an error).
      save_checkpoints_steps: ``k`` saves a checkpoint every ``k`` training steps and at
        the end of every ``train`` call; None saves at the end only.
      keep_checkpoint_max: how many recent checkpoints to keep (None or 0 keeps all).
      **unsupported: the parameters seed 002 lists as unsupported
        (``save_checkpoints_secs``, ``train_distribute``, ``device_fn``, ``protocol``,
        ``eval_distribute``, ``experimental_distribute``,
        ``experimental_max_worker_delay_secs``) are rejected with a message; any other
        name is unknown.
    """

    def __init__(self, model_dir: str | None = None, save_checkpoints_steps: int | None = None,
                 keep_checkpoint_max: int | None = 5, **unsupported: Any):
        for name, value in unsupported.items():
            if name.lower() in UNSUPPORTED:
                raise ConfigError(MSG_UNSUPPORTED.format(
                    name=name, value=value, reason=REASONS.get(name, DEFAULT_REASON),
                    names=", ".join(UNSUPPORTED)))
        if unsupported:
            raise ConfigError(
                f"RunConfig got unknown parameter(s) {sorted(unsupported)}; supported: "
                "model_dir, save_checkpoints_steps, keep_checkpoint_max."
            )
        for name, value in (("save_checkpoints_steps", save_checkpoints_steps),
                            ("keep_checkpoint_max", keep_checkpoint_max)):
            if value is not None and (not is_strict_int(value) or value < 0):
                raise ConfigError(
                    f"RunConfig({name}=...) must be a non-negative integer or None, got "
                    f"{value!r}."
                )
        self.model_dir = model_dir
        self.save_checkpoints_steps = save_checkpoints_steps
        self.keep_checkpoint_max = keep_checkpoint_max

    @classmethod
    def create(cls, config: RunConfig | Mapping[str, Any] | None) -> RunConfig:
        """The config from a :class:`RunConfig`, a dict of its parameters, or None."""
        if config is None:
            return cls()
        if isinstance(config, RunConfig):
            return config
        if not isinstance(config, Mapping):
            raise ConfigError(
                f"Estimator(config=...) expects a cerebrax.estimator.RunConfig or a dict, "
                f"got {type(config).__name__}."
            )
        return cls(**config)

    def __repr__(self) -> str:
        return (f"RunConfig(model_dir={self.model_dir!r}, save_checkpoints_steps="
                f"{self.save_checkpoints_steps!r}, keep_checkpoint_max="
                f"{self.keep_checkpoint_max!r})")
