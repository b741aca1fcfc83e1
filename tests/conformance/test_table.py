"""A table of step programs, each run through cerebrax and through torch eager.

A step program (:class:`programs.Program`) is one value on each axis of what cstorch
users write in a training step: the loss (a torch module, a functional torch loss, or
optax on JAX values), the backward call (``loss.backward()``,
``scaler.scale(loss).backward()``, ``cstorch.backward``, ``cstorch.amp.optimizer_step``),
gradient operations (torch's and cstorch's clipping by norm and by value, ``unscale_``,
in-place writes into ``p.grad``, over the module's parameters or those of
``optimizer.param_groups``), where ``zero_grad`` and the scheduler step are placed, the
optimizer, the grad scaler (none, static, dynamic, and a NaN batch that a dynamic scaler
skips), the backend (CPU, and CSX at float32 and float16 compute), step closures called
inside and outside the step, writes through views of the model's output, and one or two
param groups. Each program runs ``programs.STEPS`` steps in torch eager and through a
``@cstorch.trace`` step; the losses, every value the step returns, what the step
closures saw and the final weights (``state_dict``) are compared.

Tolerances.

- CPU and CSX at float32: equal to torch eager to ``rtol=1e-5`` (``atol=1e-7``). Both
  frameworks compute the same float32 operations; only the order of a reduction's
  additions differs, a few units of roundoff (``rtol=1e-5`` is about 170 of them). Loss
  scales are powers of two, so scaling the loss and unscaling the gradients changes no
  value that does not overflow, and the eager reference applies cstorch's scaling rule
  itself (it skips the steps a dynamic scaler skips). One exception: an optimizer that
  divides a gradient by its own magnitude (Adagrad, the Adam family) carries the
  rounding of a near-cancelling gradient element (clipping, weight decay) into the
  update at 1e-4 relative; there torch eager's own float32 run is that far from the
  exact (float64) one, and cerebrax's run is compared with the exact run instead:
  within ``rtol=1e-5`` plus ``K = 3`` times torch's largest float32 error on the
  quantity, the bound of the bridge's real-model tests. (Seen: Adagrad, clipping, two
  param groups, a view write; torch 6e-6 and cerebrax 2e-6 from the exact weight.)
- CSX at float16: cerebrax runs the model's forward and backward in float16 with float32
  master weights. Neither it nor torch computes the exact result there: every value of
  forward and backward is rounded to float16 (unit roundoff ``u = 2**-11``), and the
  kernels round differently (XLA and torch accumulate a matmul in different orders and
  precisions, fuse differently), so two correct float16 runs need not agree to any fixed
  number of bits. What a correct run shares with torch is the size of its error. The
  reference is therefore the exact computation, the same program in torch eager at
  float64, and the bound on each compared quantity (the losses as one series, each
  returned series, each weight tensor) is

      max|cerebrax - float64| <= K * max|torch16 - float64| + u * max|float64|

  where torch16 is torch eager's own mixed precision (a float16 copy of the model for
  forward and backward, its gradients cast to the float32 master weights, the optimizer
  in float32). ``K = 3`` allows for the different accumulation orders, as the bridge's
  tests allow float32 kernels 3 times torch's own error (docs/development.md, "What the numeric tests
  bound"). The floor, one rounding of the quantity's largest magnitude, covers quantities
  torch happens to compute almost exactly (a learning rate, a first-step loss whose
  errors cancel). A wrong program is far outside it: ``test_the_comparisons_can_fail``
  shows a 5% change of the learning rate caught at float16 and a 1% change at float32.

The fixed table (:data:`TABLE`) covers every value of every axis at least once; a
hypothesis strategy (:func:`programs.programs`) draws further valid combinations, a
fixed, derandomized set of them by default and more with ``CEREBRAX_CONFORMANCE_ALL=1``.

The machinery axis (torch's own autograd and optimizer machinery in the step: custom
``autograd.Function`` backwards, ``.data`` writes and reads, tensor, parameter and module
hooks, ``torch.autograd.grad`` with and without ``create_graph``, ``torch.optim``
optimizers and schedulers kept from a torch script, ``torch.autocast``) is compared like
the rest, except autocast: its reference is torch's own autocast run, and the bound the
float16 one with bfloat16's unit roundoff (``2**-8``): cerebrax applies torch's autocast
(its op lists make every cast), and XLA's bfloat16 kernels round differently from
torch's.
"""

from __future__ import annotations

