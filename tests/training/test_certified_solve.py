"""Tests of the float64 certificate's rounding bound and NaN handling (certified_solve.py)."""

import math

import numpy as np
import pytest

from jaxdp.training import certified_solve as cs

_U = 2.0 ** -53


def _exact_logistic_grad(w, lam):
  """``grad J`` of the all-ones problem (x_n = 1, y_n = 1) in long double: ``-sigmoid(-w) + lam w``."""
  wl = np.longdouble(w)
  return -1 / (1 + np.exp(wl)) + np.longdouble(lam) * wl


def test_rounding_bound_dominates_the_worst_summation_order():
  """Proof gap of issue 26: the old bound (8 sqrt(N) u K, a probabilistic model) is not a worst
  case. N identical products summed left to right (a legal order: reference BLAS, one XLA
  reduction) all round the same way: the error grows like N u, 17x the old bound at N = 1e6.
  The deterministic Higham bound gamma_N K dominates it, and the library's own (BLAS) result."""
  n, lam = 10 ** 6, 0.01
  w = np.array([-2.1972245773362196])  # sigmoid(-w) = 0.9: l'(s) = -0.9 for every example
  x, y = np.ones((n, 1)), np.ones(n)
  exact = _exact_logistic_grad(w[0], lam)
  _, g_lib = cs.objective_and_grad(w, x, y, loss="logistic", h=0.5, l2_total=lam)
  _, g_rows = cs._loss_grad(x @ w, y, "logistic", 0.5, need_value=False)  # pylint: disable=protected-access
  g_seq = np.cumsum(x[:, 0] * g_rows)[-1] / n + lam * w[0]  # left-to-right summation
  bound = float(cs.certificate_rounding_bound(n, 1, abs(w[0]), 0.0, loss="logistic", h=0.5,
                                              l2_total=lam))
  err_seq = float(abs(np.longdouble(g_seq) - exact))
  err_lib = float(abs(np.longdouble(g_lib[0]) - exact))
  assert err_seq <= bound and err_lib <= bound
  old_model = 8.0 * math.sqrt(n + 4.0) * _U + 16 * _U  # K = 1, sqrt(dim) = 1
  assert err_seq > 5 * old_model  # the old "bound" was exceeded: it was not a bound
  assert bound <= 1.1 * n * _U  # and the new one is tight to a constant (gamma_N K)


def test_rounding_bound_dominates_softmax_errors_with_large_weights():
  """Adversarial softmax inputs: rows on the unit sphere, weights of norm 1e4 (cancelling
  logits), a large linear term; error of the computed certificate vs a long-double gradient."""
  rng = np.random.default_rng(0)
  n, d, c, lam = 3000, 4, 3, 1e-4
  x = rng.normal(size=(n, d))
  x /= np.linalg.norm(x, axis=1, keepdims=True)
  y = rng.integers(0, c, size=n)
  w = 1e4 * rng.normal(size=(d, c)) / math.sqrt(d * c)
  b = 50.0 * rng.normal(size=(d, c))
  _, g = cs.objective_and_grad(w, x, y, loss="softmax", h=0.5, l2_total=lam, linear_term=b)
  xl, wl = x.astype(np.longdouble), w.astype(np.longdouble)
  s = xl @ wl
  p = np.exp(s - s.max(axis=1, keepdims=True))
  p /= p.sum(axis=1, keepdims=True)
  p[np.arange(n), y] -= 1
  exact = xl.T @ p / n + np.longdouble(lam) * wl + b.astype(np.longdouble)
  measured = float(abs(np.linalg.norm(g) - np.sqrt(np.sum(exact * exact))))
  bound = float(cs.certificate_rounding_bound(n, d * c, np.linalg.norm(w), np.linalg.norm(b),
                                              loss="softmax", h=0.5, l2_total=lam))
  assert 0 < measured <= bound
  # Affine in (||W||, ||b||), as jaxdp.inference relies on (a0 + a_w ||W|| + a_b ||b||).
  f = lambda wn, ln: float(cs.certificate_rounding_bound(n, d * c, wn, ln, loss="softmax", h=0.5,
                                                         l2_total=lam))
  a0 = f(0.0, 0.0)
  assert f(3.0, 2.0) == pytest.approx(a0 + 3 * (f(1.0, 0.0) - a0) + 2 * (f(0.0, 1.0) - a0),
                                      rel=1e-9)


def test_check_tol_floor_keeps_the_rounding_bound_small():
  for n, dim in ((30, 3), (60000, 7840), (10 ** 7, 1)):
    floor_tol = None
    try:
      cs.check_tol(1e-15, num_examples=n, dim=dim, loss="softmax")
    except ValueError as err:
      floor_tol = float(str(err).split("floor ")[1].split(" ")[0])
    assert floor_tol is not None
    b0 = float(cs.certificate_rounding_bound(n, dim, 0.0, 0.0, loss="softmax", h=0.5,
                                             l2_total=0.0))
    assert b0 <= floor_tol / 7.99
    cs.check_tol(floor_tol * 1.01, num_examples=n, dim=dim, loss="softmax")


def _small(n=30, d=3, c=3, seed=0):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(n, d))
  return x / np.linalg.norm(x, axis=1, keepdims=True), rng.integers(0, c, size=n)


@pytest.mark.parametrize("batched", [False, True])
def test_nan_weights_fail_the_certificate_and_are_repaired(batched):
  """Issue 26: ``g > tol`` is False for NaN, so NaN weights skipped the certificate and were
  returned as certified. NaN (or inf) must fail it: the point is repaired from a
  data-independent start and the result is within tol/Lambda of the minimiser."""
  x, y = _small()
  lam, tol = 0.1, 1e-7
  bad = np.full((3, 3), np.nan)
  bad[0, 0] = np.inf
  w0 = np.stack([bad, np.zeros((3, 3))]) if batched else bad
  sol = cs.certify_minimizers(w0, x, y, loss="softmax", h=0.5, l2_total=lam, tol=tol,
                              batched=batched)
  first = sol.weights[0] if batched else sol.weights
  assert np.all(np.isfinite(first))
  assert np.all(np.asarray(sol.distance) <= tol / lam)
  assert int(np.atleast_1d(sol.route)[0]) > 0
  _, g = cs.objective_and_grad(first, x, y, loss="softmax", h=0.5, l2_total=lam)
  assert np.linalg.norm(g) <= tol


def test_nan_data_never_certifies():
  x, y = _small()
  x[4, 1] = np.nan
  with pytest.raises(cs.CertificationError, match="NaN"):
    cs.certify_minimizers(np.zeros((3, 3)), x, y, loss="softmax", h=0.5, l2_total=0.1, tol=1e-7)
  # The NaN certificate itself compares as a failure.
  assert not cs._nan_fails(np.array([np.nan]))[0] <= 1.0  # pylint: disable=protected-access
