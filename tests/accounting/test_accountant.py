"""Tests of the shared accountant and the budget."""

import math

import pytest

from jaxdp.accounting import (
    BudgetExceededError,
    PrivacyAccountant,
    PrivacyBudget,
    UnsupportedEventError,
    analytic_gaussian_epsilon,
    dpsgd,
    events,
    zcdp,
)


def test_empty_ledger_spends_nothing():
  acc = PrivacyAccountant()
  for method in ["pure", "basic", "rdp", "pld", "zcdp", "auto"]:
    assert acc.get_epsilon(1e-5, method) == 0.0


def test_pure_events_basic_composition():
  acc = PrivacyAccountant()
  acc.spend(events.PureDpEvent(0.3), count=3)
  acc.spend(events.LaplaceDpEvent(noise_multiplier=2.0))  # eps = 1/2
  acc.spend(events.ExponentialMechanismDpEvent(beta=0.1))  # eps = 2 * beta
  assert acc.pure_epsilon() == pytest.approx(0.9 + 0.5 + 0.2)
  assert acc.get_epsilon(0.0) == pytest.approx(1.6)
  assert len(acc.ledger) == 3  # repeated events are merged
  # zCDP: (0.3^2/2)*3 + 0.5^2/2 + 0.1^2/2.
  assert acc.zcdp_rho() == pytest.approx(3 * 0.045 + 0.125 + 0.005)


def test_gaussian_pld_matches_exact_composition():
  # k Gaussians with multiplier z compose exactly to one Gaussian with multiplier z/sqrt(k).
  acc = PrivacyAccountant()
  acc.spend(events.GaussianDpEvent(2.0), count=10)
  exact = analytic_gaussian_epsilon(2.0 / math.sqrt(10), 1e-5)
  assert acc.get_epsilon(1e-5, "pld") == pytest.approx(exact, rel=1e-3)
  assert acc.get_epsilon(1e-5, "rdp") >= exact
  assert acc.get_epsilon(1e-5, "zcdp") >= exact
  assert acc.get_epsilon(1e-5, "auto") == pytest.approx(exact, rel=1e-3)
  assert math.isinf(acc.pure_epsilon())
  with pytest.raises(UnsupportedEventError):
    acc.get_epsilon(1e-5, "basic")


def test_dpsgd_event_matches_dpsgd_epsilon():
  acc = PrivacyAccountant()
  acc.spend(dpsgd.dpsgd_event(1.1, 0.01, 500))
  assert acc.get_epsilon(1e-5, "rdp") == pytest.approx(dpsgd.dpsgd_epsilon(1.1, 0.01, 500, 1e-5))


def test_exponential_mechanism_uses_bounded_range():
  acc = PrivacyAccountant()
  acc.spend(events.ExponentialMechanismDpEvent(beta=0.05), count=400)
  rho = 400 * 0.05**2 / 2
  assert acc.zcdp_rho() == pytest.approx(rho)
  assert acc.get_epsilon(1e-5, "zcdp") == pytest.approx(zcdp.zcdp_to_approx_dp_tight(rho, 1e-5))
  assert acc.get_epsilon(1e-5, "auto") < acc.pure_epsilon() == pytest.approx(40.0)


def test_approx_events_and_poisson_amplification():
  acc = PrivacyAccountant()
  acc.spend(events.ApproxDpEvent(0.5, 1e-6), count=2)
  assert acc.basic_epsilon_delta() == pytest.approx((1.0, 2e-6))
  assert acc.get_epsilon(1e-5, "basic") == pytest.approx(1.0)
  assert acc.get_epsilon(1e-6, "basic") == math.inf  # needs at least 2e-6
  with pytest.raises(UnsupportedEventError):
    acc.get_epsilon(1e-5, "rdp")
  assert acc.get_epsilon(1e-5, "pld") <= 1.0 + 1e-3
  amp = PrivacyAccountant()
  amp.spend(events.PoissonSampledDpEvent(0.1, events.PureDpEvent(1.0)))
  assert amp.pure_epsilon() == pytest.approx(math.log1p(0.1 * math.expm1(1.0)))


def test_non_private_event_is_infinite():
  acc = PrivacyAccountant()
  acc.spend(events.NonPrivateDpEvent())
  assert math.isinf(acc.get_epsilon(1e-5))


def test_state_round_trip():
  acc = PrivacyAccountant()
  acc.spend(dpsgd.dpsgd_event(1.0, 0.01, 10))
  acc.spend(events.ComposedDpEvent([events.PureDpEvent(0.1), events.ZCDpEvent(0.01)]), count=2)
  restored = PrivacyAccountant.from_state_dict(acc.state_dict())
  assert restored.ledger == acc.ledger
  assert restored.get_epsilon(1e-5, "rdp") == acc.get_epsilon(1e-5, "rdp")


