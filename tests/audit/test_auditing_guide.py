"""The auditing guide (docs/auditing.md) runs as written, and its table matches its CSV."""

import csv
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "auditing.md"
CSV = ROOT / "docs" / "data" / "one_run_audit.csv"


def test_guide_code_runs_and_a_correct_plan_stays_below_its_claim():
  blocks = re.findall(r"^```python\n(.*?)^```", GUIDE.read_text(), flags=re.S | re.M)
  assert len(blocks) == 1
  namespace: dict = {"__name__": "__guide__"}
  exec(compile(blocks[0], f"{GUIDE.name}[block 0]", "exec"), namespace)  # pylint: disable=exec-used
  audit, accountant = namespace["audit"], namespace["accountant"]
  assert 0.0 <= audit.steinke.epsilon_lower_bound <= audit.fdp.epsilon_lower_bound
  assert audit.fdp.epsilon_lower_bound < audit.epsilon_claimed <= 4.0 + 1e-6
  assert accountant.ledger  # the run was paid


def test_table_rows_are_the_committed_csv():
  rows = list(csv.DictReader(CSV.open()))
  names = {"correct": "correct", "noise_div10": "noise / 10", "skip_sampling": "skips sampling"}
  text = GUIDE.read_text()
  for row in rows:
    eps = f"{float(row['epsilon_target']):g}"
    line = (f"| {names[row['plan']]} | {eps} | {float(row['bound_steinke']):.2f} | "
            f"{float(row['bound_fdp']):.2f} | {float(row['ratio_fdp']):.2f} |")
    assert line in text, line
    exceeds = row["exceeds_claim_steinke"] == "True" and row["exceeds_claim_fdp"] == "True"
    assert (row["broken"] == "True") == exceeds or float(row["epsilon_target"]) == 8.0, row
