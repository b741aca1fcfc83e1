"""Step programs described by their axis values, run in torch eager and through cerebrax.

A :class:`Program` names one choice on each axis of what a cstorch training step is
made of (the loss, the backward call, gradient operations, where ``zero_grad`` and the
scheduler step sit, the optimizer, the grad scaler, the backend and its compute dtype,
step closures, writes through views, param groups, and whether a batch holds a NaN).
:meth:`Program.problems` says why a combination is not a program a user can write (an
optax loss on JAX values has no torch ``.backward()``, ``unscale_`` needs a scaler, ...).

From the one description, :func:`run_eager` writes the step in torch eager
(``torch.optim``, ``torch.nn.utils.clip_grad_*_``, the schedule's closed form written into
the param groups) and :func:`run_cerebrax` writes it as cstorch code
(``cstorch.compile``, ``cstorch.optim``, ``@cstorch.trace``, ``cstorch.step_closure``,
``cstorch.amp.GradScaler``, ``cstorch.optim.lr_scheduler``). Both return a :class:`Run`:
the loss of every step, every value the step returns, what the step closures saw, and
the final weights.

Loss scaling in torch eager follows cstorch's rule (:class:`_EagerScaler`): active on
the CSX backend only, the loss times the scale in float32, the gradients times its
inverse, an optimizer (and scheduler) step skipped when the gradients' global norm is not
finite, and the dynamic scale halved on an overflow and doubled after
``steps_per_increase`` finite steps. Every scale is a power of two, so at float32 (and
float64) a step that does not overflow computes exactly what it computes unscaled.

``run_eager(program, precision="float16")`` is torch eager's own mixed precision, the
reference for the CSX float16 backend: float32 master weights, a float16 copy of the
model for forward and backward (inputs cast to float16, the output cast back to
float32 before the loss), its float16 gradients cast to float32 onto the master
weights, and the optimizer in float32.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import optax
import torch
from hypothesis import strategies as st

import cerebrax as cstorch

STEPS = 4

# ---- the axes --------------------------------------------------------------------------------
LOSSES = ("functional", "module", "optax")
BACKWARDS = ("loss", "scaler", "cstorch", "optimizer_step")
CLIPS = ("none", "torch_norm", "torch_value", "cstorch_norm", "cstorch_value")
GRAD_OPS = ("none", "scale", "row", "decay")
PARAMS_FROM = ("module", "param_groups")
ZERO_GRADS = ("start", "end", "outside", "before_backward")
SCHEDULERS = ("none", "inside", "outside")
SCHEDULES = ("linear", "step", "cosine", "exponential")
SCALERS = ("none", "static", "dynamic")
BACKENDS = ("cpu", "csx32", "csx16")
CLOSURES = ("none", "inside", "outside", "both")
VIEW_WRITES = ("none", "setitem", "select", "narrow")
GROUPS = (1, 2)
DATA = ("clean", "nan_step")
MACHINERY = ("none", "function_ste", "function_reversal", "data_write", "data_read",
             "tensor_hook", "param_hook", "module_hook", "grad_graph", "grad_no_graph",
             "torch_optim", "autocast")
# Machinery whose torch code computes on the model's output or the loss (a torch loss).
_TORCH_LOSS_MACHINERY = ("data_read", "data_write", "tensor_hook", "grad_graph",
                         "grad_no_graph", "autocast")

# Each optimizer with every hyperparameter given, so both sides use the same values
# (cstorch's defaults differ from torch's, e.g. eps=1e-6).
OPTIMIZERS: dict[str, tuple[str, dict[str, Any]]] = {
    "SGD": ("SGD", dict(lr=0.1)),
    "SGD-nesterov": ("SGD", dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01)),
    "Adam": ("Adam", dict(lr=0.01, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0)),
    "AdamW": ("AdamW", dict(lr=0.01, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.1)),
    "Adamax": ("Adamax", dict(lr=0.01, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0)),
    "NAdam": ("NAdam", dict(lr=0.01, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                            momentum_decay=4e-3)),
    "RAdam": ("RAdam", dict(lr=0.01, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0)),
    "RMSprop": ("RMSprop", dict(lr=0.01, alpha=0.99, eps=1e-8, weight_decay=0.0,
                                momentum=0.5, centered=True)),
    "Adagrad": ("Adagrad", dict(lr=0.1, lr_decay=0.0, weight_decay=0.0,
                                initial_accumulator_value=0.0, eps=1e-6)),
    "Adadelta": ("Adadelta", dict(lr=1.0, rho=0.9, eps=1e-6, weight_decay=0.0)),
    "ASGD": ("ASGD", dict(lr=0.05, lambd=1e-4, alpha=0.75, t0=1e6, weight_decay=0.0)),
}

MAX_NORM = 0.1  # below every step's gradient norm: the clip changes the gradients
CLIP_VALUE = 0.02
STATIC_SCALE = 2.0**9
DYNAMIC_INIT_SCALE = 2.0**10  # float16 gradients stay far below 65504 at this scale
STEPS_PER_INCREASE = 2  # the dynamic scale doubles during the run
DECAY = 0.1  # the "decay" gradient op: p.grad += DECAY * p


@dataclasses.dataclass(frozen=True)
class Program:
    """One training step, by its value on each axis (see the module docstring).

    Attributes:
      loss: ``functional`` (``F.smooth_l1_loss``), ``module`` (``torch.nn.MSELoss()``)
        or ``optax`` (``optax.squared_error(...).mean()`` on JAX values: the step gets
        numpy batches, so the compiled torch model returns JAX arrays).
      backward: ``loss`` (``loss.backward()``), ``scaler``
        (``scaler.scale(loss).backward()``), ``cstorch`` (``cstorch.backward(loss)``)
        or ``optimizer_step`` (``cstorch.amp.optimizer_step(loss, opt, scaler, ...)``).
      clip: gradient clipping after backward: by norm or by value, torch's
        (``torch.nn.utils.clip_grad_*_``) or cstorch's (``cstorch.optim.clip_grad_*_``;
        with ``optimizer_step``, its ``max_gradient_norm`` / ``max_gradient_value``).
      grad_op: an in-place write into ``p.grad`` after backward: ``scale``
        (``p.grad.mul_(0.5)``), ``row`` (``params[0].grad[0].mul_(2)``, through a view)
        or ``decay`` (``p.grad.add_(p.detach(), alpha=DECAY)``).
      params_from: the parameter list the gradient ops and torch clipping take:
        ``model.parameters()`` or the parameters of ``optimizer.param_groups``.
      unscale: an explicit ``scaler.unscale_(optimizer)`` right after backward.
      zero_grad: ``optimizer.zero_grad()`` at the start of the step, at its end (after
        the optimizer step), outside it (before the step is called), or between the
        loss and its backward.
      scheduler: no scheduler, its ``step()`` inside the step (after the optimizer
        step) or outside it (after the step returned).
      schedule: the closed form (cstorch's LinearLR, StepLR, CosineDecayLR,
        ExponentialLR).
      optimizer: a key of :data:`OPTIMIZERS`.
      scaler: no ``GradScaler``, a static one or a dynamic one.
      backend: ``cpu``; ``csx32`` (CSX at float32 compute); ``csx16`` (CSX at float16).
      closure: a step closure called inside the step on the loss, one called outside
        it on the returned loss, or both.
      view_write: an in-place write through a view of the model's output before the loss.
      groups: one param group, or two (weights with weight decay; biases at half the
        learning rate).
      data: ``nan_step``: the second batch holds a NaN (a dynamic scaler skips it).
      machinery: torch's own autograd and optimizer machinery in the step:
        ``function_ste`` (a custom ``autograd.Function`` in ``forward``: a clamp whose
        backward passes the gradient straight through, its bounds non-tensor arguments),
        ``function_reversal`` (a Function whose backward is ``-alpha * grad``),
        ``data_write`` (``p.data.clamp_`` after the update), ``data_read`` (a penalty
        ``(p * p.data).sum()``: ``.data`` carries no gradient), ``tensor_hook`` (a hook
        on an activation in ``forward``), ``param_hook`` (``p.register_hook`` on the
        weights), ``module_hook`` (a full backward hook on the last layer),
        ``grad_graph`` / ``grad_no_graph`` (a gradient penalty on the inputs by
        ``torch.autograd.grad``, with and without ``create_graph``), ``torch_optim``
        (the cerebrax step uses ``torch.optim`` and ``torch.optim.lr_scheduler``
        objects, as a ported torch script keeps them), ``autocast`` (the model called
        under ``torch.autocast("cpu", bfloat16)``).
    """

    loss: str = "functional"
    backward: str = "loss"
    clip: str = "none"
    grad_op: str = "none"
    params_from: str = "module"
    unscale: bool = False
    zero_grad: str = "start"
    scheduler: str = "none"
    schedule: str = "linear"
    optimizer: str = "SGD"
    scaler: str = "none"
    backend: str = "cpu"
    closure: str = "none"
    view_write: str = "none"
    groups: int = 1
    data: str = "clean"
    machinery: str = "none"

    def problems(self) -> list[str]:
        """Why this is not a program a cstorch user writes (empty: it is one)."""
        out = []
        for field, values in AXES.items():
            if getattr(self, field) not in values:
                out.append(f"{field}={getattr(self, field)!r} is not one of {values}")
        if out:
            return out
        torch_loss = self.loss != "optax"
        if not torch_loss and self.backward == "loss":
            out.append("an optax loss is a JAX value: it has no .backward()")
        if not torch_loss and (self.clip.startswith("torch") or self.grad_op != "none"):
            out.append("torch gradient code needs torch gradients (a torch loss's backward)")
        if not torch_loss and self.view_write != "none":
            out.append("an optax loss's inputs are JAX arrays: no torch views to write into")
        if self.backward == "scaler" and self.scaler == "none":
            out.append("scaler.scale(loss).backward() needs a scaler")
        if self.backward in ("loss", "cstorch") and self.scaler != "none":
            out.append("a scaler that never scales the loss")
        if self.unscale and self.backward != "scaler":
            out.append("unscale_ goes with scaler.scale(loss).backward()")
        if (self.backward == "scaler" and not self.unscale
                and (self.clip != "none" or self.grad_op != "none")):
            out.append("gradient ops on scaled gradients: call unscale_ first")
        if self.backward == "optimizer_step":
            if self.clip.startswith("torch") or self.grad_op != "none":
                out.append("optimizer_step clips with its own arguments, nothing runs between")
        if self.params_from == "param_groups" and (
                self.backward == "optimizer_step" or (self.grad_op, self.clip) == ("none", "none")):
            out.append("no gradient op takes the parameter list")
        if self.scheduler == "none" and self.schedule != "linear":
            out.append("a schedule without a scheduler")
        if self.data == "nan_step" and (self.scaler != "dynamic" or self.backend == "cpu"):
            out.append("a NaN batch is only skipped by a dynamic scaler on CSX")
        if not torch_loss and self.machinery in _TORCH_LOSS_MACHINERY:
            out.append(f"machinery={self.machinery} is torch code on the model's output")
        if self.machinery == "autocast" and self.backend == "csx16":
            out.append("CSX at float16 computes in float16 already: no autocast on top")
        return out

    @property
    def valid(self) -> bool:
        return not self.problems()

    @property
    def id(self) -> str:
        """The axes that differ from the default program, as ``axis=value`` pairs."""
        default = Program()
        parts = [f"{f.name}={getattr(self, f.name)}" for f in dataclasses.fields(self)
                 if getattr(self, f.name) != getattr(default, f.name)]
        return ",".join(parts) or "default"

    @property
    def scaler_active(self) -> bool:
        """cstorch scales the loss on the CSX backend only."""
        return self.scaler != "none" and self.backend != "cpu"


AXES: dict[str, tuple] = {
    "loss": LOSSES, "backward": BACKWARDS, "clip": CLIPS, "grad_op": GRAD_OPS,
    "params_from": PARAMS_FROM, "unscale": (False, True), "zero_grad": ZERO_GRADS,
    "scheduler": SCHEDULERS, "schedule": SCHEDULES, "optimizer": tuple(OPTIMIZERS),
    "scaler": SCALERS, "backend": BACKENDS, "closure": CLOSURES,
    "view_write": VIEW_WRITES, "groups": GROUPS, "data": DATA, "machinery": MACHINERY,
}


@dataclasses.dataclass
class Run:
    """What a run of a program gives: per-step series and the final weights."""

    losses: list[float]
    returned: dict[str, list[float]]  # every value the step returned, per step
    closures: dict[str, list[float]]  # what the step closures saw, per step
    weights: dict[str, np.ndarray]


# ---- shared pieces ---------------------------------------------------------------------------
class Mlp(torch.nn.Sequential):
    def __init__(self):
        super().__init__(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


class _ClampThrough(torch.autograd.Function):
    """A straight-through clamp: clamps in the forward pass, passes the gradient whole."""

    @staticmethod
    def forward(ctx, x, low, high):
        return x.clamp(low, high)

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None


class ReverseGradient(torch.autograd.Function):
    """Gradient reversal: the identity forward, ``-alpha * grad`` backward."""

    @staticmethod
    def forward(ctx, x, alpha):
        ctx.alpha = alpha
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return -ctx.alpha * grad, None


class MachineryMlp(Mlp):
    """:class:`Mlp` (the same state dict) whose ``forward`` runs the program's machinery
    on the hidden activation: a custom Function, or a gradient hook."""

    def __init__(self, machinery: str):
        super().__init__()
        self.machinery = machinery

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self[1](self[0](x))
        if self.machinery == "function_ste":
            h = _ClampThrough.apply(h, -0.5, 0.5)
        elif self.machinery == "function_reversal":
            h = ReverseGradient.apply(h, 0.5)
        elif self.machinery == "tensor_hook":
            h.register_hook(lambda grad: grad * 2.0)
        return self[2](h)


def make_model(program: Program) -> torch.nn.Module:
    """The program's model, with its module hook (the parameters' hooks come later)."""
    model = Mlp() if program.machinery == "none" else MachineryMlp(program.machinery)
    if program.machinery == "module_hook":
        model[2].register_full_backward_hook(lambda module, grad_in, grad_out:
                                             (grad_in[0] * 0.5,))
    return model


def _weight_hook(grad: torch.Tensor) -> torch.Tensor:
    return grad * 0.5


def register_parameter_hooks(program: Program, model: torch.nn.Module) -> None:
    """``param_hook``: every weight's gradient halved by a hook."""
    if program.machinery == "param_hook":
        for name, p in model.named_parameters():
            if name.endswith("weight"):
                p.register_hook(_weight_hook)


