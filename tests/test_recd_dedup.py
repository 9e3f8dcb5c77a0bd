"""The dedup transform and group UDFs: hand-computed batches, round trips, errors, unique-only UDFs."""

import numpy as np
import pytest

from intune.recd import IKJT, GroupUDF, dedup_transform
from intune.recd.dedup import find_unique_rows


def _batch() -> dict:
    # rows 0,1,3 share a user; row 2 has the same id but another history; row 4 is new
    return {
        "user_id": np.array([5, 5, 5, 5, 8]),
        "clicks": np.array([1.5, 1.5, 1.5, 1.5, 0.0], dtype=np.float32),
        "hist.values": np.array([1, 2, 1, 2, 1, 3, 1, 2, 9]),
        "hist.lengths": np.array([2, 2, 2, 2, 1]),
        "item_id": np.array([10, 11, 12, 13, 14]),
        "label": np.array([0, 1, 0, 0, 1], dtype=np.int8),
    }


def test_dedup_finds_unique_rows_in_first_appearance_order():
    out = dedup_transform({"user": ["user_id", "clicks", "hist"]})(_batch())
    assert out["user.inverse"].tolist() == [0, 0, 1, 0, 2]
    assert out["user.unique.user_id"].tolist() == [5, 5, 8]
    assert out["user.unique.hist.lengths"].tolist() == [2, 2, 1]
    assert out["user.unique.hist.values"].tolist() == [1, 2, 1, 3, 9]
    assert out["item_id"].tolist() == [10, 11, 12, 13, 14]  # other columns pass through
    assert "user_id" not in out and "hist.values" not in out


def test_round_trip_restores_the_plain_batch():
    batch = _batch()
    out = dedup_transform({"user": ["user_id", "clicks", "hist.values", "hist.lengths"]})(batch)
    plain = IKJT.from_chunk(out, "user").to_jagged()
    for name in ("user_id", "clicks", "hist.values", "hist.lengths"):
        np.testing.assert_array_equal(plain[name], batch[name])


def test_batch_without_duplication_keeps_every_row():
    batch = {"user_id": np.arange(6), "item_id": np.arange(6)}
    out = dedup_transform({"user": ["user_id"]})(batch)
    assert out["user.inverse"].tolist() == list(range(6))
    assert out["user.unique.user_id"].tolist() == list(range(6))


def test_empty_lists_and_prefix_lists_are_distinct_rows():
    batch = {"h.values": np.array([1, 1, 1]), "h.lengths": np.array([0, 1, 2, 0])}
    assert find_unique_rows(batch, ["h"])[1].tolist() == [0, 1, 2, 0]


def test_float_bits_decide_equality():
    batch = {"x": np.array([0.0, -0.0, np.nan, np.nan, 0.0])}
    assert find_unique_rows(batch, ["x"])[1].tolist() == [0, 1, 2, 2, 0]


def test_random_batches_match_exact_python_dedup():
    rng = np.random.default_rng(3)
    for _ in range(20):
        n = int(rng.integers(1, 200))
        lengths = rng.integers(0, 4, n)
        batch = {"a": rng.integers(0, 3, n), "h.values": rng.integers(0, 2, int(lengths.sum())), "h.lengths": lengths}
        first, inverse = find_unique_rows(batch, ["a", "h"])
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        rows = [(batch["a"][i], tuple(batch["h.values"][offsets[i]:offsets[i + 1]])) for i in range(n)]
        expected: dict = {}
        want = [expected.setdefault(r, len(expected)) for r in rows]
        assert inverse.tolist() == want
        assert [rows[i] for i in first] == list(expected)


def test_missing_column_is_a_value_error_naming_it():
    with pytest.raises(ValueError, match=r"dedup group 'user' names column 'user_age', which is not in the batch"):
        dedup_transform({"user": ["user_id", "user_age"]})(_batch())


def test_bad_group_specs():
    with pytest.raises(ValueError, match="at least one group"):
        dedup_transform({})
    with pytest.raises(ValueError, match="non-empty list"):
        dedup_transform({"user": "user_id"})
    with pytest.raises(ValueError, match="is in dedup groups 'a' and 'b'"):
        dedup_transform({"a": ["x"], "b": ["x.values"]})


def test_group_udf_runs_on_unique_rows_only_and_matches_plain():
    seen = []

    def user_udf(rows):
        seen.append(len(rows["user_id"]))
        return {"user_id": rows["user_id"] * 2, "hist.values": rows["hist.values"][::1] + 100,
                "hist.lengths": rows["hist.lengths"], "clicks": rows["clicks"]}

    udf = GroupUDF("user", ["user_id", "clicks", "hist"], user_udf)
    plain = udf(_batch())
    deduped = udf(dedup_transform({"user": ["user_id", "clicks", "hist"]})(_batch()))
    assert seen == [5, 3]
    expanded = IKJT.from_chunk(deduped, "user").to_jagged()
    for name in ("user_id", "clicks", "hist.values", "hist.lengths"):
        np.testing.assert_array_equal(expanded[name], plain[name])
    assert plain["user_id"].tolist() == [10, 10, 10, 10, 16]


def test_group_udf_that_changes_row_count_is_an_error():
    udf = GroupUDF("user", ["user_id"], lambda rows: {"user_id": rows["user_id"][:1]}, name="trim")
    with pytest.raises(ValueError, match="UDF 'trim' of group 'user' returned 1 rows"):
        udf(dedup_transform({"user": ["user_id"]})(_batch()))


def test_vector_columns_dedup_by_whole_row():
    dense = np.array([[1.0, 2.0], [1.0, 2.0], [1.0, 3.0], [1.0, 2.0]], dtype=np.float32)
    out = dedup_transform({"user": ["dense"]})({"dense": dense, "item_id": np.arange(4)})
    assert out["user.inverse"].tolist() == [0, 0, 1, 0]
    np.testing.assert_array_equal(IKJT.from_chunk(out, "user").to_jagged()["dense"], dense)


def test_hash_collisions_fall_back_to_exact(monkeypatch):
    import intune.recd.dedup as dedup

    monkeypatch.setattr(dedup, "row_keys", lambda chunk, keys, lists=True: np.zeros(len(chunk["a"]), np.uint64))
    first, inverse = dedup.find_unique_rows({"a": np.array([3, 4, 3, 5])}, ["a"])
    assert first.tolist() == [0, 1, 3] and inverse.tolist() == [0, 1, 0, 2]


def test_min_saving_leaves_batches_with_few_repeats_plain():
    batch = {"user_id": np.array([1, 2, 3, 4, 4]), "item_id": np.arange(5)}
    kept = dedup_transform({"user": ["user_id"]}, min_saving=0.25)(batch)  # would save 1 of 5 rows
    assert "user.inverse" not in kept and kept["user_id"].tolist() == [1, 2, 3, 4, 4]
    encoded = dedup_transform({"user": ["user_id"]}, min_saving=0.2)(batch)
    assert encoded["user.inverse"].tolist() == [0, 1, 2, 3, 3]
    with pytest.raises(ValueError, match=r"min_saving must be in \[0, 1\)"):
        dedup_transform({"user": ["user_id"]}, min_saving=1.0)
