"""The custom-loop guide (docs/custom_training_loops.md) and notebook
(colabs/dpsgd_custom_flax_loop.ipynb) run end to end, as a user would run them."""

import json
import pathlib
import re
import warnings

import pytest

import _notebooks

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "colabs" / "dpsgd_custom_flax_loop.ipynb"
GUIDE = ROOT / "docs" / "custom_training_loops.md"


def _python_blocks(markdown: str) -> list[str]:
  return re.findall(r"^```python\n(.*?)^```", markdown, flags=re.S | re.M)


def _run_guide_blocks(count=None) -> dict:
  blocks = _python_blocks(GUIDE.read_text())
  assert len(blocks) >= 3
  namespace: dict = {"__name__": "__guide__"}
  for i, block in enumerate(blocks[:count]):
    exec(compile(block, f"{GUIDE.name}[block {i}]", "exec"), namespace)  # pylint: disable=exec-used
  # The first block trains to the target and its ledger holds exactly the steps taken.
  assert namespace["sampler"].epsilon() <= 2.0
  assert namespace["accountant"].ledger[0][1] == namespace["private"].steps
  return namespace


def test_guide_first_block_trains_to_its_target():
  """The guide's main loop (its first block); every block runs in order under slow."""
  _run_guide_blocks(count=1)


@pytest.mark.slow
def test_guide_code_blocks_run_in_order():
  _run_guide_blocks()


def test_notebook_is_valid_nbformat_with_cell_ids():
  nbformat = pytest.importorskip("nbformat")
  with warnings.catch_warnings():
    warnings.simplefilter("error")  # e.g. MissingIDFieldWarning
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
  ids = [c["id"] for c in nb.cells]
  assert all(ids) and len(set(ids)) == len(ids)
  code = "\n".join(c["source"] for c in nb.cells if c["cell_type"] == "code")
  assert "make_private" in code and "sampler.epsilon()" in code
  assert all(not c.get("outputs") for c in nb.cells if c["cell_type"] == "code")


def _execute(tmp_path, env_data_dir):
  return _notebooks.execute(NOTEBOOK, tmp_path, env_data_dir, timeout=600)


def _check_output(text, min_accuracy):
  # each epoch prints the guarantee with its accounting method: "(eps, delta)-DP ... rdp)"
  epochs = re.findall(r"epoch (\d+): (\d+) steps, \((\d+\.?\d*), [^)]*\)-DP for add_remove "
                      r"neighbours \(unit: example; rdp\)", text)
  assert len(epochs) >= 2, text[-2000:]
  eps = [float(e) for _, _, e in epochs]
  assert all(a < b for a, b in zip(eps, eps[1:])) and eps[-1] <= 3.0 + 1e-9, epochs
  final = re.search(r"DP-SGD custom loop: epsilon (\d+\.\d+) .* final test accuracy (\d\.\d+)", text)
  assert final, text[-2000:]
  assert float(final.group(1)) == pytest.approx(eps[-1], abs=1e-3)
  assert min_accuracy < float(final.group(2)) <= 1.0
  assert text.count("refused:") == 2
  # The tuned run: one repeat-and-select search, its whole epsilon within the target.
  tuned = re.search(r"tuned run: \{.*\}, private validation score (-?\d\.\d+), test accuracy "
                    r"(\d\.\d+); epsilon of the whole search (\d+\.\d+)", text)
  assert tuned, text[-2000:]
  assert float(tuned.group(3)) <= 3.0 + 1e-3 and 0.0 <= float(tuned.group(2)) <= 1.0
  assert "_compute_log_a_frac failed to converge" not in text


def test_notebook_executes_on_digits(tmp_path):
  """The .ipynb itself (nbclient + ipykernel), on the embedded digits data (CPU, ~30 s)."""
  text = _execute(tmp_path, None)
  assert "digits:" in text
  _check_output(text, min_accuracy=0.75)


@pytest.mark.slow
@pytest.mark.data
def test_notebook_executes_on_mnist(tmp_path, data_dir):
  text = _execute(tmp_path, data_dir)
  assert "mnist:" in text
  _check_output(text, min_accuracy=0.85)
