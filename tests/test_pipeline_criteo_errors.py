"""Criteo TSV bad lines: the slow path's line check agrees with pyarrow, and errors name the true line."""

import re

import numpy as np
import pytest

import intune
from _exactly_once import assert_same_order
from intune.pipeline import SourceError, criteo
from intune.pipeline.criteo import CriteoTsvSource

pytest.importorskip("pyarrow")

CATS = [f"{k:08x}" for k in range(1, 26)]


def row(i, label="1", i1=None, c1=None):
    """A 40-field line whose C1 is the row id ``i`` (so delivered rows can be checked)."""
    ints = [str(i % 7) if i1 is None else i1, *(str(k) for k in range(12))]
    return "\t".join([label, *ints, f"{i:08x}" if c1 is None else c1, *CATS]) + "\n"


def write(path, n, bad):
    """``n`` lines, line ``k`` (1-based) replaced by ``bad[k]`` where given; returns the good ids."""
    path.write_text("".join(bad.get(i + 1, row(i)) for i in range(n)))
    return np.array([i for i in range(n) if i + 1 not in bad])


def read_all(path, on_error, block_bytes=1 << 20):
    """All C1 values delivered and the read stage's ``skipped`` metric."""
    with intune.Pipeline.from_criteo_tsv(str(path), on_error=on_error, block_bytes=block_bytes) as pipe:
        ids = np.concatenate([c["C1"] for c in pipe])
        return ids, pipe.metrics().stages["read"].skipped


def skipped_examples(path, block_bytes=1 << 20):
    """The source's kept ``(file, line, problem)`` of skipped lines, read unit by unit."""
    source = CriteoTsvSource([str(path)], 8192, "skip", block_bytes)
    for unit in range(source.units()):
        source.read_unit(unit)
    return source.skipped_lines, source.skipped_examples


INT_REJECTS = {
    "overflow": ("99999999999999999999", "is outside the int64 range"),
    "plus": ("+5", "is not an integer"),
    "underscore": ("1_000", "is not an integer"),
}


@pytest.mark.parametrize("kind", sorted(INT_REJECTS))
def test_raise_names_the_true_line_of_an_integer_pyarrow_rejects(tmp_path, kind):
    value, problem = INT_REJECTS[kind]
    path = tmp_path / "day_0"
    write(path, 40, {11: row(10, i1=value)})
    with pytest.raises(SourceError, match=rf"day_0' line 11: I1 = b'{re.escape(value)}' {problem}$"):
        read_all(path, "raise")


@pytest.mark.parametrize("kind", sorted(INT_REJECTS))
def test_skip_drops_only_the_lines_with_integers_pyarrow_rejects(tmp_path, kind):
    value, _ = INT_REJECTS[kind]
    path = tmp_path / "day_0"
    good = write(path, 40, {11: row(10, i1=value), 27: row(26, label=value)})
    ids, skipped = read_all(path, "skip")
    assert_same_order(ids, good)
    assert skipped == 2
    count, examples = skipped_examples(path)
    assert count == 2 and [line for _, line, _ in examples] == [11, 27]
    assert examples[0][0] == str(path)


SEVERAL = {
    3: row(2, i1="99999999999999999999"),
    5: row(4, i1="+5"),
    6: row(5, label="1_000"),
    9: "1\t2\tthree\n",
    12: row(11, c1="zzzzzzzz"),
    13: row(12, label=""),
    20: row(19, i1="-9223372036854775809"),
}


def test_a_block_with_several_kinds_of_bad_lines(tmp_path):
    path = tmp_path / "day_1"
    good = write(path, 30, SEVERAL)
    with pytest.raises(SourceError, match=r"day_1' line 3: I1 = b'99999999999999999999' is outside"):
        read_all(path, "raise")
    ids, skipped = read_all(path, "skip")
    assert_same_order(ids, good)
    assert skipped == len(SEVERAL)
    count, examples = skipped_examples(path)
    assert count == len(SEVERAL)
    assert [line for _, line, _ in examples] == sorted(SEVERAL)
    problems = dict((line, problem) for _, line, problem in examples)
    assert "expected 40 tab-separated fields, got 3" in problems[9]
    assert "C1 = b'zzzzzzzz' is not 8 hex digits" in problems[12]
    assert "label is missing" in problems[13]


@pytest.mark.parametrize("bad_line", [6, 31])
def test_a_bad_line_in_a_later_block_keeps_its_true_line_number(tmp_path, bad_line):
    path = tmp_path / "day_2"
    good = write(path, 60, {bad_line: row(bad_line - 1, i1="99999999999999999999")})
    offset = len("".join(row(i) for i in range(bad_line - 1)).encode())
    assert offset > 1024, "the bad line must not be in the first block"
    with pytest.raises(SourceError, match=rf"day_2' line {bad_line}: I1 = "):
        read_all(path, "raise", block_bytes=1024)
    ids, skipped = read_all(path, "skip", block_bytes=1024)
    assert_same_order(ids, good)
    assert skipped == 1
    assert [line for _, line, _ in skipped_examples(path, block_bytes=1024)[1]] == [bad_line]


def test_lines_the_fast_parser_accepts_survive_the_slow_path(tmp_path):
    """In a block that fails, every line pyarrow would accept is still delivered, with its value."""
    path = tmp_path / "day_3"
    labels = ["-7", " 7 ", "0x10", "9223372036854775807", "-0", "000000000000000000000042"]
    lines = [row(i, label=v) for i, v in enumerate(labels)]
    lines.append("\n")  # an empty line holds no row: ignored, not skipped, as by the fast parser
    lines.append("1\t2\tthree\n")  # the one malformed line: its block takes the slow path
    lines.extend(row(i) for i in range(6, 10))
    path.write_text("".join(lines))
    with intune.Pipeline.from_criteo_tsv(str(path), on_error="skip") as pipe:
        (chunk,) = list(pipe)
        assert pipe.metrics().stages["read"].skipped == 1
    assert_same_order(chunk["C1"], np.arange(10))
    assert chunk["label"][:6].tolist() == [-7, 7, 16, 2**63 - 1, 0, 42]


def test_a_line_the_check_misses_is_found_by_the_parser_not_blamed_on_the_block(tmp_path, monkeypatch):
    """The safety net: if the line check accepted a line pyarrow rejects, that line is still named."""
    monkeypatch.setattr(criteo, "line_problem", lambda line: None)
    path = tmp_path / "day_4"
    good = write(path, 50, {17: row(16, i1="+5"), 18: row(17, c1="zzzzzzzz"), 44: "1\t2\tthree\n"})
    with pytest.raises(SourceError, match=r"day_4' line 17: rejected by the CSV parser: .*'\+5'"):
        read_all(path, "raise")
    ids, skipped = read_all(path, "skip")
    assert_same_order(ids, good)
    assert skipped == 3
    assert [line for _, line, _ in skipped_examples(path)[1]] == [17, 18, 44]
