"""Seed 003's 1.2-era loop: cbtorch.initialize / module / dataloader / Session.

The reference for every Session run is the equivalent ``@cstorch.trace`` loop on the
same torch model, optimizer and data; the Session must give the same losses and compile
one program.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import batches, mlp_apply, mlp_params, rel_err, xent, xent_step

import cerebrax as cstorch
import cerebrax.legacy as cbtorch
import torch_bridge
from cerebrax.errors import (
    BackendError,
    ConfigError,
    RecompileError,
    StateError,
    TensorReadError,
)

FEATURES, CLASSES, BATCH = 20, 4, 16


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(FEATURES, 32)
        self.norm = torch.nn.LayerNorm(32)
        self.fc2 = torch.nn.Linear(32, CLASSES)

    def forward(self, x):
        return self.fc2(self.norm(torch.relu(self.fc1(x))))


def get_train_dataloader(n=512, batch_size=BATCH, drop_last=True, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, FEATURES, generator=gen)
    teacher = torch.randn(FEATURES, CLASSES, generator=torch.Generator().manual_seed(99))
    dataset = torch.utils.data.TensorDataset(x, (x @ teacher).argmax(1))
    return torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=True,
                                       drop_last=drop_last,
                                       generator=torch.Generator().manual_seed(seed))


def trace_loop(num_steps, num_epochs):
    """The reference: the same training as a @cstorch.trace loop."""
    torch.manual_seed(0)
    module = Model()
    compiled = cstorch.compile(module, "CPU")
    optimizer = cstorch.optim.SGD(module.parameters(), lr=0.05, momentum=0.9)
    loss_fn = torch_bridge.convert(torch.nn.CrossEntropyLoss())
    training_step = xent_step(compiled, optimizer, loss_fn, zero_grad=True)

    losses = []
    train_dataloader = get_train_dataloader()
    for _ in range(num_epochs):
        for inputs, targets in train_dataloader:
            losses.append(float(training_step(inputs, targets)))
            if len(losses) == num_steps:
                return np.array(losses), compiled.state_dict()
    return np.array(losses), compiled.state_dict()


def seed003_loop(num_steps, num_epochs, compiles=None):
    """Seed 003's four additions around a standard PyTorch training loop."""
    cbtorch.initialize()                                       # 1. the system (here: CPU)
    torch.manual_seed(0)
    model = cbtorch.module(Model())                            # 2. the model
    train_dataloader = cbtorch.dataloader(get_train_dataloader())  # 3. the data loader
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    criterion = torch.nn.CrossEntropyLoss()

    losses, after_first = [], None
    global_step = 0
    with cbtorch.Session(model, optimizer, criterion, mode="train") as session:  # 4.
        for epoch in range(num_epochs):
            for step, batch in enumerate(train_dataloader):
                global_step += 1
                optimizer.zero_grad()
                inputs, targets = batch
                outputs = model(inputs)
                loss = criterion(outputs, targets)
                loss.backward()
                optimizer.step()
                losses.append(loss.item())
                if global_step == 1 and compiles is not None:
                    after_first = compiles.count
                if global_step >= num_steps:
                    break
            if global_step >= num_steps:
                break
    return np.array(losses), model, session, after_first


def test_seed003_loop_trains_like_the_trace_loop_and_compiles_once(compiles):
    ref_losses, ref_state = trace_loop(50, num_epochs=2)
    cstorch.reset()

    losses, model, session, after_first = seed003_loop(50, num_epochs=2, compiles=compiles)

    assert len(losses) == len(ref_losses) == 50  # 32 batches per epoch: two epochs
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-6)
    assert np.mean(losses[-5:]) < 0.7 * np.mean(losses[:5])  # it learned
    state = model.state_dict()
    for name, value in ref_state.items():
        assert rel_err(state[name], value) <= 1e-6, name
    # One program, compiled at the first iteration; 49 more steps compile nothing.
    assert session.num_compiles == 1
    assert session.num_steps == 50
    assert compiles.count == after_first


def test_a_torch_optimizer_trains_like_its_cerebrax_equivalent():
    """Seed 003 scripts build torch.optim optimizers: the Session runs the cerebrax
    equivalent and hands the trained state back to the torch optimizer."""
    reference, ref_state = trace_loop(num_steps=12, num_epochs=1)
    cstorch.reset()
    cbtorch.initialize()
    torch.manual_seed(0)
    model = cbtorch.module(Model())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    criterion = torch.nn.CrossEntropyLoss()
    losses = []
    with cbtorch.Session(model, optimizer, criterion, mode="train") as session:
        for inputs, targets in cbtorch.dataloader(get_train_dataloader()):
            optimizer.zero_grad()
            loss = criterion(model(inputs), targets)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            if len(losses) == 12:
                break
    assert rel_err(losses, reference) <= 1e-6, (losses, reference)
    assert session.num_compiles == 1
    state = model.compiled.state_dict()
    for name in ref_state:
        assert rel_err(state[name], ref_state[name]) <= 1e-6, name
    # The torch optimizer holds the run's momentum now, and its methods are its own.
    assert "step" not in vars(optimizer)
    buffers = [optimizer.state[p]["momentum_buffer"] for p in model.parameters()]
    assert all(b is not None and float(b.abs().sum()) > 0 for b in buffers)


