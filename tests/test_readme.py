"""The README's Python example runs as written, on a small generated data set."""

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_example_runs(tmp_path):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "the README has no Python example"
    generate = [sys.executable, "-m", "intune.cli", "data", "generate", "--rows", "20000", "--out", "data/criteo"]
    subprocess.run(generate, cwd=tmp_path, check=True, capture_output=True, timeout=120)
    # a short tick so that the tuner decides at least once on this small data set
    code = blocks[0].replace('policy="intune")', 'policy="intune", tick_s=0.2)')
    code += "\nassert rows == 20000, rows\nprint('ROWS', rows)\n"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ROWS 20000" in done.stdout
    assert (tmp_path / "history.jsonl").exists()
