"""The quick-tour notebook's code (colabs/jaxdp_quick_tour.py, the percent-format twin of the
.ipynb) runs end to end."""

import json
import pathlib
import runpy

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_notebook_matches_script():
  nb = json.loads((ROOT / "colabs" / "jaxdp_quick_tour.ipynb").read_text())
  code = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
  script = (ROOT / "colabs" / "jaxdp_quick_tour.py").read_text()
  for line in code.splitlines():
    assert line in script


@pytest.mark.slow
def test_quick_tour_runs():
  runpy.run_path(str(ROOT / "colabs" / "jaxdp_quick_tour.py"), run_name="__main__")
