"""The engine's exceptions: what a consumer sees when a stage, a source or a worker fails.

Owns the wording of failures (stage, source file, row range, original traceback). It must not decide
when to raise: stages and sources do that.
"""

from __future__ import annotations


class PipelineError(RuntimeError):
    """A failure inside the pipeline, raised to the consumer."""


class SourceError(PipelineError):
    """A source could not be read: a missing or corrupt file, a malformed line, unequal columns."""


class StageError(PipelineError):
    """A stage's function failed on a chunk.

    ``stage`` names the stage, ``origin`` says which source rows the chunk held, ``remote_traceback``
    carries the traceback from the worker (thread or process) where the function raised.
    """

    def __init__(self, stage: str, origin: str, cause: str, remote_traceback: str = "") -> None:
        self.stage = stage
        self.origin = origin
        self.remote_traceback = remote_traceback
        message = f"stage {stage!r} failed on {origin}: {cause}"
        if remote_traceback:
            message += "\n\nOriginal traceback (in the worker):\n" + remote_traceback.rstrip()
        super().__init__(message)


class WorkerLostError(PipelineError):
    """A process worker kept dying on the same chunk, beyond the restart budget."""


class SchemaError(PipelineError):
    """A chunk does not match the pipeline's schema: a missing or extra column, or a type that cannot
    hold the schema's values without loss. The message names where (file, chunk, stage), the column
    and both types; the schema is never bent silently, because a cast that loses values corrupts data."""


class StageTimeoutError(StageError):
    """A stage's function held one chunk for longer than the stage's ``timeout_s``."""

    def __init__(self, stage: str, origin: str, timeout_s: float) -> None:
        super().__init__(stage, origin, f"no result after {timeout_s:g} s (timeout_s={timeout_s:g}); the function is hung or too slow")
        self.timeout_s = timeout_s


class PipelineClosedError(PipelineError):
    """The epoch this iterator was reading was stopped before its end: the pipeline was closed, or a
    new epoch was started, so the rows delivered so far are not a whole epoch. Only an epoch that
    delivered everything ends with ``StopIteration``."""


class ClusterError(PipelineError):
    """A map stage's remote workers cannot run: the Ray cluster named by ``address`` cannot be reached,
    ``address="auto"`` finds none, or this process is already connected to another one."""
