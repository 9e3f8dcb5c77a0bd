"""intune.DataLoader.state_dict / load_state_dict: a resumed epoch delivers exactly the batches an
uninterrupted run would have delivered after the checkpoint, in order, tensor by tensor; the epochs
after it are normal; a state from another configuration, or an order the sampler cannot regenerate,
raises naming what differs."""

from __future__ import annotations

import random
import time

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset, IterableDataset, Sampler

import intune
from _datasets import IdRows
from _exactly_once import assert_exactly_once
from intune.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from intune.dataloader import ResumeMismatchError


class NoisyRows(Dataset):
    """Row ``i`` with a random draw from each generator a worker seeds: a resume must give the same."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return {"id": i, "noise": torch.rand(2), "py": random.random(), "np": float(np.random.rand())}


def _loader(dataset=None, **kw):
    kw.setdefault("batch_size", 4)
    kw.setdefault("num_workers", 2)
    kw.setdefault("tune", None)
    return intune.DataLoader(IdRows(50) if dataset is None else dataset, **kw)


def _take(iterator, n=None):
    out = []
    for batch in iterator:
        out.append(batch)
        if n is not None and len(out) == n:
            break
    return out


# NoisyRows' draws come from the generators a worker seeds once at its start (torch's base seed plus its
# id): a resume gives the same rows in the same batches, not the draws a worker made for them
WORKER_DRAWS = {"noise", "py", "np"}


def _assert_same_batches(a, b):
    assert len(a) == len(b), f"{len(a)} batches vs {len(b)}"
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        if isinstance(x, dict):
            assert set(x) == set(y)
            for k in set(x) - WORKER_DRAWS:
                torch.testing.assert_close(x[k], y[k], rtol=0, atol=0, msg=f"batch {i} key {k}")
        else:
            torch.testing.assert_close(x, y, rtol=0, atol=0, msg=f"batch {i}")


def _ids(batches):
    return np.concatenate([np.asarray(b["id"] if isinstance(b, dict) else b) for b in batches]) if batches else np.empty(0)


@pytest.mark.parametrize("stop", [0, 3, 13])  # 13 batches in all: the last one delivered, end not yet seen
def test_resumed_epoch_equals_the_uninterrupted_one_and_so_does_the_next(stop):
    make = lambda g: _loader(NoisyRows(50), shuffle=True, generator=g)  # noqa: E731
    with make(torch.Generator().manual_seed(7)) as whole:
        epoch0, epoch1 = _take(whole), _take(whole)
    with make(torch.Generator().manual_seed(7)) as first:
        it = iter(first)
        before = _take(it, stop) if stop else []
        state = first.state_dict()
    assert state["epoch"]["delivered"]["prefix"] == stop
    # the new loader's generator is in another state: the saved one replaces it
    with make(torch.Generator().manual_seed(99)) as resumed:
        resumed.load_state_dict(state)
        after = _take(resumed)
        _assert_same_batches(before + after, epoch0)
        _assert_same_batches(_take(resumed), epoch1)


def test_torch_dataloader_gives_the_same_resumed_batches():
    """The loader reproduces torch's batches; resumed, it still does."""
    torch_batches = list(torch.utils.data.DataLoader(IdRows(50), batch_size=4, shuffle=True,
                                                     generator=torch.Generator().manual_seed(3)))
    with _loader(shuffle=True, generator=torch.Generator().manual_seed(3)) as first:
        before = _take(iter(first), 5)
        state = first.state_dict()
    with _loader(shuffle=True, generator=torch.Generator()) as resumed:
        resumed.load_state_dict(state)
        _assert_same_batches(before + _take(resumed), torch_batches)


def test_global_generator_is_replayed_without_touching_the_trainers_state():
    torch.manual_seed(11)
    with _loader(NoisyRows(40), shuffle=True) as whole:
        epoch0 = _take(whole)
    torch.manual_seed(11)
    with _loader(NoisyRows(40), shuffle=True) as first:
        before = _take(iter(first), 4)
        state = first.state_dict()
    torch.manual_seed(1234)  # the trainer's own state, whatever it is
    mine = torch.get_rng_state()
    with _loader(NoisyRows(40), shuffle=True) as resumed:
        resumed.load_state_dict(state)
        it = iter(resumed)
        assert torch.equal(torch.get_rng_state(), mine)  # borrowed for the replay, given back
        _assert_same_batches(before + _take(it), epoch0)


