"""Adagrad, Adadelta, ASGD, RMSprop and Rprop with torch.optim numerics, as optax transforms.

Each ``scale_by_torch_*`` transform keeps torch's per-parameter state under torch's
names (plus an int32 ``count``, torch's ``step``) and mirrors the operation order of
torch's single-tensor implementation, so float32 results agree to a few ulps.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.typing import ArrayLike

from ...errors import ConfigError
from ._common import (
    check_non_negative,
    lerp,
    maybe_negate,
    one_minus,
    scale_by_learning_rate,
)

__all__ = [
    "ASGDState",
    "AdadeltaState",
    "AdagradState",
    "RMSpropState",
    "RpropState",
    "adadelta",
    "adagrad",
    "asgd",
    "rmsprop",
    "rprop",
    "scale_by_torch_adadelta",
    "scale_by_torch_adagrad",
    "scale_by_torch_asgd",
    "scale_by_torch_rmsprop",
    "scale_by_torch_rprop",
]

ScalarOrSchedule = ArrayLike | Callable[[jax.Array], ArrayLike]


def _is_concrete(x: object) -> bool:
    return not (isinstance(x, jax.core.Tracer) or callable(x))


def _at(value: ScalarOrSchedule, count: jax.Array) -> jax.Array:
    """A hyperparameter's value at step ``count`` (schedules are called)."""
    return jnp.asarray(value(count) if callable(value) else value, jnp.float32)


def _rounded(x: jax.Array) -> jax.Array:
    """``x``, kept as its own rounded value: XLA may not fold it into the next op.

    torch rounds ``p * decay`` before adding to it and divides by a rounded
    ``sqrt(v)``; XLA would fuse such a multiply into the following add (one FMA, one
    rounding) and turn ``a / sqrt(v)`` into ``a * rsqrt(v)`` (a few ulps off). The
    select, an identity, keeps the operation apart.
    """
    return jnp.where(x == x, x, jnp.nan)


def _zeros(params: optax.Params) -> optax.Updates:
    return jax.tree.map(jnp.zeros_like, params)


def _full(params: optax.Params, value: ArrayLike) -> optax.Updates:
    return jax.tree.map(lambda p: jnp.full_like(p, value), params)


# ---- Adagrad ---------------------------------------------------------------------------
class AdagradState(NamedTuple):
    """State of :func:`scale_by_torch_adagrad`."""

    count: jax.Array  # int32: torch's state["step"]
    sum: optax.Updates  # running sum of squared gradients


def scale_by_torch_adagrad(
    lr_decay: ArrayLike = 0.0, eps: ArrayLike = 1e-10, initial_accumulator_value: float = 0.0
) -> optax.GradientTransformation:
    """Rescales updates by torch's Adagrad accumulator.

    ``sum = sum + g * g``; the update is ``g / (sqrt(sum) + eps) / (1 + (t - 1) * lr_decay)``
    (``t`` the step, from 1), ``sum`` starting at ``initial_accumulator_value``.
    """

    def init_fn(params):
        return AdagradState(jnp.zeros((), jnp.int32), _full(params, initial_accumulator_value))

    def update_fn(updates, state, params=None):
        del params
        count = optax.safe_increment(state.count)
        acc = jax.tree.map(lambda s, g: s + g * g, state.sum, updates)
        decay = 1.0 + state.count.astype(jnp.float32) * lr_decay
        out = jax.tree.map(lambda g, s: g / (jnp.sqrt(s) + eps) / decay, updates, acc)
        return out, AdagradState(count, acc)

    return optax.GradientTransformation(init_fn, update_fn)