import dataclasses
import os

import pytest
from hypothesis import Phase, given, settings

import programs as P
from programs import Program

ALL = os.environ.get("CEREBRAX_CONFORMANCE_ALL") == "1"
# The default run draws a fixed set of programs (derandomized) and reports a failing
# one as drawn; CEREBRAX_CONFORMANCE_ALL=1 draws more and shrinks a failing program to
# the fewest axes away from the default (each example compiles a step: ~1 s).
EXAMPLES = 200 if ALL else 40
PHASES = tuple(Phase) if ALL else (Phase.explicit, Phase.generate)

TABLE = [
    # loss x backward
    Program(),
    Program(loss="module", optimizer="Adam"),
    Program(loss="optax", backward="cstorch", optimizer="AdamW"),
    Program(loss="optax", backward="scaler", scaler="dynamic", backend="csx32",
            scheduler="inside"),
    Program(loss="optax", backward="optimizer_step", scaler="static", clip="cstorch_norm",
            backend="csx16"),
    Program(backward="cstorch", clip="cstorch_value"),
    Program(backward="optimizer_step", clip="cstorch_value", optimizer="RMSprop"),
    # gradient ops, parameter lists from the module and from param_groups
    Program(backward="scaler", scaler="static", backend="csx32", unscale=True,
            clip="torch_norm"),
    Program(backward="scaler", scaler="dynamic", backend="csx32", unscale=True,
            clip="torch_value", params_from="param_groups"),
    Program(clip="torch_norm", params_from="param_groups"),
    Program(clip="torch_value", params_from="param_groups", groups=2),
    Program(clip="cstorch_norm", params_from="param_groups", groups=2),
    Program(grad_op="scale", params_from="param_groups", optimizer="SGD-nesterov"),
    Program(grad_op="row", clip="cstorch_norm"),
    Program(grad_op="decay"),  # torch code reads the parameter's value after backward
    Program(grad_op="decay", params_from="param_groups"),
    # skipped steps, zero_grad and scheduler placement
    Program(backward="optimizer_step", scaler="dynamic", backend="csx32", clip="cstorch_norm",
            data="nan_step"),
    Program(backward="scaler", scaler="dynamic", backend="csx32", data="nan_step",
            scheduler="inside", schedule="step", optimizer="SGD-nesterov"),
    Program(backward="scaler", scaler="dynamic", backend="csx32", data="nan_step",
            unscale=True, clip="torch_norm"),
    Program(backward="scaler", scaler="dynamic", backend="csx32", data="nan_step",
            scheduler="outside", optimizer="Adam", zero_grad="end"),
    Program(zero_grad="end", scheduler="inside", schedule="cosine", optimizer="Adamax"),
    Program(zero_grad="outside", scheduler="outside", schedule="exponential",
            optimizer="NAdam", groups=2),
    # optimizers, closures, view writes
    Program(optimizer="RAdam", closure="inside", zero_grad="before_backward"),
    Program(optimizer="Adagrad", closure="outside"),
    Program(optimizer="Adadelta", closure="both", backend="csx32"),
    Program(optimizer="ASGD", view_write="setitem"),
    # scalers inactive on CPU
    Program(backward="scaler", scaler="static"),
    Program(backward="scaler", scaler="dynamic", unscale=True),
    # CSX at float16
    Program(backend="csx16", view_write="select", optimizer="Adam"),
    Program(backend="csx16", view_write="narrow", backward="scaler", scaler="dynamic",
            unscale=True, clip="torch_norm"),
    Program(backend="csx16", optimizer="SGD-nesterov", scheduler="inside",
            closure="both", loss="module"),
    Program(backend="csx16", backward="scaler", scaler="dynamic", data="nan_step",
            optimizer="AdamW", zero_grad="end", groups=2),
    # torch's own machinery: custom Functions, .data, hooks, autograd.grad, torch.optim
    # objects, autocast; each with a scaler, CSX float16, clipping or closures
    Program(machinery="function_ste", backend="csx16", backward="scaler", scaler="dynamic",
            unscale=True, clip="torch_norm"),
    Program(machinery="function_reversal", closure="both", optimizer="Adam"),
    Program(machinery="data_write", backward="scaler", scaler="dynamic", backend="csx32",
            data="nan_step"),
    Program(machinery="data_read", clip="torch_norm", params_from="param_groups", groups=2),
    Program(machinery="tensor_hook", backend="csx16", closure="inside"),
    Program(machinery="param_hook", backend="csx16", backward="scaler", scaler="dynamic",
            unscale=True, clip="torch_value"),
    Program(machinery="module_hook", backward="optimizer_step", scaler="static",
            backend="csx32", clip="cstorch_norm"),
    Program(machinery="grad_graph", backend="csx16", optimizer="Adam"),
    Program(machinery="grad_no_graph", clip="cstorch_norm", closure="outside"),
    Program(machinery="torch_optim", optimizer="AdamW", scheduler="inside", schedule="step"),
    Program(machinery="torch_optim", optimizer="SGD-nesterov", backward="scaler",
            scaler="dynamic", backend="csx32", data="nan_step", scheduler="inside",
            schedule="cosine"),
    Program(machinery="torch_optim", optimizer="RMSprop", backend="csx16", groups=2,
            scheduler="outside", schedule="exponential", clip="torch_norm"),
    Program(machinery="autocast", backward="scaler", scaler="static", backend="csx32",
            closure="both"),
]


