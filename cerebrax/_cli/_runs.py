"""A run's ``model_dir``: its recorded config, resumption and checkpoint retention.

``cerebrax fit`` writes ``model_dir/run_config.yaml`` (the config after overrides) with
a run's first checkpoint, resumes from the newest ``checkpoint_<step>.mdl`` of ``model_dir`` when it is
started again, and refuses a config that differs from the recorded one, except in the
keys of :data:`MAY_CHANGE`: how long the run goes and how often it logs and saves
(``num_steps``, ``max_steps``, ``num_epochs``, ``log_steps``, ``checkpoint_steps``,
``keep_last_n``, ``keep_every_n_steps``, ``save_initial_checkpoint``), where it writes
(``model_dir``, ``compile_dir``), the checkpoint to start from, and the evaluation
sections (``eval_input``, ``eval_steps``, ``metrics``, the ``val_dataloader`` s).
``cerebrax eval`` applies the same rule to the run that wrote the checkpoint it evaluates.
"""

from __future__ import annotations

import fnmatch
import glob
import os
import re
from collections.abc import Iterator
from typing import Any

import yaml

from ..ckpt import clean_temporary_files
from ..errors import CheckpointError, ConfigError

__all__ = ["RECORD", "check_record", "checkpoints", "prepare_fit", "prune", "write_record"]

RECORD = "run_config.yaml"
CHECKPOINT_NAME = re.compile(r"checkpoint_(\d+)\.mdl$")
# Key paths (fnmatch patterns) that may differ between the runs of one model_dir.
_RUN_KEYS = ("num_steps", "max_steps", "num_epochs", "eval_steps", "eval_frequency",
             "log_steps", "checkpoint_steps", "keep_last_n", "keep_every_n_steps",
             "save_initial_checkpoint", "model_dir", "compile_dir", "checkpoint_path")
MAY_CHANGE = (
    *(f"runconfig.{key}" for key in _RUN_KEYS),
    "eval_input", "eval_input.*", "metrics", "metrics.*",
    "trainer.init.model_dir", "trainer.init.loop.*", "trainer.init.logging.*",
    "trainer.init.checkpoint.*", "trainer.init.backend.compile_dir",
    "trainer.init.metrics", "trainer.init.metrics.*", "trainer.fit.ckpt_path",
    "trainer.fit.val_dataloader", "trainer.fit.val_dataloader.*",
    "trainer.validate", "trainer.validate.*",
)

MSG_OTHER_CONFIG = """\
{model_dir!r} holds a run started with another config ({record}); {what}:
{lines}
Give this run another model_dir (--model_dir DIR){fix}."""

MSG_NOT_FRESH = """\
--no-resume: {model_dir!r} already holds checkpoints of a run ({newest}). Pass
--overwrite to delete them and start over, or give the new run another model_dir
(--model_dir DIR)."""


# ---- checkpoints -------------------------------------------------------------------------
def checkpoints(model_dir: str) -> list[tuple[int, str]]:
    """``(step, path)`` of each ``checkpoint_<step>.mdl`` in ``model_dir``, by step."""
    found = []
    for path in glob.glob(os.path.join(glob.escape(model_dir), "checkpoint_*.mdl")):
        match = CHECKPOINT_NAME.search(path)
        if match:
            found.append((int(match.group(1)), path))
    return sorted(found)


def prune(model_dir: str, *, keep_last_n: int | None, keep_every_n_steps: int | None,
          written: str) -> list[str]:
    """Deletes the checkpoints older than the newest ``keep_last_n`` (by step), except
    those whose step is a multiple of ``keep_every_n_steps`` and ``written`` (the one
    just saved). Call it only after a save returned. Returns the deleted paths."""
    if keep_last_n is None:
        return []
    found = checkpoints(model_dir)
    removed = []
    for step, path in found[: max(len(found) - keep_last_n, 0)]:
        if keep_every_n_steps and step % keep_every_n_steps == 0:
            continue
        if os.path.abspath(path) == os.path.abspath(written):
            continue
        os.remove(path)
        removed.append(path)
    return removed


