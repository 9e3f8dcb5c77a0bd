"""The package layering: benchmarks sit on top and nothing below imports them; the policies do not
import the agent (the registry names it as a string and imports it when asked); the observation
package reads no policy, agent, simulator or benchmark.

Every import in every module is checked, those inside functions included: a lazy import is still a
dependency."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"


def _modules() -> dict[str, Path]:
    """Every module under src/intune by dotted name (a package by its ``__init__``'s name)."""
    out: dict[str, Path] = {}
    for path in sorted((SRC / "intune").rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imported_modules(path: Path, module: str) -> set[str]:
    """The dotted names ``path`` imports, at any depth; ``from X import Y`` counts as ``X`` and ``X.Y``
    (Y may be a submodule)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def offending(importer_packages: tuple[str, ...], forbidden: tuple[str, ...], exempt: tuple[str, ...] = ()) -> list[str]:
    """``module -> imported`` for each module inside ``importer_packages`` (and not in ``exempt``) that
    imports something inside ``forbidden``."""
    found = []
    for module, path in _modules().items():
        if not any(_within(module, p) for p in importer_packages) or any(_within(module, p) for p in exempt):
            continue
        for name in sorted(imported_modules(path, module)):
            if any(_within(name, f) for f in forbidden):
                found.append(f"{module} -> {name}")
    return found


def test_nothing_below_the_benchmarks_imports_them() -> None:
    assert offending(("intune",), ("intune.bench",), exempt=("intune.bench", "intune.cli")) == []


def test_the_policies_do_not_import_the_agent() -> None:
    assert offending(("intune.policies",), ("intune.agent",)) == []


def test_the_observation_package_reads_no_policy_agent_simulator_or_benchmark() -> None:
    forbidden = ("intune.policies", "intune.agent", "intune.sim", "intune.bench", "intune.tuner")
    assert offending(("intune.monitor",), forbidden) == []


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from intune.bench.results import x", {"intune.bench.results", "intune.bench.results.x"}),
        ("def f():\n    from intune import bench\n", {"intune", "intune.bench"}),
        ("from ..bench import results", {"intune.bench", "intune.bench.results"}),
    ],
)
def test_imports_are_found_at_any_depth_and_relative(tmp_path: Path, source: str, expected: set[str]) -> None:
    path = tmp_path / "mod.py"
    path.write_text(source)
    assert imported_modules(path, "intune.sim.mod") == expected
