"""Smoke test of experiments/accuracy_vs_epsilon.py (tiny config on the embedded digits set)."""

import json

import pytest

import _repo_modules


_load = _repo_modules.load


def test_accuracy_vs_epsilon_writes_results(tmp_path):
  pytest.importorskip("ml_collections")
  config = _load("configs/accuracy_vs_epsilon.py").get_config()
  config.epsilons = (1.0, 100.0)
  config.deltas = (0.0,)
  config.l2_regs = (1e-3, 1e-2)
  config.num_seeds = 2
  config.val_seeds = 2  # the preset's 20 draws per lambda only repeat the same compiled fits
  config.n_train = 400
  config.out_dir = str(tmp_path)
  experiment = _load("experiments/accuracy_vs_epsilon.py")
  rows = experiment.main(config)
  out = tmp_path / config.name / "digits_n400"  # results/<experiment>/<dataset>[_n<N>]/
  assert {p.name for p in out.iterdir()} >= {"results.csv", "results.json", "accuracy_vs_epsilon.png"}
  meta = json.loads((out / "results.json").read_text())
  assert meta["rows"][0]["epsilon"] == "inf"
  assert len(meta["rows"]) == len(rows) == 1 + 2 * 2
  by = {(r["method"], r["epsilon"]): r["test_accuracy_mean"] for r in rows}
  assert by[("non_private", float("inf"))] > 0.85
  for method in ("model_sensitivity", "loss_perturbation"):
    assert by[(method, 100.0)] > by[(method, 1.0)]
