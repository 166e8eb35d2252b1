"""The README's Python example runs as written on the default model, and the
offline example script too."""

import re
import subprocess
import sys

from conftest import REPO


def readme_block(must_contain):
    for m in re.finditer(r"```python\n(.*?)```", (REPO / "README.md").read_text(), re.S):
        if must_contain in m.group(1):
            return m.group(1)
    raise AssertionError(f"README has no python block with {must_contain!r}")


def test_readme_example(gemma_path, tmp_path):
    code = readme_block("from pagellm import LLM")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("'The capital of France is' -> ") and len(lines) == 3
    assert lines[-1].strip() == "Paris"


def test_offline_example(gemma_path, tmp_path):
    out = subprocess.run([sys.executable, str(REPO / "examples/python/offline.py")], capture_output=True, text=True,
                         timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "chat -> 'Paris'" in out.stdout
