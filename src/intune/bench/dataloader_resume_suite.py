"""``intune bench dataloader-resume-suite``: torchdata's own resume tests, run against ``intune.DataLoader``.

torchdata's ``test/stateful_dataloader/test_state_dict.py`` (given with ``--peer``; it stays outside
this repository) is copied into a temporary folder with every ``StatefulDataLoader`` made
``intune.DataLoader`` (tuned as by default, or with ``tune=None``), run with pytest in a child process,
and each test's outcome recorded (a test with subtests fails when any of them fails). The report
counts the tests that pass and names every failure with its first error line; the failures of tests
that read torchdata's private state keys (``_snapshot``, ``fetcher_state``, ...: the layout of its own
state, not behaviour) are listed apart, found by reading each test's code (its own and its class's
helpers). Needs pytest, pytest-timeout, torchdata and the test file's imports (``parameterized``,
``expecttest``; ``--extra-path`` adds a folder that holds them). This module must not change the loader.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from intune.bench import md_report
from intune.results import machine_info, write_json

PRIVATE_KEYS = frozenset(
    {"_snapshot", "_worker_snapshots", "_main_snapshot", "fetcher_state", "dataset_state", "dataset_iter_state",
     "fetcher_ended"}
)
"""Keys of torchdata's own state layout: a test that reads them checks torchdata, not resume behaviour."""

MODES = {"off": "functools.partial(intune.DataLoader, tune=None)", "on": "intune.DataLoader"}

_RECORDER = '''
import json, os
_OUT = {}
def pytest_runtest_logreport(report):
    if report.when == "call" or report.failed or report.skipped:
        entry = _OUT.setdefault(report.nodeid, {"outcome": "passed", "error": ""})
        if report.failed:
            if entry["outcome"] != "failed":
                lines = [l for l in str(report.longrepr).splitlines() if l.startswith("E ")]
                entry["error"] = (lines[0][2:].strip() if lines else str(report.longrepr).splitlines()[-1])[:300]
            entry["outcome"] = "failed"
        elif report.skipped and entry["outcome"] == "passed":
            entry["outcome"] = "skipped"
def pytest_sessionfinish(session, exitstatus):
    with open(os.environ["INTUNE_SUITE_OUT"], "w") as f:
        json.dump(_OUT, f)
'''


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--peer", required=True, metavar="PATH",
                        help="torchdata's test/stateful_dataloader/test_state_dict.py (kept outside the tree)")
    parser.add_argument("--source", default="", help="where the peer file comes from (repository@commit), for the report")
    parser.add_argument("--tune", choices=("both", "on", "off"), default="both", help="run tuned, untuned, or both")
    parser.add_argument("--timeout", type=int, default=150, help="seconds a test may take (pytest-timeout)")
    parser.add_argument("--extra-path", action="append", default=[], metavar="DIR",
                        help="a folder added to the child's PYTHONPATH (for parameterized, expecttest)")
    parser.add_argument("--md", metavar="PATH", default="benchmarks/dataloader-resume-suite.md", help="the report")
    parser.add_argument("--json", metavar="PATH", help="also write the outcomes as JSON")


def swapped(text: str, mode: str) -> str:
    """The test file with torchdata's loader made ``intune.DataLoader`` (``mode``: tuning on or off)."""
    original = "from torchdata.stateful_dataloader import Stateful, StatefulDataLoader"
    if original not in text:
        raise ValueError(f"the peer file does not import StatefulDataLoader as expected ({original!r})")
    header = f"from torchdata.stateful_dataloader import Stateful\nimport functools\nimport intune\n_Loader = {MODES[mode]}\n"
    return re.sub(r"\bStatefulDataLoader\b", "_Loader", text.replace(original, header))


def private_key_tests(text: str) -> dict[str, list[str]]:
    """``Class::test`` -> the private keys it reads (in its own code or its class's helper methods)."""
    found: dict[str, list[str]] = {}
    for node in ast.parse(text).body:
        if not isinstance(node, ast.ClassDef):
            continue
        methods = [m for m in node.body if isinstance(m, ast.FunctionDef)]
        helpers = set().union(*[_keys(m) for m in methods if not m.name.startswith("test")])
        for method in methods:
            if method.name.startswith("test"):
                keys = _keys(method) | helpers
                if keys:
                    found[f"{node.name}::{method.name}"] = sorted(keys)
    return found


