"""TensorBoard summaries: summarize_* in traced steps, the event files as TensorBoard reads
them, cerebrax's reader."""

from __future__ import annotations

import pathlib
import sys

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from helpers import batches, compiled_mlp, xent
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
from tensorboard.compat.proto import types_pb2
from tensorboard.util import tensor_util

import cerebrax as cstorch
from cerebrax.summaries import SummaryError, SummaryReader, SummaryWriter

# ---- TensorBoard's own readers, independent of cerebrax's ---------------------------------


def accumulate(directory) -> EventAccumulator:
    """TensorBoard's EventAccumulator over ``directory``, every event kept (no sampling)."""
    accumulator = EventAccumulator(str(directory), size_guidance={"scalars": 0, "tensors": 0})
    accumulator.Reload()
    return accumulator


def event_files(directory) -> list[pathlib.Path]:
    return sorted(pathlib.Path(directory).rglob("events.out.tfevents.*"))


# ---- a training loop that summarizes ------------------------------------------------------


def train(num_steps: int, *, writer=None, activation_steps: int = 1, outside: bool = False):
    """Runs a traced SGD step over a DataExecutor; returns the losses and first logits."""
    model = compiled_mlp()
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)

    @cstorch.trace
    def training_step(x, y):
        logits = model(x)
        loss = xent(logits, y)
        cstorch.backward(loss)
        norm = cstorch.optim.clip_grad_norm_(model.parameters(), 10.0)
        optimizer.step()
        cstorch.summarize_scalar("train/loss", loss)
        cstorch.summarize_scalar("train/grad_norm", norm)  # a DeferredValue
        cstorch.summarize_tensor("train/logits0", logits[0])
        return loss, logits[0], norm

    data = batches(num_steps)
    loader = cstorch.utils.data.DataLoader(lambda: data, num_steps=num_steps)
    executor = cstorch.utils.data.DataExecutor(
        loader, activation_steps=activation_steps, writer=writer, progress_bar=False
    )
    outputs = []
    for x, y in executor:
        outputs.append(training_step(x, y))
        if outside:
            cstorch.summarize_scalar("outside/step", jnp.float32(executor.iteration * 10))
    losses = np.array([np.float32(o[0]) for o in outputs])
    logits = np.stack([np.asarray(o[1]) for o in outputs])
    norms = np.array([np.float32(o[2]) for o in outputs])
    return losses, logits, norms, training_step


def test_traced_summaries_are_read_back_with_the_steps_and_values(tmp_path):
    writer = SummaryWriter(tmp_path / "run")
    losses, logits, norms, _ = train(5, writer=writer, outside=True)
    reader = SummaryReader(tmp_path / "run")  # readable without close(): the loop flushed
    assert reader.tags() == {
        "scalars": ["outside/step", "train/grad_norm", "train/loss"],
        "tensors": ["train/logits0"],
    }
    # cstorch's convention: step = writer.base_step (1) + 0-based iteration.
    assert reader.scalars("train/loss") == [(s + 1, float(v)) for s, v in enumerate(losses)]
    assert reader.scalars("train/grad_norm") == [(s + 1, float(v)) for s, v in enumerate(norms)]
    assert reader.scalars("outside/step") == [(s + 1, 10.0 * s) for s in range(5)]
    tensors = reader.tensors("train/logits0")
    assert [s for s, _ in tensors] == [1, 2, 3, 4, 5]
    for (_, got), want in zip(tensors, logits):
        assert got.dtype == np.float32 and got.shape == (4,)
        np.testing.assert_array_equal(got, want)
    assert reader.read_scalar("train/loss", step=3).value == float(losses[2])
    writer.close()


def test_activation_steps_filter_summaries(tmp_path):
    writer = SummaryWriter(tmp_path)
    losses, _, _, _ = train(7, writer=writer, activation_steps=3, outside=True)
    reader = SummaryReader(tmp_path)
    # Activation steps: (s + 1) % 3 == 0, and the final step: s = 2, 5, 6.
    assert reader.scalars("train/loss") == [(s + 1, float(losses[s])) for s in (2, 5, 6)]
    assert [s for s, _ in reader.tensors("train/logits0")] == [3, 6, 7]
    assert [s for s, _ in reader.scalars("outside/step")] == [3, 6, 7]


def test_base_step_offsets_the_logged_steps(tmp_path):
    writer = SummaryWriter(tmp_path, base_step=100)
    train(2, writer=writer)
    assert [s for s, _ in SummaryReader(tmp_path).scalars("train/loss")] == [100, 101]


