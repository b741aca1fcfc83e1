"""The four commands: ``fit``, ``eval``, ``validate`` and ``compile``."""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
import time
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .. import metrics as cs_metrics
from .._step import as_jax, checkpoint_closure, drain, step_closure
from ..amp import optimizer_step
from ..ckpt import load, save, wait
from ..data import DataExecutor
from ..data._executor import batch_placement
from ..data._progress import write
from ..summaries import SummaryWriter
from ..errors import CerebraxError, CheckpointError, ConfigError, StateError
from ..trace import trace, write_artifacts
from . import _build, _runs
from ._config import InputSpec, JobConfig

__all__ = ["run_compile", "run_eval", "run_fit"]

MSG_NO_MODEL = """\
{path!r} holds no model state: its top-level keys are {keys}. The command loads
checkpoints written by `cerebrax fit`, or by a loop that saves
{{"model": model.state_dict(), "optimizer": optimizer.state_dict(), ...}}."""

MSG_OTHER_MODEL = """\
{path!r} was written by another model than this config builds: {error}
Run with the model section it was trained with (e.g. the same model.hidden), or
train from scratch without --checkpoint."""

MSG_OTHER_OPTIMIZER = """\
{path!r} holds {part} state that does not fit this config's: {error}
Run with the optimizer section it was trained with, or train from scratch without
--checkpoint."""


def _fmt(value: Any) -> str:
    """The shortest text that reads back as the same float32 (or float16) value."""
    return str(np.asarray(value)[()])


# ---- steps -------------------------------------------------------------------------------
# A model with a loss function takes a batch's (inputs, targets); a Model Zoo model
# (loss function None) takes the whole batch and returns its loss.
def _args(job: JobConfig, batch: Any) -> tuple:
    """The step's arguments for one batch."""
    return (batch,) if job.model_name is not None else tuple(batch)


def _check_batch(job: JobConfig, batch: Any, spec: InputSpec) -> None:
    if job.model_name is None:  # a Model Zoo model takes any batch its data gives
        _build.check_batch(batch, spec)


def _training_step(job: JobConfig, model: Any, loss_fn: Any, pieces: tuple):
    """The step returns ``(loss, learning rate)``, and the loss scale when scaling is on."""
    optimizer, scheduler, scaler = pieces

    def update(loss):
        optimizer_step(
            loss,
            optimizer,
            scaler,
            max_gradient_norm=job.max_gradient_norm,
            max_gradient_value=job.max_gradient_value,
        )
        lr = jnp.asarray(optimizer.param_groups[0]["lr"], jnp.float32)  # this step's rate
        if scheduler is not None:
            scheduler.step()
        if scaler is None:
            return loss, lr
        return loss, lr, scaler.get_scale()

    if loss_fn is None:

        @trace
        def training_step(batch):
            return update(model(batch))

        return training_step

    @trace
    def training_step(inputs, targets):
        return update(loss_fn(model(inputs), targets))

    return training_step


def _evaluation_step(model: Any, loss_fn: Any, metrics: list, mean_loss: Any, *,
                     returns: bool = True):
    """With ``returns`` the step returns the running mean loss, so the progress bar shows
    what the final ``eval loss`` line prints (not the last batch's loss). A Model Zoo
    model (``loss_fn`` None) updates its own metrics in its forward."""

    if loss_fn is None:

        @trace
        def evaluation_step(batch):
            mean_loss.update(model(batch))
            return mean_loss.compute() if returns else None

        return evaluation_step

    @trace
    def evaluation_step(inputs, targets):
        outputs = model(inputs)
        loss = loss_fn(outputs, targets)
        mean_loss.update(loss)
        outputs, targets = as_jax((outputs, targets))
        for metric, reads in metrics:
            if reads == "predictions":
                metric.update(labels=targets, predictions=jnp.argmax(outputs, axis=-1))
            else:  # perplexity: the batch's summed loss over its tokens
                metric.update(labels=targets, loss=as_jax(loss) * jnp.size(targets))
        return mean_loss.compute() if returns else None

    return evaluation_step


