"""The accountant's support of RepeatAndSelectDpEvent (Papernot & Steinke 2022; Liu & Talwar 2019)."""

import json
import math

import pytest
from dp_accounting import dp_event as dpa
from dp_accounting.rdp import rdp_privacy_accountant as dpa_rdp

from jaxdp.accounting import PrivacyAccountant, PrivacyBudget, UnsupportedEventError, events
from jaxdp.errors import BudgetExceededError

SHAPES = (0.0, 0.5, 1.0, 3.0, math.inf)


@pytest.mark.parametrize("shape", SHAPES)
def test_rdp_equals_dp_accounting(shape):
  inner = events.GaussianDpEvent(1.5, neighbouring="add_remove")
  acc = PrivacyAccountant()
  acc.spend(events.RepeatAndSelectDpEvent(inner, 10.0, shape))
  ref = dpa_rdp.RdpAccountant()
  ref.compose(dpa.RepeatAndSelectDpEvent(dpa.GaussianDpEvent(1.5), 10.0, shape))
  assert acc.get_epsilon(1e-5, "rdp") == pytest.approx(ref.get_epsilon(1e-5), rel=1e-12)
  assert acc.get_epsilon(1e-5) == pytest.approx(ref.get_epsilon(1e-5), rel=1e-12)  # auto
  # more than one run, much less than 10 runs composed
  one = PrivacyAccountant()
  one.spend(inner)
  ten = PrivacyAccountant()
  ten.spend(inner, 10)
  assert one.get_epsilon(1e-5) < acc.get_epsilon(1e-5) < ten.get_epsilon(1e-5, "rdp")


@pytest.mark.parametrize("method", ["pld", "basic", "zcdp"])
def test_other_methods_refuse_naming_rdp(method):
  acc = PrivacyAccountant()
  acc.spend(events.RepeatAndSelectDpEvent(events.GaussianDpEvent(1.5, neighbouring="add_remove"),
                                          5.0, 1.0))
  with pytest.raises(UnsupportedEventError, match="rdp"):
    acc.get_epsilon(1e-5, method)


def test_pure_bound_liu_talwar_and_tnb():
  run = events.PureDpEvent(0.4, neighbouring="replace_one")
  for shape, factor in ((1.0, 3.0), (0.0, 2.0), (2.0, 4.0)):
    acc = PrivacyAccountant()
    acc.spend(events.RepeatAndSelectDpEvent(run, 7.0, shape))
    assert acc.get_epsilon(0.0, "pure") == pytest.approx(factor * 0.4)
    assert acc.get_epsilon(0.0) == pytest.approx(factor * 0.4)  # auto at delta = 0
    assert acc.neighbouring == "replace_one"  # the inner event's relation
  poisson = PrivacyAccountant()
  poisson.spend(events.RepeatAndSelectDpEvent(run, 7.0, math.inf))
  with pytest.raises(UnsupportedEventError, match="rdp"):
    poisson.get_epsilon(0.0, "pure")
  assert math.isfinite(poisson.get_epsilon(1e-6, "rdp"))


def test_relation_tags_serialisation_and_validation():
  inner = events.LaplaceDpEvent(2.0, neighbouring="replace_one", unit="party")
  event = events.RepeatAndSelectDpEvent(inner, 4.0, math.inf)
  assert events.leaf_tags(event) == {("replace_one", "party")}
  acc = PrivacyAccountant(unit="party")
  acc.spend(event)
  state = json.loads(json.dumps(acc.state_dict()))
  assert PrivacyAccountant.from_state_dict(state).get_epsilon(1e-6) == acc.get_epsilon(1e-6)
  with pytest.raises(ValueError, match="neighbours"):
    PrivacyAccountant(unit="party").spend(events.ComposedDpEvent(
        [event, events.LaplaceDpEvent(1.0, neighbouring="add_remove", unit="party")]))
  for bad in (events.RepeatAndSelectDpEvent(inner, 0.5, 1.0),
              events.RepeatAndSelectDpEvent(inner, 4.0, -1.0),
              events.RepeatAndSelectDpEvent(inner, math.nan, 1.0)):
    with pytest.raises(ValueError):
      PrivacyAccountant(unit="party").spend(bad)


def test_budget_refuses_before_spending():
  budget = PrivacyBudget(1.0)
  event = events.RepeatAndSelectDpEvent(events.PureDpEvent(0.4, neighbouring="add_remove"), 5.0, 1.0)
  with pytest.raises(BudgetExceededError):
    budget.spend(event)  # 3 x 0.4 = 1.2 > 1
  assert budget.spent_epsilon == 0.0
