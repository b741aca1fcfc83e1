"""The ``cerebrax`` command: run a Model-Zoo-style YAML config with the cstorch loop.

Usage::

    cerebrax fit      CONFIG.yaml [--checkpoint PATH | --no-resume | --overwrite]
                                  [--model_dir DIR] [key.path=value ...]
    cerebrax eval     CONFIG.yaml [--checkpoint PATH] [--model_dir DIR] [key.path=value ...]
    cerebrax validate CONFIG.yaml [--mode train|eval] [key.path=value ...]
    cerebrax compile  CONFIG.yaml [--mode train|eval] [key.path=value ...]
    cerebrax run      SCRIPT [ARGS ...]

``run`` runs an unmodified cstorch script as ``python SCRIPT ARGS ...`` would, with
``import cerebras.pytorch as cstorch`` giving cerebrax (:mod:`cerebrax._cstorch_alias`).

``fit`` trains for ``runconfig.num_steps`` steps (the total: a resumed run trains the
steps that remain), prints the loss every ``runconfig.log_steps`` steps and saves
``model_dir/checkpoint_<step>.mdl`` every ``runconfig.checkpoint_steps`` steps and at
the end. A save copies the state to host memory during the step loop; the file is
written in the background (atomically, as every save); ``saved PATH`` is printed once it
is written, and the next save and the end of the run wait for it. With ``runconfig.eval_frequency`` (or
``trainer.init.loop.eval_frequency``) ``fit`` also validates every that many steps and
after the last one: ``eval_steps`` batches of the eval data through one compiled
evaluation step, printed as ``step N  eval loss ...`` with the metrics. ``fit`` writes
TensorBoard events into ``model_dir``: ``loss``, ``lr`` and ``loss_scale`` (when
scaling) at the logged steps, ``steps_per_sec`` between them, ``eval/loss`` and
``eval/<metric>``, and the model's own ``summarize_scalar`` / ``summarize_tensor``
values (``tensorboard --logdir model_dir``). ``eval`` evaluates a checkpoint (default: the newest in ``model_dir``) and
prints the mean loss over its batches and the configured metrics; its progress bar shows
the running mean of the same loss.

A ``model_dir`` holds one run. ``fit`` removes the temporary files of killed saves,
records the config (after overrides) in ``model_dir/run_config.yaml`` with the run's
first checkpoint, and, started again, resumes from the newest checkpoint of ``model_dir``: with
the same losses as a run never stopped, and ``num_steps`` raised to train further.
``--checkpoint PATH`` resumes from PATH instead; ``--no-resume`` starts from step 0 and
is refused when ``model_dir`` already holds checkpoints; ``--overwrite`` deletes the
run's checkpoints and recorded config and starts over. A config that differs from the
recorded one is refused (the message lists each key, then and now), except in how
long the run goes and how often it logs and saves (``num_steps``, ``max_steps``,
``num_epochs``, ``log_steps``, ``checkpoint_steps``, ``eval_frequency``, ``keep_last_n``,
``keep_every_n_steps``), where it writes (``model_dir``, ``compile_dir``), the
checkpoint to start from, and the evaluation sections. ``eval`` applies the same rule
to the run whose checkpoint it evaluates. Once a save is written, ``fit`` deletes the
checkpoints older than the newest ``keep_last_n`` (default: keeps all), except those
whose step is a multiple of ``keep_every_n_steps``; it never deletes the one it just
wrote.
``validate`` traces one step and ``compile`` compiles it (HLO text and memory report in
``runconfig.compile_dir``); neither runs a step. ``compile_dir`` also holds JAX's
persistent compilation cache, so a second process skips the XLA compile.

Log lines go to stdout. On a terminal, ``fit`` and ``eval`` draw a progress bar on
stderr that stays below the log lines; off a terminal they print one progress summary
line to stderr when the loop ends.

The config reads either Model Zoo layout. The sectioned layout
(``configs/digits_mlp.yaml`` is an example)::

    model:                          # factory(**other keys) -> nnx.Module, torch module, ...
      factory: examples.digits:mlp  # 'package.module:name' or 'path/to/file.py:name'
      loss: cross_entropy           # or 'module:fn', fn(outputs, targets) -> scalar
      hidden: 128
      fp16_type: float16            # (optional) as runconfig.half_dtype;
                                    #   mixed_precision: false computes in float32
    train_input:                    # input_fn(**other keys) -> iterable of (inputs, targets)
      input_fn: examples.digits:input_fn
      batch_size: 64
    eval_input: {input_fn: ..., batch_size: 40, num_steps: 9}  # num_steps: default one pass
    optimizer:                      # cstorch.optim.configure_optimizer
      optimizer_type: SGD
      learning_rate: 0.05           # a number, or a schedule dict / list for
      momentum: 0.9                 #   cstorch.optim.configure_lr_scheduler
      max_gradient_norm: 1.0        # or max_gradient_value: clipping in the step
      loss_scaling_factor: dynamic  # or a number: cstorch.amp.GradScaler, with
      initial_loss_scale: 32768     #   max_loss_scale, min_loss_scale, steps_per_increase
    loss_scaling: {loss_scale: dynamic}   # or GradScaler's own arguments (not both)
    max_gradient_norm: 5.0          # or here (not both)
    metrics: [accuracy]             # eval: accuracy, perplexity, fbeta_score, mean_iou, ...
    runconfig:
      num_steps: 600                # total training steps (or max_steps, or num_epochs)
      checkpoint_steps: 200         # 0: only the last step
      keep_last_n: 3                # (optional) delete older checkpoints ...
      keep_every_n_steps: 1000      # (optional) ... but those of steps k*1000
      save_initial_checkpoint: false  # true: checkpoint_0.mdl before the first step
      log_steps: 50
      seed: 1                       # see below
      eval_steps: 9                 # eval: as eval_input.num_steps
      eval_frequency: 200           # (optional) fit validates every 200 steps
      precision_opt_level: 1        # recorded in the log; no effect on the emulation
      model_dir: ./model_dir
      compile_dir: ./model_dir/compile    # the default
      backend: CSX                  # CPU | GPU | CSX
      half_dtype: float16           # cstorch.amp.set_half_dtype (optional)
      num_csx: 1                    # and any other ClusterConfig field

The ``trainer:`` layout holds the same job::

    trainer:
      init:
        backend: {backend_type: CSX, cluster_config: {num_csx: 1}, compile_dir: ...}
        model_dir: ./model_dir
        seed: 1
        model: {factory: examples.digits:mlp, hidden: 128}
        optimizer: {SGD: {lr: 0.05, momentum: 0.9}}
        schedulers: [{CosineDecayLR: {initial_learning_rate: 0.05, ...}}]
        precision: {fp16_type: float16, loss_scaling_factor: dynamic,
                    max_gradient_norm: 1.0, precision_opt_level: 1}   # enabled: false: float32
        loop: {max_steps: 600, eval_steps: 9,       # or num_steps / num_epochs
               eval_frequency: 200}             # (optional) validate during fit
        checkpoint: {steps: 200, save_initial_checkpoint: false,
                     keep_last_n: 3, keep_every_n_steps: 1000}   # both optional
        logging: {log_steps: 50}
        metrics: [accuracy]
      fit:
        train_dataloader: {input_fn: examples.digits:input_fn, batch_size: 64}
        val_dataloader: {input_fn: ..., split: test}   # what eval and validation read
        ckpt_path: ...                                 # optional: resume from it
      validate: {val_dataloader: ..., ckpt_path: ...}  # optional, for `cerebrax eval`

A Model Zoo ``params.yaml`` runs unchanged: ``model.name`` (``fc_mnist``) and
``*_input.data_processor`` (``MNISTDataProcessor``; in the trainer: layout
``trainer.init.model.name`` and the dataloaders' ``data_processor``) resolve through
Cerebras Model Zoo's own registry when ``cerebras.modelzoo`` is importable (installed, or on
``runconfig.python_paths``). The other keys of those sections go to the registered
classes' Model Zoo config classes (``MNISTModelConfig``), which refuse keys they do not
take, as in Model Zoo; the command reads only ``model.mixed_precision`` and
``model.fp16_type`` itself. The model's ``forward(batch)`` takes the whole batch and
returns its loss (no ``loss:``); ``eval`` and validation report the cstorch metrics the
model updates in its forward (``model.compute_eval_metrics: true``), so ``metrics:`` is
refused. The data processor's ``create_dataloader()`` is the DataLoader's input. The
cstorch alias (``import cerebras.pytorch`` giving cerebrax), which Model Zoo's imports
need, is enabled on this path only. Without Model Zoo the error names what to install.

Every key is honoured or refused: an unknown key, or a Model Zoo key cerebrax cannot
honour (``grad_accum_steps``, ``callbacks``, the model keys Model Zoo turns into
callbacks: ``compression``, ``lora_params``, ``selective_grad``, and the inputs'
``micro_batch_size``, ...), is an error naming its key path. ``seed`` seeds Python's,
numpy's and torch's generators (before a Model Zoo model is built too) and is passed
as ``seed`` to a model factory or input function that takes one and whose section does
not set it (JAX has no global generator).

Errors: a usage or config error, a missing, damaged or mismatched checkpoint, an
unwritable ``model_dir`` or a full disk prints one message on stderr (what failed, where,
the fix) and no traceback; ``--debug`` prints the traceback too. Ctrl-C during ``fit``
prints where the last checkpoint is; the same command run again resumes from it.

Exit status: 0 on success, 2 for a usage or config error, 130 after Ctrl-C, 1 for any
other failure.
"""