def adagrad(
    learning_rate: ScalarOrSchedule = 1e-2,
    lr_decay: ArrayLike = 0.0,
    weight_decay: ArrayLike = 0.0,
    initial_accumulator_value: float = 0.0,
    eps: ArrayLike = 1e-10,
    *,
    maximize: bool = False,
) -> optax.GradientTransformation:
    """Adagrad, numerically as ``torch.optim.Adagrad``.

    Update rule (``g`` the gradient, negated when ``maximize``; ``t`` the step)::

        g = g + weight_decay * p
        sum = sum + g^2                            # sum_0 = initial_accumulator_value
        p = p - lr / (1 + (t - 1) * lr_decay) * g / (sqrt(sum) + eps)

    Example:
      >>> tx = adagrad(0.1)
      >>> params = {"w": jnp.ones(2)}
      >>> updates, _ = tx.update({"w": jnp.ones(2)}, tx.init(params), params)
      >>> optax.apply_updates(params, updates)["w"]
      Array([0.9, 0.9], dtype=float32)
    """
    check_non_negative("learning_rate", learning_rate)
    check_non_negative("lr_decay", lr_decay)
    check_non_negative("weight_decay", weight_decay)
    check_non_negative("initial_accumulator_value", initial_accumulator_value)
    check_non_negative("epsilon", eps)
    return optax.chain(
        maybe_negate(maximize),
        optax.add_decayed_weights(weight_decay),
        scale_by_torch_adagrad(lr_decay, eps, initial_accumulator_value),
        scale_by_learning_rate(learning_rate),
    )


# ---- Adadelta --------------------------------------------------------------------------
class AdadeltaState(NamedTuple):
    """State of :func:`scale_by_torch_adadelta`."""

    count: jax.Array  # int32: torch's state["step"]
    square_avg: optax.Updates  # running average of g^2
    acc_delta: optax.Updates  # running average of the squared updates


def scale_by_torch_adadelta(
    rho: float = 0.9, eps: ArrayLike = 1e-6
) -> optax.GradientTransformation:
    """torch's Adadelta scaling.

    ``v = rho * v + (1 - rho) * g^2``; ``d = sqrt(u + eps) / sqrt(v + eps) * g``;
    ``u = rho * u + (1 - rho) * d^2``; the update is ``d``.
    """

    one_minus_rho = one_minus(rho)

    def init_fn(params):
        return AdadeltaState(jnp.zeros((), jnp.int32), _zeros(params), _zeros(params))

    def update_fn(updates, state, params=None):
        del params
        sq = jax.tree.map(lambda v, g: _rounded(v * rho) + (one_minus_rho * g) * g,
                          state.square_avg, updates)
        delta = jax.tree.map(
            lambda u, v, g: jnp.sqrt(u + eps) / _rounded(jnp.sqrt(v + eps)) * g,
            state.acc_delta, sq, updates,
        )
        acc = jax.tree.map(lambda u, d: _rounded(u * rho) + (one_minus_rho * d) * d,
                           state.acc_delta, delta)
        return delta, AdadeltaState(optax.safe_increment(state.count), sq, acc)

    return optax.GradientTransformation(init_fn, update_fn)


def _check_closed_unit(name: str, value: ArrayLike) -> None:
    if _is_concrete(value) and not 0.0 <= float(value) <= 1.0:
        raise ConfigError(f"Invalid {name} value: {value!r} (expected 0 <= {name} <= 1)")


def adadelta(
    learning_rate: ScalarOrSchedule = 1.0,
    rho: float = 0.9,
    eps: ArrayLike = 1e-6,
    weight_decay: ArrayLike = 0.0,
    *,
    maximize: bool = False,
) -> optax.GradientTransformation:
    """Adadelta, numerically as ``torch.optim.Adadelta``.

    Update rule (``g`` the gradient, negated when ``maximize``)::

        g = g + weight_decay * p
        v = rho * v + (1 - rho) * g^2
        d = sqrt(u + eps) / sqrt(v + eps) * g
        u = rho * u + (1 - rho) * d^2
        p = p - lr * d

    Example:
      >>> tx = adadelta(1.0, eps=1e-2)
      >>> params = {"w": jnp.ones(2)}
      >>> updates, _ = tx.update({"w": jnp.ones(2)}, tx.init(params), params)
      >>> optax.apply_updates(params, updates)["w"]
      Array([0.69848865, 0.69848865], dtype=float32)
    """
    check_non_negative("learning_rate", learning_rate)
    _check_closed_unit("rho", rho)
    check_non_negative("epsilon", eps)
    check_non_negative("weight_decay", weight_decay)
    return optax.chain(
        maybe_negate(maximize),
        optax.add_decayed_weights(weight_decay),
        scale_by_torch_adadelta(rho, eps),
        scale_by_learning_rate(learning_rate),
    )


