"""intune.DataLoader against torch's DataLoader: the same batches in the same order, len(), every row
once per epoch while the worker count changes, iterable datasets, worker ids and seeds, structures."""

from __future__ import annotations

import collections
import random
import threading
import warnings

import numpy as np
import pytest
import torch
from torch.utils.data import (
    BatchSampler,
    Dataset,
    IterableDataset,
    Sampler,
    SequentialSampler,
    SubsetRandomSampler,
)
from torch.utils.data import DataLoader as TorchLoader

import intune
from _datasets import IdRows
from intune.dataloader import transport

pytestmark = pytest.mark.timeout(120)


class DictRows(Dataset):
    """dict samples: a tensor, an int, a string, a numpy array."""

    def __init__(self, n: int = 57) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        return {
            "x": torch.arange(3, dtype=torch.float32) + i,
            "id": i,
            "name": f"row{i}",
            "feat": np.full(2, i, dtype=np.int16),
        }


class TupleRows(Dataset):
    """tuple samples: (numpy array, float label)."""

    def __len__(self) -> int:
        return 41

    def __getitem__(self, i: int) -> tuple:
        return np.array([i, i * i], dtype=np.int64), float(i) / 3


def pad_collate(samples: list) -> dict:
    """A custom collate: variable-length rows padded into one tensor, with their lengths."""
    rows = [torch.arange(1 + s["id"] % 5) for s in samples]
    lengths = torch.tensor([len(r) for r in rows])
    padded = torch.zeros(len(rows), int(lengths.max()), dtype=torch.int64)
    for k, r in enumerate(rows):
        padded[k, : len(r)] = r
    return {"padded": padded, "lengths": lengths, "names": [s["name"] for s in samples]}


class Keyed(Dataset):
    """A map-style dataset keyed by tuples (any key a sampler yields)."""

    rows = {("row", i): i * 10 for i in range(12)}

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, key: tuple) -> dict:
        return {"key": key, "value": self.rows[key]}


def assert_same(a: object, b: object, where: str = "batch") -> None:
    """Equal structures, tensors equal in dtype, shape and values."""
    assert type(a) is type(b) or (isinstance(a, dict) and isinstance(b, dict)), (
        f"{where}: {type(a)} vs {type(b)}"
    )
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), f"{where}: {a} vs {b}"
    elif isinstance(a, dict):
        assert list(a) == list(b), f"{where}: keys {list(a)} vs {list(b)}"
        for k in a:
            assert_same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), f"{where}: lengths {len(a)} vs {len(b)}"
        for k, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{where}[{k}]")
    else:
        assert a == b, f"{where}: {a!r} vs {b!r}"


def assert_epochs_equal(ours: intune.DataLoader, theirs: TorchLoader, epochs: int = 2) -> None:
    for epoch in range(epochs):
        torch.manual_seed(100 + epoch)  # for samplers that draw from torch's global generator
        a = list(ours)
        torch.manual_seed(100 + epoch)
        b = list(theirs)
        assert len(a) == len(b) == len(ours) == len(theirs), (len(a), len(b), len(ours), len(theirs))
        for k, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"epoch {epoch} batch {k}")


CASES = {
    "dict-shuffle-generator": (DictRows, dict(batch_size=8, shuffle=True), True),
    "tuple-drop-last": (TupleRows, dict(batch_size=6, drop_last=True), False),
    "custom-collate": (DictRows, dict(batch_size=5, shuffle=True, collate_fn=pad_collate), True),
    "sampler": (TupleRows, dict(batch_size=4, sampler=SubsetRandomSampler(range(3, 30))), False),
    "batch-sampler": (
        DictRows,
        dict(batch_sampler=BatchSampler(SequentialSampler(range(57)), 7, False)),
        False,
    ),
    "no-batching": (TupleRows, dict(batch_size=None, shuffle=True), True),
    "tuple-keys": (Keyed, dict(batch_size=5, sampler=sorted(Keyed.rows, reverse=True)), False),
}


@pytest.mark.parametrize("case", list(CASES))
def test_same_batches_in_the_same_order_as_torch(case: str) -> None:
    """Same dataset, sampler arguments and generator seed: the same batches, tensor by tensor, in
    the same order, over two epochs (the generator's state carries on alike between epochs)."""
    make, kwargs, seeded = CASES[case]
    ours_gen = torch.Generator().manual_seed(7) if seeded else None
    their_gen = torch.Generator().manual_seed(7) if seeded else None
    with intune.DataLoader(make(), num_workers=2, tune=None, generator=ours_gen, **kwargs) as ours:
        theirs = TorchLoader(make(), generator=their_gen, **kwargs)
        assert_epochs_equal(ours, theirs)