def test_without_a_writer_nothing_is_written_and_nothing_fails(tmp_path):
    losses, _, _, step = train(3)
    assert np.all(np.isfinite(losses))
    assert event_files(tmp_path) == []
    assert not cstorch._runtime.RUNTIME.closures
    # Outside any executor the calls do nothing either, traced or not.
    x, y = batches(1)[0]
    step(x, y)
    cstorch.summarize_scalar("eager", 1.5)
    cstorch.summarize_tensor("eager", np.ones(3))
    assert event_files(tmp_path) == []


def test_one_program_with_and_without_a_writer(tmp_path, compiles):
    model = compiled_mlp()

    @cstorch.trace
    def step_fn(x):
        out = model(x).sum()
        cstorch.summarize_scalar("sum", out)
        return out

    data = [x for x, _ in batches(3)]
    loader = cstorch.utils.data.DataLoader(lambda: data, num_steps=3)
    for x in cstorch.utils.data.DataExecutor(loader, progress_bar=False):
        step_fn(x)
    before = compiles.count
    with SummaryWriter(tmp_path) as writer:
        for x in cstorch.utils.data.DataExecutor(loader, writer=writer, progress_bar=False):
            step_fn(x)
    assert compiles.count == before and step_fn.num_compiles == 1
    assert len(SummaryReader(tmp_path).scalars("sum")) == 3


def test_summaries_are_written_one_step_behind_the_dispatch():
    log = []

    class Recorder:  # any object with add_scalar is a writer, e.g. torch's SummaryWriter
        def add_scalar(self, tag, value, step):
            log.append(("write", tag, step, value))

    model = compiled_mlp()

    @cstorch.trace
    def step_fn(x):
        out = model(x).sum()
        cstorch.summarize_scalar("sum", out)
        return out

    data = [x for x, _ in batches(3)]
    loader = cstorch.utils.data.DataLoader(lambda: data, num_steps=3)
    executor = cstorch.utils.data.DataExecutor(loader, writer=Recorder(), progress_bar=False)
    sums = []
    for x in executor:
        log.append(("dispatch", executor.iteration))
        sums.append(float(step_fn(x)))
    assert [e[:3] for e in log] == [
        ("dispatch", 0),
        ("dispatch", 1),
        ("write", "sum", 1),
        ("dispatch", 2),
        ("write", "sum", 2),
        ("write", "sum", 3),
    ]
    assert [e[3] for e in log if e[0] == "write"] == pytest.approx(sums)
    assert all(type(e[3]) is float for e in log if e[0] == "write")


def test_summaries_inside_a_step_closure_use_its_step(tmp_path):
    @cstorch.step_closure
    def report(value):
        cstorch.summarize_scalar("from_closure", value * 2)

    model = compiled_mlp()

    @cstorch.trace
    def step_fn(x):
        out = model(x).sum()
        report(out)
        return out

    data = [x for x, _ in batches(3)]
    loader = cstorch.utils.data.DataLoader(lambda: data, num_steps=3)
    with SummaryWriter(tmp_path) as writer:
        sums = [
            float(step_fn(x))
            for x in cstorch.utils.data.DataExecutor(loader, writer=writer, progress_bar=False)
        ]
    got = SummaryReader(tmp_path).scalars("from_closure")
    assert [s for s, _ in got] == [1, 2, 3]
    np.testing.assert_allclose([v for _, v in got], np.float32(sums) * 2, rtol=1e-6)


# ---- the event file -----------------------------------------------------------------------