from __future__ import annotations

import argparse
import errno
import sys
import traceback
from collections.abc import Sequence

__all__ = ["main"]

COMMANDS = {
    "fit": "train with the config, resuming the run in model_dir",
    "eval": "evaluate a checkpoint and print the loss and metrics",
    "validate": "trace one step without compiling or running it",
    "compile": "compile one step, write its HLO and memory report, run nothing",
}
# `cerebrax run SCRIPT [ARGS...]` is handled before these (main): an unmodified cstorch
# script, with `import cerebras.pytorch` giving cerebrax.


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cerebrax",
        description="Run a YAML config with the Cerebras PyTorch API (cstorch) on JAX.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, text in COMMANDS.items():
        sub = commands.add_parser(name, help=text, description=text)
        sub.add_argument("config", metavar="CONFIG.yaml", help="the run's YAML config")
        if name in ("fit", "eval"):
            sub.add_argument(
                "--checkpoint",
                metavar="PATH",
                help="checkpoint to resume from (fit) or to evaluate (eval)",
            )
        if name == "fit":
            sub.add_argument(
                "--no-resume",
                action="store_true",
                help="start from step 0; refused if model_dir already holds checkpoints",
            )
            sub.add_argument(
                "--overwrite",
                action="store_true",
                help="delete model_dir's checkpoints and recorded config, start over",
            )
        else:
            sub.add_argument(
                "--mode",
                choices=("train", "eval"),
                default="train",
                help=f"which step to {name} (default: train)",
            )
        sub.add_argument(
            "--model_dir", "--model-dir", metavar="DIR", help="overrides runconfig.model_dir"
        )
        sub.add_argument(
            "--debug", action="store_true", help="print the traceback of an error too"
        )
        sub.add_argument(
            "overrides",
            nargs="*",
            metavar="key.path=value",
            help="config overrides, e.g. runconfig.num_steps=100",
        )
    return parser


