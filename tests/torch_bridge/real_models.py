"""Published architectures at toy sizes, for the torch_bridge zoo tests and benchmark.

Every case builds a Hugging Face, timm or torchvision model from a configuration, with
random weights (nothing is downloaded), every dropout and drop-path probability 0, and
its inputs. Both frameworks run the same training step on it:

- the objective is the model's own loss (Hugging Face heads given ``labels``) or a
  fixed weighted sum of its outputs (vision classifiers);
- one optimizer step, SGD with momentum and weight decay (torch.optim on the torch
  side, optax on the JAX side, the same update rule). Not Adam: its first step is
  ``lr * g / (|g| + eps)``, which turns gradients that are rounding noise (a key bias's
  gradient is zero in exact arithmetic, since softmax ignores a shift of every score in
  a row) into full ``+-lr`` steps of arbitrary sign, and amplifies the rounding error of
  gradients near ``eps``: torch's own float32 and float64 AdamW steps differ by more
  than 1e-5 on these models.

:func:`torch_step` runs it in torch eager; :func:`jax_step` builds the jitted JAX step
from ``torch_bridge.convert``. The tests compare the two; ``bench_zoo.py`` times them.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import torch
import vision

import torch_bridge

SGD = dict(lr=0.05, momentum=0.9, weight_decay=1e-4)
BATCH = 4


@dataclasses.dataclass(frozen=True)
class Case:
    """One architecture: a builder, its inputs and its objective.

    Attributes:
      name: the zoo's name for it.
      family: ``"hf"`` (transformers) or ``"vision"`` (timm, torchvision).
      build: a seeded model (train or eval mode is set by the caller).
      inputs: ``(args, kwargs)`` of torch tensors and flags for ``model(*args, **kwargs)``.
      objective: ``"loss"`` (the first output, the model's loss) or ``"sum"`` (a fixed
        weighted sum of every floating-point output).
    """

    name: str
    family: str
    build: Callable[[], torch.nn.Module]
    inputs: Callable[[], tuple[tuple, dict]]
    objective: str


def _generator(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _tokens(vocab: int, length: int, seed: int = 0) -> torch.Tensor:
    # Token ids from 3 up: 0-2 stay free for pad / bos / eos ids in the configs.
    return torch.randint(3, vocab, (BATCH, length), generator=_generator(seed))


def _images(size: int = 32, channels: int = 3) -> torch.Tensor:
    return torch.randn(BATCH, channels, size, size, generator=_generator(0))


def _seeded(make: Callable[[], torch.nn.Module]) -> Callable[[], torch.nn.Module]:
    def build() -> torch.nn.Module:
        torch.manual_seed(0)
        return make()

    return build


def _hf(model_class: str, config_class: str, **config: Any) -> Callable[[], torch.nn.Module]:
    def make() -> torch.nn.Module:
        transformers = _transformers()
        cfg = getattr(transformers, config_class)(**config)
        return getattr(transformers, model_class)(cfg)

    return _seeded(make)


def _transformers():
    vision.load()  # transformers imports torchvision when present
    import transformers

    return transformers


# Flags every Hugging Face call passes: plain tuples out, no key/value cache.
_DECODER_FLAGS = dict(use_cache=False, return_dict=False)
_ENCODER_FLAGS = dict(return_dict=False)
_TEXT = dict(vocab_size=64, pad_token_id=0, bos_token_id=1, eos_token_id=2)


def _lm_inputs(flags: dict) -> Callable[[], tuple[tuple, dict]]:
    def inputs() -> tuple[tuple, dict]:
        ids = _tokens(64, 8)
        return (), dict(input_ids=ids, labels=_tokens(64, 8, seed=1), **flags)

    return inputs


def _seq2seq_inputs() -> tuple[tuple, dict]:
    return (), dict(input_ids=_tokens(64, 8), labels=_tokens(64, 6, seed=1), **_DECODER_FLAGS)


def _image_label_inputs(size: int) -> Callable[[], tuple[tuple, dict]]:
    def inputs() -> tuple[tuple, dict]:
        labels = torch.randint(0, 10, (BATCH,), generator=_generator(1))
        return (), dict(pixel_values=_images(size), labels=labels, **_ENCODER_FLAGS)

    return inputs


def _whisper_inputs() -> tuple[tuple, dict]:
    features = torch.randn(BATCH, 8, 16, generator=_generator(0))
    return (), dict(input_features=features, labels=_tokens(64, 6, seed=1), **_DECODER_FLAGS)


def _wav2vec2_inputs() -> tuple[tuple, dict]:
    audio = torch.randn(BATCH, 400, generator=_generator(0))
    return (), dict(input_values=audio, **_ENCODER_FLAGS)


def _image_inputs(size: int) -> Callable[[], tuple[tuple, dict]]:
    return lambda: ((_images(size),), {})


_TINY_TRANSFORMER = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                         intermediate_size=64)
_NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)

HF_CASES = [
    Case("gpt2", "hf", _hf("GPT2LMHeadModel", "GPT2Config", n_positions=16, n_embd=32,
                           n_layer=1, n_head=4, resid_pdrop=0.0, embd_pdrop=0.0,
                           attn_pdrop=0.0, **_TEXT),
         _lm_inputs(_DECODER_FLAGS), "loss"),
    Case("llama", "hf", _hf("LlamaForCausalLM", "LlamaConfig", num_key_value_heads=2,
                            max_position_embeddings=16, **_TINY_TRANSFORMER, **_TEXT),
         _lm_inputs(_DECODER_FLAGS), "loss"),
    Case("opt", "hf", _hf("OPTForCausalLM", "OPTConfig", hidden_size=32, num_hidden_layers=1,
                          num_attention_heads=4, ffn_dim=64, word_embed_proj_dim=32,
                          max_position_embeddings=16, dropout=0.0, attention_dropout=0.0,
                          activation_dropout=0.0, layerdrop=0.0, **_TEXT),
         _lm_inputs(_DECODER_FLAGS), "loss"),
    # A mixture of experts: transformers' default experts sort the tokens by expert (topk,
    # histc) and run one grouped matmul over them (torch_bridge lowers it to ragged_dot).
    Case("mixtral", "hf", _hf("MixtralForCausalLM", "MixtralConfig", num_key_value_heads=2,
                              max_position_embeddings=16, num_local_experts=4,
                              num_experts_per_tok=2, router_aux_loss_coef=0.0,
                              **_TINY_TRANSFORMER, **_TEXT),
         _lm_inputs(_DECODER_FLAGS), "loss"),
    Case("bert", "hf", _hf("BertForMaskedLM", "BertConfig", max_position_embeddings=16,
                           **_TINY_TRANSFORMER, **_NO_DROPOUT, **_TEXT),
         _lm_inputs(_ENCODER_FLAGS), "loss"),
    Case("roberta", "hf", _hf("RobertaForMaskedLM", "RobertaConfig",
                              max_position_embeddings=16, **_TINY_TRANSFORMER, **_NO_DROPOUT,
                              **_TEXT),
         _lm_inputs(_ENCODER_FLAGS), "loss"),
    Case("modernbert", "hf", _hf("ModernBertForMaskedLM", "ModernBertConfig",
                                 max_position_embeddings=16, local_attention=4,
                                 global_attn_every_n_layers=1, cls_token_id=1,
                                 sep_token_id=2, **_TINY_TRANSFORMER, **_TEXT),
         _lm_inputs(_ENCODER_FLAGS), "loss"),
    Case("t5", "hf", _hf("T5ForConditionalGeneration", "T5Config", d_model=32, d_kv=8,
                         d_ff=64, num_layers=1, num_decoder_layers=1, num_heads=4,
                         relative_attention_num_buckets=8, dropout_rate=0.0,
                         decoder_start_token_id=0, **_TEXT),
         _seq2seq_inputs, "loss"),
    Case("bart", "hf", _hf("BartForConditionalGeneration", "BartConfig", d_model=32,
                           encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
                           decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
                           max_position_embeddings=16, dropout=0.0, attention_dropout=0.0,
                           activation_dropout=0.0, encoder_layerdrop=0.0,
                           decoder_layerdrop=0.0, decoder_start_token_id=2,
                           forced_eos_token_id=None, **_TEXT),
         _seq2seq_inputs, "loss"),
    Case("vit", "hf", _hf("ViTForImageClassification", "ViTConfig", image_size=16,
                          patch_size=4, num_labels=10, **_TINY_TRANSFORMER, **_NO_DROPOUT),
         _image_label_inputs(16), "loss"),
    Case("swin", "hf", _hf("SwinForImageClassification", "SwinConfig", image_size=16,
                           patch_size=2, embed_dim=16, depths=[1, 1], num_heads=[2, 4],
                           window_size=4, num_labels=10, hidden_dropout_prob=0.0,
                           attention_probs_dropout_prob=0.0, drop_path_rate=0.0),
         _image_label_inputs(16), "loss"),
    Case("whisper", "hf", _hf("WhisperForConditionalGeneration", "WhisperConfig",
                              num_mel_bins=8, d_model=32, encoder_layers=1, decoder_layers=1,
                              encoder_attention_heads=4, decoder_attention_heads=4,
                              encoder_ffn_dim=64, decoder_ffn_dim=64, max_source_positions=8,
                              max_target_positions=16, dropout=0.0, attention_dropout=0.0,
                              activation_dropout=0.0, encoder_layerdrop=0.0,
                              decoder_layerdrop=0.0, decoder_start_token_id=1,
                              suppress_tokens=None, begin_suppress_tokens=None, **_TEXT),
         _whisper_inputs, "loss"),
    Case("wav2vec2", "hf", _hf("Wav2Vec2ForCTC", "Wav2Vec2Config", vocab_size=16,
                               conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3),
                               num_conv_pos_embeddings=4, num_conv_pos_embedding_groups=2,
                               hidden_dropout=0.0, activation_dropout=0.0,
                               attention_dropout=0.0, feat_proj_dropout=0.0,
                               final_dropout=0.0, layerdrop=0.0, mask_time_prob=0.0,
                               apply_spec_augment=False, **_TINY_TRANSFORMER),
         _wav2vec2_inputs, "sum"),
]


def _torchvision(name: str, **kwargs: Any) -> Callable[[], torch.nn.Module]:
    def make() -> torch.nn.Module:
        torchvision, _ = vision.load()
        return getattr(torchvision.models, name)(weights=None, num_classes=10, **kwargs)

    return _seeded(make)


def _timm(name: str, **kwargs: Any) -> Callable[[], torch.nn.Module]:
    def make() -> torch.nn.Module:
        _, timm = vision.load()
        return timm.create_model(name, pretrained=False, num_classes=10, drop_rate=0.0,
                                 **kwargs)

    return _seeded(make)


def _small_densenet() -> torch.nn.Module:
    torchvision, _ = vision.load()
    return torchvision.models.DenseNet(growth_rate=8, block_config=(2, 2, 2, 2),
                                       num_init_features=16, bn_size=2, num_classes=10)


VISION_CASES = [
    Case("resnet18", "vision", _torchvision("resnet18"), _image_inputs(64), "sum"),
    Case("efficientnet_b0", "vision", _timm("efficientnet_b0", drop_path_rate=0.0),
         _image_inputs(64), "sum"),
    Case("mobilenet_v3_small", "vision", _torchvision("mobilenet_v3_small", dropout=0.0),
         _image_inputs(64), "sum"),
    Case("convnext_atto", "vision", _timm("convnext_atto", drop_path_rate=0.0),
         _image_inputs(64), "sum"),
    Case("densenet_small", "vision", _seeded(_small_densenet), _image_inputs(64), "sum"),
    Case("regnetx_002", "vision", _timm("regnetx_002", drop_path_rate=0.0), _image_inputs(64),
         "sum"),
    Case("vit_tiny", "vision", _timm("vit_tiny_patch16_224", img_size=32, patch_size=8,
                                     depth=2, drop_path_rate=0.0),
         _image_inputs(32), "sum"),
    Case("swin_tiny", "vision", _timm("swin_tiny_patch4_window7_224", img_size=32,
                                      window_size=4, embed_dim=16, depths=(1, 1),
                                      num_heads=(1, 2), drop_path_rate=0.0),
         _image_inputs(32), "sum"),
    Case("squeezenet1_1", "vision", _torchvision("squeezenet1_1", dropout=0.0),
         _image_inputs(64), "sum"),
    Case("shufflenet_v2", "vision", _torchvision("shufflenet_v2_x0_5"), _image_inputs(64), "sum"),
]

CASES = {case.name: case for case in HF_CASES + VISION_CASES}


# ---- the training step in both frameworks -------------------------------------------
def leaves(out: Any) -> list:
    """Every array of a (nested) output tuple, in order; None and flags dropped."""
    if isinstance(out, (tuple, list)):
        return [y for o in out for y in leaves(o)]
    if isinstance(out, dict):
        return [y for o in out.values() for y in leaves(o)]
    return [out] if hasattr(out, "shape") else []


def _is_float(y: Any) -> bool:
    if isinstance(y, torch.Tensor):
        return y.is_floating_point()
    return jnp.issubdtype(y.dtype, jnp.floating)


def _float_leaves(out: Any) -> list:
    return [y for y in leaves(out) if _is_float(y)]


def output_weights(shape: tuple[int, ...]) -> np.ndarray:
    """The fixed weights of an output of this shape in the ``"sum"`` objective."""
    return np.random.default_rng(1).standard_normal(shape).astype(np.float32)


def torch_objective(case: Case, out: Any) -> torch.Tensor:
    if case.objective == "loss":
        return out[0]
    return sum(torch.sum(y * torch.from_numpy(output_weights(tuple(y.shape))).to(y.dtype))
               for y in _float_leaves(out))


def jax_objective(case: Case, out: Any) -> jax.Array:
    if case.objective == "loss":
        return out[0]
    return sum(jnp.sum(y * output_weights(tuple(y.shape))) for y in _float_leaves(out))


def torch_optimizer(model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), **SGD)


def optax_optimizer() -> optax.GradientTransformation:
    """torch's SGD in optax: weight decay added to the gradient, then momentum."""
    return optax.chain(optax.add_decayed_weights(SGD["weight_decay"]),
                       optax.sgd(SGD["lr"], momentum=SGD["momentum"]))


