"""One shared privacy accountant for everything a user runs, and a budget.

Every jaxdp mechanism describes itself as a :mod:`DpEvent
<jaxdp.accounting.events>`; a :class:`PrivacyAccountant` keeps the ledger of
events (with multiplicities) and answers "what have I spent" in four
currencies, each a valid upper bound:

* ``"pure"`` — basic composition of pure ε (Dwork & Roth 2014, Thm 3.16);
  Poisson subsampling of an ε-DP event gives log(1 + q(e^ε − 1))
  (Li, Qardaji & Su 2012; Balle, Barthe & Gaboardi 2018).
* ``"rdp"`` — Rényi DP (Mironov 2017) through dp_accounting's
  ``RdpAccountant``, extended with jaxdp's events: ε-DP ⇒ (α, min(ε, αε²/2))
  -RDP (Bun & Steinke 2016, Prop 1.4), the exponential mechanism ⇒
  (α, min(2βΔ, α(βΔ)²/2)) via bounded range (Cesar & Rogers 2021).
* ``"pld"`` — privacy loss distributions through dp_accounting's
  ``PLDAccountant``, extended with ε-DP and (ε, δ)-DP events via their
  dominating pair (``from_privacy_parameters``), which makes their
  composition optimal (Kairouz, Oh & Viswanath 2015).
* ``"zcdp"`` — ρ summed over events (Bun & Steinke 2016; paper 003 Props 1-4),
  converted with Canonne, Kamath & Steinke (2020).

``"auto"`` returns the smallest of the bounds that apply to the ledger.
Accounting is float64 throughout.

Neighbouring relations: each event carries the relation (and privacy unit)
its mechanism's proof uses (see :mod:`jaxdp.accounting.events`). The ERM
methods of papers 000/003 and the prediction methods are proven for
replace-one neighbours, DP-SGD with Poisson sampling for add-or-remove-one
(or, with ``neighbouring="replace_one"``, for replace-one through the PLD
analysis of the replace-one subsampled Gaussian).
An accountant composes ONE relation and unit: it adopts the relation of the
first tagged event (or the one it was created with) and refuses an event of
another relation with a ValueError naming both. jaxdp does not convert inside
the RDP/PLD machinery; convert a finished add/remove guarantee explicitly with
:func:`~jaxdp.accounting.events.replace_one_from_add_remove` (group privacy,
k = 2: (ε, δ) ⇒ (2ε, (1 + e^ε)δ)). Subsampled events are accepted under
add/remove, where the amplification bounds used here (Poisson sampling, in
dp_accounting's ``ADD_OR_REMOVE_ONE`` mode and the pure-DP
``log(1 + q(e^ε − 1))``) are proven; under replace-one only a Poisson-sampled
Gaussian is accepted, and only ``"pld"`` (and ``"auto"``) bounds it, in
dp_accounting's ``REPLACE_ONE`` mode (see
:func:`~jaxdp.accounting.events.replace_one_sampled_gaussian_std`), or a Gaussian
sampled WITHOUT replacement (fixed-size batches), which only ``"rdp"`` bounds, in
dp_accounting's ``REPLACE_ONE`` RDP mode (Wang, Balle & Kasiviswanathan 2019,
Thm 27; :func:`~jaxdp.accounting.dpsgd_accounting.fixed_size_dpsgd_event`). Every other event is
composed with dp_accounting in its ``ADD_OR_REMOVE_ONE`` mode, which for an
unsampled mechanism computes the privacy curve of noise scale / sensitivity,
whatever relation that sensitivity was computed for.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import threading
from typing import Callable

import attr
import numpy as np
from dp_accounting import dp_event as dpa_event
from dp_accounting import privacy_accountant as dpa_privacy_accountant
from dp_accounting.pld import common as pld_common
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dp_accounting.rdp import rdp_privacy_accountant

from jaxdp import _durable
from jaxdp import _validation
from jaxdp.accounting import events as ev
from jaxdp.accounting import zcdp
from jaxdp.errors import ArgumentTypeError, BudgetExceededError

_CompositionError = dpa_privacy_accountant.PrivacyAccountant.CompositionErrorDetails
_dpa_relation = dpa_privacy_accountant.NeighboringRelation

METHODS = ("pure", "basic", "rdp", "pld", "zcdp")


class UnsupportedEventError(ValueError):
  """The ledger holds an event the requested accounting method cannot bound."""


def _pure_event_params(event: ev.DpEvent) -> tuple[float, float] | None:
  """(ε, δ) of jaxdp's directly-proven events, None for other events."""
  if isinstance(event, ev.PureDpEvent):
    return event.epsilon, 0.0
  if isinstance(event, ev.ApproxDpEvent):
    return event.epsilon, event.delta
  if isinstance(event, ev.ExponentialMechanismDpEvent):
    return event.epsilon, 0.0
  return None


class _RdpAccountant(rdp_privacy_accountant.RdpAccountant):
  """dp_accounting's RDP accountant extended with jaxdp's events."""

  def _maybe_compose(self, event, count, do_compose):
    if isinstance(event, dpa_event.LaplaceDpEvent) and event.noise_multiplier == 0:
      if do_compose:  # no noise (dp_accounting would divide by zero)
        self._rdp += np.inf
      return None
    if isinstance(event, ev.ExponentialMechanismDpEvent):
      if do_compose:
        self._rdp += count * np.minimum(event.epsilon, self._orders * event.rho)
      return None
    params = _pure_event_params(event)
    if params is not None:
      eps, delta = params
      if delta > 0:
        return _CompositionError(invalid_event=event,
                                 error_message="(epsilon, delta)-DP events have no RDP bound.")
      if do_compose:
        self._rdp += count * np.minimum(eps, 0.5 * self._orders * eps**2)
      return None
    return super()._maybe_compose(event, count, do_compose)