# ---- ASGD ------------------------------------------------------------------------------
class ASGDState(NamedTuple):
    """State of :func:`scale_by_torch_asgd`."""

    count: jax.Array  # int32: torch's state["step"]
    eta: jax.Array  # float32 step size of the next update
    mu: jax.Array  # float32 averaging weight of the next update
    ax: optax.Updates  # the averaged parameters


def scale_by_torch_asgd(
    learning_rate: ScalarOrSchedule = 1e-2,
    lambd: float = 1e-4,
    alpha: float = 0.75,
    t0: float = 1e6,
) -> optax.GradientTransformation:
    """torch's averaged SGD; the update it returns is the whole parameter change.

    With ``eta`` and ``mu`` from the previous step (``eta = lr``, ``mu = 1`` at first)::

        p' = p * (1 - lambd * eta) - eta * g
        ax = p' if mu == 1 else ax + (p' - ax) * mu
        eta = lr / (1 + lambd * lr * t)^alpha;  mu = 1 / max(1, t - t0)

    and the update is ``p' - p``. It needs ``params``.
    """

    def init_fn(params):
        count = jnp.zeros((), jnp.int32)
        # The first update replaces eta with the learning rate of that step.
        eta = _at(learning_rate, count) if _is_concrete(learning_rate) else jnp.zeros(())
        return ASGDState(count, eta, jnp.ones((), jnp.float32), _zeros(params))

    def update_fn(updates, state, params=None):
        if params is None:
            raise ValueError("scale_by_torch_asgd needs params: call update(g, state, params)")
        lr = _at(learning_rate, state.count)
        # torch creates eta from the learning rate at the first step.
        eta = jnp.where(state.count == 0, lr, state.eta)
        decay = 1.0 - lambd * eta
        new = jax.tree.map(lambda p, g: _rounded(p * decay) + (-eta) * g, params, updates)
        ax = jax.tree.map(
            lambda a, q: jnp.where(state.mu == 1.0, q, a + _rounded((q - a) * state.mu)),
            state.ax, new,
        )
        count = optax.safe_increment(state.count)
        t = count.astype(jnp.float32)
        next_eta = lr / jnp.exp(alpha * jnp.log1p(lambd * lr * t))
        next_mu = 1.0 / jnp.maximum(1.0, t - t0)
        out = jax.tree.map(lambda q, p: q - p, new, params)
        return out, ASGDState(count, next_eta, next_mu, ax)

    return optax.GradientTransformation(init_fn, update_fn)


def asgd(
    learning_rate: ScalarOrSchedule = 1e-2,
    lambd: float = 1e-4,
    alpha: float = 0.75,
    t0: float = 1e6,
    weight_decay: ArrayLike = 0.0,
    *,
    maximize: bool = False,
) -> optax.GradientTransformation:
    """Averaged SGD, numerically as ``torch.optim.ASGD``.

    Update rule (``g`` the gradient, negated when ``maximize``; ``t`` the step;
    ``eta_1 = lr``, ``mu_1 = 1``)::

        g = g + weight_decay * p
        p = p * (1 - lambd * eta_t) - eta_t * g
        ax = p if mu_t == 1 else ax + (p - ax) * mu_t
        eta_{t+1} = lr / (1 + lambd * lr * t)^alpha
        mu_{t+1} = 1 / max(1, t - t0)

    The averaged parameters ``ax`` live in the state; the parameters themselves follow
    plain SGD with the decaying step ``eta``.

    Example:
      >>> tx = asgd(0.1)
      >>> params = {"w": jnp.ones(2)}
      >>> updates, _ = tx.update({"w": jnp.ones(2)}, tx.init(params), params)
      >>> optax.apply_updates(params, updates)["w"]
      Array([0.89998996, 0.89998996], dtype=float32)
    """
    check_non_negative("learning_rate", learning_rate)
    check_non_negative("weight_decay", weight_decay)
    return optax.chain(
        maybe_negate(maximize),
        optax.add_decayed_weights(weight_decay),
        scale_by_torch_asgd(learning_rate, lambd, alpha, t0),
    )


# ---- RMSprop ---------------------------------------------------------------------------
class RMSpropState(NamedTuple):
    """State of :func:`scale_by_torch_rmsprop`; absent buffers are ``()``."""

    count: jax.Array  # int32: torch's state["step"]
    square_avg: optax.Updates  # running average of g^2
    momentum_buffer: optax.Updates  # with momentum; else ()
    grad_avg: optax.Updates  # running average of g (centered); else ()


