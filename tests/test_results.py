"""Results files: ``{"machine", "results", **extra}`` as ``write_json`` writes them, one result a line."""

from __future__ import annotations

import json

import numpy as np

from intune.results import write_json


def test_write_json_round_trips_with_one_result_a_line(tmp_path) -> None:
    rows = [{"policy": "intune", "ratio": np.float64(0.25), "ticks": [1, None]}, {"policy": "steer", "ratio": 1 / 3}]
    path = write_json(tmp_path / "sub" / "r.json", rows, settings={"seed": np.int64(7)}, notes=[])
    payload = json.loads(path.read_text())
    assert payload["results"] == [{"policy": "intune", "ratio": 0.25, "ticks": [1, None]}, {"policy": "steer", "ratio": 0.333333}]
    assert payload["settings"] == {"seed": 7} and payload["notes"] == [] and "usable_cpus" in payload["machine"]
    lines = path.read_text().splitlines()
    assert [json.loads(line.rstrip(",")) for line in lines[3:5]] == payload["results"]  # a result a line
    assert lines[2] == '"results":[' and lines[5] == "],"


def test_write_json_with_no_results(tmp_path) -> None:
    path = write_json(tmp_path / "r.json", [])
    assert json.loads(path.read_text())["results"] == []


def test_results_files_keep_six_significant_digits_and_every_other_value() -> None:
    import json

    import numpy as np

    from intune.results import dumps_results

    text = dumps_results({"machine": {"cpus": 2.0}, "results": [
        {"rate": 123456.789, "share": np.float64(0.123456789), "xs": np.arange(3) / 3, "n": 7, "ok": True,
         "none": None, "nested": {"t": [1.0000001, 2]}},
    ]})
    row = json.loads(text)["results"][0]
    assert row == {"rate": 123457.0, "share": 0.123457, "xs": [0.0, 0.333333, 0.666667], "n": 7, "ok": True,
                   "none": None, "nested": {"t": [1.0, 2]}}
    assert isinstance(row["n"], int) and isinstance(row["nested"]["t"][1], int)


def test_a_saved_figure_is_a_palette_png_whose_lines_keep_their_colours(tmp_path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from PIL import Image

    from intune.results import save_figure

    fig, ax = plt.subplots(figsize=(4, 3))
    ax.plot([0, 1], [0, 1], color="#d62728", lw=6)
    ax.plot([0, 1], [1, 0], color="#1f77b4", lw=6)
    out = save_figure(fig, tmp_path / "sub" / "f.png", dpi=50)
    image = Image.open(out)
    assert image.mode == "P"
    assert image.size == (200, 150)
    colours = {c for _, c in image.convert("RGB").getcolors(maxcolors=4096)}
    assert (0xD6, 0x27, 0x28) in colours and (0x1F, 0x77, 0xB4) in colours