class _PldAccountant(pld_privacy_accountant.PLDAccountant):
  """dp_accounting's PLD accountant extended with jaxdp's events.

  ``replace_one_sampling=True`` (a replace-one ledger holding Poisson-sampled
  Gaussian events): those events are composed in dp_accounting's
  ``REPLACE_ONE`` mode at standard deviation
  :func:`~jaxdp.accounting.events.replace_one_sampled_gaussian_std` (the
  dominating pair of Zhu, Dong & Wang 2022); every other event as in the
  add/remove mode (its noise multiplier is already relative to its own
  replace-one sensitivity).
  """

  def __init__(self, replace_one_sampling: bool = False, **kwargs):
    super().__init__(**kwargs)
    self._replace_one_sampling = replace_one_sampling

  def _maybe_compose(self, event, count, do_compose):
    if self._replace_one_sampling and isinstance(event, ev.PoissonSampledDpEvent):
      inner = event.event
      if not isinstance(inner, dpa_event.GaussianDpEvent):
        return _CompositionError(
            invalid_event=event,
            error_message="only Poisson-sampled Gaussian events are accounted under replace_one.")
      if do_compose and event.sampling_probability > 0:
        if inner.noise_multiplier == 0:
          self._contains_non_dp_event = True
        else:
          pld = pld_lib.from_gaussian_mechanism(
              standard_deviation=ev.replace_one_sampled_gaussian_std(inner.noise_multiplier),
              value_discretization_interval=self._value_discretization_interval,
              sampling_prob=event.sampling_probability,
              neighboring_relation=dpa_privacy_accountant.NeighboringRelation.REPLACE_ONE,
          ).self_compose(count)
          self._pld = self._pld.compose(pld)
      return None
    params = _pure_event_params(event)
    if params is not None:
      eps, delta = params
      if do_compose and math.isinf(eps):
        self._contains_non_dp_event = True  # ε = ∞: no finite bound at any δ < 1
      elif do_compose:
        pld = pld_lib.from_privacy_parameters(
            pld_common.DifferentialPrivacyParameters(eps, delta),
            value_discretization_interval=self._value_discretization_interval)
        if count > 1:
          pld = pld.self_compose(count)
        self._pld = self._pld.compose(pld)
      return None
    return super()._maybe_compose(event, count, do_compose)


def _fields_of(event: ev.DpEvent) -> dict:
  """The fields of an attrs or dataclass event (dp_accounting's and jaxdp's)."""
  if attr.has(type(event)):
    return {f.name: getattr(event, f.name) for f in attr.fields(type(event))}
  if dataclasses.is_dataclass(event):
    return {f.name: getattr(event, f.name) for f in dataclasses.fields(event)}
  return dict(getattr(event, "__dict__", {}))


def _describe(event: ev.DpEvent, room: int = 4) -> str:
  """A short readable description of ``event`` for messages (no repr of nested events)."""
  if isinstance(event, ev.SelfComposedDpEvent):
    return f"{event.count} x {_describe(event.event, room)}"
  if isinstance(event, ev.ComposedDpEvent):
    parts = [_describe(e, room) for e in event.events[:room]]
    more = len(event.events) - room
    return "[" + "; ".join(parts) + (f"; {more} more" if more > 0 else "") + "]"
  name = type(event).__name__.removesuffix("DpEvent") or type(event).__name__
  inner = getattr(event, "event", None)
  fields = {}
  for field, value in _fields_of(event).items():
    if field.startswith("_") or field == "event" or isinstance(value, bool):
      continue
    if isinstance(value, (int, float, np.floating, np.integer)):
      fields[field] = f"{field}={float(value):.4g}"
    elif isinstance(value, str) and field in ("neighbouring", "unit"):
      fields[field] = f"{field}={value}"
  text = name + ("(" + ", ".join(fields.values()) + ")" if fields else "")
  return text + (f" of {_describe(inner, room)}" if isinstance(inner, ev.DpEvent) else "")


def _check_real(value, name: str, low: float, high: float = math.inf) -> None:
  """Raises TypeError unless ``value`` is a real number (not a bool or str), ValueError unless in [low, high]."""
  v = ev._real(value, name)  # pylint: disable=protected-access
  if not low <= v <= high:
    raise ValueError(f"{name} must be in [{low}, {high}], got {value!r}.")


