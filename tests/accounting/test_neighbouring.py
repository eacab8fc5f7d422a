"""One neighbouring relation (and privacy unit) per ledger; event validation."""

import math

import pytest
from dp_accounting import dp_event as raw

from jaxdp.accounting import (
    BudgetExceededError,
    NeighbouringRelation,
    PrivacyAccountant,
    PrivacyBudget,
    analytic_gaussian_epsilon,
    dpsgd_accounting,
    events,
)

ADD, REPLACE = "add_remove", "replace_one"


def _tags(event):
  return events.leaf_tags(event)


# -- mixing relations -----------------------------------------------------------------------------


def test_accountant_refuses_to_compose_two_relations():
  """DP-SGD (add/remove) then output perturbation (replace-one): refused, naming both."""
  from jaxdp.training import output_perturbation_calibration
  acc = PrivacyAccountant()
  acc.spend(dpsgd_accounting.dpsgd_event(1.1, 0.01, 100))
  assert acc.neighbouring == ADD
  cal = output_perturbation_calibration(num_examples=1000, l2_reg=0.1, epsilon=1.0)
  with pytest.raises(ValueError, match="replace_one.*add_remove"):
    acc.spend(cal.event)
  assert len(acc.ledger) == 1  # nothing was recorded
  # the other order is refused too
  other = PrivacyAccountant()
  other.spend(cal.event)
  with pytest.raises(ValueError, match="add_remove.*replace_one"):
    other.spend(dpsgd_accounting.dpsgd_event(1.1, 0.01, 100))


def test_budget_refuses_mixed_relations_and_spends_nothing():
  budget = PrivacyBudget(epsilon=10.0, delta=1e-5)
  budget.spend(events.PureDpEvent(0.5, neighbouring=REPLACE))
  with pytest.raises(ValueError, match="add_remove"):
    budget.spend(events.GaussianDpEvent(5.0, neighbouring=ADD))
  assert budget.accountant.ledger == ((events.PureDpEvent(0.5, neighbouring=REPLACE), 1),)
  assert budget.neighbouring == REPLACE


def test_mixed_relations_inside_one_event_are_refused():
  mixed = events.ComposedDpEvent([events.PureDpEvent(0.1, neighbouring=ADD),
                                  events.PureDpEvent(0.1, neighbouring=REPLACE)])
  with pytest.raises(ValueError, match="neighbours"):
    PrivacyAccountant().spend(mixed)


def test_declared_relation_refuses_other_tags_and_accepts_untagged():
  acc = PrivacyAccountant(neighbouring=REPLACE)
  with pytest.raises(ValueError, match="add_remove"):
    acc.spend(events.PureDpEvent(0.1, neighbouring=ADD))
  acc.spend(raw.GaussianDpEvent(2.0))  # untagged: taken to be proven for the declared relation
  acc.spend(events.PureDpEvent(0.1, neighbouring=REPLACE))
  assert acc.neighbouring == REPLACE and len(acc.ledger) == 2


def test_untagged_events_need_a_declared_relation():
  for untagged in (raw.GaussianDpEvent(1.0), events.PureDpEvent(0.5),
                   raw.SelfComposedDpEvent(raw.LaplaceDpEvent(1.0), 3)):
    with pytest.raises(ValueError, match="no neighbouring relation"):
      PrivacyAccountant().spend(untagged)
    with pytest.raises(ValueError, match="no neighbouring relation"):
      PrivacyBudget(epsilon=100.0, delta=1e-5).spend(untagged)
    PrivacyAccountant(neighbouring=ADD).spend(untagged)
  # an accountant that only ADOPTED a relation still refuses untagged events
  acc = PrivacyAccountant()
  acc.spend(events.PureDpEvent(0.5, neighbouring=ADD))
  with pytest.raises(ValueError, match="no neighbouring relation"):
    acc.spend(raw.GaussianDpEvent(1.0))


def test_units_must_match():
  acc = PrivacyAccountant()
  with pytest.raises(ValueError, match="unit"):
    acc.spend(events.PureDpEvent(0.5, neighbouring=ADD, unit="party"))
  party = PrivacyAccountant(unit="party")
  party.spend(events.PureDpEvent(0.5, neighbouring=ADD, unit="party"))
  with pytest.raises(ValueError, match="unit"):
    party.spend(events.PureDpEvent(0.5, neighbouring=ADD))
  assert party.guarantee(0.0).unit == "party"
  assert _tags(dpsgd_accounting.dpsgd_event(1.0, 0.1, 3, unit="party")) == {(ADD, "party")}


