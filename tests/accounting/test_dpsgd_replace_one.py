"""DP-SGD under replace-one neighbours: the PLD of the replace-one subsampled Gaussian.

References computed here, independently of dp_accounting: the hockey-stick
divergence of the dominating pair
``P = (1 - q) N(0, s^2) + q N(+C, s^2)``, ``Q = (1 - q) N(0, s^2) + q N(-C, s^2)``
(Zhu, Dong & Wang 2022) by numerical integration, and at ``q = 1`` the exact
Gaussian mechanism of sensitivity ``2C`` (Balle & Wang 2018 Thm 8).
"""

import math

import numpy as np
import pytest
from scipy import integrate, optimize, stats

from jaxdp.accounting import PrivacyAccountant, dpsgd_accounting, events
from jaxdp.accounting.accountant import UnsupportedEventError


def _pair_delta(eps: float, q: float, z: float) -> float:
  """delta(eps) of one replace-one subsampled Gaussian step (C = 1, s = z), both directions.

  The hockey-stick divergence ``int max(0, p - e^eps q)`` on a fine grid
  (Simpson's rule; the integrand is smooth except at its kinks, where it is 0).
  """
  x = np.linspace(-14 * z - 2, 14 * z + 2, 400_001)
  def density(mu):
    return (1 - q) * stats.norm.pdf(x, 0.0, z) + q * stats.norm.pdf(x, mu, z)
  p, r = density(1.0), density(-1.0)
  return max(integrate.simpson(np.maximum(0.0, p - math.exp(eps) * r), x=x),
             integrate.simpson(np.maximum(0.0, r - math.exp(eps) * p), x=x))


def _gaussian_epsilon(mu: float, delta: float) -> float:
  def excess(eps):
    return (stats.norm.cdf(mu / 2 - eps / mu) - math.exp(eps) * stats.norm.cdf(-mu / 2 - eps / mu)
            - delta)
  return optimize.brentq(excess, 0.0, 100.0, xtol=1e-12)


@pytest.mark.parametrize("q,z", [(0.1, 1.0), (0.5, 2.0)])
def test_one_step_matches_the_integrated_dominating_pair(q, z):
  delta = 1e-5
  eps = dpsgd_accounting.dpsgd_epsilon(z, q, 1, delta, "pld", neighbouring="replace_one")
  # PLD is pessimistic (an upper bound: the pair's delta at eps is <= delta) and tight
  # to its discretisation (1e-4 in epsilon): 5e-3 below eps the pair needs more delta.
  assert _pair_delta(eps, q, z) <= delta * (1 + 1e-6)
  assert _pair_delta(eps - 5e-3, q, z) > delta


def test_full_batch_is_the_gaussian_mechanism_of_sensitivity_two_c():
  z, delta = 2.0, 1e-5
  exact = _gaussian_epsilon(2.0 / z, delta)
  eps = dpsgd_accounting.dpsgd_epsilon(z, 1.0, 1, delta, "pld", neighbouring="replace_one")
  assert exact - 1e-6 <= eps <= exact + 5e-3
  # ... and the ledger of the tagged event (noise multiplier z / 2 over 2C) agrees.
  acc = PrivacyAccountant()
  acc.spend(dpsgd_accounting.dpsgd_event(z, 1.0, 1, neighbouring="replace_one"))
  assert acc.neighbouring == "replace_one"
  assert acc.get_epsilon(delta, "pld") == pytest.approx(eps, abs=1e-9)


def test_replace_one_costs_more_than_add_remove_and_at_most_group_privacy():
  z, q, t, delta = 1.0, 0.2, 5, 1e-5
  add_remove = dpsgd_accounting.dpsgd_epsilon(z, q, t, delta, "pld")
  replace = dpsgd_accounting.dpsgd_epsilon(z, q, t, delta, "pld", neighbouring="replace_one")
  assert add_remove < replace
  # Group privacy (k = 2) from add/remove at delta' with (1 + e^eps') delta' <= delta.
  half = dpsgd_accounting.dpsgd_epsilon(z, q, t, delta / (1 + math.exp(2 * add_remove)), "pld")
  assert replace <= 2 * half + 1e-3


# PLD of the replace-one SAMPLED Gaussian costs ~1 s per evaluation (dp_accounting inverts
# the privacy loss point by point); the default run calibrates the full-batch case.
@pytest.mark.parametrize("q,t", [(1.0, 1), pytest.param(0.5, 3, marks=pytest.mark.slow)])
def test_calibration_meets_the_target_and_the_ledger_reports_it(q, t):
  delta, target = 1e-5, 2.0
  z = dpsgd_accounting.calibrate_noise_multiplier(target, delta, q, t, "pld", tol=1e-2,
                                                  neighbouring="replace_one")
  eps = dpsgd_accounting.dpsgd_epsilon(z, q, t, delta, "pld", neighbouring="replace_one")
  assert eps <= target
  assert eps >= target - 0.1  # the smallest such z, to tol = 0.01
  # The same z is well inside the target for add/remove neighbours.
  assert dpsgd_accounting.dpsgd_epsilon(z, q, t, delta, "pld") < target - 0.3
  acc = PrivacyAccountant()
  acc.spend(dpsgd_accounting.dpsgd_event(z, q, t, neighbouring="replace_one"))
  assert acc.get_epsilon(delta) == pytest.approx(eps, abs=1e-9)  # auto = pld here


def test_only_pld_bounds_a_replace_one_sampled_ledger():
  acc = PrivacyAccountant()
  acc.spend(dpsgd_accounting.dpsgd_event(1.0, 0.1, 10, neighbouring="replace_one"))
  for method in ("rdp", "zcdp", "pure", "basic"):
    with pytest.raises(UnsupportedEventError):
      acc.get_epsilon(1e-5, method)
  assert math.isfinite(acc.get_epsilon(1e-5, "pld"))
  # Replace-one events of other methods compose on the same ledger.
  acc.spend(events.PureDpEvent(0.5, neighbouring="replace_one"))
  assert math.isfinite(acc.get_epsilon(1e-5))


def test_other_sampled_events_stay_refused_under_replace_one():
  acc = PrivacyAccountant(neighbouring="replace_one")
  sampled_laplace = events.PoissonSampledDpEvent(
      0.1, events.LaplaceDpEvent(1.0, neighbouring="replace_one"))
  with pytest.raises(ValueError, match="replace_one"):
    acc.spend(sampled_laplace)
  assert acc.ledger == ()


@pytest.mark.parametrize("call", [
    lambda: dpsgd_accounting.dpsgd_epsilon(1.0, 0.1, 10, 1e-5, "rdp", neighbouring="replace_one"),
    lambda: dpsgd_accounting.calibrate_noise_multiplier(1.0, 1e-5, 0.1, 10,
                                                        neighbouring="replace_one"),
    lambda: dpsgd_accounting.make_accountant("rdp", "replace_one"),
])
def test_rdp_with_replace_one_is_refused_naming_the_accountant(call):
  with pytest.raises(ValueError, match="accountant='pld'"):
    call()


def test_unknown_relation_is_refused():
  with pytest.raises(ValueError, match="neighbouring"):
    dpsgd_accounting.dpsgd_epsilon(1.0, 0.1, 10, 1e-5, "pld", neighbouring="swap")