def _check_event(event: ev.DpEvent) -> None:
  """Validates the numeric fields of an event tree before it enters a ledger.

  dp_accounting's event classes do not validate their fields, and the
  bounds of this module would turn a malformed event into a *negative* cost
  (e.g. ``LaplaceDpEvent(-1)`` counts ε = −1, ``PoissonSampledDpEvent(−0.5,
  ·)`` or ``SelfComposedDpEvent(·, −3)`` a negative total), which would let a
  :class:`PrivacyBudget` be overspent. ``noise_multiplier = 0`` stays allowed
  (it means no noise: the event is non-private, infinite ε).
  """
  if isinstance(event, (dpa_event.GaussianDpEvent, dpa_event.LaplaceDpEvent)):
    _check_real(event.noise_multiplier, f"{type(event).__name__}.noise_multiplier", 0.0)
  elif isinstance(event, ev.PoissonSampledDpEvent):
    _check_real(event.sampling_probability, "PoissonSampledDpEvent.sampling_probability", 0.0, 1.0)
    _check_event(event.event)
  elif isinstance(event, ev.SampledWithoutReplacementDpEvent):
    name = "SampledWithoutReplacementDpEvent"
    _check_real(event.source_dataset_size, f"{name}.source_dataset_size", 0.0)
    _check_real(event.sample_size, f"{name}.sample_size", 0.0, float(event.source_dataset_size))
    _check_event(event.event)
  elif isinstance(event, ev.SelfComposedDpEvent):
    count = event.count
    if isinstance(count, bool) or not isinstance(count, (int, np.integer)):
      raise ArgumentTypeError(f"SelfComposedDpEvent.count must be an integer >= 0, got {count!r}.")
    if count < 0:
      raise ValueError(f"SelfComposedDpEvent.count must be an integer >= 0, got {count!r}.")
    _check_event(event.event)
  elif isinstance(event, ev.ComposedDpEvent):
    for e in event.events:
      _check_event(e)
  elif isinstance(event, ev.RepeatAndSelectDpEvent):
    _check_real(event.mean, "RepeatAndSelectDpEvent.mean", 1.0)  # E[K] >= 1 (dp_accounting)
    if math.isinf(float(event.mean)):
      raise ValueError("RepeatAndSelectDpEvent.mean must be finite.")
    _check_real(event.shape, "RepeatAndSelectDpEvent.shape", 0.0)  # inf: Poisson
    _check_event(event.event)
  elif isinstance(event, dpa_event.ZCDpEvent):
    _check_real(event.rho, "ZCDpEvent.rho", 0.0)
    _check_real(event.xi, "ZCDpEvent.xi", 0.0)


def _walk(event: ev.DpEvent, leaf: Callable[[ev.DpEvent], tuple[float, float]],
          sampled: Callable[[float, tuple[float, float]], tuple[float, float]] | None,
          repeated: Callable[[ev.DpEvent, tuple[float, float]], tuple[float, float]] | None = None
          ) -> tuple[float, float]:
  """Additive (ε-like, δ-like) totals of an event tree."""
  if isinstance(event, ev.RepeatAndSelectDpEvent):
    if repeated is None:
      raise UnsupportedEventError(
          "RepeatAndSelectDpEvent (repeat a mechanism a random number of times and release the "
          "best run) is bounded by method='rdp' (Papernot & Steinke 2022, Thms 2 and 6), or by "
          "method='pure' for a pure-DP run repeated a truncated-negative-binomial number of times.")
    return repeated(event, _walk(event.event, leaf, sampled, repeated))
  if isinstance(event, ev.NoOpDpEvent):
    return 0.0, 0.0
  if isinstance(event, ev.NonPrivateDpEvent):
    return math.inf, 0.0
  if isinstance(event, ev.SelfComposedDpEvent):
    if event.count == 0:  # nothing ran (and 0 * inf would be NaN)
      return 0.0, 0.0
    a, b = _walk(event.event, leaf, sampled, repeated)
    return event.count * a, event.count * b
  if isinstance(event, ev.ComposedDpEvent):
    totals = [_walk(e, leaf, sampled, repeated) for e in event.events]
    return sum(t[0] for t in totals), sum(t[1] for t in totals)
  if isinstance(event, ev.PoissonSampledDpEvent) and sampled is not None:
    return sampled(event.sampling_probability, _walk(event.event, leaf, sampled, repeated))
  return leaf(event)


def _pure_repeat_and_select(event: ev.DpEvent, inner: tuple[float, float]) -> tuple[float, float]:
  """Pure ε of the best of K runs of an ε-DP mechanism, K truncated negative binomial of shape η.

  ``(2 + η) ε`` for finite η >= 0: Papernot & Steinke 2022 (ICLR; arXiv 2110.03620v2), Thm 2
  in the limit λ, λ̂ → ∞ (an ε-DP run is (λ, ε)-RDP at every order; the terms
  (1 + η) log(1/γ)/λ̂ and log E[K]/(λ − 1) vanish). η = 1 (geometric K) is Liu & Talwar's
  3ε (STOC 2019, the random-stopping selection of Section 3), η = 0 (logarithmic) gives 2ε.
  Poisson K (η = ∞) and (ε, δ) runs have no bound here (use method='rdp').
  """
  eps, delta = inner
  shape = float(event.shape)
  if delta != 0.0 or math.isinf(shape):
    raise UnsupportedEventError(
        "RepeatAndSelectDpEvent has a pure-DP bound only for a pure-DP run and a truncated "
        "negative binomial K (shape < inf; 3 epsilon for geometric K, Liu & Talwar 2019); "
        "use method='rdp' (Papernot & Steinke 2022).")
  return ((2.0 + shape) * eps if eps > 0 else 0.0), 0.0


