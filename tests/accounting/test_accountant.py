"""Tests of the shared accountant and the budget."""

import math

import numpy as np
import pytest

from jaxdp.accounting import (
    BudgetExceededError,
    PrivacyAccountant,
    PrivacyBudget,
    UnsupportedEventError,
    analytic_gaussian_epsilon,
    dpsgd_accounting,
    events,
    zcdp,
)
from dp_accounting import dp_event as raw

# These tests exercise the arithmetic; events are untagged, so the relation is declared.
REL = "add_remove"


def test_empty_ledger_spends_nothing():
  acc = PrivacyAccountant(REL)
  for method in ["pure", "basic", "rdp", "pld", "zcdp", "auto"]:
    assert acc.get_epsilon(1e-5, method) == 0.0


def test_pure_events_basic_composition():
  acc = PrivacyAccountant(REL)
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
  acc = PrivacyAccountant(REL)
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
  acc = PrivacyAccountant(REL)
  acc.spend(dpsgd_accounting.dpsgd_event(1.1, 0.01, 500))
  assert acc.get_epsilon(1e-5, "rdp") == pytest.approx(dpsgd_accounting.dpsgd_epsilon(1.1, 0.01, 500, 1e-5))


def test_exponential_mechanism_uses_bounded_range():
  acc = PrivacyAccountant(REL)
  acc.spend(events.ExponentialMechanismDpEvent(beta=0.05), count=400)
  rho = 400 * 0.05**2 / 2
  assert acc.zcdp_rho() == pytest.approx(rho)
  assert acc.get_epsilon(1e-5, "zcdp") == pytest.approx(zcdp.zcdp_to_approx_dp_tight(rho, 1e-5))
  assert acc.get_epsilon(1e-5, "auto") < acc.pure_epsilon() == pytest.approx(40.0)


def test_approx_events_and_poisson_amplification():
  acc = PrivacyAccountant(REL)
  acc.spend(events.ApproxDpEvent(0.5, 1e-6), count=2)
  assert acc.basic_epsilon_delta() == pytest.approx((1.0, 2e-6))
  assert acc.get_epsilon(1e-5, "basic") == pytest.approx(1.0)
  assert acc.get_epsilon(1e-6, "basic") == math.inf  # needs at least 2e-6
  with pytest.raises(UnsupportedEventError):
    acc.get_epsilon(1e-5, "rdp")
  assert acc.get_epsilon(1e-5, "pld") <= 1.0 + 1e-3
  amp = PrivacyAccountant(REL)
  amp.spend(events.PoissonSampledDpEvent(0.1, events.PureDpEvent(1.0)))
  assert amp.pure_epsilon() == pytest.approx(math.log1p(0.1 * math.expm1(1.0)))


def test_non_private_event_is_infinite():
  acc = PrivacyAccountant(REL)
  acc.spend(events.NonPrivateDpEvent())
  assert math.isinf(acc.get_epsilon(1e-5))


def test_state_round_trip():
  acc = PrivacyAccountant(REL)
  acc.spend(dpsgd_accounting.dpsgd_event(1.0, 0.01, 10))
  acc.spend(events.ComposedDpEvent([events.PureDpEvent(0.1), events.ZCDpEvent(0.01)]), count=2)
  restored = PrivacyAccountant.from_state_dict(acc.state_dict())
  assert restored.ledger == acc.ledger
  assert restored.get_epsilon(1e-5, "rdp") == acc.get_epsilon(1e-5, "rdp")


def test_budget_refuses_past_limit_and_spends_nothing():
  budget = PrivacyBudget(neighbouring=REL, epsilon=1.0)
  for _ in range(10):
    budget.spend(events.PureDpEvent(0.1))
  assert budget.spent_epsilon == pytest.approx(1.0)
  with pytest.raises(BudgetExceededError, match="nothing was spent"):
    budget.spend(events.PureDpEvent(1e-6))
  assert budget.spent_epsilon == pytest.approx(1.0)
  assert not budget.can_spend(events.PureDpEvent(1e-6))


