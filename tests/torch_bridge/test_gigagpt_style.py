"""A training script written the way Cerebras' gigaGPT ``train.py`` is written for
cstorch 2.x, run with ``import cerebrax as cstorch``: ``backend.is_cpu``, the model built
``with backend.device:``, ``cstorch.backends.csx.debug`` flags set by assignment, a
``DataExecutor`` whose ``profiler.rate_tracker.rate`` is logged from a step closure with a
``SummaryWriter``, ``loss.backward()``, ``clip_grad_norm_``, AdamW with cstorch's defaults
and a LinearLR schedule. Its losses must equal torch eager's on the same model, data and
hyperparameters (cstorch's AdamW defaults written out for torch)."""

from __future__ import annotations

import copy

import numpy as np
import torch

import cerebrax as cstorch
from cerebrax.utils.tensorboard import SummaryWriter

VOCAB, SEQ, WIDTH, HEADS, BLOCKS, BATCH, STEPS = 64, 16, 32, 4, 2, 4, 6
LR, END_LR, CLIP = 1e-2, 1e-3, 1.0


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1 = torch.nn.LayerNorm(WIDTH)
        self.attn = torch.nn.MultiheadAttention(WIDTH, HEADS, batch_first=True)
        self.ln_2 = torch.nn.LayerNorm(WIDTH)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(WIDTH, 4 * WIDTH), torch.nn.GELU(),
                                       torch.nn.Linear(4 * WIDTH, WIDTH))

    def forward(self, x, mask):
        h = self.ln_1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln_2(x))


class GPTModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = torch.nn.Embedding(VOCAB, WIDTH)
        self.wpe = torch.nn.Embedding(SEQ, WIDTH)
        self.blocks = torch.nn.ModuleList(Block() for _ in range(BLOCKS))
        self.ln_f = torch.nn.LayerNorm(WIDTH)
        self.lm_head = torch.nn.Linear(WIDTH, VOCAB, bias=False)
        self.lm_head.weight = self.wte.weight  # tied, as gigaGPT's

    def forward(self, input_ids, labels):
        positions = torch.arange(input_ids.shape[1])
        x = self.wte(input_ids) + self.wpe(positions)
        mask = torch.triu(torch.full((SEQ, SEQ), float("-inf")), diagonal=1)
        for block in self.blocks:
            x = block(x, mask)
        logits = self.lm_head(self.ln_f(x))
        return torch.nn.functional.cross_entropy(logits.view(-1, VOCAB), labels.view(-1))


class TokenDataset(torch.utils.data.Dataset):
    def __init__(self):
        g = torch.Generator().manual_seed(0)
        self.tokens = torch.randint(0, VOCAB, (BATCH * STEPS, SEQ + 1), generator=g)

    def __len__(self):
        return len(self.tokens)

    def __getitem__(self, i):
        return self.tokens[i, :-1], self.tokens[i, 1:]


def torch_losses(model: torch.nn.Module) -> list[float]:
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, eps=1e-6, weight_decay=0.0)
    losses = []
    loader = torch.utils.data.DataLoader(TokenDataset(), batch_size=BATCH)
    for step, (input_ids, labels) in enumerate(loader):
        for group in optimizer.param_groups:  # LinearLR's closed form
            group["lr"] = LR + (END_LR - LR) * min(step, STEPS) / STEPS
        loss = model(input_ids, labels)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def test_gigagpt_style_script_trains_like_torch(tmp_path):
    torch.manual_seed(0)
    reference = GPTModel()
    expected = torch_losses(copy.deepcopy(reference))

    # ---- the script, as written for cstorch 2.x --------------------------------------
    backend = cstorch.backend("CPU")
    if not backend.is_cpu:
        cstorch.backends.csx.debug.execute_crd_memory_gi = 10
    cstorch.backends.csx.debug.debug_args = []  # recorded, not applied, on this backend
    with backend.device:
        torch.manual_seed(0)
        model = GPTModel()
    compiled_model = cstorch.compile(model, backend)
    optimizer = cstorch.optim.AdamW(model.parameters(), lr=LR)
    scheduler = cstorch.optim.lr_scheduler.LinearLR(
        optimizer, initial_learning_rate=LR, end_learning_rate=END_LR, total_iters=STEPS)
    writer = SummaryWriter(log_dir=str(tmp_path / "events"))

    @cstorch.trace
    def training_step(input_ids, labels):
        loss = compiled_model(input_ids, labels)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(model.parameters()), CLIP)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        return loss

    losses, rates = [], []

    @cstorch.step_closure
    def log_loss(loss, step):
        rate = executor.profiler.rate_tracker.rate
        global_rate = executor.profiler.rate_tracker.global_rate
        losses.append(loss.item())
        rates.append((rate, global_rate))
        writer.add_scalar("loss", loss.item(), step)
        writer.add_scalar("samples_per_sec", rate, step)

    dataloader = cstorch.utils.data.DataLoader(
        lambda: torch.utils.data.DataLoader(TokenDataset(), batch_size=BATCH))
    executor = cstorch.utils.data.DataExecutor(dataloader, num_steps=STEPS,
                                               checkpoint_steps=STEPS)
    for step, (input_ids, labels) in enumerate(executor, start=1):
        loss = training_step(input_ids, labels)
        log_loss(loss, step)
    writer.close()
    # ----------------------------------------------------------------------------------

    np.testing.assert_allclose(losses, expected, rtol=2e-5)
    assert len(rates) == STEPS and all(r >= 0 and g >= 0 for r, g in rates)
    assert rates[-1][1] > 0  # samples per second since the start, after the last step
    assert any(p.name.startswith("events") for p in tmp_path.iterdir())
