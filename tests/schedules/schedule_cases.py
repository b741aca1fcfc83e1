"""Float64 references and the table of schedule cases, shared by the schedule tests.

``REFERENCES[cls](t, **kwargs)`` is the float64 NumPy closed form of the scheduler class
``cls`` (called with that class's arguments), ``FACTORIES[cls](**kwargs)`` the matching
pure ``cerebrax.schedules`` function, and ``CASES[name] = (cls, arguments(H))`` a setting
of each schedule as a function of a horizon ``H`` that shows every phase of it.
"""

from __future__ import annotations

import math

import numpy as np

from cerebrax import schedules

INT32_MAX = 2**31 - 1


def assert_lrs(got, expected, rtol=1e-6, atol=1e-12):
    np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(expected, np.float64),
                               rtol=rtol, atol=atol)


# ---- float64 references, keyed by class and called with the class's arguments ----------
def _count(t, milestones):
    return np.sum(np.asarray(t)[..., None] >= np.asarray(milestones, np.float64), axis=-1)


def ref_polynomial(t, initial_learning_rate, end_learning_rate, total_iters, power=1.0,
                   cycle=False):
    frac = 1.0 - np.minimum(t, total_iters) / total_iters
    return np.where(t >= total_iters, end_learning_rate,
                    end_learning_rate + (initial_learning_rate - end_learning_rate) * frac**power)


def ref_exponential(t, initial_learning_rate, total_iters, decay_rate, staircase=False):
    x = t / total_iters
    return initial_learning_rate * decay_rate ** (np.floor(x) if staircase else x)


def ref_inverse_time(t, initial_learning_rate, step_exponent, total_iters, decay_rate,
                     staircase=False):
    x = t**step_exponent / total_iters
    return initial_learning_rate / (1.0 + decay_rate * (np.floor(x) if staircase else x))


def ref_cosine_annealing(t, initial_learning_rate, T_max, eta_min=0.0):  # noqa: N803
    return eta_min + (initial_learning_rate - eta_min) * 0.5 * (1 + np.cos(np.pi * t / T_max))


def ref_warm_restarts(t, initial_learning_rate, T_0, T_mult=1, eta_min=0.0):  # noqa: N803
    out = []
    for step in np.asarray(t, np.int64).ravel().tolist():
        if T_mult == 1:
            t_cur, t_i = step % T_0, T_0
        else:
            start, t_i = 0, T_0
            while step >= start + t_i:
                start, t_i = start + t_i, t_i * T_mult
            t_cur = step - start
        out.append(eta_min + (initial_learning_rate - eta_min)
                   * 0.5 * (1 + math.cos(math.pi * t_cur / t_i)))
    return np.reshape(out, np.shape(t))


def ref_lambda(t, initial_learning_rate, lr_lambda=None):
    if lr_lambda is None:  # cstorch's placeholders
        return initial_learning_rate**2 * (t / 30) * 0.95**t
    return initial_learning_rate * lr_lambda(t)


def ref_cyclic(t, base_lr, max_lr, step_size_up=2000, step_size_down=None, mode="triangular",
               gamma=1.0, scale_mode="cycle"):
    down = step_size_up if step_size_down is None else step_size_down
    total = step_size_up + down
    ratio = step_size_up / total
    cycle = np.floor(1 + t / total)
    x = 1.0 + t / total - cycle
    rise = np.where(x <= ratio, x / ratio, (x - 1) / (ratio - 1))
    scale = {"triangular": lambda: 1.0, "triangular2": lambda: 0.5 ** (cycle - 1),
             "exp_range": lambda: gamma**t}[mode]()
    return base_lr + (max_lr - base_lr) * rise * scale


def ref_one_cycle(t, initial_learning_rate, max_lr, total_steps=1000, pct_start=0.3,
                  final_div_factor=1e4, three_phase=False, anneal_strategy="cos"):
    low = initial_learning_rate / final_div_factor
    if three_phase:
        ends = [pct_start * total_steps - 1, 2 * pct_start * total_steps - 2, total_steps - 1]
        values = [initial_learning_rate, max_lr, initial_learning_rate, low]
    else:
        ends = [pct_start * total_steps - 1, total_steps - 1]
        values = [initial_learning_rate, max_lr, low]

    def anneal(start, end, pct):
        if anneal_strategy == "cos":
            return end + (start - end) / 2.0 * (np.cos(np.pi * pct) + 1)
        return (end - start) * pct + start

    lr, begin = anneal(values[0], values[1], t / ends[0]), 0.0
    for i in range(1, len(ends)):
        begin = ends[i - 1]
        lr = np.where(t > begin, anneal(values[i], values[i + 1],
                                        (t - begin) / (ends[i] - begin)), lr)
    return lr