def test_replace_one_ledger_refuses_subsampled_events():
  acc = PrivacyAccountant(neighbouring=REPLACE)
  with pytest.raises(ValueError, match="subsampled"):
    acc.spend(raw.PoissonSampledDpEvent(0.1, raw.GaussianDpEvent(1.0)))
  tagged = events.PoissonSampledDpEvent(0.1, events.PureDpEvent(1.0, neighbouring=REPLACE))
  with pytest.raises(ValueError, match="subsampled"):
    PrivacyAccountant().spend(tagged)


def test_no_op_and_non_private_events_fit_any_ledger():
  for relation in (ADD, REPLACE):
    acc = PrivacyAccountant()
    acc.spend(events.NoOpDpEvent())
    acc.spend(events.NonPrivateDpEvent())
    acc.spend(events.PureDpEvent(0.1, neighbouring=relation))
    assert acc.neighbouring == relation


# -- the guarantee names its relation ---------------------------------------------------------------


def test_guarantee_and_repr_name_the_relation():
  acc = PrivacyAccountant()
  acc.spend(dpsgd_accounting.dpsgd_event(1.1, 0.01, 100))
  g = acc.guarantee(1e-5)
  assert g.epsilon == acc.get_epsilon(1e-5) and g.delta == 1e-5
  assert (g.neighbouring, g.unit, g.method) == (ADD, "example", "auto")
  assert "add_remove" in str(g) and "add_remove" in repr(acc)
  budget = PrivacyBudget(epsilon=1.0)
  budget.spend(events.PureDpEvent(0.25, neighbouring=REPLACE))
  assert budget.guarantee().neighbouring == REPLACE
  assert "replace_one" in repr(budget)


def test_relation_spellings():
  from dp_accounting import NeighboringRelation
  assert events.check_neighbouring(NeighboringRelation.ADD_OR_REMOVE_ONE) == ADD
  assert events.check_neighbouring(NeighbouringRelation.REPLACE_ONE) == REPLACE
  assert events.PureDpEvent(1.0, neighbouring=NeighboringRelation.REPLACE_ONE).neighbouring == REPLACE
  with pytest.raises(ValueError, match="neighbouring"):
    events.check_neighbouring(NeighboringRelation.REPLACE_SPECIAL)
  with pytest.raises(ValueError, match="neighbouring"):
    events.PureDpEvent(1.0, neighbouring="replace")
  with pytest.raises(TypeError, match="neighbouring"):
    PrivacyAccountant(neighbouring=1)
  with pytest.raises(TypeError, match="unit"):
    events.PureDpEvent(1.0, neighbouring=ADD, unit="")


# -- serialisation round-trips the tags ------------------------------------------------------------


@pytest.mark.parametrize("event", [
    events.PureDpEvent(0.5, neighbouring=REPLACE),
    events.ApproxDpEvent(0.5, 1e-6, neighbouring=ADD, unit="party"),
    events.GaussianDpEvent(2.0, neighbouring=REPLACE),
    events.LaplaceDpEvent(2.0, neighbouring=ADD),
    events.ZCDpEvent(0.1, neighbouring=REPLACE),
    events.ExponentialMechanismDpEvent(0.2, 2.0, neighbouring=REPLACE),
    dpsgd_accounting.dpsgd_event(1.0, 0.1, 7),
])
def test_tags_round_trip(event, tmp_path):
  assert events.event_from_dict(events.event_to_dict(event)) == event
  (unit,) = {u for _, u in _tags(event)}
  acc = PrivacyAccountant(unit=unit)
  acc.spend(event, count=2)
  restored = PrivacyAccountant.from_state_dict(acc.state_dict())
  assert restored.ledger == acc.ledger and restored.neighbouring == acc.neighbouring
  assert restored.unit == acc.unit == unit
  budget = PrivacyBudget(epsilon=1e6, delta=1e-5, unit=unit)
  budget.spend(event)
  budget.save(tmp_path / "b.json")
  loaded = PrivacyBudget.load(tmp_path / "b.json")
  assert loaded.accountant.ledger == budget.accountant.ledger
  assert (loaded.neighbouring, loaded.unit) == (budget.neighbouring, unit)


def test_declared_relation_round_trips():
  acc = PrivacyAccountant(neighbouring=ADD)
  acc.spend(raw.GaussianDpEvent(2.0))
  restored = PrivacyAccountant.from_state_dict(acc.state_dict())
  assert restored.neighbouring == ADD
  restored.spend(raw.GaussianDpEvent(3.0))  # still declared: untagged events still accepted


