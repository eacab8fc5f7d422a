"""experiments/tradeoffs.py, Fig. 2 (paper 000 Sec. 4.2): private prediction vs private training
as a function of the inference budget B, the noise of each answer calibrated as the predictors
calibrate it, and subsample-and-aggregate's T chosen on the held-out split.

Tiny config on the embedded digits set (no data dir needed): two budgets, three noise draws, one
epsilon, delta in {0, 1e-5}, 16 teachers.
"""

import csv
import json
import math

import numpy as np
import pytest

import _experiment_scripts

from jaxdp import prediction as jpred

BUDGETS = (1, 100)
EPS = 10.0
DELTAS = (0.0, 1e-5)
TRAINING = ("model_sensitivity", "loss_perturbation")
PREDICTION = ("prediction_sensitivity", "subsample_aggregate")
# The whole digits training set and its preset's 16 teachers: the shapes of the runs in
# tests/experiments/test_tradeoffs.py, whose certified fits and teachers compile the same
# programs (shared through the compilation cache).
N_TRAIN = 1438

_load = _experiment_scripts.load  # experiment scripts once per process


def _tiny_config(tmp_path, l2_regs=(1e-2,)):
  config = _load("configs/tradeoffs.py").get_config("fig2")
  config.methods = ("non_private",) + TRAINING + PREDICTION
  config.epsilons = (EPS,)
  config.deltas = DELTAS
  config.axis_values = BUDGETS
  config.l2_regs = l2_regs
  config.num_teachers = 16
  config.num_seeds = 3  # 1 validation and 3 test draws, as test_tradeoffs.py's runs
  config.val_seeds = 1
  config.n_train = N_TRAIN
  config.out_dir = str(tmp_path)
  return config


def _check_writes_results(config, tmp_path):
  experiment = _load("experiments/tradeoffs.py")
  rows = experiment.main(config)

  out = tmp_path / config.name / f"digits_n{N_TRAIN}"  # <out_dir>/<experiment>/<dataset>[_n<N>]/
  assert {p.name for p in out.iterdir()} >= {"results.csv", "results.json", "points.jsonl",
                                              "fig2.png"}
  assert (out / "fig2.png").stat().st_size > 10_000
  meta = json.loads((out / "results.json").read_text())  # strict JSON (no NaN/inf literals)
  with open(out / "results.csv", newline="") as f:
    csv_rows = list(csv.DictReader(f))
  # non-private: one row; private training: one row per delta (the released model answers any
  # number of queries, so its accuracy is the same for every B: the figure draws it flat);
  # private prediction: one row per (delta, B).
  expected = 1 + len(TRAINING) * len(DELTAS) + len(PREDICTION) * len(DELTAS) * len(BUDGETS)
  assert len(rows) == len(meta["rows"]) == len(csv_rows) == expected
  (dataset,) = meta["datasets"]
  assert dataset["n_train"] == N_TRAIN and dataset["n_fit"] + dataset["n_val"] == N_TRAIN
  assert {r["epsilon"] for r in meta["rows"] if r["method"] == "non_private"} == {"inf"}

  teachers = experiment.teacher_grid(experiment.resolve_config(config))
  for r in rows:
    assert 0.0 <= r["test_accuracy_mean"] <= 1.0 and 0.0 <= r["nonprivate_val_accuracy"] <= 1.0
    assert r["test_accuracy_std"] >= 0.0
    assert r["num_draws"] == (1 if r["method"] == "non_private" else config.num_seeds)
    assert r["l2_reg"] in config.l2_regs
    if r["method"] in PREDICTION:
      assert r["kind"] == "prediction" and r["budget"] in BUDGETS
    else:
      assert r["kind"] == "training" and r["budget"] == 0 and r["noise_scale"] == 0.0
    if r["method"] == "subsample_aggregate":
      assert r["num_teachers"] in teachers

  base = [r["test_accuracy_mean"] for r in rows if r["method"] == "non_private"]
  assert len(base) == 1 and base[0] >= 0.8

  by = {(r["method"], r["delta"], r["budget"]): r for r in rows if r["method"] != "non_private"}
  for delta in DELTAS:
    for method in TRAINING:  # one private model per delta, whatever B
      assert [r["budget"] for r in rows if r["method"] == method and r["delta"] == delta] == [0]
    # Private prediction pays for every answer: B = 100 is far noisier than B = 1.
    for method in PREDICTION:
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
  return rows


def test_fig2_prediction_vs_training_writes_results(tmp_path):
  # One lambda and one T: every method, both deltas and both budgets as in the slow test, which
  # also selects lambda (and T with it) among candidates.
  pytest.importorskip("ml_collections")
  _check_writes_results(_tiny_config(tmp_path), tmp_path)


@pytest.mark.slow
def test_fig2_prediction_vs_training_writes_results_slow(tmp_path):
  """Two lambdas and two T: the held-out selection of lambda and of (T, lambda)."""
  pytest.importorskip("ml_collections")
  config = _tiny_config(tmp_path, l2_regs=(1e-3, 1e-2))
  config.num_teachers_grid = (8, 16)
  rows = _check_writes_results(config, tmp_path)
  points = [tuple(r["point"]) for r in rows if r["method"] == "subsample_aggregate"]
  assert points and all(p[-1] == 0 for p in points)  # T is chosen, not a coordinate


def test_num_teachers_grid_is_searched_with_lambda_and_checked_before_any_work(tmp_path):
  pytest.importorskip("ml_collections")
  experiment = _load("experiments/tradeoffs.py")
  config = _tiny_config(tmp_path, l2_regs=(1e-3, 1e-2))
  config.num_teachers_grid = (8, 16, 8)
  resolved = experiment.resolve_config(config)
  assert experiment.teacher_grid(resolved) == (8, 16)
  points = [p for p in experiment.grid(resolved) if p[0] == "subsample_aggregate"]
  assert len(points) == len(DELTAS) * len(BUDGETS) and {p[-1] for p in points} == {0}
  cands = experiment._candidates("subsample_aggregate", points[0], resolved)  # pylint: disable=protected-access
  assert cands == [dict(num_teachers=t, l2_reg=lam) for t in (8, 16) for lam in (1e-3, 1e-2)]
  config.num_teachers_grid = (16,)  # one value: a fixed T, a coordinate of the point
  resolved = experiment.resolve_config(config)
  assert {p[-1] for p in experiment.grid(resolved) if p[0] == "subsample_aggregate"} == {16}
  config.axis = "num_teachers"  # on the T axis, the axis value is the point's T
  config.axis_values = (4, 32)
  resolved = experiment.resolve_config(config)
  assert {p[-1] for p in experiment.grid(resolved) if p[0] == "subsample_aggregate"} == {4, 32}
  for bad in ((0,), (8, -1)):
    config = _tiny_config(tmp_path)
    config.num_teachers_grid = bad
    with pytest.raises(ValueError, match="num_teachers_grid"):
      experiment.main(config)
  assert not (tmp_path / config.name).exists()  # refused before the data were loaded


def test_unknown_method_is_refused(tmp_path):
  pytest.importorskip("ml_collections")
  config = _tiny_config(tmp_path)
  config.methods = ("non_private", "dp_sgd")
  with pytest.raises(ValueError, match="config.methods"):
    _load("experiments/tradeoffs.py").main(config)
  assert not (tmp_path / config.name).exists()
