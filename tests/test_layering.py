"""The package layering: benchmarks sit on top and nothing below imports them; the policies do not
import the agent (the registry names it as a string and imports it when asked); the observation
package reads no policy, agent, simulator or benchmark; no import circle inside the engine
(``pipeline/``), nor between the DataLoader and the tuner.

Every import in every module is checked, those inside functions and under ``TYPE_CHECKING`` included: a
lazy import is still a dependency, and a type-only one still ties two modules together for a reader."""

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


def import_graph() -> dict[str, set[str]]:
    """Each module's imports of other modules of intune: ``from X import Y`` is an edge to ``X.Y`` when
    that is a module, else to ``X`` (a package's ``__init__`` is only an edge when it is named itself)."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                edges.update(_longest_module(alias.name, modules) for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join([*anchor, base] if base else anchor)
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    edges.add(sub if sub in modules else _longest_module(base, modules))
        graph[module] = {e for e in edges if e and e != module}
    return graph


def _longest_module(name: str, modules: dict[str, Path]) -> str:
    """The longest prefix of dotted ``name`` that is a module of intune ('' for another package's)."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in modules:
            return ".".join(parts[:n])
    return ""


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (each holds an import circle), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []
    for root in sorted(graph):  # Tarjan's algorithm, iteratively (no recursion limit)
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            step = next((e for e in edges if e in graph), None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(sorted(graph[step]))))
                elif step in on_stack:
                    low[node] = min(low[node], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    group.append(top)
                    if top == node:
                        break
                if len(group) > 1:
                    groups.append(sorted(group))
    return sorted(groups)


def test_no_import_circle_inside_the_engine() -> None:
    """Inside ``pipeline/`` (its ``__init__`` included) no module reaches itself through imports."""
    graph = import_graph()
    engine = {m: {e for e in edges if _within(e, "intune.pipeline")} for m, edges in graph.items() if _within(m, "intune.pipeline")}
    assert import_cycles(engine) == []


def test_no_import_circle_between_the_dataloader_and_the_tuner() -> None:
    """The DataLoader builds a tuner; the tuner must not need the DataLoader back (its protocol is
    ``intune.tunable``, its error ``intune.checkpoint.ResumeError``)."""
    circles = [c for c in import_cycles(import_graph()) if "intune.tuner" in c]
    assert circles == [], f"import circles through the tuner: {circles}"


def test_a_circle_is_found() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}}
    assert import_cycles(graph) == [["a", "b", "c"]]


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
