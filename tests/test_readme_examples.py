"""Every python example in README.md runs twice in a row, as written, in a fresh folder."""

import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
BLOCKS = re.findall(r"^```python\n(.*?)^```", (ROOT / "README.md").read_text(), re.M | re.S)


def test_readme_has_python_examples():
  assert BLOCKS


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_example_runs_twice_as_written(index, tmp_path):
  script = tmp_path / "example.py"
  script.write_text(BLOCKS[index])
  outputs = []
  for _ in range(2):
    run = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                         text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    outputs.append(run.stdout)
  assert outputs[0].strip(), "the example printed nothing"
  # Nothing left in the working directory but the script itself (temporary folders only).
  assert sorted(p.name for p in tmp_path.iterdir()) == ["example.py"]
