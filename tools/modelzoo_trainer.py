"""Cerebras Model Zoo's own Trainer (``cszoo fit``) on cerebrax, checked against torch eager.

For each case (fc_mnist on fake data; gpt2 and llama on HDF5 files in Model Zoo's format
that this script writes), in a fresh folder:

1. ``cerebrax run cszoo fit params.yaml`` trains a tiny config on the CPU backend in
   float32 (gpt2_bf16: with the precision section enabled at bfloat16), saving the initial checkpoint and checkpoints along the way, with a
   validation at the end; it must exit 0.
2. A torch-eager loop (a subprocess of this script, with the cstorch alias on so that
   Model Zoo's modules import, and nothing compiled) builds the same model class from
   the same validated config, loads the Trainer's initial checkpoint, and trains it on
   the batches of the same data processor with the torch optimizer of the same
   settings (gpt2_bf16: its forward under ``torch.autocast("cpu", torch.bfloat16)``,
   what cstorch's autocast is on a CPU). Its per-step training losses must equal the
   Trainer's (read from its TensorBoard events) at rel 1e-5 (gpt2_bf16: 2**-8, one
   bfloat16 rounding), and so must the validation loss.
3. Resume: the same config in another folder is killed (SIGKILL) once its first
   checkpoint after the initial one exists, then ``cszoo fit`` runs again in that
   folder; Model Zoo loads the last checkpoint, and the losses of the steps after it
   must equal the uninterrupted run's.
4. For gpt2 and llama, ``cszoo checkpoint convert`` turns the final checkpoint into a
   Hugging Face checkpoint; the Hugging Face model's logits on a batch must equal the
   Model Zoo model's with the cerebrax-trained weights (rel 1e-5).

Model Zoo is not a dependency of cerebrax and is never imported by it: this script runs
where a Model Zoo checkout is installed (``pip install --no-deps -e CHECKOUT``, see
docs/porting/modelzoo.md) so that ``cszoo`` is on PATH, with cerebrax's ``tensorboard``
extra (it reads the Trainer's losses back from its event files). Install that extra
before Model Zoo's pins: pip would otherwise raise pydantic past the 2.8.2 that Model Zoo's
config classes need.

    python tools/modelzoo_trainer.py CHECKOUT [--cases fc_mnist,gpt2,llama] [--workdir DIR]

Exit status 0 when every check of every case holds; 1 otherwise; 2 for a bad command line.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np
import yaml

REL = 1e-5
TIMEOUT = 1800  # seconds for one cszoo run

# ---- the cases --------------------------------------------------------------------------

TRAIN_STEPS = 6
CHECKPOINT_STEPS = 2
EVAL_STEPS = 2
SEQ = 16
VOCAB = 96
BATCH = 4


def _common(model_dir: str, optimizer: dict) -> dict:
    return {
        "backend": {"backend_type": "CPU"},
        "model_dir": model_dir,
        "seed": 1,
        "optimizer": optimizer,
        "precision": {"enabled": False},
        "loop": {"max_steps": TRAIN_STEPS, "eval_frequency": TRAIN_STEPS,
                 "eval_steps": EVAL_STEPS},
        "checkpoint": {"steps": CHECKPOINT_STEPS, "save_initial_checkpoint": True},
        "logging": {"log_steps": 1},
    }


def fc_mnist_params(folder: pathlib.Path) -> dict:
    init = _common(str(folder / "model_dir"),
                   {"SGD": {"learning_rate": 0.05, "momentum": 0.9}})
    init["model"] = {"name": "fc_mnist", "depth": 2, "hidden_size": 32, "dropout": 0.0,
                     "activation_fn": "relu", "to_float16": False}
    init["schedulers"] = [{"ConstantLR": {"learning_rate": 0.05}}]
    loader = {"data_processor": "MNISTDataProcessor", "use_fake_data": True,
              "fake_data_seed": 7, "batch_size": BATCH, "drop_last_batch": True,
              "shuffle": False}
    return {"trainer": {"init": init, "fit": {
        "train_dataloader": {**loader, "split": "train"},
        "val_dataloader": {**loader, "split": "val"}}}}


def _lm_loader(folder: pathlib.Path, split: str) -> dict:
    return {"data_processor": "GptHDF5MapDataProcessor",
            "data_dir": str(folder / "data" / split), "batch_size": BATCH,
            "shuffle": False, "num_workers": 0}


def gpt2_params(folder: pathlib.Path) -> dict:
    init = _common(str(folder / "model_dir"),
                   {"SGD": {"learning_rate": 0.02, "momentum": 0.9}})
    init["model"] = {
        "name": "gpt2", "vocab_size": VOCAB, "hidden_size": 32, "num_hidden_layers": 2,
        "num_heads": 2, "filter_size": 64, "max_position_embeddings": SEQ,
        "position_embedding_type": "learned", "share_embedding_weights": True,
        "dropout_rate": 0.0, "attention_dropout_rate": 0.0, "nonlinearity": "gelu",
        "layer_norm_epsilon": 1.0e-5, "use_projection_bias_in_attention": True,
        "use_ffn_bias_in_attention": True, "use_ffn_bias": True,
        "loss_scaling": "num_tokens", "loss_weight": 1.0,
    }
    init["schedulers"] = [{"ConstantLR": {"learning_rate": 0.02}}]
    return {"trainer": {"init": init, "fit": {
        "train_dataloader": _lm_loader(folder, "train"),
        "val_dataloader": _lm_loader(folder, "val")}}}


def llama_params(folder: pathlib.Path) -> dict:
    init = _common(str(folder / "model_dir"), {"AdamW": {
        "learning_rate": 0.003, "betas": [0.9, 0.95], "eps": 1.0e-8,
        "weight_decay": 0.1, "correct_bias": True}})
    init["model"] = {
        "name": "llama", "vocab_size": VOCAB, "hidden_size": 32, "num_hidden_layers": 2,
        "num_heads": 4, "filter_size": 64, "max_position_embeddings": SEQ,
        "position_embedding_type": "rotary", "rotary_dim": 8, "rope_theta": 10000.0,
        "attention_module": "multiquery_attention",
        "extra_attention_params": {"num_kv_groups": 2},
        "nonlinearity": "swiglu", "norm_type": "rmsnorm", "layer_norm_epsilon": 1.0e-5,
        "share_embedding_weights": False, "use_bias_in_output": False,
        "use_ffn_bias": False, "use_ffn_bias_in_attention": False,
        "use_projection_bias_in_attention": False, "dropout_rate": 0.0,
        "attention_dropout_rate": 0.0, "embedding_dropout_rate": 0.0,
        "loss_scaling": "num_tokens", "loss_weight": 1.0,
    }
    init["schedulers"] = [{"ConstantLR": {"learning_rate": 0.003}}]
    return {"trainer": {"init": init, "fit": {
        "train_dataloader": _lm_loader(folder, "train"),
        "val_dataloader": _lm_loader(folder, "val")}}}


def gpt2_clip_params(folder: pathlib.Path) -> dict:
    """gpt2 with the precision section's gradient clipping (by norm, small enough that it
    clips every step), float32."""
    params = gpt2_params(folder)
    params["trainer"]["init"]["precision"] = {"enabled": False, "max_gradient_norm": 0.05}
    return params


def gpt2_bf16_params(folder: pathlib.Path) -> dict:
    """gpt2 with the precision section enabled at bfloat16: the Trainer calls the model
    under ``cstorch.amp.autocast()``, which on the CPU backend is torch's autocast."""
    params = gpt2_params(folder)
    init = params["trainer"]["init"]
    init["precision"] = {"enabled": True, "fp16_type": "bfloat16"}
    # AdamW moves the weights further in 6 steps than SGD, so that the logits leave
    # the uniform guess and the half-precision casts show in the losses.
    init["optimizer"] = {"AdamW": {"learning_rate": 0.005, "betas": [0.9, 0.95],
                                   "eps": 1.0e-8, "weight_decay": 0.0}}
    init["schedulers"] = [{"ConstantLR": {"learning_rate": 0.005}}]
    return params


