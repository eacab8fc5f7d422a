"""Tests of the functional mechanism (jaxdp/training/functional_mechanism.py)."""

import math

import jax
import numpy as np
import pytest

from jaxdp.accounting import events
from jaxdp.training import functional_mechanism as fm


def _regression_data(seed=0, n=400, d=4):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(n, d))
  x = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1.0) * 0.9
  w = rng.normal(size=d) / np.sqrt(d)
  y = np.clip(x @ w + 0.05 * rng.normal(size=n), -1, 1)
  return x.astype(np.float32), y.astype(np.float32), w


def _per_record_l1(x, y, task):
  """sum_phi |lambda_{x,y,phi}| for one record (degree-1 and degree-2 monomial coefficients)."""
  if task == "linear":
    lin, q = -2 * y * x, 1.0
  else:
    lin, q = (0.5 - y) * x, 1 / 8
  quad = q * np.outer(x, x)
  return np.abs(lin).sum() + np.abs(np.diag(quad)).sum() + 2 * np.abs(np.triu(quad, 1)).sum()


def test_sensitivity_formula_bounds_and_is_attained():
  d = 9
  rng = np.random.default_rng(1)
  for task, y_vals in (("linear", (-1.0, 1.0)), ("logistic", (0.0, 1.0))):
    sens = fm.functional_mechanism_sensitivity(task, d)
    assert sens == pytest.approx(2 * (2 * 3 + 9) if task == "linear" else 3 + 9 / 4)
    pts = rng.normal(size=(2000, d))
    pts /= np.linalg.norm(pts, axis=1, keepdims=True)
    worst = max(_per_record_l1(p, yv, task) for p in pts for yv in y_vals)
    assert 2 * worst <= sens + 1e-9
    corner = np.full(d, 1 / math.sqrt(d))  # ||x||_1 = sqrt(D): the bound is tight
    assert 2 * _per_record_l1(corner, y_vals[0], task) == pytest.approx(sens, rel=1e-9)
  cal = fm.functional_mechanism_calibration("logistic", d, 0.5)
  assert cal.scale == pytest.approx((3 + 9 / 4) / 0.5)
  assert cal.event == events.PureDpEvent(0.5, neighbouring="replace_one")
  with pytest.raises(ValueError, match="task"):
    fm.functional_mechanism_sensitivity("poisson", 3)


def test_eps_inf_linear_is_ridge_solution():
  x, y, _ = _regression_data()
  lam = 0.01
  res = fm.functional_mechanism(jax.random.key(0), x, y, epsilon=math.inf, task="linear", l2_reg=lam)
  n, d = x.shape
  x64, y64 = x.astype(np.float64), y.astype(np.float64)
  # argmin (1/N)||y - X w||^2 + (lam/2)||w||^2.
  expected = np.linalg.solve(x64.T @ x64 + 0.5 * n * lam * np.eye(d), x64.T @ y64)
  np.testing.assert_allclose(res.weights, expected, rtol=1e-4, atol=1e-5)
  assert res.event == events.NonPrivateDpEvent()
  assert int(res.num_kept) == d


def test_noisy_objective_is_trimmed_and_accuracy_improves_with_epsilon():
  x, y, w_true = _regression_data(n=4000, d=3)
  keys = jax.random.split(jax.random.key(3), 64)
  errs = []
  for eps in (0.1, 10.0, 1000.0):
    res = fm.functional_mechanism(keys, x, y, epsilon=eps, task="linear")
    assert res.weights.shape == (64, 3)
    assert np.all(np.isfinite(np.asarray(res.weights)))
    assert np.all(np.asarray(res.num_kept) <= 3)
    errs.append(float(np.median(np.linalg.norm(np.asarray(res.weights) - w_true, axis=1))))
  assert errs[0] > errs[1] > errs[2]
  assert errs[2] < 0.1
  # At eps = 0.1 the noise (scale ~ 100) often makes M~ indefinite: some directions are trimmed.
  low = fm.functional_mechanism(keys, x[:50], y[:50], epsilon=0.1, task="linear")
  assert np.min(np.asarray(low.num_kept)) < 3


def test_logistic_taylor_classifier():
  rng = np.random.default_rng(0)
  n, d = 3000, 3
  y = rng.integers(0, 2, size=n)
  x = rng.normal(size=(n, d)) * 0.3 + np.where(y[:, None] > 0, 0.4, -0.4)
  x = (x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1.0)).astype(np.float32)
  res = fm.functional_mechanism(jax.random.key(0), x, y, epsilon=math.inf, task="logistic")
  acc = float(np.mean((x @ np.asarray(res.weights) >= 0) == (y > 0)))
  assert acc > 0.9
  priv = fm.functional_mechanism(jax.random.split(jax.random.key(1), 32), x, y, epsilon=5.0,
                                 task="logistic")
  accs = np.mean((np.einsum("nd,kd->kn", x, np.asarray(priv.weights)) >= 0) == (y > 0), axis=1)
  assert np.median(accs) > 0.8


def test_same_key_same_result_and_validation():
  x, y, _ = _regression_data()
  a = fm.functional_mechanism(jax.random.key(4), x, y, epsilon=1.0)
  b = fm.functional_mechanism(jax.random.key(4), x, y, epsilon=1.0)
  np.testing.assert_array_equal(a.weights, b.weights)
  with pytest.raises(ValueError, match="normalize_rows"):
    fm.functional_mechanism(jax.random.key(0), 5 * x, y, epsilon=1.0)
  with pytest.raises(ValueError, match=r"\[-1, 1\]"):
    fm.functional_mechanism(jax.random.key(0), x, 3 * y + 2, epsilon=1.0)
  with pytest.raises(ValueError, match=r"\{0, 1\}"):
    fm.functional_mechanism(jax.random.key(0), x, y, epsilon=1.0, task="logistic")
  with pytest.raises(ValueError, match="epsilon"):
    fm.functional_mechanism(jax.random.key(0), x, y, epsilon=0.0)
