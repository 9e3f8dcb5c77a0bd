"""``intune bench dataloader-suite``: a peer test file is run unchanged and with intune.DataLoader swapped
in, and the report names each test torch passes and intune does not, with the private attribute it read."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from intune import cli
from intune.bench.dataloader_suite import private_reads, swap

pytestmark = pytest.mark.timeout(300)

PEER = textwrap.dedent(
    '''
    import unittest

    import torch
    from torch.utils.data import (
        DataLoader,
        Dataset,
    )


    class Rows(Dataset):
        def __len__(self):
            return 6

        def __getitem__(self, i):
            return i


    class TestSmall(unittest.TestCase):
        def test_batches(self):
            loader = DataLoader(Rows(), batch_size=2, num_workers=0)
            self.assertEqual([b.tolist() for b in loader], [[0, 1], [2, 3], [4, 5]])
            self.assertIsInstance(loader, torch.utils.data.DataLoader)

        def test_private(self):
            self.assertFalse(DataLoader(Rows(), batch_size=None, num_workers=0)._auto_collation)

        def test_typing(self):
            def f() -> DataLoader[list[torch.Tensor]]:
                pass

        @unittest.skip("never")
        def test_skipped(self):
            pass
    '''
)


def test_swap_makes_every_dataloader_intunes_and_refuses_another_file() -> None:
    text = swap(PEER, "off")
    assert "    DataLoader,\n" not in text and "class DataLoader(intune.DataLoader[_T])" in text
    assert "tune=None" in text
    with pytest.raises(ValueError, match="not PyTorch's test_dataloader.py"):
        swap("import torch\n", "on")


def test_private_reads_names_the_attributes_a_test_reads_that_intune_does_not_define() -> None:
    peer = PEER + textwrap.dedent(
        '''
        def _target():
            it = iter(DataLoader(Rows(), num_workers=2))
            return [w.pid for w in it._workers]


        class TestMore(TestSmall):
            def setUp(self):
                self._own = 1

            def test_subprocess(self):
                _target()
                return self._own, DataLoader(Rows()).__len__()
        '''
    )
    reads = private_reads(peer)
    assert reads["TestSmall.test_private"] == ["_auto_collation"]
    assert reads["TestMore.test_private"] == ["_auto_collation"], "inherited tests are read too"
    assert reads["TestMore.test_subprocess"] == ["_workers"], "through the function it names; not self._own"
    assert "TestSmall.test_batches" not in reads


def test_the_report_names_what_passes_with_torch_only(tmp_path: Path) -> None:
    peer = tmp_path / "peer.py"
    peer.write_text(PEER)
    md, js = tmp_path / "suite.md", tmp_path / "suite.json"
    code = cli.main(["bench", "dataloader-suite", "--peer", str(peer), "--modes", "torch,off",
                     "--md", str(md), "--json", str(js)])
    assert code == 0
    data = json.loads(js.read_text())
    counts = {r["run"]: r for r in data["results"]}
    assert (counts["torch"]["passed"], counts["torch"]["skipped"]) == (3, 1)
    # intune's loader is no torch DataLoader subclass and has no _auto_collation: both named
    assert counts["off"]["passed"] == 1 and counts["off"]["failed"] == 2
    short = {r["test"]: r for r in data["shortfalls"]["off"]}
    assert set(short) == {"TestSmall.test_batches", "TestSmall.test_private"}
    assert short["TestSmall.test_private"]["reads torch's private attribute"] == "_auto_collation"
    assert short["TestSmall.test_batches"]["reads torch's private attribute"] == ""
    text = md.read_text()
    assert "Pass with torch, not with intune (off)" in text and "_auto_collation" in text


def test_a_reference_torch_run_stands_in_for_the_torch_mode_and_must_be_of_the_same_file(tmp_path: Path) -> None:
    peer = tmp_path / "peer.py"
    peer.write_text(PEER)
    ref = tmp_path / "torch.json"
    assert cli.main(["bench", "dataloader-suite", "--peer", str(peer), "--modes", "torch", "--json", str(ref)]) == 0
    md, js = tmp_path / "suite.md", tmp_path / "suite.json"
    argv = ["bench", "dataloader-suite", "--peer", str(peer), "--modes", "off", "--reference", str(ref)]
    assert cli.main([*argv, "--md", str(md), "--json", str(js)]) == 0
    data = json.loads(js.read_text())
    assert [r["run"] for r in data["results"]] == ["torch", "off"]
    assert {r["test"] for r in data["shortfalls"]["off"]} == {"TestSmall.test_batches", "TestSmall.test_private"}
    assert f"The `torch` run is the one `{ref}` holds" in md.read_text()
    # the reference replaces the torch mode, and must hold a run of this very peer file
    assert cli.main([*argv[:5], "torch,off", *argv[6:]]) == 2
    peer.write_text(PEER + "\n# another file\n")
    assert cli.main(argv) == 2
    assert cli.main([*argv[:-1], str(js.with_name("missing.json"))]) == 2
