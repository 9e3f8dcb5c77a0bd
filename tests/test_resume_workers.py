"""A map-style dataset with a state of its own (here torch's generator, which ``__getitem__`` draws
from), fetched by worker processes, resumes as torchdata's ``StatefulDataLoader`` resumes it: each
worker's copy's ``state_dict()`` is in the loader's state (taken when the epoch opens and after its
batches), and a resume gives every worker its own back, so the rows after the resume are the
uninterrupted run's. Before, workers were seeded afresh and drew other numbers; persistent workers
kept their own generators across ``load_state_dict``; a state between epochs lost the persistent
workers' states."""

from __future__ import annotations

import json

import pytest
import torch
from torch.utils.data import Dataset

import intune


class RandomRows(Dataset):
    """Row ``i`` is ``1000 * i`` plus a draw from torch's generator (in the worker that fetches it); its
    state is that generator's."""

    def __len__(self) -> int:
        return 48

    def __getitem__(self, i: int) -> int:
        return 1000 * i + int(torch.randint(1000, (1,)))

    def state_dict(self):
        return {"g": torch.get_rng_state()}

    def load_state_dict(self, state):
        torch.set_rng_state(state["g"])


def _loader(**kw):
    kw.setdefault("batch_size", 4)
    kw.setdefault("num_workers", 3)
    kw.setdefault("tune", None)
    kw.setdefault("shuffle", True)
    return intune.DataLoader(RandomRows(), generator=torch.Generator().manual_seed(7), **kw)


def _rows(batches) -> list[int]:
    return [int(v) for batch in batches for v in batch.tolist()]


def _take(it, n):
    return [next(it) for _ in range(n)]


@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("every", [1, 4])
@pytest.mark.parametrize("cut", [0, 5])
def test_each_workers_state_is_restored_mid_epoch(persistent, every, cut):
    kw = dict(persistent_workers=persistent, snapshot_every_n_steps=every)
    with _loader(**kw) as whole:
        expected = _rows(whole)
    with _loader(**kw) as first:
        it = iter(first)
        before = _rows(_take(it, cut))
        state = first.state_dict()
    json.dumps({k: v for k, v in state.items() if k != "epoch"})  # the generator states are tensors, kept as they are
    with _loader(**kw) as resumed:
        resumed.load_state_dict(state)
        after = _rows(resumed)
    assert before + after == expected


def test_persistent_workers_states_carry_over_a_resume_between_epochs():
    with _loader(persistent_workers=True) as whole:
        _rows(whole)
        second = _rows(whole)
    with _loader(persistent_workers=True) as first:
        _rows(first)
        state = first.state_dict()
    with _loader(persistent_workers=True) as resumed:
        resumed.load_state_dict(state)
        assert _rows(resumed) == second


def test_load_state_dict_restarts_persistent_workers():
    """The same loader, its persistent workers already past the state: they start afresh from it."""
    with _loader(persistent_workers=True) as loader:
        state = loader.state_dict()  # before any epoch
        it = iter(loader)
        before = _rows(_take(it, 3))
        loader.load_state_dict(state)
        again = _rows(loader)
    assert again[:12] == before
    with _loader(persistent_workers=True) as fresh:
        assert again == _rows(fresh)