def scale_by_torch_rmsprop(
    alpha: float = 0.99,
    eps: ArrayLike = 1e-8,
    momentum: ArrayLike = 0.0,
    *,
    centered: bool = False,
    use_momentum: bool | None = None,
) -> optax.GradientTransformation:
    """torch's RMSprop scaling.

    ``v = alpha * v + (1 - alpha) * g^2``; centered: ``m = lerp(m, g, 1 - alpha)`` and
    ``avg = sqrt(v - m^2) + eps``, else ``avg = sqrt(v) + eps``. The update is
    ``g / avg``, or with momentum ``buf = momentum * buf + g / avg`` (``buf_0 = 0``).
    ``use_momentum`` (default ``momentum > 0``) says whether the buffer exists.
    """

    one_minus_alpha = one_minus(alpha)
    if use_momentum is None:
        use_momentum = float(momentum) > 0.0

    def init_fn(params):
        return RMSpropState(jnp.zeros((), jnp.int32), _zeros(params),
                            _zeros(params) if use_momentum else (),
                            _zeros(params) if centered else ())

    def update_fn(updates, state, params=None):
        del params
        sq = jax.tree.map(lambda v, g: _rounded(v * alpha) + (one_minus_alpha * g) * g,
                          state.square_avg, updates)
        if centered:
            gavg = jax.tree.map(lambda m, g: lerp(m, g, one_minus_alpha),
                                state.grad_avg, updates)
            avg = jax.tree.map(lambda v, m: jnp.sqrt(v - m * m) + eps, sq, gavg)
        else:
            gavg = ()
            avg = jax.tree.map(lambda v: jnp.sqrt(v) + eps, sq)
        out = jax.tree.map(lambda g, a: g / a, updates, avg)
        if use_momentum:
            out = buf = jax.tree.map(lambda b, u: _rounded(b * momentum) + u,
                                     state.momentum_buffer, out)
        else:
            buf = ()
        return out, RMSpropState(optax.safe_increment(state.count), sq, buf, gavg)

    return optax.GradientTransformation(init_fn, update_fn)


def rmsprop(
    learning_rate: ScalarOrSchedule = 1e-2,
    alpha: float = 0.99,
    eps: ArrayLike = 1e-8,
    weight_decay: ArrayLike = 0.0,
    momentum: ArrayLike = 0.0,
    *,
    centered: bool = False,
    maximize: bool = False,
    use_momentum: bool | None = None,
) -> optax.GradientTransformation:
    """RMSprop, numerically as ``torch.optim.RMSprop``.

    Update rule (``g`` the gradient, negated when ``maximize``)::

        g = g + weight_decay * p
        v = alpha * v + (1 - alpha) * g^2
        m = alpha * m + (1 - alpha) * g;  avg = sqrt(v - m^2) + eps   # centered
        avg = sqrt(v) + eps                                            # otherwise
        buf = momentum * buf + g / avg;  p = p - lr * buf              # momentum > 0
        p = p - lr * g / avg                                           # otherwise

    Args:
      use_momentum: whether the momentum buffer exists; defaults to ``momentum > 0``
        (give it explicitly when ``momentum`` is traced).

    Example:
      >>> tx = rmsprop(0.01)
      >>> params = {"w": jnp.ones(2)}
      >>> updates, _ = tx.update({"w": jnp.ones(2)}, tx.init(params), params)
      >>> optax.apply_updates(params, updates)["w"]
      Array([0.90000004, 0.90000004], dtype=float32)
    """
    check_non_negative("learning_rate", learning_rate)
    check_non_negative("epsilon", eps)
    check_non_negative("momentum", momentum)
    check_non_negative("weight_decay", weight_decay)
    check_non_negative("alpha", alpha)
    return optax.chain(
        maybe_negate(maximize),
        optax.add_decayed_weights(weight_decay),
        scale_by_torch_rmsprop(alpha, eps, momentum, centered=centered,
                               use_momentum=use_momentum),
        scale_by_learning_rate(learning_rate),
    )


