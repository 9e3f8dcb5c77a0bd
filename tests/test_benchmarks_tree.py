"""``benchmarks/`` holds only what ``intune bench`` commands wrote and the files they read.

Each Markdown report there records the command line that wrote it (its first line); that command's own
options say which files it writes and reads (``intune.bench.files``). A report counts only where its
command writes that very report, so a report moved or copied by hand vouches for nothing. Every other
file must be one such a command wrote or reads: experiments live in git history and
``docs/experiments.md``, not in the tree.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from intune.bench.files import command_files
from intune.bench.md_report import recorded_command

ROOT = Path(__file__).resolve().parents[1]


def _accounted(root: Path) -> tuple[set[Path], set[Path], set[Path]]:
    """(files written, folders written, files read) by the commands the reports under ``root/benchmarks``
    record, resolved against ``root`` (where the commands ran)."""
    written: set[Path] = set()
    folders: set[Path] = set()
    read: set[Path] = set()
    for report in sorted((root / "benchmarks").rglob("*.md")):
        argv = recorded_command(report.read_text())
        if argv is None or argv[:1] != ["bench"]:
            continue
        files = command_files(argv)
        if report.resolve() not in {(root / p).resolve() for p in files.written}:
            continue  # not where its command wrote it
        written |= {(root / p).resolve() for p in files.written}
        folders |= {(root / p).resolve() for p in files.written_folders}
        read |= {(root / p).resolve() for p in files.read}
    return written, folders, read


def unaccounted(root: Path) -> list[str]:
    """Files under ``root/benchmarks`` that no recorded bench command wrote or reads, relative to root."""
    written, folders, read = _accounted(root)
    stray = []
    for path in sorted(p for p in (root / "benchmarks").rglob("*") if p.is_file()):
        resolved = path.resolve()
        if resolved in written or resolved in read or any(f in resolved.parents for f in folders):
            continue
        stray.append(str(path.relative_to(root)))
    return stray


def test_every_file_under_benchmarks_is_written_or_read_by_a_recorded_bench_command() -> None:
    assert unaccounted(ROOT) == []


def test_every_file_a_recorded_command_reads_is_in_the_tree() -> None:
    _, _, read = _accounted(ROOT)
    assert sorted(str(p.relative_to(ROOT)) for p in read if not p.exists()) == []


def _report(root: Path, name: str, command: str) -> None:
    path = root / "benchmarks" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"# `{command}`\n\nDate: ...\n")


def test_a_stray_file_or_a_moved_report_is_found(tmp_path: Path) -> None:
    bench = tmp_path / "benchmarks"
    _report(tmp_path, "engine.md", "intune bench engine --json benchmarks/engine.json --md benchmarks/engine.md")
    _report(
        tmp_path,
        "agent.md",
        "intune bench agent --ablation pm1=benchmarks/pm1.pt --json benchmarks/agent.json --md benchmarks/agent.md",
    )
    _report(tmp_path, "sim.md", "intune bench sim --plot benchmarks/sim.png --md benchmarks/sim.md")
    # a report moved into an experiment's folder: its command wrote benchmarks/scale.md, not this one
    _report(tmp_path, "exp/scale.md", "intune bench scale --json benchmarks/scale.json --md benchmarks/scale.md")
    for name in ("engine.json", "agent.json", "pm1.pt", "sim.png", "sim-fig8.png", "scale.json", "notes.txt"):
        (bench / name).write_text("{}")
    (bench / "exp" / "run.log").write_text("a scratch log")
    assert unaccounted(tmp_path) == [
        "benchmarks/exp/run.log",
        "benchmarks/exp/scale.md",
        "benchmarks/notes.txt",
        "benchmarks/scale.json",
    ]


@pytest.mark.parametrize(
    ("argv", "written", "folders", "read"),
    [
        (["bench", "engine", "--json", "e.json", "--md", "e.md"], {"e.json", "e.md"}, set(), set()),
        (["bench", "sim", "--plot", "out/s.png"], {"out/s.png", "out/s-fig8.png"}, set(), set()),
        (["bench", "sim", "--plot", "s.png", "--no-fig8"], {"s.png"}, set(), set()),
        (["bench", "agent", "--ablation", "a=w/a.pt", "--ablation", "b=b.pt"], set(), set(), {"w/a.pt", "b.pt"}),
        (["bench", "tune", "--history", "h", "--md", "t.md"], {"t.md"}, {"h"}, set()),
        (["bench", "real", "--plot", "r.png"], {"r.png"}, set(), set()),
    ],
)
def test_command_files_follow_each_commands_options(argv, written, folders, read) -> None:
    files = command_files(argv)
    assert files.written == {Path(p) for p in written}
    assert files.written_folders == {Path(p) for p in folders}
    assert files.read == {Path(p) for p in read}


def test_command_files_refuse_what_is_not_a_bench_command() -> None:
    with pytest.raises(ValueError, match="not an `intune bench` command line"):
        command_files(["demo", "--seconds", "1"])
    with pytest.raises(ValueError, match="not an `intune bench` command line"):
        command_files(["bench"])


def test_recorded_command_reads_the_reports_first_line() -> None:
    assert recorded_command("# `intune bench engine --md 'a b.md'`\n\nDate") == ["bench", "engine", "--md", "a b.md"]
    assert recorded_command("# `intune bench engine (called from Python; options not recorded)`\n") is None
    assert recorded_command("# Candidates\n") is None
