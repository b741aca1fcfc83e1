"""A tiny classifier in the shape of a Model Zoo model, and its data processor.

``TinyModel.forward(data)`` takes the batch ``(inputs, labels)`` and returns the loss;
in eval mode it updates its accuracy metric (``compute_eval_metrics``), as Model Zoo's
models do. ``TinyDataProcessor`` makes a torch DataLoader of random, seeded data.
"""

from typing import Literal

import torch
import torch.nn.functional as F

import cerebras.pytorch as cstorch
from cerebras.modelzoo.config import BaseConfig

NUM_FEATURES = 8
NUM_CLASSES = 4


class TinyModelConfig(BaseConfig):
    name: Literal["tiny_mlp", "tiny_mlp_unused"]
    hidden: int = 16
    compute_eval_metrics: bool = False


class TinyModel(torch.nn.Module):
    def __init__(self, config: TinyModelConfig):
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(NUM_FEATURES, config.hidden),
            torch.nn.ReLU(),
            torch.nn.Linear(config.hidden, NUM_CLASSES),
        )
        self.accuracy = None
        if config.compute_eval_metrics:
            self.accuracy = cstorch.metrics.AccuracyMetric(name="accuracy")

    def forward(self, data):
        inputs, labels = data
        logits = self.net(inputs)
        if not self.training and self.accuracy is not None:
            self.accuracy(labels=labels.clone(), predictions=logits.argmax(-1).int())
        return F.cross_entropy(logits, labels)


class TinyDataConfig(BaseConfig):
    data_processor: Literal["TinyDataProcessor"]
    batch_size: int
    num_batches: int = 6
    split: Literal["train", "val"] = "train"


class TinyDataProcessor:
    def __init__(self, config: TinyDataConfig):
        self.config = config

    def create_dataloader(self) -> torch.utils.data.DataLoader:
        """Seeded random inputs, labelled by a fixed random linear map (learnable)."""
        n = self.config.num_batches * self.config.batch_size
        teacher = torch.randn(NUM_FEATURES, NUM_CLASSES, generator=torch.Generator().manual_seed(7))
        seed = 1 if self.config.split == "train" else 2
        inputs = torch.randn(n, NUM_FEATURES, generator=torch.Generator().manual_seed(seed))
        labels = (inputs @ teacher).argmax(-1)
        return torch.utils.data.DataLoader(
            torch.utils.data.TensorDataset(inputs, labels),
            batch_size=self.config.batch_size,
            shuffle=False,
            drop_last=True,
        )