def test_with_neighbouring_tags_every_leaf():
  tree = raw.ComposedDpEvent([raw.GaussianDpEvent(1.0),
                              raw.SelfComposedDpEvent(raw.LaplaceDpEvent(2.0), 3)])
  tagged = events.with_neighbouring(tree, REPLACE)
  assert _tags(tagged) == {(REPLACE, "example")}
  with pytest.raises(ValueError, match="already tagged"):
    events.with_neighbouring(events.PureDpEvent(1.0, neighbouring=ADD), REPLACE)


# -- library methods tag their events --------------------------------------------------------------


def test_library_events_carry_their_relation():
  from jaxdp import mechanisms as mech
  from jaxdp.prediction import pate, prediction_sensitivity, subsample_aggregate
  from jaxdp.training import (loss_perturbation_calibration, objective_perturbation_calibration,
                              output_perturbation_calibration)
  from jaxdp.training.functional_mechanism import functional_mechanism_calibration
  add = {(ADD, "example")}
  rep = {(REPLACE, "example")}
  # DP-SGD with Poisson sampling: add/remove.
  assert _tags(dpsgd_accounting.dpsgd_event(1.0, 0.01, 10)) == add
  # ERM methods (paper 000 Lemma 1 / paper 003): replace-one.
  for kwargs in ({"epsilon": 1.0}, {"epsilon": 1.0, "delta": 1e-5}, {"rho": 0.1}):
    cal = output_perturbation_calibration(num_examples=100, l2_reg=0.1, **kwargs)
    assert _tags(cal.event) == rep, kwargs
  for delta in (0.0, 1e-5):
    cal = loss_perturbation_calibration(epsilon=1.0, delta=delta, num_examples=100, num_classes=3)
    assert _tags(cal.event) == rep
  cal = loss_perturbation_calibration(epsilon=1.0, num_examples=100, num_classes=3,
                                      neighbouring=ADD, l2_reg=0.0)
  assert _tags(cal.event) == add
  obj = objective_perturbation_calibration(epsilon=1.0, num_examples=1000, l2_reg=0.1)
  assert _tags(obj.event) == rep
  assert _tags(functional_mechanism_calibration("logistic", 3, 1.0).event) == rep
  # Prediction methods: replace-one.
  for delta in (0.0, 1e-5):  # L2-Laplace, Gaussian
    pcal = prediction_sensitivity.calibrate_prediction_sensitivity(1.0, delta, 10, 1000, 0.1)
    assert _tags(pcal.query_event()) == rep
  assert _tags(subsample_aggregate.exponential_aggregation_event(0.1)) == rep
  for mechanism, scale in (("lnmax", 4.0), ("gnmax", 4.0)):
    assert _tags(pate.noisy_max_event(mechanism, scale)) == rep
  # Generic mechanisms: the relation the caller's sensitivity was computed for.
  assert _tags(mech.laplace_mechanism_event(1.0, 0.5)) == add  # documented default
  assert _tags(mech.laplace_mechanism_event(1.0, 0.5, neighbouring=REPLACE)) == rep
  assert _tags(mech.gaussian_mechanism_event(1.0, 0.5, 1e-5, neighbouring=REPLACE)) == rep
  assert _tags(mech.l2_laplace_mechanism_event(1.0, 0.5, neighbouring=REPLACE)) == rep
  assert _tags(mech.exponential_mechanism_event(0.5, neighbouring=REPLACE, unit="party")) == {
      (REPLACE, "party")}


# -- explicit conversion add/remove -> replace-one -------------------------------------------------


def test_replace_one_conversion_is_group_privacy_with_k_2():
  ev_pure = events.replace_one_from_add_remove(0.5)
  assert ev_pure == events.PureDpEvent(1.0, neighbouring=REPLACE)
  ev_approx = events.replace_one_from_add_remove(0.5, 1e-6)
  assert ev_approx.epsilon == 1.0
  assert ev_approx.delta == pytest.approx((1 + math.exp(0.5)) * 1e-6, rel=1e-15)
  assert ev_approx.neighbouring == REPLACE
  with pytest.raises(ValueError, match=">= 1"):
    events.replace_one_from_add_remove(5.0, 0.01)


