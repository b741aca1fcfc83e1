"""partition / combine: the one way cerebrax splits a pytree into its arrays and the rest."""

from __future__ import annotations

import pickle

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cerebrax._tree import ARRAY, Skeleton, TorchLeaf, combine, partition


def test_round_trip_keeps_structure_statics_and_order():
    tree = ({"b": jnp.ones(2), "a": 3, "c": [jnp.zeros(1), "s", None]}, (np.float32(1.5),))
    arrays, skeleton = partition(tree)
    leaves, _ = jax.tree.flatten(tree)
    assert [a is x for a, x in zip(arrays, [leaves[1], leaves[2]])] == [True, True]
    assert skeleton.leaves == (3, ARRAY, ARRAY, "s", np.float32(1.5))
    assert skeleton.statics == (3, "s", np.float32(1.5))
    assert skeleton.torch_dtypes == (None, None)
    back = combine(arrays, skeleton)
    assert jax.tree.structure(back) == jax.tree.structure(tree)
    assert all(x is y for x, y in zip(jax.tree.leaves(back), jax.tree.leaves(tree)))


def test_combine_places_new_arrays_and_ignores_extra_ones():
    _, skeleton = partition([jnp.ones(1), 7, jnp.ones(2)])
    out = combine([np.zeros(1), np.zeros(2), "unused"], skeleton)
    assert out[1] == 7 and out[0].shape == (1,) and out[2].shape == (2,)


def test_a_custom_array_of_decides_what_travels():
    tree = {"x": np.ones(2), "n": jnp.int32(4), "f": jnp.ones(3)}
    floats, skeleton = partition(tree, lambda x: (x, None) if x.dtype.kind == "f" else None)
    assert [f.shape for f in floats] == [(3,), (2,)]  # keys sorted: f, n, x
    assert skeleton.statics == (jnp.int32(4),)
    assert combine([jnp.zeros(3), jnp.zeros(2)], skeleton)["n"] is tree["n"]


def test_a_skeleton_keys_a_cache_where_its_leaves_are_hashable():
    one = partition((jnp.ones(2), {"k": 1}))[1]
    same = partition((jnp.zeros(2), {"k": 1}))[1]
    other = partition((jnp.zeros(2), {"k": 2}))[1]
    assert one == same and hash(one) == hash(same)
    assert one != other
    assert pickle.loads(pickle.dumps(ARRAY)) is ARRAY


def test_torch_leaves_carry_their_dtype_through():
    arrays, skeleton = partition([TorchLeaf(jnp.ones(2), "bfloat16"), jnp.ones(1)])
    assert skeleton.torch_dtypes == ("bfloat16", None)
    back = combine(arrays, skeleton, torch=TorchLeaf)
    assert back[0] == TorchLeaf(arrays[0], "bfloat16") and back[1] is arrays[1]
    assert combine(arrays, skeleton)[0] is arrays[0]  # without ``torch``: the arrays


def test_a_torch_tensor_is_a_leaf_and_a_step_tensor_travels_as_its_array():
    torch = pytest.importorskip("torch")
    from torch_bridge import JaxTensor

    host = torch.ones(2, dtype=torch.float16)
    step = JaxTensor(jnp.ones(3, jnp.bfloat16), torch.bfloat16)
    arrays, skeleton = partition({"host": host, "step": step})
    assert skeleton.statics == (host,)  # a host tensor stays where it is
    assert len(arrays) == 1 and isinstance(arrays[0], jax.Array)
    assert skeleton.torch_dtypes == (torch.bfloat16,)
    assert isinstance(skeleton, Skeleton)