@dataclasses.dataclass
class StepResult:
    """What one training step gives: outputs (before the update), the objective,
    parameter gradients, parameters after the update and buffers after the step,
    by torch's parameter and buffer names, as numpy arrays."""

    outputs: list[np.ndarray]
    objective: float
    grads: dict[str, np.ndarray]
    params: dict[str, np.ndarray]
    buffers: dict[str, np.ndarray]


def torch_step(case: Case, model: torch.nn.Module, *, train: bool,
               double: bool = False) -> StepResult:
    """One eager torch step on a copy of ``model`` (``model`` itself is left as it is),
    in float64 with ``double`` (weights and floating-point inputs)."""
    ref = copy.deepcopy(model).train(train)
    args, kwargs = case.inputs()
    if double:
        ref = ref.double()
        if getattr(getattr(ref, "config", None), "_experts_implementation", None):
            # torch's grouped matmul has no float64 kernel; the eager experts loop does
            # the same arithmetic one expert at a time.
            ref.config._experts_implementation = "eager"
        args = tuple(_to_double(x) for x in args)
        kwargs = {k: _to_double(v) for k, v in kwargs.items()}
    optimizer = torch_optimizer(ref)
    optimizer.zero_grad()
    out = ref(*args, **kwargs)
    objective = torch_objective(case, out)
    objective.backward()
    grads = {n: p.grad.numpy().copy() for n, p in ref.named_parameters() if p.grad is not None}
    optimizer.step()
    return StepResult(
        outputs=[y.detach().numpy() for y in _float_leaves(out)],
        objective=float(objective.detach()),
        grads=grads,
        params={n: p.detach().numpy() for n, p in ref.named_parameters()},
        buffers={n: b.numpy() for n, b in ref.named_buffers()},
    )