def _keys(node: ast.AST) -> set[str]:
    return {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and n.value in PRIVATE_KEYS}


def run_suite(peer_text: str, mode: str, timeout_s: int, extra_path: Sequence[str]) -> tuple[dict[str, Any], float]:
    """Each test's outcome (``nodeid`` -> ``{"outcome", "error"}``) and the run's seconds."""
    src = Path(__file__).resolve().parents[2]
    with tempfile.TemporaryDirectory(prefix="intune-resume-suite-") as folder:
        test = Path(folder) / f"test_state_dict_intune_{mode}.py"
        test.write_text(swapped(peer_text, mode))
        (Path(folder) / "conftest.py").write_text(_RECORDER)
        out = Path(folder) / "outcomes.json"
        env = dict(os.environ, INTUNE_SUITE_OUT=str(out), PYTHONPATH=os.pathsep.join([str(src), *extra_path]))
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--timeout={timeout_s}",
                   "--rootdir", folder, str(test)]
        t0 = time.monotonic()
        done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, check=False)
        seconds = time.monotonic() - t0
        if not out.exists():
            raise RuntimeError(f"the suite did not run (exit {done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        outcomes = json.loads(out.read_text())
    for outcome in outcomes.values():  # an exception's repr keeps torch's long hint after an escaped newline
        outcome["error"] = outcome["error"].split("\\n")[0].rstrip("'")
    return {node.split("::", 1)[1]: v for node, v in outcomes.items()}, seconds


def run(args: argparse.Namespace) -> int:
    peer = Path(args.peer).resolve()
    repo = Path(__file__).resolve().parents[3]
    if peer.is_relative_to(repo):
        raise SystemExit(f"--peer {peer} is inside this repository: keep torchdata's file outside the tree")
    text = peer.read_text()
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    private = private_key_tests(text)
    modes = ["off", "on"] if args.tune == "both" else [args.tune]
    results: list[dict[str, Any]] = []
    for mode in modes:
        outcomes, seconds = run_suite(text, mode, args.timeout, args.extra_path)
        counts = {k: sum(v["outcome"] == k for v in outcomes.values()) for k in ("passed", "failed", "skipped")}
        print(f"tune {mode}: {counts['passed']} of {len(outcomes)} passed, {counts['failed']} failed "
              f"({seconds:.0f} s)")
        results.append({"tune": mode, "tests": len(outcomes), **counts, "seconds": round(seconds, 1),
                        "outcomes": outcomes})
    versions = _versions()
    command = md_report.command_line(("bench", "dataloader-resume-suite"))
    context = [
        f"torchdata's `test_state_dict.py` ({args.source or 'source not given'}; sha256 {digest}...), every "
        "`StatefulDataLoader` made `intune.DataLoader` (tune on: the default policy; off: `tune=None`), run with "
        f"pytest and a {args.timeout} s timeout per test; a test with subtests fails when any subtest fails. "
        f"{versions}. {md_report.load_line()}",
        f"Tests that read torchdata's private state keys ({', '.join(f'`{k}`' for k in sorted(PRIVATE_KEYS))}): "
        f"{len(private)}, found in the file's code; they check torchdata's state layout, not resume behaviour.",
    ]
    sections = [md_report.section("Counts", rows=[
        {"tune": r["tune"], "tests": r["tests"], "passed": r["passed"], "failed": r["failed"], "skipped": r["skipped"],
         "failed, private keys": sum(o["outcome"] == "failed" and t in private for t, o in r["outcomes"].items()),
         "failed, other": sum(o["outcome"] == "failed" and t not in private for t, o in r["outcomes"].items()),
         "seconds": r["seconds"]} for r in results])]
    for r in results:
        rows = [{"test": t, "private keys read": ", ".join(private.get(t, [])) or "-", "first error": o["error"]}
                for t, o in sorted(r["outcomes"].items()) if o["outcome"] == "failed"]
        sections.append(md_report.section(f"Failures, tune {r['tune']}", rows=rows or None,
                                          text=() if rows else ["None."]))
    path = md_report.write(args.md, md_report.render(command, machine_info(), context, sections))
    print(f"wrote {path}")
    if args.json:
        write_json(args.json, results)
    return 0


def _versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    parts = []
    for name in ("torch", "torchdata", "pytest"):
        try:
            parts.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            parts.append(f"{name} not installed")
    return ", ".join(parts)