class _Interrupted(Exception):
    """Ctrl-C, with what the user needs to know to go on."""


# The fix for an operating-system error, by its errno.
_OS_FIXES = {
    errno.ENOSPC: "The disk is full: free space, or point --model_dir at a disk with room.",
    errno.EDQUOT: "The disk quota is used up: free space, or point --model_dir elsewhere.",
    errno.EFBIG: "A file size limit was hit (ulimit -f): raise it, or write elsewhere.",
    errno.EACCES: "Make the directory writable, or choose another with --model_dir.",
    errno.EPERM: "Make the directory writable, or choose another with --model_dir.",
    errno.EROFS: "The file system is read-only: choose another directory with --model_dir.",
    errno.ENOTDIR: "A file stands where a directory is expected: move it, or choose "
    "another path.",
    errno.EEXIST: "A file stands where a directory is expected: move it, or choose "
    "another path.",
}


def _message(error: BaseException) -> str:
    """One message for ``error``: its text and, for a failed file operation, the fix."""
    if isinstance(error, OSError) and error.strerror:
        where = f": {error.filename!r}" if error.filename is not None else ""
        text = f"{error.strerror}{where}."
    else:
        text = str(error)
    cause = error if isinstance(error, OSError) else error.__cause__
    fix = _OS_FIXES.get(getattr(cause, "errno", None)) if isinstance(cause, OSError) else None
    if not fix or fix in text:
        return text
    return f"{text}{' ' if text.endswith('.') else '. '}{fix}"


