"""Tests of the scikit-learn-like private estimators (jaxdp/training/estimators.py)."""

import math

import numpy as np
import pytest

from jaxdp.accounting import PrivacyAccountant, PrivacyBudget, events
from jaxdp.errors import BudgetExceededError
from jaxdp.training import linear
from jaxdp.training.estimators import PrivateLinearClassifier, PrivateLogisticRegression


def _data(seed=0, n=300, d=6, c=3):
  rng = np.random.default_rng(seed)
  y = rng.integers(0, c, size=n)
  x = 2.0 * rng.normal(size=(c, d))[y] + rng.normal(size=(n, d))
  x = (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)
  labels = np.asarray(["cat", "dog", "eel"])[y]
  return x, labels, y


def test_fit_predict_score_and_accountant():
  x, labels, _ = _data()
  acc = PrivacyAccountant()
  clf = PrivateLogisticRegression(epsilon=5.0, l2_reg=1e-3, accountant=acc, seed=1).fit(x, labels)
  assert clf.coef_.shape == (6, 3)
  proba = clf.predict_proba(x)
  np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=1e-5)
  assert set(np.unique(clf.predict(x))) <= {"cat", "dog", "eel"}
  assert clf.score(x, labels) > 0.5
  # Approximate Minima Perturbation: 99% of eps on the objective noise, 1% on the output noise.
  assert acc.ledger == ((events.ComposedDpEvent([
      events.PureDpEvent(0.99 * 5.0, neighbouring="replace_one"),
      events.PureDpEvent(0.01 * 5.0, neighbouring="replace_one")]), 1),)
  clf.fit(x, labels)  # a second fit spends again, with a fresh key
  assert acc.pure_epsilon() == pytest.approx(10.0)


def test_loss_perturbation_estimator_uses_replace_one_neighbours():
  # All estimator methods share one accountant, so they must share one neighbouring relation;
  # model sensitivity and the binary methods are replace-one. Loss perturbation must therefore
  # use the replace-one calibration (beta = eps/(4K)), which also makes l2_reg > 0 valid
  # (under add/remove the mean-normalised L2 term is data-dependent).
  import jax  # pylint: disable=import-outside-toplevel
  from jaxdp.training import objective_perturbation  # pylint: disable=import-outside-toplevel
  x, labels, y = _data()
  w = PrivateLogisticRegression(epsilon=1.0, l2_reg=1e-3, seed=3).fit(x, labels).coef_
  ref = objective_perturbation.loss_perturbation(
      jax.random.fold_in(jax.random.key(3), 0), x, y, num_classes=3, epsilon=1.0, l2_reg=1e-3,
      neighbouring="replace_one")
  assert ref.calibration.objective.scale == pytest.approx(0.99 / (4 * math.sqrt(2)))
  assert ref.calibration.objective.neighbouring == "replace_one"
  np.testing.assert_allclose(w, ref.weights, rtol=1e-5, atol=1e-6)


def test_public_classes_fix_the_output_and_inferred_classes_warn():
  # Replace-one neighbours where the neighbour loses the only "eel": with the label set read
  # off the data the released shape (and classes_) would differ -- a certain distinguisher.
  x, labels, _ = _data()
  eel = np.flatnonzero(labels == "eel")
  labels = labels.copy()
  labels[eel[1:]] = "dog"  # D: exactly one eel
  neighbour = labels.copy()
  neighbour[eel[0]] = "cat"  # D': the eel replaced
  public = ["cat", "dog", "eel"]
  a = PrivateLogisticRegression(epsilon=1.0, classes=public, seed=0).fit(x, labels)
  b = PrivateLogisticRegression(epsilon=1.0, classes=public, seed=0).fit(x, neighbour)
  assert a.coef_.shape == b.coef_.shape == (6, 3)
  assert list(a.classes_) == list(b.classes_) == public
  assert set(a.predict(x)) <= set(public)
  with pytest.warns(UserWarning, match="NOT differentially private"):
    c = PrivateLogisticRegression(epsilon=1.0, seed=0).fit(x, neighbour)
  assert c.coef_.shape == (6, 2)  # what the inferred label set leaks
  with pytest.raises(ValueError, match="outside classes"):
    PrivateLogisticRegression(epsilon=1.0, classes=["cat", "dog"]).fit(x, labels)
  with pytest.raises(ValueError, match="classes"):
    PrivateLogisticRegression(epsilon=1.0, classes=["cat", "cat"])


