"""``intune bench dataloader-suite --peer PATH``: PyTorch's own DataLoader tests, run against intune.DataLoader.

The peer file is PyTorch's ``test/test_dataloader.py`` (from the repository whose version matches the
installed torch; it is not shipped here: give its path). The command runs it up to three times, each
in a fresh pytest process from a temporary folder:

- ``torch``: unchanged, the reference (what passes there is what intune must pass);
- ``off``: every ``DataLoader`` the file uses is ``intune.DataLoader`` with ``tune=None`` (a subclass
  that only changes that default, so ``DataLoader[...]`` and ``isinstance`` still hold), also in the
  code the file runs in subprocesses;
- ``on``: every ``DataLoader`` is ``intune.DataLoader`` itself (tuned by default).

``--reference PATH`` takes the ``torch`` run from the JSON an earlier ``--modes torch --json PATH`` wrote
(torch's outcomes do not depend on intune, and that run is the longest), checked to be of the same
peer file; the report names it. It is read after intune's runs, so both may run at once.

It reports the counts of each run and every test that passes with torch but not with intune, with the
first line of its failure and the private attributes of torch's it reads, which intune does not
mimic: the name in an ``AttributeError`` on a name starting with ``_``, and the names starting with
``_`` that the test's code (and the module-level functions it names, such as a subprocess's target)
reads as attributes and that neither the peer file nor ``intune.DataLoader`` and its iterator define
(``private_reads``, a static reading of the file). torch's test utilities
need the ``expecttest`` package (``pip install expecttest``, or ``--path`` to a folder holding it).
This module runs the file; it must not change intune's behaviour.
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
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from intune.bench import md_report
from intune.results import format_table, machine_info, write_json

MODES = ("torch", "off", "on")

_IMPORT = re.compile(r"^from torch\.utils\.data import \(\n(?:    \w+,\n)+\)\n", re.MULTILINE)
_SUBPROCESS_IMPORT = "from torch.utils.data import DataLoader, IterableDataset\n"
_PRIVATE = re.compile(r"has no attribute '(_\w+)'")

_DEFINE = {
    "on": "import intune\n\nDataLoader = intune.DataLoader\n",
    "off": (
        "import typing\n\nimport intune\n\n_T = typing.TypeVar('_T')\n\n\n"
        "class DataLoader(intune.DataLoader[_T]):\n"
        "    def __init__(self, *args, tune=None, **kwargs):\n"
        "        super().__init__(*args, tune=tune, **kwargs)\n"
    ),
}
_DEFINE_IN_SUBPROCESS = {
    "on": "from torch.utils.data import IterableDataset\nfrom intune import DataLoader\n",
    "off": (
        "from torch.utils.data import IterableDataset\nimport functools, intune\n"
        "DataLoader = functools.partial(intune.DataLoader, tune=None)\n"
    ),
}


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--peer", required=True, metavar="PATH", help="PyTorch's test/test_dataloader.py")
    parser.add_argument(
        "--modes", default=",".join(MODES), help=f"comma-separated runs among {', '.join(MODES)} (default: all)"
    )
    parser.add_argument("--timeout", type=int, default=150, help="seconds per test (pytest-timeout; default 150)")
    parser.add_argument("--path", action="append", default=[], metavar="DIR",
                        help="a folder added to the runs' PYTHONPATH (e.g. one holding expecttest); repeatable")
    parser.add_argument("-k", dest="select", default=None, help="only the tests pytest's -k selects")
    parser.add_argument("--reference", metavar="PATH",
                        help="the torch run from the JSON an earlier `--modes torch --json PATH` wrote (same peer file)")
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON to PATH")
    parser.add_argument("--md", metavar="PATH", help="write the report as Markdown, with command, date and machine")


def read_files(args: argparse.Namespace) -> list[str]:
    """The files the command reads that the tree holds (``--reference``; the peer file is kept outside)."""
    return [args.reference] if args.reference else []


def swap(text: str, mode: str) -> str:
    """The peer file with every ``DataLoader`` it uses made intune's (``mode`` "on" or "off")."""
    found = _IMPORT.search(text)
    if found is None or "    DataLoader,\n" not in found.group(0):
        raise ValueError("not PyTorch's test_dataloader.py: no 'from torch.utils.data import (... DataLoader, ...)'")
    block = found.group(0).replace("    DataLoader,\n", "")
    text = text[: found.start()] + block + _DEFINE[mode] + text[found.end() :]
    text = text.replace("torch.utils.data.DataLoader(", "DataLoader(")
    return text.replace(_SUBPROCESS_IMPORT, _DEFINE_IN_SUBPROCESS[mode])


