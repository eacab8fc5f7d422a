"""DpEvents: immutable descriptions of the private mechanisms a user ran.

jaxdp reuses dp_accounting's event vocabulary (Gaussian, Laplace,
Poisson-sampled, self-composed, composed, zCDP, no-op, non-private) and adds
the three kinds its methods need that dp_accounting lacks:

* :class:`PureDpEvent` — any ε-DP mechanism whose guarantee is proven
  directly (L2-Laplace output perturbation, loss perturbation, prediction
  sensitivity with δ = 0, ...);
* :class:`ApproxDpEvent` — any (ε, δ)-DP mechanism proven directly (e.g. the
  Gaussian loss perturbation of paper 000 Algorithm 5, whose proof is not a
  plain Gaussian mechanism);
* :class:`ExponentialMechanismDpEvent` — sampling ``i ∝ exp(β s_i)`` for a
  score of sensitivity Δ: ``2βΔ``-DP (McSherry & Talwar 2007; the factor 2 is
  because the normaliser moves too) and ``2βΔ``-bounded-range, hence
  ``(βΔ)²/2``-zCDP (Durfee & Rogers 2019, Cesar & Rogers 2021).

Convention for Gaussian and Laplace events (as in dp_accounting): the noise
multiplier is the noise scale divided by the sensitivity, ``σ/Δ₂`` or ``b/Δ₁``.

Neighbouring relations and privacy units. A DP guarantee is a statement about
neighbouring datasets; composing an add/remove guarantee with a replace-one
guarantee gives a number that holds under neither. Every leaf event that a
jaxdp method produces therefore carries a tag ``neighbouring`` (a
:class:`NeighbouringRelation`: ``"add_remove"`` — one unit added or removed,
dp_accounting's ``NeighboringRelation.ADD_OR_REMOVE_ONE``; ``"replace_one"`` —
one unit replaced, ``NeighboringRelation.REPLACE_ONE``) and ``unit`` (what one
unit is: ``"example"`` by default; e.g. ``"party"`` when a whole party's data
is protected). The noise multiplier of a tagged Gaussian/Laplace event is
``σ/Δ`` with Δ the sensitivity *under the event's own relation*. Unsampled
events are composed with dp_accounting in its ``ADD_OR_REMOVE_ONE`` mode,
which computes the privacy curve of ``σ/Δ`` whatever relation Δ was computed
for. The one subsampled event jaxdp accounts under replace-one, a
Poisson-sampled Gaussian (DP-SGD with ``neighbouring="replace_one"``), goes
through dp_accounting's PLD ``REPLACE_ONE`` mode, whose "sensitivity" is the
bound on ONE contribution (half of Δ): see
:func:`replace_one_sampled_gaussian_std`. Structural events (Poisson-sampled, self-composed,
composed, no-op, non-private) carry no tag; their relation is that of their
leaves. ``neighbouring=None`` (and every raw dp_accounting event) is
*untagged*: an accountant only accepts it if it was created with an explicit
relation (see :class:`~jaxdp.accounting.PrivacyAccountant`).

Converting relations: an ε add/remove guarantee implies 2ε replace-one
(group privacy with k = 2; the reverse does not hold), see
:func:`replace_one_from_add_remove`.
"""

from __future__ import annotations

import enum
import math

import attr
import numpy as np
from dp_accounting import dp_event
from dp_accounting.dp_event import GaussianDpEvent as _DpaGaussianDpEvent
from dp_accounting import privacy_accountant as _dpa
from dp_accounting.dp_event import (  # pylint: disable=unused-import
    ComposedDpEvent,
    DpEvent,
    NonPrivateDpEvent,
    NoOpDpEvent,
    PoissonSampledDpEvent,
    RepeatAndSelectDpEvent,
    SampledWithoutReplacementDpEvent,
    SelfComposedDpEvent,
)

from jaxdp import _validation


