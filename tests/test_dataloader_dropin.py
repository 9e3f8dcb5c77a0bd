"""intune.DataLoader behaves as torch's DataLoader where torch's own test file looks: what a sampler
yields reaches the dataset as it is, worker counts are never capped silently, workers are seeded as
torch seeds them, iterable datasets are read by every worker, and errors and argument checks are torch's."""

from __future__ import annotations

import re

import pytest
import torch
from torch.utils.data import DataLoader as TorchLoader
from torch.utils.data import Dataset, IterableDataset, Sampler

import intune

pytestmark = pytest.mark.timeout(120)


class ListIndexed(Dataset):
    """``dataset[[i, j, ...]]`` returns the rows at once (a bulk-loading dataset); an int is refused."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, indices: list) -> torch.Tensor:
        if not isinstance(indices, list):
            raise TypeError(f"expected a list of indices, got {indices!r}")
        return torch.as_tensor(indices)


class Chunks(Sampler):
    """Yields lists of indices: [0, 1, 2], [3, 4, 5], ..."""

    def __init__(self, n: int, size: int) -> None:
        self.n, self.size = n, size

    def __iter__(self):
        for start in range(0, self.n, self.size):
            yield list(range(start, min(start + self.size, self.n)))

    def __len__(self) -> int:
        return -(-self.n // self.size)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_sampler_element_reaches_the_dataset_whole_without_batching(workers: int) -> None:
    """batch_size=None: each element the sampler yields is one index, passed as it is (a list here), as
    torch does; no row of it may vanish."""
    kwargs = dict(batch_size=None, sampler=Chunks(35, 4))
    expected = [t.tolist() for t in TorchLoader(ListIndexed(35), **kwargs)]
    with intune.DataLoader(ListIndexed(35), num_workers=workers, tune=None, **kwargs) as loader:
        got = [t.tolist() for t in loader]
    assert got == expected
    assert sorted(i for batch in got for i in batch) == list(range(35))


class Barrier(Dataset):
    """Each row waits until ``parties`` workers hold one at once: it hangs (then fails) unless that
    many workers run; returns the worker's id."""

    def __init__(self, parties: int) -> None:
        import multiprocessing

        self.barrier = multiprocessing.get_context("fork").Barrier(parties)
        self.parties = parties

    def __len__(self) -> int:
        return self.parties

    def __getitem__(self, i: int) -> int:
        self.barrier.wait(timeout=60)
        return torch.utils.data.get_worker_info().id


def test_num_workers_is_never_capped_silently() -> None:
    """tune=None: exactly the workers asked for, above the default bound too (a barrier of 6 parties
    passes only if 6 workers run at once); no warning about a cap."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*cap", category=UserWarning)
        loader = intune.DataLoader(Barrier(6), batch_size=1, num_workers=6, tune=None, max_workers=None)
    with loader:
        assert loader.num_workers == 6
        assert sorted(int(b) for b in loader) == list(range(6))


def test_an_explicit_worker_count_is_the_tuners_floor_and_a_cap_is_stated() -> None:
    with intune.DataLoader(Barrier(6), batch_size=1, num_workers=6) as tuned:
        knob = tuned.pipeline.knobs["fetch.workers"]
        assert knob.value == 6 and knob.min == 6 and knob.max >= 6
    with pytest.warns(UserWarning, match=r"num_workers=6 .*max_workers=3.*3 workers"):
        capped = intune.DataLoader(Barrier(6), batch_size=1, num_workers=6, max_workers=3, tune=None)
    with capped:
        assert capped.num_workers == 3


class InitialSeed(Dataset):
    """Row ``i``: the seed torch's generator was last seeded with in the worker, and the worker's own."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> list:
        return [torch.initial_seed(), torch.utils.data.get_worker_info().seed]


def seed_12345(worker_id: int) -> None:
    torch.manual_seed(12345)


SEEN_IN_INIT: list = []


def note_seed(worker_id: int) -> None:
    info = torch.utils.data.get_worker_info()
    assert info.id == worker_id and info.seed == torch.initial_seed(), (info, torch.initial_seed())


