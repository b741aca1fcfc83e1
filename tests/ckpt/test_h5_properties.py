"""``cstorch.save`` then ``cstorch.load`` is the identity, for random trees (hypothesis).

Trees nest dicts (str or int keys, one key type per dict), lists and tuples; leaves are
numpy arrays and scalars, jax arrays and torch tensors of every supported dtype, with
arbitrary bit patterns (NaN payloads, infinities, -0.0, subnormals), and Python
``None``/``bool``/``int``/``float``/``str``. What comes back has the same containers,
keys in the same order, and every array bit for bit (tests/ckpt/test_h5.py has the
hand-picked cases).
"""

from __future__ import annotations

import pathlib
import tempfile

import jax
import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cerebrax as cstorch

torch = pytest.importorskip("torch")

# conftest's autouse fixture is per test, not per example; each example writes to a
# directory of its own, so the examples share nothing.
PROPERTY = settings(max_examples=30, suppress_health_check=[HealthCheck.function_scoped_fixture])

_NUMPY_DTYPES = [np.dtype(name) for name in (
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64", "complex64", "complex128")] + [np.dtype(ml_dtypes.bfloat16)]
# jax without jax_enable_x64 holds no 64-bit types.
_JAX_DTYPES = [d for d in _NUMPY_DTYPES if jax.dtypes.canonicalize_dtype(d) == d]
_TORCH_DTYPES = [d for d in _NUMPY_DTYPES if d.name not in ("uint16", "uint32", "uint64")]


@st.composite
def bit_patterns(draw, dtypes, max_dims=3):
    """A numpy array of one of ``dtypes`` holding arbitrary bits (0 or 1 for bool)."""
    dtype = draw(st.sampled_from(dtypes))
    shape = tuple(draw(st.lists(st.integers(0, 4), max_size=max_dims)))
    size = int(np.prod(shape))
    if dtype == np.bool_:
        return np.array(draw(st.lists(st.booleans(), min_size=size, max_size=size)),
                        bool).reshape(shape)
    data = draw(st.binary(min_size=size * dtype.itemsize, max_size=size * dtype.itemsize))
    return np.frombuffer(data, dtype).reshape(shape).copy()


def _torch_tensor(array):
    if array.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)


arrays = st.one_of(
    bit_patterns(_NUMPY_DTYPES),
    bit_patterns(_NUMPY_DTYPES, max_dims=0).map(lambda a: a[()]),  # numpy scalars
    bit_patterns(_JAX_DTYPES).map(jax.numpy.asarray),
    bit_patterns(_TORCH_DTYPES).map(_torch_tensor),
)
python_leaves = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text())
str_keys = st.text(st.characters(exclude_characters="."), max_size=6)


def _containers(children):
    return st.one_of(
        st.dictionaries(str_keys, children, max_size=4),
        st.dictionaries(st.integers(-3, 1000), children, max_size=4),
        st.lists(children, max_size=4),
        st.lists(children, max_size=4).map(tuple),
    )


trees = _containers(st.recursive(st.one_of(arrays, python_leaves), _containers, max_leaves=10))


def _expected_bits(leaf) -> np.ndarray:
    """The numpy array a saved array leaf loads as (its bits, never cast)."""
    if isinstance(leaf, torch.Tensor):
        if leaf.dtype == torch.bfloat16:
            return leaf.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        return leaf.numpy()
    return np.asarray(leaf)


def assert_same_tree(got, want, where="root"):
    if isinstance(want, dict):
        assert type(got) is dict, where
        assert [(type(k), k) for k in got] == [(type(k), k) for k in want], where
        for key in want:
            assert_same_tree(got[key], want[key], f"{where}[{key!r}]")
    elif isinstance(want, (list, tuple)):
        assert type(got) is type(want) and len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want)):
            assert_same_tree(g, w, f"{where}[{i}]")
    elif isinstance(want, (np.ndarray, np.generic, jax.Array, torch.Tensor)):
        if isinstance(got, cstorch.ckpt.LazyArray):
            got = got.numpy()
        expected = _expected_bits(want)
        assert type(got) is (type(want) if isinstance(want, np.generic) else np.ndarray), where
        actual = np.asarray(got)
        assert (actual.dtype, actual.shape) == (expected.dtype, expected.shape), where
        assert actual.tobytes() == expected.tobytes(), where
    else:
        assert type(got) is type(want), where
        assert repr(got) == repr(want), where  # tells nan, -0.0 and inf apart


@PROPERTY
@given(tree=trees)
def test_save_then_load_is_the_identity(tree):
    with tempfile.TemporaryDirectory() as directory:
        path = pathlib.Path(directory) / "state.mdl"
        cstorch.save(tree, path)
        assert_same_tree(cstorch.load(path), tree)  # lazy arrays
        assert_same_tree(cstorch.load(path, map_location="cache"), tree)  # numpy arrays