def test_event_file_as_tensorboard_reads_it(tmp_path):
    with SummaryWriter(tmp_path) as writer:
        writer.add_scalar("a", 0.5, 3, walltime=1_700_000_000.25)
        writer.add_tensor("t", np.arange(6, dtype=np.int32).reshape(2, 3), 4, walltime=1.7e9 + 1)
        writer.add_tensor("big", np.arange(5000, dtype=np.float32), 5)  # > 8 KB payload
    (path,) = event_files(tmp_path)
    assert path.name.startswith("events.out.tfevents.")
    first, scalar, tensor, big = EventFileLoader(str(path)).Load()
    assert first.file_version == "brain.Event:2" and not first.HasField("summary")
    assert first.wall_time > 1.6e9  # seconds
    assert (scalar.step, scalar.wall_time) == (3, 1_700_000_000.25)
    (value,) = scalar.summary.value  # migrated by TensorBoard into a scalars-plugin tensor
    assert value.tag == "a" and value.metadata.plugin_data.plugin_name == "scalars"
    assert tensor_util.make_ndarray(value.tensor) == np.float32(0.5)
    assert (tensor.step, tensor.wall_time) == (4, 1.7e9 + 1)
    (value,) = tensor.summary.value
    assert value.tag == "t" and value.tensor.dtype == types_pb2.DT_INT32
    np.testing.assert_array_equal(
        tensor_util.make_ndarray(value.tensor), np.arange(6, dtype=np.int32).reshape(2, 3)
    )
    assert big.step == 5 and big.wall_time >= first.wall_time
    np.testing.assert_array_equal(
        tensor_util.make_ndarray(big.summary.value[0].tensor), np.arange(5000, dtype=np.float32)
    )
    # What `tensorboard --logdir` shows: "a" under scalars, "t" and "big" under tensors.
    accumulator = accumulate(tmp_path)
    assert accumulator.Tags()["scalars"] == ["a"]
    assert sorted(accumulator.Tags()["tensors"]) == ["big", "t"]
    ((wall_time, step, value),) = [(e.wall_time, e.step, e.value) for e in accumulator.Scalars("a")]
    assert (wall_time, step, value) == (1_700_000_000.25, 3, 0.5)


def test_training_summaries_as_tensorboard_reads_them(tmp_path):
    with SummaryWriter(tmp_path / "run") as writer:
        losses, logits, norms, _ = train(4, writer=writer, outside=True)
    accumulator = accumulate(tmp_path / "run")
    tags = accumulator.Tags()
    assert sorted(tags["scalars"]) == ["outside/step", "train/grad_norm", "train/loss"]
    assert tags["tensors"] == ["train/logits0"]
    loss = accumulator.Scalars("train/loss")
    assert [(e.step, e.value) for e in loss] == [(s + 1, float(v)) for s, v in enumerate(losses)]
    norm = accumulator.Scalars("train/grad_norm")
    assert [(e.step, e.value) for e in norm] == [(s + 1, float(v)) for s, v in enumerate(norms)]
    outside = accumulator.Scalars("outside/step")
    assert [(e.step, e.value) for e in outside] == [(s + 1, 10.0 * s) for s in range(4)]
    tensors = accumulator.Tensors("train/logits0")
    assert [e.step for e in tensors] == [1, 2, 3, 4]
    for event, want in zip(tensors, logits):
        got = tensor_util.make_ndarray(event.tensor_proto)
        assert got.dtype == np.float32 and got.shape == (4,)
        np.testing.assert_array_equal(got, want)
    # Wall times are when each step's summaries were written, in order, and cerebrax's
    # reader agrees with TensorBoard's on every one.
    walls = [e.wall_time for e in loss]
    assert walls == sorted(walls)
    ours = SummaryReader(tmp_path / "run").read_scalar("train/loss")
    assert [tuple(e) for e in ours] == [(e.wall_time, e.step, e.value) for e in loss]


@pytest.mark.parametrize(
    "array",
    [
        np.float32(1.5) * np.ones((2, 3), np.float32),
        np.array(2.25, np.float64),
        np.arange(12, dtype=np.int64).reshape(3, 4) - 6,
        np.array([True, False, True]),
        np.linspace(-1, 1, 7).astype(np.float16),
        np.linspace(-1, 1, 7).astype(ml_dtypes.bfloat16),
        np.arange(6, dtype=np.uint8),
        np.arange(5, dtype=np.uint32) * 1_000_000_000,
        np.array([0, 2**64 - 1], np.uint64),
        np.arange(4, dtype=np.int8) - 2,
        np.array([1 + 2j, -3j], np.complex64),
        np.zeros((0, 3), np.float32),
        np.random.default_rng(0).normal(size=(64, 300)).astype(np.float32),
    ],
    ids=lambda a: f"{a.dtype}{a.shape}",
)
def test_tensors_round_trip_exactly(tmp_path, array):
    with SummaryWriter(tmp_path) as writer:
        writer.add_tensor("x", array, 7)
    ((step, got),) = SummaryReader(tmp_path).tensors("x")
    assert step == 7 and got.dtype == array.dtype and got.shape == array.shape
    np.testing.assert_array_equal(got, array)
    if array.dtype != ml_dtypes.bfloat16:  # TensorBoard alone has no numpy bfloat16
        (event,) = accumulate(tmp_path).Tensors("x")
        np.testing.assert_array_equal(tensor_util.make_ndarray(event.tensor_proto), array)


