"""The correlated-noise notebook (colabs/correlated_noise_bandmf.ipynb): valid, and it runs end
to end as a user would run it (DP-SGD and BandMF at the same budget, both within it)."""

import pathlib
import re
import warnings

import pytest

import _notebooks

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "colabs" / "correlated_noise_bandmf.ipynb"


def test_correlated_notebook_is_valid_nbformat_with_cell_ids():
  nbformat = pytest.importorskip("nbformat")
  with warnings.catch_warnings():
    warnings.simplefilter("error")  # e.g. MissingIDFieldWarning
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
  assert nb.nbformat == 4
  ids = [c["id"] for c in nb.cells]
  assert all(ids) and len(set(ids)) == len(ids)
  code = "\n".join(c["source"] for c in nb.cells if c["cell_type"] == "code")
  for needle in ("noise_strategy", "optimize_bandmf", "calibrate_mf_noise_multiplier",
                 "expected_error", "make_private", "PrivacyAccountant", "momentum=MOMENTUM"):
    assert needle in code, needle
  assert any(c["cell_type"] == "markdown" for c in nb.cells)
  assert all(not c.get("outputs") and c.get("execution_count") is None
             for c in nb.cells if c["cell_type"] == "code")


def _execute(tmp_path, env_data_dir):
  return _notebooks.execute(NOTEBOOK, tmp_path, env_data_dir, timeout=900)


def _check_output(text, min_accuracy):
  target = re.search(r"target: epsilon (\d+\.?\d*) at delta [^;]+; (\d+) steps", text)
  assert target, text[-3000:]
  target_epsilon, steps = float(target.group(1)), int(target.group(2))
  runs = {}
  for label, sigma, ledger, eps, acc in re.findall(
      r"^(DP-SGD|BandMF): .*?noise multiplier (\d+\.\d+), ledger \[([^\]]*)\] epsilon "
      r"(\d+\.\d+), test accuracy (\d\.\d+)$", text, flags=re.M):
    runs[label] = (float(sigma), ledger, float(eps), float(acc))
  assert set(runs) == {"DP-SGD", "BandMF"}, text[-3000:]
  for label, (sigma, _, eps, acc) in runs.items():
    assert sigma > 0, label
    assert eps <= target_epsilon, (label, eps)
    assert min_accuracy < acc <= 1.0, (label, acc)
  # DP-SGD pays its per-step event T times; BandMF pays its whole run as one event.
  assert runs["DP-SGD"][1] == f"PoissonSampledDpEvent x {steps}", runs["DP-SGD"][1]
  assert runs["BandMF"][1].endswith(" x 1"), runs["BandMF"][1]
  chosen = re.search(r"chosen: bands = (\d+)", text)
  assert chosen and int(chosen.group(1)) > 1, text[-3000:]
  memory = re.search(r"streamed noise state: (\d+) x ([\d,]+) parameters = ([\d,]+) floats", text)
  assert memory, text[-3000:]
  size, params, floats = (int(g.replace(",", "")) for g in memory.groups())
  assert size == int(chosen.group(1)) - 1 and floats == size * params
  assert "_compute_log_a_frac failed to converge" not in text
  return runs


@pytest.mark.slow
def test_correlated_notebook_executes_on_digits(tmp_path):
  """The .ipynb itself (nbclient + ipykernel), on the embedded digits data (CPU, ~35 s)."""
  text = _execute(tmp_path, None)
  assert "digits:" in text
  runs = _check_output(text, min_accuracy=0.5)
  print({label: (eps, acc) for label, (_, _, eps, acc) in runs.items()})


@pytest.mark.slow
@pytest.mark.data
def test_correlated_notebook_executes_on_mnist(tmp_path, data_dir):
  text = _execute(tmp_path, data_dir)
  assert "mnist:" in text
  _check_output(text, min_accuracy=0.85)