def test_the_table_holds_valid_programs_covering_every_axis_value():
    """Every program of the table is valid and distinct, and every value of every axis
    appears in at least one of them."""
    problems = {p.id: p.problems() for p in TABLE if not p.valid}
    assert not problems, problems
    assert len({p.id for p in TABLE}) == len(TABLE)
    missing = {axis: [v for v in values if v not in {getattr(p, axis) for p in TABLE}]
               for axis, values in P.AXES.items()}
    assert not any(missing.values()), missing


@pytest.mark.parametrize("program", TABLE, ids=lambda p: p.id)
def test_a_program_trains_as_in_torch_eager(program):
    P.check(program)


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None, phases=PHASES)
@given(P.programs())
def test_drawn_programs_train_as_in_torch_eager(program):
    P.check(program)


@pytest.mark.parametrize("invalid, reason", [
    (Program(loss="optax"), "no .backward()"),
    (Program(loss="optax", backward="cstorch", clip="torch_norm"), "torch gradients"),
    (Program(backward="scaler"), "needs a scaler"),
    (Program(scaler="static"), "never scales"),
    (Program(unscale=True), "unscale_ goes with"),
    (Program(backward="scaler", scaler="static", clip="cstorch_norm"), "unscale_ first"),
    (Program(backward="optimizer_step", grad_op="scale"), "nothing runs between"),
    (Program(params_from="param_groups"), "no gradient op"),
    (Program(schedule="cosine"), "without a scheduler"),
    (Program(backward="scaler", scaler="dynamic", data="nan_step"), "NaN batch"),
])
def test_programs_users_cannot_write_are_invalid(invalid, reason):
    assert any(reason in problem for problem in invalid.problems()), invalid.problems()


def _losses_and_weights(run: P.Run) -> P.Run:
    return P.Run(run.losses, {}, {}, run.weights)


@pytest.mark.parametrize("program, lr_factor", [
    (Program(optimizer="Adam", clip="cstorch_norm"), 1.01),
    (Program(backend="csx16", optimizer="Adam"), 1.05),
    (Program(backend="csx16", backward="scaler", scaler="static"), 1.05),
])
def test_the_comparisons_can_fail(program, lr_factor):
    """A cerebrax run at another learning rate (1% more at float32, 5% more at float16)
    fails the comparison, and would by its losses and weights alone (not only by the
    learning rate the step returns)."""
    got = P.run_cerebrax(program, lr_factor=lr_factor)
    if program.backend == "csx16":
        exact = P.run_eager(program, precision="float64")
        torch16 = P.run_eager(program, precision="float16")
        with pytest.raises(AssertionError):
            P.assert_within_float16_bound(exact, torch16, got)
        excess = P.float16_excess(*map(_losses_and_weights, (exact, torch16, got)))
    else:
        want = P.run_eager(program)
        with pytest.raises(AssertionError):
            P.assert_same(want, got)
        exact = P.run_eager(program, precision="float64")
        excess = P.float32_excess(*map(_losses_and_weights, (exact, want, got)))
    assert any(name.startswith("weights") for name in excess), excess


def test_a_wrong_eager_reference_is_caught():
    """A reference that leaves out the clip differs from the program that clips."""
    program = Program(clip="cstorch_norm")
    got = P.run_cerebrax(program)
    wrong = P.run_eager(dataclasses.replace(program, clip="none"))
    with pytest.raises(AssertionError):
        P.assert_same(wrong, got)
