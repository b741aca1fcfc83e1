"""A cstorch metric updated inside a compiled torch module's ``forward`` (Model Zoo's
evaluation pattern) on the emulated wafer's layouts: replicas, weight streaming and a
layer pipeline give the single-device evaluation's losses, accuracy and update count.

In a pipeline or weight streaming, the last stage runs inside the device mesh's
``shard_map``; the metric's arguments leave it with the model's outputs and the update
is made outside (it once failed there, on the mesh's axis types).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import cerebrax as cstorch

ClusterConfig = cstorch.distributed.ClusterConfig
LAYOUTS = {
    "single": None,
    "replica8": dict(execution_mode="replica", num_replicas=8),
    "ws8": dict(execution_mode="weight_streaming", max_wgt_servers=8),
    "pipeline2": dict(execution_mode="pipeline", num_stages=2),
}


class _Scored(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([torch.nn.Linear(6, 6) for _ in range(4)])
        self.head = torch.nn.Linear(6, 3)
        self.accuracy = cstorch.metrics.AccuracyMetric("accuracy")

    def forward(self, x, labels):
        for block in self.blocks:
            x = torch.tanh(block(x))
        out = self.head(x)
        if not self.training:
            self.accuracy(labels=labels.clone(), predictions=out.argmax(-1).int())
        return out


def _evaluate(layout: str) -> tuple[list[float], float, int]:
    cstorch.reset()
    cstorch.amp.set_half_dtype("float32")
    torch.manual_seed(0)
    model = _Scored()
    fields = LAYOUTS[layout]
    backend = cstorch.backend("CSX", cluster_config=ClusterConfig(**fields) if fields else None)
    compiled = cstorch.compile(model, backend)
    compiled.eval()

    @cstorch.trace
    def evaluation_step(x, labels):
        return torch.nn.functional.cross_entropy(compiled(x, labels), labels)

    g = torch.Generator().manual_seed(0)
    data = [(torch.randn(32, 6, generator=g), torch.randint(0, 3, (32,), generator=g))
            for _ in range(3)]
    with torch.no_grad():
        losses = [float(evaluation_step(x, y)) for x, y in data]
    return losses, float(model.accuracy), model.accuracy.num_updates


@pytest.mark.parametrize("layout", ["replica8", "ws8", "pipeline2"])
def test_a_metric_in_forward_updates_on_every_layout(layout):
    want_losses, want_accuracy, want_updates = _evaluate("single")
    losses, accuracy, updates = _evaluate(layout)
    np.testing.assert_allclose(losses, want_losses, rtol=1e-6)
    assert accuracy == want_accuracy and updates == want_updates == 3
