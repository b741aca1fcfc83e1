"""The active trace context satisfies its declared interface, ``ActiveContext``.

tests/test_layering.py checks the same by reading the code: each declared member is
defined by ``TraceContext``, and other modules use no other member.
"""

from __future__ import annotations

from helpers import batches, compiled_mlp, xent

import cerebrax as cstorch
from cerebrax._step import ActiveContext, TraceContext, active_context


def test_the_context_of_a_traced_step_is_an_active_context():
    model = compiled_mlp()
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)
    seen = []

    @cstorch.trace
    def step(x, y):
        seen.append(active_context())
        cstorch.backward(xent(model(x), y))
        optimizer.step()

    assert active_context() is None
    step(*batches(1)[0])
    (ctx,) = seen
    assert isinstance(ctx, TraceContext)
    assert isinstance(ctx, ActiveContext)
    assert active_context() is None


def test_an_object_missing_a_member_is_not_an_active_context():
    class Partial:
        def read(self, ref): ...
        def write(self, ref, value, *, skippable=True): ...

    assert not isinstance(Partial(), ActiveContext)
