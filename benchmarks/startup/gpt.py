"""The model and data of the start-up benchmark's scripts: a small GPT on token files, built
the way gigaGPT-style cstorch scripts build theirs (a module of their own, imported by the
training script, with a torch Dataset over a memory-mapped token file and a torch
DataLoader with persistent worker processes)."""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

VOCAB, WIDTH, DEPTH, HEADS, SEQ, BATCH = 50257, 64, 2, 2, 32, 4


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
        self.out = nn.Linear(WIDTH, WIDTH)

    def forward(self, x, mask):
        b, s, _ = x.shape
        q, k, v = self.qkv(x).split(WIDTH, dim=-1)
        q, k, v = (t.view(b, s, HEADS, WIDTH // HEADS).transpose(1, 2) for t in (q, k, v))
        scores = q @ k.transpose(-1, -2) / math.sqrt(WIDTH // HEADS) + mask
        weights = nn.functional.softmax(scores.float(), dim=-1).type_as(scores)
        return self.out((weights @ v).transpose(1, 2).reshape(b, s, WIDTH))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.attn = Attention()
        self.fc, self.proj = nn.Linear(WIDTH, 4 * WIDTH), nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x, mask):
        x = x + self.attn(self.ln_1(x), mask)
        return x + self.proj(nn.functional.gelu(self.fc(self.ln_2(x))))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VOCAB, WIDTH), nn.Embedding(SEQ, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(DEPTH))
        self.ln_f = nn.LayerNorm(WIDTH)
        self.lm_head = nn.Linear(WIDTH, VOCAB, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, input_ids, labels):
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.wte(input_ids) + self.wpe(positions)
        mask = torch.triu(torch.full((SEQ, SEQ), float("-inf"), device=x.device), 1)
        for block in self.blocks:
            x = block(x, mask)
        logits = self.lm_head(self.ln_f(x))
        return nn.functional.cross_entropy(logits.view(-1, VOCAB), labels.view(-1).long())


class Tokens(torch.utils.data.Dataset):
    """Sequences of a flat uint16 token file, read through a memory map."""

    def __init__(self, path):
        self.data = np.memmap(path, dtype=np.uint16, mode="r")

    def __len__(self):
        return (len(self.data) - 1) // SEQ

    def __getitem__(self, i):
        x = self.data[i * SEQ:(i + 1) * SEQ + 1].astype(np.int32)
        return x[:-1], x[1:]


def write_tokens(path, count=SEQ * BATCH * 64 + 1, seed=0):
    """Writes ``count`` random tokens to ``path`` (the benchmark's data, no download)."""
    np.random.default_rng(seed).integers(0, VOCAB, count, dtype=np.uint16).tofile(path)


def get_dataloader(path, seed=0):
    """A shuffled torch DataLoader over ``path`` with two persistent workers."""
    dataset = Tokens(path)
    sampler = torch.utils.data.RandomSampler(
        dataset, generator=torch.Generator().manual_seed(seed))
    return torch.utils.data.DataLoader(
        dataset, batch_sampler=torch.utils.data.BatchSampler(sampler, BATCH, drop_last=True),
        num_workers=2, persistent_workers=True)


def optimizer_groups(model, weight_decay=0.1):
    """AdamW's groups: decay for matrices, none for vectors."""
    params = list(model.parameters())
    return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
