"""The one splitmix64 (intune.hashing): the published outputs, and the DLRM and RecD callers agree."""

from __future__ import annotations

import numpy as np

from intune.hashing import mix64, splitmix64

MASK = (1 << 64) - 1


def _finaliser_by_hand(z: int) -> int:
    z &= MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def test_splitmix64_gives_the_published_outputs_of_seed_0() -> None:
    # the generator seeded at 0 yields 0xE220A8397B1DCDAF, then 0x6E789E6AA1B965F4 (state 1 * golden)
    assert splitmix64(np.array([0, 0x9E3779B97F4A7C15], dtype=np.uint64)).tolist() == [
        0xE220A8397B1DCDAF,
        0x6E789E6AA1B965F4,
    ]


def test_mix64_is_the_finaliser_of_value_plus_salt_times_golden() -> None:
    values = [0, 1, 12345, -7, 2**62]
    for salt in (0, 1, 11, -3):
        got = mix64(np.array(values, dtype=np.int64), salt).tolist()
        assert got == [_finaliser_by_hand(v + salt * 0x9E3779B97F4A7C15) for v in values]
        assert splitmix64(np.array(values), salt).tolist() == mix64(np.array(values), salt + 1).tolist()


def test_integers_hash_by_their_64_bit_pattern_whatever_their_dtype() -> None:
    signed = np.array([-1, 5], dtype=np.int64)
    unsigned = np.array([MASK, 5], dtype=np.uint64)
    assert mix64(signed, 3).tolist() == mix64(unsigned, 3).tolist()
    assert mix64(np.array([5], dtype=np.int32), 3).tolist() == mix64(np.array([5], dtype=np.uint64), 3).tolist()
