"""A compiled torch module's own parameters stand for its compiled parameters.

``cstorch.compile`` links each ``nn.Parameter`` to its compiled parameter
(``cerebrax._step.alias_parameter``): optimizers take the module's parameters, and torch
code in a traced step reads their values and sets their ``.grad``. The links hold for
several compiled models at once, follow the last compile of a module, go with
``cstorch.reset()``, and keep the compiled model alive while the module's parameters live.
"""

from __future__ import annotations

import copy
import gc
import weakref

import numpy as np
import torch

import cerebrax as cstorch
from cerebrax.models import resolve_parameter


def _linear(seed: int) -> torch.nn.Linear:
    torch.manual_seed(seed)
    return torch.nn.Linear(4, 3)


def test_each_module_s_parameters_resolve_to_its_own_compiled_model():
    a, b = _linear(0), _linear(1)
    compiled_a, compiled_b = cstorch.compile(a, "CPU"), cstorch.compile(b, "CPU")
    for module, compiled in ((a, compiled_a), (b, compiled_b)):
        named = dict(compiled.named_parameters())
        for name, original in module.named_parameters():
            assert resolve_parameter(original) is named[name]
    optimizer = cstorch.optim.SGD([*a.parameters(), *b.parameters()], lr=0.1)
    assert optimizer.param_groups[0]["params"] == [*compiled_a.parameters(),
                                                   *compiled_b.parameters()]


def test_compiling_a_module_again_links_its_parameters_to_the_new_model():
    module = _linear(0)
    first = cstorch.compile(module, "CPU")
    second = cstorch.compile(module, "CPU")
    assert resolve_parameter(module.weight) is dict(second.named_parameters())["weight"]
    assert resolve_parameter(module.weight) is not dict(first.named_parameters())["weight"]


def test_reset_forgets_the_links_and_a_new_compile_makes_them_again():
    module = _linear(0)
    cstorch.compile(module, "CPU")
    assert resolve_parameter(module.weight) is not None
    cstorch.reset()
    assert resolve_parameter(module.weight) is None
    compiled = cstorch.compile(module, "CPU")
    assert resolve_parameter(module.weight) is dict(compiled.named_parameters())["weight"]


def test_the_links_keep_a_dropped_compiled_model_alive():
    module = _linear(0)
    compiled = weakref.ref(cstorch.compile(module, "CPU"))
    gc.collect()
    assert compiled() is not None
    optimizer = cstorch.optim.SGD(module.parameters(), lr=0.1)
    assert optimizer.param_groups[0]["params"] == compiled().parameters()


def test_torch_code_in_a_step_sees_the_gradients_of_the_model_it_calls():
    """Two compiled models, a step that calls one: its torch parameters hold their
    gradients after loss.backward(), their hooks applied; the other model's do not."""
    a, b = _linear(0), _linear(1)
    reference = copy.deepcopy(b)
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    reference.weight.register_hook(lambda g: g * 2)
    torch.nn.functional.cross_entropy(reference(x), y).backward()

    cstorch.compile(a, "CPU")
    compiled_b = cstorch.compile(b, "CPU")
    b.weight.register_hook(lambda g: g * 2)
    optimizer = cstorch.optim.SGD(b.parameters(), lr=1.0)
    seen = {}

    @cstorch.trace
    def step(x, y):
        torch.nn.functional.cross_entropy(compiled_b(x), y).backward()
        seen["a"], seen["b"] = a.weight.grad, type(b.weight.grad)
        optimizer.step()

    before = b.weight.detach().clone()
    step(x, y)
    assert seen["a"] is None and issubclass(seen["b"], torch.Tensor)
    np.testing.assert_allclose(before - b.state_dict()["weight"], reference.weight.grad,
                               rtol=1e-5, atol=1e-7)
