"""Every preprocessing op against hand-computed examples, and its error messages."""

from __future__ import annotations

import math

import numpy as np
import pytest

from intune.dlrm import ops

NAN = float("nan")


def test_fill_null_over_floats_objects_and_fixed_width_strings() -> None:
    chunk = {
        "x": np.array([1.0, NAN, 3.0]),
        "s": np.array(["ab", None, ""], dtype=object),
        "b": np.array([b"0a", b"", b"ff"]),
    }
    out = ops.FillNull(("x",), 0)(chunk)
    assert out["x"].tolist() == [1.0, 0.0, 3.0]
    assert np.isnan(chunk["x"][1])  # input untouched
    assert ops.FillNull("s", "00")(chunk)["s"].tolist() == ["ab", "00", "00"]
    assert ops.FillNull("b", "0")(chunk)["b"].tolist() == [b"0a", b"0", b"ff"]


def test_cast_and_its_refusal_of_missing_values() -> None:
    out = ops.Cast("x", "int32")({"x": np.array([1.7, -2.2])})
    assert out["x"].dtype == np.int32 and out["x"].tolist() == [1, -2]
    with pytest.raises(ValueError, match="column 'x' has missing values; apply FillNull"):
        ops.Cast("x", "int64")({"x": np.array([1.0, NAN])})


def test_clamp() -> None:
    out = ops.Clamp(("a",), min=0, max=10)({"a": np.array([-5, 3, 12])})
    assert out["a"].tolist() == [0, 3, 10]
    assert ops.Clamp("a", max=2)({"a": np.array([-5, 3])})["a"].tolist() == [-5, 2]


def test_log1p_is_the_dlrm_reference_transform() -> None:
    out = ops.Log1p("i")({"i": np.array([-3, 0, 1, math.e - 1, 99])})["i"]
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, [0.0, 0.0, math.log(2), 1.0, math.log(100)], rtol=1e-6)


def test_logit() -> None:
    out = ops.Logit("p", eps=0.01)({"p": np.array([0.5, 0.75, 0.0, 1.0])})["p"]
    np.testing.assert_allclose(
        out, [0.0, math.log(3), math.log(0.01 / 0.99), math.log(0.99 / 0.01)], rtol=1e-6
    )


def test_box_cox() -> None:
    x = {"x": np.array([1.0, 4.0, 9.0])}
    np.testing.assert_allclose(ops.BoxCox("x", 0.5)(x)["x"], [0.0, 2.0, 4.0])  # (sqrt(x) - 1) / 0.5
    np.testing.assert_allclose(ops.BoxCox("x", 0.0)(x)["x"], [0.0, math.log(4), math.log(9)], rtol=1e-6)
    with pytest.raises(ValueError, match="column 'x' row 1 is 0.0; Box-Cox needs positive values"):
        ops.BoxCox("x", 1.0)({"x": np.array([1.0, 0.0])})


def test_bucketize_counts_borders_at_or_below_and_gives_missing_its_own_bucket() -> None:
    op = ops.Bucketize("x", (0.0, 1.0, 10.0), out="xb")
    out = op({"x": np.array([-1.0, 0.0, 0.5, 1.0, 9.9, 10.0, 1e9, NAN])})
    assert out["xb"].tolist() == [0, 1, 1, 2, 2, 3, 3, 4]
    assert op.num_buckets == 5
    with pytest.raises(ValueError, match="strictly increasing"):
        ops.Bucketize("x", (1.0, 1.0))


def test_onehot() -> None:
    out = ops.Onehot("c", 3)({"c": np.array([2, 0])})["c"]
    assert out.tolist() == [[0, 0, 1], [1, 0, 0]]
    with pytest.raises(ValueError, match="row 1 is 3, outside \\[0, 3\\)"):
        ops.Onehot("c", 3)({"c": np.array([0, 3])})


def _splitmix64_by_hand(x: int, salt: int) -> int:
    mask = (1 << 64) - 1
    z = (x + salt * 0x9E3779B97F4A7C15 + 0x9E3779B97F4A7C15) & mask
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    return z ^ (z >> 31)


def test_sigrid_hash_matches_the_formula_in_python_integers() -> None:
    ids = [0, 1, 12345, -7, 2**62]
    out = ops.SigridHash("id", salt=42, max_value=1000)({"id": np.array(ids, dtype=np.int64)})["id"]
    expected = [_splitmix64_by_hand(x & ((1 << 64) - 1), 42) % 1000 for x in ids]
    assert out.tolist() == expected
    assert _splitmix64_by_hand(0, 0) == 0xE220A8397B1DCDAF  # the published first splitmix64 output for seed 0
    other_salt = ops.SigridHash("id", salt=43, max_value=1000)({"id": np.array(ids)})["id"]
    assert other_salt.tolist() != out.tolist()


