"""RecD-style in-batch deduplication (Zhao et al., MLSys 2023, arXiv 2211.05239).

``IKJT`` (unique rows + inverse indices of a feature group), ``dedup_transform`` (a batch chunk ->
IKJT-carrying chunk map function), ``GroupUDF`` (a group's UDF on unique rows), ``shuffle_sessions`` /
``SessionShuffleBuffer`` / ``session_permutation`` (shuffle sessions, not rows), ``write_session_dataset``
(session data), and the dedup-aware ``SessionDLRM`` in ``intune.recd.model`` (imported lazily: torch).

In the engine (list columns arrive as object arrays until the engine reads them as jagged pairs)::

    pipe = (intune.Pipeline.from_parquet("sessions/*.parquet")
            .batch(1024)
            .map(ListsToJagged(["user_history"]))
            .map(dedup_transform({"user": list(USER_COLUMNS)}))        # Pipeline.dedup(groups)
            .map(GroupUDF("user", list(USER_COLUMNS), UserUDF()))        # runs on unique rows
            .map(ItemUDF()))
"""

from intune.recd._chunks import ListsToJagged
from intune.recd.dedup import DedupTransform, GroupUDF, build_ikjt, dedup_transform
from intune.recd.ikjt import IKJT
from intune.recd.session_shuffle import SessionShuffleBuffer, session_permutation, shuffle_sessions
from intune.recd.sessions import read_session_chunks, write_session_dataset

__all__ = [
    "IKJT",
    "ListsToJagged",
    "SessionShuffleBuffer",
    "DedupTransform",
    "GroupUDF",
    "build_ikjt",
    "dedup_transform",
    "read_session_chunks",
    "session_permutation",
    "shuffle_sessions",
    "write_session_dataset",
]