class NeighbouringRelation(str, enum.Enum):
  """Which datasets are neighbours (the relation a DP guarantee is stated for).

  Mirrors ``dp_accounting.NeighboringRelation`` (``ADD_OR_REMOVE_ONE``,
  ``REPLACE_ONE``); the values are the strings jaxdp accepts everywhere.
  """

  ADD_OR_REMOVE_ONE = "add_remove"
  REPLACE_ONE = "replace_one"

  def __str__(self) -> str:
    return self.value


ADD_REMOVE = NeighbouringRelation.ADD_OR_REMOVE_ONE.value
REPLACE_ONE = NeighbouringRelation.REPLACE_ONE.value
DEFAULT_UNIT = "example"

_FROM_DP_ACCOUNTING = {
    _dpa.NeighboringRelation.ADD_OR_REMOVE_ONE: ADD_REMOVE,
    _dpa.NeighboringRelation.REPLACE_ONE: REPLACE_ONE,
}


def check_neighbouring(value, name: str = "neighbouring", allow_none: bool = False) -> str | None:
  """Returns the canonical string (``"add_remove"``/``"replace_one"``) of a relation.

  Accepts :class:`NeighbouringRelation`, its string values, and
  dp_accounting's ``NeighboringRelation.ADD_OR_REMOVE_ONE``/``REPLACE_ONE``.

  Raises:
    TypeError: ``value`` is not a string or relation (or is None while
      ``allow_none`` is False).
    ValueError: an unknown relation (e.g. dp_accounting's ``REPLACE_SPECIAL``).
  """
  if value is None:
    if allow_none:
      return None
    raise TypeError(f"{name} must be 'add_remove' or 'replace_one', got None.")
  if isinstance(value, _dpa.NeighboringRelation):
    if value not in _FROM_DP_ACCOUNTING:
      raise ValueError(f"{name}: jaxdp supports add_remove and replace_one, got {value}.")
    return _FROM_DP_ACCOUNTING[value]
  if not isinstance(value, str):
    raise TypeError(f"{name} must be 'add_remove' or 'replace_one', got {type(value).__name__}.")
  try:
    return NeighbouringRelation(value).value
  except ValueError:
    raise ValueError(f"{name} must be 'add_remove' or 'replace_one', got {value!r}.") from None


def check_unit(value, name: str = "unit") -> str:
  """A privacy unit is a non-empty string (``"example"``, ``"party"``, ...)."""
  if not isinstance(value, str) or not value:
    raise TypeError(f"{name} must be a non-empty string such as 'example', got {value!r}.")
  return value


def _relation_converter(value):
  return check_neighbouring(value, allow_none=True)


def _unit_validator(instance, attribute, value):
  del instance, attribute
  check_unit(value)


def _neighbouring_field():
  return attr.field(default=None, kw_only=True, converter=_relation_converter)


def _unit_field():
  return attr.field(default=DEFAULT_UNIT, kw_only=True, validator=_unit_validator)


def _real(value, name: str) -> float:
  """``value`` as a float; bools, strings and other non-reals raise ArgumentTypeError (a TypeError)."""
  return _validation._as_float(value, name)  # pylint: disable=protected-access


def _check_positive_epsilon(name, value):
  v = _real(value, name)
  if not v > 0:
    raise ValueError(f"{name} must be > 0, got {value!r} (a mechanism that costs nothing is "
                     "NoOpDpEvent()).")


def _check_nonnegative(name, value):
  v = _real(value, name)
  if v < 0:
    raise ValueError(f"{name} must be >= 0, got {value!r}.")


def _check_positive_finite(name, value):
  v = _real(value, name)
  if not 0 < v < math.inf:
    raise ValueError(f"{name} must be finite and > 0, got {value!r}.")


def _check_delta(name, value):
  v = _real(value, name)
  if not 0.0 <= v < 1.0:
    raise ValueError(f"{name} must be in [0, 1), got {value!r}.")


@attr.define(frozen=True)
class GaussianDpEvent(dp_event.GaussianDpEvent):
  """dp_accounting's Gaussian event (``noise_multiplier = σ/Δ₂``) with a relation tag."""

  neighbouring: str | None = _neighbouring_field()
  unit: str = _unit_field()

  def __attrs_post_init__(self):
    _check_nonnegative("GaussianDpEvent.noise_multiplier", self.noise_multiplier)


