"""The seams between modules: one resume error, one serialiser of random generators, and the tuner's
needs as a protocol that the pipeline and the DataLoader's view of it satisfy."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

import intune
from intune.checkpoint import CheckpointError, ResumeError
from intune.rng import rng_from_state, rng_state
from intune.tunable import MovableKnobs, Tunable

SRC = Path(__file__).resolve().parents[1] / "src" / "intune"


def test_one_resume_error():
    from intune.dataloader import ResumeMismatchError
    from intune.pipeline.resume import ResumeError as PipelineResumeError

    assert ResumeMismatchError is ResumeError is PipelineResumeError
    assert issubclass(ResumeError, CheckpointError) and issubclass(ResumeError, ValueError)


def test_the_tuner_refuses_another_pipelines_state_with_the_resume_error():
    from intune.tuner import tune

    chunks = [{"id": np.arange(10)}]
    with tune(intune.Pipeline.from_iterable(chunks).batch(5), "none") as tuner:
        state = tuner.state_dict()
    other = intune.Pipeline.from_iterable(chunks).map(lambda c: c, name="udf").batch(5)
    with tune(other, "none") as tuner, pytest.raises(ResumeError, match="udf.workers"):
        tuner.load_state_dict(state)


def test_a_generator_round_trips_and_draws_on_alike():
    rng = np.random.default_rng([7, 3])
    rng.random(5)
    rng.integers(0, 10, 3, dtype=np.uint32)  # leaves a buffered 32-bit half (has_uint32)
    state = rng_state(rng)
    assert state["bit_generator"] == "PCG64" and isinstance(state["state"], str)
    again = rng_from_state(state, "test")
    assert np.array_equal(rng.integers(0, 2**31, 20, dtype=np.uint32), again.integers(0, 2**31, 20, dtype=np.uint32))
    assert np.array_equal(rng.permutation(50), again.permutation(50))


@pytest.mark.parametrize(
    "edit, field",
    [
        (lambda s: s.update(bit_generator="MT19937"), "g.bit_generator"),
        (lambda s: s.update(state="-1"), "g.state"),
        (lambda s: s.update(state=str(2**128)), "g.state"),
        (lambda s: s.update(inc="4"), "g.inc: 4 is even"),
        (lambda s: s.update(has_uint32=2), "g.has_uint32"),
        (lambda s: s.update(uinteger=2**32), "g.uinteger"),
        (lambda s: s.update(uinteger="１"), "g.uinteger"),  # a digit, but not an ASCII one
        (lambda s: s.pop("inc"), "lacks ['inc']"),
    ],
)
def test_a_generator_state_is_bounded_field_by_field(edit, field):
    state = rng_state(np.random.default_rng(1))
    edit(state)
    with pytest.raises(CheckpointError, match=None) as info:
        rng_from_state(state, "g")
    assert field in str(info.value)


def test_no_module_but_intune_rng_serialises_a_numpy_generator():
    """Reading or setting ``bit_generator.state`` is the serialiser's business alone."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        if path.name == "rng.py" and path.parent == SRC:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "state" and isinstance(node.value, ast.Attribute) and node.value.attr == "bit_generator":
                found.append(str(path.relative_to(SRC)))
    assert found == []


def test_a_pipeline_and_the_dataloaders_view_are_tunable():
    pipe = intune.Pipeline.from_iterable([{"id": np.arange(10)}]).map(lambda c: c, name="udf").batch(5)
    view = MovableKnobs(pipe)
    assert isinstance(pipe, Tunable) and isinstance(view, Tunable)
    assert "read.workers" in pipe.knobs and "read.workers" not in view.knobs  # a stream's one reader is fixed
    assert "udf.workers" in view.knobs
    assert view.remote_cpus() == 0.0 and view.shard is None and not view.closed
    assert sum(len(b["id"]) for b in view) == 10
    view.close()
    assert pipe.closed and view.closed