# ---- Rprop -----------------------------------------------------------------------------
class RpropState(NamedTuple):
    """State of :func:`scale_by_torch_rprop`."""

    count: jax.Array  # int32: torch's state["step"]
    prev: optax.Updates  # the previous (masked) gradient
    step_size: optax.Updates  # per-element step sizes


def scale_by_torch_rprop(
    learning_rate: ScalarOrSchedule = 1e-2,
    etas: tuple[ArrayLike, ArrayLike] = (0.5, 1.2),
    step_sizes: tuple[ArrayLike, ArrayLike] = (1e-6, 50.0),
) -> optax.GradientTransformation:
    """torch's resilient backpropagation; the update it returns is ``sign(g) * step``.

    Elementwise, with ``s = sign(g * prev)``: ``step = clip(step * (eta_plus if s > 0,
    eta_minus if s < 0, 1 if s == 0), *step_sizes)``; where ``s < 0`` the gradient is
    zeroed; ``prev = g``. ``step`` starts at the learning rate of the first step.
    """
    eta_minus, eta_plus = etas
    step_min, step_max = step_sizes

    def init_fn(params):
        if _is_concrete(learning_rate):
            return RpropState(jnp.zeros((), jnp.int32), _zeros(params),
                              _full(params, _at(learning_rate, jnp.zeros((), jnp.int32))))
        return RpropState(jnp.zeros((), jnp.int32), _zeros(params), _zeros(params))

    def factor(g, prev):
        s = jnp.sign(g * prev)
        s = jnp.where(s > 0, jnp.asarray(eta_plus, s.dtype), s)
        s = jnp.where(s < 0, jnp.asarray(eta_minus, s.dtype), s)
        return jnp.where(s == 0, jnp.ones((), s.dtype), s)

    def update_fn(updates, state, params=None):
        del params
        # torch fills the step sizes with the learning rate of the first step.
        first, lr = state.count == 0, _at(learning_rate, state.count)
        sizes = jax.tree.map(lambda z: jnp.where(first, lr.astype(z.dtype), z), state.step_size)
        signs = jax.tree.map(factor, updates, state.prev)
        sizes = jax.tree.map(lambda z, s: jnp.clip(z * s, step_min, step_max), sizes, signs)
        grads = jax.tree.map(
            lambda g, s: jnp.where(s == jnp.asarray(eta_minus, s.dtype), jnp.zeros_like(g), g),
            updates, signs,
        )
        out = jax.tree.map(lambda g, z: jnp.sign(g) * z, grads, sizes)
        return out, RpropState(optax.safe_increment(state.count), grads, sizes)

    return optax.GradientTransformation(init_fn, update_fn)


def _check_etas(etas: tuple[ArrayLike, ArrayLike]) -> None:
    if all(_is_concrete(e) for e in etas) and not 0.0 < float(etas[0]) < 1.0 < float(etas[1]):
        raise ConfigError(
            f"Invalid eta values: {etas[0]}, {etas[1]} (expected 0 < etas[0] < 1 < etas[1])"
        )


def rprop(
    learning_rate: ScalarOrSchedule = 1e-2,
    etas: tuple[ArrayLike, ArrayLike] = (0.5, 1.2),
    step_sizes: tuple[ArrayLike, ArrayLike] = (1e-6, 50.0),
    *,
    maximize: bool = False,
) -> optax.GradientTransformation:
    """Rprop, numerically as ``torch.optim.Rprop``.

    Update rule, elementwise (``g`` the gradient, negated when ``maximize``;
    ``step`` starts at ``learning_rate``, which is used for nothing else)::

        f = eta_plus if g * prev > 0, eta_minus if g * prev < 0, else 1
        step = clip(step * f, step_sizes[0], step_sizes[1])
        g = 0 where g * prev < 0
        p = p - sign(g) * step
        prev = g

    Example:
      >>> tx = rprop(0.1)
      >>> params = {"w": jnp.ones(2)}
      >>> updates, _ = tx.update({"w": -jnp.ones(2)}, tx.init(params), params)
      >>> optax.apply_updates(params, updates)["w"]
      Array([1.1, 1.1], dtype=float32)
    """
    check_non_negative("learning_rate", learning_rate)
    _check_etas(etas)
    return optax.chain(
        maybe_negate(maximize),
        scale_by_torch_rprop(learning_rate, etas, step_sizes),
        optax.scale(-1.0),
    )
