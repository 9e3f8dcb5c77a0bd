"""intune.SharedList and DataLoader(share_lists=True): equal Python values from shared memory, in this
process and in forked and spawned workers; the copy-on-read warning; the process tree's memory."""

from __future__ import annotations

import multiprocessing
import pickle
import warnings

import pytest
import torch
from torch.utils.data import Dataset

import intune
from intune.bench import child
from intune.dataloader import CopyOnReadWarning, SharedList
from intune.dataloader.shared_list import big_containers, share_lists

CASES = [
    ["a", "bé", "", "日本語", "x" * 300],
    [b"a", b"", b"\x00\xff", b"y" * 70],
    [0, -1, 2**62, -(2**63), 7],
    [1.5, -0.0, 1e308, 2.0**-1074],
    [True, False, True],
    [],
]


@pytest.mark.parametrize("values", CASES, ids=["str", "bytes", "int", "float", "bool", "empty"])
def test_indexing_gives_equal_python_values(values):
    shared = SharedList(values)
    assert len(shared) == len(values)
    assert [shared[i] for i in range(len(values))] == values
    assert all(type(a) is type(b) for a, b in zip(shared, values, strict=True))
    assert list(shared) == values and shared.tolist() == values and shared == values
    assert shared[1:-1] == values[1:-1] and shared[::-2] == values[::-2]
    if values:
        assert shared[-1] == values[-1]
        assert values[0] in shared
    with pytest.raises(IndexError, match="out of range"):
        shared[len(values)]
    again = pickle.loads(pickle.dumps(shared))  # a reference to the same segment
    assert list(again) == values
    assert len(pickle.dumps(SharedList(["z" * 1000] * 100))) < 500


@pytest.mark.parametrize(
    ("values", "words"),
    [
        ([1, "a"], "item 0 is int, item 1 is str"),
        ([1, True], "item 1 is bool"),
        ([None], "item 0 is NoneType"),
        ([2**64], "does not fit in 64 bits"),
    ],
)
def test_items_of_another_type_are_refused_by_index(values, words):
    with pytest.raises(TypeError, match=words):
        SharedList(values)


def _read(shared, out):
    out.put([shared[0], shared[-1], len(shared)])


def test_a_spawned_process_maps_the_same_segment():
    shared = SharedList([f"s{i}" for i in range(5000)])
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(target=_read, args=(shared, out))
    proc.start()
    assert out.get(timeout=60) == ["s0", "s4999", 5000]
    proc.join(30)


class Names(Dataset):
    """Row ``i``: its name, its id and its score, from three lists and a dict of lists."""

    def __init__(self, n: int) -> None:
        self.names = [f"name-{i}" for i in range(n)]
        self.ids = list(range(0, 3 * n, 3))
        self.columns = {"score": [i / 4 for i in range(n)], "mixed": [1, "a"] * (n // 2)}
        self.small = ["a", "b"]

    def __len__(self) -> int:
        return len(self.names)

    def __getitem__(self, i: int):
        return {"name": self.names[i], "id": self.ids[i], "score": self.columns["score"][i]}


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_share_lists_gives_the_same_batches_in_workers(context):
    with intune.DataLoader(Names(3000), batch_size=64, num_workers=0, tune=None) as plain:
        expected = list(plain)
    dataset = Names(3000)
    with intune.DataLoader(dataset, batch_size=64, num_workers=2, tune=None, share_lists=True,
                           multiprocessing_context=context) as shared:
        got = list(shared)
    assert isinstance(dataset.names, SharedList) and isinstance(dataset.ids, SharedList)
    assert isinstance(dataset.columns["score"], SharedList)
    assert type(dataset.columns["mixed"]) is list and type(dataset.small) is list  # mixed types; too short
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        assert a["name"] == b["name"]
        assert torch.equal(a["id"], b["id"]) and torch.equal(a["score"], b["score"])


class Big(Dataset):
    def __init__(self) -> None:
        self.rows = list(range(1_000_001))
        self.parts = {"names": [str(i) for i in range(1_000_001)]}

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> int:
        return self.rows[i]


def test_a_big_container_is_named_once_when_workers_start():
    big = Big()
    assert big_containers(big) == [("Big.rows", "list", 1_000_001), ("Big.parts['names']", "list", 1_000_001)]
    with pytest.warns(CopyOnReadWarning) as record:
        intune.DataLoader(big, num_workers=1, tune=None).close()
    words = [str(w.message) for w in record]
    assert len(words) == 2 and all("share_lists=True" in w for w in words)
    assert words[0].startswith("intune.DataLoader: Big.rows is a list of 1,000,001 Python objects")
    assert "Big.parts['names'] is a list" in words[1]
    assert record[0].filename == __file__  # it points at the line that built the loader
    with warnings.catch_warnings():
        warnings.simplefilter("error", CopyOnReadWarning)
        intune.DataLoader(big, num_workers=1, tune=None).close()  # once per class and attribute
        intune.DataLoader(Big(), num_workers=0, tune=None).close()  # no workers: nothing to copy into


def test_share_lists_silences_the_warning_and_converts_in_place():
    class Other(Big):
        pass

    dataset = Other()
    with warnings.catch_warnings():
        warnings.simplefilter("error", CopyOnReadWarning)
        with intune.DataLoader(dataset, batch_size=4, num_workers=1, tune=None, share_lists=True) as loader:
            assert [b.tolist() for b in loader] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert isinstance(dataset.rows, SharedList) and isinstance(dataset.parts["names"], SharedList)
    assert share_lists(dataset) == []  # nothing left to convert


def test_the_workers_do_not_copy_a_shared_list():
    """Memory, measured by the kernel: the anonymous + shared-memory PSS of the process tree grows by
    the workers' own pages only with share_lists=True, and by a copy of the strings per worker without."""
    spec = {"rows": 600_000, "workers": 2, "epochs": 2, "batch_size": 4096}
    growth = {}
    for system in ("intune", "intune share_lists=True"):
        row = child.run_child("intune.bench.dataloader_memory", {**spec, "system": system}, 600)
        assert "error" not in row, row
        growth[system] = row["own_after_mb"] - row["own_before_mb"]
    print(f"anon + shmem PSS growth, MB: {growth}")
    assert growth["intune"] > 60  # 600,000 strings of ~70 bytes with their list, copied into 2 workers
    assert growth["intune share_lists=True"] < growth["intune"] / 2