def test_resume_across_worker_resizes_delivers_each_row_once_in_order():
    """Workers resized between batches before and after the checkpoint; a resumed loader that starts
    with another worker count delivers the rest of the epoch, identical to the uninterrupted run."""
    n = 120
    with _loader(NoisyRows(n), shuffle=True, generator=torch.Generator().manual_seed(5), batch_size=6) as whole:
        epoch0 = _take(whole)
    with _loader(NoisyRows(n), shuffle=True, generator=torch.Generator().manual_seed(5), batch_size=6,
                 num_workers=1, max_workers=4) as first:
        it, before = iter(first), []
        for workers in (3, 1, 4, 2):
            first.knobs["fetch.workers"].set(workers)
            before += _take(it, 2)
        first.knobs["fetch.workers"].set(4)  # resizing while the checkpoint is taken
        state = first.state_dict()
    with _loader(NoisyRows(n), shuffle=True, generator=torch.Generator(), batch_size=6,
                 num_workers=3, max_workers=4) as resumed:
        resumed.load_state_dict(state)
        it, after = iter(resumed), []
        while True:
            got = _take(it, 3)
            after += got
            if len(got) < 3:
                break
            resumed.knobs["fetch.workers"].set(1 + len(after) % 4)
    assert_exactly_once(_ids(before + after), range(n))
    _assert_same_batches(before + after, epoch0)


class Slow(Dataset):
    """Even batches are slow, so that with in_order=False later batches overtake them."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> int:
        if (i // 4) % 2 == 0:
            time.sleep(0.02)
        return i


def test_overtaking_batches_in_order_false_are_resumed_exactly_once():
    with _loader(Slow(), in_order=False, num_workers=3) as first:
        before = _take(iter(first), 7)
        state = first.state_dict()
    delivered = state["epoch"]["delivered"]
    assert delivered["prefix"] + len(delivered["beyond"]) == 7
    with _loader(Slow(), in_order=False, num_workers=3) as resumed:
        resumed.load_state_dict(state)
        after = _take(resumed)
    assert_exactly_once(_ids(before + after), range(64))


class HiddenRandom(Sampler):
    """A sampler with randomness of its own, no generator and no state_dict: it cannot be regenerated."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        return iter(np.random.default_rng().permutation(self.n).tolist())


def test_a_sampler_that_cannot_regenerate_its_order_raises_instead_of_resuming_wrong():
    with _loader(sampler=HiddenRandom(40)) as first:
        _take(iter(first), 3)
        state = first.state_dict()
    with _loader(sampler=HiddenRandom(40)) as resumed:
        resumed.load_state_dict(state)
        with pytest.raises(ResumeMismatchError, match="HiddenRandom|regenerated other indices"):
            iter(resumed)
        with pytest.raises(ResumeMismatchError):  # not a fresh epoch on a retry either
            iter(resumed)


class SeededSampler(Sampler):
    """A sampler with its own seed, saved and loaded by its state_dict()."""

    def __init__(self, n: int, seed: int) -> None:
        self.n, self.seed = n, seed

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        order = np.random.default_rng(self.seed).permutation(self.n).tolist()
        self.seed += 1  # the next epoch shuffles anew
        return iter(order)

    def state_dict(self):
        return {"seed": self.seed}

    def load_state_dict(self, state):
        self.seed = int(state["seed"])


def test_a_sampler_with_state_dict_is_resumed_from_its_state_at_the_epoch_start():
    with _loader(sampler=SeededSampler(40, seed=1)) as whole:
        epoch0, epoch1 = _take(whole), _take(whole)
    with _loader(sampler=SeededSampler(40, seed=1)) as first:
        before = _take(iter(first), 4)
        state = first.state_dict()
    assert state["epoch"]["sampler_states"] == {"sampler": {"seed": 1}}
    with _loader(sampler=SeededSampler(40, seed=500)) as resumed:
        resumed.load_state_dict(state)
        _assert_same_batches(before + _take(resumed), epoch0)
        _assert_same_batches(_take(resumed), epoch1)


