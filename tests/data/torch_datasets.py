"""Datasets for the multi-worker tests, at module level so worker processes started with
spawn or forkserver can unpickle them; this module imports torch only, so they start fast."""

from __future__ import annotations

import torch


class Squares(torch.utils.data.Dataset):
    """Sample i: (i, i^2) as float32 and the worker process's id as an int64."""

    def __init__(self, size: int):
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int):
        info = torch.utils.data.get_worker_info()
        worker = -1 if info is None else info.id
        x = torch.tensor([index, index * index], dtype=torch.float32)
        return x, torch.tensor(worker)


def squares_loader(size: int, batch_size: int, **kwargs) -> torch.utils.data.DataLoader:
    return torch.utils.data.DataLoader(Squares(size), batch_size=batch_size, drop_last=True,
                                       **kwargs)