def test_workers_are_seeded_once_as_torch_seeds_them() -> None:
    """A worker_init_fn that seeds torch keeps its seed for every batch; in worker_init_fn the worker's
    seed is torch's initial seed; seeds are the base seed plus the worker's id (below 2**63: they
    collate as int64)."""
    with intune.DataLoader(InitialSeed(), batch_size=2, num_workers=2, tune=None, worker_init_fn=seed_12345) as loader:
        assert all(int(s) == 12345 for batch in loader for s in batch[0])
    with intune.DataLoader(InitialSeed(), batch_size=2, num_workers=2, tune=None, worker_init_fn=note_seed) as loader:
        seeds = torch.cat([batch[1] for batch in loader]).tolist()
    assert len(set(seeds)) == 2 and max(seeds) - min(seeds) == 1 and max(seeds) < 2**63


class PerWorker(IterableDataset):
    """Worker ``w`` yields ``(w, 0) .. (w, sizes[w] - 1)``; counts the iter() calls of its copy."""

    def __init__(self, sizes: list[int]) -> None:
        self.sizes = sizes
        self.iters = 0

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        assert info is not None and info.num_workers == len(self.sizes), info
        assert INIT_IDS.get("id") == info.id, "worker_init_fn did not run first in this worker"
        self.iters += 1
        for i in range(self.sizes[info.id]):
            yield (info.id, i, self.iters)


INIT_IDS: dict = {}


def remember_id(worker_id: int) -> None:
    INIT_IDS["id"] = worker_id


def same(a: object, b: object) -> bool:
    """Equal structures: the same types, tensors equal in dtype and values."""
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    return a == b


@pytest.mark.parametrize(
    "kwargs", [dict(batch_size=None), dict(batch_size=3), dict(batch_size=3, drop_last=True, persistent_workers=True)]
)
def test_an_iterable_dataset_is_read_by_every_worker_interleaved_as_torch(kwargs: dict) -> None:
    """num_workers=3: each worker iterates its own copy with its get_worker_info(), after
    worker_init_fn; the batches come round-robin in torch's order, skipping workers whose part ended
    (sizes 0, 4, 7), in every epoch (persistent workers call iter() again on their copy)."""
    sizes = [0, 4, 7]
    args = dict(num_workers=3, worker_init_fn=remember_id, **kwargs)
    theirs = TorchLoader(PerWorker(sizes), **args)
    with intune.DataLoader(PerWorker(sizes), tune=None, **args) as ours:
        for _epoch in range(2):
            a, b = list(ours), list(theirs)
            assert same(a, b), (a, b)


class SleepsFirst(Dataset):
    """Each worker's first row sleeps ``seconds``."""

    def __init__(self, seconds: float) -> None:
        self.seconds, self.slept = seconds, False

    def __len__(self) -> int:
        return 10

    def __getitem__(self, i: int) -> int:
        if not self.slept:
            import time

            self.slept = True
            time.sleep(self.seconds)
        return i


def test_timeout_is_torchs_runtime_error_rebuildable_from_its_message() -> None:
    import pickle

    with intune.DataLoader(SleepsFirst(20), batch_size=2, num_workers=2, timeout=1, tune=None) as loader:
        with pytest.raises(RuntimeError, match=r"^DataLoader timed out after 1 seconds") as caught:
            next(iter(loader))
    error = caught.value
    assert re.search(r"indices \[[0-3], [1-4]\]", str(error)), "the batch is named"
    again = type(error)(str(error))  # what torch's ExceptionWrapper and multiprocessing do
    assert str(again) == str(error) and isinstance(again, RuntimeError)
    assert str(pickle.loads(pickle.dumps(error))) == str(error)


def test_argument_checks_are_torchs() -> None:
    loader = intune.DataLoader(ListIndexed(4), batch_size=2, num_workers=0)
    for attr in ("batch_size", "sampler", "batch_sampler", "drop_last", "dataset", "persistent_workers"):
        with pytest.raises(ValueError, match=f"{attr} attribute should not be set after"):
            setattr(loader, attr, {})
    assert loader.dataset.n == 4
    with pytest.raises(ValueError, match=r"multi-process loading \(num_workers > 0\), but got num_workers=0"):
        intune.DataLoader(ListIndexed(4), num_workers=0, multiprocessing_context="spawn")
    with pytest.raises(TypeError, match="multiprocessing_context option should be a valid context"):
        intune.DataLoader(ListIndexed(4), num_workers=1, multiprocessing_context=object())
    with pytest.raises(ValueError, match="should specify a valid start method in"):
        intune.DataLoader(ListIndexed(4), num_workers=1, multiprocessing_context="bad")


