"""Workload specs: shipped workloads load, validation errors name the file and the field, variants."""

import json

import numpy as np
import pytest

from intune.sim import SpecError, list_workloads, load_workload, model, spec_from_dict, workload_variant

BASE = {"name": "w", "stages": [{"name": "read", "cpu_us_per_row": 1.0}]}


def _with_stage(**fields):
    return {**BASE, "stages": [{"name": "read", "cpu_us_per_row": 1.0, **fields}]}


@pytest.mark.parametrize(
    "data, field",
    [
        (_with_stage(cpu_us_per_rwo=1.0), r"stages\[0\] \(read\)\.cpu_us_per_rwo: unknown field"),
        (_with_stage(cpu_us_per_row=-1.0), r"stages\[0\] \(read\)\.cpu_us_per_row: must be >= 0"),
        (_with_stage(mode="fiber"), r"stages\[0\] \(read\)\.mode: must be one of"),
        (_with_stage(mode="process", gil_fraction=0.5), r"\(read\)\.gil_fraction: applies only to thread"),
        (
            _with_stage(buffer={"min": 8, "max": 4, "default": 4}),
            r"\(read\)\.buffer: needs min <= default <= max",
        ),
        (_with_stage(max_workers=2.5), r"\(read\)\.max_workers: must be an integer"),
        ({**BASE, "machine": {"cpus": 0}}, r"machine\.cpus: must be >= 1"),
        (
            {**BASE, "machine": {"memory_limit_gb": 8, "base_memory_gb": 9}},
            r"machine\.base_memory_gb: must be below",
        ),
        ({**BASE, "stages": [BASE["stages"][0], BASE["stages"][0]]}, r"stage names must be unique"),
        ({**BASE, "ladder": [["read", "udf"]]}, r"ladder\[0\]: unknown stage\(s\) \['udf'\]"),
        ({"stages": BASE["stages"]}, r"name: is required"),
    ],
)
def test_validation_errors_name_the_field(data, field):
    with pytest.raises(SpecError, match=field):
        spec_from_dict(data, source="my.yaml")


def test_errors_name_the_file(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(_with_stage(contention=2.0)))
    with pytest.raises(SpecError, match=r"bad\.json.*contention: must be <= 1"):
        load_workload(path)
    with pytest.raises(SpecError, match="no shipped workload 'nope'"):
        load_workload("nope")


def test_json_and_yaml_specs_load(tmp_path):
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(BASE))
    assert load_workload(str(path)).stage_names == ("read",)


def test_shipped_workloads_load_and_criteo_has_the_papers_shares():
    names = list_workloads()
    assert {"criteo", "production", "ladder-2", "ladder-7"} <= set(names)
    for name in names:
        assert load_workload(name).stages
    criteo = load_workload("criteo")
    assert (
        criteo.stage_names == ("read", "batch", "shuffle", "udf", "prefetch") and criteo.batch_size == 24096
    )
    p = model.params_from_spec(criteo)
    latency = p.cpu_s_per_row + p.io_s_per_row
    np.testing.assert_allclose(latency / latency.sum(), [0.14, 0.28, 0.117, 0.423, 0.04], atol=0.002)
    assert load_workload("production").stage_names == ("read", "shuffle", "udf", "batch", "prefetch")
    assert [len(load_workload(f"ladder-{k}").stages) for k in range(2, 8)] == [2, 3, 4, 5, 6, 7]


def test_production_matches_figure_5_shares_of_demand():
    spec = load_workload("production")
    p = model.params_from_spec(spec)
    for name, ref in spec.references.items():
        w = [ref.workers[s] for s in p.names]
        b = [
            ref.buffer_mb.get(s, st.buffer.default if st.buffer else 0)
            for s, st in zip(p.names, spec.stages, strict=True)
        ]
        share = model.throughput(p, w, b, ref.cpus) / p.demand
        assert share == pytest.approx(ref.demand_share, abs=0.025), name


def test_variants_change_cpus_batch_and_stages():
    spec = load_workload("criteo", cpus=8, batch_size=4096)
    assert spec.machine.cpus == 8 and spec.rows_per_item() == [4096, 4096, 4096, 4096, 4096]
    small = workload_variant(load_workload("criteo"), stages=["udf", "read"])
    assert small.stage_names == ("read", "udf")  # the spec's order is kept
    with pytest.raises(SpecError, match=r"unknown stage\(s\) \['nope'\]"):
        workload_variant(load_workload("criteo"), stages=["read", "nope"])


def test_the_docs_example_is_a_valid_spec():
    import re
    from pathlib import Path

    import yaml

    text = (Path(__file__).parents[1] / "docs" / "workloads.md").read_text()
    example = re.search(r"```yaml\n(.*?)```", text, re.S).group(1)
    spec = spec_from_dict(yaml.safe_load(example), source="docs/workloads.md")
    assert spec.stage_names == ("read", "udf", "prefetch")


def test_variant_names_load_back():
    spec = load_workload("production", cpus=64, memory_limit_gb=48)
    assert spec.name == "production@cpus=64@mem=48"
    again = load_workload(spec.name)
    assert again.machine == spec.machine and again.stages == spec.stages
    assert load_workload("production@latency=0").consumer.model_latency_s == 0.0
    with pytest.raises(SpecError, match="unknown variant 'foo=1'"):
        load_workload("production@foo=1")