@attr.define(frozen=True)
class LaplaceDpEvent(dp_event.LaplaceDpEvent):
  """dp_accounting's Laplace event (``noise_multiplier = b/Δ₁``) with a relation tag."""

  neighbouring: str | None = _neighbouring_field()
  unit: str = _unit_field()

  def __attrs_post_init__(self):
    _check_nonnegative("LaplaceDpEvent.noise_multiplier", self.noise_multiplier)


@attr.define(frozen=True)
class ZCDpEvent(dp_event.ZCDpEvent):
  """dp_accounting's ρ-zCDP event (``xi = 0``) with a relation tag."""

  neighbouring: str | None = _neighbouring_field()
  unit: str = _unit_field()

  def __attrs_post_init__(self):
    _check_nonnegative("ZCDpEvent.rho", self.rho)
    _check_nonnegative("ZCDpEvent.xi", self.xi)
    if float(self.rho) == 0.0 and float(self.xi) == 0.0:
      raise ValueError("ZCDpEvent.rho must be > 0 (a mechanism that costs nothing is NoOpDpEvent()).")


@attr.define(frozen=True)
class PureDpEvent(DpEvent):
  """A mechanism that is ε-differentially private by its own proof (ε > 0; ∞ = not private)."""

  epsilon: float = attr.field(converter=lambda v: _checked_float(_check_positive_epsilon,
                                                                 "PureDpEvent.epsilon", v))
  neighbouring: str | None = _neighbouring_field()
  unit: str = _unit_field()


@attr.define(frozen=True)
class ApproxDpEvent(DpEvent):
  """A mechanism that is (ε, δ)-differentially private by its own proof (ε >= 0, δ in [0, 1), not both 0)."""

  epsilon: float = attr.field(converter=lambda v: _checked_float(_check_nonnegative,
                                                                 "ApproxDpEvent.epsilon", v))
  delta: float = attr.field(converter=lambda v: _checked_float(_check_delta,
                                                               "ApproxDpEvent.delta", v))
  neighbouring: str | None = _neighbouring_field()
  unit: str = _unit_field()

  def __attrs_post_init__(self):
    if self.epsilon == 0.0 and self.delta == 0.0:
      raise ValueError("ApproxDpEvent with epsilon = delta = 0 costs nothing: use NoOpDpEvent().")


@attr.define(frozen=True)
class ExponentialMechanismDpEvent(DpEvent):
  """One draw of the exponential mechanism ``p(i) ∝ exp(β · score_i)``.

  Attributes:
    beta: the inverse temperature β (finite, > 0).
    sensitivity: the sensitivity Δ of every score (max over neighbours and
      outputs of ``|score_i(D) − score_i(D')|``; finite, > 0).
    neighbouring, unit: the relation Δ was computed for (see module doc).

  Guarantees: ``epsilon = 2βΔ`` pure DP and ``rho = (βΔ)²/2`` zCDP.
  """

  beta: float = attr.field(converter=lambda v: _checked_float(
      _check_positive_finite, "ExponentialMechanismDpEvent.beta", v))
  sensitivity: float = attr.field(default=1.0, converter=lambda v: _checked_float(
      _check_positive_finite, "ExponentialMechanismDpEvent.sensitivity", v))
  neighbouring: str | None = _neighbouring_field()
  unit: str = _unit_field()

  @property
  def epsilon(self) -> float:
    return 2.0 * self.beta * self.sensitivity

  @property
  def rho(self) -> float:
    return 0.5 * (self.beta * self.sensitivity) ** 2


def _checked_float(check, name, value) -> float:
  check(name, value)
  return float(value)


TAGGED_EVENT_TYPES = (GaussianDpEvent, LaplaceDpEvent, ZCDpEvent, PureDpEvent, ApproxDpEvent,
                      ExponentialMechanismDpEvent)