CASES = {"fc_mnist": fc_mnist_params, "gpt2": gpt2_params, "llama": llama_params,
         "gpt2_clip": gpt2_clip_params, "gpt2_bf16": gpt2_bf16_params}
# Against torch eager, a case in bfloat16 is compared at one bfloat16 rounding of the
# loss: torch and XLA round each half-precision operation at the same casts but not
# always at the same points (a matrix product and its bias). Its resume is float-exact.
CASE_REL = {"gpt2_bf16": 2.0**-8}
HF_MODELS = {"gpt2": "gpt2", "llama": "llama"}
SRC_FMT = "cs-2.9"


def write_lm_data(folder: pathlib.Path, seed: int = 0) -> None:
    """HDF5 files as Model Zoo's GPT preprocessing writes them: a ``data`` dataset of
    shape [n, 3, msl] int32 (input_ids, attention_mask, labels = the next tokens), and
    the attribute ``n_examples``."""
    import h5py

    rng = np.random.default_rng(seed)
    for split, n in (("train", BATCH * (TRAIN_STEPS + 2)), ("val", BATCH * EVAL_STEPS)):
        out = folder / "data" / split
        out.mkdir(parents=True, exist_ok=True)
        tokens = rng.integers(0, VOCAB, size=(n, SEQ + 1), dtype=np.int32)
        lengths = rng.integers(SEQ // 2, SEQ + 1, size=n)
        mask = (np.arange(SEQ)[None, :] < lengths[:, None]).astype(np.int32)
        data = np.stack([tokens[:, :-1] * mask, mask, tokens[:, 1:] * mask], axis=1)
        with h5py.File(out / "data-0.h5", "w") as f:
            f.create_dataset("data", data=data)
            f.attrs["n_examples"] = n


# ---- stand-ins for Model Zoo's optional eval harnesses ---------------------------------

# Model Zoo's trainer extensions import the bigcode and EleutherAI eval harnesses, which
# install only from git. These runs use neither: each module below is a stand-in whose
# every name is a placeholder class (usable as a base class, a decorator, a callable).
HARNESS_MODULES = (
    "bigcode_eval", "bigcode_eval.base", "bigcode_eval.evaluator", "bigcode_eval.utils",
    "bigcode_eval.tasks", "lm_eval", "lm_eval.__main__", "lm_eval.evaluator",
    "lm_eval.utils", "lm_eval.evaluator_utils", "lm_eval.tasks", "lm_eval.api",
    "lm_eval.api.instance", "lm_eval.api.model", "lm_eval.api.registry", "lm_eval.api.task",
    "lm_eval.models", "lm_eval.models.utils",
)
STAND_IN = """\"\"\"A stand-in written by tools/modelzoo_trainer.py (an eval harness not installed).\"\"\"


class Placeholder:
    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        return args[0] if len(args) == 1 and callable(args[0]) else self


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return Placeholder
"""


# The kill of the resume check: where the environment names a checkpoint file, the
# process kills itself (SIGKILL, no cleanup) as soon as the Trainer's checkpoint index lists
# it (the Trainer writes the file with cstorch.save, then adds it to the index, from which
# its autoload picks the checkpoint to resume from), so the run stops right after that
# checkpoint, whatever the machine's speed.
KILL_HOOK = """\"\"\"Written by tools/modelzoo_trainer.py: SIGKILL once a named checkpoint is indexed.\"\"\"
import os

_TARGET = os.environ.get("CEREBRAX_TOOL_KILL_AFTER")
if _TARGET:
    import signal

    import yaml

    _dump = yaml.safe_dump

    def _dump_then_die(data, stream=None, **kwargs):
        result = _dump(data, stream, **kwargs)
        listed = isinstance(data, list) and any(
            os.path.abspath(str(p)) == _TARGET for p in data)
        if listed and stream is not None:
            stream.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        return result

    yaml.safe_dump = _dump_then_die
"""


def write_harness_stand_ins(folder: pathlib.Path) -> pathlib.Path:
    """Writes the stand-in modules under ``folder``, and the kill hook
    (``sitecustomize``); returns it (for PYTHONPATH)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(KILL_HOOK)
    for name in HARNESS_MODULES:
        parts = name.split(".")
        package = folder.joinpath(*parts[:-1]) if len(parts) > 1 else folder
        for i in range(1, len(parts)):
            init = folder.joinpath(*parts[:i], "__init__.py")
            init.parent.mkdir(parents=True, exist_ok=True)
            if not init.exists():
                init.write_text(STAND_IN)
        if name in {m.rsplit(".", 1)[0] for m in HARNESS_MODULES if "." in m} or "." not in name:
            target = folder.joinpath(*parts, "__init__.py")
        else:
            target = package / f"{parts[-1]}.py"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(STAND_IN)
    return folder


# ---- running cszoo ---------------------------------------------------------------------


def _cszoo(args: list[str], cwd: pathlib.Path, log: pathlib.Path,
           kill_when: pathlib.Path | None = None) -> int:
    """``cerebrax run cszoo ARGS`` in ``cwd``; its output goes to ``log``. With
    ``kill_when``, the process kills itself (SIGKILL) once it has saved that file."""
    command = [sys.executable, "-m", "cerebrax", "run", "cszoo", *args]
    env = _env()
    if kill_when is not None:
        env["CEREBRAX_TOOL_KILL_AFTER"] = os.path.abspath(kill_when)
    with open(log, "a") as out:
        out.write(f"$ {' '.join(command)}\n")
        out.flush()
        child = subprocess.Popen(command, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                 start_new_session=True, env=env)
        try:
            return child.wait(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
            return 124


STAND_INS: pathlib.Path | None = None  # set by main: the harness stand-ins' folder


def _env() -> dict[str, str]:
    """The environment of the processes this script starts: the stand-ins importable."""
    env = dict(os.environ)
    if STAND_INS is not None:
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(STAND_INS), env.get("PYTHONPATH", "")) if p)
    return env


def _scalars(model_dir: pathlib.Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar of the TensorBoard event files under ``model_dir``, by tag."""
    from cerebrax.summaries import SummaryReader

    found: dict[str, list[tuple[int, float]]] = {}
    for folder in sorted({p.parent for p in model_dir.rglob("events.out.tfevents.*")}):
        if folder.is_symlink():
            continue
        reader = SummaryReader(folder)
        for tag in reader.tags()["scalars"]:
            found.setdefault(tag, []).extend(reader.scalars(tag))
    return {tag: sorted(set(values)) for tag, values in found.items()}


def _checkpoints(model_dir: pathlib.Path) -> dict[int, pathlib.Path]:
    out = {}
    for path in model_dir.glob("checkpoint_*.mdl"):
        step = path.stem.split("_")[-1]
        if step.isdigit():
            out[int(step)] = path
    return out


# ---- the torch-eager reference (run in a subprocess: --eager) ---------------------------


def eager_reference(folder: pathlib.Path) -> dict:
    """Trains the case in ``folder`` in torch eager from the Trainer's initial checkpoint;
    returns the per-step training losses and the validation loss."""
    import cerebrax

    cerebrax.enable_cstorch_alias()
    import torch

    import cerebras.pytorch as cstorch
    from cerebras.modelzoo.common.optim_utils import configure_param_groups
    from cerebras.modelzoo.trainer.validate import validate_trainer_params

    params = yaml.safe_load((folder / "params.yaml").read_text())
    (config,) = validate_trainer_params(params)
    init = config.init
    torch.manual_seed(init.seed)
    model = init.model()
    state = cstorch.load(str(_checkpoints(pathlib.Path(init.model_dir))[0]))
    model.load_state_dict(state["model"])

    kind, settings = next(iter(params["trainer"]["init"]["optimizer"].items()))
    groups = configure_param_groups(model, init.optimizer.dict())
    if kind == "SGD":
        optimizer = torch.optim.SGD(groups, lr=settings["learning_rate"],
                                    momentum=settings.get("momentum", 0.0))
    elif kind == "AdamW":
        optimizer = torch.optim.AdamW(groups, lr=settings["learning_rate"],
                                      betas=tuple(settings["betas"]), eps=settings["eps"],
                                      weight_decay=settings["weight_decay"])
    else:
        raise SystemExit(f"no torch optimizer for {kind}")

    def batches(section: Any) -> Any:
        section = section[0] if isinstance(section, (list, tuple)) else section
        processor = section.get_orig_class()(**section.get_orig_class_args())
        loader = processor.create_dataloader() if hasattr(processor, "create_dataloader") \
            else processor
        return iter(loader)

    def loss_of(batch: Any) -> torch.Tensor:
        out = model(batch) if not isinstance(batch, (tuple, list)) else model(batch)
        return out["loss"] if isinstance(out, dict) else out

    precision = params["trainer"]["init"].get("precision", {})
    clip = precision.get("max_gradient_norm")
    # The precision section enabled: the Trainer's forward under cstorch's autocast,
    # which on a CPU backend is torch's (bfloat16 only on CPU).
    autocast = torch.autocast("cpu", dtype=torch.bfloat16,
                              enabled=bool(precision.get("enabled")))
    plain = loss_of

    def loss_of(batch: Any) -> torch.Tensor:
        with autocast:
            return plain(batch)

    float32 = []  # the same steps without autocast, to show what the casts change
    if precision.get("enabled"):
        import copy

        shadow, saved = copy.deepcopy(model), copy.deepcopy(optimizer.state_dict())
        train = batches(config.fit.train_dataloader)
        for _ in range(TRAIN_STEPS):
            loss = plain(next(train))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            float32.append(loss.item())
        model.load_state_dict(shadow.state_dict())
        optimizer.load_state_dict(saved)
    losses = []
    model.train()
    train = batches(config.fit.train_dataloader)
    for _ in range(TRAIN_STEPS):
        loss = loss_of(next(train))
        loss.backward()
        if clip is not None:  # the precision callback's clip_grad_norm_ over the groups
            torch.nn.utils.clip_grad_norm_(
                [p for g in optimizer.param_groups for p in g["params"]], clip)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    model.eval()
    val_losses = []
    with torch.no_grad():
        val = batches(config.fit.val_dataloader)
        for _ in range(EVAL_STEPS):
            val_losses.append(loss_of(next(val)).item())
    # the model's own eval metrics (Model Zoo's models update them in forward in eval
    # mode), updated here from the torch-eager forward's tensors
    metrics = {m.name: float(m) for m in model.modules()
               if isinstance(m, cstorch.metrics.Metric) and m.num_updates}
    return {"train": losses, "val": float(np.mean(val_losses)), "metrics": metrics,
            "float32": float32}


# ---- the checks ------------------------------------------------------------------------


def _close(a: float, b: float, rel: float = REL) -> bool:
    return math.isclose(a, b, rel_tol=rel, abs_tol=rel * 1e-3)


def run_case(name: str, checkout: pathlib.Path, root: pathlib.Path) -> list[str]:
    """Runs every check of one case; returns the lines of its report (failures start
    with FAIL)."""
    report = [f"## {name}"]
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    params = CASES[name](folder)
    if name != "fc_mnist":
        write_lm_data(folder)
    (folder / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    log = folder / "cszoo.log"

    started = time.monotonic()
    code = _cszoo(["fit", "params.yaml"], folder, log)
    report.append(f"cszoo fit: exit {code} ({time.monotonic() - started:.0f} s; log {log})")
    if code != 0:
        report.append("FAIL: cszoo fit did not exit 0; the log's end:")
        report.extend("    " + line for line in log.read_text().splitlines()[-25:])
        return report
    scalars = _scalars(folder / "model_dir")
    report.append(f"scalars logged: {sorted(scalars)}")
    train = [v for _, v in scalars.get("loss", [])][:TRAIN_STEPS]

    reference = _eager(folder)
    if "error" in reference:
        report.append(f"FAIL: the torch-eager reference failed: {reference['error']}")
        return report
    tol = CASE_REL.get(name, REL)
    float32 = reference["float32"] or [math.nan] * len(train)
    report.append("step  cerebrax (cszoo fit)  torch eager        rel diff"
                  + ("  (torch float32: rel diff)" if reference["float32"] else ""))
    ok = len(train) == TRAIN_STEPS
    for i, (got, want, full) in enumerate(zip(train, reference["train"], float32), start=1):
        rel = abs(got - want) / max(abs(want), 1e-30)
        ok &= _close(got, want, tol)
        line = f"{i:>4}  {got:.9g}  {want:.9g}  {rel:.2e}"
        if reference["float32"]:
            line += f"  ({full:.9g}: {abs(full - want) / max(abs(want), 1e-30):.2e})"
        report.append(line)
    report.append(("ok" if ok else "FAIL") + f": {len(train)} training losses, rel {tol:.3g}")
    # the Trainer's average validation loss: "<scope>/loss" of its validation loop
    val_tags = [t for t in scalars if t.startswith("validate") and t.endswith("/loss")]
    val = [v for _, v in scalars[val_tags[0]]] if val_tags else []
    if val:
        good = _close(val[-1], reference["val"], tol)
        report.append(("ok" if good else "FAIL")
                      + f": validation loss {val[-1]:.9g} vs torch eager {reference['val']:.9g}")
    else:
        report.append("FAIL: no validation loss logged")
    # the eval metrics Model Zoo's ModelEvalMetrics callback logs under their names
    for tag, want in sorted(reference["metrics"].items()):
        # logged under the validation loop's scope: "validate_0/eval/accuracy"
        tags = [t for t in scalars if t == tag or t.endswith("/" + tag)]
        got = [v for _, v in scalars[tags[0]]] if tags else []
        if not got:
            report.append(f"FAIL: eval metric {tag} not logged")
            continue
        report.append(("ok" if _close(got[-1], want, tol) else "FAIL")
                      + f": eval metric {tag} {got[-1]:.9g} vs torch eager {want:.9g}")
    report += check_validate(folder, params, reference["val"], tol)
    report += check_resume(folder, params, train)
    if name in HF_MODELS:
        report += check_hf_conversion(name, folder)
    return report


def check_resume(folder: pathlib.Path, params: dict, uninterrupted: list[float]) -> list[str]:
    """A run killed once its first checkpoint after the initial one exists, then started
    again in its folder, must log the uninterrupted run's losses for the later steps."""
    resumed = folder / "resume"
    resumed.mkdir(exist_ok=True)
    params = json.loads(json.dumps(params))
    params["trainer"]["init"]["model_dir"] = str(resumed / "model_dir")
    (resumed / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    log = resumed / "cszoo.log"
    first = resumed / "model_dir" / f"checkpoint_{CHECKPOINT_STEPS}.mdl"
    killed = _cszoo(["fit", "params.yaml"], resumed, log, kill_when=first)
    if not first.exists():
        return [f"FAIL: resume: no checkpoint {first.name} (exit {killed})"]
    code = _cszoo(["fit", "params.yaml"], resumed, log)
    if code != 0:
        return [f"FAIL: resume: the second cszoo fit exited {code} (log {log})"]
    logged = dict(_scalars(resumed / "model_dir").get("loss", []))
    later = [logged.get(step) for step in range(CHECKPOINT_STEPS + 1, TRAIN_STEPS + 1)]
    want = uninterrupted[CHECKPOINT_STEPS:]
    ok = None not in later and all(_close(a, b) for a, b in zip(later, want))
    return [("ok" if ok else "FAIL") + f": resumed after step {CHECKPOINT_STEPS} (first run "
            f"exit {killed}): losses of steps {CHECKPOINT_STEPS + 1}..{TRAIN_STEPS} {later} "
            f"vs uninterrupted {want}"]


def check_validate(folder: pathlib.Path, params: dict, want: float,
                   tol: float = REL) -> list[str]:
    """``cszoo validate`` of the fit's last checkpoint, in a model_dir of its own, must
    log the validation loss of the torch-eager model after the same training steps."""
    last = _checkpoints(folder / "model_dir").get(TRAIN_STEPS)
    if last is None:
        return [f"FAIL: validate: the fit saved no checkpoint_{TRAIN_STEPS}"]
    here = folder / "validate"
    here.mkdir(exist_ok=True)
    params = json.loads(json.dumps(params))
    trainer = params["trainer"]
    trainer["init"]["model_dir"] = str(here / "model_dir")
    trainer["validate"] = {"val_dataloader": trainer["fit"]["val_dataloader"],
                           "ckpt_path": str(last)}
    (here / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    log = here / "cszoo.log"
    code = _cszoo(["validate", "params.yaml"], here, log)
    if code != 0:
        return [f"FAIL: cszoo validate exited {code} (log {log})"]
    scalars = _scalars(here / "model_dir")
    tags = [t for t in scalars if t.endswith("/loss") or t == "loss"]
    if not tags:
        return [f"FAIL: cszoo validate logged no loss (tags {sorted(scalars)})"]
    got = scalars[tags[0]][-1][1]
    return [("ok" if _close(got, want, tol) else "FAIL")
            + f": cszoo validate ({tags[0]}) {got:.9g} vs torch eager {want:.9g}"]


def check_hf_conversion(name: str, folder: pathlib.Path) -> list[str]:
    """``cszoo checkpoint convert`` to Hugging Face; the HF model's logits on a batch must
    equal the Model Zoo model's with the same (cerebrax-trained) weights."""
    model_dir = folder / "model_dir"
    final = _checkpoints(model_dir)[TRAIN_STEPS]
    out = folder / "hf"
    log = folder / "convert.log"
    # The checkpoint records cerebrax's own version, which Model Zoo's cs-auto cannot map
    # to a converter: name the newest Cerebras format Model Zoo 2.10 converts from.
    code = _cszoo(["checkpoint", "convert", "--model", HF_MODELS[name], "--src-fmt",
                   SRC_FMT, "--tgt-fmt", "hf", "--config", "params.yaml",
                   "--output-dir", str(out), str(final)], folder, log)
    if code != 0:
        tail = log.read_text().splitlines()[-15:]
        return [f"FAIL: cszoo checkpoint convert exited {code}", *("    " + t for t in tail)]
    done = subprocess.run([sys.executable, __file__, "--logits", str(folder), str(final),
                           str(out)], capture_output=True, text=True, timeout=TIMEOUT,
                          env=_env())
    if done.returncode != 0:
        return ["FAIL: comparing logits failed:", done.stderr[-3000:]]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    ok = result["max_rel"] <= REL
    return [("ok" if ok else "FAIL") + f": Hugging Face conversion: logits of shape "
            f"{result['shape']}, max |hf - modelzoo| / max |modelzoo| = "
            f"{result['max_rel']:.2e} (rel {REL})"]


def compare_logits(folder: pathlib.Path, checkpoint: pathlib.Path,
                   hf_dir: pathlib.Path) -> dict:
    """The Model Zoo model (weights from ``checkpoint``) and the converted HF model, on the
    same batch of token ids: their logits' largest difference relative to the largest
    logit."""
    import cerebrax

    cerebrax.enable_cstorch_alias()
    import torch
    import transformers

    import cerebras.pytorch as cstorch
    from cerebras.modelzoo.trainer.validate import validate_trainer_params

    params = yaml.safe_load((folder / "params.yaml").read_text())
    (config,) = validate_trainer_params(params)
    model = config.init.model()
    model.load_state_dict(cstorch.load(str(checkpoint))["model"])
    model.eval()
    configs = sorted(hf_dir.rglob("config.json"))
    hf = transformers.AutoModelForCausalLM.from_pretrained(configs[0].parent,
                                                           torch_dtype=torch.float32)
    hf.eval()
    ids = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    with torch.no_grad():
        ours = model.model(input_ids=ids, attention_mask=mask)
        ours = ours[0] if isinstance(ours, (tuple, list)) else ours
        theirs = hf(input_ids=ids, attention_mask=mask).logits
    diff = (ours.float() - theirs.float()).abs().max() / ours.float().abs().max()
    return {"shape": list(theirs.shape), "max_rel": float(diff)}


def _eager(folder: pathlib.Path) -> dict:
    done = subprocess.run([sys.executable, __file__, "--eager", str(folder)],
                          capture_output=True, text=True, timeout=TIMEOUT, env=_env())
    if done.returncode != 0:
        return {"error": done.stderr[-3000:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkout", nargs="?", type=pathlib.Path,
                        help="the Model Zoo checkout (installed in this environment)")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--workdir", type=pathlib.Path, default=None)
    parser.add_argument("--eager", type=pathlib.Path, help=argparse.SUPPRESS)
    parser.add_argument("--logits", type=pathlib.Path, nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.eager is not None:
        print(json.dumps(eager_reference(args.eager)))
        return 0
    if args.logits is not None:
        print(json.dumps(compare_logits(*args.logits)))
        return 0
    if args.checkout is None or not (args.checkout / "src" / "cerebras" / "modelzoo").is_dir():
        parser.error("CHECKOUT must be a Model Zoo checkout (with src/cerebras/modelzoo)")
    if shutil.which("cszoo") is None:
        parser.error("cszoo is not on PATH: install the checkout in this environment "
                     "(pip install --no-deps -e CHECKOUT; see docs/modelzoo.md)")
    cases = [c for c in args.cases.split(",") if c]
    unknown = set(cases) - set(CASES)
    if unknown:
        parser.error(f"unknown cases {sorted(unknown)}; known: {sorted(CASES)}")
    root = args.workdir or pathlib.Path(tempfile.mkdtemp(prefix="cerebrax_modelzoo_"))
    global STAND_INS
    STAND_INS = write_harness_stand_ins(root / "stand_ins")
    failed = False
    for name in cases:
        lines = run_case(name, args.checkout, root)
        failed |= any(line.startswith("FAIL") for line in lines)
        print("\n".join(lines), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
