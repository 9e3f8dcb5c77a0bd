"""``intune bench dataloader-resume-suite``: the swap, the private-key tests found by reading the code,
and a whole run on a small peer file written like torchdata's (one test passes, one fails on a
private key, one fails on behaviour), counted and reported."""

from __future__ import annotations

from pathlib import Path

import pytest

from intune.bench import dataloader_resume_suite as suite
from intune.cli import main

PEER = '''
import unittest
import torch
from torchdata.stateful_dataloader import Stateful, StatefulDataLoader


class TestResume(unittest.TestCase):
    def _keys(self, state):
        return state["_snapshot"]["_worker_snapshots"]

    def test_resume(self):
        dl = StatefulDataLoader(list(range(10)), batch_size=2, num_workers=0)
        it = iter(dl)
        first = [next(it) for _ in range(2)]
        state = dl.state_dict()
        rest = list(it)
        dl = StatefulDataLoader(list(range(10)), batch_size=2, num_workers=0)
        dl.load_state_dict(state)
        self.assertEqual([b.tolist() for b in first + list(dl)], [b.tolist() for b in first + rest])

    def test_layout(self):
        dl = StatefulDataLoader(list(range(10)), num_workers=0)
        self._keys(dl.state_dict())

    def test_wrong(self):
        self.assertIsInstance(StatefulDataLoader(list(range(4))), int)
'''


def test_the_swap_and_the_private_key_tests():
    text = suite.swapped(PEER, "off")
    assert "StatefulDataLoader(" not in text and "_Loader = functools.partial(intune.DataLoader, tune=None)" in text
    assert suite.private_key_tests(PEER) == {
        "TestResume::test_layout": ["_snapshot", "_worker_snapshots"],
        "TestResume::test_resume": ["_snapshot", "_worker_snapshots"],  # its class's helper reads them
        "TestResume::test_wrong": ["_snapshot", "_worker_snapshots"],
    }
    with pytest.raises(ValueError, match="does not import StatefulDataLoader"):
        suite.swapped("import torch\n", "on")


def test_a_run_counts_and_reports(tmp_path: Path):
    pytest.importorskip("torchdata")
    pytest.importorskip("pytest_timeout")
    peer = tmp_path / "peer.py"
    peer.write_text(PEER.replace("    def _keys(self, state):\n        return state[\"_snapshot\"][\"_worker_snapshots\"]\n", "")
                    .replace("self._keys(dl.state_dict())", 'dl.state_dict()["_snapshot"]'))
    md = tmp_path / "report.md"
    assert main(["bench", "dataloader-resume-suite", "--peer", str(peer), "--tune", "off", "--md", str(md),
                 "--source", "a test file"]) == 0
    text = md.read_text()
    assert "| off  | 3     | 1      | 2      | 0       | 1                    | 1" in text
    assert "TestResume::test_layout | _snapshot" in text and "TestResume::test_wrong" in text


def test_the_peer_file_must_stay_outside_the_tree():
    inside = Path(suite.__file__).resolve().parents[3] / "README.md"
    with pytest.raises(SystemExit, match="outside the tree"):
        main(["bench", "dataloader-resume-suite", "--peer", str(inside), "--tune", "off"])
