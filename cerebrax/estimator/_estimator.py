"""``Estimator``: seed 002's train / evaluate / compile workflow on the trace runtime.

``model_fn(features, labels, mode, params)`` describes one step and returns an
:class:`EstimatorSpec`. The Estimator turns it into one ``@cstorch.trace`` step per
mode, feeds it from ``input_fn(params)`` through a ``cstorch.utils.data.DataLoader``
and a ``DataExecutor``, and keeps its checkpoints (``cstorch.save``) in ``model_dir``:
``train`` resumes from the latest one and writes new ones, ``evaluate`` evaluates the
latest one. ``compile`` traces (``validate_only=True``) or compiles the step for the
input's shapes without running it.
"""

from __future__ import annotations

import glob
import inspect
import os
import re
import tempfile
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from .. import _step
from .._filters import is_strict_int
from ..backend import backend as make_backend
from ..backend import current_backend
from ..ckpt import load, save
from ..data import DataExecutor, DataLoader, to_device
from ..errors import ConfigError, StateError
from ..metrics import Metric
from ..trace import TracedStep, backward, write_artifacts
from ._config import RunConfig
from ._input import CheckedDataset, check_input_fn, make_dataset
from ._spec import EstimatorSpec, ModeKeys

__all__ = ["Estimator"]

CHECKPOINT = "checkpoint_{step}.mdl"
_CHECKPOINT_RE = re.compile(r"checkpoint_(\d+)\.mdl$")

MSG_HOOKS_ARGUMENT = """\
Estimator.{method}(hooks=...) is not supported: the Estimator does not support
user-defined hooks, since each step is one compiled program. Fix: read values after a
step with a step closure called from model_fn (cstorch.step_closure), and save state
with the Estimator's checkpoints (RunConfig(save_checkpoints_steps=...))."""

MSG_MODEL_FN = """\
model_fn must take (features, labels, mode, params), got model_fn{sig}.

    def model_fn(features, labels, mode, params):
        loss = loss_fn(model(features), labels)
        return EstimatorSpec(mode, loss=loss, optimizer=optimizer)"""


def _checkpoint_step(path: str) -> int:
    match = _CHECKPOINT_RE.search(os.path.basename(path))
    return int(match.group(1)) if match else -1


