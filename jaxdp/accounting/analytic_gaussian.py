"""The analytic Gaussian mechanism (Balle & Wang, 2018).

For a function ``f`` of L2 sensitivity ``Δ``, the Gaussian mechanism
``f(D) + N(0, σ² I)`` is (ε, δ)-DP **if and only if** (Balle & Wang 2018,
Theorem 8; paper 000 Equation 17)::

    Φ(Δ/(2σ) − εσ/Δ) − e^ε Φ(−Δ/(2σ) − εσ/Δ) ≤ δ.            (*)

The smallest such σ is ``σ = α Δ / sqrt(2ε)`` where ``α`` is computed by
Algorithm 2 of ``000_tradeoffs_of_private_prediction.md`` (Algorithm 1 of
Balle & Wang), implemented here with both of its branches:

* if ``δ ≥ δ₀ = Φ(0) − e^ε Φ(−sqrt(2ε))``: ``v* = sup{v ≥ 0 : B⁺(v) ≤ δ}``
  with ``B⁺(v) = Φ(sqrt(εv)) − e^ε Φ(−sqrt(ε(v+2)))`` and
  ``α = sqrt(1 + v*/2) − sqrt(v*/2)``;
* else: ``u* = inf{u ≥ 0 : B⁻(u) ≤ δ}`` with
  ``B⁻(u) = Φ(−sqrt(εu)) − e^ε Φ(−sqrt(ε(u+2)))`` and
  ``α = sqrt(1 + u*/2) + sqrt(u*/2)`` (the branch the paper's text omits;
  it is in Balle & Wang's Algorithm 1).

Both searches are bisections in float64; the bracket end that is returned is
always the one that satisfies (*), so the returned σ never under-shoots.
``e^ε Φ(−x)`` is evaluated as ``exp(ε + log Φ(−x))`` so large ε do not
overflow.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import special

from jaxdp import _validation

_MAX_BISECTIONS = 2000


def _exp_eps_phi(epsilon: float, x: float) -> float:
  """e^ε Φ(x), computed in log space."""
  return math.exp(epsilon + float(special.log_ndtr(x)))


def _b_plus(epsilon: float, v: float) -> float:
  return float(special.ndtr(math.sqrt(epsilon * v))) - _exp_eps_phi(
      epsilon, -math.sqrt(epsilon * (v + 2.0)))


def _b_minus(epsilon: float, u: float) -> float:
  return float(special.ndtr(-math.sqrt(epsilon * u))) - _exp_eps_phi(
      epsilon, -math.sqrt(epsilon * (u + 2.0)))


def analytic_gaussian_delta(sigma: float, epsilon: float, sensitivity: float = 1.0) -> float:
  """The exact δ(ε) of the Gaussian mechanism, the left side of (*) (Balle & Wang Thm 8).

  Args:
    sigma: standard deviation of the Gaussian noise (> 0).
    epsilon: ε ≥ 0.
    sensitivity: L2 sensitivity Δ (> 0).

  Returns:
    The smallest δ for which the mechanism is (ε, δ)-DP, in float64.
  """
  sigma = _validation.check_positive(sigma, "sigma")
  if float(epsilon) < 0 or math.isnan(float(epsilon)):
    raise ValueError(f"epsilon must be >= 0, got {epsilon}.")
  epsilon = float(epsilon)
  sensitivity = _validation.check_positive(sensitivity, "sensitivity")
  a = sensitivity / (2.0 * sigma)
  b = epsilon * sigma / sensitivity
  if math.isinf(epsilon):
    return 0.0
  value = float(special.ndtr(a - b)) - _exp_eps_phi(epsilon, -a - b)
  return max(value, 0.0)


def analytic_gaussian_alpha(epsilon: float, delta: float) -> float:
  """The scalar α of Algorithm 2 (paper 000, Appendix B.1) with σ = αΔ/sqrt(2ε).

  Args:
    epsilon: ε in (0, inf).
    delta: δ in (0, 1).

  Returns:
    α in float64.
  """
  epsilon = _validation.check_epsilon(epsilon)
  delta = _validation.check_delta(delta, allow_zero=False)
  delta_0 = 0.5 - _exp_eps_phi(epsilon, -math.sqrt(2.0 * epsilon))
  if delta >= delta_0:
    # B⁺ increases from δ₀ (v = 0) to 1; v* is the largest v with B⁺(v) ≤ δ.
    lo, hi = 0.0, 1.0
    while _b_plus(epsilon, hi) <= delta:
      lo, hi = hi, 2.0 * hi
      if hi > 1e300:
        raise ValueError("analytic Gaussian search diverged; delta too close to 1.")
    for _ in range(_MAX_BISECTIONS):
      mid = 0.5 * (lo + hi)
      if mid in (lo, hi):
        break
      if _b_plus(epsilon, mid) <= delta:
        lo = mid
      else:
        hi = mid
    v_star = lo  # satisfies B⁺(v) ≤ δ; α decreases in v, so this errs on the safe side.
    # sqrt(1 + v/2) − sqrt(v/2), written without the cancellation that loses
    # digits for large v (tiny ε and δ).
    return 1.0 / (math.sqrt(1.0 + v_star / 2.0) + math.sqrt(v_star / 2.0))
  # B⁻ decreases from δ₀ (u = 0) to 0; u* is the smallest u with B⁻(u) ≤ δ.
  lo, hi = 0.0, 1.0
  while _b_minus(epsilon, hi) > delta:
    lo, hi = hi, 2.0 * hi
    if hi > 1e300:
      raise ValueError("analytic Gaussian search diverged; delta too small.")
  for _ in range(_MAX_BISECTIONS):
    mid = 0.5 * (lo + hi)
    if mid in (lo, hi):
      break
    if _b_minus(epsilon, mid) <= delta:
      hi = mid
    else:
      lo = mid
  u_star = hi  # satisfies B⁻(u) ≤ δ; α increases in u, so this errs on the safe side.
  return math.sqrt(1.0 + u_star / 2.0) + math.sqrt(u_star / 2.0)


def analytic_gaussian_sigma(epsilon: float, delta: float, sensitivity: float = 1.0) -> float:
  """Smallest σ making the Gaussian mechanism (ε, δ)-DP for L2 sensitivity Δ.

  ``σ = α Δ / sqrt(2ε)`` with α from :func:`analytic_gaussian_alpha`
  (paper 000 Algorithm 2 and Algorithm 3; Balle & Wang 2018 Theorems 8-9).

  >>> round(analytic_gaussian_sigma(1.0, 1e-5), 6)
  3.730632

  Args:
    epsilon: ε in (0, inf).
    delta: δ in (0, 1) (δ = 0 is impossible for Gaussian noise).
    sensitivity: L2 sensitivity Δ ≥ 0 (Δ = 0 needs no noise: σ = 0).

  Returns:
    σ in float64.
  """
  epsilon = _validation.check_epsilon(epsilon)
  delta = _validation.check_delta(delta, allow_zero=False)
  sensitivity = _validation.check_sensitivity(sensitivity)
  if sensitivity == 0.0:
    return 0.0
  sigma = analytic_gaussian_alpha(epsilon, delta) * sensitivity / math.sqrt(2.0 * epsilon)
  # Rounding in α's closed form can leave δ(σ) a few ulps above δ; nudge σ up
  # (with growing steps, δ(σ) is decreasing in σ) until (*) holds exactly in
  # float64, so the guarantee is never overstated.
  step = 1e-12
  while analytic_gaussian_delta(sigma, epsilon, sensitivity) > delta:
    sigma *= 1.0 + step
    step *= 2.0
  return sigma


def analytic_gaussian_epsilon(sigma: float, delta: float, sensitivity: float = 1.0) -> float:
  """Smallest ε such that N(0, σ²) noise on a Δ-sensitive query is (ε, δ)-DP.

  Inverts (*) in ε by bisection (δ(ε) is decreasing in ε). The returned ε is
  the upper end of the final bracket, so it never under-states the loss.
  """
  sigma = _validation.check_positive(sigma, "sigma")
  delta = _validation.check_delta(delta, allow_zero=False)
  sensitivity = _validation.check_positive(sensitivity, "sensitivity")
  if analytic_gaussian_delta(sigma, 0.0, sensitivity) <= delta:
    return 0.0
  lo, hi = 0.0, 1.0
  while analytic_gaussian_delta(sigma, hi, sensitivity) > delta:
    lo, hi = hi, 2.0 * hi
  for _ in range(_MAX_BISECTIONS):
    mid = 0.5 * (lo + hi)
    if mid in (lo, hi):
      break
    if analytic_gaussian_delta(sigma, mid, sensitivity) <= delta:
      hi = mid
    else:
      lo = mid
  return hi


def classic_gaussian_sigma(epsilon: float, delta: float, sensitivity: float = 1.0) -> float:
  """σ = Δ sqrt(2 ln(1.25/δ)) / ε (Dwork & Roth 2014, Theorem A.1; valid for ε < 1 only)."""
  epsilon = _validation.check_epsilon(epsilon)
  delta = _validation.check_delta(delta, allow_zero=False)
  sensitivity = _validation.check_sensitivity(sensitivity)
  if epsilon >= 1.0:
    raise ValueError(
        f"the classic Gaussian mechanism bound needs epsilon < 1, got {epsilon}; "
        "use analytic_gaussian_sigma instead.")
  return sensitivity * math.sqrt(2.0 * math.log(1.25 / delta)) / epsilon


__all__ = [
    "analytic_gaussian_alpha",
    "analytic_gaussian_delta",
    "analytic_gaussian_epsilon",
    "analytic_gaussian_sigma",
    "classic_gaussian_sigma",
]

del np