# RepeatAndSelectDpEvent(event, mean, shape): run ``event``'s mechanism a random number of times
# and release only the best run (Papernot & Steinke 2022); its relation is its inner event's.
_STRUCTURAL = (ComposedDpEvent, SelfComposedDpEvent, PoissonSampledDpEvent,
               SampledWithoutReplacementDpEvent, RepeatAndSelectDpEvent, NoOpDpEvent,
               NonPrivateDpEvent)


def leaf_tags(event: DpEvent) -> set[tuple[str | None, str | None]]:
  """The ``(neighbouring, unit)`` tags of the leaves of an event tree.

  Structural events contribute their children's tags; no-op and non-private
  events none (they hold under any relation). An untagged leaf (a raw
  dp_accounting event, or ``neighbouring=None``) contributes ``(None, None)``.
  """
  if isinstance(event, (NoOpDpEvent, NonPrivateDpEvent)):
    return set()
  if isinstance(event, ComposedDpEvent):
    return set().union(*[leaf_tags(e) for e in event.events])
  if isinstance(event, (SelfComposedDpEvent, PoissonSampledDpEvent,
                        SampledWithoutReplacementDpEvent, RepeatAndSelectDpEvent)):
    return leaf_tags(event.event)
  relation = getattr(event, "neighbouring", None)
  if relation is None:
    return {(None, None)}
  return {(relation, getattr(event, "unit", DEFAULT_UNIT))}


def _sampled_subtrees(event: DpEvent):
  """The subsampled events of the tree (each yielded once, not searched inside)."""
  if isinstance(event, (PoissonSampledDpEvent, SampledWithoutReplacementDpEvent)):
    yield event
  elif isinstance(event, ComposedDpEvent):
    for e in event.events:
      yield from _sampled_subtrees(e)
  elif isinstance(event, (SelfComposedDpEvent, RepeatAndSelectDpEvent)):
    yield from _sampled_subtrees(event.event)


def contains_repeat_and_select(event: DpEvent) -> bool:
  """Whether the tree holds a :class:`RepeatAndSelectDpEvent` (only RDP and pure DP bound it)."""
  if isinstance(event, RepeatAndSelectDpEvent):
    return True
  if isinstance(event, ComposedDpEvent):
    return any(contains_repeat_and_select(e) for e in event.events)
  if isinstance(event, (SelfComposedDpEvent, PoissonSampledDpEvent,
                        SampledWithoutReplacementDpEvent)):
    return contains_repeat_and_select(event.event)
  return False


def contains_sampling(event: DpEvent) -> bool:
  """Whether the tree holds a subsampled event (amplification depends on the relation)."""
  return any(True for _ in _sampled_subtrees(event))


def sampling_is_replace_one_accountable(event: DpEvent) -> bool:
  """Whether every subsampled subtree of ``event`` is a sampled Gaussian tagged replace-one.

  Under ``replace_one`` neighbours these are the only subsampled events jaxdp
  accounts: a Poisson-sampled Gaussian (by PLD, see
  :func:`replace_one_sampled_gaussian_std`) and a Gaussian sampled WITHOUT
  replacement, fixed-size batches (by RDP, Wang, Balle & Kasiviswanathan 2019,
  Thm 27; :func:`jaxdp.accounting.dpsgd_accounting.fixed_size_dpsgd_event`);
  every other amplification bound here is proven for add/remove only. Tagged on
  purpose: an untagged dp_accounting Gaussian usually carries DP-SGD's
  ``z = sigma / C`` (add/remove), which read as ``sigma / (2C)`` would halve the
  sensitivity.
  """
  return all(isinstance(s, (PoissonSampledDpEvent, SampledWithoutReplacementDpEvent))
             and isinstance(s.event, _DpaGaussianDpEvent)
             and getattr(s.event, "neighbouring", None) == REPLACE_ONE
             for s in _sampled_subtrees(event))


def contains_poisson_sampling(event: DpEvent) -> bool:
  """Whether the tree holds a Poisson-sampled event."""
  return any(isinstance(s, PoissonSampledDpEvent) for s in _sampled_subtrees(event))


