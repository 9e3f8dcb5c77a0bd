"""The ``intune`` command line: a thin dispatcher over commands that live beside what they run.

Each command is a module exposing ``configure(parser)`` and ``run(args) -> int``; this file owns only
the command tree, so adding a command is one line here and one module there.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# (command path, module, one-line help)
COMMANDS: list[tuple[tuple[str, ...], str, str]] = [
    (("demo",), "intune.dlrm.demo", "generate a small data set and train DLRM through a tuned pipeline"),
    (("bench", "engine"), "intune.bench.engine", "engine overhead, parallel speed-up, transport, resize, memory"),
    (("bench", "sim"), "intune.bench.sim", "every policy on every simulated workload over the resize schedule"),
    (("bench", "agent"), "intune.bench.agent", "the agent against every policy on shipped and held-out simulated workloads"),
    (("bench", "tune"), "intune.bench.tune_live", "the agent on the real engine: convergence, CPU resize, memory limit"),
    (("bench", "real"), "intune.bench.real", "DLRM preprocessing: intune vs tf.data AUTOTUNE vs PyTorch DataLoader"),
    (("bench", "recd"), "intune.bench.recd", "RecD deduplication: storage, preprocessing, training ratios"),
    (("bench", "hammock"), "intune.bench.hammock", "Hammock vs gradient-boosted trees and baselines"),
    (("bench", "dataloader"), "intune.bench.dataloader", "intune.DataLoader vs torch's DataLoader on a per-row dataset"),
    (("bench", "dataloader-resume-suite"), "intune.bench.dataloader_resume_suite", "torchdata's StatefulDataLoader resume tests run against intune.DataLoader"),
    (("bench", "dataloader-suite"), "intune.bench.dataloader_suite", "PyTorch's own DataLoader tests run against intune.DataLoader"),
    (("bench", "resume"), "intune.bench.resume", "checkpoint size and time, resume to the first batch, rows/s after a resume"),
    (("bench", "fidelity"), "intune.bench.fidelity", "the simulator's Observation against the engine's, field by field"),
    (("bench", "scale"), "intune.bench.scale", "remote workers sized by every policy: simulated pools up to 64 nodes, a real Ray cluster"),
    (("pretrain",), "intune.agent.pretrain", "pretrain the agent's network in the simulator"),
    (("sim", "calibrate"), "intune.sim.calibrate", "fit the simulator to the real engine and check its predictions"),
    (("data", "generate"), "intune.dlrm.datagen_cli", "generate Criteo-format data (Parquet or TSV)"),
    (("data", "convert"), "intune.dlrm.convert_cli", "convert Criteo TSV files to Parquet"),
    (("report",), "intune.history", "plot a tuner history (JSON lines) to PNG"),
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="intune", description="Input-pipeline optimizer for recommendation-model training."
    )
    groups: dict[tuple[str, ...], argparse._SubParsersAction] = {(): parser.add_subparsers(dest="command")}
    parsers: dict[tuple[str, ...], argparse.ArgumentParser] = {}
    for path, module, help_text in COMMANDS:
        for depth in range(1, len(path)):
            prefix = path[:depth]
            if prefix not in parsers:
                sub = groups[prefix[:-1]].add_parser(prefix[-1], help=f"{prefix[-1]} commands")
                parsers[prefix] = sub
                groups[prefix] = sub.add_subparsers(dest=f"command_{depth}")
        leaf = groups[path[:-1]].add_parser(path[-1], help=help_text, description=help_text)
        leaf.set_defaults(_module=module, _path=path)
        parsers[path] = leaf
    return parser


def _configure(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.Namespace:
    """Parse once to find the command, let its module add its options, then parse for real."""
    # the first parse only finds the command: without -h, so that help lists the command's own options
    known, _ = parser.parse_known_args([a for a in argv if a not in ("-h", "--help")])
    module_name = getattr(known, "_module", None)
    if module_name is None:
        return known
    # find the leaf parser again and let the module configure it
    sub = parser
    for name in known._path:
        action = next(a for a in sub._actions if isinstance(a, argparse._SubParsersAction))
        sub = action.choices[name]
    module = importlib.import_module(module_name)
    module.configure(sub)
    return parser.parse_args(argv)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """``argv`` (the arguments after ``intune``) parsed as ``main`` parses them, its command's options
    included, without running it: ``_module`` names the command's module."""
    return _configure(build_parser(), list(argv))


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = _configure(parser, argv)
    if getattr(args, "_module", None) is None:
        parser.print_help()
        return 0 if not argv else 2
    module = importlib.import_module(args._module)
    try:
        return int(module.run(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
