"""Preprocessing UDFs for session data, written as production pipelines write them.

The user UDF turns raw user columns into model inputs (log1p counts, hashed ids) and walks the
user-history list row by row in Python (keep the most recent items, drop immediate repeats, hash each
id into the item table): GIL-bound per-row work like the UDFs that dominate real DLRM pipelines. The
item UDF hashes the candidate item and builds a category x position cross per row. Wrapped in
``GroupUDF`` the user UDF runs on unique rows of a deduplicated batch and on all rows otherwise. This
module must not deduplicate or shuffle; its hashing must agree between history and candidate items.
"""

from __future__ import annotations

import numpy as np

from intune.hashing import mix64
from intune.recd.dedup import GroupUDF
from intune.recd.model import SessionDLRMConfig
from intune.recd.sessions import USER_COLUMNS

Chunk = dict[str, np.ndarray]
_A, _B, _P = 1_000_003, 7_919, 2_147_483_647  # item-id hash: ((x * A + B) mod P) mod table


def hash_items(ids: np.ndarray, table: int) -> np.ndarray:
    """Vectorised item-id hash, equal to the per-row one used on histories."""
    return (ids.astype(np.int64) * _A + _B) % _P % table


class UserUDF:
    """Raw user columns -> model inputs; the history list is processed per row in Python."""

    def __init__(self, config: SessionDLRMConfig | None = None, history_len: int = 48):
        self.config, self.history_len = config or SessionDLRMConfig(), history_len

    def __call__(self, rows: Chunk) -> Chunk:
        c, keep = self.config, self.history_len
        out: Chunk = {}
        for name in ("user_clicks", "user_views", "user_days", "user_purchases"):
            out[name] = np.log1p(np.maximum(rows[name], 0)).astype(np.float32)
        out["user_id"] = (mix64(rows["user_id"], 11) % np.uint64(c.user_table)).astype(np.int64)
        out["user_country"] = rows["user_country"] % c.country_table
        out["user_device"] = rows["user_device"] % c.device_table
        values, lengths = rows["user_history.values"].tolist(), rows["user_history.lengths"].tolist()
        new_values: list[int] = []
        new_lengths = np.empty(len(lengths), dtype=np.int64)
        start, table = 0, c.item_table
        for i, n in enumerate(lengths):
            recent = values[max(start, start + n - keep): start + n]
            start += n
            kept = [x for j, x in enumerate(recent) if j == 0 or x != recent[j - 1]]
            new_values.extend((x * _A + _B) % _P % table for x in kept)
            new_lengths[i] = len(kept)
        out["user_history.values"] = np.asarray(new_values, dtype=np.int64)
        out["user_history.lengths"] = new_lengths
        return out


class ItemUDF:
    """Candidate item hashing, category and position bounds, and a per-row category x position cross."""

    def __init__(self, config: SessionDLRMConfig | None = None, cross_table: int = 65_536):
        self.config, self.cross_table = config or SessionDLRMConfig(), cross_table

    def __call__(self, chunk: Chunk) -> Chunk:
        c = self.config
        out = dict(chunk)
        out["item_id"] = hash_items(chunk["item_id"], c.item_table)
        out["item_category"] = chunk["item_category"] % c.category_table
        out["position"] = np.clip(chunk["position"], 0, c.position_table - 1)
        cats, pos = chunk["item_category"].tolist(), chunk["position"].tolist()
        out["item_cross"] = np.fromiter(
            (hash((a, min(b // 4, 15))) % self.cross_table for a, b in zip(cats, pos, strict=True)), dtype=np.int64, count=len(cats)
        )
        return out


def preprocess_udfs(config: SessionDLRMConfig | None = None) -> list:
    """The map functions after batching: user group UDF (unique rows when deduplicated), item UDF."""
    return [GroupUDF("user", list(USER_COLUMNS), UserUDF(config), name="user_udf"), ItemUDF(config)]
