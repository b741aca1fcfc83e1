"""Whether this CPU's XLA rounds float16 arithmetic after every operation, as torch eager
does, and where it does not.

XLA's CPU compiler lets LLVM fuse a multiply and an add into one FMA instruction. On a
CPU without half-precision arithmetic, float16 operations are computed in float32 and
rounded one by one, so nothing fuses. On a CPU with AVX-512 FP16 (Sapphire Rapids and
later) they run natively, and ``a * b + c`` may round once where torch rounds twice.

Usage: ``python tools/half_arith_probe.py`` prints one line per pattern: how many of
2**16 random elements differ from torch eager's result, jitted as is, and with an
optimization barrier after the product.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import torch

N = 1 << 16


def _pairs():
    rng = np.random.default_rng(0)
    return [rng.standard_normal(N).astype(np.float16) for _ in range(3)]


PATTERNS = {
    "a * b + c": (lambda a, b, c: a * b + c, lambda m, c: m + c),
    "c - a * b": (lambda a, b, c: c - a * b, lambda m, c: c - m),
    "a * b - c": (lambda a, b, c: a * b - c, lambda m, c: m - c),
}


def main() -> None:
    a, b, c = _pairs()
    flags = sorted(set(re.findall(r"avx512_fp16|avx512f|amx_tile|amx_fp16|avx2",
                                  open("/proc/cpuinfo").read())))
    print(f"jax {jax.__version__}, torch {torch.__version__}, CPU flags: {flags}")
    ta, tb, tc = (torch.from_numpy(x) for x in (a, b, c))
    for name, (whole, after_product) in PATTERNS.items():
        want = whole(ta, tb, tc).numpy()
        plain = np.asarray(jax.jit(whole)(a, b, c))

        def barred(a, b, c, after_product=after_product):
            return after_product(jax.lax.optimization_barrier(a * b), c)

        barrier = np.asarray(jax.jit(barred)(a, b, c))
        f32 = np.asarray(jax.jit(lambda a, b, c, whole=whole: whole(
            *(x.astype(jnp.float32) for x in (a, b, c))).astype(jnp.float16))(a, b, c))
        print(f"{name}: differ from torch eager: jitted {int((plain != want).sum())}, "
              f"with a barrier {int((barrier != want).sum())}, one float32 rounding "
              f"{int((f32 != want).sum())} (of {N})")
    import torch_bridge  # after the plain JAX lines: they do not depend on it

    class MulAdd(torch.nn.Module):
        def forward(self, a, b, c):
            return a * b + c

    converted = torch_bridge.convert(MulAdd(), (ta, tb, tc))
    got = np.asarray(jax.jit(lambda *x: converted.apply({}, {}, *x)[0])(a, b, c))
    want = MulAdd()(ta, tb, tc).numpy()
    print(f"torch_bridge, a * b + c: differ from torch eager {int((got != want).sum())}")


if __name__ == "__main__":
    main()