def test_budget_batch_refused_whole():
  budget = PrivacyBudget(neighbouring=REL, epsilon=1.0)
  budget.spend(events.PureDpEvent(0.01), count=95)
  with pytest.raises(BudgetExceededError):
    budget.spend(events.PureDpEvent(0.01), count=10)
  assert budget.spent_epsilon == pytest.approx(0.95)
  budget.spend(events.PureDpEvent(0.01), count=5)


def test_budget_with_delta_uses_best_bound():
  budget = PrivacyBudget(neighbouring=REL, epsilon=2.0, delta=1e-5)
  z = 4.0
  n_ok = 0
  while budget.can_spend(events.GaussianDpEvent(z)):
    budget.spend(events.GaussianDpEvent(z))
    n_ok += 1
  # Exact: k Gaussians = one with multiplier z/sqrt(k); the budget admits (nearly) the largest k.
  assert analytic_gaussian_epsilon(z / math.sqrt(n_ok), 1e-5) <= 2.0 * (1 + 1e-3)
  assert analytic_gaussian_epsilon(z / math.sqrt(n_ok + 2), 1e-5) > 2.0


def test_budget_save_load(tmp_path):
  budget = PrivacyBudget(neighbouring=REL, epsilon=1.0, delta=0.0)
  budget.spend(events.PureDpEvent(0.7))
  path = tmp_path / "budget.json"
  budget.save(path)
  restored = PrivacyBudget.load(path)
  assert restored.spent_epsilon == pytest.approx(0.7)
  with pytest.raises(BudgetExceededError):
    restored.spend(events.PureDpEvent(0.5))


def test_bad_input():
  with pytest.raises(ValueError, match="epsilon"):
    PrivacyBudget(neighbouring=REL, epsilon=0.0)
  with pytest.raises(ValueError, match="delta"):
    PrivacyBudget(neighbouring=REL, epsilon=1.0, delta=1.0)
  with pytest.raises(ValueError, match="count"):
    PrivacyAccountant(REL).spend(events.PureDpEvent(0.1), count=0)
  with pytest.raises(TypeError, match="DpEvent"):
    PrivacyAccountant(REL).spend(0.1)
  with pytest.raises(ValueError, match="epsilon"):
    events.PureDpEvent(-0.1)
  with pytest.raises(ValueError, match="delta"):
    events.ApproxDpEvent(0.1, 1.5)
  with pytest.raises(ValueError, match="method"):
    PrivacyAccountant(REL).get_epsilon(1e-5, method="moments")


@pytest.mark.parametrize("event,field", [
    # raw dp_accounting events do not validate their fields (jaxdp's subclasses do)
    (raw.LaplaceDpEvent(noise_multiplier=-0.5), "noise_multiplier"),
    (raw.GaussianDpEvent(noise_multiplier=math.nan), "noise_multiplier"),
    (events.PoissonSampledDpEvent(-0.5, events.PureDpEvent(1.0)), "sampling_probability"),
    (events.PoissonSampledDpEvent(2.0, events.GaussianDpEvent(1.0)), "sampling_probability"),
    (events.SelfComposedDpEvent(events.PureDpEvent(1.0), -3), "count"),
    (events.ComposedDpEvent([events.PureDpEvent(0.1), raw.ZCDpEvent(-0.5)]), "rho"),
    (events.PoissonSampledDpEvent(0.1, raw.LaplaceDpEvent(noise_multiplier=-1.0)),
     "noise_multiplier"),
])
def test_malformed_events_are_refused_before_they_lower_the_total(event, field):
  # Without validation, LaplaceDpEvent(-0.5) counted eps = -2 and let a budget of 1 absorb 2.5.
  with pytest.raises(ValueError, match=field):
    PrivacyAccountant(REL).spend(event)
  budget = PrivacyBudget(neighbouring=REL, epsilon=1.0, delta=1e-5)
  with pytest.raises(ValueError, match=field):
    budget.spend(event)
  assert budget.accountant.ledger == ()
  with pytest.raises(ValueError, match=field):
    PrivacyAccountant.from_state_dict({"declared_neighbouring": REL,
                                       "ledger": [[events.event_to_dict(event), 1]]})


