"""Recurrent layers (LSTM, GRU, Elman RNN) as one ``lax.scan`` per layer and direction.

The input projection of every time step is one matrix product before the scan; the scan
body holds only the recurrent product and the gate arithmetic, so the compiled program
has the same size for any sequence length.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch
from jax import lax

from ._registry import lowering

aten = torch.ops.aten


def _rnn_is_random(x, hx, params, has_biases, num_layers, dropout, train, *rest):
    return bool(train) and dropout > 0 and num_layers > 1


def _input_projection(x, w_ih, b):
    gx = jnp.matmul(x, w_ih.T)
    return gx if b is None else gx + b


def _unpack(w, has_biases):
    w_ih, w_hh = w[0], w[1]
    b_ih, b_hh = (w[2], w[3]) if has_biases else (None, None)
    w_hr = w[4 if has_biases else 2] if len(w) > (4 if has_biases else 2) else None
    return w_ih, w_hh, b_ih, b_hh, w_hr


def _lstm_layer(x, state0, w, has_biases, reverse):
    w_ih, w_hh, b_ih, b_hh, w_hr = _unpack(w, has_biases)
    b = None if b_ih is None else b_ih + b_hh
    gx = _input_projection(x, w_ih, b)
    w_hh_t = w_hh.T
    w_hr_t = None if w_hr is None else w_hr.T

    def step(carry, g):
        h, c = carry
        i, f, gg, o = jnp.split(g + jnp.matmul(h, w_hh_t), 4, axis=-1)
        c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(gg)
        h = jax.nn.sigmoid(o) * jnp.tanh(c)
        if w_hr_t is not None:
            h = jnp.matmul(h, w_hr_t)
        return (h, c), h

    (h, c), ys = lax.scan(step, state0, gx, reverse=reverse)
    return ys, (h, c)


def _gru_layer(x, state0, w, has_biases, reverse):
    w_ih, w_hh, b_ih, b_hh, _ = _unpack(w, has_biases)
    gx = _input_projection(x, w_ih, b_ih)
    w_hh_t = w_hh.T

    def step(carry, g):
        (h,) = carry
        gh = jnp.matmul(h, w_hh_t)
        if b_hh is not None:
            gh = gh + b_hh
        xr, xz, xn = jnp.split(g, 3, axis=-1)
        hr, hz, hn = jnp.split(gh, 3, axis=-1)
        r = jax.nn.sigmoid(xr + hr)
        z = jax.nn.sigmoid(xz + hz)
        n = jnp.tanh(xn + r * hn)
        h = (1.0 - z) * n + z * h
        return (h,), h

    (h,), ys = lax.scan(step, state0, gx, reverse=reverse)
    return ys, (h,)


def _elman_layer(activation):
    def layer(x, state0, w, has_biases, reverse):
        w_ih, w_hh, b_ih, b_hh, _ = _unpack(w, has_biases)
        b = None if b_ih is None else b_ih + b_hh
        gx = _input_projection(x, w_ih, b)
        w_hh_t = w_hh.T

        def step(carry, g):
            (h,) = carry
            h = activation(g + jnp.matmul(h, w_hh_t))
            return (h,), h

        (h,), ys = lax.scan(step, state0, gx, reverse=reverse)
        return ys, (h,)
    return layer


def _run(layer_fn, key, x, states, params, has_biases, num_layers, dropout, train,
         bidirectional, batch_first):
    if batch_first:
        x = jnp.swapaxes(x, 0, 1)
    dirs = 2 if bidirectional else 1
    group = len(params) // (num_layers * dirs)
    finals = []
    for layer in range(num_layers):
        outs = []
        for d in range(dirs):
            i = layer * dirs + d
            out, final = layer_fn(x, tuple(s[i] for s in states),
                                  params[i * group:(i + 1) * group], has_biases, d == 1)
            outs.append(out)
            finals.append(final)
        x = jnp.concatenate(outs, axis=-1) if dirs == 2 else outs[0]
        if key is not None and layer < num_layers - 1:
            keep = jax.random.bernoulli(jax.random.fold_in(key, layer), 1.0 - dropout, x.shape)
            x = jnp.where(keep, x / (1.0 - dropout), jnp.zeros((), x.dtype))
    if batch_first:
        x = jnp.swapaxes(x, 0, 1)
    stacked = tuple(jnp.stack([f[j] for f in finals]) for j in range(len(states)))
    return (x, *stacked)


@lowering(aten.lstm.input, random=_rnn_is_random)
def lstm(key, x, hx, params, has_biases, num_layers, dropout, train, bidirectional,
         batch_first):
    return _run(_lstm_layer, key, x, tuple(hx), params, has_biases, num_layers, dropout,
                train, bidirectional, batch_first)


@lowering(aten.gru.input, random=_rnn_is_random)
def gru(key, x, hx, params, has_biases, num_layers, dropout, train, bidirectional,
        batch_first):
    return _run(_gru_layer, key, x, (hx,), params, has_biases, num_layers, dropout, train,
                bidirectional, batch_first)


@lowering(aten.rnn_tanh.input, random=_rnn_is_random)
def rnn_tanh(key, x, hx, params, has_biases, num_layers, dropout, train, bidirectional,
             batch_first):
    return _run(_elman_layer(jnp.tanh), key, x, (hx,), params, has_biases, num_layers,
                dropout, train, bidirectional, batch_first)


@lowering(aten.rnn_relu.input, random=_rnn_is_random)
def rnn_relu(key, x, hx, params, has_biases, num_layers, dropout, train, bidirectional,
             batch_first):
    return _run(_elman_layer(jax.nn.relu), key, x, (hx,), params, has_biases, num_layers,
                dropout, train, bidirectional, batch_first)
