"""Train an MLP on scikit-learn's handwritten digits with the cstorch programming model.

Written like the seeds' MNIST custom training loop: a cluster config and a backend,
a compiled model, a cstorch optimizer and learning-rate scheduler, a traced training
step, the loss printed by a step closure, checkpoints saved by a checkpoint closure at
checkpoint steps, and a traced evaluation step that accumulates test accuracy.

    python examples/train_digits.py                 # the emulated wafer ("CSX", float16)
    python examples/train_digits.py --backend CPU   # plain float32 on the CPU

The digits ship with scikit-learn (no download): 1,797 8x8 images, 360 held out. The
model, data and loss live in `examples/digits.py`, which `configs/digits_mlp.yaml` also
names: `cerebrax fit configs/digits_mlp.yaml` runs this same job from a config.
"""

from __future__ import annotations

import argparse
import os

from digits import MLP, input_fn, loss_fn  # examples/digits.py: model, data and loss
from flax import nnx

import cerebrax as cstorch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="CSX", choices=["CSX", "CPU"])
    parser.add_argument("--num-steps", type=int, default=600)
    parser.add_argument("--checkpoint-steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.05)
    # Not ./model_dir: that is the run directory of `cerebrax fit configs/digits_mlp.yaml`.
    parser.add_argument("--model-dir", default="./model_dir_train_digits")
    args = parser.parse_args()
    os.makedirs(args.model_dir, exist_ok=True)

    if args.backend == "CSX":
        config = cstorch.distributed.ClusterConfig(num_csx=1, num_workers_per_csx=1)
        backend = cstorch.backend("CSX", cluster_config=config)
    else:
        backend = cstorch.backend("CPU")

    model = MLP(nnx.Rngs(0))
    compiled_model = cstorch.compile(model, backend)
    print(compiled_model)

    optimizer = cstorch.optim.SGD(compiled_model.parameters(), lr=args.lr, momentum=0.9)
    lr_scheduler = cstorch.optim.lr_scheduler.CosineDecayLR(
        optimizer, initial_learning_rate=args.lr, end_learning_rate=args.lr / 20,
        total_iters=args.num_steps,
    )
    grad_scaler = cstorch.amp.GradScaler(loss_scale="dynamic")

    @cstorch.trace
    def training_step(inputs, targets):
        outputs = compiled_model(inputs)
        loss = loss_fn(outputs, targets)
        cstorch.amp.optimizer_step(loss, optimizer, grad_scaler, max_gradient_norm=5.0)
        lr_scheduler.step()
        return loss

    @cstorch.step_closure
    def print_loss(loss, step):
        if step == 1 or step % 50 == 0 or step == args.num_steps:
            print(f"step {step:4d}  loss {loss.item():.4f}")

    @cstorch.checkpoint_closure
    def save_checkpoint(step):
        path = os.path.join(args.model_dir, f"checkpoint_{step}.mdl")
        state_dict = {
            "model": compiled_model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "lr_scheduler": lr_scheduler.state_dict(),
            "grad_scaler": grad_scaler.state_dict(),
            "global_step": step,
        }
        cstorch.save(state_dict, path)
        print(f"saved {path}")

    dataloader = cstorch.utils.data.DataLoader(
        input_fn, "train", args.batch_size, True, num_steps=args.num_steps
    )
    executor = cstorch.utils.data.DataExecutor(dataloader, checkpoint_steps=args.checkpoint_steps)
    compiled_model.train()
    for inputs, targets in executor:
        loss = training_step(inputs, targets)
        print_loss(loss, executor.user_iteration)
        save_checkpoint(executor.user_iteration)

    accuracy = cstorch.metrics.AccuracyMetric("accuracy")
    compiled_model.eval()

    @cstorch.trace
    def evaluation_step(inputs, targets):
        outputs = compiled_model(inputs)
        accuracy(labels=targets, predictions=outputs.argmax(-1))
        return loss_fn(outputs, targets)

    eval_loader = cstorch.utils.data.DataLoader(input_fn, "test", 40, False)
    for inputs, targets in cstorch.utils.data.DataExecutor(eval_loader):
        evaluation_step(inputs, targets)
    print(f"test accuracy: {float(accuracy):.4f} on {len(eval_loader) * 40} held-out digits")


if __name__ == "__main__":
    main()
