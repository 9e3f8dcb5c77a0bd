"""`intune bench real` is fair: on one small data set every available system, run as the benchmark
runs it (its own process, the shared reader, the same pickled UDF), delivers one epoch of exactly the
data's rows, in batches of the same sizes, with the same values after the UDF as the shared reader
and the UDF give in this process. Systems whose package is missing are skipped with the reason."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from intune.bench import real
from intune.bench.real_systems import epoch_slices, row_groups
from intune.dlrm import data, workload

ROWS = 12_000  # 5 row groups of 2,048 rows and one of 1,760: a short last group and a short last batch
GROUP_ROWS = 2_048
BATCH_ROWS = 1_024
SYSTEMS = [
    ("pytorch-dataloader", "num_workers=2"),
    ("torchdata-nodes", None),
    ("tf.data", "AUTOTUNE"),
    ("intune-engine", "none"),
    ("intune-engine", "fixed:read.workers=2+udf.workers=2"),  # parallel readers, two UDF processes
]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> dict:
    """The files, the pickled UDF, and the reference epoch: the shared reader and the UDF in-process."""
    root = tmp_path_factory.mktemp("fair")
    files = [str(f) for f in data.generate(ROWS, root / "data", seed=3, row_group_rows=GROUP_ROWS)]
    udf = workload.make_udf("heavy", [root / "data" / f for f in files], table_size=1000)
    udf_path = root / "udf.pickle"
    udf_path.write_bytes(pickle.dumps(udf))
    outputs = [udf(piece) for piece in epoch_slices(row_groups(files), BATCH_ROWS)]
    reference = {k: np.concatenate([o[k] for o in outputs]) for k in outputs[0]}
    sizes = sorted(len(o["label"]) for o in outputs)
    return {"files": files, "udf_path": str(udf_path), "root": root, "reference": reference, "sizes": sizes}


def sorted_rows(columns: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The rows in one canonical order (by label, then every dense and sparse column), so that
    systems that interleave workers' batches differently compare equal when their rows are equal."""
    keys = [columns["sparse"][:, j] for j in range(columns["sparse"].shape[1])[::-1]]
    keys += [columns["dense"][:, j] for j in range(columns["dense"].shape[1])[::-1]]
    order = np.lexsort([*keys, columns["label"]])
    return {k: v[order] for k, v in columns.items()}


@pytest.mark.parametrize(("system", "policy"), SYSTEMS, ids=[f"{s}:{p}" for s, p in SYSTEMS])
def test_every_system_emits_the_same_rows_and_batches(dataset: dict, system: str, policy: str | None) -> None:
    skip = {(e.system, e.policy): e.skip for e in real.available_systems(None, cpus=2.0)}.get(
        (system, policy)
    )
    if skip:
        pytest.skip(f"{system}: {skip}")
    out_path = dataset["root"] / f"{system}-{policy}.npz".replace(":", "_")
    spec = {
        "system": system,
        "policy": policy,
        "files": dataset["files"],
        "udf": "heavy",
        "udf_path": dataset["udf_path"],
        "table_size": 1000,
        "batch_rows": BATCH_ROWS,
        "cpus": 2.0,
        "collect_to": str(out_path),
        "collect_rows": ROWS,
    }
    out = real.run_child(spec, timeout_s=120)
    assert "error" not in out, out
    assert out["rows"] == ROWS  # one epoch, every row once: nothing dropped, nothing from a 2nd epoch
    got = dict(np.load(out_path))
    assert sorted(got.pop("batch_rows").tolist()) == dataset["sizes"]
    want = sorted_rows(dataset["reference"])
    got = sorted_rows(got)
    assert set(got) == set(want)
    for name in want:
        assert got[name].dtype == want[name].dtype, name
        np.testing.assert_array_equal(got[name], want[name], err_msg=f"{system} column {name}")
