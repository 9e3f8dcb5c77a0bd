"""IKJT: hand-built examples, validation errors, chunk encoding, torchrec conversion."""

import numpy as np
import pytest

from intune.recd import IKJT


def _example() -> IKJT:
    # unique rows: u0 = (id 7, hist [1, 2]), u1 = (id 9, hist []), u2 = (id 7, hist [3])
    return IKJT(
        group="user",
        keys=("user_id", "hist"),
        values={"user_id": np.array([7, 9, 7]), "hist": np.array([1, 2, 3])},
        lengths={"hist": np.array([2, 0, 1])},
        inverse=np.array([0, 0, 2, 1, 0]),
    )


def test_to_jagged_expands_each_row_to_its_unique_row():
    plain = _example().to_jagged()
    assert plain["user_id"].tolist() == [7, 7, 7, 9, 7]
    assert plain["hist.lengths"].tolist() == [2, 2, 1, 0, 2]
    assert plain["hist.values"].tolist() == [1, 2, 1, 2, 3, 1, 2]


def test_shape_and_offsets():
    ikjt = _example()
    assert (ikjt.num_unique, ikjt.batch_size) == (3, 5)
    assert ikjt.offsets("hist").tolist() == [0, 2, 2, 3]
    assert ikjt.offsets("user_id").tolist() == [0, 1, 2, 3]


def test_chunk_encoding_round_trips():
    ikjt = _example()
    chunk = ikjt.to_chunk()
    assert sorted(chunk) == ["user.inverse", "user.unique.hist.lengths", "user.unique.hist.values",
                             "user.unique.user_id"]
    back = IKJT.from_chunk({**chunk, "item_id": np.arange(5)}, "user")
    assert back.keys == ikjt.keys
    for name, col in ikjt.to_jagged().items():
        np.testing.assert_array_equal(back.to_jagged()[name], col)


@pytest.mark.parametrize("bad", [3, -1, 10])
def test_inverse_out_of_range_is_a_value_error(bad):
    with pytest.raises(ValueError, match=rf"inverse index {bad} at batch row 1 is out of range \[0, 3\)"):
        IKJT(group="user", keys=("user_id",), values={"user_id": np.array([1, 2, 3])},
             inverse=np.array([0, bad, 1]))


def test_inconsistent_parts_are_value_errors():
    with pytest.raises(ValueError, match="has 3 values but its lengths sum to 2"):
        IKJT(group="u", keys=("h",), values={"h": np.array([1, 2, 3])}, lengths={"h": np.array([1, 1])},
             inverse=np.array([0]))
    with pytest.raises(ValueError, match="key 'b' has 1 unique rows, expected 2"):
        IKJT(group="u", keys=("a", "b"), values={"a": np.array([1, 2]), "b": np.array([1])},
             inverse=np.array([0, 1]))
    with pytest.raises(ValueError, match="1-D integer"):
        IKJT(group="u", keys=("a",), values={"a": np.array([1])}, inverse=np.array([0.0]))
    with pytest.raises(ValueError, match="no deduplicated group 'user'"):
        IKJT.from_chunk({"item_id": np.arange(3)}, "user")


def test_empty_batch():
    ikjt = IKJT(group="u", keys=("a",), values={"a": np.zeros(0, dtype=np.int64)}, inverse=np.zeros(0, np.int64))
    assert ikjt.to_jagged()["a"].shape == (0,)


def test_to_torchrec_keyed_jagged_tensor_with_inverse_indices():
    pytest.importorskip("torchrec")
    ikjt = _example()
    kjt = ikjt.to_torchrec()
    assert kjt.keys() == ["user_id", "hist"]
    assert kjt.stride_per_key() == [3, 3]
    keys, inverse = kjt.inverse_indices()
    assert keys == ["user_id", "hist"]
    assert inverse.tolist() == [[0, 0, 2, 1, 0]] * 2
    per_key = kjt.to_dict()
    assert per_key["hist"].lengths().tolist() == [2, 0, 1]
    assert per_key["hist"].values().tolist() == [1, 2, 3]
    assert per_key["user_id"].values().tolist() == [7, 9, 7]


def test_to_torchrec_rejects_float_keys():
    pytest.importorskip("torchrec")
    ikjt = IKJT(group="u", keys=("c", "x"), values={"c": np.array([1.5]), "x": np.array([4])},
                inverse=np.array([0, 0]))
    assert ikjt.to_torchrec().keys() == ["x"]  # dense float keys are left out by default
    with pytest.raises(ValueError, match="'c' has float64 values"):
        ikjt.to_torchrec(keys=["c"])


def test_torchrec_embedding_bag_collection_expands_to_the_plain_batch():
    pytest.importorskip("torchrec")
    import torch
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    ikjt = _example()
    torch.manual_seed(0)
    ebc = EmbeddingBagCollection(tables=[
        EmbeddingBagConfig(name="t_id", embedding_dim=4, num_embeddings=10, feature_names=["user_id"]),
        EmbeddingBagConfig(name="t_hist", embedding_dim=4, num_embeddings=10, feature_names=["hist"]),
    ])
    plain = ikjt.to_jagged()
    reference = KeyedJaggedTensor(
        keys=["user_id", "hist"],
        values=torch.from_numpy(np.concatenate([plain["user_id"], plain["hist.values"]])),
        lengths=torch.from_numpy(np.concatenate([np.ones(5, dtype=np.int64), plain["hist.lengths"]])),
    )
    torch.testing.assert_close(ebc(ikjt.to_torchrec()).values(), ebc(reference).values())