class Estimator:
    """Trains and evaluates a model described by ``model_fn`` (seed 002's Estimator).

    Args:
      model_fn: ``model_fn(features, labels, mode, params) -> EstimatorSpec``, written
        with JAX on a ``cstorch.compile``-d model (a ``FunctionalModel``, a flax module,
        or a torch module through the bridge). It runs inside a traced step, once per
        mode, so the model, optimizer and metrics it uses must exist before: create
        them outside (see :class:`EstimatorSpec`).
      model_dir: where checkpoints are written and read; defaults to
        ``config.model_dir``, else a new temporary directory.
      params: the dict passed to ``model_fn`` and ``input_fn``.
      config: a :class:`RunConfig` (or a dict of its parameters).

    Input functions take the single dict ``params`` and return a dataset of
    ``(features, labels)`` batches of one fixed batch size (see
    :mod:`cerebrax.estimator._input` for the rules and their messages).

    Example:
      >>> from cerebrax.estimator import Estimator, EstimatorSpec
      >>> model = cstorch.compile(cstorch.FunctionalModel(
      ...     lambda p, x: x @ p["w"] + p["b"], {"w": jnp.zeros((4, 2)), "b": jnp.zeros(2)}))
      >>> optimizer = cstorch.optim.SGD(model.parameters(), lr=0.5)
      >>> def model_fn(features, labels, mode, params):
      ...     logits = model(features)
      ...     loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
      ...     return EstimatorSpec(mode, loss=loss, optimizer=optimizer)
      >>> def input_fn(params):  # 10 batches: is the first feature positive?
      ...     x = np.random.default_rng(0).normal(size=(10, params["batch_size"], 4))
      ...     return [(xb.astype(np.float32), (xb[:, 0] > 0).astype(np.int32)) for xb in x]
      >>> estimator = Estimator(model_fn, model_dir="run", params={"batch_size": 32})
      >>> estimator.train(input_fn, steps=10).global_step
      10
      >>> estimator.latest_checkpoint()
      '.../run/checkpoint_10.mdl'
      >>> estimator.evaluate(input_fn, steps=10)
      {'loss': 0.256..., 'global_step': 10}
    """

    def __init__(self, model_fn: Callable[..., EstimatorSpec], model_dir: str | None = None,
                 params: Mapping[str, Any] | None = None,
                 config: RunConfig | Mapping[str, Any] | None = None):
        if not callable(model_fn):
            raise ConfigError(f"Estimator(model_fn=...) must be callable, got {model_fn!r}.")
        try:
            inspect.signature(model_fn).bind(None, None, None, None)
        except TypeError:
            raise ConfigError(MSG_MODEL_FN.format(sig=inspect.signature(model_fn))) from None
        except ValueError:
            pass  # no signature to check (a builtin)
        if params is not None and not isinstance(params, Mapping):
            raise ConfigError(
                f"Estimator(params=...) must be a dict, got {type(params).__name__}."
            )
        self.config = RunConfig.create(config)
        if model_dir and self.config.model_dir and (
                os.path.abspath(model_dir) != os.path.abspath(self.config.model_dir)):
            raise ConfigError(
                f"Estimator got model_dir={model_dir!r} and config.model_dir="
                f"{self.config.model_dir!r}; give one directory (or the same in both)."
            )
        self.model_dir = os.path.abspath(
            model_dir or self.config.model_dir or tempfile.mkdtemp(prefix="cerebrax_estimator_"))
        os.makedirs(self.model_dir, exist_ok=True)
        self.model_fn = model_fn
        self.params = dict(params or {})
        self._steps: dict[str, TracedStep] = {}
        self._model: Any = None
        self._optimizer: Any = None
        self._scheduler: Any = None
        self._metrics: dict[str, Any] = {}
        self._global_step = 0
        self._synced_step: int | None = None  # the checkpoint the state in memory equals
        self._restored: set[str] = set()  # its parts loaded into (or saved from) memory

    # ---- the public workflow ---------------------------------------------------------------
    @property
    def global_step(self) -> int:
        """The number of training steps run so far (restored from ``model_dir``)."""
        return self._global_step

    def latest_checkpoint(self) -> str | None:
        """The path of the newest checkpoint in ``model_dir``, or None."""
        paths = glob.glob(os.path.join(self.model_dir, "checkpoint_*.mdl"))
        paths = [p for p in paths if _checkpoint_step(p) >= 0]
        return max(paths, key=_checkpoint_step) if paths else None

    def train(self, input_fn: Callable[..., Any], steps: int | None = None, *,
              max_steps: int | None = None, hooks: Any = None) -> Estimator:
        """Trains for ``steps`` more steps (or up to global step ``max_steps``).

        Resumes from the latest checkpoint in ``model_dir`` and saves checkpoints there
        (every ``config.save_checkpoints_steps`` steps and at the end).

        Returns:
          The Estimator.
        """
        if hooks:
            raise ConfigError(MSG_HOOKS_ARGUMENT.format(method="train"))
        _check_steps("steps", steps)
        _check_steps("max_steps", max_steps)
        if steps is None and max_steps is None:
            raise ConfigError(
                "Estimator.train() needs the number of steps to train for: pass steps= (more "
                "steps) or max_steps= (the global step to reach). The dataset must keep "
                "providing batches until they are done (repeat it)."
            )
        if steps is not None and max_steps is not None:
            raise ConfigError("Estimator.train() takes steps or max_steps, not both.")
        check_input_fn(input_fn)
        self._restore()  # the global step of the latest checkpoint, if not yet known
        num_steps = steps if steps is not None else max_steps - self._global_step
        if num_steps <= 0:
            return self
        loader, _ = self._loader(input_fn, num_steps)
        executor = DataExecutor(loader, num_steps=num_steps,
                                checkpoint_steps=self.config.save_checkpoints_steps or 0)
        save_closure = _step.checkpoint_closure(self._save)
        for features, labels in executor:
            step = self._step(ModeKeys.TRAIN, features, labels)
            self._model.train()
            step(features, labels)
            self._global_step += 1
            save_closure(self._global_step)
        return self

    def evaluate(self, input_fn: Callable[..., Any], steps: int | None = None, *,
                 hooks: Any = None) -> dict[str, Any]:
        """Evaluates the latest checkpoint on ``steps`` batches (None: one pass).

        Returns:
          ``{"loss": mean loss, "global_step": ..., **eval_metric_ops}``: a metric object
          reports its value after the steps, a scalar array its mean over them.
        """
        if hooks:
            raise ConfigError(MSG_HOOKS_ARGUMENT.format(method="evaluate"))
        _check_steps("steps", steps)
        check_input_fn(input_fn)
        loader, dataset = self._loader(input_fn, steps)
        if steps is None and not dataset.has_length():
            raise ConfigError(
                "Estimator.evaluate(steps=None) evaluates one pass over the dataset, which "
                "needs a dataset with a length (a torch DataLoader, a list); this one has "
                "none (a generator). Pass steps=..."
            )
        self._restore()
        losses, values = [], []
        for features, labels in DataExecutor(loader, num_steps=steps):
            step = self._step(ModeKeys.EVAL, features, labels)
            if not values and not losses:
                for metric in self._metrics.values():
                    if isinstance(metric, Metric):
                        metric.reset()
            self._model.eval()
            loss, arrays = step(features, labels)
            losses.append(loss)
            values.append(arrays)
        # Host sync point: the results wait for the last step.
        results: dict[str, Any] = {"loss": float(np.mean([np.asarray(x) for x in losses]))}
        for name, metric in self._metrics.items():
            if isinstance(metric, Metric):
                results[name] = float(metric)
            else:
                results[name] = float(np.mean([np.asarray(v[name]) for v in values]))
        results["global_step"] = self._global_step
        return results

    def compile(self, input_fn: Callable[..., Any], validate_only: bool = False, *,
                mode: str = ModeKeys.TRAIN) -> str | None:
        """Traces (``validate_only=True``) or compiles the ``mode`` step; runs nothing.

        The step is built for the shapes of the input function's first batch, which is
        checked by the same rules as in ``train``. Compiling writes the program's HLO text
        and memory analysis under ``model_dir/compile``.

        Returns:
          The directory of the compile artifacts, or None with ``validate_only``.
        """
        if mode not in (ModeKeys.TRAIN, ModeKeys.EVAL):
            raise ConfigError(f"Estimator.compile(mode=...) must be 'train' or 'eval', got "
                              f"{mode!r}.")
        check_input_fn(input_fn)
        dataset = make_dataset(input_fn, self.params, 1)
        first = next(iter(dataset), None)
        if first is None:
            raise ConfigError("The input function's dataset is empty: it has no batch to "
                              "compile for.")
        backend = current_backend(raise_exception=False) or make_backend("CPU")
        features, labels = to_device(tuple(first), backend.jax_device)
        step = self._step(mode, features, labels)
        self._model.train(mode == ModeKeys.TRAIN)
        start = time.perf_counter()
        lowered = step.lower(features, labels)  # traces model_fn; checks shapes and rules
        if validate_only:
            print(f"[cerebrax] validated the Estimator's {mode} step: traced, nothing "
                  "compiled or run.")
            return None
        compiled = lowered.compile()
        directory = os.path.join(self.model_dir, "compile")
        write_artifacts(directory, step.__name__, lowered, compiled,
                        time.perf_counter() - start,
                        what=f"the Estimator's step `{step.__name__}`")
        return directory

    # ---- steps ---------------------------------------------------------------------------
    def _loader(self, input_fn: Callable[..., Any], steps: int | None
                ) -> tuple[DataLoader, CheckedDataset]:
        """A DataLoader over the checked dataset of ``input_fn`` (one per streaming worker)."""
        datasets: list[CheckedDataset] = []

        def checked_input_fn() -> CheckedDataset:
            datasets.append(make_dataset(input_fn, self.params, steps))
            return datasets[-1]

        loader = DataLoader(checked_input_fn)
        loader.source  # noqa: B018 - calls input_fn now: its return value is checked here
        return loader, datasets[0]

    def _step(self, mode: str, features: Any, labels: Any) -> TracedStep:
        """The traced step of ``mode``; its first use finds the model_fn's objects."""
        step = self._steps.get(mode)
        if step is not None:
            return step
        if mode == ModeKeys.TRAIN:
            def estimator_train_step(features: Any, labels: Any) -> Any:
                return self._train_step(features, labels)

            fn = estimator_train_step
        else:
            def estimator_eval_step(features: Any, labels: Any) -> Any:
                return self._eval_step(features, labels)

            fn = estimator_eval_step
        if self._model is None or (mode == ModeKeys.TRAIN and self._optimizer is None):
            # One trace, compiling nothing, shows which model (and optimizer) model_fn
            # uses: the mode is set and the checkpoint restored before the real step.
            TracedStep(fn).lower(features, labels)
        self._model.train(mode == ModeKeys.TRAIN)
        self._steps[mode] = step = TracedStep(fn)
        self._restore()
        return step

    def _call_model_fn(self, features: Any, labels: Any, mode: str) -> EstimatorSpec:
        spec = self.model_fn(features, labels, mode, self.params)
        if not isinstance(spec, EstimatorSpec):
            raise ConfigError(
                f"model_fn must return a cerebrax.estimator.EstimatorSpec, got "
                f"{type(spec).__name__}."
            )
        spec.check(mode)
        models = _step.active_context().models_used
        if not models:
            raise StateError(
                "model_fn used no compiled model. Call a model prepared with "
                "cstorch.compile(...) inside model_fn."
            )
        self._model = models[0]
        if mode == ModeKeys.TRAIN:
            self._optimizer, self._scheduler = spec.optimizer, spec.lr_scheduler
        else:
            self._metrics = dict(spec.eval_metric_ops or {})
        return spec

    def _train_step(self, features: Any, labels: Any) -> Any:
        spec = self._call_model_fn(features, labels, ModeKeys.TRAIN)
        backward(spec.loss)
        spec.optimizer.step()
        spec.optimizer.zero_grad()
        if spec.lr_scheduler is not None:
            spec.lr_scheduler.step()
        return spec.loss

    def _eval_step(self, features: Any, labels: Any) -> tuple[Any, dict]:
        spec = self._call_model_fn(features, labels, ModeKeys.EVAL)
        arrays = {name: metric for name, metric in self._metrics.items()
                  if not isinstance(metric, Metric)}
        return spec.loss, arrays

    # ---- checkpoints ---------------------------------------------------------------------
    def _parts(self) -> dict[str, Any]:
        parts = {"model": self._model, "optimizer": self._optimizer,
                 "lr_scheduler": self._scheduler}
        return {name: obj for name, obj in parts.items() if obj is not None}

    def _restore(self) -> None:
        """Loads the latest checkpoint's parts that the state in memory does not hold yet."""
        path = self.latest_checkpoint()
        if path is None:
            return
        step = _checkpoint_step(path)
        if step != self._synced_step:
            self._synced_step, self._restored = step, set()
        missing = [name for name in self._parts() if name not in self._restored]
        state = load(path) if missing or self._global_step != step else None
        if state is None:
            return
        for name in missing:
            if name in state:
                self._parts()[name].load_state_dict(state[name])
                self._restored.add(name)
        self._global_step = int(state["global_step"])

    def _save(self, global_step: int) -> None:
        """Writes a checkpoint of the step just run (a checkpoint closure's body)."""
        parts = self._parts()
        state = {name: obj.state_dict() for name, obj in parts.items()}
        state["global_step"] = global_step
        save(state, os.path.join(self.model_dir, CHECKPOINT.format(step=global_step)))
        self._synced_step, self._restored = global_step, set(parts)
        keep = self.config.keep_checkpoint_max
        if keep:
            paths = sorted(glob.glob(os.path.join(self.model_dir, "checkpoint_*.mdl")),
                           key=_checkpoint_step)
            for old in paths[:-keep]:
                os.remove(old)


def _check_steps(name: str, value: Any) -> None:
    if value is not None and (not is_strict_int(value) or value < 1):
        raise ConfigError(f"{name} must be a positive integer or None, got {value!r}.")
