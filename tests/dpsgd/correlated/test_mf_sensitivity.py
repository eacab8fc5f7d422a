"""Sensitivity of Toeplitz and dense strategies against brute force over all patterns."""

import itertools
import math

import numpy as np
import pytest

from jaxdp.dpsgd.correlated import optimize
from jaxdp.dpsgd.correlated import sensitivity
from jaxdp.dpsgd.correlated import strategies


def _patterns(n, k, b):
  for m in range(1, k + 1):
    for p in itertools.combinations(range(n), m):
      if all(p[i + 1] - p[i] >= b for i in range(m - 1)):
        yield list(p)


def _brute_force(c, k, b):
  """max over patterns and sign vectors s of s^T X_pp s (= sens^2 when X >= 0 or cross terms vanish)."""
  x = c.T @ c
  best = 0.0
  for p in _patterns(c.shape[0], k, b):
    sub = x[np.ix_(p, p)]
    signs = np.array(list(itertools.product([-1.0, 1.0], repeat=len(p))))
    best = max(best, float(np.max(np.einsum("si,ij,sj->s", signs, sub, signs))))
  return best


def _check(strategy, n, k, b):
  want = _brute_force(strategy.matrix(n), k, b)
  got = sensitivity.sensitivity(strategy, n, max_participations=k, min_separation=b) ** 2
  case = sensitivity.sensitivity_case(strategy, n, max_participations=k, min_separation=b)
  dense, dense_case = sensitivity.sensitivity_of_matrix(
      strategy.matrix(n), max_participations=k, min_separation=b, return_case=True)
  for value, rule in ((got, case), (dense ** 2, dense_case)):
    if rule == "bound":
      assert value >= want * (1 - 1e-12)
    else:
      np.testing.assert_allclose(value, want, rtol=1e-10, atol=1e-12)
  return case


class _Toeplitz:
  """Any lower-triangular Toeplitz C (signed, increasing, even with an unstable inverse, which
  BandMF refuses): the sensitivity only needs coefficients(n)."""

  def __init__(self, coefs):
    self.coefs = np.asarray(coefs, np.float64)

  def coefficients(self, n):
    out = np.zeros(n)
    out[:min(n, self.coefs.size)] = self.coefs[:n]
    return out

  def matrix(self, n):
    return strategies.toeplitz_matrix(self.coefs, n)


SETTINGS = [(8, 1, 1), (8, 2, 3), (8, 3, 2), (7, 4, 1), (8, 2, 5), (8, 4, 2)]


@pytest.mark.parametrize("n,k,b", SETTINGS)
def test_random_strategies_match_brute_force(n, k, b):
  rng = np.random.default_rng(n * 100 + k * 10 + b)
  cases = set()
  for _ in range(3):
    signed = _Toeplitz(np.concatenate([[1.0], rng.normal(size=rng.integers(1, 5))]))
    increasing = _Toeplitz(np.concatenate([[1.0], rng.uniform(0.0, 2.0, 3)]))
    decreasing = strategies.BandMF(np.concatenate([[1.0], np.sort(rng.uniform(0, 1, 4))[::-1]]))
    omega = rng.dirichlet(np.ones(3))[:2]
    blt = strategies.BLT(rng.uniform(0.05, 0.95, 2), omega)
    for strategy in (signed, increasing, decreasing, blt):
      cases.add(_check(strategy, n, k, b))
    # The BLT and the nonnegative non-increasing BandMF are exact cases.
    for strategy in (decreasing, blt):
      assert sensitivity.sensitivity_case(strategy, n, max_participations=k,
                                          min_separation=b) != "bound"
  if k == 1:
    assert cases == {"single"}


def test_optimized_bandmf_matches_brute_force():
  n = 8
  strategy = optimize.optimize_bandmf(n, 3, max_participations=2, min_separation=3)
  assert _check(strategy, n, 2, 3) == "orthogonal"
  assert _check(strategy, n, 1, 1) == "single"


def test_dense_non_toeplitz_matches_brute_force():
  rng = np.random.default_rng(5)
  n = 7
  for k, b in ((2, 2), (3, 1), (3, 3)):
    c = np.tril(rng.normal(size=(n, n)))
    want = _brute_force(c, k, b)
    got, case = sensitivity.sensitivity_of_matrix(c, max_participations=k, min_separation=b,
                                                  return_case=True)
    assert case == "bound" and got ** 2 >= want * (1 - 1e-12)
    # Banded (non-Toeplitz) with bands <= b: exact via the dynamic program.
    banded = np.where(np.subtract.outer(np.arange(n), np.arange(n)) < b, c, 0.0)
    got, case = sensitivity.sensitivity_of_matrix(banded, max_participations=k, min_separation=b,
                                                  return_case=True)
    if k > 1:
      assert case == "orthogonal"
    np.testing.assert_allclose(got ** 2, _brute_force(banded, k, b), rtol=1e-12)


@pytest.mark.parametrize("n,k,b,expected", [(10, 3, 1, 3), (10, 3, 4, 3), (10, 5, 4, 3),
                                            (1, 4, 1, 1), (10, 1, 20, 1)])
def test_dp_sgd_is_sqrt_participations(n, k, b, expected):
  assert sensitivity.max_participations(n, b) == math.ceil(n / b)
  value = sensitivity.sensitivity(strategies.BandMF.dp_sgd(), n, max_participations=k,
                                  min_separation=b)
  assert value == pytest.approx(math.sqrt(expected), rel=1e-15)


def test_large_toeplitz_agrees_with_dense():
  n, k, b = 300, 3, 40
  blt = strategies.BLT(np.array([0.99, 0.6]), np.array([0.1, 0.3]))
  band = strategies.BandMF(optimize.square_root_coefs(50))
  for strategy, case in ((blt, "monotone"), (band, "monotone")):
    value = sensitivity.sensitivity(strategy, n, max_participations=k, min_separation=b)
    assert sensitivity.sensitivity_case(strategy, n, max_participations=k,
                                        min_separation=b) == case
    dense = sensitivity.sensitivity_of_matrix(strategy.matrix(n), max_participations=k,
                                              min_separation=b)
    np.testing.assert_allclose(value, dense, rtol=1e-12)


def test_bad_arguments_are_refused():
  s = strategies.BandMF.dp_sgd()
  with pytest.raises(ValueError, match="max_participations"):
    sensitivity.sensitivity(s, 5, max_participations=0)
  with pytest.raises(ValueError, match="min_separation"):
    sensitivity.sensitivity(s, 5, min_separation=0)
  with pytest.raises(ValueError, match="num_steps"):
    sensitivity.sensitivity(s, 0)
  with pytest.raises(ValueError, match="min_separation"):
    sensitivity.max_participations(5, -1)
  with pytest.raises(TypeError, match="strategy"):
    sensitivity.sensitivity(np.eye(3), 3)
  with pytest.raises(ValueError, match="strategy_matrix"):
    sensitivity.sensitivity_of_matrix(np.ones((2, 3)))
  with pytest.raises(ValueError, match="strategy_matrix"):
    sensitivity.sensitivity_of_matrix(np.full((2, 2), np.nan))
