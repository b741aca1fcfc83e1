"""A cstorch script in the style of Model Zoo's language models, run by
tests/cli/test_modelzoo_style.py under ``cerebrax run`` (traced, CPU or CSX) and with
``--eager`` (plain torch): it uses the names and patterns Model Zoo's models, layers and
data code use, and prints its losses and metrics as JSON."""

import argparse
import dataclasses
import json
import math

import torch

import cerebras.pytorch as cstorch
import cerebras.pytorch.distributed as dist
from cerebras.pytorch.core.annotation import AnnotationMode, create_annotation
from cerebras.pytorch.metrics import AccuracyMetric, PerplexityMetric
from cerebras.pytorch.utils.data.utils import infer_batch_size
from cerebras.pytorch.utils.kernel import kernel_annotater
from cerebras.pytorch.utils.num_kv_groups import groups_annotater

parser = argparse.ArgumentParser()
parser.add_argument("--backend", default="CPU")
parser.add_argument("--eager", action="store_true")
args = parser.parse_args()


@dataclasses.dataclass
class RegionConfig(AnnotationMode.Config):
    name: str


def region(name):
    return create_annotation(RegionConfig,
                             lambda c, bwd: AnnotationMode.Attribute("region", c.name),
                             name=name, enable_fwd=True, enable_bwd=True)


class Scale(torch.autograd.Function):
    """Reads current_pol() in forward and backward, as Model Zoo's rotary embedding."""

    @staticmethod
    def forward(ctx, x, s):
        ctx.save_for_backward(s)
        return x * s if cstorch.current_pol() >= 0 else x

    @staticmethod
    def backward(ctx, grad):
        (s,) = ctx.saved_tensors
        return (grad * s if cstorch.current_pol() >= 0 else grad), None


class TinyLM(torch.nn.Module):
    def __init__(self, vocab=32, width=16, metrics=True):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.proj = torch.nn.Linear(width, width)
        self.lm_head = torch.nn.Linear(width, vocab)
        self.using_kernel = kernel_annotater(None)
        self.using_groups = groups_annotater(None)
        self.accuracy = AccuracyMetric(name="eval/accuracy") if metrics else None
        self.perplexity = PerplexityMetric(name="eval/perplexity") if metrics else None

    @region("body")
    def body(self, h):
        attn = self.using_groups(self.using_kernel(torch.matmul))(h, h.transpose(-1, -2))
        h = torch.softmax(attn / math.sqrt(h.shape[-1]), -1) @ self.proj(h)
        return Scale.apply(torch.tanh(h), torch.tensor(0.5))

    def forward(self, data):
        h = self.body(self.embed(data["input_ids"]))
        if cstorch.use_cs() and cstorch.backends.csx.precision.optimization_level == 1:
            logits = cstorch.pol(bwd_level=0)(self.lm_head)(h)
        else:
            logits = self.lm_head(h)
        weights = data["attention_mask"].to(logits.dtype)
        per_token = torch.nn.functional.cross_entropy(
            logits.flatten(0, 1), data["labels"].long().flatten(), reduction="none")
        loss = (per_token * weights.flatten()).sum() / weights.sum()
        if not self.training and self.accuracy is not None:
            self.accuracy(labels=data["labels"].clone(), predictions=logits.argmax(-1).int(),
                          weights=weights.clone())
            self.perplexity(labels=data["labels"].clone(), loss=loss * weights.sum(),
                            weights=weights.clone())
        if cstorch.amp.is_cbfloat16_tensor(loss):
            loss = loss.float()
        return loss


torch.manual_seed(0)
gen = torch.Generator().manual_seed(1)


def batch():
    ids = torch.randint(0, 32, (4, 9), generator=gen, dtype=torch.int32)
    mask = torch.ones(4, 8, dtype=torch.int32)
    mask[2, 5:] = 0
    return {"input_ids": ids[:, :-1].contiguous(), "labels": ids[:, 1:].contiguous(),
            "attention_mask": mask}


train, evals = [batch() for _ in range(3)], [batch() for _ in range(2)]
assert infer_batch_size(train[0]) == 4 and dist.get_world_size() == 1
model = TinyLM(metrics=not args.eager)
out = {"train": [], "eval": []}
if args.eager:
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for b in train:
        loss = model(b)
        opt.zero_grad()
        loss.backward()
        opt.step()
        out["train"].append(loss.item())
    model.eval()
    hits = total = nll = 0.0
    with torch.no_grad():
        for b in evals:
            loss = model(b)
            out["eval"].append(loss.item())
            w = b["attention_mask"].float()
            h = model.body(model.embed(b["input_ids"]))
            hits += float(((model.lm_head(h).argmax(-1) == b["labels"]).float() * w).sum())
            total += float(w.sum())
            nll += loss.item() * float(w.sum())
    out["accuracy"], out["perplexity"] = hits / total, math.exp(nll / total)
else:
    if args.backend == "CSX":
        cstorch.amp.set_half_dtype("float32")
        backend = cstorch.backend("CSX", cluster_config=dist.ClusterConfig(num_csx=1))
    else:
        backend = cstorch.backend("CPU")
    compiled = cstorch.compile(model, backend)
    opt = cstorch.optim.SGD(compiled.parameters(), lr=0.5)

    @cstorch.trace
    def train_step(b):
        loss = compiled(b)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    @cstorch.trace
    @torch.no_grad()
    def eval_step(b):
        return compiled(b)

    @cstorch.step_closure
    def record(key, loss):
        out[key].append(loss.item())

    compiled.train()
    for b in train:
        record("train", train_step(b))
    compiled.eval()
    for b in evals:
        record("eval", eval_step(b))
    out["accuracy"], out["perplexity"] = float(model.accuracy), float(model.perplexity)
print("RESULT " + json.dumps(out))