def test_the_loader_class_is_generic_as_torchs() -> None:
    alias = intune.DataLoader[list[torch.Tensor]]
    assert alias.__origin__ is intune.DataLoader


class ParentPid(Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> int:
        import os

        return os.getppid()


def parents(**kwargs: object) -> set:
    with intune.DataLoader(ParentPid(), batch_size=2, num_workers=2, tune=None, **kwargs) as loader:
        return {int(p) for batch in loader for p in batch}


def test_the_start_method_is_honoured() -> None:
    """A forked worker's parent is this process; a fork server's workers are forked by the server
    (multiprocessing_context="forkserver", or Python's default set to it)."""
    import multiprocessing
    import os

    assert parents(multiprocessing_context="fork") == {os.getpid()}
    assert os.getpid() not in parents(multiprocessing_context="forkserver")
    before = multiprocessing.get_start_method(allow_none=True)
    multiprocessing.set_start_method("forkserver", force=True)
    try:
        assert os.getpid() not in parents()
    finally:
        multiprocessing.set_start_method(before, force=True)
    assert parents() == {os.getpid()}


def test_shuffle_switches_an_iterdatapipes_shuffling_on_as_torch() -> None:
    from torch.utils.data.datapipes.iter import IterableWrapper

    def pipe():
        return IterableWrapper(range(100)).shuffle().sharding_filter()

    for workers in (0, 2):
        for shuffle, ordered in ((False, True), (True, False)):
            with intune.DataLoader(pipe(), batch_size=None, shuffle=shuffle, num_workers=workers, tune=None) as loader:
                torch.manual_seed(1)
                first = list(loader)
                torch.manual_seed(1)
                again = list(loader)
            assert sorted(first) == list(range(100)), (workers, shuffle)
            assert (first == list(range(100))) == ordered, (workers, shuffle)
            assert first == again, "the same global seed gives the same shuffle"


class WhichWorker(Dataset):
    """Row ``i``: the id of the worker that fetched it; row ``slow`` sleeps a second."""

    def __init__(self, n: int, slow: int | None = None) -> None:
        self.n, self.slow = n, slow

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple:
        if i == self.slow:
            import time

            time.sleep(1.0)
        return torch.utils.data.get_worker_info().id, i


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_batches_go_to_the_workers_round_robin(workers: int) -> None:
    with intune.DataLoader(WhichWorker(48), batch_size=4, num_workers=workers, tune=None) as loader:
        for k, (ids, rows) in enumerate(loader):
            assert ids.tolist() == [k % workers] * 4 and rows.tolist() == list(range(4 * k, 4 * k + 4))


def test_out_of_order_batches_skip_a_worker_holding_prefetch_factor_batches() -> None:
    """in_order=False: worker 0 is stuck on row 0 with row 2 queued behind it (prefetch_factor=2); every
    other row goes to worker 1 and comes first, as under torch."""
    with intune.DataLoader(WhichWorker(10, slow=0), num_workers=2, prefetch_factor=2, in_order=False, tune=None) as loader:
        got = [(int(w), int(i)) for w, i in loader]
    assert [i for _, i in got] == [1, 3, 4, 5, 6, 7, 8, 9, 0, 2]
    assert [w for w, _ in got] == [1] * 8 + [0, 0]


def test_a_class_defined_in_a_function_comes_back_as_itself() -> None:
    """A named tuple that cannot be imported by its name, made by a forked worker, is the loader's own
    class again (isinstance holds), as with torch."""
    import collections

    Pair = collections.namedtuple("Pair", "left right")

    class Pairs(Dataset):
        def __len__(self) -> int:
            return 6

        def __getitem__(self, i: int) -> Pair:
            return Pair(i, float(i))

    with intune.DataLoader(Pairs(), batch_size=3, num_workers=2, tune=None) as loader:
        batches = list(loader)
    assert all(isinstance(b, Pair) for b in batches), [type(b) for b in batches]
    assert torch.cat([b.left for b in batches]).tolist() == list(range(6))


class FailsMidStream(IterableDataset):
    """Rows 0..549 (each worker its half), then raises."""

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        workers, me = (info.num_workers, info.id) if info is not None else (1, 0)
        yield from range(me, 550, workers)
        raise OSError("the stream broke")


@pytest.mark.parametrize("workers", [0, 2])
def test_an_iterable_that_raises_delivers_every_batch_made_before_it(workers: int) -> None:
    """As torch's: the batches made before the error, then the error."""
    got = []
    with intune.DataLoader(FailsMidStream(), batch_size=5, num_workers=workers, tune=None) as loader:
        with pytest.raises(OSError, match="the stream broke"):
            for batch in loader:
                got.extend(batch.tolist())
    theirs = []
    with pytest.raises(OSError, match="the stream broke"):
        for batch in TorchLoader(FailsMidStream(), batch_size=5, num_workers=workers):
            theirs.extend(batch.tolist())
    assert got == theirs and len(got) >= 550 // max(1, workers)


def test_a_sharded_iterable_resumes_mid_epoch_and_between_epochs() -> None:
    """Each worker's place in its own iterator is in the state (tests/test_resume_shards.py has the
    cases): a mid-epoch state resumes the rest of the epoch, a state between epochs a whole one."""

    def rows(batches):
        return [(int(w), int(i)) for b in batches for w, i in zip(b[0].tolist(), b[1].tolist(), strict=True)]

    with intune.DataLoader(PerWorker([5, 5]), batch_size=2, num_workers=2, tune=None, worker_init_fn=remember_id) as first:
        it = iter(first)
        before = rows([next(it)])
        middle = first.state_dict()
        rest = rows(it)
        between = first.state_dict()
    with intune.DataLoader(PerWorker([5, 5]), batch_size=2, num_workers=2, tune=None, worker_init_fn=remember_id) as again:
        again.load_state_dict(middle)
        assert rows(again) == rest
        assert sorted(before + rest) == [(w, i) for w in range(2) for i in range(5)]
        again.load_state_dict(between)
        assert sum(len(b[0]) for b in again) == 10


class NamedRows(Dataset):
    """Rows as a named tuple kept as a class attribute (pickle cannot find it by its name, ``Row``)."""

    import collections

    Row = collections.namedtuple("Row", "i label")

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> Row:
        return self.Row(i, str(i))


def test_a_class_attribute_class_comes_back_as_itself_from_forkserver_workers() -> None:
    with intune.DataLoader(NamedRows(), batch_size=2, num_workers=2, tune=None, multiprocessing_context="forkserver") as loader:
        batches = list(loader)
    assert all(isinstance(b, NamedRows.Row) for b in batches), [type(b) for b in batches]
    assert [list(b.label) for b in batches] == [["0", "1"], ["2", "3"]]


def test_auto_workers_that_could_not_get_the_dataset_load_in_this_process() -> None:
    """num_workers='auto' under a start method that pickles (here a global 'spawn'): a dataset defined in
    a function cannot travel, so the loader warns and loads in this process, as torch's default does."""
    import multiprocessing

    class Local(Dataset):
        def __len__(self) -> int:
            return 5

        def __getitem__(self, i: int) -> int:
            return i

    before = multiprocessing.get_start_method(allow_none=True)
    multiprocessing.set_start_method("spawn", force=True)
    try:
        with pytest.warns(UserWarning, match="num_workers='auto' loads in this process: 'spawn' workers get"):
            loader = intune.DataLoader(Local(), batch_size=2)
        with loader:
            assert loader.num_workers == 0 and [b.tolist() for b in loader] == [[0, 1], [2, 3], [4]]
    finally:
        multiprocessing.set_start_method(before, force=True)


class Counting(IterableDataset):
    """Rows 0..n-1, whatever worker reads it (it does not divide itself)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        return iter(range(self.n))


def test_an_iterable_dataset_gets_workers_only_when_asked() -> None:
    """The default num_workers='auto' reads an iterable dataset in this process, as torch's default: a
    dataset that does not divide itself by worker would otherwise come once per worker."""
    with intune.DataLoader(Counting(20), batch_size=None) as loader:
        assert loader.num_workers == 0 and list(loader) == list(range(20))
    with intune.DataLoader(Counting(20), batch_size=None, num_workers=2, tune=None) as loader:
        assert sorted(loader) == sorted(list(range(20)) * 2)  # asked for: torch's behaviour
