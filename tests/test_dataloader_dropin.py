"""intune.DataLoader behaves as torch's DataLoader where torch's own test file looks: what a sampler
yields reaches the dataset as it is, worker counts are never capped silently, workers are seeded as
torch seeds them, iterable datasets are read by every worker, and errors and argument checks are torch's."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader as TorchLoader
from torch.utils.data import Dataset, Sampler

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