def test_values_are_lazy_until_the_step_and_materialized_after():
    model = cbtorch.module(Model())
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)
    criterion = torch.nn.CrossEntropyLoss()
    inputs, targets = next(iter(get_train_dataloader()))
    weights = {k: torch.as_tensor(v) for k, v in model.state_dict().items()}

    with cbtorch.Session(model, optimizer, criterion) as session:
        optimizer.zero_grad()
        outputs = model(inputs)
        loss = criterion(outputs, targets)
        assert isinstance(outputs, cbtorch.LazyTensor)
        assert isinstance(loss, cbtorch.LazyTensor)
        assert "pending" in repr(loss)
        loss.backward()
        optimizer.step()
        # The step computed the outputs with the weights from before the update.
        reference = Model()
        reference.load_state_dict(weights)
        with torch.no_grad():
            expected_outputs = reference(inputs)
            expected_loss = torch.nn.functional.cross_entropy(expected_outputs, targets)
        assert loss.item() == pytest.approx(expected_loss.item(), rel=1e-5)
        np.testing.assert_allclose(outputs.numpy(), expected_outputs.numpy(), rtol=1e-4,
                                   atol=1e-5)
        assert outputs.shape == (BATCH, CLASSES)
        # After the step, arithmetic on values computes right away.
        assert float(loss * 2) == pytest.approx(2 * loss.item())
        assert session.num_steps == 1


def test_reading_a_value_before_optimizer_step_is_refused():
    model = cbtorch.module(Model())
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)
    inputs, targets = next(iter(get_train_dataloader()))
    criterion = torch.nn.CrossEntropyLoss()
    with cbtorch.Session(model, optimizer, criterion):
        loss = criterion(model(inputs), targets)
        loss.backward()
        with pytest.raises(TensorReadError, match=r"before optimizer\.step\(\)"):
            loss.item()


def test_a_body_whose_graph_changes_raises_recompile_error():
    model = cbtorch.module(Model())
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)
    criterion = torch.nn.CrossEntropyLoss()
    loader = get_train_dataloader()
    with cbtorch.Session(model, optimizer, criterion):
        for step, (inputs, targets) in enumerate(loader):
            optimizer.zero_grad()
            loss = criterion(model(inputs), targets)
            if step == 1:
                loss = loss * 2.0  # a call the compiled step does not have
            loss.backward()
            if step == 1:
                with pytest.raises(RecompileError, match=r"call 3 of the step was "
                                   r"loss\.backward\(\) when the step was compiled, but is "
                                   r"mul\(\.\.\.\) now"):
                    optimizer.step()
                break
            optimizer.step()


def test_a_new_batch_size_raises_recompile_error_naming_drop_last():
    model = cbtorch.module(Model())
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)
    criterion = torch.nn.CrossEntropyLoss()
    ragged = get_train_dataloader(n=40, drop_last=False)  # batches of 16, 16, 8
    with cbtorch.Session(model, optimizer, criterion):
        with pytest.raises(RecompileError, match=r"(?s)shape \(16, 20\).*drop_last=True"):
            for inputs, targets in ragged:
                loss = criterion(model(inputs), targets)
                loss.backward()
                optimizer.step()


def test_eval_session_matches_torch_eager_on_the_trained_weights(compiles):
    torch.manual_seed(0)
    model = cbtorch.module(Model())
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.05)
    criterion = torch.nn.CrossEntropyLoss()
    with cbtorch.Session(model, optimizer, criterion, mode="train"):
        for inputs, targets in cbtorch.dataloader(get_train_dataloader(n=160)):
            loss = criterion(model(inputs), targets)
            loss.backward()
            optimizer.step()

    eval_loader = cbtorch.dataloader(get_train_dataloader(n=96, seed=1))
    losses, accuracies = [], []
    with cbtorch.Session(model, None, criterion, mode="eval") as session:
        assert not model.training
        for i, (inputs, targets) in enumerate(eval_loader):
            outputs = model(inputs)
            loss = criterion(outputs, targets)
            losses.append(loss.item())  # the read runs the eval step
            accuracies.append(float((outputs.argmax(1) == np.asarray(targets)).mean()))
            if i == 0:
                after_first = compiles.count
    assert session.num_compiles == 1 and session.num_steps == 6
    assert compiles.count == after_first

    reference = Model()
    reference.load_state_dict({k: torch.as_tensor(v) for k, v in model.state_dict().items()})
    reference.eval()
    expected, expected_acc = [], []
    with torch.no_grad():
        for inputs, targets in get_train_dataloader(n=96, seed=1):
            logits = reference(inputs)
            expected.append(torch.nn.functional.cross_entropy(logits, targets).item())
            expected_acc.append((logits.argmax(1) == targets).float().mean().item())
    np.testing.assert_allclose(losses, expected, rtol=1e-5)
    np.testing.assert_allclose(accuracies, expected_acc)