def _basic_leaf(event: ev.DpEvent) -> tuple[float, float]:
  params = _pure_event_params(event)
  if params is not None:
    return params
  if isinstance(event, dpa_event.LaplaceDpEvent):
    return (math.inf if event.noise_multiplier == 0 else 1.0 / event.noise_multiplier), 0.0
  raise UnsupportedEventError(
      f"{type(event).__name__} has no (epsilon, delta) of its own for basic composition; "
      "use method='rdp', 'pld' or 'zcdp'.")


def _basic_sampled(q: float, inner: tuple[float, float]) -> tuple[float, float]:
  eps, delta = inner
  return math.log1p(q * math.expm1(eps)) if math.isfinite(eps) else math.inf, q * delta


def _zcdp_leaf(event: ev.DpEvent) -> tuple[float, float]:
  if isinstance(event, dpa_event.GaussianDpEvent):
    z = event.noise_multiplier
    return (math.inf if z == 0 else 0.5 / z**2), 0.0
  if isinstance(event, dpa_event.ZCDpEvent):
    if event.xi != 0:
      raise UnsupportedEventError("approximate zCDP events (xi != 0) are not supported.")
    return event.rho, 0.0
  if isinstance(event, ev.ExponentialMechanismDpEvent):
    return event.rho, 0.0
  if isinstance(event, dpa_event.LaplaceDpEvent):
    eps = math.inf if event.noise_multiplier == 0 else 1.0 / event.noise_multiplier
    return zcdp.pure_dp_to_zcdp(eps) if math.isfinite(eps) else math.inf, 0.0
  params = _pure_event_params(event)
  if params is not None and params[1] == 0.0:
    return (zcdp.pure_dp_to_zcdp(params[0]) if math.isfinite(params[0]) else math.inf), 0.0
  raise UnsupportedEventError(f"{type(event).__name__} has no zCDP bound.")


@dataclasses.dataclass(frozen=True)
class PrivacyGuarantee:
  """An (ε, δ)-DP guarantee together with what it is a guarantee about.

  Attributes:
    epsilon, delta: the bound.
    neighbouring: the neighbouring relation it holds for (``"add_remove"`` or
      ``"replace_one"``; None for an empty or non-private-only ledger).
    unit: the privacy unit (``"example"``, ``"party"``, ...).
    method: the accounting method that produced ``epsilon``.
  """

  epsilon: float
  delta: float
  neighbouring: str | None
  unit: str
  method: str

  def __str__(self) -> str:
    return (f"({self.epsilon:.6g}, {self.delta:.3g})-DP for {self.neighbouring or 'any'} "
            f"neighbours (unit: {self.unit}; {self.method})")