def _metric_values(metrics: list) -> dict[str, float]:
    """The metrics' values (host sync points: each waits for the last step). A model's
    own metric that its forward did not update is left out, with a note (as Model Zoo's
    ModelEvalMetrics callback does)."""
    values = {}
    for metric, reads in metrics:
        if reads is None and metric.num_updates == 0:
            write(f"[cerebrax] the model's metric {metric.name!r} was not updated by the "
                  "evaluation steps: not reported")
            continue
        values[metric.name] = float(metric)
    return values


class _Validation:
    """Validation during ``fit``: ``eval_steps`` batches of the eval data through one
    compiled evaluation step, every ``eval_frequency`` steps and after the last step.

    The loss and the metrics are printed and written to the run's TensorBoard events as
    ``eval/loss`` and ``eval/<metric>``. The model is in eval mode while it runs.
    """

    def __init__(self, job: JobConfig, model: Any, loss_fn: Any, writer: Any):
        self.job, self.model, self.writer, self.spec = job, model, writer, job.eval_input
        self.metrics = _build.build_metrics(job, model)
        self.mean_loss = cs_metrics.MeanMetric("loss")
        self.step_fn = _evaluation_step(model, loss_fn, self.metrics, self.mean_loss,
                                        returns=False)
        self.loader = _build.build_loader(self.spec, num_steps=self.spec.num_steps,
                                          seed=job.run.seed)
        self.num_steps = self.loader.num_steps

    def __call__(self, step: int) -> None:
        # The closures of the steps so far (this step's checkpoint among them) read the
        # state of their step: run them before the evaluation steps dispatch.
        drain()
        self.model.eval()
        for metric in [self.mean_loss, *(m for m, _ in self.metrics)]:
            metric.reset()
        batches = self.loader.batches(batch_placement())
        try:
            for i in range(self.num_steps):
                batch = next(batches)
                if not i:
                    _check_batch(self.job, batch, self.spec)
                self.step_fn(*_args(self.job, batch))
        finally:
            batches.close()
            self.model.train()
        values = {"loss": float(self.mean_loss)}  # host sync: waits for the last batch
        values.update(_metric_values(self.metrics))
        write(f"step {step:6d}  eval " + "  ".join(f"{k} {v:.6f}" for k, v in values.items())
              + f"  ({self.num_steps} steps)")
        for name, value in values.items():
            self.writer.add_scalar(f"eval/{name}", value, step)
        self.writer.flush()


class _Saver:
    """The command's checkpoints: written in the background, one at a time.

    ``save`` copies the state to host memory and returns; the H5 file is written and
    renamed into place in a background thread (atomic, as every save). :meth:`poll`
    (after every step) finishes a written save without waiting; the next save and the
    end of the run wait for it. Finishing prints ``saved PATH``, records the run's
    config (at the first save) and applies the retention (``keep_last_n``), so
    retention only ever counts complete files.
    """

    def __init__(self, run: Any, config: dict):
        self.run, self.config = run, config
        self.pending: tuple[Any, str] | None = None

    def save(self, state_dict: dict, step: int) -> None:
        self.finish()
        path = os.path.join(self.run.model_dir, f"checkpoint_{step}.mdl")
        self.pending = (save(state_dict, path, background=True), path)

    def poll(self) -> None:
        """Finishes the pending save if its file is written (never blocks)."""
        if self.pending is not None and self.pending[0].done():
            self.finish()

    def finish(self) -> None:
        """Waits for the pending save; raises CheckpointError if it failed."""
        if self.pending is None:
            return
        (handle, path), self.pending = self.pending, None
        handle.wait()
        write(f"saved {path}")
        _runs.write_record(self.run.model_dir, self.config)  # once: at the first save
        run = self.run
        for old in _runs.prune(run.model_dir, keep_last_n=run.keep_last_n,
                               keep_every_n_steps=run.keep_every_n_steps, written=path):
            write(f"removed {old} (keep_last_n {run.keep_last_n})")


# ---- checkpoints -------------------------------------------------------------------------
def latest_checkpoint(model_dir: str) -> str | None:
    found = _runs.checkpoints(model_dir)
    return found[-1][1] if found else None


