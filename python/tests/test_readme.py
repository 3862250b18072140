"""The README's Python example must run as written (in its own process:
normalizing `mooncake_tcp` sets MC_FORCE_TCP in the environment)."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_readme_python_example_runs():
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks, "README has no Python example"
    for code in blocks:
        done = subprocess.run([sys.executable, "-c", code + "\nprint('example finished')"],
                              cwd=ROOT / "python", capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip().endswith("example finished")