REFERENCES = {
    "ConstantLR": lambda t, learning_rate, total_iters=None: np.full(np.shape(t), learning_rate),
    "PolynomialLR": ref_polynomial,
    "LinearLR": ref_polynomial,
    "ExponentialLR": ref_exponential,
    "InverseExponentialTimeDecayLR": ref_inverse_time,
    "InverseSquareRootDecayLR": lambda t, initial_learning_rate=1.0, scale=1.0, warmup_steps=1:
        initial_learning_rate * scale / np.sqrt(np.maximum(warmup_steps, t)),
    "CosineDecayLR": lambda t, initial_learning_rate, end_learning_rate, total_iters:
        ref_cosine_annealing(np.minimum(t, total_iters), initial_learning_rate, total_iters,
                             end_learning_rate),
    "CosineAnnealingLR": ref_cosine_annealing,
    "CosineAnnealingWarmRestarts": ref_warm_restarts,
    "StepLR": lambda t, initial_learning_rate, step_size, gamma:
        initial_learning_rate * gamma ** np.floor(t / step_size),
    "MultiStepLR": lambda t, initial_learning_rate, gamma, milestones:
        initial_learning_rate * gamma ** _count(t, milestones),
    "MultiplicativeLR": lambda t, initial_learning_rate, coefficient:
        initial_learning_rate * coefficient**t,
    "PiecewiseConstantLR": lambda t, learning_rates, milestones:
        np.asarray(learning_rates)[_count(t, milestones)],
    "LambdaLR": ref_lambda,
    "CyclicLR": ref_cyclic,
    "OneCycleLR": ref_one_cycle,
}

FACTORIES = {
    "ConstantLR": lambda learning_rate, total_iters=None: schedules.constant(learning_rate),
    "PolynomialLR": schedules.polynomial,
    "LinearLR": schedules.linear,
    "ExponentialLR": schedules.exponential,
    "InverseExponentialTimeDecayLR": schedules.inverse_exponential_time_decay,
    "InverseSquareRootDecayLR": schedules.inverse_square_root_decay,
    "CosineDecayLR": schedules.cosine_decay,
    "CosineAnnealingLR": schedules.cosine_annealing,
    "CosineAnnealingWarmRestarts": schedules.cosine_annealing_warm_restarts,
    "StepLR": schedules.step_decay,
    "MultiStepLR": schedules.multi_step,
    "MultiplicativeLR": schedules.multiplicative,
    "PiecewiseConstantLR": schedules.piecewise_constant,
    "LambdaLR": schedules.lambda_schedule,
    "CyclicLR": schedules.cyclic,
    "OneCycleLR": schedules.one_cycle,
}


def _n(x):
    return max(1, int(x))


def _warmup_lambda(h):
    # Plain arithmetic: the same lambda runs on int32 tracers and float64 NumPy arrays.
    return lambda t: (t + 1.0) / (t + 1.0 + h / 10)