# ---- the recorded config -----------------------------------------------------------------
def _leaves(node: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(node, dict) and node:
        for key, value in node.items():
            yield from _leaves(value, f"{prefix}.{key}" if prefix else str(key))
    else:
        yield prefix, node


def _may_change(key: str) -> bool:
    return any(fnmatch.fnmatchcase(key, pattern) for pattern in MAY_CHANGE)


def differences(old: dict, new: dict) -> list[tuple[str, Any, Any]]:
    """``(key path, old value, new value)`` for each key that may not change."""
    missing = object()
    before, after = dict(_leaves(old)), dict(_leaves(new))
    found = []
    for key in sorted(before.keys() | after.keys()):
        a, b = before.get(key, missing), after.get(key, missing)
        if a != b and not _may_change(key):
            found.append((key, "(not set)" if a is missing else a,
                          "(not set)" if b is missing else b))
    return found


def write_record(model_dir: str, config: dict) -> None:
    """Records ``config`` as the one the run in ``model_dir`` started with (once)."""
    path = os.path.join(model_dir, RECORD)
    if not os.path.exists(path):
        with open(path, "w") as f:
            yaml.safe_dump(config, f, sort_keys=False)


def check_record(model_dir: str, config: dict, *, command: str) -> None:
    """Raises :class:`ConfigError` when ``model_dir``'s recorded config differs from
    ``config`` in a key that may not change; does nothing without a record."""
    path = os.path.join(model_dir, RECORD)
    try:
        with open(path) as f:
            recorded = yaml.safe_load(f)
    except FileNotFoundError:
        return
    except (OSError, yaml.YAMLError) as e:
        raise CheckpointError(f"cannot read the run's recorded config {path!r} ({e}); "
                              "remove the file to accept this config.") from None
    found = differences(recorded if isinstance(recorded, dict) else {}, config)
    if not found:
        return
    lines = "\n".join(f"  - {key}: {old!r} then, {new!r} now" for key, old, new in found)
    if command == "fit":
        what = "this config differs in"
        fix = ", or pass --overwrite to delete its checkpoints and start over"
    else:
        what = "its checkpoints were trained with"
        fix = " or the config the run was trained with"
    raise ConfigError(MSG_OTHER_CONFIG.format(
        model_dir=model_dir, record=path, what=what, lines=lines, fix=fix))


# ---- fit ---------------------------------------------------------------------------------
def prepare_fit(model_dir: str, config: dict, checkpoint: str | None, *, resume: bool,
                overwrite: bool) -> str | None:
    """Gets ``model_dir`` ready for ``fit``; returns the checkpoint to resume from.

    Removes the temporary files of killed saves. ``overwrite`` deletes the run's
    checkpoints and recorded config first. Otherwise the config must match the
    recorded one, and without an explicit ``checkpoint`` the run resumes from the newest
    checkpoint of ``model_dir`` (``resume``) or refuses to write over them.
    """
    clean_temporary_files(model_dir)
    if overwrite:
        found = [path for _, path in checkpoints(model_dir)]
        if checkpoint and os.path.exists(checkpoint) and any(
            os.path.samefile(checkpoint, p) for p in found
        ):
            raise ConfigError(
                f"--overwrite deletes the checkpoints of {model_dir!r}, --checkpoint "
                f"{checkpoint!r} among them. Copy it elsewhere first, or drop --overwrite."
            )
        for path in found:
            os.remove(path)
        if os.path.exists(os.path.join(model_dir, RECORD)):
            os.remove(os.path.join(model_dir, RECORD))
        return checkpoint
    check_record(model_dir, config, command="fit")
    if checkpoint is not None:
        return checkpoint
    found = checkpoints(model_dir)
    if not found:
        return None
    if not resume:
        raise CheckpointError(MSG_NOT_FRESH.format(model_dir=model_dir, newest=found[-1][1]))
    return found[-1][1]
