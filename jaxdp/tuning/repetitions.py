"""Laws of the random number of runs K of private hyper-parameter tuning.

Papernot & Steinke 2022 ("Hyperparameter tuning with Renyi differential
privacy", ICLR; arXiv 2110.03620v2) run a private mechanism K times, K drawn
from a public law independent of the data, and release only the best run. The
privacy cost depends on the law of K only through ``(E[K], shape)``, which is
what dp_accounting's ``RepeatAndSelectDpEvent(event, mean, shape)`` records:

* :class:`TruncatedNegativeBinomial` ``(mean, shape=η)``, η in (0, ∞):
  ``P[K = k] = (1 − γ)^k / (γ^{−η} − 1) · Π_{l=0}^{k−1} (l + η)/(l + 1)`` for
  k >= 1 (PS22 Definition 1), i.e. a negative binomial conditioned on K >= 1.
  Its RDP is PS22 Theorem 2.
* :class:`GeometricRepetitions` (η = 1): ``P[K = k] = γ (1 − γ)^{k−1}``,
  ``E[K] = 1/γ`` (Liu & Talwar 2019's random stopping).
* :class:`LogarithmicRepetitions` (η = 0): ``P[K = k] = (1 − γ)^k / (k log(1/γ))``.
* :class:`PoissonRepetitions` (η = ∞): ``P[K = k] = e^{−μ} μ^k / k!`` for k >= 0
  (PS22 Theorem 6). K = 0 happens with probability e^{−μ}: the procedure then
  releases nothing (``None``), as in the paper; that outcome is covered by the
  theorem.

The truncated laws never draw K = 0. PS22 also allow η in (−1, 0); dp_accounting
accounts only η >= 0, so only those are offered here.

γ is found from ``mean`` by bisection in float64 (geometric: γ = 1/mean
exactly) and the returned γ is the upper end of the bracket, so the law that is
sampled has ``E[K] <= mean`` and a γ at least dp_accounting's (which returns
the lower end): both terms of the Theorem 2 bound that depend on the law,
``log E[K]`` and ``log(1/γ)``, are then over-estimated by the accounting,
never under-estimated.

Sampling is exact inversion of the float64 CDF with one 53-bit uniform made
from ``jax.random.bits`` of the key (closed form for the geometric law): the
law of K is the pmf up to float64 rounding (the inversion stops once the
remaining tail mass is below 1e-16).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxdp import _validation
from jaxdp.accounting import events

MAX_MEAN = 1e6  # a larger mean would run the mechanism a million times on average


def _uniform53(key: jax.Array) -> float:
  """One uniform in (0, 1) with 53 random bits, from ``key`` (float64, on the host)."""
  bits = np.asarray(jax.random.bits(key, (2,), jnp.uint32), dtype=np.uint64)
  n = (int(bits[0]) >> 6) * (1 << 27) + (int(bits[1]) >> 5)  # 26 + 27 bits
  return (n + 0.5) / float(1 << 53)


def _check_mean(mean: Any, name: str, low_inclusive: bool) -> float:
  value = _validation._as_float(mean, name)  # pylint: disable=protected-access
  ok = (value >= 1.0) if low_inclusive else (value > 1.0)
  if not (ok and value <= MAX_MEAN):
    bound = ">= 1" if low_inclusive else "> 1"
    raise ValueError(f"{name} must be finite, {bound} and <= {MAX_MEAN:g}, got {mean!r}.")
  return value


def _tnb_mean(gamma: float, shape: float) -> float:
  """E[K] of the truncated negative binomial (PS22 Definition 1), float64."""
  if gamma >= 1.0:
    return 1.0
  if shape == 1.0:
    return 1.0 / gamma
  log_gamma = math.log(gamma)
  if shape == 0.0:
    return (1.0 - gamma) / (gamma * -log_gamma)
  return shape * (1.0 - gamma) / (gamma * -math.expm1(shape * log_gamma))


def _gamma_for_mean(shape: float, mean: float) -> float:
  """The γ with E[K] <= mean, within float64 of the root (upper end of a bisection bracket)."""
  if shape == 1.0:
    return 1.0 / mean
  lo, hi = 0.0, 1.0  # E[K] is decreasing in γ; E[K](1) = 1 < mean
  hi = min(1.0, 2.0 * (shape + 1.0) / mean)  # E[K] <= 2 (η + 1)/γ
  while _tnb_mean(hi, shape) > mean:  # safety: make sure hi is an upper end
    hi = min(1.0, 2.0 * hi)
  for _ in range(200):
    mid = 0.5 * (lo + hi)
    if mid <= lo or mid >= hi:
      break
    if _tnb_mean(mid, shape) > mean:
      lo = mid
    else:
      hi = mid
  return hi


def _invert(u: float, logpmf, start: int, mode: float) -> int:
  """Smallest k >= start with CDF(k) >= u, summing pmf terms in float64."""
  cdf, k = 0.0, start
  while True:
    p = math.exp(logpmf(k))
    cdf += p
    if cdf >= u:
      return k
    if k > mode and p < 1e-17 * max(1.0, k):  # the remaining tail mass is below ~1e-16
      return k
    k += 1


class _Law:
  """Shared methods of the laws of K."""

  mean: float
  shape: float

  def _logpmf(self, k: int) -> float:
    raise NotImplementedError

  @property
  def min_runs(self) -> int:
    """The smallest K the law draws (1 for the truncated laws, 0 for Poisson)."""
    return 1

  def pmf(self, k: Any) -> np.ndarray:
    """``P[K = k]`` in float64 (elementwise over an integer array; 0 outside the support)."""
    ks = np.asarray(k)
    if ks.dtype.kind not in "iu":
      if not np.all(np.equal(np.mod(ks, 1), 0)):
        raise ValueError(f"k must be integers, got {k!r}.")
    flat = ks.astype(np.int64).ravel()
    out = np.array([math.exp(self._logpmf(int(v))) if v >= self.min_runs else 0.0 for v in flat],
                   dtype=np.float64)
    return out.reshape(ks.shape)

  def event(self, per_run_event: events.DpEvent) -> events.DpEvent:
    """``RepeatAndSelectDpEvent(per_run_event, mean, shape)``: the whole procedure's event.

    RDP: Papernot & Steinke 2022 Thm 2 (truncated negative binomial,
    logarithmic, geometric) and Thm 6 (Poisson), computed by dp_accounting's
    RDP accountant; pure DP (pure run, shape < inf): ``(2 + shape) ε``.
    """
    if not isinstance(per_run_event, events.DpEvent):
      raise TypeError(f"per_run_event must be a DpEvent, got {type(per_run_event).__name__}.")
    return events.RepeatAndSelectDpEvent(per_run_event, float(self.mean), float(self.shape))


@dataclasses.dataclass(frozen=True)
class TruncatedNegativeBinomial(_Law):
  """K >= 1 with ``P[K = k] ∝ C(k + η − 1, k) (1 − γ)^k`` (PS22 Definition 1), η = ``shape``.

  Attributes:
    mean: E[K] (finite, > 1); γ is solved from it (see the module docstring).
    shape: η >= 0, finite (0: logarithmic, 1: geometric; Poisson is
      :class:`PoissonRepetitions`).
  """

  mean: float
  shape: float
  gamma: float = dataclasses.field(init=False, repr=False, compare=False, default=float("nan"))

  def __post_init__(self):
    mean = _check_mean(self.mean, f"{type(self).__name__}.mean", low_inclusive=False)
    shape = _validation._as_float(self.shape, f"{type(self).__name__}.shape")  # pylint: disable=protected-access
    if not 0.0 <= shape < math.inf:
      raise ValueError(f"{type(self).__name__}.shape must be finite and >= 0 (dp_accounting "
                       f"accounts shape >= 0; use PoissonRepetitions for shape = inf), got "
                       f"{self.shape!r}.")
    object.__setattr__(self, "mean", mean)
    object.__setattr__(self, "shape", shape)
    object.__setattr__(self, "gamma", _gamma_for_mean(shape, mean))

  def _logpmf(self, k: int) -> float:
    g, eta = self.gamma, self.shape
    log1m = math.log1p(-g)
    if eta == 0.0:
      return k * log1m - math.log(k) - math.log(-math.log(g))
    return (math.lgamma(k + eta) - math.lgamma(eta) - math.lgamma(k + 1.0) + k * log1m
            + eta * math.log(g) - math.log(-math.expm1(eta * math.log(g))))

  def sample(self, key: jax.Array) -> int:
    """One K >= 1 drawn from ``key`` (exact inversion in float64)."""
    _validation.check_key(key)
    return _draw_count(self, _uniform53(key))


@dataclasses.dataclass(frozen=True)
class GeometricRepetitions(TruncatedNegativeBinomial):
  """K >= 1 geometric, ``P[K = k] = γ (1 − γ)^{k−1}``, γ = 1/mean (TNB with shape 1).

  With a pure ε-DP run the best of K runs is 3ε-DP (Liu & Talwar 2019).
  """

  mean: float
  shape: float = dataclasses.field(init=False, default=1.0)


@dataclasses.dataclass(frozen=True)
class LogarithmicRepetitions(TruncatedNegativeBinomial):
  """K >= 1 logarithmic, ``P[K = k] = (1 − γ)^k / (k log(1/γ))`` (TNB with shape 0).

  With a pure ε-DP run the best of K runs is 2ε-DP (PS22 Thm 2, λ → ∞).
  """

  mean: float
  shape: float = dataclasses.field(init=False, default=0.0)


@dataclasses.dataclass(frozen=True)
class PoissonRepetitions(_Law):
  """K ~ Poisson(mean), K >= 0 (PS22 Theorem 6); K = 0 releases nothing (``None``).

  Attributes:
    mean: μ = E[K] (finite, >= 1: dp_accounting's domain of Theorem 6).
  """

  mean: float

  def __post_init__(self):
    object.__setattr__(self, "mean", _check_mean(self.mean, "PoissonRepetitions.mean",
                                                 low_inclusive=True))

  @property
  def shape(self) -> float:
    return math.inf

  @property
  def min_runs(self) -> int:
    return 0

  def _logpmf(self, k: int) -> float:
    return -self.mean + k * math.log(self.mean) - math.lgamma(k + 1.0)

  def sample(self, key: jax.Array) -> int:
    """One K >= 0 drawn from ``key`` (exact inversion in float64)."""
    _validation.check_key(key)
    return _draw_count(self, _uniform53(key))


def _draw_count(law: Any, u: float) -> int:
  """K = the smallest k with CDF(k) >= u (u uniform in (0, 1)): a draw of ``law``."""
  if isinstance(law, PoissonRepetitions):
    return _invert(u, law._logpmf, 0, law.mean)  # pylint: disable=protected-access
  if law.shape == 1.0:  # geometric: P[K > k] = (1 - γ)^k, K = ceil(log u / log(1 - γ))
    return max(1, int(math.ceil(math.log(u) / math.log1p(-law.gamma))))
  mode = max(1.0, (law.shape - 1.0) * (1.0 - law.gamma) / law.gamma)
  return _invert(u, law._logpmf, 1, mode)  # pylint: disable=protected-access


Repetitions = (TruncatedNegativeBinomial, PoissonRepetitions)


def check_repetitions(repetitions: Any, name: str = "repetitions") -> Any:
  """Raises TypeError unless ``repetitions`` is one of this module's laws."""
  if not isinstance(repetitions, Repetitions):
    raise TypeError(f"{name} must be a TruncatedNegativeBinomial, GeometricRepetitions, "
                    f"LogarithmicRepetitions or PoissonRepetitions, got "
                    f"{type(repetitions).__name__}.")
  return repetitions


__all__ = ["GeometricRepetitions", "LogarithmicRepetitions", "PoissonRepetitions",
           "TruncatedNegativeBinomial", "check_repetitions"]
