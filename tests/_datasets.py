"""Small map-style datasets shared by the DataLoader tests."""

from torch.utils.data import Dataset


class IdRows(Dataset):
    """Row ``i`` is the integer ``i``: what a loader delivers names the rows it read."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i
