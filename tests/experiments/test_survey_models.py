"""Tests of experiments/survey_models.py: the k-means comparison's spend and relation, the
naive Bayes and random trees points."""

import math

import numpy as np
import pytest

import _experiment_scripts

_load = _experiment_scripts.load  # experiment scripts once per process


def _synthetic(seed=0, n=3000, dim=6):
  rng = np.random.default_rng(seed)
  centres = rng.random((3, dim))
  x = np.clip(centres[rng.integers(0, 3, n)] + 0.05 * rng.normal(size=(n, dim)), 0, 1)
  xt = np.clip(centres[rng.integers(0, 3, n)] + 0.05 * rng.normal(size=(n, dim)), 0, 1)
  return dict(x=x, y=np.zeros(n), xt=xt, yt=np.zeros(n), lower=np.zeros(dim),
              upper=np.ones(dim))


def test_diffprivlib_kmeans_spend_factor_values():
  sm = _load("experiments/survey_models.py")
  got = [sm.diffprivlib_kmeans_spend_factor(d) for d in (10, 51, 104, 784)]
  np.testing.assert_allclose(got, [1.21, 2.11, 2.70, 5.38], atol=0.006)
  assert sm.diffprivlib_kmeans_spend_factor(1) == pytest.approx(1.0)


def test_spend_factor_is_what_diffprivlib_spends():
  """Records the epsilons diffprivlib's KMeans hands to its mechanisms in one fit."""
  sm = _load("experiments/survey_models.py")
  dpl = sm.import_diffprivlib()
  if dpl is None:
    pytest.skip("diffprivlib (optional extra [compare]) not installed")
  import diffprivlib.models.k_means as dkm  # pylint: disable=import-outside-toplevel
  spent = []

  def recording(cls):
    class Recorded(cls):  # pylint: disable=too-few-public-methods
      def __init__(self, *args, epsilon, **kw):
        spent.append((cls.__name__, epsilon))
        super().__init__(*args, epsilon=epsilon, **kw)
    return Recorded

  mp = pytest.MonkeyPatch()
  mp.setattr(dkm, "GeometricFolded", recording(dkm.GeometricFolded))
  mp.setattr(dkm, "LaplaceBoundedDomain", recording(dkm.LaplaceBoundedDomain))
  try:
    d = _synthetic(dim=10)
    est = dpl.models.KMeans(3, epsilon=1.0, bounds=(d["lower"], d["upper"]), random_state=0)
    est.fit(d["x"])
  finally:
    mp.undo()
  iters = est.n_iter_
  # One GeometricFolded per update, one LaplaceBoundedDomain per (non-empty cluster, dimension).
  per_update = []
  for name, eps in spent:
    if name == "GeometricFolded":
      per_update.append([eps, 0.0, 0])
    else:
      per_update[-1][1] = eps
      per_update[-1][2] += 1
  # Count + d sum coordinates of ONE cluster (parallel composition over clusters), per update.
  one = per_update[0][0] + 10 * per_update[0][1]
  assert one * iters == pytest.approx(sm.diffprivlib_kmeans_spend_factor(10), rel=1e-9)


def test_kmeans_point_runs_both_relations_and_scores():
  sm = _load("experiments/survey_models.py")
  config = _load("configs/survey_models.py").get_config()
  d = _synthetic()
  for rel in ("add_remove", "replace_one"):
    config.kmeans_neighbouring = rel
    ratio, secs = sm.fit_and_score("kmeans", "jaxdp", 3.0, 0, d, config)
    assert math.isfinite(ratio) and ratio > 0.99 and secs > 0
  # Without noise the private Lloyd is close to scikit-learn's cost.
  ratio, _ = sm.fit_and_score("kmeans", "jaxdp", math.inf, 0, d, config)
  assert ratio < 1.5


def test_naive_bayes_and_trees_points_run_on_indicator_and_continuous_columns():
  """The jaxdp naive Bayes (categorical path for the binary columns) and trees points."""
  sm = _load("experiments/survey_models.py")
  config = _load("configs/survey_models.py").get_config()
  config.num_trees, config.tree_depth = 2, 2
  rng = np.random.default_rng(0)
  n = 400
  y, yt = rng.integers(0, 2, n), rng.integers(0, 2, n)
  flag = lambda lab: (rng.random(n) < np.where(lab == 1, 0.9, 0.1)).astype(float)
  x = np.stack([rng.random(n), flag(y)], 1)
  xt = np.stack([rng.random(n), flag(yt)], 1)
  d = dict(x=x, y=y, xt=xt, yt=yt, lower=np.zeros(2), upper=np.ones(2),
           binary=np.array([False, True]))
  for model in ("naive_bayes", "random_trees"):
    acc, secs = sm.fit_and_score(model, "jaxdp", math.inf, 0, d, config)
    assert acc > 0.8 and secs > 0, (model, acc)
