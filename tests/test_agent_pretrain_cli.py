"""`intune pretrain`'s arguments: a bad one is refused before any training starts."""

from __future__ import annotations

import argparse

import pytest

from intune.agent import pretrain as pretrain_module


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    pretrain_module.configure(parser)
    return parser.parse_args(list(argv))


def test_a_curve_path_that_is_not_a_png_is_refused_before_training(monkeypatch, tmp_path):
    def no_training(*args, **kwargs):
        raise AssertionError("pretraining started before --curve was checked")

    monkeypatch.setattr(pretrain_module, "pretrain", no_training)
    with pytest.raises(SystemExit, match=r"--curve .*\.png.*curve\.json"):
        pretrain_module.run(_args("--curve", str(tmp_path / "curve.json"), "--out", str(tmp_path / "w.pt")))


def test_a_png_curve_path_passes_the_check(monkeypatch, tmp_path):
    class Started(Exception):
        pass

    def training(*args, **kwargs):
        raise Started

    monkeypatch.setattr(pretrain_module, "pretrain", training)
    with pytest.raises(Started):
        pretrain_module.run(_args("--curve", str(tmp_path / "curve.PNG"), "--out", str(tmp_path / "w.pt")))