class PrivacyAccountant:
  """A ledger of DpEvents of ONE neighbouring relation, with several bounds on the total loss.

  Args:
    neighbouring: the relation every event must hold for (``"add_remove"`` or
      ``"replace_one"``). None (default): adopt the relation of the first
      tagged event. Untagged events (raw dp_accounting events,
      ``neighbouring=None``) are only accepted when the relation is given here,
      and are then taken to be proven for it.
    unit: the privacy unit (default ``"example"``); events of another unit
      are refused.

  >>> from jaxdp.accounting import events
  >>> acc = PrivacyAccountant()
  >>> acc.spend(events.PureDpEvent(0.5, neighbouring="replace_one"), count=2)
  >>> acc.pure_epsilon()
  1.0
  >>> print(acc.guarantee(0.0))
  (1, 0)-DP for replace_one neighbours (unit: example; auto)
  """

  def __init__(self, neighbouring: str | None = None, unit: str = ev.DEFAULT_UNIT):
    self._declared = ev.check_neighbouring(neighbouring, allow_none=True)
    self._neighbouring = self._declared
    self._unit = ev.check_unit(unit)
    self._ledger: list[list] = []  # [event, count], merged when an event repeats
    self._index: dict[str, int] = {}

  @property
  def neighbouring(self) -> str | None:
    """The relation of this ledger (declared, or adopted from the first tagged event)."""
    return self._neighbouring

  @property
  def unit(self) -> str:
    return self._unit

  # -- recording --------------------------------------------------------------
  def _relation_after(self, event: ev.DpEvent) -> str | None:
    """The ledger's relation once ``event`` is added; raises if it does not fit."""
    relation = self._neighbouring
    for tag_relation, tag_unit in sorted(ev.leaf_tags(event), key=str):
      if tag_relation is None:
        if self._declared is None:
          raise ValueError(
              f"{type(event).__name__} carries no neighbouring relation, so its guarantee cannot be "
              "composed safely: tag it (events.with_neighbouring(event, 'add_remove') or the "
              "event's neighbouring= argument) or create the accountant with "
              "PrivacyAccountant(neighbouring=...).")
        continue
      if tag_unit != self._unit:
        raise ValueError(f"event is for privacy unit {tag_unit!r} but this accountant composes unit "
                         f"{self._unit!r}; guarantees for different units do not compose.")
      if relation is None:
        relation = tag_relation
      elif tag_relation != relation:
        raise ValueError(
            f"event is for {tag_relation} neighbours but this accountant composes {relation} "
            "neighbours; composing both gives a bound that holds under neither. Use one "
            "accountant per relation, or convert a finished add_remove guarantee with "
            "events.replace_one_from_add_remove(epsilon, delta) (2x epsilon, group privacy).")
    if (relation == ev.REPLACE_ONE and ev.contains_sampling(event)
        and not ev.sampling_is_replace_one_accountable(event)):
      raise ValueError(
          "under replace_one neighbours the only subsampled events accounted are a Poisson-sampled "
          "GaussianDpEvent (by PLD) and a GaussianDpEvent sampled without replacement (fixed-size "
          "batches, by RDP), tagged replace_one; the other amplification bounds used here are "
          "proven for add_remove neighbours only, and this accountant composes replace_one.")
    return relation

  def spend(self, event: ev.DpEvent, count: int = 1) -> None:
    """Records ``count`` runs of the mechanism described by ``event``.

    Raises:
      TypeError: ``event`` is not a DpEvent, a field is a str/bool, or
        ``count`` is not an integer.
      ValueError: a field is out of range (NaN or negative noise multiplier,
        sampling probability outside [0, 1], negative count or ρ), ``count``
        < 1, or the event's relation or unit differs from this ledger's (or it
        is untagged and no relation was declared).
    """
    if not isinstance(event, ev.DpEvent):
      raise TypeError(f"event must be a DpEvent, got {type(event).__name__}.")
    _check_event(event)
    if isinstance(count, bool) or not isinstance(count, (int, np.integer)):
      raise ArgumentTypeError(f"count must be an integer >= 1, got {count!r}.")
    count = _validation.check_positive_int(count, "count")
    data = ev.event_to_dict(event)
    # Canonical copy with Python floats/ints: a numpy float32 field would otherwise
    # carry float32 arithmetic into dp_accounting (accounting is float64 only).
    event = ev.event_from_dict(data)
    relation = self._relation_after(event)
    key = json.dumps(data, sort_keys=True)
    if key in self._index:
      self._ledger[self._index[key]][1] += count
    else:
      self._index[key] = len(self._ledger)
      self._ledger.append([event, count])
    self._neighbouring = relation

  compose = spend

  @property
  def ledger(self) -> tuple[tuple[ev.DpEvent, int], ...]:
    return tuple((e, c) for e, c in self._ledger)

  def as_event(self) -> ev.DpEvent:
    """The whole ledger as one ComposedDpEvent."""
    if not self._ledger:
      return ev.NoOpDpEvent()
    return ev.ComposedDpEvent([ev.SelfComposedDpEvent(e, c) if c > 1 else e for e, c in self._ledger])

  def copy(self) -> "PrivacyAccountant":
    return PrivacyAccountant.from_state_dict(self.state_dict())

  # -- queries ----------------------------------------------------------------
  def basic_epsilon_delta(self) -> tuple[float, float]:
    """(Σε, Σδ) by basic composition; raises UnsupportedEventError for Gaussian-type events."""
    return _walk(self.as_event(), _basic_leaf, _basic_sampled, _pure_repeat_and_select)

  def pure_epsilon(self) -> float:
    """Total pure ε, or inf when some event only has an approximate/RDP guarantee."""
    try:
      eps, delta = self.basic_epsilon_delta()
    except UnsupportedEventError:
      return math.inf
    return eps if delta == 0.0 else math.inf

  def zcdp_rho(self) -> float:
    """Total ρ (zCDP composes additively; paper 003 Proposition 4)."""
    return _walk(self.as_event(), _zcdp_leaf, None)[0]

  def get_epsilon(self, delta: float, method: str = "auto") -> float:
    """An upper bound on the total ε at ``delta`` by ``method``.

    The bound holds for :attr:`neighbouring` neighbours (see :meth:`guarantee`).

    Args:
      delta: target δ in [0, 1); δ = 0 asks for pure DP.
      method: one of ``"auto"`` (the smallest applicable bound), ``"pure"``,
        ``"basic"``, ``"rdp"``, ``"pld"``, ``"zcdp"``.

    Raises:
      UnsupportedEventError: if ``method`` cannot bound some event in the ledger.
    """
    delta = _validation.check_delta(delta)
    if method != "auto" and method not in METHODS:
      raise ValueError(f"method must be 'auto' or one of {METHODS}, got {method!r}.")
    if method == "auto":
      bounds = []
      for m in (("pure",) if delta == 0 else METHODS):
        try:
          bounds.append(self.get_epsilon(delta, m))
        except UnsupportedEventError:
          continue
      return min(bounds) if bounds else math.inf
    if not self._ledger:
      return 0.0
    if method == "pure":
      eps = self.pure_epsilon()
      if math.isinf(eps):
        try:
          self.basic_epsilon_delta()
        except UnsupportedEventError as err:
          raise UnsupportedEventError(f"no pure-DP bound: {err}") from None
      return eps
    if method == "basic":
      eps, total_delta = self.basic_epsilon_delta()
      return eps if total_delta <= delta else math.inf
    if method == "zcdp":
      rho = self.zcdp_rho()
      if rho == 0.0:
        return 0.0
      if delta == 0.0 or math.isinf(rho):
        return math.inf
      return zcdp.zcdp_to_approx_dp_tight(rho, delta)
    if method in ("rdp", "pld"):
      if delta == 0.0:
        return self.get_epsilon(0.0, "pure") if method == "pld" else math.inf
      # ADD_OR_REMOVE_ONE mode on purpose (see the module docstring); the one
      # subsampled event a replace_one ledger may hold (a Poisson-sampled
      # Gaussian) has only the PLD analysis here.
      event = self.as_event()
      replace_one = self._neighbouring == ev.REPLACE_ONE
      replace_sampled = replace_one and ev.contains_poisson_sampling(event)
      without_replacement = ev.contains_sampling_without_replacement(event)
      if replace_sampled and method == "rdp":
        raise UnsupportedEventError(
            "the rdp accountant bounds Poisson-sampled events for add_remove neighbours only; "
            "this replace_one ledger is accounted with method='pld'.")
      if method == "pld" and ev.contains_repeat_and_select(event):
        raise UnsupportedEventError(
            "dp_accounting's PLD has no analysis of RepeatAndSelectDpEvent (the best of a random "
            "number of runs); it is accounted with method='rdp' (Papernot & Steinke 2022, Thms 2 "
            "and 6).")
      if without_replacement and method == "pld":
        raise UnsupportedEventError(
            "dp_accounting's PLD has no analysis of sampling without replacement (fixed-size "
            "batches); a ledger holding a SampledWithoutReplacementDpEvent is accounted with "
            "method='rdp' (Wang, Balle & Kasiviswanathan 2019, replace_one neighbours).")
      # Sampling without replacement is analysed by dp_accounting's RDP in its REPLACE_ONE
      # mode (Wang, Balle & Kasiviswanathan 2019, Thm 27); its other events do not depend on
      # the mode (Gaussian, Laplace, zCDP and jaxdp's pure events), Poisson sampling is refused.
      acc = ((_RdpAccountant(neighboring_relation=_dpa_relation.REPLACE_ONE)
              if replace_one and without_replacement else _RdpAccountant()) if method == "rdp"
             else _PldAccountant(replace_one_sampling=replace_sampled))
      if not acc.supports(event):
        raise UnsupportedEventError(f"the {method} accountant does not support this ledger.")
      acc.compose(event)
      return float(acc.get_epsilon(delta))
    raise ValueError(f"method must be 'auto' or one of {METHODS}, got {method!r}.")

  def guarantee(self, delta: float, method: str = "auto") -> PrivacyGuarantee:
    """:meth:`get_epsilon` with the relation and unit it holds for."""
    return PrivacyGuarantee(self.get_epsilon(delta, method), float(delta), self._neighbouring,
                            self._unit, method)

  def supports(self, method: str) -> bool:
    try:
      self.get_epsilon(0.5 if method != "pure" else 0.0, method)
    except UnsupportedEventError:
      return False
    return True

  # -- persistence ------------------------------------------------------------
  def state_dict(self) -> dict:
    return {"neighbouring": self._neighbouring, "declared_neighbouring": self._declared,
            "unit": self._unit, "ledger": [[ev.event_to_dict(e), c] for e, c in self._ledger]}

  @classmethod
  def from_state_dict(cls, state: dict) -> "PrivacyAccountant":
    acc = cls(state.get("declared_neighbouring"), state.get("unit", ev.DEFAULT_UNIT))
    for event, count in state["ledger"]:
      acc.spend(ev.event_from_dict(event), count)
    recorded = state.get("neighbouring")
    if recorded is not None and acc.neighbouring != recorded:
      raise ValueError(f"state records neighbouring={recorded!r} but its events give "
                       f"{acc.neighbouring!r}.")
    return acc

  def __repr__(self) -> str:
    return (f"PrivacyAccountant({len(self._ledger)} distinct events, "
            f"neighbouring={self._neighbouring!r}, unit={self._unit!r})")