def ids_of(loader: object) -> list:
    """Two epochs' ids; the global generator is used between iter() and the first batch, as a
    training loop may (torch's loader with workers draws its seeds at iter(), before that)."""
    out = []
    for _ in range(2):
        it = iter(loader)
        torch.rand(5)
        out += [b["id"] for b in it]
    return out


def test_global_generator_draws_as_torch_does() -> None:
    """Without a generator both draw from torch's global one, at the same moments: equal after reseeding."""
    with intune.DataLoader(DictRows(), batch_size=8, shuffle=True, num_workers=1, tune=None) as ours:
        torch.manual_seed(3)
        a = ids_of(ours)
    torch.manual_seed(3)
    b = ids_of(TorchLoader(DictRows(), batch_size=8, shuffle=True, num_workers=1))
    for x, y in zip(a, b, strict=True):
        assert torch.equal(x, y)


def test_spawned_and_in_process_workers_give_the_same_batches() -> None:
    """Fresh interpreters (multiprocessing_context="spawn") and num_workers=0 deliver what fork does."""
    kwargs = dict(batch_size=6, shuffle=True)
    theirs = TorchLoader(DictRows(), generator=torch.Generator().manual_seed(1), **kwargs)
    expected = list(theirs)
    for how in (dict(num_workers=2, multiprocessing_context="spawn"), dict(num_workers=0)):
        with intune.DataLoader(
            DictRows(), generator=torch.Generator().manual_seed(1), tune=None, **how, **kwargs
        ) as ours:
            for k, (x, y) in enumerate(zip(list(ours), expected, strict=True)):
                assert_same(x, y, f"{how} batch {k}")


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(batch_size=8),
        dict(batch_size=8, drop_last=True),
        dict(batch_size=None),
        dict(batch_sampler=BatchSampler(SequentialSampler(range(57)), 10, True)),
    ],
)
def test_len_as_torch(kwargs: dict) -> None:
    with intune.DataLoader(DictRows(), tune=None, num_workers=1, **kwargs) as ours:
        assert len(ours) == len(TorchLoader(DictRows(), **kwargs))


def test_every_row_once_in_order_while_workers_resize() -> None:
    """Worker counts changed between batches, up and down, over two epochs: every index exactly once
    per epoch, in the sampler's order (the engine's resize keeps order and loses nothing)."""
    rng = random.Random(0)
    with intune.DataLoader(
        IdRows(3000),
        batch_size=16,
        shuffle=True,
        tune=None,
        num_workers=1,
        generator=torch.Generator().manual_seed(5),
    ) as loader:
        theirs = TorchLoader(
            IdRows(3000), batch_size=16, shuffle=True, generator=torch.Generator().manual_seed(5)
        )
        knob = loader.knobs["fetch.workers"]
        for _epoch in range(2):
            got = []
            for k, batch in enumerate(loader):
                got.append(batch)
                if k % 7 == 0:
                    knob.set(rng.randint(1, 4))
            expected = list(theirs)
            assert np.array_equal(torch.cat(got).numpy(), torch.cat(expected).numpy())
            assert sorted(torch.cat(got).tolist()) == list(range(3000))


