"""intune.DataLoader resumes as torchdata's StatefulDataLoader does: the dataset's and its iterator's own
state_dict() (taken after iter(), at the epoch's start and end too), torch's global generator between
epochs, a loaded state copied, in-process map-style datasets, a JSON state, snapshot_every_n_steps.
Each test names the wrong data (or error) the loader gave before."""

from __future__ import annotations

import copy
import itertools
import json
import time

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset, IterableDataset, Sampler

import intune
from intune.dataloader import ResumeMismatchError, resume


def _rows(batches) -> list[int]:
    out: list[int] = []
    for batch in batches:
        out.extend(int(v) for v in (batch if isinstance(batch, (list, tuple)) else batch.tolist()))
    return out


def _loader(dataset, **kw):
    kw.setdefault("batch_size", 4)
    kw.setdefault("num_workers", 0)
    kw.setdefault("tune", None)
    return intune.DataLoader(dataset, **kw)


class ResetsAndReturnsSelf(IterableDataset):
    """``__iter__`` resets the position and returns ``self`` (a common pattern); state: the position."""

    def __init__(self, n: int) -> None:
        self.n, self.pos, self.iter_calls = n, 0, 0

    def __iter__(self):
        self.iter_calls += 1
        self.pos = 0
        return self

    def __next__(self) -> int:
        if self.pos >= self.n:
            raise StopIteration
        self.pos += 1
        return self.pos - 1

    def state_dict(self):
        return {"pos": self.pos}

    def load_state_dict(self, state):
        self.pos = state["pos"]


def test_a_dataset_that_is_its_own_iterator_is_iterated_once_per_epoch():
    """Before: iter() was called again for every batch, so the epoch repeated its first rows forever."""
    dataset = ResetsAndReturnsSelf(30)
    with _loader(dataset) as loader:
        got = _rows(itertools.islice(loader, 20))  # 8 batches make the epoch; 20 would mean it never ends
        assert got == list(range(30))
        assert dataset.iter_calls == 1
        assert _rows(loader) == list(range(30))
        assert dataset.iter_calls == 2


def test_its_state_is_loaded_after_iter():
    """Before: the state was loaded before iter(), whose reset then lost it (the epoch started over)."""
    with _loader(ResetsAndReturnsSelf(30)) as first:
        it = iter(first)
        before = _rows(itertools.islice(it, 3))
        state = first.state_dict()
    fresh = ResetsAndReturnsSelf(30)
    with _loader(fresh) as resumed:
        resumed.load_state_dict(state)
        after = _rows(resumed)
    assert before + after == list(range(30))
    assert fresh.iter_calls == 1


class SlowResets(ResetsAndReturnsSelf):
    def __next__(self) -> int:
        time.sleep(0.005)  # the loader's reading thread is still reading ahead when the loop moves on
        return super().__next__()


def test_a_second_loader_over_the_same_self_iterating_dataset_stops_the_first():
    """Before: the first loader's thread went on reading ahead from the dataset after the second loader's
    iter() had reset it and loaded the state, so the second lost rows (torchdata's
    TestStateInitializationDataset, intermittently)."""
    dataset = SlowResets(60)
    first = _loader(dataset)
    it = iter(first)
    before = _rows(itertools.islice(it, 3))
    state = first.state_dict()
    with _loader(dataset) as second:
        second.load_state_dict(state)
        after = _rows(second)
    assert before + after == list(range(60))
    with pytest.raises(intune.PipelineClosedError):
        next(it)
    first.close()


class Epochs(IterableDataset):
    """Rows ``(i, epoch)``; the epoch counter moves on when the iterator runs out (torchdata's
    GeneratorIterable pattern), and a loaded state resumes at ``i``."""

    def __init__(self, n: int) -> None:
        self.n, self.i, self.epoch, self.resume = n, 0, 0, None

    def __iter__(self):
        self.i, self.resume = (self.resume or 0), None
        for k in range(self.i, self.n):
            self.i = k + 1
            yield (k, self.epoch)
        self.i = 0
        self.epoch += 1

    def state_dict(self):
        return {"i": self.i, "epoch": self.epoch}

    def load_state_dict(self, state):
        self.resume, self.epoch = state["i"], state["epoch"]