# (class, arguments as a function of the horizon H): H = 2000 for the closed forms,
# H = 40 for the traced step, so both see every phase of each schedule.
CASES = {
    "constant": ("ConstantLR", lambda h: dict(learning_rate=0.05, total_iters=h)),
    "polynomial": ("PolynomialLR", lambda h: dict(
        initial_learning_rate=0.1, end_learning_rate=0.001, total_iters=3 * h // 4, power=2.0)),
    "polynomial_warmup": ("PolynomialLR", lambda h: dict(
        initial_learning_rate=0.0, end_learning_rate=0.1, total_iters=h // 2, power=0.5)),
    "linear_decay_to_zero": ("LinearLR", lambda h: dict(
        initial_learning_rate=0.1, end_learning_rate=0.0, total_iters=h // 2)),
    "linear_warmup_from_zero": ("LinearLR", lambda h: dict(
        initial_learning_rate=0.0, end_learning_rate=0.1, total_iters=h // 2)),
    "exponential": ("ExponentialLR", lambda h: dict(
        initial_learning_rate=0.1, total_iters=_n(h / 20), decay_rate=0.5)),
    "exponential_staircase": ("ExponentialLR", lambda h: dict(
        initial_learning_rate=0.1, total_iters=_n(h / 20), decay_rate=0.5, staircase=True)),
    "inverse_time": ("InverseExponentialTimeDecayLR", lambda h: dict(
        initial_learning_rate=0.1, step_exponent=1, total_iters=_n(h / 20), decay_rate=0.5)),
    "inverse_time_staircase": ("InverseExponentialTimeDecayLR", lambda h: dict(
        initial_learning_rate=0.1, step_exponent=1, total_iters=_n(h / 20), decay_rate=0.5,
        staircase=True)),
    "inverse_time_squared": ("InverseExponentialTimeDecayLR", lambda h: dict(
        initial_learning_rate=0.1, step_exponent=2, total_iters=h * h // 100, decay_rate=1.0)),
    "inverse_square_root": ("InverseSquareRootDecayLR", lambda h: dict(
        initial_learning_rate=0.1, scale=2.0, warmup_steps=_n(h / 20))),
    "cosine_decay": ("CosineDecayLR", lambda h: dict(
        initial_learning_rate=0.1, end_learning_rate=0.001, total_iters=3 * h // 4)),
    "cosine_decay_warmup_from_zero": ("CosineDecayLR", lambda h: dict(
        initial_learning_rate=0.0, end_learning_rate=0.1, total_iters=h // 2)),
    "cosine_annealing": ("CosineAnnealingLR", lambda h: dict(
        initial_learning_rate=0.1, T_max=_n(h / 7), eta_min=0.0)),
    "warm_restarts": ("CosineAnnealingWarmRestarts", lambda h: dict(
        initial_learning_rate=0.1, T_0=_n(h / 7), T_mult=1, eta_min=0.001)),
    "warm_restarts_doubling": ("CosineAnnealingWarmRestarts", lambda h: dict(
        initial_learning_rate=0.1, T_0=_n(h / 40), T_mult=2, eta_min=0.0)),
    "warm_restarts_tripling": ("CosineAnnealingWarmRestarts", lambda h: dict(
        initial_learning_rate=0.1, T_0=_n(h / 100), T_mult=3, eta_min=0.001)),
    "step": ("StepLR", lambda h: dict(initial_learning_rate=0.1, step_size=_n(h / 7), gamma=0.5)),
    "multi_step": ("MultiStepLR", lambda h: dict(
        initial_learning_rate=0.1, gamma=0.1, milestones=[h // 7, h // 3, h // 3, 3 * h // 4])),
    "multiplicative": ("MultiplicativeLR", lambda h: dict(
        initial_learning_rate=0.1, coefficient=1 - 4 / h)),
    "piecewise_constant": ("PiecewiseConstantLR", lambda h: dict(
        learning_rates=[0.1, 0.05, 0.01], milestones=[h // 4, 3 * h // 5])),
    "lambda": ("LambdaLR", lambda h: dict(
        initial_learning_rate=0.1, lr_lambda=_warmup_lambda(h))),
    "lambda_placeholders": ("LambdaLR", lambda h: dict(initial_learning_rate=0.5)),
    "cyclic_triangular": ("CyclicLR", lambda h: dict(
        base_lr=0.01, max_lr=0.1, step_size_up=_n(3 * h / 40), step_size_down=_n(h / 20))),
    "cyclic_triangular2": ("CyclicLR", lambda h: dict(
        base_lr=0.01, max_lr=0.1, step_size_up=_n(h / 10), mode="triangular2")),
    "cyclic_exp_range": ("CyclicLR", lambda h: dict(
        base_lr=0.01, max_lr=0.1, step_size_up=_n(h / 20), step_size_down=_n(3 * h / 40),
        mode="exp_range", gamma=1 - 1 / h)),
    "one_cycle_cos": ("OneCycleLR", lambda h: dict(
        initial_learning_rate=0.004, max_lr=0.1, total_steps=h, pct_start=0.3)),
    "one_cycle_linear_past_the_end": ("OneCycleLR", lambda h: dict(
        initial_learning_rate=0.004, max_lr=0.1, total_steps=3 * h // 4, pct_start=0.3,
        anneal_strategy="linear")),
    "one_cycle_three_phase": ("OneCycleLR", lambda h: dict(
        initial_learning_rate=0.004, max_lr=0.1, total_steps=h, pct_start=0.25,
        final_div_factor=100.0, three_phase=True)),
}