def test_tensors_of_other_byte_orders_and_layouts_read_back(tmp_path):
    big_endian = np.arange(6, dtype=">i4").reshape(2, 3)
    with SummaryWriter(tmp_path) as writer:
        writer.add_tensor("big_endian", big_endian, 1)
        writer.add_tensor("transposed", big_endian.T, 1)
        with pytest.raises(cstorch.ConfigError, match="has no TensorBoard type"):
            writer.add_tensor("text", np.array(["a", "b"]), 1)
    reader = SummaryReader(tmp_path)
    ((_, got),) = reader.tensors("big_endian")
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, big_endian)
    np.testing.assert_array_equal(reader.tensors("transposed")[0][1], big_endian.T)
    assert reader.tags()["tensors"] == ["big_endian", "transposed"]


def test_reader_detects_corruption(tmp_path):
    with SummaryWriter(tmp_path) as writer:
        for step in range(5):
            writer.add_scalar("loss", 1.0 / (step + 1), step)
    (path,) = event_files(tmp_path)
    data = path.read_bytes()
    assert len(SummaryReader(tmp_path).scalars("loss")) == 5
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(flipped))
    with pytest.raises(SummaryError, match="is damaged at byte"):
        SummaryReader(tmp_path)
    path.write_bytes(data[:-3])  # a run killed mid-write
    with pytest.raises(SummaryError, match="ends inside"):
        SummaryReader(tmp_path)
    assert issubclass(SummaryError, cstorch.CerebraxError)


def test_reader_errors_name_what_is_missing(tmp_path):
    with pytest.raises(SummaryError, match="No event files"):
        SummaryReader(tmp_path)
    with SummaryWriter(tmp_path) as writer:
        writer.add_scalar("loss", 1.0, 1)
    reader = SummaryReader(tmp_path)
    with pytest.raises(SummaryError, match=r"Scalar tags there: \['loss'\]"):
        reader.scalars("los")
    with pytest.raises(SummaryError, match="its steps are"):
        reader.read_scalar("loss", step=2)


def test_reader_without_tensorboard_says_how_to_install_it(tmp_path, monkeypatch):
    for name in [n for n in sys.modules if n == "tensorboard" or n.startswith("tensorboard.")]:
        monkeypatch.setitem(sys.modules, name, None)  # `import tensorboard` now fails
    monkeypatch.delitem(sys.modules, "cerebrax.summaries._loader", raising=False)
    with SummaryWriter(tmp_path) as writer:  # writing needs only tensorboardX
        writer.add_scalar("loss", 1.0, 1)
    with pytest.raises(SummaryError, match=r'pip install "cerebrax\[tensorboard\]"'):
        SummaryReader(tmp_path)


def test_reader_reads_a_file_still_being_written(tmp_path):
    writer = SummaryWriter(tmp_path, flush_secs=3600)
    writer.add_scalar("loss", 1.0, 1)
    writer.flush()
    reader = SummaryReader(writer.file_path)
    assert reader.scalars("loss") == [(1, 1.0)] and reader.file_versions == ["brain.Event:2"]
    writer.add_scalar("loss", 0.5, 2)
    writer.close()
    reader.reload()
    assert reader.scalars("loss") == [(1, 1.0), (2, 0.5)]


def test_writer_after_close_raises(tmp_path):
    writer = SummaryWriter(tmp_path)
    writer.close()
    writer.close()
    with pytest.raises(cstorch.ConfigError, match="closed"):
        writer.add_scalar("x", 1.0, 1)


# ---- misuse ---------------------------------------------------------------------------------


