"""The pipeline engine: ``Pipeline`` and the errors a consumer may see.

Modules: ``engine`` (the builder, knobs, metrics), ``epoch`` (a running epoch, the consumer's end),
``stages`` (the stage base, read and map), ``serial_stages`` (shuffle, batch, prefetch), ``pool``
(resizable worker pools), ``procworker`` and ``shm`` (process workers over shared memory),
``remote_ray`` (a map stage's remote workers: Ray actors beside the local ones), ``ray_host`` (the
helper process that is intune's Ray driver, so that a Ray node's death cannot end the trainer),
``channel`` (bounded, ordered queues), ``shuffle`` and ``batcher`` (pure algorithms), ``sources``
and ``criteo`` (readers), ``columns`` (Arrow columns as numpy: strings as fixed-width arrays),
``metrics`` (the snapshot contract), ``resume`` and ``session_resume`` (what stages share to resume an
epoch: roles, the input log, its replays) and ``state`` (a pipeline's state composed of its stages').
"""

from intune.pipeline.engine import Pipeline
from intune.pipeline.errors import (
    ClusterError,
    PipelineClosedError,
    PipelineError,
    SchemaError,
    SourceError,
    StageError,
    StageTimeoutError,
    WorkerLostError,
)

__all__ = [
    "ClusterError",
    "Pipeline",
    "PipelineClosedError",
    "PipelineError",
    "SchemaError",
    "SourceError",
    "StageError",
    "StageTimeoutError",
    "WorkerLostError",
]
