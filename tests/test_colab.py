"""The quick-tour notebook's code (colabs/jaxdp_quick_tour.py, the percent-format twin of the
.ipynb) runs end to end."""

import json
import re
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


def test_notebook_is_valid_nbformat_with_cell_ids():
  nbformat = pytest.importorskip("nbformat")
  import warnings  # pylint: disable=import-outside-toplevel
  with warnings.catch_warnings():
    warnings.simplefilter("error")  # e.g. MissingIDFieldWarning
    nb = nbformat.read(ROOT / "colabs" / "jaxdp_quick_tour.ipynb", as_version=4)
    nbformat.validate(nb)
  ids = [c["id"] for c in nb.cells]
  assert all(ids) and len(set(ids)) == len(ids)
  assert "test accuracy" in "".join(c["source"] for c in nb.cells if "train_dpsgd" in c["source"])


@pytest.mark.slow
def test_notebook_executes_without_log_noise(tmp_path):
  """Runs the .ipynb itself (nbclient + ipykernel), as a user opening it would."""
  nbformat = pytest.importorskip("nbformat")
  nbclient = pytest.importorskip("nbclient")
  pytest.importorskip("ipykernel")
  nb = nbformat.read(ROOT / "colabs" / "jaxdp_quick_tour.ipynb", as_version=4)
  nbclient.NotebookClient(nb, timeout=900, kernel_name="python3",
                          resources={"metadata": {"path": str(tmp_path)}}).execute()
  outputs = []
  for cell in nb.cells:
    for out in cell.get("outputs", []):
      outputs.append(out.get("text", "") + str(out.get("data", {}).get("text/plain", "")))
  text = "\n".join(outputs)
  assert "_compute_log_a_frac failed to converge" not in text
  assert "Unable to initialize backend 'tpu'" not in text
  acc = re.search(r"DP-SGD: .* test accuracy (\d\.\d+)", text)
  assert acc and 0.5 < float(acc.group(1)) <= 1.0, text[-2000:]