@pytest.mark.parametrize("sigma,delta", [(1.0, 1e-5), (3.0, 1e-6), (0.7, 1e-3)])
def test_replace_one_conversion_is_sound_for_the_gaussian(sigma, delta):
  """Gaussian of add/remove sensitivity 1 has replace-one sensitivity 2 (exact curve: sigma/2)."""
  eps_add = analytic_gaussian_epsilon(sigma, delta)
  converted = events.replace_one_from_add_remove(eps_add, delta)
  exact_replace = analytic_gaussian_epsilon(sigma / 2.0, converted.delta)
  assert exact_replace <= converted.epsilon * (1 + 1e-9)


def test_replace_one_conversion_is_tight_for_laplace():
  """Laplace of add/remove L1 sensitivity 1, scale b: replace-one costs exactly 2/b."""
  b = 4.0
  converted = events.replace_one_from_add_remove(1.0 / b)
  exact = PrivacyAccountant()
  exact.spend(events.LaplaceDpEvent(b / 2.0, neighbouring=REPLACE))  # replace-one Delta_1 = 2
  assert exact.pure_epsilon() == pytest.approx(converted.epsilon, rel=1e-15)


# -- bad events -------------------------------------------------------------------------------------


@pytest.mark.parametrize("make,error,match", [
    (lambda: events.PureDpEvent(0), ValueError, "NoOpDpEvent"),
    (lambda: events.PureDpEvent(0.0), ValueError, "NoOpDpEvent"),
    (lambda: events.PureDpEvent(-1.0), ValueError, "epsilon"),
    (lambda: events.PureDpEvent(math.nan), ValueError, "epsilon"),
    (lambda: events.PureDpEvent("1.0"), TypeError, "epsilon"),
    (lambda: events.PureDpEvent(True), TypeError, "epsilon"),
    (lambda: events.PureDpEvent(None), TypeError, "epsilon"),
    (lambda: events.ApproxDpEvent(0.0, 0.0), ValueError, "NoOpDpEvent"),
    (lambda: events.ApproxDpEvent("0.5", 1e-5), TypeError, "epsilon"),
    (lambda: events.ApproxDpEvent(0.5, True), TypeError, "delta"),
    (lambda: events.ApproxDpEvent(0.5, 1.0), ValueError, "delta"),
    (lambda: events.ExponentialMechanismDpEvent(0.0), ValueError, "beta"),
    (lambda: events.ExponentialMechanismDpEvent(True), TypeError, "beta"),
    (lambda: events.ExponentialMechanismDpEvent(0.1, 0.0), ValueError, "sensitivity"),
    (lambda: events.ExponentialMechanismDpEvent(0.1, "1"), TypeError, "sensitivity"),
    (lambda: events.GaussianDpEvent("1.0"), TypeError, "noise_multiplier"),
    (lambda: events.GaussianDpEvent(-1.0), ValueError, "noise_multiplier"),
    (lambda: events.LaplaceDpEvent(True), TypeError, "noise_multiplier"),
    (lambda: events.ZCDpEvent(0.0), ValueError, "NoOpDpEvent"),
    (lambda: events.ZCDpEvent("0.1"), TypeError, "rho"),
])
def test_bad_events_are_refused(make, error, match):
  with pytest.raises(error, match=match):
    make()


@pytest.mark.parametrize("event,error", [
    (raw.LaplaceDpEvent("1.0"), TypeError),
    (raw.GaussianDpEvent(True), TypeError),
    (raw.PoissonSampledDpEvent("0.1", raw.GaussianDpEvent(1.0)), TypeError),
    (raw.SelfComposedDpEvent(raw.GaussianDpEvent(1.0), 2.0), TypeError),
    (raw.ZCDpEvent(True), TypeError),
])
def test_raw_events_with_wrong_types_are_refused(event, error):
  """A str/bool field of a raw dp_accounting event is a TypeError, never converted."""
  with pytest.raises(error):
    PrivacyAccountant(neighbouring=ADD).spend(event)
  budget = PrivacyBudget(epsilon=10.0, delta=1e-5, neighbouring=ADD)
  with pytest.raises(error):
    budget.spend(event)
  assert budget.accountant.ledger == ()


def test_bad_counts():
  acc = PrivacyAccountant(neighbouring=ADD)
  for count, error in ((True, TypeError), (2.0, TypeError), ("3", TypeError), (0, ValueError)):
    with pytest.raises(error, match="count"):
      acc.spend(events.PureDpEvent(0.1), count=count)
  assert acc.ledger == ()


def test_budget_exceeded_still_reported_for_tagged_events():
  budget = PrivacyBudget(epsilon=1.0)
  budget.spend(events.PureDpEvent(0.6, neighbouring=ADD))
  with pytest.raises(BudgetExceededError):
    budget.spend(events.PureDpEvent(0.6, neighbouring=ADD))