def forward_loss(program: Program, forward: Callable, model: torch.nn.Module, x: Any,
                 y: Any, loss_of: Callable) -> Any:
    """The model's output and loss, with the program's machinery around them
    (autocast, a gradient penalty on the inputs, a ``.data`` penalty)."""
    machinery = program.machinery
    if machinery.startswith("grad_"):
        x = x.clone().requires_grad_()
    if machinery == "autocast":
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = forward(x)
        out = out.to(x.dtype)
    else:
        out = forward(x)
    out = view_write(program, out)
    loss = loss_of(out, y)
    if machinery.startswith("grad_"):
        (gx,) = torch.autograd.grad(out.pow(2).sum(), x, retain_graph=True,
                                    create_graph=machinery == "grad_graph")
        loss = loss + 0.1 * gx.pow(2).mean()
    elif machinery == "data_read":
        loss = loss + 0.05 * sum((p * p.data).sum() for p in model.parameters())
    return loss


def data_write(program: Program, model: torch.nn.Module) -> None:
    """``data_write``: every parameter clipped through ``.data`` after the update."""
    if program.machinery == "data_write":
        with torch.no_grad():
            for p in model.parameters():
                p.data.clamp_(-0.25, 0.25)


def torch_scheduler(program: Program, optimizer: Any) -> Any:
    """The program's schedule as a torch.optim.lr_scheduler, as a torch script has it."""
    sched = torch.optim.lr_scheduler
    if program.schedule == "linear":
        return sched.LinearLR(optimizer, start_factor=1.0, end_factor=0.1, total_iters=3)
    if program.schedule == "step":
        return sched.StepLR(optimizer, step_size=2, gamma=0.5)
    if program.schedule == "cosine":
        lr = OPTIMIZERS[program.optimizer][1]["lr"]
        return sched.SequentialLR(optimizer, [
            sched.CosineAnnealingLR(optimizer, T_max=3, eta_min=lr / 10),
            sched.ConstantLR(optimizer, factor=0.1, total_iters=STEPS + 1)], milestones=[3])
    return sched.ExponentialLR(optimizer, gamma=0.5**0.5)