class Stream(IterableDataset):
    """Rows 0..n-1; ``stateful`` adds torchdata's state_dict/load_state_dict (the position)."""

    def __init__(self, n: int) -> None:
        self.n, self.start, self.reads = n, 0, 0

    def __iter__(self):
        start, self.start = self.start, 0
        for i in range(start, self.n):
            self.reads += 1
            self.position = i + 1
            yield i


class StatefulStream(Stream):
    position = 0

    def state_dict(self):
        return {"position": self.position}

    def load_state_dict(self, state):
        self.start = int(state["position"])


@pytest.mark.parametrize("kind", [Stream, StatefulStream])
def test_iterable_datasets_resume_after_the_last_delivered_batch(kind):
    with _loader(kind(45), batch_size=4, num_workers=0) as first:
        before = _take(iter(first), 5)  # the stream reads ahead of the loop meanwhile
        state = first.state_dict()
    if kind is StatefulStream:
        # after the 5th batch, not the read-ahead; the generator __iter__ returns keeps no state of its own
        assert state["epoch"]["dataset"] == {"batches": 5, "dataset": {"position": 20}, "iterator": None}
    fresh = kind(45)
    with _loader(fresh, batch_size=4, num_workers=0) as resumed:
        resumed.load_state_dict(state)
        after = _take(resumed)
        nxt = _take(resumed)
    assert_exactly_once(_ids(before + after), range(45))
    assert _ids(before + after).tolist() == list(range(45))
    assert _ids(nxt).tolist() == list(range(45))
    # a stateful dataset is not read again from its start; a plain one reads the skipped rows once more
    assert fresh.reads == (45 - 20 + 45 if kind is StatefulStream else 45 + 45)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"batch_size": 5}, "batch_size"),
        ({"drop_last": True}, "drop_last"),
        ({"shuffle": False}, "shuffle"),
        ({"seed": 3}, "seed"),
        ({"dataset": IdRows(51)}, "dataset_len"),
        ({"rank": 1, "world_size": 2}, "rank"),
        ({"tune": "none"}, "tune"),
    ],
)
def test_a_state_from_another_configuration_raises_naming_the_field(change, field):
    base = dict(batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(0))
    if field == "tune":  # the policy counts when both loaders are tuned
        base["tune"] = "heuristic"
    with _loader(**base) as first:
        _take(iter(first), 2)
        state = first.state_dict()
    kw = {**base, **change}
    dataset = kw.pop("dataset", None)
    with _loader(dataset, **kw) as other:
        with pytest.raises(ResumeMismatchError, match=rf"{field}: saved"):
            other.load_state_dict(state)
        # nothing changed: the loader still stands before its first epoch
        after = other.state_dict()
        assert after["epochs_started"] == 0 and after["epoch"] is None and after["seed"] is None


@pytest.mark.parametrize(("saved", "resumed"), [(None, "intune"), ("intune", None)])
def test_a_tuned_state_resumes_an_untuned_loader_and_the_reverse(saved, resumed):
    """The rows do not depend on tuning: an untuned loader ignores the tuner's state, a tuned one starts
    its tuner afresh from an untuned state."""
    make = lambda tune: _loader(shuffle=True, generator=torch.Generator().manual_seed(6), tune=tune)  # noqa: E731
    with make(saved) as whole:
        epoch = _take(whole)
    with make(saved) as first:
        before = _take(iter(first), 3)
        state = first.state_dict()
    with make(resumed) as other:
        other.load_state_dict(state)
        _assert_same_batches(before + _take(other), epoch)