def test_eval_step_ends_when_the_dataloader_moves_on():
    model = cbtorch.module(Model())
    criterion = torch.nn.CrossEntropyLoss()
    losses = []
    with cbtorch.Session(model, None, criterion, mode="eval") as session:
        for inputs, targets in cbtorch.dataloader(get_train_dataloader(n=48)):
            losses.append(criterion(model(inputs), targets))  # never read in the body
    assert session.num_steps == 3 and session.num_compiles == 1
    assert all(np.isfinite(loss.item()) for loss in losses)


def test_jax_model_that_returns_its_loss_trains_like_the_trace_loop():
    data = batches(12)

    def apply_with_loss(params, x, y):
        return xent(mlp_apply(params, x), y)

    def run(use_session):
        model = cstorch.compile(cstorch.FunctionalModel(apply_with_loss, mlp_params()))
        optimizer = cstorch.optim.Adam(model.parameters(), lr=0.01)
        if not use_session:
            @cstorch.trace
            def step(x, y):
                loss = model(x, y)
                cstorch.backward(loss)
                optimizer.step()
                return loss

            return [float(step(x, y)) for x, y in data]
        model = cbtorch.module(model)
        losses = []
        with cbtorch.Session(model, optimizer, criterion=None) as session:
            for x, y in data:
                optimizer.zero_grad()
                loss = model(x, y)
                loss.backward()
                optimizer.step()
                losses.append(loss.item())
        assert session.num_compiles == 1
        return losses

    expected = run(use_session=False)
    cstorch.reset()
    np.testing.assert_allclose(run(use_session=True), expected, rtol=1e-6)


def test_step_closures_run_after_the_step_with_values():
    model = cbtorch.module(Model())
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)
    criterion = torch.nn.CrossEntropyLoss()
    seen = []
    with cbtorch.Session(model, optimizer, criterion) as session:
        for inputs, targets in get_train_dataloader(n=32):
            loss = criterion(model(inputs), targets)
            session.add_step_closure(lambda value: seen.append(float(value)), args=(loss,))
            assert len(seen) == session.num_steps  # this step's closure waits for it
            loss.backward()
            optimizer.step()
            assert seen[-1] == loss.item()
    assert len(seen) == 2
    assert session.num_compiles == 1


def test_the_taken_over_methods_are_given_back():
    model = cbtorch.module(Model())
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)
    criterion = torch.nn.CrossEntropyLoss()
    with cbtorch.Session(model, optimizer, criterion):
        assert "step" in vars(optimizer) and "forward" in vars(criterion)
        # Plain torch tensors still go through the torch criterion, eagerly.
        value = criterion(torch.zeros(2, 3), torch.tensor([0, 1]))
        assert value.item() == pytest.approx(np.log(3.0))
    assert "step" not in vars(optimizer) and "zero_grad" not in vars(optimizer)
    assert "forward" not in vars(criterion)
    with pytest.raises(StateError, match="inside a step decorated with @cstorch.trace"):
        optimizer.step()


def test_misuse_is_refused_with_the_fix():
    model = cbtorch.module(Model())
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)
    criterion = torch.nn.CrossEntropyLoss()
    with pytest.raises(ConfigError, match=r"model = cbtorch\.module\(Model\(\)\)"):
        cbtorch.Session(Model(), optimizer, criterion)
    with pytest.raises(ConfigError, match=r"cstorch\.optim\.SGD\(model\.parameters\(\)"):
        cbtorch.Session(model, object(), criterion)
    with pytest.raises(ConfigError, match="from_torch"):
        cbtorch.Session(model, torch.optim.LBFGS(model.parameters()), criterion)
    with pytest.raises(ConfigError, match="needs the optimizer"):
        cbtorch.Session(model, None, criterion, mode="train")
    with pytest.raises(ConfigError, match="criterion=None"):
        cbtorch.Session(model, optimizer, xent)
    with pytest.raises(ConfigError, match="'train' or 'eval'"):
        cbtorch.Session(model, optimizer, criterion, mode="predict")
    inputs, targets = next(iter(get_train_dataloader()))
    with cbtorch.Session(model, None, criterion, mode="eval"):
        with pytest.raises(StateError, match="mode='train'"):
            criterion(model(inputs), targets).backward()
    with cbtorch.Session(model, optimizer, criterion):
        with pytest.raises(StateError, match="do not nest"):
            with cbtorch.Session(model, optimizer, criterion):
                pass


def test_initialize_creates_the_backend_once():
    backend = cbtorch.initialize()
    assert backend.backend_type == "CPU"
    assert cbtorch.initialize() is backend
    assert cbtorch.module(Model()).compiled.backend is backend
    with pytest.raises(BackendError, match="initialize\\(\\) once"):
        cbtorch.initialize(cs_ip="10.0.0.1")