def _run(args: argparse.Namespace) -> None:
    from ._cli import _build, _commands, _config, _modelzoo, _runs

    raw = _config.load_config(args.config, args.overrides)
    if args.model_dir:
        _config.set_value(raw, "runconfig.model_dir", args.model_dir)
    _build.add_python_paths(_config.python_paths(raw), args.config)
    job = _config.parse(raw)
    mode = getattr(args, "mode", "train")
    _config.require(job, args.command, step=mode)
    job = _modelzoo.prepare(job)  # model.name, data_processor: Model Zoo's config classes
    checkpoint = getattr(args, "checkpoint", None) or job.run.checkpoint_path
    if args.command == "fit":
        _commands.make_model_dir(job.run.model_dir)  # before compile_dir, often inside it
        checkpoint = _runs.prepare_fit(job.run.model_dir, raw, checkpoint,
                                       resume=not args.no_resume, overwrite=args.overwrite)
    counter = _build.setup_compile_cache(job.run.compile_dir)
    if args.command == "fit":
        try:
            _commands.run_fit(job, counter, checkpoint, config=raw)
        except KeyboardInterrupt as e:
            raise _Interrupted(_commands.interrupted(job.run.model_dir)) from e
    elif args.command == "eval":
        _commands.run_eval(job, checkpoint, config=raw)
    else:
        _commands.run_compile(job, mode=mode, validate_only=args.command == "validate")


def _run_script(argv: list[str]) -> int:
    """``cerebrax run SCRIPT [ARGS...]`` (see :mod:`cerebrax._cstorch_alias`)."""
    if not argv or argv[0] in ("-h", "--help"):
        print(MSG_RUN_USAGE, file=sys.stderr if not argv else sys.stdout)
        return 2 if not argv else 0
    from . import _startup_gc
    from ._cstorch_alias import run_module, run_script
    from .errors import ConfigError

    # Until the first step (cerebrax/_startup_gc.py). `python -m cerebrax run` and the
    # console script held already, while cerebrax was imported; main(["run", ...])
    # called from Python holds here.
    _startup_gc.hold()

    try:
        if argv[0] == "-m":
            if len(argv) < 2:
                print("cerebrax run: error: -m takes a module name.\n" + MSG_RUN_USAGE,
                      file=sys.stderr)
                return 2
            return run_module(argv[1], argv[2:])
        return run_script(argv[0], argv[1:])
    except ConfigError as e:
        print(f"cerebrax run: error: {e}", file=sys.stderr)
        return 2


MSG_RUN_USAGE = """usage: cerebrax run SCRIPT [ARGS ...]
       cerebrax run -m MODULE [ARGS ...]
       cerebrax run COMMAND [ARGS ...]

Runs an unmodified cstorch program as `python SCRIPT ARGS ...`, `python -m MODULE ARGS ...`
or an installed console script (`cerebrax run cszoo fit params.yaml`) would, with
`import cerebras.pytorch as cstorch` (and its submodules) giving cerebrax, also in the
DataLoader worker processes it starts."""


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the command line ``argv`` (default: ``sys.argv[1:]``); returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "run":  # the script's own arguments are not ours to parse
        return _run_script(argv[1:])
    parser = _parser()
    # Overrides may come before or after the options: collect the strays here.
    args, extra = parser.parse_known_args(argv)  # exits with status 2 on a usage error
    strays = [a for a in extra if a.startswith("-") or "=" not in a]
    if strays:
        parser.error(f"unrecognized arguments: {' '.join(strays)}")
    args.overrides = list(args.overrides) + extra
    from .errors import CerebraxError, ConfigError

    try:
        _run(args)
    except (CerebraxError, OSError, KeyboardInterrupt, _Interrupted) as e:
        # Any other exception is a bug or the user's own code failing: its traceback
        # shows where, so it propagates (exit status 1).
        if args.debug:
            traceback.print_exc()
        if isinstance(e, (KeyboardInterrupt, _Interrupted)):
            print(f"cerebrax {args.command}: {str(e) or 'interrupted.'}", file=sys.stderr)
            return 130
        print(f"cerebrax {args.command}: error: {_message(e)}", file=sys.stderr)
        return 2 if isinstance(e, ConfigError) else 1
    return 0