def test_each_rank_resumes_its_own_share():
    states, firsts, wholes = {}, {}, {}
    for rank in (0, 1):
        with _loader(IdRows(60), shuffle=True, rank=rank, world_size=2, seed=4) as whole:
            wholes[rank] = _take(whole)
        with _loader(IdRows(60), shuffle=True, rank=rank, world_size=2, seed=4) as first:
            firsts[rank] = _take(iter(first), 2 + rank)
            states[rank] = first.state_dict()
    rows = []
    for rank in (0, 1):
        with _loader(IdRows(60), shuffle=True, rank=rank, world_size=2, seed=4) as resumed:
            resumed.load_state_dict(states[rank])
            got = firsts[rank] + _take(resumed)
        _assert_same_batches(got, wholes[rank])
        rows.append(_ids(got))
    assert_exactly_once(np.concatenate(rows), range(60))
    with _loader(IdRows(60), shuffle=True, rank=1, world_size=2, seed=4) as other:
        with pytest.raises(ResumeMismatchError, match="rank: saved 0, now 1"):
            other.load_state_dict(states[0])


def test_state_through_a_checkpoint_file_with_a_tuned_loader(tmp_path):
    """The whole state (tuner included) is stored without pickle; the resumed loader starts at the saved
    knob values; a corrupted file is refused."""
    # num_workers="auto": a tuner may go below the start (an explicit num_workers is its floor)
    with _loader(NoisyRows(80), shuffle=True, generator=torch.Generator().manual_seed(2), tune="intune",
                 num_workers="auto") as whole:
        epoch0 = _take(whole)
    with _loader(NoisyRows(80), shuffle=True, generator=torch.Generator().manual_seed(2), tune="intune",
                 max_workers=4, num_workers="auto") as first:
        before = _take(iter(first), 6)
        first.knobs["fetch.workers"].set(1)  # where a tuner might have put it
        t0 = time.perf_counter()
        state = first.state_dict()
        state_ms = (time.perf_counter() - t0) * 1e3
    path = save_checkpoint(tmp_path / "loader.ckpt", state, kind="dataloader")
    print(f"DataLoader state (tune='intune'): {path.stat().st_size} bytes on disk, state_dict() {state_ms:.1f} ms")
    assert state["tuner"]["knobs"]["fetch.workers"]["value"] == 1
    loaded = load_checkpoint(path, kind="dataloader")
    with _loader(NoisyRows(80), shuffle=True, generator=torch.Generator(), tune="intune", max_workers=4,
                 num_workers="auto") as resumed:
        resumed.load_state_dict(loaded)
        assert resumed.knobs["fetch.workers"].value == 1
        _assert_same_batches(before + _take(resumed), epoch0)
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError):
        load_checkpoint(path, kind="dataloader")


def test_state_between_epochs_and_before_the_first():
    make = lambda: _loader(shuffle=True, generator=torch.Generator().manual_seed(9))  # noqa: E731
    with make() as whole:
        epochs = [_take(whole) for _ in range(3)]
    with make() as first:
        fresh_state = first.state_dict()
        _take(first)
        between = first.state_dict()  # the epoch ran out: nothing to resume, the next one starts anew
    assert fresh_state["epoch"] is None and between["epoch"] is None and between["epochs_started"] == 1
    with _loader(shuffle=True, generator=torch.Generator()) as resumed:
        resumed.load_state_dict(between)
        _assert_same_batches(_take(resumed), epochs[1])
        _assert_same_batches(_take(resumed), epochs[2])
    with _loader(shuffle=True, generator=torch.Generator()) as resumed:
        resumed.load_state_dict(fresh_state)
        _assert_same_batches(_take(resumed), epochs[0])


class FailsAt(Dataset):
    def __len__(self) -> int:
        return 20

    def __getitem__(self, i: int) -> int:
        if i == 9:
            raise KeyError(i)
        return i