def make_model_dir(path: str) -> None:
    """Creates ``model_dir`` and writes a file into it: an unwritable directory fails
    now, not at the first checkpoint."""
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as e:
        raise CheckpointError(
            f"runconfig.model_dir {path!r} is not a writable directory ({e.strerror})."
        ) from e


def interrupted(model_dir: str) -> str:
    """What Ctrl-C during ``fit`` prints: where the last complete checkpoint is.

    A checkpoint being written in the background is finished first (a failed one is
    not listed: the message names the last complete one)."""
    try:
        wait()
    except CheckpointError:
        pass
    path = latest_checkpoint(model_dir)  # saves are atomic: a listed file is complete
    if path is None:
        return f"interrupted before the first checkpoint: none in {model_dir!r} yet."
    return (
        f"interrupted. The last checkpoint is {path}: to resume, run the same command "
        f"again (it resumes from the newest checkpoint of model_dir), or pass "
        f"--checkpoint {path}"
    )


def _load_model(model: Any, path: str) -> Mapping[str, Any]:
    """The checkpoint at ``path``, its ``model`` entry loaded into ``model``."""
    try:
        state = load(path)
    except CheckpointError as e:
        raise CheckpointError(
            f"{e} Pass a checkpoint_<step>.mdl that `cerebrax fit` wrote with --checkpoint."
        ) from e.__cause__
    if not isinstance(state, Mapping) or "model" not in state:
        keys = sorted(state) if isinstance(state, Mapping) else f"none (a {type(state).__name__})"
        raise CheckpointError(MSG_NO_MODEL.format(path=path, keys=keys))
    try:
        model.load_state_dict(state["model"])
    except StateError as e:
        error = str(e).removesuffix(" Pass strict=False to load the keys that match.")
        raise CheckpointError(MSG_OTHER_MODEL.format(path=path, error=error)) from None
    return state


def _restore(state: Mapping[str, Any], pieces: tuple, path: str) -> int:
    optimizer, scheduler, scaler = pieces
    part = "optimizer"
    try:
        if "optimizer" in state:
            optimizer.load_state_dict(state["optimizer"])
        part = "learning rate scheduler"
        schedulers = state.get("schedulers") or (
            [state["lr_scheduler"]] if "lr_scheduler" in state else []
        )
        if scheduler is not None and schedulers:
            scheduler.load_state_dict(schedulers[0])
        part = "loss scaling"
        if scaler is not None and state.get("grad_scaler"):
            scaler.load_state_dict(state["grad_scaler"])
    except (CerebraxError, KeyError, ValueError) as e:
        raise CheckpointError(
            MSG_OTHER_OPTIMIZER.format(path=path, part=part, error=e)
        ) from None
    step = state.get("global_step", 0)
    step = int(np.asarray(step))
    write(f"[cerebrax] resumed from {path} at step {step}")
    return step


