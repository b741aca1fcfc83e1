"""What seed 001's scripts leave to the user, filled in once for the tests that run them:
the "user defined model", and a torch DataLoader over synthetic data (no download)."""

from __future__ import annotations

import torch

FEATURES, CLASSES, BATCH = 20, 4, 16


class Classifier(torch.nn.Module):
    """The "user defined model": a small MLP with LayerNorm."""

    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(FEATURES, 64)
        self.norm = torch.nn.LayerNorm(64)
        self.fc2 = torch.nn.Linear(64, CLASSES)

    def forward(self, x):
        return self.fc2(self.norm(torch.relu(self.fc1(x))))


def synthetic_data(n, seed=0):
    """Points labelled by a fixed random linear teacher (learnable; no download)."""
    x = torch.randn(n, FEATURES, generator=torch.Generator().manual_seed(seed))
    teacher = torch.randn(FEATURES, CLASSES, generator=torch.Generator().manual_seed(99))
    return x, (x @ teacher).argmax(1)


def train_dataloader_fn(batch_size):
    """The seed's ``train_dataloader_fn``: a torch DataLoader (shuffled, seeded)."""
    x, y = synthetic_data(512)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y),
                                       batch_size=batch_size, shuffle=True, drop_last=True,
                                       generator=torch.Generator().manual_seed(0))


def eval_dataloader_fn(batch_size):
    """Held-out points in a fixed order."""
    x, y = synthetic_data(256, seed=7)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y),
                                       batch_size=batch_size, drop_last=True)
