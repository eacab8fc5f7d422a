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

Neighbouring relations: each event carries the guarantee its mechanism
proves. The ERM methods of papers 000/003 are proven for replace-one
neighbours, DP-SGD with Poisson sampling for add-or-remove-one; an ε
add/remove guarantee implies 2ε for replace-one. Compose events of one
relation per accountant (see docs/sharp_edges.md).
"""

from __future__ import annotations

import json
import math
import os
import threading
from typing import Callable

import numpy as np
from dp_accounting import privacy_accountant as dpa_privacy_accountant
from dp_accounting.pld import common as pld_common
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dp_accounting.rdp import rdp_privacy_accountant

from jaxdp import _validation
from jaxdp.accounting import events as ev
from jaxdp.accounting import zcdp
from jaxdp.errors import BudgetExceededError

_CompositionError = dpa_privacy_accountant.PrivacyAccountant.CompositionErrorDetails

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
    if isinstance(event, ev.LaplaceDpEvent) and event.noise_multiplier == 0:
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
  """dp_accounting's PLD accountant extended with jaxdp's events."""

  def _maybe_compose(self, event, count, do_compose):
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


def _check_real(value, name: str, low: float, high: float = math.inf) -> None:
  """Raises ValueError unless ``value`` is a real number in [low, high]."""
  try:
    v = float(value)
  except (TypeError, ValueError) as err:
    raise ValueError(f"{name} must be a real number, got {value!r}.") from err
  if math.isnan(v) or not low <= v <= high:
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
  if isinstance(event, (ev.GaussianDpEvent, ev.LaplaceDpEvent)):
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
    if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 0:
      raise ValueError(f"SelfComposedDpEvent.count must be an integer >= 0, got {count!r}.")
    _check_event(event.event)
  elif isinstance(event, ev.ComposedDpEvent):
    for e in event.events:
      _check_event(e)
  elif isinstance(event, ev.ZCDpEvent):
    _check_real(event.rho, "ZCDpEvent.rho", 0.0)
    _check_real(event.xi, "ZCDpEvent.xi", 0.0)


def _walk(event: ev.DpEvent, leaf: Callable[[ev.DpEvent], tuple[float, float]],
          sampled: Callable[[float, tuple[float, float]], tuple[float, float]] | None
          ) -> tuple[float, float]:
  """Additive (ε-like, δ-like) totals of an event tree."""
  if isinstance(event, ev.NoOpDpEvent):
    return 0.0, 0.0
  if isinstance(event, ev.NonPrivateDpEvent):
    return math.inf, 0.0
  if isinstance(event, ev.SelfComposedDpEvent):
    if event.count == 0:  # nothing ran (and 0 * inf would be NaN)
      return 0.0, 0.0
    a, b = _walk(event.event, leaf, sampled)
    return event.count * a, event.count * b
  if isinstance(event, ev.ComposedDpEvent):
    totals = [_walk(e, leaf, sampled) for e in event.events]
    return sum(t[0] for t in totals), sum(t[1] for t in totals)
  if isinstance(event, ev.PoissonSampledDpEvent) and sampled is not None:
    return sampled(event.sampling_probability, _walk(event.event, leaf, sampled))
  return leaf(event)


def _basic_leaf(event: ev.DpEvent) -> tuple[float, float]:
  params = _pure_event_params(event)
  if params is not None:
    return params
  if isinstance(event, ev.LaplaceDpEvent):
    return (math.inf if event.noise_multiplier == 0 else 1.0 / event.noise_multiplier), 0.0
  raise UnsupportedEventError(
      f"{type(event).__name__} has no (epsilon, delta) of its own for basic composition; "
      "use method='rdp', 'pld' or 'zcdp'.")


def _basic_sampled(q: float, inner: tuple[float, float]) -> tuple[float, float]:
  eps, delta = inner
  return math.log1p(q * math.expm1(eps)) if math.isfinite(eps) else math.inf, q * delta


def _zcdp_leaf(event: ev.DpEvent) -> tuple[float, float]:
  if isinstance(event, ev.GaussianDpEvent):
    z = event.noise_multiplier
    return (math.inf if z == 0 else 0.5 / z**2), 0.0
  if isinstance(event, ev.ZCDpEvent):
    if event.xi != 0:
      raise UnsupportedEventError("approximate zCDP events (xi != 0) are not supported.")
    return event.rho, 0.0
  if isinstance(event, ev.ExponentialMechanismDpEvent):
    return event.rho, 0.0
  if isinstance(event, ev.LaplaceDpEvent):
    eps = math.inf if event.noise_multiplier == 0 else 1.0 / event.noise_multiplier
    return zcdp.pure_dp_to_zcdp(eps) if math.isfinite(eps) else math.inf, 0.0
  params = _pure_event_params(event)
  if params is not None and params[1] == 0.0:
    return (zcdp.pure_dp_to_zcdp(params[0]) if math.isfinite(params[0]) else math.inf), 0.0
  raise UnsupportedEventError(f"{type(event).__name__} has no zCDP bound.")


class PrivacyAccountant:
  """A ledger of DpEvents with several ways to bound the total privacy loss.

  >>> from jaxdp.accounting import events
  >>> acc = PrivacyAccountant()
  >>> acc.spend(events.PureDpEvent(0.5), count=2)
  >>> acc.pure_epsilon()
  1.0
  """

  def __init__(self):
    self._ledger: list[list] = []  # [event, count], merged when an event repeats
    self._index: dict[str, int] = {}

  # -- recording --------------------------------------------------------------
  def spend(self, event: ev.DpEvent, count: int = 1) -> None:
    """Records ``count`` runs of the mechanism described by ``event``.

    Raises:
      ValueError: ``event`` is not a DpEvent, has a field out of range (NaN or
        negative noise multiplier, sampling probability outside [0, 1],
        negative count or ρ), or ``count`` is not an integer >= 1.
    """
    if not isinstance(event, ev.DpEvent):
      raise ValueError(f"event must be a DpEvent, got {type(event).__name__}.")
    _check_event(event)
    count = _validation.check_positive_int(count, "count")
    data = ev.event_to_dict(event)
    # Canonical copy with Python floats/ints: a numpy float32 field would otherwise
    # carry float32 arithmetic into dp_accounting (accounting is float64 only).
    event = ev.event_from_dict(data)
    key = json.dumps(data, sort_keys=True)
    if key in self._index:
      self._ledger[self._index[key]][1] += count
    else:
      self._index[key] = len(self._ledger)
      self._ledger.append([event, count])

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
    out = PrivacyAccountant()
    for e, c in self._ledger:
      out.spend(e, c)
    return out

  # -- queries ----------------------------------------------------------------
  def basic_epsilon_delta(self) -> tuple[float, float]:
    """(Σε, Σδ) by basic composition; raises UnsupportedEventError for Gaussian-type events."""
    return _walk(self.as_event(), _basic_leaf, _basic_sampled)

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
      acc = _RdpAccountant() if method == "rdp" else _PldAccountant()
      event = self.as_event()
      if not acc.supports(event):
        raise UnsupportedEventError(f"the {method} accountant does not support this ledger.")
      acc.compose(event)
      return float(acc.get_epsilon(delta))
    raise ValueError(f"method must be 'auto' or one of {METHODS}, got {method!r}.")

  def supports(self, method: str) -> bool:
    try:
      self.get_epsilon(0.5 if method != "pure" else 0.0, method)
    except UnsupportedEventError:
      return False
    return True

  # -- persistence ------------------------------------------------------------
  def state_dict(self) -> dict:
    return {"ledger": [[ev.event_to_dict(e), c] for e, c in self._ledger]}

  @classmethod
  def from_state_dict(cls, state: dict) -> "PrivacyAccountant":
    acc = cls()
    for event, count in state["ledger"]:
      acc.spend(ev.event_from_dict(event), count)
    return acc

  def __repr__(self) -> str:
    return f"PrivacyAccountant({len(self._ledger)} distinct events)"


class PrivacyBudget:
  """A privacy budget (ε, δ) that refuses to be overspent.

  ``spend`` composes the event into the ledger only if the total stays within
  (ε, δ) by ``method`` (``"auto"``: best applicable bound; δ = 0 uses pure
  DP); otherwise it raises :class:`~jaxdp.errors.BudgetExceededError` and
  spends nothing. Save and restore with ``state_dict``/``from_state_dict`` (or
  ``save``/``load``) so that a restart cannot reset the budget.

  >>> from jaxdp.accounting import events
  >>> budget = PrivacyBudget(epsilon=1.0)
  >>> budget.spend(events.PureDpEvent(0.25), count=4)
  >>> budget.can_spend(events.PureDpEvent(0.25))
  False
  """

  _RELATIVE_SLACK = 1e-9  # absorbs float rounding of B * (eps / B)

  def __init__(self, epsilon: float, delta: float = 0.0, method: str = "auto",
               accountant: PrivacyAccountant | None = None):
    self.epsilon = _validation.check_epsilon(epsilon)
    self.delta = _validation.check_delta(delta)
    if method != "auto" and method not in METHODS:
      raise ValueError(f"method must be 'auto' or one of {METHODS}, got {method!r}.")
    self.method = method
    self.accountant = accountant if accountant is not None else PrivacyAccountant()
    # spend() is check-then-commit: the lock makes it atomic when several
    # predictors or threads share one budget (else both could pass the check).
    self._lock = threading.RLock()
    if not self._within_limit(self.accountant):
      raise BudgetExceededError("the given accountant has already spent more than this budget.")

  def _limit(self) -> float:
    return self.epsilon * (1.0 + self._RELATIVE_SLACK)

  def _epsilon_of(self, acc: PrivacyAccountant) -> float:
    try:
      return acc.get_epsilon(self.delta, self.method)
    except UnsupportedEventError:
      return math.inf

  def spent_epsilon(self) -> float:
    """ε spent so far at this budget's δ."""
    return self._epsilon_of(self.accountant)

  def remaining_epsilon(self) -> float:
    return max(self.epsilon - self.spent_epsilon(), 0.0)

  def _within_limit(self, acc: PrivacyAccountant) -> bool:
    """Whether some valid bound keeps ``acc`` within the budget.

    Cheap bounds are tried first: any one of them at or below the limit
    suffices, so the (slow) PLD accountant only runs near the limit.
    """
    if self.method != "auto":
      return self._epsilon_of(acc) <= self._limit()
    methods = ("pure",) if self.delta == 0 else ("basic", "zcdp", "rdp", "pld")
    for method in methods:
      try:
        if acc.get_epsilon(self.delta, method) <= self._limit():
          return True
      except UnsupportedEventError:
        continue
    return False

  def can_spend(self, event: ev.DpEvent, count: int = 1) -> bool:
    with self._lock:
      trial = self.accountant.copy()
    trial.spend(event, count)
    return self._within_limit(trial)

  def spend(self, event: ev.DpEvent, count: int = 1) -> None:
    """Spends ``count`` × ``event`` or raises BudgetExceededError (spending nothing).

    Thread-safe: the check and the commit happen under one lock.
    """
    with self._lock:
      trial = self.accountant.copy()
      trial.spend(event, count)
      if not self._within_limit(trial):
        total = self._epsilon_of(trial)
        raise BudgetExceededError(
            f"spending {count} x {event} would bring epsilon to {total:.6g} at delta={self.delta}, "
            f"over the budget epsilon={self.epsilon}; nothing was spent "
            f"(spent so far: {self.spent_epsilon():.6g}).")
      self.accountant.spend(event, count)

  def state_dict(self) -> dict:
    return {"epsilon": self.epsilon, "delta": self.delta, "method": self.method,
            "accountant": self.accountant.state_dict()}

  @classmethod
  def from_state_dict(cls, state: dict) -> "PrivacyBudget":
    return cls(state["epsilon"], state["delta"], state["method"],
               PrivacyAccountant.from_state_dict(state["accountant"]))

  def save(self, path: str | os.PathLike) -> None:
    """Writes the budget and its ledger as JSON (atomically)."""
    tmp = f"{os.fspath(path)}.tmp"
    with self._lock:
      state = self.state_dict()
    with open(tmp, "w", encoding="utf-8") as f:
      json.dump(state, f)
      f.flush()
      os.fsync(f.fileno())  # durable before it replaces the old ledger
    os.replace(tmp, path)

  @classmethod
  def load(cls, path: str | os.PathLike) -> "PrivacyBudget":
    with open(path, encoding="utf-8") as f:
      return cls.from_state_dict(json.load(f))

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
            f"spent={self.spent_epsilon():.6g})")


__all__ = ["METHODS", "PrivacyAccountant", "PrivacyBudget", "UnsupportedEventError"]
