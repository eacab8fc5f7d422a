"""Tests of composition theorems and the private-prediction inversions."""

import math

import numpy as np
import pytest

from jaxdp.accounting import PrivacyAccountant, analytic_gaussian_sigma, composition, events


def test_basic_composition():
  assert composition.basic_composition([0.1, 0.2, 0.3], [1e-6, 0, 2e-6]) == pytest.approx((0.6, 3e-6))
  with pytest.raises(ValueError, match="delta"):
    composition.basic_composition([0.1], [1.0])
  with pytest.raises(ValueError, match="epsilon"):
    composition.basic_composition([-0.1])


def test_advanced_composition_drv_closed_form():
  eps, k, slack = 0.05, 1000, 1e-6
  total_eps, total_delta = composition.advanced_composition(eps, 1e-8, k, slack)
  expected = math.sqrt(2 * k * math.log(1 / slack)) * eps + k * eps * (math.exp(eps) - 1)
  assert total_eps == pytest.approx(expected, rel=1e-12)
  assert total_delta == pytest.approx(k * 1e-8 + slack, rel=1e-12)
  # Beats basic composition for many small steps.
  assert total_eps < k * eps


def test_kov_never_worse_than_drv():
  for eps in [0.01, 0.1, 1.0, 3.0]:
    for k in [1, 10, 1000]:
      drv = composition.advanced_composition(eps, 0.0, k, 1e-6, "drv")[0]
      kov = composition.advanced_composition(eps, 0.0, k, 1e-6, "kov")[0]
      assert kov <= drv + 1e-12
      assert kov <= k * eps + 1e-12


@pytest.mark.parametrize("bad", [dict(k=0), dict(delta_slack=0.0), dict(epsilon=0.0), dict(delta=1.0)])
def test_advanced_composition_bad_input(bad):
  kwargs = dict(epsilon=0.1, delta=0.0, k=10, delta_slack=1e-5)
  kwargs.update(bad)
  with pytest.raises(ValueError):
    composition.advanced_composition(**kwargs)
  with pytest.raises(ValueError, match="bound"):
    composition.advanced_composition(0.1, 0.0, 10, 1e-5, bound="nope")


@pytest.mark.parametrize("total,k,slack", [(1.0, 100, 1e-6), (0.1, 10, 1e-5), (8.0, 1000, 1e-9)])
def test_per_query_closed_form_solves_the_quadratic(total, k, slack):
  e = composition.advanced_composition_per_query_epsilon(total, k, slack)
  log_term = math.log(1 / slack)
  assert math.sqrt(2 * k * log_term) * e + k * e**2 / 2 == pytest.approx(total, rel=1e-10)
  # Valid through Kairouz-Oh-Viswanath (tanh(x/2) <= x/2) ...
  assert composition.advanced_composition(e, 0.0, k, slack, "kov")[0] <= total * (1 + 1e-12)
  # ... and through zCDP for pure mechanisms (the accountant agrees).
  acc = PrivacyAccountant("add_remove")
  acc.spend(events.PureDpEvent(e), count=k)
  assert acc.get_epsilon(slack, "zcdp") <= total * (1 + 1e-9)


def test_paper_closed_form_overshoots_drv_bound():
  """The paper's Eq. 51 argument via DRV is invalid: DRV's total exceeds the target."""
  e = composition.advanced_composition_per_query_epsilon(1.0, 100, 1e-6)
  assert composition.advanced_composition(e, 0.0, 100, 1e-6, "drv")[0] > 1.0
  exact = composition.advanced_composition_per_query_epsilon_exact(1.0, 100, 1e-6, "drv")
  assert exact < e
  assert composition.advanced_composition(exact, 0.0, 100, 1e-6, "drv")[0] <= 1.0
  assert composition.advanced_composition(exact, 0.0, 100, 1e-6, "drv")[0] == pytest.approx(1.0, rel=1e-9)


@pytest.mark.parametrize("k", [1, 10, 100, 1000])
def test_per_query_gaussian_sigma_algorithm7(k):
  eps, delta, sens = 1.0, 1e-5, 0.02
  basic = composition.per_query_gaussian_sigma(eps, delta, k, sens, method="basic")
  assert basic.sigma == pytest.approx(analytic_gaussian_sigma(eps / k, delta / k, sens), rel=1e-12)
  adv = composition.per_query_gaussian_sigma(eps, delta, k, sens, method="advanced")
  best = composition.per_query_gaussian_sigma(eps, delta, k, sens, method="best")
  assert best.sigma == pytest.approx(min(basic.sigma, adv.sigma), rel=1e-12)
  # Advanced: delta split adds up and each query's (eps*, delta*) is the advertised one.
  assert 0 < adv.delta_slack < delta
  assert adv.delta_slack + k * adv.delta_per_query == pytest.approx(delta, rel=1e-9)
  assert adv.sigma == pytest.approx(
      analytic_gaussian_sigma(adv.epsilon_per_query, adv.delta_per_query, sens), rel=1e-9)
  # The search found (close to) the optimum over a fine independent grid.
  grid = np.geomspace(delta * 1e-4, delta * (1 - 1e-4), 200)
  brute = min(
      analytic_gaussian_sigma(composition.advanced_composition_per_query_epsilon(eps, k, s),
                              (delta - s) / k, sens) for s in grid)
  assert adv.sigma <= brute * (1 + 1e-3)
  # The total guarantee holds according to the PLD accountant (exact for Gaussians).
  acc = PrivacyAccountant("add_remove")
  acc.spend(events.GaussianDpEvent(best.sigma / sens), count=k)
  assert acc.get_epsilon(delta, "pld") <= eps * (1 + 1e-3)


def test_advanced_wins_for_large_budgets_basic_for_small():
  assert composition.per_query_gaussian_sigma(1.0, 1e-5, 1).method == "basic"
  assert composition.per_query_gaussian_sigma(1.0, 1e-5, 1000).method == "advanced"
