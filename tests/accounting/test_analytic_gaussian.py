"""Tests of the analytic Gaussian mechanism calibration (Balle & Wang 2018)."""

import math

import dp_accounting
import numpy as np
import pytest
from scipy import stats

from jaxdp.accounting import analytic_gaussian as ag

# (epsilon, delta) pairs covering both branches of Algorithm 2.
CASES = [(1.0, 1e-5), (0.1, 1e-5), (10.0, 1e-5), (1.0, 0.3), (0.01, 0.45), (50.0, 1e-10),
         (1e-3, 1e-6), (3.0, 0.2), (0.5, 0.1)]


def _theorem8_delta(sigma, epsilon, sensitivity=1.0):
  """Balle & Wang Theorem 8, evaluated independently with scipy.stats in float64."""
  a = sensitivity / (2 * sigma)
  b = epsilon * sigma / sensitivity
  return stats.norm.cdf(a - b) - math.exp(epsilon) * stats.norm.cdf(-a - b)


def _branch(epsilon, delta):
  delta_0 = 0.5 - math.exp(epsilon) * stats.norm.cdf(-math.sqrt(2 * epsilon))
  return "plus" if delta >= delta_0 else "minus"


def test_cases_cover_both_branches():
  branches = {_branch(e, d) for e, d in CASES if e <= 10}
  assert branches == {"plus", "minus"}


@pytest.mark.parametrize("epsilon,delta", CASES)
@pytest.mark.parametrize("sensitivity", [1.0, 0.37])
def test_sigma_meets_theorem8_exactly(epsilon, delta, sensitivity):
  sigma = ag.analytic_gaussian_sigma(epsilon, delta, sensitivity)
  achieved = ag.analytic_gaussian_delta(sigma, epsilon, sensitivity)
  # Never overstated, and tight: within 1e-6 relative of the target delta.
  assert achieved <= delta
  assert achieved == pytest.approx(delta, rel=1e-6)
  if epsilon < 20:  # scipy's plain e^eps * Phi loses precision for huge eps
    assert _theorem8_delta(sigma, epsilon, sensitivity) == pytest.approx(delta, rel=1e-6)
  # A 1e-4 smaller sigma must violate the condition: sigma is (nearly) minimal.
  assert ag.analytic_gaussian_delta(sigma * (1 - 1e-4), epsilon, sensitivity) > delta


@pytest.mark.parametrize("epsilon,delta", CASES)
def test_agrees_with_dp_accounting(epsilon, delta):
  ours = ag.analytic_gaussian_sigma(epsilon, delta)
  theirs = dp_accounting.get_sigma_gaussian(epsilon, delta)
  assert ours == pytest.approx(theirs, rel=1e-6)


def test_alpha_relation_and_scaling():
  alpha = ag.analytic_gaussian_alpha(1.0, 1e-5)
  assert ag.analytic_gaussian_sigma(1.0, 1e-5) == pytest.approx(alpha / math.sqrt(2.0), rel=1e-9)
  assert ag.analytic_gaussian_sigma(1.0, 1e-5, 3.0) == pytest.approx(
      3.0 * ag.analytic_gaussian_sigma(1.0, 1e-5), rel=1e-9)
  assert ag.analytic_gaussian_sigma(1.0, 1e-5, 0.0) == 0.0


def test_better_than_classic_gaussian():
  for eps in [0.1, 0.5, 0.9]:
    assert ag.analytic_gaussian_sigma(eps, 1e-5) < ag.classic_gaussian_sigma(eps, 1e-5)
  with pytest.raises(ValueError, match="epsilon < 1"):
    ag.classic_gaussian_sigma(2.0, 1e-5)


def test_epsilon_inverse_round_trip():
  for eps, delta in CASES[:6]:
    sigma = ag.analytic_gaussian_sigma(eps, delta)
    assert ag.analytic_gaussian_epsilon(sigma, delta) == pytest.approx(eps, rel=1e-6)


def test_monotone_in_epsilon_and_delta():
  sig = [ag.analytic_gaussian_sigma(e, 1e-5) for e in np.geomspace(0.01, 10, 20)]
  assert np.all(np.diff(sig) < 0)
  sig = [ag.analytic_gaussian_sigma(1.0, d) for d in np.geomspace(1e-12, 0.5, 20)]
  assert np.all(np.diff(sig) < 0)


@pytest.mark.parametrize("kwargs,match", [
    (dict(epsilon=0.0, delta=1e-5), "epsilon must be > 0"),
    (dict(epsilon=-1.0, delta=1e-5), "epsilon must be > 0"),
    (dict(epsilon=math.inf, delta=1e-5), "finite"),
    (dict(epsilon=math.nan, delta=1e-5), "NaN"),
    (dict(epsilon=1.0, delta=0.0), r"delta must be in \(0, 1\)"),
    (dict(epsilon=1.0, delta=1.0), r"delta must be in \(0, 1\)"),
    (dict(epsilon=1.0, delta=-0.1), r"delta must be in \(0, 1\)"),
    (dict(epsilon=1.0, delta=1e-5, sensitivity=-1.0), "sensitivity must be finite and >= 0"),
])
def test_bad_input(kwargs, match):
  with pytest.raises(ValueError, match=match):
    ag.analytic_gaussian_sigma(**kwargs)


@pytest.mark.parametrize("epsilon,delta", [(1e-4, 9.321697517861378e-101), (1e-4, 2.4113977238404587e-285),
                                           (3.0527737246612284e-4, 1.66038885600102e-231)])
def test_tiny_epsilon_and_delta_never_overstate_the_guarantee(epsilon, delta):
  """Large v*: sqrt(1 + v/2) - sqrt(v/2) cancelled digits and the old 200-step nudge gave up,
  returning a sigma whose exact delta exceeded the target (by 4e-5 relative here)."""
  sigma = ag.analytic_gaussian_sigma(epsilon, delta)
  assert ag.analytic_gaussian_delta(sigma, epsilon) <= delta
  assert ag.analytic_gaussian_delta(sigma, epsilon) == pytest.approx(delta, rel=1e-6)
