"""predict_proba / predict_log_proba of the classic classifiers (scikit-learn's contract)."""

import numpy as np
import pytest
from sklearn.exceptions import NotFittedError

from jaxdp import classic


# 40 rows of 3 features in [0, 1], two classes, epsilon = 1, two trees of depth 2: the fits of
# test_classic_sklearn_compat.py's estimators (same shapes and noise parameters), whose compiled
# cores and samplers these share (the noise scales are compile-time constants of the cores).
def _data(n=40, seed=0):
  rng = np.random.default_rng(seed)
  x = rng.uniform(0.0, 1.0, size=(n, 3))
  y = np.where(x[:, 0] + 0.1 * rng.normal(size=n) > 0.5, "yes", "no")
  return x, y


@pytest.mark.parametrize("make", [
    lambda: classic.PrivateNaiveBayes(epsilon=1.0, classes=["no", "yes"], lower=0.0, upper=1.0,
                                      seed=0),
    lambda: classic.PrivateRandomTrees(epsilon=1.0, classes=["no", "yes"], lower=0.0, upper=1.0,
                                       n_estimators=2, depth=2, seed=0),
    lambda: classic.PrivateRandomTrees(epsilon=1.0, classes=["no", "yes"], lower=0.0, upper=1.0,
                                       n_estimators=2, depth=2, seed=0, combine="average"),
], ids=["naive_bayes", "random_trees_product", "random_trees_average"])
def test_proba_rows_sum_to_one_and_argmax_is_predict(make):
  x, y = _data()
  est = make()
  with pytest.raises(NotFittedError):
    est.predict_proba(x)
  est.fit(x, y)
  proba = est.predict_proba(x)
  assert proba.shape == (40, 2)
  assert np.all(proba >= 0.0) and np.all(proba <= 1.0)
  np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=1e-12)
  np.testing.assert_array_equal(est.classes_[np.argmax(proba, axis=1)], est.predict(x))
  with pytest.raises(ValueError, match="features"):
    est.predict_proba(x[:5, :2])
  if hasattr(est, "predict_log_proba"):
    np.testing.assert_allclose(np.exp(est.predict_log_proba(x)), proba, rtol=1e-12)