def contains_sampling_without_replacement(event: DpEvent) -> bool:
  """Whether the tree holds a sampled-without-replacement (fixed-size batch) event."""
  return any(isinstance(s, SampledWithoutReplacementDpEvent) for s in _sampled_subtrees(event))


def replace_one_sampled_gaussian_std(noise_multiplier: float) -> float:
  """dp_accounting's ``REPLACE_ONE`` standard deviation of a replace-one sampled Gaussian event.

  A ``PoissonSampledDpEvent(q, GaussianDpEvent(z, neighbouring="replace_one"))``
  describes a sum of per-unit contributions, each of L2 norm at most ``c``,
  Poisson-sampled at rate q, plus ``N(0, sigma^2 I)``. Its replace-one
  sensitivity at ``q = 1`` is ``Delta = 2c`` (one contribution ``g`` replaced by
  ``g' = -g``), so by the convention of this module ``z = sigma / (2c)``.
  Replacing one unit changes the output law from
  ``(1 - q) N(s, sigma^2) + q N(s + g, sigma^2)`` to
  ``(1 - q) N(s, sigma^2) + q N(s + g', sigma^2)``; the dominating pair puts
  ``g = -g'`` on one axis at norm ``c`` (Zhu, Dong & Wang 2022, "Optimal
  accounting of differential privacy via characteristic function", Sec. 5;
  Doroshenko et al. 2022, the pair dp_accounting's PLD computes in its
  ``REPLACE_ONE`` mode with "sensitivity" ``c``). In dp_accounting's units
  (sensitivity 1 = ``c``) the standard deviation is ``sigma / c = 2 z``.
  At ``q = 1`` this is the Gaussian mechanism of sensitivity ``2c``: ``z`` again.
  """
  return 2.0 * float(noise_multiplier)


def with_neighbouring(event: DpEvent, neighbouring, unit: str = DEFAULT_UNIT) -> DpEvent:
  """A copy of ``event`` with every leaf tagged ``(neighbouring, unit)``.

  Use it to tag an event whose guarantee you proved for ``neighbouring``
  (e.g. a raw dp_accounting ``GaussianDpEvent``). Leaves already tagged with
  another relation or unit raise ValueError (re-tagging is not a conversion;
  see :func:`replace_one_from_add_remove`).
  """
  relation = check_neighbouring(neighbouring)
  unit = check_unit(unit)
  data = event_to_dict(event)

  def tag(d):
    if not isinstance(d, dict) or "type" not in d:
      return d
    d = {k: ([tag(x) for x in v] if isinstance(v, list) else tag(v)) for k, v in d.items()}
    if _EVENT_TYPES[d["type"]] in TAGGED_EVENT_TYPES:
      old = d.get("neighbouring")
      if old is not None and (old, d.get("unit", DEFAULT_UNIT)) != (relation, unit):
        raise ValueError(f"{d['type']} is already tagged ({old}, {d.get('unit', DEFAULT_UNIT)}); "
                         f"cannot re-tag it ({relation}, {unit}).")
      d["neighbouring"], d["unit"] = relation, unit
    return d

  return event_from_dict(tag(data))