def test_a_failed_batch_counts_as_delivered():
    """The loop got the failed batch's error in its place; a resume does not raise it again."""
    with _loader(FailsAt()) as first:
        it = iter(first)
        before = _take(it, 2)
        with pytest.raises(KeyError):
            next(it)
        state = first.state_dict()
    assert state["epoch"]["delivered"]["prefix"] == 3
    with _loader(FailsAt()) as resumed:
        resumed.load_state_dict(state)
        after = _take(resumed)
    assert _ids(before + after).tolist() == [i for i in range(20) if i // 4 != 2]


@pytest.mark.parametrize("kw", [{"num_workers": 0}, {"batch_size": None}, {"drop_last": True, "batch_size": 6}])
def test_resume_without_workers_without_batching_and_with_drop_last(kw):
    # without workers, __getitem__ draws from the training loop's own generators (as with torch): its
    # random values are not the loader's to replay, so rows without randomness there
    rows = (lambda: IdRows(40)) if kw.get("num_workers") == 0 else (lambda: NoisyRows(40))  # noqa: E731
    make = lambda g: _loader(rows(), shuffle=True, generator=g, **kw)  # noqa: E731
    with make(torch.Generator().manual_seed(4)) as whole:
        epoch0 = _take(whole)
    with make(torch.Generator().manual_seed(4)) as first:
        before = _take(iter(first), 3)
        state = first.state_dict()
    with make(torch.Generator()) as resumed:
        resumed.load_state_dict(state)
        _assert_same_batches(before + _take(resumed), epoch0)


class FlipWorkers:
    """A policy that moves the fetch workers between 1 and 3 every tick."""

    name = "flip"

    def reset(self, knobs, observation):
        self.knobs = knobs

    def step(self, observation):
        return {"fetch.workers": 3 if self.knobs["fetch.workers"].value == 1 else 1}


class SlowNoisy(NoisyRows):
    def __getitem__(self, i: int):
        time.sleep(0.001)
        return super().__getitem__(i)


def test_checkpoint_while_the_tuner_resizes_the_workers_every_tick():
    """The tuner thread resizes the workers every 20 ms while the loop takes states; the last one,
    resumed by a loader whose tuner keeps resizing, gives the uninterrupted epoch exactly."""
    n = 600

    def make(g):
        loader = _loader(SlowNoisy(n), shuffle=True, generator=g, batch_size=8, tune=FlipWorkers(), max_workers=4)
        loader.tuner.tick_s = 0.02
        return loader

    with _loader(NoisyRows(n), shuffle=True, generator=torch.Generator().manual_seed(8), batch_size=8) as whole:
        epoch0 = _take(whole)
    with make(torch.Generator().manual_seed(8)) as first:
        it, before, states = iter(first), [], []
        for batch in it:
            before.append(batch)
            states.append(first.state_dict())
            # at least 40 batches, and on until the tuner has ticked twice (a busy machine may hold its
            # thread back), short of the epoch's end
            if len(before) >= 40 and (len(first.tuner.history()) >= 2 or len(before) >= 70):
                break
        ticks = len(first.tuner.history())
    assert ticks >= 2, "the tuner never ticked: nothing was resized"
    with make(torch.Generator()) as resumed:
        resumed.load_state_dict(states[-1])
        after = _take(resumed)
        moved = {row["knobs"]["fetch.workers"] for row in resumed.tuner.history()}
    assert_exactly_once(_ids(before + after), range(n))
    _assert_same_batches(before + after, epoch0)
    print(f"ticks before the checkpoint {ticks}, worker counts after it {sorted(moved)}")


def test_persistent_workers_resume_in_a_later_epoch():
    """With persistent_workers the seed is drawn at the first iter() only: a resume in the second epoch
    must not draw it again (the state says so), and gives the uninterrupted second and third epochs."""
    make = lambda g: _loader(NoisyRows(40), shuffle=True, generator=g, persistent_workers=True)  # noqa: E731
    with make(torch.Generator().manual_seed(6)) as whole:
        epochs = [_take(whole) for _ in range(3)]
    with make(torch.Generator().manual_seed(6)) as first:
        _take(first)
        before = _take(iter(first), 4)
        state = first.state_dict()
    assert state["epoch"]["epoch"] == 1 and state["epoch"]["seed_drawn"] is False
    with make(torch.Generator()) as resumed:
        resumed.load_state_dict(state)
        _assert_same_batches(before + _take(resumed), epochs[1])
        _assert_same_batches(_take(resumed), epochs[2])
