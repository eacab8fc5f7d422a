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
"""

from __future__ import annotations

import math

import attr
import numpy as np
from dp_accounting import dp_event
from dp_accounting.dp_event import (  # pylint: disable=unused-import
    ComposedDpEvent,
    DpEvent,
    GaussianDpEvent,
    LaplaceDpEvent,
    NonPrivateDpEvent,
    NoOpDpEvent,
    PoissonSampledDpEvent,
    SampledWithoutReplacementDpEvent,
    SelfComposedDpEvent,
    ZCDpEvent,
)


def _check_epsilon(instance, attribute, value):
  del instance
  if not isinstance(value, (int, float)) or math.isnan(value) or value < 0:
    raise ValueError(f"{attribute.name} must be a number >= 0, got {value!r}.")


def _check_delta(instance, attribute, value):
  del instance
  if not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
    raise ValueError(f"{attribute.name} must be in [0, 1), got {value!r}.")


@attr.define(frozen=True)
class PureDpEvent(DpEvent):
  """A mechanism that is ε-differentially private by its own proof."""

  epsilon: float = attr.field(converter=float, validator=_check_epsilon)


@attr.define(frozen=True)
class ApproxDpEvent(DpEvent):
  """A mechanism that is (ε, δ)-differentially private by its own proof."""

  epsilon: float = attr.field(converter=float, validator=_check_epsilon)
  delta: float = attr.field(converter=float, validator=_check_delta)


@attr.define(frozen=True)
class ExponentialMechanismDpEvent(DpEvent):
  """One draw of the exponential mechanism ``p(i) ∝ exp(β · score_i)``.

  Attributes:
    beta: the inverse temperature β (> 0).
    sensitivity: the sensitivity Δ of every score (max over neighbours and
      outputs of ``|score_i(D) − score_i(D')|``).

  Guarantees: ``epsilon = 2βΔ`` pure DP and ``rho = (βΔ)²/2`` zCDP.
  """

  beta: float = attr.field(converter=float, validator=_check_epsilon)
  sensitivity: float = attr.field(default=1.0, converter=float, validator=_check_epsilon)

  @property
  def epsilon(self) -> float:
    return 2.0 * self.beta * self.sensitivity

  @property
  def rho(self) -> float:
    return 0.5 * (self.beta * self.sensitivity) ** 2


# Registry used to serialise ledgers (budget save/restore).
_EVENT_TYPES = {
    cls.__name__: cls
    for cls in [
        ComposedDpEvent, GaussianDpEvent, LaplaceDpEvent, NonPrivateDpEvent,
        NoOpDpEvent, PoissonSampledDpEvent, SampledWithoutReplacementDpEvent,
        SelfComposedDpEvent, ZCDpEvent, PureDpEvent, ApproxDpEvent,
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
    "ApproxDpEvent", "ComposedDpEvent", "DpEvent", "ExponentialMechanismDpEvent",
    "GaussianDpEvent", "LaplaceDpEvent", "NonPrivateDpEvent", "NoOpDpEvent",
    "PoissonSampledDpEvent", "PureDpEvent", "SampledWithoutReplacementDpEvent",
    "SelfComposedDpEvent", "ZCDpEvent", "event_from_dict", "event_to_dict",
]

del dp_event