def replace_one_from_add_remove(epsilon: float, delta: float = 0.0,
                                unit: str = DEFAULT_UNIT) -> DpEvent:
  """The replace-one event implied by an (ε, δ) add/remove guarantee.

  Group privacy with k = 2 (Dwork & Roth 2014, Thm 2.2 and its (ε, δ)
  extension): replace-one neighbours ``D, D'`` are two add/remove steps apart
  through ``D'' = D \\ {x}``, so for every set S
  ``P[M(D) ∈ S] ≤ e^ε (e^ε P[M(D') ∈ S] + δ) + δ``, i.e. M is
  ``(2ε, (1 + e^ε) δ)``-DP for replace-one neighbours. The converse does not
  hold (a replace-one bound says nothing about changing the dataset size).

  Args:
    epsilon: the add/remove ε (> 0) of a whole mechanism or run (e.g. the ε of
      a DP-SGD run at δ, computed by an add/remove accountant).
    delta: its δ in [0, 1).
    unit: the privacy unit of the guarantee.

  Returns:
    ``PureDpEvent(2ε, neighbouring="replace_one")`` if δ = 0, else
    ``ApproxDpEvent(2ε, (1 + e^ε)δ, neighbouring="replace_one")``.

  >>> replace_one_from_add_remove(0.5)
  PureDpEvent(epsilon=1.0, neighbouring='replace_one', unit='example')
  """
  eps = _checked_float(_check_positive_epsilon, "epsilon", epsilon)
  dlt = _checked_float(_check_delta, "delta", delta)
  if dlt == 0.0:
    return PureDpEvent(2.0 * eps, neighbouring=REPLACE_ONE, unit=unit)
  new_delta = (1.0 + math.exp(eps)) * dlt
  if not new_delta < 1.0:
    raise ValueError(f"(1 + e^epsilon) * delta = {new_delta:.3g} >= 1: no replace-one guarantee.")
  return ApproxDpEvent(2.0 * eps, new_delta, neighbouring=REPLACE_ONE, unit=unit)


# Registry used to serialise ledgers (budget save/restore).
_EVENT_TYPES = {
    cls.__name__: cls
    for cls in [
        ComposedDpEvent, GaussianDpEvent, LaplaceDpEvent, NonPrivateDpEvent,
        NoOpDpEvent, PoissonSampledDpEvent, RepeatAndSelectDpEvent,
        SampledWithoutReplacementDpEvent, SelfComposedDpEvent, ZCDpEvent, PureDpEvent, ApproxDpEvent,
        ExponentialMechanismDpEvent,
    ]
}


def event_to_dict(event: DpEvent) -> dict:
  """Serialises an event (recursively) to JSON-compatible data."""
  if type(event).__name__ not in _EVENT_TYPES:
    raise ValueError(f"cannot serialise DpEvent of type {type(event).__name__}.")
  out = {"type": type(event).__name__}
  for field in attr.fields(type(event)):
    value = getattr(event, field.name)
    if isinstance(value, np.generic):  # numpy scalars (e.g. a float32 noise multiplier)
      value = value.item()
    if isinstance(value, DpEvent):
      value = event_to_dict(value)
    elif isinstance(value, (list, tuple)):
      value = [event_to_dict(v) if isinstance(v, DpEvent) else v for v in value]
    out[field.name] = value
  return out


def event_from_dict(data: dict) -> DpEvent:
  """Inverse of :func:`event_to_dict`."""
  data = dict(data)
  cls = _EVENT_TYPES[data.pop("type")]
  kwargs = {}
  for key, value in data.items():
    if isinstance(value, dict) and "type" in value:
      value = event_from_dict(value)
    elif isinstance(value, list):
      value = [event_from_dict(v) if isinstance(v, dict) and "type" in v else v for v in value]
    kwargs[key] = value
  return cls(**kwargs)


__all__ = [
    "ADD_REMOVE", "DEFAULT_UNIT", "NeighbouringRelation", "REPLACE_ONE", "TAGGED_EVENT_TYPES",
    "check_neighbouring", "check_unit", "contains_poisson_sampling", "contains_repeat_and_select",
    "contains_sampling",
    "contains_sampling_without_replacement", "leaf_tags",
    "replace_one_from_add_remove", "with_neighbouring",
    "ApproxDpEvent", "ComposedDpEvent", "DpEvent", "ExponentialMechanismDpEvent",
    "GaussianDpEvent", "LaplaceDpEvent", "NonPrivateDpEvent", "NoOpDpEvent",
    "PoissonSampledDpEvent", "PureDpEvent", "RepeatAndSelectDpEvent",
    "SampledWithoutReplacementDpEvent",
    "SelfComposedDpEvent", "ZCDpEvent", "event_from_dict", "event_to_dict",
]

del dp_event