def test_refitting_uses_fresh_noise():
  x, labels, _ = _data()
  clf = PrivateLogisticRegression(epsilon=1.0, seed=0)
  w1 = clf.fit(x, labels).coef_.copy()
  w2 = clf.fit(x, labels).coef_.copy()
  assert not np.allclose(w1, w2)
  w3 = PrivateLogisticRegression(epsilon=1.0, seed=0).fit(x, labels).coef_
  np.testing.assert_array_equal(w1, w3)


def test_budget_refuses_before_training():
  x, labels, _ = _data()
  budget = PrivacyBudget(epsilon=1.5)
  clf = PrivateLogisticRegression(epsilon=1.0, accountant=budget, method="model_sensitivity",
                                  l2_reg=0.1)
  clf.fit(x, labels)
  with pytest.raises(BudgetExceededError):
    PrivateLogisticRegression(epsilon=1.0, accountant=budget).fit(x, labels)
  fresh = PrivateLogisticRegression(epsilon=1.0, accountant=PrivacyBudget(epsilon=0.5))
  with pytest.raises(BudgetExceededError):
    fresh.fit(x, labels)
  assert not hasattr(fresh, "coef_")


def test_non_private_and_eps_inf_match_fit_linear():
  x, labels, y = _data()
  ref = linear.fit_linear(x, y, num_classes=3, l2_reg=1e-2).weights
  for method in ("non_private", "loss_perturbation", "model_sensitivity"):
    clf = PrivateLogisticRegression(epsilon=math.inf, method=method, l2_reg=1e-2).fit(x, labels)
    np.testing.assert_array_equal(clf.coef_, ref)


def test_binary_methods_and_gaussian_delta():
  x, labels, y = _data(c=2)
  for method in ("objective_perturbation", "output_perturbation"):
    clf = PrivateLinearClassifier(epsilon=2.0, method=method, loss="huber", l2_reg=0.05).fit(x, labels)
    assert clf.coef_.shape == (6,)
    assert clf.predict_proba(x).shape == (300, 2)
  acc = PrivacyAccountant()
  PrivateLogisticRegression(epsilon=1.0, delta=1e-5, accountant=acc).fit(x, labels)
  parts = acc.ledger[0][0].events
  assert [type(p) for p in parts] == [events.ApproxDpEvent] * 2
  assert [p.epsilon for p in parts] == pytest.approx([0.99, 0.01])
  assert [p.delta for p in parts] == pytest.approx([0.99e-5, 0.01e-5])
  assert sum(p.delta for p in parts) == pytest.approx(1e-5, rel=1e-12)


def test_validation():
  x, labels, _ = _data()
  with pytest.raises(ValueError, match="method"):
    PrivateLogisticRegression(epsilon=1.0, method="dp_magic")
  with pytest.raises(ValueError, match="binary"):
    PrivateLinearClassifier(epsilon=1.0, method="objective_perturbation").fit(x, labels)
  with pytest.raises(ValueError, match="normalize_rows"):
    PrivateLogisticRegression(epsilon=1.0).fit(3 * x, labels)
  clf = PrivateLogisticRegression(epsilon=1.0, normalize=True).fit(3 * x, labels)
  assert clf.coef_.shape == (6, 3)
  with pytest.raises(ValueError, match="not fitted"):
    PrivateLogisticRegression(epsilon=1.0).predict(x)