def test_misuse_errors(tmp_path):
    model = compiled_mlp()
    x = batches(1)[0][0]

    @cstorch.trace
    def python_number(x):
        cstorch.summarize_scalar("lr", 0.1)
        return model(x).sum()

    with pytest.raises(cstorch.StateError, match="Python number inside the traced step"):
        python_number(x)

    @cstorch.trace
    def not_a_scalar(x):
        cstorch.summarize_scalar("logits", model(x))
        return model(x).sum()

    with pytest.raises(cstorch.ConfigError, match="needs a single value, got shape"):
        not_a_scalar(x)

    loader = cstorch.utils.data.DataLoader(lambda: [x], num_steps=1)
    with pytest.raises(cstorch.ConfigError, match="needs an object with add_scalar"):
        cstorch.utils.data.DataExecutor(loader, writer=object())

    class ScalarsOnly:
        def add_scalar(self, tag, value, step):
            pass

    executor = cstorch.utils.data.DataExecutor(loader, writer=ScalarsOnly(), progress_bar=False)
    with pytest.raises(cstorch.ConfigError, match="needs a writer with add_tensor"):
        for _ in executor:
            cstorch.summarize_tensor("w", np.ones(2))
    with pytest.raises(cstorch.ConfigError, match="non-empty string"):
        cstorch.summarize_scalar("", 1.0)


def test_public_names():
    for name in ("summarize_scalar", "summarize_tensor"):
        assert getattr(cstorch, name) is getattr(cstorch.utils.tensorboard, name)
    for name in ("SummaryWriter", "SummaryReader", "SummaryError", "ScalarEvent", "TensorEvent"):
        assert getattr(cstorch.utils.tensorboard, name) is getattr(cstorch.summaries, name)


# ---- a full disk ----------------------------------------------------------------------------
def _full_disk(*args):
    import errno

    raise OSError(errno.ENOSPC, "No space left on device")


def test_an_event_file_that_cannot_be_written_fails_at_once_and_is_removed(
        tmp_path, monkeypatch):
    import tensorboardX.record_writer

    monkeypatch.setattr(tensorboardX.record_writer.RecordWriter, "flush", _full_disk)
    with pytest.raises(SummaryError, match=r"Could not write the TensorBoard event file "
                                           r".*events\.out\.tfevents\..*No space left"):
        SummaryWriter(tmp_path / "logs")
    assert list((tmp_path / "logs").iterdir()) == []


def test_a_failed_close_raises_once_and_closes_the_writer(tmp_path, monkeypatch):
    import tensorboardX.record_writer

    writer = SummaryWriter(tmp_path)
    writer.add_scalar("loss", 1.0, 1)
    def close(records):  # the file closes, but its last buffered bytes did not fit
        records._writer.close()
        _full_disk()

    monkeypatch.setattr(tensorboardX.record_writer.RecordWriter, "close", close)
    with pytest.raises(SummaryError, match="No space left on device"):
        writer.close()
    writer.close()  # closed: a second close does nothing
    with pytest.raises(cstorch.errors.ConfigError, match="is closed"):
        writer.add_scalar("loss", 2.0, 2)


# ---- what torch's and cstorch's writers expose (Model Zoo's TensorBoard logger) --------
def test_add_text_is_read_by_tensorboard_as_text(tmp_path):
    with SummaryWriter(tmp_path) as writer:
        writer.add_text("config", "lr: 0.1\n**bold**", global_step=3)
        writer.add_scalar("loss", 0.5, global_step=3)
    accumulator = EventAccumulator(str(tmp_path), size_guidance={"tensors": 0})
    accumulator.Reload()
    (event,) = accumulator.Tensors("config")
    assert event.step == 3
    assert tensor_util.make_ndarray(event.tensor_proto).tolist() == [b"lr: 0.1\n**bold**"]
    metadata = accumulator.SummaryMetadata("config")
    assert metadata.plugin_data.plugin_name == "text"
    assert SummaryReader(tmp_path).scalars("loss") == [(3, 0.5)]
    with pytest.raises(cstorch.ConfigError, match="takes a str"):
        SummaryWriter(tmp_path / "other").add_text("x", 3)


def test_the_file_writer_names_the_event_file_and_cs_events_dir_exists(tmp_path):
    """Model Zoo links ``tf_events`` to ``_get_file_writer().event_writer._file_name`` and
    ``cs_events`` to ``cs_events_dir``."""
    import os

    with SummaryWriter(tmp_path / "events") as writer:
        path = writer._get_file_writer().event_writer._file_name
        assert path == writer.file_path and os.path.isfile(path)
        link = tmp_path / "tf_events"
        link.symlink_to(os.path.relpath(os.path.realpath(path), tmp_path))
        assert link.resolve() == pathlib.Path(path).resolve()
        assert os.path.isdir(writer.cs_events_dir)
        assert os.path.dirname(writer.cs_events_dir) == str(tmp_path / "events")
    # the folder is not an event file: the reader still finds the one writer's file only
    assert SummaryReader(tmp_path / "events").tags() == {"scalars": [], "tensors": []}