def test_budget_refuses_past_limit_and_spends_nothing():
  budget = PrivacyBudget(epsilon=1.0)
  for _ in range(10):
    budget.spend(events.PureDpEvent(0.1))
  assert budget.spent_epsilon() == pytest.approx(1.0)
  with pytest.raises(BudgetExceededError, match="nothing was spent"):
    budget.spend(events.PureDpEvent(1e-6))
  assert budget.spent_epsilon() == pytest.approx(1.0)
  assert not budget.can_spend(events.PureDpEvent(1e-6))


def test_budget_batch_refused_whole():
  budget = PrivacyBudget(epsilon=1.0)
  budget.spend(events.PureDpEvent(0.01), count=95)
  with pytest.raises(BudgetExceededError):
    budget.spend(events.PureDpEvent(0.01), count=10)
  assert budget.spent_epsilon() == pytest.approx(0.95)
  budget.spend(events.PureDpEvent(0.01), count=5)


def test_budget_with_delta_uses_best_bound():
  budget = PrivacyBudget(epsilon=2.0, delta=1e-5)
  z = 4.0
  n_ok = 0
  while budget.can_spend(events.GaussianDpEvent(z)):
    budget.spend(events.GaussianDpEvent(z))
    n_ok += 1
  # Exact: k Gaussians = one with multiplier z/sqrt(k); the budget admits (nearly) the largest k.
  assert analytic_gaussian_epsilon(z / math.sqrt(n_ok), 1e-5) <= 2.0 * (1 + 1e-3)
  assert analytic_gaussian_epsilon(z / math.sqrt(n_ok + 2), 1e-5) > 2.0


def test_budget_save_load(tmp_path):
  budget = PrivacyBudget(epsilon=1.0, delta=0.0)
  budget.spend(events.PureDpEvent(0.7))
  path = tmp_path / "budget.json"
  budget.save(path)
  restored = PrivacyBudget.load(path)
  assert restored.spent_epsilon() == pytest.approx(0.7)
  with pytest.raises(BudgetExceededError):
    restored.spend(events.PureDpEvent(0.5))


def test_bad_input():
  with pytest.raises(ValueError, match="epsilon"):
    PrivacyBudget(epsilon=0.0)
  with pytest.raises(ValueError, match="delta"):
    PrivacyBudget(epsilon=1.0, delta=1.0)
  with pytest.raises(ValueError, match="count"):
    PrivacyAccountant().spend(events.PureDpEvent(0.1), count=0)
  with pytest.raises(ValueError, match="DpEvent"):
    PrivacyAccountant().spend(0.1)
  with pytest.raises(ValueError, match="epsilon"):
    events.PureDpEvent(-0.1)
  with pytest.raises(ValueError, match="delta"):
    events.ApproxDpEvent(0.1, 1.5)
  with pytest.raises(ValueError, match="method"):
    PrivacyAccountant().get_epsilon(1e-5, method="moments")


@pytest.mark.parametrize("event,field", [
    (events.LaplaceDpEvent(noise_multiplier=-0.5), "noise_multiplier"),
    (events.GaussianDpEvent(noise_multiplier=math.nan), "noise_multiplier"),
    (events.PoissonSampledDpEvent(-0.5, events.PureDpEvent(1.0)), "sampling_probability"),
    (events.PoissonSampledDpEvent(2.0, events.GaussianDpEvent(1.0)), "sampling_probability"),
    (events.SelfComposedDpEvent(events.PureDpEvent(1.0), -3), "count"),
    (events.ComposedDpEvent([events.PureDpEvent(0.1), events.ZCDpEvent(-0.5)]), "rho"),
    (events.PoissonSampledDpEvent(0.1, events.LaplaceDpEvent(noise_multiplier=-1.0)),
     "noise_multiplier"),
])
def test_malformed_events_are_refused_before_they_lower_the_total(event, field):
  # Without validation, LaplaceDpEvent(-0.5) counted eps = -2 and let a budget of 1 absorb 2.5.
  with pytest.raises(ValueError, match=field):
    PrivacyAccountant().spend(event)
  budget = PrivacyBudget(epsilon=1.0, delta=1e-5)
  with pytest.raises(ValueError, match=field):
    budget.spend(event)
  assert budget.accountant.ledger == ()
  with pytest.raises(ValueError, match=field):
    PrivacyAccountant.from_state_dict({"ledger": [[events.event_to_dict(event), 1]]})


def test_infinite_epsilon_event_is_infinite_for_every_method():
  acc = PrivacyAccountant()
  acc.spend(events.PureDpEvent(math.inf))
  for method in ["auto", "pure", "basic", "rdp", "pld"]:
    assert math.isinf(acc.get_epsilon(1e-5, method)), method
  budget = PrivacyBudget(epsilon=10.0, delta=1e-5)
  with pytest.raises(BudgetExceededError):
    budget.spend(events.PureDpEvent(math.inf))
  # noise multiplier 0 (no noise) is a valid, non-private event
  zero = PrivacyAccountant()
  zero.spend(events.LaplaceDpEvent(noise_multiplier=0.0))
  assert math.isinf(zero.get_epsilon(1e-5))