def _to_double(x: Any) -> Any:
    if isinstance(x, torch.Tensor) and x.is_floating_point():
        return x.double()
    return x


def jax_step(case: Case, model: torch.nn.Module, *, train: bool,
             compiler_options: dict | None = None, direct: bool = False
             ) -> tuple[Callable[[], StepResult], torch_bridge.Converted]:
    """The same step through ``torch_bridge.convert``, jitted: ``(run, converted)``.

    ``run()`` exports, compiles and runs the step on the converted state the first
    time; the result's arrays are numpy (a host sync point). ``direct``: the module is
    traced op by op where it can be (``Converted.run_direct``, as ``cstorch.compile``
    runs it), exported where that refuses.
    """
    conv = torch_bridge.convert(model, train=train)
    tx = optax_optimizer()
    args, kwargs = case.inputs()
    arrays = [x for x in (*args, *kwargs.values()) if isinstance(x, torch.Tensor)]
    flags = {k: v for k, v in kwargs.items() if not isinstance(v, torch.Tensor)}
    names = [k for k, v in kwargs.items() if isinstance(v, torch.Tensor)]
    n_args = len(args)
    key = jax.random.key(0)

    trainable = {n for n, p in model.named_parameters() if p.requires_grad}

    def step(params, frozen, buffers, opt_state, inputs):
        def objective(p):
            call = (tuple(inputs[:n_args]), {**dict(zip(names, inputs[n_args:])), **flags})
            traced = conv.run_direct({**p, **frozen}, buffers, *call) if direct else None
            if traced is not None:
                leaves, spec, new_buffers = traced
                out = torch.utils._pytree.tree_unflatten(leaves, spec)
            else:
                out, new_buffers = conv.run({**p, **frozen}, buffers, *call, key=key)
            return jax_objective(case, out), (out, new_buffers)

        (value, (out, new_buffers)), grads = jax.value_and_grad(objective, has_aux=True)(
            params)
        updates, _ = tx.update(grads, opt_state, params)
        new_params = {**optax.apply_updates(params, updates), **frozen}
        return _float_leaves(out), value, grads, new_params, new_buffers

    jitted = jax.jit(step)

    def run() -> StepResult:
        inputs = [jnp.asarray(x.numpy()) for x in arrays]
        params = {n: p for n, p in conv.params.items() if n in trainable}
        frozen = {n: p for n, p in conv.params.items() if n not in trainable}
        state = (params, frozen, conv.buffers, tx.init(params), inputs)
        compiled = jitted.lower(*state).compile(compiler_options)
        out, value, grads, params, buffers = jax.device_get(compiled(*state))
        return StepResult([np.asarray(y) for y in out], float(value), grads, params, buffers)

    return run, conv


__all__ = ["CASES", "Case", "HF_CASES", "StepResult", "VISION_CASES", "jax_step", "leaves",
           "torch_step"]
