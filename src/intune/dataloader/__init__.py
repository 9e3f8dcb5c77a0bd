"""``intune.DataLoader``: a drop-in for ``torch.utils.data.DataLoader``, its worker count tuned live.

The package owns the loader and nothing else; each module owns one part: ``loader`` (the class and
its epochs), ``sampling`` (torch's samplers, the split among ranks, the source of index batches),
``fetch`` (what a worker runs), ``stage`` (the engine's map stage as the loader needs it),
``transport`` (collated batches through shared memory), ``stream`` (iterable datasets), ``errors``
(what the training loop sees when a worker fails), ``resume`` (what a checkpoint holds about an
epoch, and the checks that refuse a state from another configuration), ``dataset_state`` (a dataset's
and its iterator's own ``state_dict()``, taken and restored as torchdata's ``StatefulDataLoader`` does),
``shared_list`` (``SharedList``: big lists read by workers without copy-on-read; the loader's warning). A rank's place and machine share come from
``intune.pipeline.sharding``, as for the pipeline's own sources.
"""

from intune.dataloader.errors import DataLoaderWorkerError, DatasetPickleError
from intune.dataloader.loader import DataLoader
from intune.dataloader.resume import ResumeMismatchError
from intune.dataloader.shared_list import CopyOnReadWarning, SharedList

__all__ = [
    "CopyOnReadWarning",
    "DataLoader",
    "DataLoaderWorkerError",
    "DatasetPickleError",
    "ResumeMismatchError",
    "SharedList",
]
