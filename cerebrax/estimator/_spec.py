"""``EstimatorSpec`` and ``ModeKeys``: what a ``model_fn`` returns, and for which mode."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from ..backend import current_backend
from ..errors import ConfigError
from ..metrics import Metric
from ..optim import Optimizer

__all__ = ["EstimatorSpec", "ModeKeys"]


class ModeKeys:
    """The ``mode`` argument of ``model_fn`` (TensorFlow's values)."""

    TRAIN = "train"
    EVAL = "eval"


MSG_HOOKS = """\
Detected unsupported {field} in the EstimatorSpec returned by model_fn. The Estimator
does not support user-defined hooks: each step is one compiled program, with no point
to hook into between its operations.
Fix: to read values after a step, call a step closure from model_fn:

    @cstorch.step_closure
    def log_loss(loss):
        print(float(loss))

    def model_fn(features, labels, mode, params):
        loss = ...
        log_loss(loss)
        return EstimatorSpec(mode, loss=loss, optimizer=optimizer)"""

MSG_EVAL_METRICS_ON_CSX = """\
Detected unsupported eval_metric_ops in CS system training run. On the CSX backend the
training step cannot compute evaluation metrics. Fix: return eval_metric_ops only when
mode == ModeKeys.EVAL (Estimator.evaluate computes them), or train on CPU or GPU."""


@dataclasses.dataclass
class EstimatorSpec:
    """What ``model_fn(features, labels, mode, params)`` returns.

    ``model_fn`` runs inside the Estimator's traced step (once, when the step is
    compiled), so ``features`` and ``labels`` are traced arrays. The model, the
    optimizer and the metrics it uses must exist before the first step: create them
    outside ``model_fn`` (a traced step is a static graph over existing state).

    Attributes:
      mode: the ``mode`` given to ``model_fn`` (a :class:`ModeKeys` value).
      loss: the scalar loss of the batch (required). Training differentiates it;
        evaluation reports its mean over the steps.
      optimizer: TRAIN: the ``cstorch.optim`` optimizer that the Estimator steps after
        marking the loss (TensorFlow's ``train_op = optimizer.minimize(loss)``).
      lr_scheduler: TRAIN: an optional scheduler stepped after the optimizer.
      eval_metric_ops: EVAL: ``{name: metric}``, where a metric is a
        ``cstorch.metrics`` metric that ``model_fn`` updated (its final value is
        reported) or a scalar array (its mean over the steps is reported). In a TRAIN
        spec they are not computed, and on the CSX backend they are an error.
      predictions: not used by ``train`` and ``evaluate``; kept for model_fns that
        return them.
      training_hooks, evaluation_hooks, training_chief_hooks, prediction_hooks:
        unsupported; anything but empty is an error naming step closures instead.
    """

    mode: str
    loss: Any = None
    optimizer: Optimizer | None = None
    lr_scheduler: Any = None
    eval_metric_ops: Mapping[str, Any] | None = None
    predictions: Any = None
    training_hooks: Sequence[Any] = ()
    evaluation_hooks: Sequence[Any] = ()
    training_chief_hooks: Sequence[Any] = ()
    prediction_hooks: Sequence[Any] = ()

    def check(self, mode: str) -> None:
        """Applies the Estimator's rules to this spec for a step in ``mode``."""
        for field in ("training_hooks", "evaluation_hooks", "training_chief_hooks",
                      "prediction_hooks"):
            if getattr(self, field):
                raise ConfigError(MSG_HOOKS.format(field=field))
        if self.mode != mode:
            raise ConfigError(
                f"model_fn returned an EstimatorSpec for mode {self.mode!r} when called "
                f"with mode {mode!r}. Pass the mode through: EstimatorSpec(mode, ...)."
            )
        if self.loss is None:
            raise ConfigError(f"model_fn returned an EstimatorSpec without a loss in mode "
                              f"{mode!r}. Set EstimatorSpec(mode, loss=...).")
        if mode == ModeKeys.TRAIN:
            if not isinstance(self.optimizer, Optimizer):
                raise ConfigError(
                    "model_fn returned a TRAIN EstimatorSpec whose optimizer is "
                    f"{type(self.optimizer).__name__}; set optimizer= to the "
                    "cstorch.optim optimizer over the model's parameters."
                )
            backend = current_backend(raise_exception=False)
            if self.eval_metric_ops and backend is not None and backend.is_csx:
                raise ConfigError(MSG_EVAL_METRICS_ON_CSX)
        for name, metric in (self.eval_metric_ops or {}).items():
            if not isinstance(name, str) or name in ("loss", "global_step"):
                raise ConfigError(
                    f"eval_metric_ops key {name!r} must be a string other than 'loss' and "
                    "'global_step' (evaluate() reports those itself)."
                )
            if not isinstance(metric, Metric) and not hasattr(metric, "shape"):
                raise ConfigError(
                    f"eval_metric_ops[{name!r}] must be a cstorch.metrics metric or a "
                    f"scalar array, got {type(metric).__name__}."
                )