def run_mode(peer: str, mode: str, folder: Path, timeout: int, paths: Sequence[str], select: str | None) -> dict[str, Any]:
    """Run the peer file (swapped for ``mode``) in a fresh pytest: each test's outcome and message."""
    name = f"test_dataloader_{mode}.py"
    text = Path(peer).read_text()
    (folder / name).write_text(text if mode == "torch" else swap(text, mode))
    junit = folder / f"{mode}.xml"
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", f"--timeout={timeout}",
               f"--junitxml={junit}", name]
    if select:
        command += ["-k", select]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([_intune_root(), *paths, *filter(None, [env.get("PYTHONPATH")])])
    started = time.monotonic()
    done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True)
    seconds = time.monotonic() - started
    if not junit.exists():
        tail = (done.stdout + done.stderr).strip().splitlines()[-15:]
        raise RuntimeError(f"pytest did not run the {mode} copy (exit {done.returncode}):\n" + "\n".join(tail))
    return {"mode": mode, "seconds": seconds, "exit": done.returncode, "tests": outcomes(junit)}


def _intune_root() -> str:
    """The folder intune is imported from here, first on the runs' path (so they test this intune)."""
    import intune

    return str(Path(intune.__file__).resolve().parents[1])


def outcomes(junit: Path) -> dict[str, dict[str, str]]:
    """``{"Class.test": {"outcome": passed|failed|error|skipped, "message": first line}}`` from a JUnit file."""
    tests: dict[str, dict[str, str]] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = f"{case.get('classname', '').rsplit('.', 1)[-1]}.{case.get('name')}"
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            found = case.find(tag)
            if found is not None:
                outcome = "failed" if tag == "failure" else tag
                message = (found.get("message") or found.text or "").strip().splitlines()[0:1]
                message = message[0] if message else ""
                break
        tests[name] = {"outcome": outcome, "message": message[:300]}
    return tests


def counts(tests: dict[str, dict[str, str]]) -> dict[str, int]:
    out = {"passed": 0, "failed": 0, "error": 0, "skipped": 0}
    for t in tests.values():
        out[t["outcome"]] += 1
    return out


def shortfalls(
    reference: dict[str, dict[str, str]], ours: dict[str, dict[str, str]], reads: dict[str, list[str]]
) -> list[dict[str, str]]:
    """Tests that pass with torch and not with intune, each with its message and the private attributes
    of torch's it reads (named by its failure, else by ``reads``, from ``private_reads``)."""
    rows = []
    for name, ref in reference.items():
        got = ours.get(name, {"outcome": "missing", "message": ""})
        if ref["outcome"] == "passed" and got["outcome"] != "passed":
            private = _PRIVATE.search(got["message"])
            named = [private.group(1)] if private else reads.get(name, [])
            rows.append({
                "test": name,
                "outcome": got["outcome"],
                "reads torch's private attribute": ", ".join(named),
                "message": got["message"],
            })
    return rows


