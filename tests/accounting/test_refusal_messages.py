"""What a refused spend says: the method that cannot bound it, or what was asked, spent and left."""

import numpy as np
import pytest

from jaxdp.accounting import PrivacyBudget, dpsgd_accounting, events
from jaxdp.accounting.accountant import UnsupportedEventError
from jaxdp.errors import BudgetExceededError
from jaxdp.training import PrivateLogisticRegression


def test_replace_one_sampled_gaussian_on_an_rdp_budget_names_the_method_that_can():
  budget = PrivacyBudget(10.0, 1e-5, method="rdp")
  event = dpsgd_accounting.dpsgd_event(1.0, 0.01, 10, neighbouring="replace_one")
  with pytest.raises(UnsupportedEventError, match=r"method='rdp'.*cannot account.*'pld'") as err:
    budget.spend(event)
  assert "inf" not in str(err.value)
  with pytest.raises(UnsupportedEventError, match="cannot account"):
    budget.can_spend(event)
  assert not budget.accountant.ledger
  # The methods that can bound it accept the same spend.
  for method in ("pld",):
    ok = PrivacyBudget(10.0, 1e-5, method=method)
    ok.spend(event)
    assert 0 < ok.spent_epsilon < 10


def test_over_budget_says_what_was_asked_spent_and_left_without_event_reprs():
  budget = PrivacyBudget(1.0, 1e-5, method="rdp")
  budget.spend(dpsgd_accounting.dpsgd_event(2.0, 0.01, 20))
  spent = budget.spent_epsilon
  with pytest.raises(BudgetExceededError) as err:
    budget.spend(dpsgd_accounting.dpsgd_event(2.0, 0.01, 100_000))
  text = str(err.value)
  assert "DpEvent(" not in text
  assert "PoissonSampled(sampling_probability=0.01) of Gaussian(noise_multiplier=2" in text
  assert f"spent so far {spent:.6g}, remaining {1.0 - spent:.6g}" in text
  assert "nothing was spent" in text
  assert budget.spent_epsilon == spent


def test_estimator_refusal_names_the_fit_and_the_budget_left():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(40, 3))
  x /= np.linalg.norm(x, axis=1, keepdims=True)
  y = (x[:, 0] > 0).astype(int)
  budget = PrivacyBudget(1.5, 0.0)
  PrivateLogisticRegression(epsilon=1.0, classes=[0, 1], accountant=budget, seed=0).fit(x, y)
  with pytest.raises(BudgetExceededError) as err:
    PrivateLogisticRegression(epsilon=1.0, classes=[0, 1], accountant=budget, seed=1).fit(x, y)
  text = str(err.value)
  assert "ComposedDpEvent(" not in text and "DpEvent(" not in text
  assert text.startswith("fitting PrivateLogisticRegression (")
  assert "spent so far 1, remaining 0.5" in text
  assert len(budget.accountant.ledger) == 1
