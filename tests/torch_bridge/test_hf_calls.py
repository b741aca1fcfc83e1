"""Hugging Face models called the way their users call them, compared with torch eager.

``compiled(input_ids=x, labels=y)`` with transformers' default flags, inside a traced step
(``out.loss.backward()``) and outside one (``out.logits``); keyword inputs in
``torch_bridge.convert``; Python flags as constants of the graph; and the short error
for a forward that branches on a tensor's value. Models are built from tiny configs with
random weights (no download).
"""

from __future__ import annotations

import copy

import jax.numpy as jnp
import numpy as np
import pytest
import torch

import cerebrax as cstorch
import torch_bridge
from cerebrax.errors import ConfigError, TensorReadError

from vision import load
from helpers import CSTORCH_ADAMW

load()  # transformers imports torchvision: load it next to the CPU torch first
transformers = pytest.importorskip("transformers")

VOCAB, BATCH, SEQ, STEPS, LR = 97, 2, 8, 5, 1e-2


def gpt2():
    config = transformers.GPT2Config(
        n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=64,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    return transformers.AutoModelForCausalLM.from_config(config)


def llama():
    config = transformers.LlamaConfig(
        num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=2,
        num_key_value_heads=1, vocab_size=VOCAB, max_position_embeddings=64,
        bos_token_id=0, eos_token_id=0, pad_token_id=0)
    return transformers.AutoModelForCausalLM.from_config(config)


MODELS = {"gpt2": gpt2, "llama": llama}


def batches(n):
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, VOCAB, (BATCH, SEQ), generator=g) for _ in range(n)]


def assert_rel_close(actual, expected, rtol=1e-5, what=""):
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    scale = np.maximum(np.abs(expected).max(), 1e-12)
    err = np.abs(actual - expected).max() / scale
    assert err <= rtol, f"{what}: max difference {err:.2e} of the largest value"


@pytest.mark.parametrize("name", list(MODELS))
def test_training_step_with_default_flags_and_labels_equals_torch_eager(name):
    torch.manual_seed(0)
    model = MODELS[name]()
    assert model.training  # from_config leaves the model in train mode
    reference = copy.deepcopy(model)
    data = batches(STEPS)

    ref_opt = torch.optim.AdamW(reference.parameters(), lr=LR, **CSTORCH_ADAMW)
    expected = []
    for x in data:
        out = reference(input_ids=x, labels=x)
        out.loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        expected.append(out.loss.item())

    compiled = cstorch.compile(model, "CPU")
    optimizer = cstorch.optim.AdamW(model.parameters(), lr=LR)

    @cstorch.trace
    def step(x):
        out = compiled(input_ids=x, labels=x)  # HF's default flags: use_cache, return_dict
        assert isinstance(out, transformers.modeling_outputs.ModelOutput)
        assert isinstance(out.loss, torch_bridge.JaxTensor)
        assert out["logits"] is out.logits and out.logits.shape == (BATCH, SEQ, VOCAB)
        out.loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return out.loss

    losses = [float(step(x)) for x in data]
    assert_rel_close(losses, expected, what="losses")
    assert losses[-1] < losses[0]
    assert step.num_compiles == 1


@pytest.mark.parametrize("name", list(MODELS))
def test_inference_call_outside_a_step_equals_torch_eager(name):
    torch.manual_seed(0)
    model = MODELS[name]().eval()
    x = batches(1)[0]
    with torch.no_grad():
        expected = model(input_ids=x).logits.numpy()
    compiled = cstorch.compile(model, "CPU")

    out = compiled(input_ids=x)
    assert isinstance(out, transformers.modeling_outputs.ModelOutput)
    assert out.past_key_values is None  # exported with use_cache=False
    assert_rel_close(out.logits, expected, what="logits")

    out = compiled(input_ids=x, use_cache=False, return_dict=True)
    assert_rel_close(out["logits"], expected, what="logits with explicit flags")

    out = compiled(input_ids=x, labels=x)
    with torch.no_grad():
        loss = model(input_ids=x, labels=x).loss.item()
    assert_rel_close(out.loss, loss, what="loss")