def private_reads(text: str) -> dict[str, list[str]]:
    """``{"Class.test": [private attribute, ...]}``: the attributes starting with one ``_`` that each test
    reads (in its own body and in the module-level functions it names) and that neither the peer file
    defines (as a function, a class or a ``self`` attribute) nor intune's loader or its iterator has."""
    import intune
    from intune.dataloader.loader import _Batches

    tree = ast.parse(text)
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    defined = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    defined |= {  # the tests' own attributes (self._x = ...)
        t.attr
        for n in ast.walk(tree)
        if isinstance(n, ast.Assign)
        for t in n.targets
        if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"
    }
    ours = set(dir(intune.DataLoader)) | set(dir(_Batches))

    def reads(node: ast.AST, seen: set[str]) -> set[str]:
        found = set()
        for sub in ast.walk(node):
            if isinstance(sub, ast.Attribute) and sub.attr.startswith("_") and not sub.attr.startswith("__"):
                found.add(sub.attr)
            elif isinstance(sub, ast.Name) and sub.id in functions and sub.id not in seen:
                seen.add(sub.id)
                found |= reads(functions[sub.id], seen)
        return found

    def methods(cls: ast.ClassDef) -> dict[str, ast.FunctionDef]:
        out: dict[str, ast.FunctionDef] = {}
        for base in cls.bases:  # inherited tests first, overridden by the class's own
            if isinstance(base, ast.Name) and base.id in classes:
                out.update(methods(classes[base.id]))
        out.update({n.name: n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test")})
        return out

    result = {}
    for cls in classes.values():
        for name, method in methods(cls).items():
            private = sorted(a for a in reads(method, set()) - defined if a not in ours)
            if private:
                result[f"{cls.name}.{name}"] = private
    return result


def peer_digest(text: str) -> str:
    """The peer file's identity in a results file (its sha256), so a reference run is of the same file."""
    return hashlib.sha256(text.encode()).hexdigest()


def load_reference(path: str, digest: str) -> tuple[dict[str, Any], str]:
    """The ``torch`` run (its summary row plus ``tests``) from an earlier run's JSON, and when it ran.

    Raises ``ValueError`` naming the file when it holds no torch run or one of another peer file."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"--reference {path}: not a results file of `bench dataloader-suite` ({exc})") from None
    tests = data.get("tests", {}).get("torch") if isinstance(data, dict) else None
    row = next((r for r in data.get("results", []) if r.get("run") == "torch"), None) if tests else None
    if not tests or row is None:
        raise ValueError(f"--reference {path}: holds no torch run (write one with --modes torch --json {path})")
    if data.get("peer_sha256") != digest:
        raise ValueError(f"--reference {path}: its torch run is of another peer file (sha256 differs)")
    when = str(data.get("machine", {}).get("time_utc", "an earlier run"))
    return {"mode": "torch", "seconds": row.get("seconds", 0), "tests": tests}, when


def run(args: argparse.Namespace) -> int:
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        print(f"intune bench dataloader-suite: unknown mode(s) {unknown}; choose among {list(MODES)}", file=sys.stderr)
        return 2
    if not Path(args.peer).is_file():
        print(f"intune bench dataloader-suite: --peer {args.peer}: no such file", file=sys.stderr)
        return 2
    peer_text = Path(args.peer).read_text()
    digest = peer_digest(peer_text)
    if args.reference and "torch" in modes:
        print("intune bench dataloader-suite: --reference replaces the torch run; drop torch from --modes",
              file=sys.stderr)
        return 2
    results = []
    with tempfile.TemporaryDirectory(prefix="intune-dataloader-suite-") as folder:
        for mode in modes:
            got = run_mode(args.peer, mode, Path(folder), args.timeout, args.path, args.select)
            results.append(got)
            print(f"{mode}: {counts(got['tests'])} in {got['seconds']:.0f} s", flush=True)
    referenced = None
    if args.reference:  # read after the runs: the torch run it holds may be written meanwhile
        try:
            reference_run, when = load_reference(args.reference, digest)
        except ValueError as exc:
            print(f"intune bench dataloader-suite: {exc}", file=sys.stderr)
            return 2
        results.insert(0, reference_run)
        referenced = f"The `torch` run is the one `{args.reference}` holds (run {when})."
    summary = [{"run": r["mode"], **counts(r["tests"]), "seconds": round(r["seconds"])} for r in results]
    reference = next((r["tests"] for r in results if r["mode"] == "torch"), None)
    reads = private_reads(peer_text)
    short = {} if reference is None else {
        r["mode"]: shortfalls(reference, r["tests"], reads) for r in results if r["mode"] != "torch"
    }
    print(format_table(summary))
    for mode, rows in short.items():
        print(f"\npass with torch, not with intune ({mode}): {len(rows)}")
        if rows:
            print(format_table(rows, ["test", "outcome", "reads torch's private attribute"]))
    command = md_report.command_line(("bench", "dataloader-suite"))
    if args.json:
        write_json(args.json, summary, peer=os.path.basename(args.peer), peer_sha256=digest, shortfalls=short,
                   tests={r["mode"]: r["tests"] for r in results})
    if args.md:
        print(f"wrote {md_report.write(args.md, report(command, summary, short, args.timeout, referenced))}")
    return 0


def report(
    command: str,
    summary: list[dict[str, Any]],
    short: dict[str, list[dict[str, str]]],
    timeout: int,
    referenced: str | None = None,
) -> str:
    """The Markdown report: the runs' counts, then per intune run the tests torch passes and it does not."""
    context = [
        "PyTorch's own `test/test_dataloader.py`, run unchanged (`torch`) and with every `DataLoader` it uses made",
        "`intune.DataLoader` with `tune=None` (`off`) or tuned, its default (`on`); each run a fresh pytest process,",
        f"`--timeout {timeout}` per test. A test that reads one of torch's private attributes (a name starting",
        "with `_`, such as an iterator's `_workers`: named by its failure, or found in the test's code and the",
        "functions it names, defined neither by the test file nor by intune.DataLoader) has them in its column:",
        "intune does not mimic them.",
        *([referenced] if referenced else []),
        md_report.load_line(),
    ]
    columns = ["test", "outcome", "reads torch's private attribute", "message"]
    sections = [md_report.section("Counts", [], summary)]
    for mode, rows in short.items():
        private = sum(bool(r["reads torch's private attribute"]) for r in rows)
        text = [f"{len(rows)} tests, {private} of them reading a private attribute."]
        sections.append(md_report.section(f"Pass with torch, not with intune ({mode})", text, rows or None, columns))
    return md_report.render(command, machine_info(), context, sections)