class PrivacyBudget:
  """A privacy budget (ε, δ) for one neighbouring relation that refuses to be overspent.

  ``spend`` composes the event into the ledger only if the total stays within
  (ε, δ) by ``method`` (``"auto"``: best applicable bound; δ = 0 uses pure
  DP); otherwise it raises :class:`~jaxdp.errors.BudgetExceededError` and
  spends nothing.

  Durability: with ``path=``, the file is the state of record. Every spend is
  a read-modify-write under an exclusive file lock (``jaxdp._durable``): the
  ledger is re-read from disk, the limit checked, the event appended and the
  file replaced atomically and fsync'd before the lock is released. So a crash
  loses no acknowledged spend, and several processes (or copies of this
  object) sharing the file cannot spend more than (ε, δ) in total. Creating a
  budget on an existing file resumes it, and refuses a different ε, δ,
  method, relation or unit.

  Round-off: the total may exceed ε by at most :attr:`ROUNDING_ULPS` units in
  the last place of ε (a relative 4.4e-16), to absorb the float rounding of
  ``B · (ε/B)``; nothing larger is accepted.

  Args:
    epsilon: ε > 0, finite.
    delta: δ in [0, 1).
    method: accounting method (see :meth:`PrivacyAccountant.get_epsilon`).
    accountant: an existing ledger to start from (not with an existing ``path``).
    neighbouring: the relation (None: adopt the first tagged event's).
    unit: the privacy unit (default ``"example"``).
    path: JSON file that persists the budget (see above).

  >>> from jaxdp.accounting import events
  >>> budget = PrivacyBudget(epsilon=1.0)
  >>> budget.spend(events.PureDpEvent(0.25, neighbouring="replace_one"), count=4)
  >>> budget.can_spend(events.PureDpEvent(0.25, neighbouring="replace_one"))
  False
  >>> f"{budget.spent_epsilon:.2f}"
  '1.00'
  """

  ROUNDING_ULPS = 2

  def __init__(self, epsilon: float, delta: float = 0.0, method: str = "auto",
               accountant: PrivacyAccountant | None = None, *,
               neighbouring: str | None = None, unit: str | None = None,
               path: str | os.PathLike | None = None):
    self.epsilon = _validation.check_epsilon(epsilon)
    self.delta = _validation.check_delta(delta)
    if method != "auto" and method not in METHODS:
      raise ValueError(f"method must be 'auto' or one of {METHODS}, got {method!r}.")
    self.method = method
    relation = ev.check_neighbouring(neighbouring, allow_none=True)
    if accountant is None:
      accountant = PrivacyAccountant(relation, ev.DEFAULT_UNIT if unit is None else unit)
    elif not isinstance(accountant, PrivacyAccountant):
      raise TypeError(f"accountant must be a PrivacyAccountant, got {type(accountant).__name__}.")
    else:
      if relation is not None and accountant.neighbouring not in (None, relation):
        raise ValueError(f"neighbouring={relation!r} but the accountant composes "
                         f"{accountant.neighbouring!r}.")
      if unit is not None and ev.check_unit(unit) != accountant.unit:
        raise ValueError(f"unit={unit!r} but the accountant composes unit {accountant.unit!r}.")
      if relation is not None and accountant.neighbouring is None:
        state = accountant.state_dict()
        state["declared_neighbouring"] = relation
        accountant = PrivacyAccountant.from_state_dict(state)
    self.accountant = accountant
    self.path = None if path is None else os.path.abspath(os.fspath(path))
    # spend() is check-then-commit: the lock makes it atomic when several
    # predictors or threads share one budget (else both could pass the check).
    self._lock = threading.RLock()
    if self.path is None:
      if not self._within_limit(self.accountant):
        raise BudgetExceededError("the given accountant has already spent more than this budget.")
      return
    given_accountant = accountant.ledger != ()
    with _durable.locked_update(self.path) as box:
      if box.value is None:
        if not self._within_limit(self.accountant):
          raise BudgetExceededError("the given accountant has already spent more than this budget.")
        box.value = self.state_dict()
        return
      stored = box.value
      if given_accountant:
        raise ValueError(f"path {self.path!r} already holds a budget; resume it without passing "
                         "an accountant.")
      self._check_matches(stored, relation, unit)
      self.accountant = PrivacyAccountant.from_state_dict(stored["accountant"])

  def _check_matches(self, stored: dict, relation: str | None, unit: str | None) -> None:
    """Refuses to resume a stored budget with different parameters."""
    mismatches = []
    for name, mine in (("epsilon", self.epsilon), ("delta", self.delta), ("method", self.method)):
      if stored.get(name) != mine:
        mismatches.append(f"{name}={mine!r} (stored {stored.get(name)!r})")
    acc = stored.get("accountant", {})
    stored_relation = acc.get("neighbouring")
    if relation is not None and stored_relation is not None and stored_relation != relation:
      mismatches.append(f"neighbouring={relation!r} (stored {stored_relation!r})")
    if relation is not None and stored_relation is None and acc.get("ledger"):
      mismatches.append(f"neighbouring={relation!r} (stored ledger has no relation)")
    if unit is not None and acc.get("unit", ev.DEFAULT_UNIT) != unit:
      mismatches.append(f"unit={unit!r} (stored {acc.get('unit')!r})")
    if mismatches:
      raise ValueError(f"the budget stored at {self.path!r} differs: " + ", ".join(mismatches)
                       + "; use another path or the stored parameters.")
    if relation is not None and stored_relation is None:
      acc["declared_neighbouring"] = relation  # an empty stored ledger adopts the relation

  # -- properties ---------------------------------------------------------------
  @property
  def neighbouring(self) -> str | None:
    return self.accountant.neighbouring

  @property
  def unit(self) -> str:
    return self.accountant.unit

  def _limit(self) -> float:
    limit = self.epsilon
    for _ in range(self.ROUNDING_ULPS):
      limit = math.nextafter(limit, math.inf)
    return limit

  def _epsilon_of(self, acc: PrivacyAccountant) -> float:
    try:
      return acc.get_epsilon(self.delta, self.method)
    except UnsupportedEventError:
      return math.inf

  def _refresh(self) -> None:
    """Re-reads the ledger of record (persistent budgets only)."""
    if self.path is not None:
      stored = _durable.read_json(self.path)
      if stored is not None:
        self.accountant = PrivacyAccountant.from_state_dict(stored["accountant"])

  @property
  def spent_epsilon(self) -> float:
    """ε spent so far at this budget's δ (for a persistent budget: by every process)."""
    with self._lock:
      self._refresh()
      return self._epsilon_of(self.accountant)

  @property
  def remaining_epsilon(self) -> float:
    return max(self.epsilon - self.spent_epsilon, 0.0)

  def guarantee(self) -> PrivacyGuarantee:
    """The guarantee spent so far, with its relation and unit."""
    with self._lock:
      self._refresh()
      return self.accountant.guarantee(self.delta, self.method)

  def _within_limit(self, acc: PrivacyAccountant) -> bool:
    """Whether some valid bound keeps ``acc`` within the budget.

    Cheap bounds are tried first: any one of them at or below the limit
    suffices, so the (slow) PLD accountant only runs near the limit.

    Raises:
      UnsupportedEventError: this budget's ``method`` (not ``"auto"``) cannot
        bound ``acc`` at all; the message says why and which method can.
    """
    if self.method != "auto":
      try:
        return acc.get_epsilon(self.delta, self.method) <= self._limit()
      except UnsupportedEventError as err:
        raise UnsupportedEventError(
            f"PrivacyBudget(method={self.method!r}) cannot account this spend: {err} Build the "
            "budget with that method or method='auto' (the smallest bound any method gives); "
            "nothing was spent.") from None
    methods = ("pure",) if self.delta == 0 else ("basic", "zcdp", "rdp", "pld")
    for method in methods:
      try:
        if acc.get_epsilon(self.delta, method) <= self._limit():
          return True
      except UnsupportedEventError:
        continue
    return False

  def can_spend(self, event: ev.DpEvent, count: int = 1) -> bool:
    """Whether ``spend(event, count)`` would succeed now (raises like ``spend`` for bad events)."""
    with self._lock:
      self._refresh()
      trial = self.accountant.copy()
    trial.spend(event, count)
    return self._within_limit(trial)

  def _check_and_spend(self, acc: PrivacyAccountant, event: ev.DpEvent, count: int) -> PrivacyAccountant:
    trial = acc.copy()
    trial.spend(event, count)
    if not self._within_limit(trial):
      asked = f"spending {count} x {_describe(event)}" if count != 1 else f"spending {_describe(event)}"
      raise BudgetExceededError(self._refusal(acc, trial, asked))
    return trial

  def _refusal(self, acc: PrivacyAccountant, trial: PrivacyAccountant, asked: str) -> str:
    """What was asked, what it would bring epsilon to, what is spent and what remains."""
    spent = self._epsilon_of(acc)
    return (f"{asked} would bring epsilon to {self._epsilon_of(trial):.6g} at delta={self.delta} "
            f"({self.method}), over the budget epsilon={self.epsilon:.6g}: spent so far "
            f"{spent:.6g}, remaining {max(self.epsilon - spent, 0.0):.6g}; nothing was spent.")

  def refusal_message(self, event: ev.DpEvent, asked: str, count: int = 1) -> str:
    """The message of a refused spend of ``count`` x ``event``, for callers that check first.

    ``asked`` says what needed the spend (e.g. ``"fitting PrivateLogisticRegression"``).
    """
    with self._lock:
      self._refresh()
      acc = self.accountant.copy()
    trial = acc.copy()
    trial.spend(event, count)
    return self._refusal(acc, trial, f"{asked} ({_describe(event)})")

  def spend(self, event: ev.DpEvent, count: int = 1) -> None:
    """Spends ``count`` × ``event`` or raises BudgetExceededError (spending nothing).

    Thread-safe (the check and the commit happen under one lock) and, with
    ``path=``, process-safe and durable (see the class docstring).
    """
    with self._lock:
      if self.path is None:
        self.accountant = self._check_and_spend(self.accountant, event, count)
        return
      with _durable.locked_update(self.path) as box:
        stored = box.value
        if stored is None:
          raise FileNotFoundError(f"the budget file {self.path!r} was removed; refusing to "
                                  "start a fresh budget silently.")
        current = PrivacyAccountant.from_state_dict(stored["accountant"])
        new = self._check_and_spend(current, event, count)
        box.value = dict(stored, accountant=new.state_dict())
      self.accountant = new

  def state_dict(self) -> dict:
    return {"epsilon": self.epsilon, "delta": self.delta, "method": self.method,
            "accountant": self.accountant.state_dict()}

  @classmethod
  def from_state_dict(cls, state: dict) -> "PrivacyBudget":
    """A budget (not persistent) restored from :meth:`state_dict`."""
    return cls(state["epsilon"], state["delta"], state["method"],
               PrivacyAccountant.from_state_dict(state["accountant"]))

  def save(self, path: str | os.PathLike) -> None:
    """Writes a snapshot of the budget and its ledger as JSON (atomically, durably).

    A snapshot is not a persistent budget: prefer ``PrivacyBudget(..., path=)``.
    """
    with self._lock:
      self._refresh()
      state = self.state_dict()
    _durable.write_json_atomic(path, state)

  @classmethod
  def load(cls, path: str | os.PathLike) -> "PrivacyBudget":
    """A budget (not persistent) restored from a snapshot written by :meth:`save`."""
    state = _durable.read_json(path)
    if state is None:
      raise FileNotFoundError(f"no budget at {os.fspath(path)!r}.")
    return cls.from_state_dict(state)

  def __getstate__(self) -> dict:
    # The lock cannot be pickled or deep-copied; a copy gets a fresh one.
    state = self.__dict__.copy()
    del state["_lock"]
    return state

  def __setstate__(self, state: dict) -> None:
    self.__dict__.update(state)
    self._lock = threading.RLock()

  def __repr__(self) -> str:
    return (f"PrivacyBudget(epsilon={self.epsilon}, delta={self.delta}, "
            f"neighbouring={self.neighbouring!r}, unit={self.unit!r}, "
            f"spent={self.spent_epsilon:.6g}" + (f", path={self.path!r})" if self.path else ")"))


__all__ = ["METHODS", "PrivacyAccountant", "PrivacyBudget", "PrivacyGuarantee",
           "UnsupportedEventError"]