def test_python_flags_are_constants_of_the_graph():
    torch.manual_seed(0)
    model = gpt2().eval()
    x = batches(1)[0]
    compiled = cstorch.compile(model, "CPU")
    as_tuple = compiled(input_ids=x, return_dict=False)
    assert isinstance(as_tuple, tuple)
    with torch.no_grad():
        expected = model(input_ids=x, return_dict=False)[0].numpy()
    assert_rel_close(as_tuple[0], expected, what="logits as a tuple")
    # An int flag selects the positions whose logits are computed.
    last = compiled(input_ids=x, logits_to_keep=1)
    assert last.logits.shape == (BATCH, 1, VOCAB)
    assert_rel_close(last.logits, expected[:, -1:], what="logits_to_keep=1")


def test_convert_takes_keyword_inputs():
    torch.manual_seed(0)
    model = gpt2().eval()
    x = batches(1)[0]
    with torch.no_grad():
        expected = model(input_ids=x, labels=x)
    converted = torch_bridge.convert(model, example_kwargs={"input_ids": x, "labels": x})
    assert len(converted.programs) == 1  # exported now, with use_cache=False
    out = converted(input_ids=x, labels=x)
    assert len(converted.programs) == 1  # the call used that export
    assert_rel_close(out.logits, expected.logits.numpy(), what="logits")
    assert_rel_close(out["loss"], expected.loss.item(), what="loss")

    # Positional and keyword inputs together, JAX arrays as inputs.
    out, _ = converted.apply(converted.params, converted.buffers, jnp.asarray(x.numpy()),
                             labels=jnp.asarray(x.numpy()))
    assert_rel_close(out.loss, expected.loss.item(), what="apply's loss")


def test_use_cache_true_names_the_flag():
    torch.manual_seed(0)
    compiled = cstorch.compile(gpt2().eval(), "CPU")
    with pytest.raises(ConfigError, match=r"DynamicCache") as info:
        compiled(input_ids=batches(1)[0], use_cache=True)
    assert "pass use_cache=False" in str(info.value)


class Branchy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        if x.sum() > 0:  # the branch torch.export cannot capture
            return self.fc(x)
        return -x


def test_data_dependent_branch_is_a_short_error(capfd):
    compiled = cstorch.compile(Branchy(), "CPU")
    with pytest.raises(TensorReadError) as info:
        compiled(torch.randn(2, 4))
    message = str(info.value)
    assert "Branchy" in message
    assert "if x.sum() > 0:" in message and "test_hf_calls.py" in message
    assert "torch.where" in message
    assert len(message.splitlines()) < 15
    printed = capfd.readouterr()
    assert "def forward" not in message + printed.out + printed.err  # no FX graph

    with pytest.raises(TensorReadError, match=r"if x.sum\(\) > 0:"):
        torch_bridge.convert(Branchy(), torch.randn(2, 4))


class Equal(torch.nn.Module):
    def forward(self, x):
        if torch.equal(x, x.flip(0)):  # a Python bool computed from the values
            return x
        return x * 2


def test_an_op_with_a_data_dependent_python_result_is_a_short_error(capfd):
    """torch.equal (and torch 2.11's quantile, which calls it) returns a Python value
    computed from the values: the error names the op, the line and the fix."""
    with pytest.raises(TensorReadError) as info:
        cstorch.compile(Equal(), "CPU")(torch.randn(2, 4))
    message = str(info.value)
    assert "Equal" in message and "aten.equal" in message
    assert "if torch.equal(x, x.flip(0)):" in message and "test_hf_calls.py" in message
    assert "torch.where" in message and len(message.splitlines()) < 15
    printed = capfd.readouterr()
    assert "def forward" not in message + printed.out + printed.err  # no FX graph
