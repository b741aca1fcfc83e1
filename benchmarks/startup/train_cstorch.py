"""A gigaGPT-style cstorch training script (run by bench_startup.py with ``cerebrax run``).

``train_cstorch.py TOKENS`` calls the compiled model in the step, as gigaGPT does;
``train_cstorch.py TOKENS module`` calls the torch module itself there instead (its
parameters read as the compiled state's), which traces its forward op by op through the
bridge's tensor rather than exporting it with ``torch.export``.
"""

import sys

import torch

import cerebras.pytorch as cstorch
from gpt import GPT, get_dataloader, optimizer_groups
from phases import mark

STEPS, WARMUP, LR = 20, 2, 6e-4


def main(data_path, call="compiled"):
    mark("imports")
    backend = cstorch.backend("CPU")
    torch.manual_seed(0)
    with backend.device:
        model = GPT()
    compiled_model = cstorch.compile(model, backend)
    optimizer = cstorch.optim.AdamW(optimizer_groups(model), lr=0.1, betas=(0.9, 0.95),
                                    eps=1e-8, correct_bias=True)
    scheduler = cstorch.optim.lr_scheduler.SequentialLR(optimizer, schedulers=[
        cstorch.optim.lr_scheduler.LinearLR(optimizer, initial_learning_rate=0.0,
                                            end_learning_rate=LR, total_iters=WARMUP),
        cstorch.optim.lr_scheduler.CosineDecayLR(optimizer, initial_learning_rate=LR,
                                                 end_learning_rate=LR / 10,
                                                 total_iters=STEPS - WARMUP),
    ], milestones=[WARMUP])
    params = [p for group in optimizer.param_groups for p in group["params"]]

    @cstorch.trace
    def training_step(batch):
        input_ids, labels = batch
        loss = (compiled_model if call == "compiled" else model)(input_ids, labels)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        return loss

    @cstorch.step_closure
    def log_loss(loss, step):
        if step == 1:
            mark("first_step")
        print(f"step {step} loss {loss.item():.6f}", flush=True)

    mark("model")
    dataloader = cstorch.utils.data.DataLoader(get_dataloader, data_path)
    executor = cstorch.utils.data.DataExecutor(dataloader, num_steps=STEPS)
    for step, batch in enumerate(executor, start=1):
        if step == 1:
            mark("first_batch")
        loss = training_step(batch)
        log_loss(loss, step)
    mark("done")


if __name__ == "__main__":
    main(*sys.argv[1:])