# ---- fit ---------------------------------------------------------------------------------
def run_fit(
    job: JobConfig, counter: _build.CacheCounter, checkpoint: str | None, *, config: dict
) -> None:
    """Trains; resumes from ``checkpoint`` when given. ``config`` (the YAML mapping after
    overrides) is recorded in ``model_dir`` with the run's first checkpoint."""
    job = _build.resolve_num_steps(job)  # num_epochs -> num_steps
    run = job.run
    os.makedirs(run.model_dir, exist_ok=True)
    backend = _build.build_backend(job)
    model, loss_fn = _build.build_model(job, backend)
    pieces = _build.build_optimizer(job, model)
    optimizer, scheduler, scaler = pieces
    step_fn = _training_step(job, model, loss_fn, pieces)

    start, state = 0, None
    if checkpoint is not None:
        state = _load_model(model, checkpoint)
        start = _restore(state, pieces, checkpoint)
    remaining = run.num_steps - start
    if remaining < 1:
        raise ConfigError(
            f"the checkpoint is at step {start}, and runconfig.num_steps is {run.num_steps}: "
            "nothing is left to train. Raise runconfig.num_steps to train further, or "
            "pass --overwrite to start over."
        )
    # Resume the data where the checkpoint left it: from the DataLoader's own state, or,
    # for a checkpoint without one, by skipping the batches its steps consumed (such a
    # run then saves no loader state either, so its checkpoints resume the same way).
    data_state = state.get("dataloader") if state is not None else None
    skip = start if data_state is None else 0
    loader = _build.build_loader(
        job.train_input, num_steps=remaining, skip=skip, seed=run.seed
    )
    if data_state is not None:
        loader.load_state_dict(data_state)

    every = run.checkpoint_steps
    # TensorBoard events in model_dir: loss, learning rate, loss scale, steps/s, the
    # validation's values and the model's own summarize_scalar / summarize_tensor.
    writer = SummaryWriter(run.model_dir, base_step=start + 1)
    executor = DataExecutor(
        loader,
        num_steps=remaining,
        # Global checkpoint steps k, 2k, ... are local steps of the resumed run only when
        # the executor's cadence divides both k and the starting step.
        checkpoint_steps=math.gcd(every, start) if every else 0,
        activation_steps=math.gcd(run.log_steps, start),
        writer=writer,
        progress_bar="auto",
    )
    validate = None
    if run.eval_frequency is not None:
        validate = _Validation(job, model, loss_fn, writer)
    rate = _Rate()

    @step_closure
    def log_step(outputs, step):
        if step % run.log_steps == 0 or step == run.num_steps:
            loss, lr = outputs[0], outputs[1]
            write(f"step {step:6d}  loss {_fmt(loss)}")
            writer.add_scalar("loss", float(loss), step)
            writer.add_scalar("lr", float(lr), step)
            if len(outputs) > 2:
                writer.add_scalar("loss_scale", float(outputs[2]), step)
            steps_per_sec = rate(step)
            if steps_per_sec is not None:
                writer.add_scalar("steps_per_sec", steps_per_sec, step)

    @checkpoint_closure
    def save_checkpoint(step):
        if step == run.num_steps or (every and step % every == 0):
            write_checkpoint(step)

    saver = _Saver(run, config)

    def write_checkpoint(step):
        state_dict = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
        if scheduler is not None:
            state_dict["schedulers"] = [scheduler.state_dict()]
        if scaler is not None:
            state_dict["grad_scaler"] = scaler.state_dict()
        if not skip:
            state_dict["dataloader"] = loader.state_dict()
        state_dict["global_step"] = step
        saver.save(state_dict, step)

    try:
        if run.save_initial_checkpoint and start == 0:
            write_checkpoint(0)  # the initial weights, before the first step
        model.train()
        # Closed explicitly on any exit: on Ctrl-C the executor's cleanup (streaming
        # threads stopped, queued closures run: a pending checkpoint is written) runs
        # now, before the message names the last checkpoint, not when the traceback is
        # freed (at interpreter exit, where it could hang on its threads).
        with contextlib.closing(iter(executor)) as batches:
            for batch in batches:
                step = start + executor.user_iteration
                if executor.is_initial_step:
                    _check_batch(job, batch, job.train_input)
                    timer = _FirstStep(counter)
                outputs = step_fn(*_args(job, batch))
                if executor.is_initial_step:
                    timer.report(outputs[0])
                log_step(outputs, step)
                save_checkpoint(step)
                saver.poll()  # "saved PATH" once the background write is done
                if validate is not None and (step % run.eval_frequency == 0
                                             or step == run.num_steps):
                    validate(step)
        saver.finish()
    except BaseException:
        with contextlib.suppress(CerebraxError):  # the first error is the one to report
            writer.close()
        raise
    writer.close()


class _Rate:
    """Steps per second between two logged steps (host time of the log closures)."""

    def __init__(self) -> None:
        self.last: tuple[int, float] | None = None

    def __call__(self, step: int) -> float | None:
        now = time.perf_counter()
        last, self.last = self.last, (step, now)
        if last is None or now <= last[1]:
            return None
        return (step - last[0]) / (now - last[1])


