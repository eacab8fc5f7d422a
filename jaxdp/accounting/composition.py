"""Composition theorems and the per-query inversions used by private prediction.

* :func:`basic_composition` — k mechanisms (ε_i, δ_i) compose to (Σε_i, Σδ_i)
  (Dwork & Roth 2014, Theorem 3.16).
* :func:`advanced_composition` — k-fold adaptive composition of (ε, δ)-DP
  mechanisms is (ε', kδ + δ')-DP with
  ``ε' = sqrt(2k ln(1/δ')) ε + k ε (e^ε − 1)`` (Dwork, Rothblum & Vadhan 2010,
  Theorem III.3; Dwork & Roth 2014, Theorem 3.20), or with the tighter
  ``bound="kov"`` of Kairouz, Oh & Viswanath (2015, Theorem 3.4):
  ``ε' = min(kε, kε(e^ε−1)/(e^ε+1) + ε sqrt(2k ln(1/δ')),
  kε(e^ε−1)/(e^ε+1) + ε sqrt(2k ln(e + sqrt(kε²)/δ')))`` and
  ``δ_total = 1 − (1−δ)^k (1−δ')``.
* :func:`advanced_composition_per_query_epsilon` — the closed-form inversion
  of paper 000 (Equations 51 and 61): the per-query ε* such that B queries
  compose to a total ε with slack δ'::

      ε* = sqrt(2/B) (sqrt(ln(1/δ') + ε) − sqrt(ln(1/δ'))),

  the positive root of ``sqrt(2B ln(1/δ')) ε* + B ε*²/2 = ε``.

  **Note on the paper's proof.** Paper 000 justifies the root with
  ``B ε*²/2 ≤ B ε*(e^ε* − 1)/2`` (Eq. 50), but that inequality points the
  wrong way: making the *smaller* quantity equal to ε does not bound the
  composed loss by ε. The closed form is nevertheless valid, for two
  different reasons that we rely on instead: (i) for (ε*, δ*) mechanisms,
  Kairouz et al.'s bound has the quadratic term ``Bε*(e^ε*−1)/(e^ε*+1) =
  Bε* tanh(ε*/2) ≤ Bε*²/2``, so the KOV total is at most ε (with total δ
  ``≤ δ' + Bδ*``); (ii) for pure ε*-DP (or bounded-range) mechanisms, zCDP
  gives exactly ``ε = Bε*²/2 + ε* sqrt(2B ln(1/δ'))`` (Bun & Steinke 2016).
  :func:`advanced_composition_per_query_epsilon_exact` instead inverts the
  DRV bound exactly, for users who want the textbook theorem.
* :func:`per_query_gaussian_sigma` — paper 000 Algorithm 7: per-query noise
  for B Gaussian queries with a total (ε, δ) budget, σ' from standard
  composition and σ'' from advanced composition with a search over δ'.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np
from scipy import optimize

from jaxdp import _validation
from jaxdp.accounting import analytic_gaussian


def basic_composition(epsilons: Sequence[float], deltas: Sequence[float] | None = None
                      ) -> tuple[float, float]:
  """(Σ ε_i, Σ δ_i) (Dwork & Roth 2014, Theorem 3.16)."""
  eps = np.asarray(epsilons, dtype=np.float64)
  dels = np.zeros_like(eps) if deltas is None else np.asarray(deltas, dtype=np.float64)
  if eps.shape != dels.shape:
    raise ValueError("epsilons and deltas must have the same length.")
  if np.any(np.isnan(eps)) or np.any(eps < 0):
    raise ValueError("every epsilon must be >= 0 and not NaN.")
  if np.any(np.isnan(dels)) or np.any(dels < 0) or np.any(dels >= 1):
    raise ValueError("every delta must be in [0, 1).")
  return float(eps.sum()), float(min(dels.sum(), 1.0))


def advanced_composition(epsilon: float, delta: float, k: int, delta_slack: float,
                         bound: str = "drv") -> tuple[float, float]:
  """Total (ε', δ') of k adaptive compositions of an (ε, δ)-DP mechanism.

  Args:
    epsilon: per-mechanism ε > 0.
    delta: per-mechanism δ in [0, 1).
    k: number of compositions (≥ 1).
    delta_slack: the slack δ' in (0, 1) of the theorem.
    bound: ``"drv"`` (Dwork, Rothblum & Vadhan 2010, Thm III.3) or ``"kov"``
      (Kairouz, Oh & Viswanath 2015, Thm 3.4; never larger).

  Returns:
    (total ε, total δ). DRV: ``(sqrt(2k ln(1/δ'))ε + kε(e^ε−1), kδ + δ')``.

  >>> eps, dlt = advanced_composition(0.1, 0.0, 100, 1e-5)
  >>> round(eps, 6), dlt
  (5.850235, 1e-05)
  """
  epsilon = _validation.check_epsilon(epsilon)
  delta = _validation.check_delta(delta)
  k = _validation.check_positive_int(k, "k")
  delta_slack = _validation.check_delta(delta_slack, "delta_slack", allow_zero=False)
  log_term = math.log(1.0 / delta_slack)
  if bound == "drv":
    total_eps = math.sqrt(2.0 * k * log_term) * epsilon + k * epsilon * math.expm1(epsilon)
    total_delta = k * delta + delta_slack
  elif bound == "kov":
    quad = k * epsilon * math.tanh(epsilon / 2.0)  # kε(e^ε−1)/(e^ε+1)
    total_eps = min(
        k * epsilon,
        quad + epsilon * math.sqrt(2.0 * k * log_term),
        quad + epsilon * math.sqrt(2.0 * k * math.log(math.e + math.sqrt(k * epsilon**2) / delta_slack)),
    )
    total_delta = 1.0 - (1.0 - delta) ** k * (1.0 - delta_slack)
  else:
    raise ValueError(f"bound must be 'drv' or 'kov', got {bound!r}.")
  return total_eps, min(total_delta, 1.0)


def advanced_composition_per_query_epsilon(total_epsilon: float, k: int, delta_slack: float) -> float:
  """Per-query ε* = sqrt(2/k)(sqrt(ln(1/δ') + ε) − sqrt(ln(1/δ'))) (paper 000 Eqs. 51, 61).

  Valid through Kairouz et al. (2015) Theorem 3.4 or, for pure/bounded-range
  queries, through zCDP — see the module docstring for why the paper's own
  argument does not establish it.
  """
  total_epsilon = _validation.check_epsilon(total_epsilon, "total_epsilon")
  k = _validation.check_positive_int(k, "k")
  delta_slack = _validation.check_delta(delta_slack, "delta_slack", allow_zero=False)
  log_term = math.log(1.0 / delta_slack)
  return math.sqrt(2.0 / k) * (math.sqrt(log_term + total_epsilon) - math.sqrt(log_term))


def advanced_composition_per_query_epsilon_exact(total_epsilon: float, k: int, delta_slack: float,
                                                 bound: str = "drv") -> float:
  """Largest per-query ε* whose :func:`advanced_composition` total is ≤ total_epsilon."""
  total_epsilon = _validation.check_epsilon(total_epsilon, "total_epsilon")
  k = _validation.check_positive_int(k, "k")

  def excess(e: float) -> float:
    return advanced_composition(e, 0.0, k, delta_slack, bound)[0] - total_epsilon

  hi = total_epsilon
  if excess(hi) <= 0:
    return hi
  root = optimize.brentq(excess, 1e-300, hi, xtol=1e-15, rtol=1e-13)
  while excess(root) > 0:  # keep on the safe side of the root
    root = math.nextafter(root, 0.0)
  return root


@dataclasses.dataclass(frozen=True)
class PerQueryGaussian:
  """Result of :func:`per_query_gaussian_sigma`.

  Attributes:
    sigma: per-query noise standard deviation.
    method: ``"basic"`` or ``"advanced"``, whichever gave this sigma.
    epsilon_per_query, delta_per_query: the (ε*, δ*) each query satisfies.
    delta_slack: δ' of advanced composition (0 for basic composition).
  """

  sigma: float
  method: str
  epsilon_per_query: float
  delta_per_query: float
  delta_slack: float


def per_query_gaussian_sigma(epsilon: float, delta: float, k: int, sensitivity: float = 1.0,
                             method: str = "best", num_grid: int = 256) -> PerQueryGaussian:
  """Per-query Gaussian σ for k queries with total (ε, δ) (paper 000 Algorithm 7).

  * ``"basic"``: σ' = analytic Gaussian σ at (ε/k, δ/k) (standard composition).
  * ``"advanced"``: σ'' = min over δ' ∈ (0, δ) of the analytic Gaussian σ at
    ε* = :func:`advanced_composition_per_query_epsilon` (ε, k, δ') and
    δ* = (δ − δ')/k. The search is a log-spaced grid of ``num_grid`` points
    refined by bounded scalar minimisation; any δ' gives a valid guarantee,
    so the search only affects utility.
  * ``"best"``: the smaller of the two (Algorithm 7 sets σ = min(σ', σ'')).

  Every returned σ is at least the analytic-Gaussian σ for its (ε*, δ*), so
  each query is (ε*, δ*)-DP and k queries compose to (ε, δ).
  """
  epsilon = _validation.check_epsilon(epsilon)
  delta = _validation.check_delta(delta, allow_zero=False)
  k = _validation.check_positive_int(k, "k")
  sensitivity = _validation.check_sensitivity(sensitivity)
  if method not in ("basic", "advanced", "best"):
    raise ValueError(f"method must be 'basic', 'advanced' or 'best', got {method!r}.")

  candidates = []
  if method in ("basic", "best"):
    sigma = analytic_gaussian.analytic_gaussian_sigma(epsilon / k, delta / k, sensitivity)
    candidates.append(PerQueryGaussian(sigma, "basic", epsilon / k, delta / k, 0.0))
  if method in ("advanced", "best"):

    def sigma_for(log_frac: float) -> tuple[float, float, float, float]:
      delta_slack = delta * (1.0 / (1.0 + math.exp(-log_frac)))  # δ' = δ·sigmoid(t) ∈ (0, δ)
      eps_q = advanced_composition_per_query_epsilon(epsilon, k, delta_slack)
      delta_q = (delta - delta_slack) / k
      if delta_q <= 0 or eps_q <= 0:
        return math.inf, eps_q, delta_q, delta_slack
      return (analytic_gaussian.analytic_gaussian_sigma(eps_q, delta_q, sensitivity),
              eps_q, delta_q, delta_slack)

    grid = np.linspace(-30.0, 30.0, num_grid)
    values = [sigma_for(t)[0] for t in grid]
    i = int(np.argmin(values))
    lo, hi = grid[max(i - 1, 0)], grid[min(i + 1, num_grid - 1)]
    res = optimize.minimize_scalar(lambda t: sigma_for(t)[0], bounds=(lo, hi), method="bounded",
                                   options={"xatol": 1e-8})
    best_t = res.x if res.fun < values[i] else grid[i]
    sigma, eps_q, delta_q, delta_slack = sigma_for(best_t)
    candidates.append(PerQueryGaussian(sigma, "advanced", eps_q, delta_q, delta_slack))
  return min(candidates, key=lambda c: c.sigma)


__all__ = [
    "PerQueryGaussian",
    "advanced_composition",
    "advanced_composition_per_query_epsilon",
    "advanced_composition_per_query_epsilon_exact",
    "basic_composition",
    "per_query_gaussian_sigma",
]