class RecordingSampler(Sampler):
    """A sampler that notes the thread its iteration starts on."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.threads: list[int] = []

    def __iter__(self):
        self.threads.append(threading.get_ident())
        return iter(range(self.n))

    def __len__(self) -> int:
        return self.n


def test_the_sampler_starts_on_the_callers_thread_at_iter() -> None:
    """As torch's loader with workers does, the sampler starts at iter(), on the caller's thread, so a
    sampler drawing from torch's global generator draws before the training loop's next draw."""
    sampler = RecordingSampler(20)
    with intune.DataLoader(IdRows(20), batch_size=4, sampler=sampler, num_workers=1, tune=None) as loader:
        it = iter(loader)
        assert sampler.threads == [threading.get_ident()]
        assert torch.cat(list(it)).tolist() == list(range(20))


class Squares(IterableDataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        assert info is None, "an iterable dataset is read in the loader's process"
        for i in range(self.n):
            yield {"i": i, "sq": torch.tensor([i * i])}

    def __len__(self) -> int:
        return self.n


@pytest.mark.parametrize(
    "kwargs", [dict(batch_size=4), dict(batch_size=4, drop_last=True), dict(batch_size=None)]
)
def test_iterable_dataset_as_torch_without_workers(kwargs: dict) -> None:
    with intune.DataLoader(Squares(18), num_workers=0, **kwargs) as ours:
        theirs = TorchLoader(Squares(18), **kwargs)
        assert len(ours) == len(theirs)
        assert_epochs_equal(ours, theirs)


class WorkerView(Dataset):
    """Each sample: the worker's id from torch's get_worker_info(), and numbers drawn from the
    generators the loader seeded for the batch."""

    def __len__(self) -> int:
        return 24

    def __getitem__(self, i: int) -> dict:
        info = torch.utils.data.get_worker_info()
        return {
            "worker": -1 if info is None else info.id,
            "init": INIT_CALLS.get("id", -1),
            "draw": (random.random(), float(np.random.random()), float(torch.rand(()))),
        }


INIT_CALLS: dict = {}


def remember_init(worker_id: int) -> None:
    INIT_CALLS["id"] = worker_id


def test_worker_ids_init_and_random_draws_as_torch() -> None:
    """Seeded as torch seeds its workers (base seed from the generator plus the worker's id, once, at the
    worker's start) and batches handed out round-robin: the same worker for each batch, the same random
    numbers drawn in __getitem__ as torch's loader with the same generator, over two epochs (fresh
    workers and a new base seed in the second); worker_init_fn runs in each worker with its id."""
    for workers in (1, 3):
        kwargs = dict(batch_size=4, num_workers=workers, worker_init_fn=remember_init)
        with intune.DataLoader(
            WorkerView(), tune=None, generator=torch.Generator().manual_seed(9), **kwargs
        ) as loader:
            ours = [list(loader) for _ in range(2)]
        theirs_loader = TorchLoader(WorkerView(), generator=torch.Generator().manual_seed(9), **kwargs)
        theirs = [list(theirs_loader) for _ in range(2)]
        for epoch in range(2):
            for k, (a, b) in enumerate(zip(ours[epoch], theirs[epoch], strict=True)):
                assert_same(a, b, f"{workers} workers, epoch {epoch} batch {k}")
            assert all(torch.equal(b["worker"], b["init"]) for b in ours[epoch]), "worker_init_fn saw another id"
        assert draws_of(ours[0]) != draws_of(ours[1]), "the second epoch repeated the first one's draws"


def draws_of(batches: list) -> list:
    return [tuple(t.tolist() for t in batch["draw"]) for batch in batches]


def test_structures_survive_the_transport() -> None:
    """Tensors of every kind, named tuples, OrderedDicts, strings and objects come back equal."""
    Pair = collections.namedtuple("Pair", "left right")
    batch = {
        "bf16": torch.arange(6, dtype=torch.bfloat16).reshape(2, 3),
        "bool": torch.tensor([True, False]),
        "scalar": torch.tensor(3.5, dtype=torch.float64),
        "strided": torch.arange(12).reshape(3, 4).t(),
        "grad": torch.ones(2, requires_grad=True),
        "pair": Pair(torch.zeros(2, dtype=torch.uint8), ["a", "b"]),
        "ordered": collections.OrderedDict([("z", np.arange(3)), ("a", 1.5)]),
        "tuple": (None, "text", 7),
    }
    back = transport.decode(dict(transport.encode(batch)))
    assert list(back) == list(batch)
    for key in ("bf16", "bool", "scalar", "strided"):
        assert back[key].dtype == batch[key].dtype and torch.equal(back[key], batch[key]), key
    assert back["grad"].requires_grad and torch.equal(back["grad"], batch["grad"])
    assert isinstance(back["pair"], Pair) and back["pair"].right == ["a", "b"]
    assert torch.equal(back["pair"].left, batch["pair"].left)
    assert isinstance(back["ordered"], collections.OrderedDict) and list(back["ordered"]) == ["z", "a"]
    assert np.array_equal(back["ordered"]["z"], np.arange(3)) and back["tuple"] == (None, "text", 7)


class FreezeCount(IdRows):
    def __getitem__(self, i: int) -> int:
        import gc

        return gc.get_freeze_count()


def test_forked_workers_freeze_what_they_inherit() -> None:
    """A forked worker's collections skip the objects it inherited (their pages stay shared with the
    loader's process instead of being copied when the collector marks them)."""
    with intune.DataLoader(FreezeCount(8), batch_size=4, num_workers=1, tune=None) as loader:
        counts = torch.cat(list(loader))
    assert (counts > 1000).all(), counts


def test_tuned_by_default_and_pin_memory_warns_without_accelerator() -> None:
    """The default loader has a tuner running while it is read, with the knobs that can move (workers,
    buffer; not the sampler's single thread, which an even split would count as a stage to feed); pin
    memory without an accelerator warns as torch does and delivers unpinned batches."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = intune.DataLoader(IdRows(200), batch_size=10, pin_memory=True)
    assert any("pin_memory" in str(w.message) for w in caught) or torch.accelerator.is_available()
    with loader:
        assert set(loader.knobs) == {"fetch.workers", "prefetch.buffer_mb"}, "a fixed knob is no knob to tune"
        assert set(loader.tuner.knobs) == set(loader.knobs)
        assert loader.tuner is not None and loader.num_workers >= 1
        it = iter(loader)
        first = next(it)
        assert loader.tuner.running
        rest = list(it)
        assert sorted(torch.cat([first, *rest]).tolist()) == list(range(200))
    assert not loader.tuner.running