class _FirstStep:
    """Times the first step (trace, compile or cache load, run) and notes cache use."""

    def __init__(self, counter: _build.CacheCounter):
        self.counter = counter
        self.hits, self.misses = counter.hits, counter.misses
        self.start = time.perf_counter()

    def report(self, output: Any) -> None:
        jax.block_until_ready(output)  # host sync point: the first step only
        seconds = time.perf_counter() - self.start
        hits = self.counter.hits - self.hits
        misses = self.counter.misses - self.misses
        cache = "hit" if hits and not misses else "miss" if misses else "not used"
        write(
            f"[cerebrax] first step in {seconds:.3f} s (compile cache {cache}: "
            f"{hits} hit(s), {misses} miss(es))"
        )


# ---- eval --------------------------------------------------------------------------------
def run_eval(job: JobConfig, checkpoint: str | None, *, config: dict) -> None:
    """Evaluates ``checkpoint`` (default: the newest of ``model_dir``). The run that
    wrote it (its directory's recorded config) must match ``config``."""
    run = job.run
    path = checkpoint or latest_checkpoint(run.model_dir)
    if path is None:
        raise ConfigError(
            f"`cerebrax eval` needs trained weights: no checkpoint_<step>.mdl in "
            f"{run.model_dir!r}. Pass --checkpoint PATH or run `cerebrax fit` first."
        )
    _runs.check_record(os.path.dirname(path) or ".", config, command="eval")
    backend = _build.build_backend(job)
    model, loss_fn = _build.build_model(job, backend)
    metrics = _build.build_metrics(job, model)
    mean_loss = cs_metrics.MeanMetric("loss")
    state = _load_model(model, path)
    step = state.get("global_step")
    write(
        f"[cerebrax] evaluating {path}"
        + (f" (step {int(np.asarray(step))})" if step is not None else "")
    )
    step_fn = _evaluation_step(model, loss_fn, metrics, mean_loss)
    loader = _build.build_loader(
        job.eval_input, num_steps=job.eval_input.num_steps, seed=run.seed
    )
    model.eval()
    steps = 0
    with contextlib.closing(iter(DataExecutor(loader, progress_bar="auto"))) as batches:
        for batch in batches:
            if not steps:
                _check_batch(job, batch, job.eval_input)
            step_fn(*_args(job, batch))
            steps += 1
    # Host sync points: each float() waits for the last evaluation step.
    write(f"eval loss {float(mean_loss):.6f}  ({steps} steps)")
    for name, value in _metric_values(metrics).items():
        write(f"eval {name} {value:.6f}")


# ---- validate / compile --------------------------------------------------------------------
def run_compile(job: JobConfig, *, mode: str, validate_only: bool) -> None:
    """Traces (``validate``) or compiles (``compile``) one step; runs nothing.

    A CSX backend does this itself (``validate_only`` / ``compile_only``). CPU and GPU
    backends have no such flags, so the step is lowered (and compiled) here.
    """
    run = job.run
    csx = run.backend == "CSX"
    backend = _build.build_backend(
        job, compile_only=csx and not validate_only, validate_only=csx and validate_only
    )
    model, loss_fn = _build.build_model(job, backend)
    if mode == "train":
        step_fn = _training_step(job, model, loss_fn, _build.build_optimizer(job, model))
        spec: InputSpec = job.train_input
        model.train()
    else:
        metrics = _build.build_metrics(job, model)
        step_fn = _evaluation_step(model, loss_fn, metrics, cs_metrics.MeanMetric("loss"))
        spec = job.eval_input
        model.eval()
    loader = _build.build_loader(spec, num_steps=1, seed=run.seed)
    name = step_fn.__name__
    for batch in DataExecutor(loader, num_steps=1, progress_bar=False):
        _check_batch(job, batch, spec)
        if csx:
            step_fn(*_args(job, batch))
        elif validate_only:
            step_fn.lower(*_args(job, batch))
            write(f"[cerebrax] validated `{name}`: traced and lowered, nothing compiled or run.")
        else:
            started = time.perf_counter()
            lowered = step_fn.lower(*_args(job, batch))
            compiled = lowered.compile()
            write_artifacts(
                run.compile_dir, name, lowered, compiled, time.perf_counter() - started
            )
    if not validate_only:
        with open(
            os.path.join(backend.compile_dir if csx else run.compile_dir, f"{name}.memory.txt")
        ) as f:
            print(f.read(), end="")  # after the loop: no bar is live
