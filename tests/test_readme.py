"""The README's Python examples run as written (the pipeline one on a small generated data set)."""

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def _example(marker: str) -> str:
    blocks = [b for b in re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S) if marker in b]
    assert blocks, f"the README has no Python example with {marker}"
    return blocks[0]


def test_readme_dataloader_example_runs(tmp_path):
    code = _example("intune.DataLoader(") + "\nassert rows == 10_000, rows\nprint('ROWS', rows)\n"
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ROWS 10000" in done.stdout


def test_readme_example_runs(tmp_path):
    generate = [sys.executable, "-m", "intune.cli", "data", "generate", "--rows", "20000", "--out", "data/criteo"]
    subprocess.run(generate, cwd=tmp_path, check=True, capture_output=True, timeout=120)
    # a short tick so that the tuner decides at least once on this small data set
    code = _example("intune.tune(").replace('policy="intune")', 'policy="intune", tick_s=0.2)')
    code += "\nassert rows == 20000, rows\nprint('ROWS', rows)\n"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ROWS 20000" in done.stdout
    assert (tmp_path / "history.jsonl").exists()
