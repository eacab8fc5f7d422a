"""The tuning guide (docs/tuning.md) runs as a user would run it.

Every ``python`` block of the page is self-contained. The always-on test runs
the fast ones (the custom ``repeat_and_select`` mechanism and the plain
``GridSearchCV`` behaviours) and checks what they print; the ``PrivateSearchCV``
and ``tune_dpsgd`` examples train on digits (seconds each on a CPU) and run,
with every block in order, under ``slow``.
"""

import contextlib
import io
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "tuning.md"


def _python_blocks() -> list[str]:
  return re.findall(r"^```python\n(.*?)^```", GUIDE.read_text(), flags=re.S | re.M)


def _block(marker: str) -> tuple[int, str]:
  found = [(i, b) for i, b in enumerate(_python_blocks()) if marker in b]
  assert len(found) == 1, f"one block of {GUIDE.name} must contain {marker!r}"
  return found[0]


def _run(index: int, block: str) -> tuple[dict, str]:
  namespace: dict = {"__name__": "__guide__"}
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    exec(compile(block, f"{GUIDE.name}[block {index}]", "exec"), namespace)  # pylint: disable=exec-used
  return namespace, out.getvalue()


def test_the_guide_has_its_examples():
  blocks = _python_blocks()
  assert len(blocks) == 4
  text = GUIDE.read_text()
  for word in ("now", "previously", "used to", "no longer"):  # a user guide, not a change log
    assert not re.search(rf"\b{word}\b", text, flags=re.I), word


def test_custom_mechanism_block_spends_liu_talwar_3_eps():
  namespace, out = _run(*_block("def mechanism(key, clip)"))
  assert namespace["result"].candidate in (0.25, 0.5, 1.0)
  assert namespace["accountant"].get_epsilon(0.0) == pytest.approx(3.0)
  assert len(namespace["accountant"].ledger) == 1  # ONE spend for the whole search
  assert "clip:" in out and "epsilon: 3.0" in out


def test_plain_grid_search_block_shows_the_three_behaviours():
  _, out = _run(*_block("GridSearchCV("))
  assert "search stopped: BudgetExceededError spent 3.0" in out
  assert "refused:" in out and "n_jobs=2" in out
  assert "warned: True" in out


@pytest.mark.slow
def test_every_block_runs_in_order():
  for i, block in enumerate(_python_blocks()):
    namespace, out = _run(i, block)
    if "PrivateSearchCV(" in block:
      assert namespace["budget"].spent_epsilon == pytest.approx(7.0)
      assert 0.0 <= namespace["test_accuracy"] <= 1.0
      assert namespace["search"].best_params_["l2_reg"] in (1e-3, 1e-2, 1e-1)
    if "tune_dpsgd(" in block:
      assert namespace["out"].epsilon <= 4.0 + 1e-9
      assert len(namespace["accountant"].ledger) == 1
    assert out