# In-process only: with workers, each worker iterates its own copy of the dataset, so the epoch counted
# in the dataset never moves in the loader's process (torch's DataLoader and torchdata's
# StatefulDataLoader give epoch 0 twice there too).
@pytest.mark.parametrize("workers", [0])
def test_an_end_of_epoch_checkpoint_resumes_the_next_epoch(workers):
    """Before: the dataset's state was not saved once its epoch ended, so the resume gave epoch 0's
    rows again instead of epoch 1's."""
    with _loader(Epochs(30), batch_size=3, collate_fn=list, num_workers=workers) as first:
        epoch0 = list(first)
        state = first.state_dict()
        epoch1 = list(first)
    assert {e for batch in epoch0 for _, e in batch} == {0}
    assert {e for batch in epoch1 for _, e in batch} == {1}
    with _loader(Epochs(30), batch_size=3, collate_fn=list, num_workers=workers) as resumed:
        it = iter(resumed)
        next(it)  # an epoch of its own in flight (reading ahead, short of its end): ended by the load
        resumed.load_state_dict(state)
        assert list(resumed) == epoch1


class RandomOrder:
    """An iterator with state of its own: rows drawn with its own generator (its state saved)."""

    def __init__(self, n: int, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.left = n

    def __iter__(self):
        return self

    def __next__(self) -> int:
        if self.left == 0:
            raise StopIteration
        self.left -= 1
        return int(self.rng.integers(0, 1_000_000))

    def state_dict(self):
        return {"rng": self.rng.bit_generator.state, "left": self.left}

    def load_state_dict(self, state):
        self.rng.bit_generator.state = state["rng"]
        self.left = state["left"]


class RandomStream(IterableDataset):
    """A new random iterator at each ``iter()`` (a fresh seed each time): only its state can resume it."""

    def __init__(self, n: int) -> None:
        self.n, self.seeds = n, itertools.count(int(np.random.SeedSequence().entropy % 1000))

    def __iter__(self):
        return RandomOrder(self.n, next(self.seeds))


def test_the_iterators_own_state_is_saved_and_restored():
    """Before: only the dataset's state_dict counted; the stream was read again from a new iterator,
    so a random iterator gave other rows after the resume."""
    with _loader(RandomStream(40)) as first:
        it = iter(first)
        before = _rows(itertools.islice(it, 4))
        state = first.state_dict()
        rest = _rows(it)
    assert state["epoch"]["dataset"]["iterator"]["left"] == 24
    with _loader(RandomStream(40)) as resumed:
        resumed.load_state_dict(state)
        assert _rows(resumed) == rest
    assert len(before + rest) == 40


def test_a_checkpoint_before_the_first_batch_holds_the_iterators_start():
    """Before: a state taken after iter(loader) and before any batch held no dataset state at all."""
    with _loader(RandomStream(20)) as first:
        it = iter(first)
        state = first.state_dict()
        whole = _rows(it)
    with _loader(RandomStream(20)) as resumed:
        resumed.load_state_dict(state)
        assert _rows(resumed) == whole


def test_building_a_tuned_loader_does_not_draw_from_torchs_global_generator():
    """Before: the tuner's network was initialised from torch's global generator, shifting every later
    draw (torch's DataLoader and tune=None draw nothing there)."""
    before = torch.get_rng_state().clone()
    with intune.DataLoader(list(range(40)), batch_size=4, num_workers=1, tune="intune"):
        assert torch.equal(torch.get_rng_state(), before)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_state_between_epochs_holds_the_global_generator_that_decides_the_next_shuffle(workers):
    """Before: without generator=, the next epoch's order came from whatever torch's global generator
    held when the resumed loader started it."""
    torch.manual_seed(5)
    with _loader(list(range(40)), shuffle=True, num_workers=workers) as first:
        list(first)
        state = first.state_dict()
        epoch1, epoch2 = _rows(first), _rows(first)
    torch.manual_seed(99)  # the resumed process's generator is elsewhere
    with _loader(list(range(40)), shuffle=True, num_workers=workers) as resumed:
        resumed.load_state_dict(state)
        assert _rows(resumed) == epoch1
        assert _rows(resumed) == epoch2  # left advanced, as the uninterrupted run's


class KeepsReference(IterableDataset):
    """Keeps the dict it was loaded with and writes into it as it goes (torchdata's dynamic-state case)."""

    def __init__(self, n: int) -> None:
        self.n, self.state = n, {"pos": 0}

    def __iter__(self):
        start = self.state["pos"]
        for i in range(start, self.n):
            self.state["pos"] = i + 1
            yield i

    def state_dict(self):
        return self.state

    def load_state_dict(self, state):
        self.state = state


def test_a_loaded_state_is_copied_so_it_can_be_loaded_twice():
    """Before: the dataset got the caller's dict itself, advanced it while reading, and a second load
    of the same state gave 0 rows."""
    with _loader(KeepsReference(30)) as first:
        before = _rows(itertools.islice(first, 2))
        state = first.state_dict()
    kept = copy.deepcopy(state)
    for _ in range(2):
        with _loader(KeepsReference(30)) as resumed:
            resumed.load_state_dict(state)
            assert before + _rows(resumed) == list(range(30))
        assert state == kept


class DrawsInProcess(Dataset):
    """``__getitem__`` draws from torch's global generator, whose state is the dataset's own state."""

    def __len__(self) -> int:
        return 24

    def __getitem__(self, i: int) -> float:
        return float(torch.rand(()))

    def state_dict(self):
        return {"rng": torch.get_rng_state()}

    def load_state_dict(self, state):
        torch.set_rng_state(state["rng"])


def test_an_in_process_map_style_datasets_state_is_saved_after_the_last_delivered_batch():
    """Before: with num_workers=0 the dataset's state_dict was never taken, so the draws after the
    resume were not the uninterrupted run's."""
    torch.manual_seed(1)
    with _loader(DrawsInProcess()) as first:
        it = iter(first)
        next(it), next(it)  # the fetch thread reads ahead meanwhile
        state = first.state_dict()
        rest = [b.tolist() for b in it]
    assert state["epoch"]["dataset"]["batches"] == 2
    torch.manual_seed(2)
    with _loader(DrawsInProcess()) as resumed:
        resumed.load_state_dict(state)
        assert [b.tolist() for b in resumed] == rest


class DrawsWhileFetching(Dataset):
    """Row ``i``, after a draw from torch's global generator (a random transform in the process)."""

    def __len__(self) -> int:
        return 40

    def __getitem__(self, i: int) -> int:
        time.sleep(0.002)
        torch.rand(())
        return i


class SlowRandomSampler(Sampler):
    """A random order from torch's global generator, drawn after a pause (other threads run meanwhile)."""

    def __len__(self) -> int:
        return 40

    def __iter__(self):
        time.sleep(0.02)
        yield from torch.randperm(40).tolist()


def test_resuming_an_epoch_in_flight_waits_for_its_fetch_thread():
    """Before: the abandoned epoch's fetch thread kept drawing from torch's global generator while the
    resume replayed the epoch's start from it, and the replay raised ResumeMismatchError (torchdata's
    interrupted-shuffle pattern hit it now and then)."""
    with _loader(DrawsWhileFetching(), sampler=SlowRandomSampler(), batch_size=2) as loader:
        it = iter(loader)
        start = loader.state_dict()
        got = [next(it).tolist() for _ in range(4)]
        middle = loader.state_dict()
        loader.load_state_dict(middle)  # the epoch is still fetching ahead
        got += [b.tolist() for b in loader]
        loader.load_state_dict(start)
        assert [b.tolist() for b in loader] == got
    assert sorted(v for b in got for v in b) == list(range(40))


@pytest.mark.parametrize("tune", [None, "intune"])
def test_the_state_is_json(tune):
    """Before: the state held numpy arrays (generator states, the tuner's weights), where torchdata's
    is JSON."""
    kw = dict(shuffle=True, num_workers=1, tune=tune, generator=torch.Generator().manual_seed(3))
    with _loader(list(range(64)), **kw) as whole:
        epoch = _rows(whole)
    with _loader(list(range(64)), **kw | {"generator": torch.Generator().manual_seed(3)}) as first:
        before = _rows(itertools.islice(first, 5))
        text = json.dumps(first.state_dict())
    with _loader(list(range(64)), **kw | {"generator": torch.Generator()}) as resumed:
        resumed.load_state_dict(json.loads(text))
        assert before + _rows(resumed) == epoch


def _fails(worker_id: int) -> None:
    raise ValueError(f"no init for worker {worker_id}")


def test_a_failing_worker_init_fn_raises_at_iter_with_its_class():
    """Before: it raised at the first next(), as a StageError."""
    with _loader(list(range(16)), num_workers=2, worker_init_fn=_fails) as loader:
        with pytest.raises(ValueError, match="no init for worker"):
            iter(loader)


class CountsSnapshots(IterableDataset):
    """Rows 0..n-1, resumable from a position; counts its state_dict() calls."""

    def __init__(self, n: int) -> None:
        self.n, self.start, self.pos, self.calls = n, 0, 0, 0

    def __iter__(self):
        self.pos, self.start = self.start, 0
        while self.pos < self.n:
            self.pos += 1
            yield self.pos - 1

    def state_dict(self):
        self.calls += 1
        return {"pos": self.pos}

    def load_state_dict(self, state):
        self.start = state["pos"]


def test_snapshot_every_n_steps_takes_fewer_states_and_reads_the_rest_again():
    """Before: the argument was refused (TypeError)."""
    for every, calls in ((4, 4), (1, 12), (0, 2)):  # 10 batches: the start, every 4th batch, the end
        dataset = CountsSnapshots(40)
        with _loader(dataset, snapshot_every_n_steps=every) as loader:
            assert _rows(loader) == list(range(40))
        assert dataset.calls == calls
    with _loader(CountsSnapshots(40), snapshot_every_n_steps=4) as first:
        it = iter(first)
        before = _rows(itertools.islice(it, 6))
        state = first.state_dict()
    assert state["epoch"]["dataset"] == {"batches": 4, "dataset": {"pos": 16}, "iterator": None}
    with _loader(CountsSnapshots(40), snapshot_every_n_steps=4) as resumed:
        resumed.load_state_dict(state)
        assert before + _rows(resumed) == list(range(40))  # batches 5 and 6 read again, not delivered


@pytest.mark.parametrize("bad", [-1, 1.5, "2", True])
def test_snapshot_every_n_steps_must_be_a_count(bad):
    with pytest.raises(ValueError, match="snapshot_every_n_steps"):
        _loader(list(range(4)), snapshot_every_n_steps=bad)


def test_a_state_from_another_fetch_mode_is_refused_at_iter():
    """In-process and worker states hold different things; torchdata raises AssertionError there."""
    with _loader(list(range(20)), num_workers=0) as first:
        next(iter(first))
        state = first.state_dict()
    with _loader(list(range(20)), num_workers=2) as other:
        other.load_state_dict(state)
        with pytest.raises(resume.FetchModeMismatchError, match="num_workers=0") as raised:
            iter(other)
        assert isinstance(raised.value, AssertionError) and isinstance(raised.value, ResumeMismatchError)