def test_infinite_epsilon_event_is_infinite_for_every_method():
  acc = PrivacyAccountant(REL)
  acc.spend(events.PureDpEvent(math.inf))
  for method in ["auto", "pure", "basic", "rdp", "pld"]:
    assert math.isinf(acc.get_epsilon(1e-5, method)), method
  budget = PrivacyBudget(neighbouring=REL, epsilon=10.0, delta=1e-5)
  with pytest.raises(BudgetExceededError):
    budget.spend(events.PureDpEvent(math.inf))
  # noise multiplier 0 (no noise) is a valid, non-private event
  zero = PrivacyAccountant(REL)
  zero.spend(events.LaplaceDpEvent(noise_multiplier=0.0))
  assert math.isinf(zero.get_epsilon(1e-5))


def test_budget_spend_is_atomic_across_threads(monkeypatch):
  """Two threads each spending 0.6 of a budget of 1: exactly one may succeed."""
  import threading
  import time
  budget = PrivacyBudget(neighbouring=REL, epsilon=1.0)
  original = PrivacyBudget._within_limit

  def slow_check(self, acc):
    time.sleep(0.05)  # widen the check-then-commit window
    return original(self, acc)

  monkeypatch.setattr(PrivacyBudget, "_within_limit", slow_check)
  outcomes = []

  def worker():
    try:
      budget.spend(events.PureDpEvent(0.6))
      outcomes.append("spent")
    except BudgetExceededError:
      outcomes.append("refused")

  threads = [threading.Thread(target=worker) for _ in range(2)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert sorted(outcomes) == ["refused", "spent"]
  assert budget.spent_epsilon == pytest.approx(0.6)


def test_budget_save_is_durable(tmp_path, monkeypatch):
  import os
  synced = []
  real_fsync = os.fsync
  monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
  budget = PrivacyBudget(neighbouring=REL, epsilon=1.0)
  budget.spend(events.PureDpEvent(0.3))
  budget.save(tmp_path / "b.json")
  assert synced  # flushed to disk before os.replace
  assert PrivacyBudget.load(tmp_path / "b.json").spent_epsilon == pytest.approx(0.3)


@pytest.mark.parametrize("eps,k", [(0.05, 400), (1.0, 3), (3.0, 2)])
def test_rdp_of_pure_and_exponential_events_pins_the_curve(eps, k):
  """RDP of eps-DP is min(eps, alpha eps^2/2); of the exponential mechanism min(2 b, alpha b^2/2)."""
  from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib
  orders = np.asarray(rdp_lib.DEFAULT_RDP_ORDERS, dtype=np.float64)
  delta = 1e-6
  acc = PrivacyAccountant(REL)
  acc.spend(events.PureDpEvent(eps), count=k)
  expected = rdp_lib.compute_epsilon(orders, k * np.minimum(eps, orders * eps**2 / 2), delta)[0]
  assert acc.get_epsilon(delta, "rdp") == pytest.approx(expected, rel=1e-12)
  beta = eps / 2  # the exponential mechanism with 2 beta = eps: same pure eps, same zCDP rho
  em = PrivacyAccountant(REL)
  em.spend(events.ExponentialMechanismDpEvent(beta=beta), count=k)
  expected_em = rdp_lib.compute_epsilon(
      orders, k * np.minimum(2 * beta, orders * beta**2 / 2), delta)[0]
  assert em.get_epsilon(delta, "rdp") == pytest.approx(expected_em, rel=1e-12)
  # bounded range makes the exponential mechanism no costlier than generic eps-DP, and much
  # cheaper when many small answers compose (rho = eps^2/8 instead of eps^2/2)
  assert em.get_epsilon(delta, "rdp") <= acc.get_epsilon(delta, "rdp")
  if k >= 100:
    assert em.get_epsilon(delta, "rdp") < 0.7 * acc.get_epsilon(delta, "rdp")


def _exact_pure_composition_epsilon(eps, k, delta):
  """Optimal k-fold composition of eps-DP (Kairouz, Oh & Viswanath 2015, Thm 3.3).

  The dominating pair is randomized response: under P the loss is (k - 2j) eps with
  j ~ Binomial(k, 1/(1 + e^eps)); delta(e') = E_P[(1 - e^{e' - L})_+]. Bisection on e'.
  """
  from scipy import optimize, stats
  j = np.arange(k + 1)
  pmf = stats.binom.pmf(j, k, 1.0 / (1.0 + math.exp(eps)))
  loss = (k - 2 * j) * eps

  def excess(e):
    return float(np.sum(pmf * np.maximum(0.0, 1.0 - np.exp(e - loss)))) - delta
  return optimize.brentq(excess, 0.0, k * eps, xtol=1e-12)


@pytest.mark.parametrize("eps,k", [(0.1, 50), (0.5, 10)])
def test_pld_of_pure_events_is_the_optimal_composition(eps, k):
  delta = 1e-5
  acc = PrivacyAccountant(REL)
  acc.spend(events.PureDpEvent(eps), count=k)
  exact = _exact_pure_composition_epsilon(eps, k, delta)
  got = acc.get_epsilon(delta, "pld")
  assert exact * (1 - 1e-6) <= got <= exact + 5e-3  # pessimistic discretisation only
  # an ApproxDpEvent(eps, 0) is the same mechanism
  approx = PrivacyAccountant(REL)
  approx.spend(events.ApproxDpEvent(eps, 0.0), count=k)
  assert approx.get_epsilon(delta, "pld") == pytest.approx(got, rel=1e-9)


def test_poisson_amplification_of_approx_event():
  acc = PrivacyAccountant(REL)
  acc.spend(events.PoissonSampledDpEvent(0.2, events.ApproxDpEvent(1.0, 1e-6)), count=3)
  eps, delta = acc.basic_epsilon_delta()
  assert eps == pytest.approx(3 * math.log1p(0.2 * math.expm1(1.0)), rel=1e-12)
  assert delta == pytest.approx(3 * 0.2 * 1e-6, rel=1e-12)


def test_events_with_numpy_scalars_are_recorded_and_saved(tmp_path):
  budget = PrivacyBudget(neighbouring=REL, epsilon=5.0, delta=1e-5)
  budget.spend(events.SelfComposedDpEvent(events.GaussianDpEvent(np.float32(4.0)), np.int64(3)))
  budget.spend(events.PureDpEvent(np.float64(0.1)))
  # the ledger holds Python floats: no float32 arithmetic reaches dp_accounting
  recorded = budget.accountant.ledger[0][0]
  assert type(recorded.event.noise_multiplier) is float and type(recorded.count) is int
  reference = PrivacyAccountant(REL)
  reference.spend(events.SelfComposedDpEvent(events.GaussianDpEvent(4.0), 3))
  reference.spend(events.PureDpEvent(0.1))
  assert budget.spent_epsilon == reference.get_epsilon(1e-5)
  budget.save(tmp_path / "b.json")
  restored = PrivacyBudget.load(tmp_path / "b.json")
  assert restored.spent_epsilon == pytest.approx(budget.spent_epsilon, rel=1e-12)


def test_budget_can_be_copied_and_pickled():
  import copy
  import pickle
  budget = PrivacyBudget(neighbouring=REL, epsilon=1.0)
  budget.spend(events.PureDpEvent(0.4))
  for clone in (copy.deepcopy(budget), pickle.loads(pickle.dumps(budget))):
    assert clone.spent_epsilon == pytest.approx(0.4)
    with pytest.raises(BudgetExceededError):
      clone.spend(events.PureDpEvent(0.7))
    clone.spend(events.PureDpEvent(0.6))
  assert budget.spent_epsilon == pytest.approx(0.4)  # copies are independent
