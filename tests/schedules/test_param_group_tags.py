"""``param_group_tags`` and ``ScalePerParamLR`` / ``ScalePerParamWD`` against hand
computations: SGD with lr 1 and gradient 1 moves each parameter by minus the sum of the
learning rates its group used, so the parameters record every group's schedule."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from schedule_cases import assert_lrs

import cerebrax as cstorch

LRS = cstorch.optim.lr_scheduler
WDS = cstorch.optim.weight_decay_scheduler
NAMES = ("emb", "hidden", "head")


def _model():
    params = {name: jnp.zeros(1) for name in NAMES}
    return cstorch.compile(cstorch.FunctionalModel(
        lambda p, x: sum(p[n].sum() for n in NAMES) * x.sum(), params), "CPU")


def _groups(model, **extra):
    """Three groups: "emb" tagged {"embedding"}, "hidden" untagged, "head" tagged
    {"decay", "output"}; ``extra[name]`` adds entries to that group."""
    p = dict(model.named_parameters())
    tags = {"emb": {"tags": {"embedding"}}, "hidden": {}, "head": {"tags": {"decay", "output"}}}
    return [{"params": [p[n]], "lr": 0.5, **tags[n], **extra.get(n, {})} for n in NAMES]


def _run(model, optimizer, schedulers, steps):
    @cstorch.trace
    def step(x):
        loss = model(x)
        cstorch.backward(loss)
        optimizer.step()
        for scheduler in schedulers:
            scheduler.step()
        return loss

    for _ in range(steps):
        step(jnp.ones(1))
    assert step.num_compiles == 1
    state = model.state_dict()
    return {n: -float(state[n][0]) for n in NAMES}  # the sum of each group's rates


LINEAR = np.linspace(0.1, 0.0, 11)  # LinearLR(0.1 -> 0.0 in 10 steps) at t = 0..10


@pytest.mark.parametrize("tags, written", [
    (None, {"emb", "hidden", "head"}),
    ("embedding", {"emb"}),
    (["embedding"], {"emb"}),
    ([None], {"hidden"}),
    (["output", None], {"hidden", "head"}),
    ({"decay", "embedding"}, {"emb", "head"}),
])
def test_only_the_tagged_groups_are_scheduled(tags, written):
    model = _model()
    optimizer = cstorch.optim.SGD(_groups(model), lr=1.0)
    scheduler = LRS.LinearLR(optimizer, 0.1, 0.0, total_iters=10, param_group_tags=tags)
    used = _run(model, optimizer, [scheduler], 6)
    for name in NAMES:
        want = LINEAR[:6].sum() if name in written else 6 * 0.5
        assert used[name] == pytest.approx(want, rel=1e-6), name
    last = scheduler.get_last_lr()
    for name, value in zip(NAMES, last):
        if name in written:
            assert value == pytest.approx(LINEAR[6], rel=1e-6)
        else:
            assert value is None


def test_two_schedulers_share_an_optimizer_by_tags():
    model = _model()
    optimizer = cstorch.optim.SGD(_groups(model), lr=1.0)
    warm = LRS.LinearLR(optimizer, 0.1, 0.0, total_iters=10, param_group_tags="embedding")
    rest = LRS.StepLR(optimizer, 0.2, step_size=2, gamma=0.5, param_group_tags=[None, "decay"])
    used = _run(model, optimizer, [warm, rest], 6)
    step = 0.2 * 0.5 ** np.floor(np.arange(6) / 2)
    assert used == pytest.approx({"emb": LINEAR[:6].sum(), "hidden": step.sum(),
                                  "head": step.sum()}, rel=1e-6)


def test_composites_need_their_members_tags():
    model = _model()
    optimizer = cstorch.optim.SGD(_groups(model), lr=1.0)
    scheduler = LRS.SequentialLR(optimizer, [
        LRS.ConstantLR(optimizer, 0.3, total_iters=2, param_group_tags="output"),
        LRS.ConstantLR(optimizer, 0.1, param_group_tags="output")],
        milestones=[2], param_group_tags="output")
    used = _run(model, optimizer, [scheduler], 5)
    assert used == pytest.approx({"emb": 2.5, "hidden": 2.5, "head": 0.3 * 2 + 0.1 * 3})
    with pytest.raises(cstorch.ConfigError, match=r"same param_group_tags, \['output'\]"):
        LRS.ChainedScheduler([LRS.ConstantLR(optimizer, 0.3, param_group_tags="output"),
                              LRS.ConstantLR(optimizer, 1.0)], param_group_tags="output")


@pytest.mark.parametrize("tags, match", [
    ("decoder", r"(?s)param_group_tags=\['decoder'\].*the groups' tags: \[None, 'decay', "
                r"'embedding', 'output'\]"),
    (["emb", "emb"], "duplicate values"),
    ([lambda t: t], "must be a tag"),
])
def test_tag_errors(tags, match):
    model = _model()
    optimizer = cstorch.optim.SGD(_groups(model), lr=1.0)
    with pytest.raises(cstorch.ConfigError, match=match):
        LRS.ConstantLR(optimizer, 0.1, param_group_tags=tags)


def test_scale_per_param_lr_scales_by_each_groups_factor():
    model = _model()
    groups = _groups(model, emb={"adjust_learning_rate": 0.25}, head={"adjust_val": 3.0})
    optimizer = cstorch.optim.SGD(groups, lr=1.0)
    scheduler = LRS.ScalePerParamLR(optimizer, LRS.LinearLR(optimizer, 0.1, 0.0, 10))
    assert scheduler.adjustment_scalars == [0.25, 1.0, 3.0]
    used = _run(model, optimizer, [scheduler], 7)
    assert used == pytest.approx({"emb": 0.25 * LINEAR[:7].sum(), "hidden": LINEAR[:7].sum(),
                                  "head": 3.0 * LINEAR[:7].sum()}, rel=1e-6)
    assert_lrs(scheduler.get_last_lr(), LINEAR[7] * np.array([0.25, 1.0, 3.0]))
    assert scheduler.state_dict()["_scheduler"]["last_epoch"] == 7


def test_scale_per_param_with_tags_and_a_sequential_inside():
    model = _model()
    groups = _groups(model, head={"adjust_learning_rate": 2.0}, emb={"adjust_val": 5.0})
    optimizer = cstorch.optim.SGD(groups, lr=1.0)
    tags = ["output", None]
    inner = LRS.SequentialLR(optimizer, [
        LRS.ConstantLR(optimizer, 0.1, total_iters=3, param_group_tags=tags),
        LRS.ExponentialLR(optimizer, 0.1, 1, 0.5, param_group_tags=tags)],
        milestones=[3], param_group_tags=tags)
    scheduler = LRS.ScalePerParamLR(optimizer, inner, param_group_tags=tags)
    used = _run(model, optimizer, [scheduler], 6)
    base = np.array([0.1, 0.1, 0.1, 0.1, 0.05, 0.025])
    assert used == pytest.approx({"emb": 6 * 0.5, "hidden": base.sum(),
                                  "head": 2.0 * base.sum()}, rel=1e-6)
    with pytest.raises(cstorch.ConfigError, match="part of a ScalePerParamLR"):
        inner.step()


def test_scale_per_param_errors():
    model = _model()
    optimizer = cstorch.optim.SGD(_groups(model), lr=1.0)
    with pytest.raises(cstorch.ConfigError, match="same param_group_tags"):
        LRS.ScalePerParamLR(optimizer, LRS.ConstantLR(optimizer, 0.1), param_group_tags="output")
    scaled = LRS.ScalePerParamLR(optimizer, LRS.ConstantLR(optimizer, 0.1))
    with pytest.raises(cstorch.ConfigError, match="wrap the SequentialLR in it instead"):
        LRS.SequentialLR(optimizer, [scaled, LRS.ConstantLR(optimizer, 0.1)], [2])
    with pytest.raises(cstorch.ConfigError, match="writes 'lr' but scheduler"):
        LRS.ScalePerParamLR(optimizer, WDS.ConstantWD(optimizer, 0.1))


def test_scale_per_param_wd_and_configure_with_adjust_learning_rate():
    model = _model()
    groups = _groups(model, emb={"adjust_learning_rate": 0.5})
    optimizer = cstorch.optim.SGD(groups, lr=1.0)
    wd = WDS.ScalePerParamWD(optimizer, WDS.ConstantWD(optimizer, 0.02))
    assert wd.get_last_value() == pytest.approx([0.01, 0.02, 0.02])
    lr = cstorch.optim.configure_lr_scheduler(
        optimizer, {"scheduler": "Linear", "initial_learning_rate": 0.1,
                    "end_learning_rate": 0.0, "total_iters": 10},
        adjust_learning_rate={"embedding": 0.5})
    assert isinstance(lr, LRS.ScalePerParamLR)
    assert lr.get_last_lr() == pytest.approx([0.05, 0.1, 0.1])
    with pytest.raises(cstorch.ConfigError, match="not supported with adjust_learning_rate"):
        cstorch.optim.configure_lr_scheduler(
            optimizer, [{"scheduler": "Constant", "learning_rate": 0.1,
                         "main_scheduler": "chained"}], adjust_learning_rate={"x": 1.0})


def test_tagged_groups_save_and_load(tmp_path):
    model = _model()
    optimizer = cstorch.optim.AdamW(_groups(model), lr=1e-3)
    _run(model, optimizer, [], 2)
    state = optimizer.state_dict()
    assert [g["tags"] for g in state["param_groups"] if "tags" in g] == [
        ["embedding"], ["decay", "output"]]
    cstorch.save({"optimizer": state}, tmp_path / "tags.h5")
    fresh = cstorch.optim.AdamW(_groups(model), lr=1e-3)
    fresh.load_state_dict(cstorch.load(tmp_path / "tags.h5")["optimizer"])
    assert fresh.param_groups[2]["tags"] == {"decay", "output"}
    assert_lrs(fresh.state_dict()["state"][0]["exp_avg"], state["state"][0]["exp_avg"])
