"""Zero-concentrated DP (Bun & Steinke 2016) and its conversions.

Paper 003 (``003_dp_confidence_intervals_for_erm.md``, Section 2) uses:

* Proposition 1: ε-DP ⇒ (ε²/2)-zCDP (:func:`pure_dp_to_zcdp`);
* Proposition 2: ρ-zCDP ⇒ (ρ + 2 sqrt(ρ log(1/δ)), δ)-DP (:func:`zcdp_to_approx_dp`);
* Proposition 3: the Gaussian mechanism with σ = Δ/sqrt(2ρ) is ρ-zCDP
  (:func:`gaussian_zcdp_sigma`, :func:`gaussian_zcdp_rho`).

We add the tighter conversion of Canonne, Kamath & Steinke (2020,
Proposition 12 / Asoodeh et al.) used by :class:`PrivacyAccountant`, and the
bounded-range bound (ε-BR ⇒ ε²/8-zCDP, Cesar & Rogers 2021) that applies to
the exponential mechanism. All arithmetic is float64.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import optimize

from jaxdp import _validation


def pure_dp_to_zcdp(epsilon: float) -> float:
  """ε-DP ⇒ (ε²/2)-zCDP (Bun & Steinke 2016 Prop 1.4; paper 003 Proposition 1)."""
  epsilon = _validation.check_nonnegative(epsilon, "epsilon")
  return 0.5 * epsilon**2


def bounded_range_to_zcdp(epsilon: float) -> float:
  """ε-bounded-range ⇒ (ε²/8)-zCDP (Cesar & Rogers 2021).

  The exponential mechanism ``p ∝ exp(β s)`` with a Δ-sensitive score is
  2βΔ-bounded-range, hence (βΔ)²/2-zCDP.
  """
  epsilon = _validation.check_nonnegative(epsilon, "epsilon")
  return epsilon**2 / 8.0


def gaussian_zcdp_rho(sigma: float, sensitivity: float = 1.0) -> float:
  """ρ = Δ²/(2σ²) for Gaussian noise of std σ on a Δ-sensitive query (paper 003 Prop 3)."""
  sigma = _validation.check_positive(sigma, "sigma")
  sensitivity = _validation.check_sensitivity(sensitivity)
  return sensitivity**2 / (2.0 * sigma**2)


def gaussian_zcdp_sigma(rho: float, sensitivity: float = 1.0) -> float:
  """σ = Δ/sqrt(2ρ) (paper 003 Proposition 3)."""
  rho = _validation.check_positive(rho, "rho")
  sensitivity = _validation.check_sensitivity(sensitivity)
  return sensitivity / math.sqrt(2.0 * rho)


def zcdp_to_approx_dp(rho: float, delta: float) -> float:
  """ρ-zCDP ⇒ (ρ + 2 sqrt(ρ log(1/δ)), δ)-DP (paper 003 Proposition 2)."""
  rho = _validation.check_nonnegative(rho, "rho")
  delta = _validation.check_delta(delta, allow_zero=False)
  return rho + 2.0 * math.sqrt(rho * math.log(1.0 / delta))


def zcdp_to_approx_dp_tight(rho: float, delta: float) -> float:
  """Tighter conversion: ε = inf_{α>1} αρ + (log(1/δ) + (α−1) log(1−1/α) − log α)/(α−1).

  Canonne, Kamath & Steinke (2020), Proposition 12 (from Asoodeh et al. 2020).
  Never larger than :func:`zcdp_to_approx_dp`; the result is
  ``min`` of the two so a numerical optimiser failure cannot loosen it.
  """
  rho = _validation.check_nonnegative(rho, "rho")
  delta = _validation.check_delta(delta, allow_zero=False)
  if rho == 0.0:
    return 0.0
  if math.isinf(rho):
    return math.inf
  log_inv_delta = math.log(1.0 / delta)

  def bound(log_alpha_minus_1: float) -> float:
    a = 1.0 + math.exp(log_alpha_minus_1)
    return a * rho + (log_inv_delta + (a - 1.0) * math.log1p(-1.0 / a) - math.log(a)) / (a - 1.0)

  res = optimize.minimize_scalar(bound, bounds=(-20.0, 20.0), method="bounded",
                                 options={"xatol": 1e-10})
  grid = np.linspace(-20.0, 20.0, 401)
  best_grid = min(bound(g) for g in grid)
  return max(0.0, min(float(res.fun), best_grid, zcdp_to_approx_dp(rho, delta)))


def approx_dp_to_zcdp_budget(epsilon: float, delta: float) -> float:
  """Largest ρ whose Proposition-2 conversion gives at most (ε, δ).

  Solves ρ + 2 sqrt(ρ L) = ε, L = log(1/δ): ρ = (sqrt(L + ε) − sqrt(L))².
  """
  epsilon = _validation.check_epsilon(epsilon)
  delta = _validation.check_delta(delta, allow_zero=False)
  log_inv_delta = math.log(1.0 / delta)
  return (math.sqrt(log_inv_delta + epsilon) - math.sqrt(log_inv_delta)) ** 2


__all__ = [
    "approx_dp_to_zcdp_budget",
    "bounded_range_to_zcdp",
    "gaussian_zcdp_rho",
    "gaussian_zcdp_sigma",
    "pure_dp_to_zcdp",
    "zcdp_to_approx_dp",
    "zcdp_to_approx_dp_tight",
]
