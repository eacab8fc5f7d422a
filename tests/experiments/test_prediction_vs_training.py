"""Smoke test of experiments/prediction_vs_training.py (paper 000 Sec. 4.2, Fig. 2).

Tiny config on the embedded digits set (no data dir needed): two budgets, two
noise seeds, one epsilon, delta in {0, 1e-5}, 16 teachers.
"""

import csv
import json
import math

import numpy as np
import pytest

import _repo_modules

from jaxdp import prediction as jpred

BUDGETS = (1, 100)
EPS = 10.0
DELTAS = (0.0, 1e-5)
# The whole digits training set and its preset's 16 teachers: the shapes of the runs in
# tests/experiments/test_tradeoffs.py, whose certified fits and teachers compile the same
# programs (shared through the compilation cache).
N_TRAIN = 1438


_load = _repo_modules.load


def _tiny_config(tmp_path, l2_regs=(1e-2,)):
  config = _load("configs/prediction_vs_training.py").get_config()
  config.epsilons = (EPS,)
  config.deltas = DELTAS
  config.budgets = BUDGETS
  config.l2_regs = l2_regs
  config.num_teachers = (16,)
  config.num_seeds = 2
  config.n_train = N_TRAIN
  config.out_dir = str(tmp_path)
  return config


def _check_writes_results(config, tmp_path):
  experiment = _load("experiments/prediction_vs_training.py")
  rows = experiment.main(config)

  out = tmp_path / config.name / f"digits_n{N_TRAIN}"  # results/<experiment>/<dataset>[_n<N>]/
  assert {p.name for p in out.iterdir()} >= {"results.csv", "results.json", "points.jsonl",
                                              "prediction_vs_training.png"}
  assert (out / "prediction_vs_training.png").stat().st_size > 10_000
  meta = json.loads((out / "results.json").read_text())  # strict JSON (no NaN/inf literals)
  with open(out / "results.csv", newline="") as f:
    csv_rows = list(csv.DictReader(f))
  # non-private: one row per B; 2 training + 2 prediction methods: one row per (delta, B).
  expected = len(BUDGETS) * (1 + 4 * len(DELTAS))
  assert len(rows) == len(meta["rows"]) == len(csv_rows) == expected
  assert meta["n_train"] == N_TRAIN and meta["n_fit"] + meta["n_val"] == N_TRAIN
  assert {r["epsilon"] for r in meta["rows"] if r["method"] == "non_private"} == {"inf"}

  for r in rows:
    assert 0.0 <= r["test_accuracy_mean"] <= 1.0 and 0.0 <= r["val_accuracy"] <= 1.0
    assert r["test_accuracy_std"] >= 0.0
    assert r["num_draws"] == (1 if r["method"] == "non_private" else config.num_seeds)
    assert r["budget"] in BUDGETS and r["l2_reg"] in config.l2_regs

  base = [r["test_accuracy_mean"] for r in rows if r["method"] == "non_private"]
  assert len(set(base)) == 1 and base[0] >= 0.8

  by = {(r["method"], r["delta"], r["budget"]): r for r in rows if r["method"] != "non_private"}
  for delta in DELTAS:
    # Private training releases one private model: its accuracy is the same for every B.
    for method in ("model_sensitivity", "loss_perturbation"):
      accs = {(by[method, delta, b]["test_accuracy_mean"], by[method, delta, b]["test_accuracy_std"])
              for b in BUDGETS}
      assert len(accs) == 1, (method, delta, accs)
    # Private prediction pays for every answer: B = 100 is far noisier than B = 1.
    for method in ("prediction_sensitivity", "subsample_aggregate"):
      lo, hi = by[method, delta, BUDGETS[0]], by[method, delta, BUDGETS[-1]]
      assert lo["test_accuracy_mean"] > hi["test_accuracy_mean"] + 0.2, (method, delta)

    # Calibration exactly as the predictors for budget B (float32 scale, never less noise).
    for b in BUDGETS:
      r = by["subsample_aggregate", delta, b]
      beta = jpred.exponential_aggregation_beta(EPS, delta, b)
      assert r["noise_scale"] <= beta and r["noise_scale"] == pytest.approx(beta, rel=1e-6)
      if delta == 0.0:
        assert beta == EPS / (2 * b)  # corrected Thm. 7
      r = by["prediction_sensitivity", delta, b]
      # Certified fit: slack tol + 2^-24 (K + tol) (float32 rounding), as the predictor's.
      k = jpred.SOFTMAX_LIPSCHITZ
      slack = config.tol + 2.0 ** -24 * (k + config.tol)
      cal = jpred.calibrate_prediction_sensitivity(EPS, delta, b, N_TRAIN, r["l2_reg"], k,
                                                   solver_tol=slack)
      assert cal.noise == ("l2_laplace" if delta == 0.0 else "gaussian")
      assert r["noise_scale"] == pytest.approx(cal.scale, rel=1e-6)
      if delta == 0.0:  # beta = eps / (B Delta), Delta = 2K/(N lambda) + 2 slack/lambda, rounded down
        assert r["noise_scale"] <= cal.scale
        sens = 2 * k / (N_TRAIN * r["l2_reg"]) + 2 * slack / r["l2_reg"]
        assert cal.scale == pytest.approx(EPS / (b * sens), rel=1e-12)
      else:  # sigma rounded up
        assert r["noise_scale"] >= cal.scale
  assert all(math.isfinite(r["noise_scale"]) for r in rows)
  assert np.isclose(float(csv_rows[0]["test_accuracy_mean"]), rows[0]["test_accuracy_mean"])


def test_prediction_vs_training_writes_results(tmp_path):
  # One lambda (half the fits and private releases): every method, both deltas and both
  # budgets as in the slow test, which also selects lambda among two candidates.
  pytest.importorskip("ml_collections")
  _check_writes_results(_tiny_config(tmp_path), tmp_path)


@pytest.mark.slow
def test_prediction_vs_training_writes_results_slow(tmp_path):
  """Two lambdas: the held-out selection of lambda (and of (T, lambda)) among candidates."""
  pytest.importorskip("ml_collections")
  _check_writes_results(_tiny_config(tmp_path, l2_regs=(1e-3, 1e-2)), tmp_path)


def test_prediction_vs_training_rejects_unknown_method(tmp_path):
  pytest.importorskip("ml_collections")
  config = _tiny_config(tmp_path)
  config.methods = ("non_private", "dp_sgd")
  with pytest.raises(ValueError, match="config.methods"):
    _load("experiments/prediction_vs_training.py").main(config)
