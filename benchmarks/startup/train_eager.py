"""The same training as ``train_cstorch.py``, in torch eager (bench_startup.py's reference)."""

import math
import sys

import torch

from gpt import GPT, get_dataloader, optimizer_groups
from phases import mark

STEPS, WARMUP, LR = 20, 2, 6e-4


def learning_rate(step):  # LinearLR warmup, then CosineDecayLR, as the cstorch script's
    if step < WARMUP:
        return LR * step / WARMUP
    t = min(step - WARMUP, STEPS - WARMUP) / (STEPS - WARMUP)
    return LR / 10 + (LR - LR / 10) * 0.5 * (1 + math.cos(math.pi * t))


def main(data_path):
    mark("imports")
    torch.manual_seed(0)
    model = GPT()
    optimizer = torch.optim.AdamW(optimizer_groups(model), lr=learning_rate(0),
                                  betas=(0.9, 0.95), eps=1e-8)
    mark("model")
    for step, batch in enumerate(get_dataloader(data_path), start=1):
        if step == 1:
            mark("first_batch")
        input_ids, labels = batch
        loss = model(input_ids, labels)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step)
        optimizer.zero_grad()
        value = loss.item()
        if step == 1:
            mark("first_step")
        print(f"step {step} loss {value:.6f}", flush=True)
        if step == STEPS:
            break
    mark("done")


if __name__ == "__main__":
    main(sys.argv[1])