def test_hex_hash_is_int_of_hex_modulo_table_with_missing_as_zero() -> None:
    chunk = {"c": np.array(["0000000a", "000000ff", None, "68fd1e64"], dtype=object)}
    out = ops.HexHash("c", 7)(chunk)["c"]
    assert out.tolist() == [10 % 7, 255 % 7, 0, 0x68FD1E64 % 7]
    fixed = {"c": np.array([b"0000000A", b"", b"10"])}
    assert ops.HexHash("c", 1000)(fixed)["c"].tolist() == [10, 0, 16]
    with pytest.raises(ValueError, match="column 'c' row 1: .*'00zz' is not a hex ID"):
        ops.HexHash("c", 7)({"c": np.array(["0a", "00zz"])})


def test_first_x_keeps_the_head_of_each_list() -> None:
    chunk = {"h.values": np.array([1, 2, 3, 4, 5, 6]), "h.lengths": np.array([3, 0, 1, 2])}
    out = ops.FirstX("h", 2)(chunk)
    assert out["h.values"].tolist() == [1, 2, 4, 5, 6]
    assert out["h.lengths"].tolist() == [2, 0, 1, 2]
    with pytest.raises(ValueError, match="h.lengths sums to 5 but h.values has 6"):
        ops.FirstX("h", 2)({"h.values": np.arange(6), "h.lengths": np.array([5])})


def test_ngram_folds_consecutive_ids() -> None:
    base = ops.NGRAM_BASE
    chunk = {"h.values": np.array([1, 2, 3, 7, 8]), "h.lengths": np.array([3, 1, 0, 1])}
    chunk["h.lengths"] = np.array([3, 1, 1, 0])
    out = ops.NGram("h", 2)(chunk)
    assert out["h_ngram2.values"].tolist() == [1 * base + 2, 2 * base + 3]
    assert out["h_ngram2.lengths"].tolist() == [2, 0, 0, 0]
    tri = ops.NGram("h", 3, out="t")({"h.values": np.array([1, 2, 3, 4]), "h.lengths": np.array([4])})
    assert tri["t.values"].tolist() == [(1 * base + 2) * base + 3, (2 * base + 3) * base + 4]


def test_map_id_with_default() -> None:
    op = ops.MapId("c", {100: 1, 7: 2, 55: 3}, default=0, out="m")
    assert op({"c": np.array([7, 8, 100, 55, -1])})["m"].tolist() == [2, 0, 1, 3, 0]
    assert ops.MapId("c", {})({"c": np.array([1, 2])})["c"].tolist() == [0, 0]


def test_build_vocabulary_orders_by_frequency() -> None:
    assert ops.build_vocabulary(np.array([5, 9, 9, 3, 9, 5]), top=2, start=1) == {9: 1, 5: 2}


def test_cartesian_of_scalars_and_of_lists() -> None:
    base = ops.NGRAM_BASE
    out = ops.Cartesian("a", "b", "ab")({"a": np.array([1, 2]), "b": np.array([3, 4])})
    assert out["ab"].tolist() == [1 * base + 3, 2 * base + 4]
    assert ops.Cartesian("a", "b", "ab", table_size=10)({"a": np.array([1]), "b": np.array([3])})[
        "ab"
    ].tolist() == [(base + 3) % 10]
    lists = {
        "a.values": np.array([1, 2, 5]),
        "a.lengths": np.array([2, 1, 0]),
        "b.values": np.array([10, 20, 30, 40]),
        "b.lengths": np.array([2, 1, 1]),
    }
    out = ops.Cartesian("a", "b", "x")(lists)
    assert out["x.lengths"].tolist() == [4, 1, 0]
    assert out["x.values"].tolist() == [
        1 * base + 10,
        1 * base + 20,
        2 * base + 10,
        2 * base + 20,
        5 * base + 30,
    ]


def test_stack_and_compose_make_a_udf() -> None:
    udf = ops.Compose((ops.FillNull(("a", "b"), 0), ops.Log1p(("a", "b")), ops.Stack(("a", "b"), "dense")))
    out = udf({"a": np.array([0.0, NAN]), "b": np.array([math.e - 1, 1.0]), "label": np.array([1, 0])})
    assert sorted(out) == ["dense", "label"]
    np.testing.assert_allclose(out["dense"], [[0.0, 1.0], [0.0, math.log(2)]], rtol=1e-6)


def test_missing_column_is_named() -> None:
    with pytest.raises(KeyError, match="Log1p: chunk has no column 'I9'"):
        ops.Log1p("I9")({"I1": np.array([1])})


def test_ops_pickle_for_process_workers() -> None:
    import pickle

    op = ops.Compose((ops.MapId("c", {1: 2}), ops.SigridHash("c", 1, 10)))
    assert (
        pickle.loads(pickle.dumps(op))({"c": np.array([1])})["c"].tolist()
        == op({"c": np.array([1])})["c"].tolist()
    )
