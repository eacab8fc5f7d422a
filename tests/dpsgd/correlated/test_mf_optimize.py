"""Optimised BandMF / BLT strategies and the expected error."""

import math

import numpy as np
import pytest

from jaxdp.dpsgd.correlated import optimize
from jaxdp.dpsgd.correlated import sensitivity
from jaxdp.dpsgd.correlated import strategies
from jaxdp.dpsgd.correlated import workloads


def _dense_expected_error(strategy, n, *, momentum=0.0, learning_rates=None, k=1, b=1,
                          error="total"):
  a = workloads.sgd_workload(n, momentum=momentum, learning_rates=learning_rates)
  sq = (a @ np.linalg.inv(strategy.matrix(n))) ** 2
  err = {"total": sq.sum(), "mean": sq.sum() / n, "max": sq.sum(axis=1).max()}[error]
  sens = sensitivity.sensitivity_of_matrix(strategy.matrix(n), max_participations=k,
                                           min_separation=b)
  return sens ** 2 * err


def test_square_root_coefs_square_to_prefix_sum():
  r = optimize.square_root_coefs(12)
  rr = strategies.toeplitz_matrix(r, 12)
  np.testing.assert_allclose(rr @ rr, np.tril(np.ones((12, 12))), atol=1e-12)


def test_one_band_is_dp_sgd():
  s = optimize.optimize_bandmf(50, 1, max_participations=3, min_separation=10)
  np.testing.assert_array_equal(s.coefs, [1.0])
  n = 20
  # DP-SGD's expected error: k ||A||_F^2 (k = ceil(20 / 7) = 3 participations).
  want = 3 * (n * (n + 1) / 2)
  got = optimize.expected_error(s, n, max_participations=5, min_separation=7)
  assert got == pytest.approx(want, rel=1e-12)


def test_optimized_bandmf_beats_square_root_and_identity():
  n, bands, k, b = 32, 6, 2, 16
  eta = np.linspace(1.0, 0.2, n)
  kw = dict(momentum=0.9, learning_rates=eta, max_participations=k, min_separation=b)
  s = optimize.optimize_bandmf(n, bands, error="total", **kw)
  assert s.bands == bands and s.coefs[0] == 1.0
  assert sensitivity.sensitivity_case(s, n, max_participations=k, min_separation=b) == "orthogonal"
  ours = optimize.expected_error(s, n, error="total", **kw)
  np.testing.assert_allclose(ours, _dense_expected_error(s, n, momentum=0.9, learning_rates=eta,
                                                         k=k, b=b), rtol=1e-10)
  sqrt = optimize.expected_error(strategies.BandMF(optimize.square_root_coefs(bands)), n, **kw)
  ident = optimize.expected_error(strategies.BandMF.dp_sgd(), n, **kw)
  assert ours <= sqrt * (1 + 1e-9)
  assert ours <= ident * (1 + 1e-9)
  assert ours < 0.9 * ident


def test_blt_is_close_to_the_best_toeplitz_strategy():
  n = 24
  full = optimize.optimize_bandmf(n, n, error="mean")
  blt = optimize.optimize_blt(n, 3, error="mean")
  assert np.all(blt.theta > 0) and np.all(blt.theta < 1) and blt.omega.sum() <= 1.0
  e_full = optimize.expected_error(full, n, error="mean")
  e_blt = optimize.expected_error(blt, n, error="mean")
  e_sqrt = optimize.expected_error(strategies.BandMF(optimize.square_root_coefs(n)), n,
                                   error="mean")
  np.testing.assert_allclose(e_blt, _dense_expected_error(blt, n, error="mean"), rtol=1e-10)
  assert e_full <= e_sqrt * (1 + 1e-9)
  assert e_full * (1 - 1e-9) <= e_blt <= 1.03 * e_full
  # Several participations: the BLT's sensitivity is exact ("monotone").
  assert sensitivity.sensitivity_case(blt, n, max_participations=3, min_separation=8) == "monotone"


def test_bad_arguments_are_refused():
  with pytest.raises(ValueError, match="min_separation"):
    optimize.optimize_bandmf(20, 8, max_participations=2, min_separation=4)
  with pytest.raises(ValueError, match="bands"):
    optimize.optimize_bandmf(20, 21)
  with pytest.raises(ValueError, match="bands"):
    optimize.optimize_bandmf(20, 0)
  with pytest.raises(ValueError, match="buffers"):
    optimize.optimize_blt(20, 0)
  with pytest.raises(ValueError, match="error kind"):
    optimize.optimize_blt(20, 2, error="rmse")
  with pytest.raises(ValueError, match="momentum"):
    optimize.optimize_bandmf(20, 4, momentum=1.0)
  with pytest.raises(ValueError, match="learning_rates"):
    optimize.optimize_blt(20, 2, learning_rates=np.ones(19))
  with pytest.raises(ValueError, match="max_iterations"):
    optimize.optimize_bandmf(20, 4, max_iterations=0)
  with pytest.raises(ValueError, match="tol"):
    optimize.optimize_blt(20, 2, tol=0.0)
  with pytest.raises(ValueError, match="max_participations"):
    optimize.expected_error(strategies.BandMF.dp_sgd(), 20, max_participations=0)
  with pytest.raises(ValueError, match="min_separation"):
    optimize.expected_error(strategies.BandMF.dp_sgd(), 20, min_separation=None)
  assert math.isfinite(optimize.expected_error(strategies.BandMF.dp_sgd(), 1))


def test_bandmf_optimum_is_found_when_the_first_trial_step_is_near_singular():
  # A unit L-BFGS step from the square-root start lands at c_1 = 1.5, where C^{-1} blows up
  # (loss ~1e58); the search runs on log(loss) and still reaches c_1 ~ 0.967.
  from jaxdp.dpsgd.correlated import BandMF, optimize_bandmf, expected_error
  kw = dict(momentum=0.9, max_participations=90, min_separation=2)
  best = optimize_bandmf(180, 2, **kw)
  start = BandMF(np.array([1.0, 0.5]))
  assert expected_error(best, 180, **kw) < 0.95 * expected_error(start, 180, **kw)
  assert abs(best.coefs[1] - 0.9674) < 1e-3