def batches(program: Program) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    out = [(torch.randn(5, 6, generator=g), torch.randn(5, 3, generator=g))
           for _ in range(STEPS)]
    if program.data == "nan_step":
        out[1][0][0, 0] = float("nan")
    return out


def schedule(program: Program) -> Callable[[int], float]:
    """The closed form of the program's schedule: the learning rate of step ``t``."""
    lr = OPTIMIZERS[program.optimizer][1]["lr"]
    if program.schedule == "linear":  # LinearLR(lr, lr / 10, total_iters=3)
        return lambda t: lr + (lr / 10 - lr) * min(t, 3) / 3
    if program.schedule == "step":  # StepLR(lr, step_size=2, gamma=0.5)
        return lambda t: lr * 0.5 ** (t // 2)
    if program.schedule == "cosine":  # CosineDecayLR(lr, lr / 10, total_iters=3)
        return lambda t: lr / 10 + (lr - lr / 10) * 0.5 * (1 + math.cos(math.pi * min(t, 3) / 3))
    return lambda t: lr * 0.5 ** (t / 2)  # ExponentialLR(lr, total_iters=2, decay_rate=0.5)


def cstorch_scheduler(program: Program, optimizer: Any) -> Any:
    lr = OPTIMIZERS[program.optimizer][1]["lr"]
    sched = cstorch.optim.lr_scheduler
    if program.schedule == "linear":
        return sched.LinearLR(optimizer, initial_learning_rate=lr, end_learning_rate=lr / 10,
                              total_iters=3)
    if program.schedule == "step":
        return sched.StepLR(optimizer, initial_learning_rate=lr, step_size=2, gamma=0.5)
    if program.schedule == "cosine":
        return sched.CosineDecayLR(optimizer, initial_learning_rate=lr,
                                   end_learning_rate=lr / 10, total_iters=3)
    return sched.ExponentialLR(optimizer, initial_learning_rate=lr, total_iters=2,
                               decay_rate=0.5)


def param_groups(program: Program, model: torch.nn.Module, lr_factor: float = 1.0) -> list:
    """The optimizer's param groups over the torch module's parameters."""
    lr = OPTIMIZERS[program.optimizer][1]["lr"] * lr_factor
    if program.groups == 1:
        return [{"params": list(model.parameters()), "lr": lr}]
    weights = [p for n, p in model.named_parameters() if n.endswith("weight")]
    biases = [p for n, p in model.named_parameters() if n.endswith("bias")]
    return [{"params": weights, "lr": lr, "weight_decay": 0.01},
            {"params": biases, "lr": lr / 2}]


def make_optimizer(namespace: Any, program: Program, model: torch.nn.Module,
                   lr_factor: float = 1.0) -> Any:
    """``namespace.<Optimizer>(groups, **hyperparameters)``: torch.optim or cstorch.optim."""
    name, kwargs = OPTIMIZERS[program.optimizer]
    return getattr(namespace, name)(param_groups(program, model, lr_factor), **kwargs)


def loss_value(program: Program, out: Any, y: Any) -> Any:
    """The loss in torch (eager and torch-native cerebrax steps) or in optax."""
    if program.loss == "functional":
        return torch.nn.functional.smooth_l1_loss(out, y)
    if program.loss == "module":
        return torch.nn.MSELoss()(out, y)
    if isinstance(out, torch.Tensor):  # torch eager's reference of the optax loss
        return torch.nn.functional.mse_loss(out, y)
    return optax.squared_error(out, y).mean()


def view_write(program: Program, out: Any) -> Any:
    if program.view_write == "none":
        return out
    out = out.clone()
    if program.view_write == "setitem":
        out[:, 0] = 0
    elif program.view_write == "select":
        out.select(1, 1).mul_(0.5)
    else:
        out.narrow(0, 0, 2).add_(1)
    return out


def grad_op(program: Program, params: list) -> None:
    if program.grad_op == "scale":
        for p in params:
            p.grad.mul_(0.5)
    elif program.grad_op == "row":
        params[0].grad[0].mul_(2)
    elif program.grad_op == "decay":
        for p in params:
            p.grad.add_(p.detach(), alpha=DECAY)


def closure_lists(program: Program) -> dict[str, list[float]]:
    """What each of the program's step closures will have seen, by where it is called."""
    where = {"none": (), "inside": ("inside",), "outside": ("outside",),
             "both": ("inside", "outside")}[program.closure]
    return {w: [] for w in where}


def grouped_params(optimizer: Any) -> list:
    return [p for group in optimizer.param_groups for p in group["params"]]


def _float(value: Any) -> float:
    return value.item() if isinstance(value, torch.Tensor) else float(value)


def weights_of(model: torch.nn.Module) -> dict[str, np.ndarray]:
    return {k: v.detach().double().numpy(force=True) for k, v in model.state_dict().items()}


# ---- torch eager -----------------------------------------------------------------------------
class _EagerScaler:
    """cstorch's GradScaler rule on torch eager gradients (see the module docstring)."""

    def __init__(self, program: Program):
        self.active = program.scaler_active
        self.dynamic = program.scaler == "dynamic"
        self.scale = DYNAMIC_INIT_SCALE if self.dynamic else STATIC_SCALE
        self.steps = self.overflows = 0
        self.finite = True

    def scaled(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self.scale if self.active else loss

    def unscale_(self, params: list) -> None:
        if not self.active:
            return
        grads = [p.grad for p in params if p.grad is not None]
        for g in grads:
            g.mul_(1.0 / self.scale)
        sq = sum(g.float().square().sum() for g in grads)
        self.finite = bool(torch.sqrt(sq) < math.inf)

    @property
    def skips(self) -> bool:
        """Whether this step's optimizer (and scheduler) step is skipped: dynamic
        scaling only; a static scaler steps whatever the gradients."""
        return self.active and self.dynamic and not self.finite

    def update(self) -> None:
        if not (self.active and self.dynamic):
            return
        self.steps += 1
        self.overflows += not self.finite
        if self.overflows / self.steps > 0.0:
            self.scale, self.steps, self.overflows = self.scale / 2, 0, 0
        elif self.steps > STEPS_PER_INCREASE:
            self.scale, self.steps, self.overflows = self.scale * 2, 0, 0
        self.scale = min(max(self.scale, 2.0**-14), 2.0**15)
        self.finite = True


class _Half:
    """torch eager's mixed precision: a float16 copy computes, the master weights learn."""

    def __init__(self, master: torch.nn.Module):
        self.master = master
        self.half = copy.deepcopy(master).half()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            for h, m in zip(self.half.parameters(), self.master.parameters()):
                h.copy_(m)  # rounds to float16
                h.grad = None
        return self.half(x.half()).float()

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()
        for h, m in zip(self.half.parameters(), self.master.parameters()):
            grad = h.grad.float()
            for hook in (m._backward_hooks or {}).values():  # the master's gradient hooks
                grad = hook(grad)
            m.grad = grad if m.grad is None else m.grad + grad


def _eager_update(program: Program, optimizer: Any, params: list, scaler: _EagerScaler,
                  loss: torch.Tensor, half: _Half | None, model: torch.nn.Module
                  ) -> tuple[float | None, bool]:
    """Backward, gradient ops and the optimizer step: ``(clip norm, skipped)``."""
    scaled = scaler.scaled(loss)
    if half is not None:
        half.backward(scaled)
    else:
        scaled.backward()
    all_params = grouped_params(optimizer)
    unscaled = program.unscale or program.backward == "optimizer_step"
    if unscaled:
        scaler.unscale_(all_params)
    grad_op(program, params)
    clip_params = all_params if program.backward == "optimizer_step" else params
    norm = None
    if program.clip.endswith("norm"):
        norm = torch.nn.utils.clip_grad_norm_(clip_params, MAX_NORM).item()
    elif program.clip.endswith("value"):
        torch.nn.utils.clip_grad_value_(clip_params, CLIP_VALUE)
    if not unscaled and program.backward == "scaler":
        scaler.unscale_(all_params)  # scaler.step unscales
    skipped = scaler.skips
    if not skipped:
        optimizer.step()
    data_write(program, model)
    return norm, skipped


def run_eager(program: Program, *, precision: str = "float32") -> Run:
    """The program in torch eager, at ``precision``: ``float32``, ``float64`` (model and
    data in double) or ``float16`` (torch's mixed precision, :class:`_Half`)."""
    torch.manual_seed(0)
    model = make_model(program)
    if precision == "float64":
        model = model.double()
    half = _Half(model) if precision == "float16" else None
    register_parameter_hooks(program, model)  # on the master weights (see _Half)
    forward = half if half is not None else model
    data_dtype = torch.float64 if precision == "float64" else torch.float32
    optimizer = make_optimizer(torch.optim, program, model)
    lr_of = schedule(program)
    counter = 0

    # A cstorch scheduler writes one rate to every group; a torch scheduler scales each
    # group's own initial rate.
    bases = [group["lr"] for group in optimizer.param_groups]

    def schedule_step(t: int) -> None:
        for group, base in zip(optimizer.param_groups, bases):
            per_group = base / bases[0] if program.machinery == "torch_optim" else 1.0
            group["lr"] = lr_of(t) * per_group

    if program.scheduler != "none":
        schedule_step(0)
    scaler = _EagerScaler(program)
    params = grouped_params(optimizer) if program.params_from == "param_groups" else list(
        model.parameters())
    losses, returned, closures = [], {"loss": [], "lr": []}, closure_lists(program)
    if program.clip.endswith("norm") and program.backward != "optimizer_step":
        returned["norm"] = []

    for x, y in batches(program):
        x, y = x.to(data_dtype), y.to(data_dtype)
        if program.zero_grad in ("start", "outside"):
            optimizer.zero_grad()
        returned["lr"].append(optimizer.param_groups[0]["lr"])
        loss = forward_loss(program, forward, model, x, y,
                            lambda out, y: loss_value(program, out, y))
        if program.zero_grad == "before_backward" or program.backward == "optimizer_step":
            optimizer.zero_grad()
        norm, skipped = _eager_update(program, optimizer, params, scaler, loss, half, model)
        if norm is not None and "norm" in returned:
            returned["norm"].append(norm)
        scaler.update()
        if program.zero_grad == "end":
            optimizer.zero_grad()
        if program.scheduler == "inside" and not skipped:
            counter += 1
            schedule_step(counter)
        value = loss.item()
        losses.append(value)
        returned["loss"].append(value)
        if "inside" in closures:
            closures["inside"].append(value)
        if program.scheduler == "outside":
            counter += 1
            schedule_step(counter)
        if "outside" in closures:
            closures["outside"].append(value)
    return Run(losses, returned, closures, weights_of(model))


# ---- cerebrax --------------------------------------------------------------------------------
_BACKENDS = {"cpu": ("CPU", "float32"), "csx32": ("CSX", "float32"),
             "csx16": ("CSX", "float16")}


def cstorch_scaler(program: Program) -> Any:
    if program.scaler == "static":
        return cstorch.amp.GradScaler(loss_scale=STATIC_SCALE)
    if program.scaler == "dynamic":
        return cstorch.amp.GradScaler(loss_scale="dynamic", init_scale=DYNAMIC_INIT_SCALE,
                                      steps_per_increase=STEPS_PER_INCREASE)
    return None


def _cstorch_update(program: Program, optimizer: Any, scaler: Any, loss: Any,
                    parameters: Callable[[], list]) -> Any:
    """Backward, gradient ops and the optimizer step, inside the traced step: the norm
    that a clip by norm returned, or None."""
    if program.backward == "optimizer_step":
        clip = {"cstorch_norm": {"max_gradient_norm": MAX_NORM},
                "cstorch_value": {"max_gradient_value": CLIP_VALUE}}.get(program.clip, {})
        cstorch.amp.optimizer_step(loss, optimizer, scaler, **clip)
        return None
    if program.backward == "loss":
        loss.backward()
    elif program.backward == "scaler":
        scaler.scale(loss).backward()
    else:
        cstorch.backward(loss)
    if program.unscale:
        scaler.unscale_(optimizer)
    params = parameters()
    grad_op(program, params)
    norm = None
    if program.clip == "torch_norm":
        norm = torch.nn.utils.clip_grad_norm_(params, MAX_NORM)
    elif program.clip == "torch_value":
        torch.nn.utils.clip_grad_value_(params, CLIP_VALUE)
    elif program.clip == "cstorch_norm":
        norm = cstorch.optim.clip_grad_norm_(params, MAX_NORM)
    elif program.clip == "cstorch_value":
        cstorch.optim.clip_grad_value_(params, CLIP_VALUE)
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    return norm


def run_cerebrax(program: Program, *, lr_factor: float = 1.0) -> Run:
    """The program as cstorch code, through ``@cstorch.trace``.

    ``lr_factor`` multiplies the optimizer's learning rate (a wrong program, for the
    test that the comparison can fail).
    """
    backend_name, half = _BACKENDS[program.backend]
    cstorch.reset()
    cstorch.amp.set_half_dtype(half)
    torch.manual_seed(0)
    model = make_model(program)
    register_parameter_hooks(program, model)
    net = cstorch.compile(model, cstorch.backend(backend_name))
    ported = program.machinery == "torch_optim"  # the torch script's own optimizer
    optimizer = make_optimizer(torch.optim if ported else cstorch.optim, program, model,
                               lr_factor)
    scheduler = None
    if program.scheduler != "none":
        scheduler = (torch_scheduler if ported else cstorch_scheduler)(program, optimizer)
    scaler = cstorch_scaler(program)
    criterion = torch.nn.MSELoss()
    closures = closure_lists(program)

    @cstorch.step_closure
    def inside(loss):
        closures["inside"].append(_float(loss))

    @cstorch.step_closure
    def outside(loss):
        closures["outside"].append(_float(loss))

    def the_loss(out, y):
        if program.loss == "module":
            return criterion(out, y)
        return loss_value(program, out, y)

    def parameters():
        if program.params_from == "param_groups":
            return grouped_params(optimizer)
        return list(model.parameters())

    @cstorch.trace
    def step(x, y):
        if program.zero_grad == "start":
            optimizer.zero_grad()
        out = {"lr": optimizer.param_groups[0]["lr"]}
        loss = forward_loss(program, net, model, x, y, the_loss)
        out["loss"] = loss
        if program.zero_grad == "before_backward":
            optimizer.zero_grad()
        norm = _cstorch_update(program, optimizer, scaler, loss, parameters)
        data_write(program, model)
        if norm is not None:
            out["norm"] = norm
        if program.zero_grad == "end":
            optimizer.zero_grad()
        if program.scheduler == "inside":
            scheduler.step()
        if "inside" in closures:
            inside(loss)
        return out

    losses, returned = [], {}
    for x, y in batches(program):
        if program.loss == "optax":
            x, y = x.numpy(), y.numpy()
        if program.zero_grad == "outside":
            optimizer.zero_grad()
        out = step(x, y)
        if program.scheduler == "outside":
            scheduler.step()
        if "outside" in closures:
            outside(out["loss"])
        for key, value in out.items():
            returned.setdefault(key, []).append(_float(value))
        losses.append(_float(out["loss"]))
    weights = weights_of(model)
    cstorch.reset()  # the half dtype too
    return Run(losses, returned, closures, weights)


# ---- comparisons -----------------------------------------------------------------------------
def _series(run: Run) -> dict[str, np.ndarray]:
    """Every compared quantity of a run, by name."""
    out = {"losses": np.asarray(run.losses, np.float64)}
    out.update({f"returned[{k}]": np.asarray(v, np.float64) for k, v in run.returned.items()})
    out.update({f"closure[{k}]": np.asarray(v, np.float64) for k, v in run.closures.items()})
    out.update({f"weights[{k}]": np.asarray(v, np.float64) for k, v in run.weights.items()})
    return out


def _same_keys(want: dict, got: dict) -> None:
    assert sorted(got) == sorted(want), f"different quantities: {sorted(got)} vs {sorted(want)}"


def assert_same(want: Run, got: Run, *, rtol: float = 1e-5, atol: float = 1e-7) -> None:
    """Losses, returned values, closure values and final weights equal to ``rtol``."""
    want_s, got_s = _series(want), _series(got)
    _same_keys(want_s, got_s)
    for name, expected in want_s.items():
        np.testing.assert_allclose(got_s[name], expected, rtol=rtol, atol=atol, err_msg=name)


U16 = 2.0**-11  # float16's unit roundoff
UBF16 = 2.0**-8  # bfloat16's
K = 3.0  # cerebrax's error against float64 at most K times torch eager's own


def _excess(exact: Run, torch_run: Run, got: Run,
            allowance: Callable[[np.ndarray, float], np.ndarray]) -> dict[str, tuple]:
    """Quantities where ``got`` is further from ``exact`` than ``allowance(exact values,
    torch's largest error on the quantity)`` allows, elementwise: ``{name: (error,
    bound)}`` at the worst element. NaNs must sit where the exact run has them."""
    ref_s, torch_s, got_s = _series(exact), _series(torch_run), _series(got)
    _same_keys(ref_s, got_s)
    excess = {}
    for name, ref in ref_s.items():
        got_v, torch_v = got_s[name], torch_s[name]
        nan = np.isnan(ref)
        if not np.array_equal(np.isnan(got_v), nan):
            excess[name] = (math.inf, 0.0)
            continue
        if nan.all():
            continue
        ref, got_v, torch_v = ref[~nan], got_v[~nan], torch_v[~nan]
        error = np.abs(got_v - ref)
        bound = allowance(ref, float(np.max(np.abs(torch_v - ref))))
        if not np.all(error <= bound):
            worst = int(np.argmax(error - bound))
            excess[name] = (float(error[worst]), float(bound[worst]))
    return excess


def float16_excess(exact: Run, torch16: Run, got: Run) -> dict[str, tuple[float, float]]:
    """Where ``got`` exceeds the float16 bound ``K * max|torch16 - exact| + U16 *
    max|exact|`` per quantity (the test module's docstring says why)."""
    return _excess(exact, torch16, got,
                   lambda ref, torch_error: np.full(ref.shape, K * torch_error
                                                    + U16 * float(np.max(np.abs(ref)))))


def float32_excess(exact: Run, torch32: Run, got: Run, *, rtol: float = 1e-5,
                   atol: float = 1e-7) -> dict[str, tuple[float, float]]:
    """Where ``got`` is further from the exact run than ``rtol`` (elementwise) plus ``K``
    times torch eager's own largest float32 error on the quantity."""
    return _excess(exact, torch32, got,
                   lambda ref, torch_error: rtol * np.abs(ref) + atol + K * torch_error)


def _describe(excess: dict[str, tuple[float, float]]) -> str:
    return ", ".join(f"{k}: {e:.3g} > {b:.3g}" for k, (e, b) in excess.items())


def assert_within_float16_bound(exact: Run, torch16: Run, got: Run) -> None:
    excess = float16_excess(exact, torch16, got)
    assert not excess, "beyond the float16 bound (error, bound): " + _describe(excess)


def check(program: Program, *, lr_factor: float = 1.0) -> None:
    """Runs ``program`` through cerebrax and torch eager and compares (see the test
    module's docstring): at float32, equal to rel 1e-5, or, where torch eager's own
    float32 run is further than that from the exact (float64) run, within rel 1e-5 plus
    ``K`` times torch's error of the exact run; at float16, the float16 bound."""
    assert program.valid, program.problems()
    got = run_cerebrax(program, lr_factor=lr_factor)
    if program.machinery == "autocast":  # torch's own autocast is the reference
        excess = _excess(run_eager(program, precision="float64"), run_eager(program), got,
                         lambda ref, torch_error: np.full(
                             ref.shape, K * torch_error + UBF16 * float(np.max(np.abs(ref)))))
        assert not excess, "beyond the bfloat16 bound (error, bound): " + _describe(excess)
        return
    if program.backend == "csx16":
        assert_within_float16_bound(run_eager(program, precision="float64"),
                                    run_eager(program, precision="float16"), got)
        return
    want = run_eager(program)
    try:
        assert_same(want, got)
    except AssertionError as strict:
        excess = float32_excess(run_eager(program, precision="float64"), want, got)
        if excess:
            raise AssertionError(
                f"{strict}\nand beyond rel 1e-5 + {K:g} x torch's own float32 error of the "
                f"float64 run (error, bound): {_describe(excess)}") from None


# ---- the hypothesis strategy -----------------------------------------------------------------
@st.composite
def programs(draw: Callable) -> Program:
    """Valid programs: each axis drawn among the values the axes drawn before allow.

    Every axis lists its default first, so hypothesis shrinks a failing program towards
    the default on every axis it does not need.
    """
    pick = lambda values: draw(st.sampled_from(values))  # noqa: E731
    loss = pick(LOSSES)
    torch_loss = loss != "optax"
    backward = pick(BACKWARDS if torch_loss else BACKWARDS[1:])
    scaler = {"loss": "none", "cstorch": "none", "scaler": pick(SCALERS[1:]),
              "optimizer_step": pick(SCALERS)}[backward]
    backend = pick(BACKENDS)
    torch_code = torch_loss and backward != "optimizer_step"
    clip = pick(CLIPS if torch_code else ("none", "cstorch_norm", "cstorch_value"))
    op = pick(GRAD_OPS) if torch_code else "none"
    uses_list = backward != "optimizer_step" and (clip != "none" or op != "none")
    if backward != "scaler":
        unscale = False
    elif clip != "none" or op != "none":
        unscale = True
    else:
        unscale = draw(st.booleans())
    scheduler = pick(SCHEDULERS)
    machinery = pick(tuple(m for m in MACHINERY
                           if (torch_loss or m not in _TORCH_LOSS_MACHINERY)
                           and not (m == "autocast" and backend == "csx16")))
    program = Program(
        loss=loss, backward=backward, clip=clip, grad_op=op,
        params_from=pick(PARAMS_FROM) if uses_list else "module", unscale=unscale,
        zero_grad=pick(ZERO_GRADS), scheduler=scheduler,
        schedule=pick(SCHEDULES) if scheduler != "none" else "linear",
        optimizer=pick(tuple(OPTIMIZERS)), scaler=scaler, backend=backend,
        closure=pick(CLOSURES), view_write=pick(VIEW_WRITES) if torch_loss else "none",
        groups=pick(GROUPS),
        data=pick(DATA) if scaler == "dynamic" and backend != "cpu" else "clean",
        machinery=machinery,
    )
    assert program.valid, (program, program.problems())
    return program
