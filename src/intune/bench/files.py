"""Which files an ``intune bench`` command line writes and which it reads.

The results committed under ``benchmarks/`` are what bench commands wrote, beside the weights those
commands read, and each Markdown report records the exact command that wrote it (its first line,
``md_report.render``). This module maps such a command line to its files, parsing it with the
command's own options as ``intune`` would (``cli.parse_args``), so that a check can tell every file
under ``benchmarks/`` from a stray one (``tests/test_benchmarks_tree.py``).

The rule the bench commands share: the files they write are named by ``--json``, ``--md`` and
``--plot`` (``OUTPUT_OPTIONS``), a folder of files by ``--history`` (``OUTPUT_FOLDERS``). A command that
writes or reads other files says which, beside its ``run``: ``written_files(args)`` and
``read_files(args)``, each a list of paths, from the same helpers the command itself uses (``bench sim``
its Figure 8 plot, ``bench agent`` its ablation networks). It must not run a command.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

OUTPUT_OPTIONS = ("json", "md", "plot")
"""Options whose value is a file the command writes, in every bench command that has them."""
OUTPUT_FOLDERS = ("history",)
"""Options whose value is a folder the command writes files under."""


@dataclass(frozen=True)
class CommandFiles:
    """A command line's files, as paths relative to where it ran (as given on the line)."""

    written: frozenset[Path]
    written_folders: frozenset[Path]
    read: frozenset[Path]


def command_files(argv: Sequence[str]) -> CommandFiles:
    """The files ``intune <argv>`` writes and reads, ``argv`` starting ``bench <command>``.

    Raises ``ValueError`` for a command line that is not a bench command's; a bad option exits as the
    command line itself would (``SystemExit`` with argparse's message)."""
    argv = list(argv)
    if argv[:1] != ["bench"]:
        raise ValueError(f"not an `intune bench` command line: intune {' '.join(argv)}")
    from intune.cli import parse_args

    args = parse_args(argv)
    if getattr(args, "_module", None) is None:
        raise ValueError(f"not an `intune bench` command line: intune {' '.join(argv)}")
    module = importlib.import_module(args._module)

    def paths(names: Sequence[str]) -> set[Path]:
        return {Path(value) for name in names if (value := getattr(args, name, None))}

    written = paths(OUTPUT_OPTIONS) | {Path(p) for p in getattr(module, "written_files", lambda a: [])(args)}
    read = {Path(p) for p in getattr(module, "read_files", lambda a: [])(args)}
    return CommandFiles(frozenset(written), frozenset(paths(OUTPUT_FOLDERS)), frozenset(read))


__all__ = ["OUTPUT_FOLDERS", "OUTPUT_OPTIONS", "CommandFiles", "command_files"]
