"""intune: a live-resizable input pipeline for recommendation-model training, and the policies that tune it.

Public API: ``Pipeline`` (the engine), ``Knob``, ``monitor`` (machine metrics), ``tune`` (run a
policy on a live pipeline). Names resolve lazily so that ``import intune`` stays cheap and does not
import torch.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "Pipeline": ("intune.pipeline", "Pipeline"),
    "DataLoader": ("intune.dataloader", "DataLoader"),
    "SharedList": ("intune.dataloader.shared_list", "SharedList"),
    "Knob": ("intune.knobs", "Knob"),
    "Observation": ("intune.monitor.observation", "Observation"),
    "monitor": ("intune.monitor", None),
    "tune": ("intune.tuner", "tune"),
    "Tuner": ("intune.tuner", "Tuner"),
    "PipelineError": ("intune.pipeline.errors", "PipelineError"),
    "PipelineClosedError": ("intune.pipeline.errors", "PipelineClosedError"),
    "SchemaError": ("intune.pipeline.errors", "SchemaError"),
    "StageTimeoutError": ("intune.pipeline.errors", "StageTimeoutError"),
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'intune' has no attribute {name!r}")
    module_name, attr = _LAZY[name]
    module = importlib.import_module(module_name)
    value = module if attr is None else getattr(module, attr)
    globals()[name] = value
    return value
