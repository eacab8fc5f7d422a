"""Privacy auditing with ONE training run: the canary guessing game.

The multi-run audit of :mod:`jaxdp.audit.core` needs hundreds of runs of the
mechanism. The one-run audit (Steinke, Nasr & Jagielski 2023, "Privacy
auditing with one (1) training run", NeurIPS, arXiv:2305.08846) trains once:

1. ``m`` canaries are drawn; canary ``i`` is included in the training data iff
   ``S_i = +1``, with ``S_1, ..., S_m`` i.i.d. uniform on ``{-1, +1}``
   (inclusion with probability 1/2; excluded canaries are absent, or replaced
   by a fixed public row under replace-one neighbours);
2. the mechanism runs once on the data with the included canaries;
3. the auditor scores every canary from the output (higher = more likely
   included) and guesses ``T_i = +1`` for the ``k+`` highest scores,
   ``T_i = -1`` for the ``k-`` lowest, and abstains (``T_i = 0``) on the rest:
   ``r = k+ + k-`` guesses, ``v`` of them correct.

A mechanism that is DP with respect to each canary cannot let the auditor be
right much more often than chance; a high ``v`` refutes the claim.

**Steinke et al. 2023, main theorem (pure DP: Thm. 3.1 of arXiv:2305.08846 as
we number it; the statement is reproduced so it can be checked).** If ``M`` is
``epsilon``-DP with respect to each canary and the guesses ``T`` are a function
of ``M``'s output with ``||T||_1 = r``, then the number of correct guesses
``W = sum_i max(0, T_i S_i)`` is stochastically dominated by
``Binomial(r, p_eps)``, ``p_eps = e^eps / (1 + e^eps)``: for every ``v``,

  P[W >= v] <= F_eps(v) := P[Binomial(r, p_eps) >= v].

**Approximate DP (the same paper's (eps, delta) main theorem, Thm. 3.2 as we
number it; Sec. 5 proves it via its Prop. 5.x coupling).** If ``M`` is
``(epsilon, delta)``-DP with respect to each canary, then for every ``v``

  P[W >= v] <= F_eps(v) + 2 m delta max_{i = 1..v} (F_eps(v - i) - F_eps(v)) / i,

with ``m`` the number of canaries (the authors' Algorithm "p_value_DP_audit"
computes exactly this). The right-hand side is the p-value of the observed
``v`` under the null hypothesis "``M`` is ``(eps, delta)``-DP"; the one-run
lower bound at significance ``beta`` is the largest ``eps`` whose p-value is
below ``beta`` (any smaller epsilon is then refuted as well, since
``(eps', delta)``-DP with ``eps' < eps`` implies ``(eps, delta)``-DP).

**Mahloujifar, Melis & Chaudhuri 2024 ("Auditing f-differential privacy in one
run", arXiv:2410.22235), main theorem for the guessing game with abstention
(numerical form: their Algorithm computing ``audit_rh_with_cap``).** Let
``M`` be ``f``-DP with respect to each canary, with ``f`` a symmetric
trade-off function, and let ``B^{-1}(x) = f(1 - x)`` be the smallest
probability an event can have under one neighbour when it has probability
``x`` under the other; for the Gaussian trade-off ``f = G_mu`` (Dong, Roth &
Su 2019, Def. 2.7) ``B^{-1}(x) = Phi(Phi^{-1}(x) - mu)``. For
``j = 0..r`` let ``r_j = E[W 1{W >= j}] / m`` and ``h_j = E[(r - W) 1{W >= j}]
/ m`` (correct and wrong guesses, per canary, on the outcomes with at least
``j`` correct). Applying ``f``-DP to canary ``i`` alone (flipping ``S_i``
turns a correct guess on ``i`` into a wrong one and lowers ``W`` by one) and
averaging over ``i`` with Jensen (``B^{-1}`` is convex) gives

  h_{j-1} >= max(h_j, B^{-1}(r_j)),   r_{j-1} = r_j + (j-1)/(r-j+1) (h_{j-1} - h_j),

and ``r_0 + h_0 = r / m`` (every outcome makes exactly ``r`` guesses). If
``P[W >= v] >= tau``, the paper's algorithm starts the recursion from
``r_v = tau v / m``, ``h_v = tau (r - v) / m`` and runs it down to ``j = 0``
with the smallest admissible ``h``, which gives a lower bound on
``r_0 + h_0``; when that
lower bound exceeds ``r / m`` the assumption is impossible, so
``P[W >= v] < tau`` and observing ``W = v`` rejects "``M`` is ``G_mu``-DP" at
level ``tau``. The rejection is monotone in ``mu``; the reported ``mu`` bound
is the largest rejected ``mu`` (bisection), converted to ``epsilon`` at the
given ``delta`` by the GDP duality (Dong, Roth & Su 2019, Cor. 2.13):
``delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)``. This is the
form both public implementations use (Google's JAX Privacy
``_epsilon_one_run_fdp`` and Meta's PrivacyGuard ``FDPAnalysisNode``); we
re-derived the recursion above and check its coverage by simulation in the
tests.

Reading the f-DP bound (sharp edge): it refutes "``M`` is at least as private
as the Gaussian trade-off curve through ``(eps, delta)``", a stronger null
than ``(eps, delta)``-DP. For a Gaussian mechanism (DP-SGD with full batches,
or many steps of small-q DP-SGD, which the CLT of Dong et al. 2019 Thm. 3.5
makes nearly Gaussian) it audits the claim; for mechanisms whose trade-off
curve is not Gaussian an f-DP bound above the claimed ``eps`` says the curve
is not the Gaussian one, which is weaker evidence than a Steinke bound above
the claim. The f-DP analysis needs ``delta > 0`` (every ``G_mu`` with
``mu > 0`` has infinite epsilon at ``delta = 0``).

**Searching over (k+, k-).** Each test above is valid for guesses fixed before
the outcome is seen. Reporting the best of ``K`` choices of ``(k+, k-)``
(as Steinke et al. do in their experiments) is a multiple test: here every
choice is tested at level ``beta / K`` (Bonferroni), so the reported maximum is
a lower bound with family-wise confidence ``1 - beta`` -- the ``confidence``
field of the result is that family-wise number. A single ``(k+, k-)`` pair has
``K = 1``.

All statistics are float64 numpy/scipy on the host; the bisections for the
``K`` choices run as arrays (one recursion pass for all choices and a grid of
``mu``), which ``benchmarks/one_run_audit.py`` compares with a plain scalar
implementation.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Optional, Sequence

import numpy as np
from scipy import optimize as sp_optimize
from scipy import special as sp_special
from scipy import stats as sp_stats

from jaxdp import _validation

METHODS = ("steinke", "fdp")
_METHOD_NAMES = {"steinke": "steinke2023", "fdp": "fdp_gaussian"}


@dataclasses.dataclass(frozen=True)
class OneRunAuditResult:
  """Result of a one-run audit (module docstring).

  Attributes:
    epsilon_lower_bound: epsilon refuted with family-wise confidence
      ``confidence`` (>= 0): the mechanism is not (epsilon, delta)-DP for any
      smaller epsilon (``"steinke2023"``), or not at least as private as the
      Gaussian trade-off through (epsilon, delta) (``"fdp_gaussian"``).
    method: ``"steinke2023"`` or ``"fdp_gaussian"``.
    num_canaries: m.
    num_guesses: r = k+ + k- of the reported choice.
    num_correct: v, correct guesses of the reported choice.
    k_plus, k_minus: guesses "in" (highest scores) and "out" (lowest scores).
    confidence: family-wise confidence of ``epsilon_lower_bound`` over all
      ``num_hypotheses`` choices of (k+, k-) (each tested at level
      ``(1 - confidence) / num_hypotheses``).
    num_hypotheses: K, the number of (k+, k-) choices searched.
    delta: the delta of the refuted claim.
    epsilon_claimed: the claimed epsilon (None if not given).
    mu_lower_bound: ``"fdp_gaussian"`` only: the largest refuted GDP mu.
  """

  epsilon_lower_bound: float
  method: str
  num_canaries: int
  num_guesses: int
  num_correct: int
  k_plus: int
  k_minus: int
  confidence: float
  num_hypotheses: int
  delta: float
  epsilon_claimed: Optional[float] = None
  mu_lower_bound: Optional[float] = None

  @property
  def precision(self) -> float:
    """v / r, the fraction of correct guesses."""
    return self.num_correct / self.num_guesses if self.num_guesses else float("nan")

  @property
  def violates_claim(self) -> bool:
    """True when the lower bound exceeds the claimed epsilon."""
    return self.epsilon_claimed is not None and self.epsilon_lower_bound > self.epsilon_claimed

  @property
  def tightness(self) -> float:
    """epsilon_lower_bound / epsilon_claimed (nan without a claim)."""
    if not self.epsilon_claimed:
      return float("nan")
    return self.epsilon_lower_bound / self.epsilon_claimed

  def as_dict(self) -> dict:
    out = dataclasses.asdict(self)
    out["precision"] = self.precision
    out["violates_claim"] = self.violates_claim
    return out

  def __str__(self) -> str:
    claim = "-" if self.epsilon_claimed is None else f"{self.epsilon_claimed:.4g}"
    verdict = ("VIOLATION: bound exceeds the claim" if self.violates_claim else
               "consistent with the claim" if self.epsilon_claimed is not None else "no claim")
    extra = "" if self.mu_lower_bound is None else f", mu >= {self.mu_lower_bound:.4f}"
    return (f"One-run audit ({self.method}, {100 * self.confidence:g}% family-wise confidence "
            f"over {self.num_hypotheses} (k+, k-) choices): epsilon >= "
            f"{self.epsilon_lower_bound:.4f}{extra} at delta = {self.delta:.3g} "
            f"[claimed {claim}: {verdict}]; m = {self.num_canaries}, k+ = {self.k_plus}, "
            f"k- = {self.k_minus}, {self.num_correct}/{self.num_guesses} correct")


# ---------------------------------------------------------------------------
# Steinke, Nasr & Jagielski 2023.
# ---------------------------------------------------------------------------


def steinke_p_value(num_canaries: int, num_guesses: int, num_correct: int, epsilon: float,
                    delta: float = 0.0) -> float:
  """P-value of ``v`` correct out of ``r`` guesses under "(epsilon, delta)-DP" (main theorem).

  ``F(v) + 2 m delta max_{i=1..v} (F(v - i) - F(v)) / i`` with
  ``F(u) = P[Binomial(r, e^eps / (1 + e^eps)) >= u]`` (module docstring),
  capped at 1.
  """
  m, r, v = _check_counts(num_canaries, num_guesses, num_correct)
  eps = _validation.check_nonnegative(epsilon, "epsilon")
  delta = _validation.check_delta(delta)
  return float(_steinke_p(m, r, v, eps, delta))


def _steinke_p(m: int, r: int, v: int, eps: float, delta: float) -> float:
  if v == 0:
    return 1.0
  q = sp_special.expit(eps)
  tail = sp_stats.binom.sf(v - 1, r, q)   # P[Bin >= v]
  if delta == 0.0:
    return min(1.0, tail)
  # P[v - i <= Bin < v] for i = 1..v: reversed cumulative pmf below v.
  window = np.cumsum(sp_stats.binom.pmf(np.arange(v - 1, -1, -1), r, q))
  alpha = float(np.max(window / np.arange(1, v + 1)))
  return min(1.0, tail + 2.0 * m * delta * alpha)


def steinke_epsilon_lower_bound(num_canaries: int, num_guesses: int, num_correct: int, *,
                                delta: float = 0.0, significance: float = 0.05,
                                xtol: float = 1e-12) -> float:
  """Largest epsilon whose :func:`steinke_p_value` is below ``significance`` (0 if none).

  The p-value is increasing in epsilon; the returned value is the root of
  ``p(eps) = significance`` (the supremum of the refuted epsilons), by
  bracketing and Brent's method to ``xtol``. With ``v = r`` and ``delta = 0``
  it is ``log(p / (1 - p))`` with ``p = significance^(1/r)``.
  """
  m, r, v = _check_counts(num_canaries, num_guesses, num_correct)
  delta = _validation.check_delta(delta)
  beta = _check_significance(significance)
  return _steinke_bound(m, r, v, delta, beta, xtol)


def _steinke_bound(m: int, r: int, v: int, delta: float, beta: float, xtol: float = 1e-12) -> float:
  if v == 0 or _steinke_p(m, r, v, 0.0, delta) >= beta:
    return 0.0
  if v == r and delta == 0.0:   # closed form: p(eps) = p_eps^r
    p = beta ** (1.0 / r)
    return float(math.log(p) - math.log1p(-p))
  lo, hi = 0.0, 1.0
  while _steinke_p(m, r, v, hi, delta) < beta:
    lo, hi = hi, 2.0 * hi
    if hi > 1e4:   # cannot happen for v <= r < inf; guards a runaway loop
      return lo
  fn = lambda e: _steinke_p(m, r, v, e, delta) - beta
  return float(sp_optimize.brentq(fn, lo, hi, xtol=xtol, rtol=4 * np.finfo(float).eps))


# ---------------------------------------------------------------------------
# Mahloujifar, Melis & Chaudhuri 2024 (Gaussian f-DP).
# ---------------------------------------------------------------------------


def _fdp_rejects(m: int, r: np.ndarray, v: np.ndarray, mu: np.ndarray, tau: float) -> np.ndarray:
  """Vectorised rejection test of "G_mu-DP" (module docstring recursion).

  ``r``, ``v``, ``mu`` broadcast to one shape; returns True where the
  recursion from ``P[W >= v] = tau`` reaches ``r_0 + h_0 > r / m``.
  """
  r, v, mu = np.broadcast_arrays(np.asarray(r, np.float64), np.asarray(v, np.float64),
                                 np.asarray(mu, np.float64))
  rr = tau * v / m          # r_v
  hh = tau * (r - v) / m    # h_v
  rr, hh = rr.copy(), hh.copy()
  top = int(v.max()) if v.size else 0
  for t in range(top):
    j = v - 1 - t                      # the level being filled, j = v-1 .. 0
    live = (v > 0) & (j >= 0)
    if not live.any():
      break
    inv = sp_special.ndtr(sp_special.ndtri(np.clip(rr, 0.0, 1.0)) - mu)   # B^{-1}(r_{j+1})
    h_new = np.maximum(hh, inv)
    changed = live & (h_new > hh)
    if not changed.any():
      break                            # fixed point: nothing changes any more
    with np.errstate(divide="ignore", invalid="ignore"):
      step = np.where(changed, j / (r - j) * (h_new - hh), 0.0)
    rr = np.where(changed, np.minimum(rr + step, 1.0), rr)
    hh = np.where(changed, h_new, hh)
  return (rr + hh > r / m) & (v > 0)


def fdp_rejects(num_canaries: int, num_guesses: int, num_correct: int, mu: float,
                significance: float = 0.05) -> bool:
  """Whether ``v`` correct out of ``r`` guesses refutes ``G_mu``-DP at level ``significance``."""
  m, r, v = _check_counts(num_canaries, num_guesses, num_correct)
  mu = _validation.check_nonnegative(mu, "mu")
  beta = _check_significance(significance)
  return bool(_fdp_rejects(m, np.array([r]), np.array([v]), np.array([mu]), beta)[0])


_MU_MAX = 40.0


def _fdp_mu_bounds(m: int, r: np.ndarray, v: np.ndarray, beta: float, *, grid: int = 33,
                   rounds: int = 5) -> np.ndarray:
  """Largest refuted mu for each (r, v) pair: grid refinement of the monotone test."""
  r = np.asarray(r, np.float64)
  v = np.asarray(v, np.float64)
  lo = np.zeros_like(r)
  hi = np.full_like(r, _MU_MAX)
  frac = np.linspace(0.0, 1.0, grid)
  for _ in range(rounds):
    mus = lo[:, None] + (hi - lo)[:, None] * frac[None, :]
    mus[:, 0] = np.maximum(mus[:, 0], 1e-12)
    rej = _fdp_rejects(m, r[:, None], v[:, None], mus, beta)
    # Monotone in mu: rejected for mu below the bound. Last rejected grid index.
    idx = np.where(rej.any(axis=1), grid - 1 - np.argmax(rej[:, ::-1], axis=1), -1)
    new_lo = np.where(idx >= 0, mus[np.arange(r.size), np.maximum(idx, 0)], lo)
    new_hi = np.where(idx + 1 < grid, mus[np.arange(r.size), np.minimum(idx + 1, grid - 1)], hi)
    none = idx < 0
    lo = np.where(none, lo, new_lo)
    hi = np.where(none, mus[:, 0], new_hi)
  return np.where(lo > 0, lo, 0.0)


def gdp_epsilon(mu: float, delta: float) -> float:
  """Epsilon of ``mu``-GDP at ``delta`` (Dong, Roth & Su 2019, Cor. 2.13).

  The root of ``Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2) = delta``;
  0 when ``delta >= 2 Phi(mu/2) - 1`` (the value at eps = 0).
  """
  mu = _validation.check_nonnegative(mu, "mu")
  delta = _validation.check_delta(delta, allow_zero=False)
  if mu == 0.0:
    return 0.0

  def excess(eps):
    a = sp_special.log_ndtr(-eps / mu + mu / 2)
    b = eps + sp_special.log_ndtr(-eps / mu - mu / 2)
    with np.errstate(divide="ignore"):
      return a + np.log1p(-np.exp(min(b - a, 0.0))) - math.log(delta) if b < a else -np.inf

  if excess(0.0) <= 0:
    return 0.0
  hi = max(1.0, mu * mu)
  while excess(hi) > 0:
    hi *= 2.0
  return float(sp_optimize.brentq(excess, 0.0, hi, xtol=1e-12))


def fdp_epsilon_lower_bound(num_canaries: int, num_guesses: int, num_correct: int, *,
                            delta: float, significance: float = 0.05) -> tuple[float, float]:
  """``(epsilon, mu)``: the largest refuted GDP ``mu`` and its epsilon at ``delta``."""
  m, r, v = _check_counts(num_canaries, num_guesses, num_correct)
  delta = _validation.check_delta(delta, allow_zero=False)
  beta = _check_significance(significance)
  mu = float(_fdp_mu_bounds(m, np.array([r]), np.array([v]), beta)[0])
  return gdp_epsilon(mu, delta), mu


# ---------------------------------------------------------------------------
# The audit from scores.
# ---------------------------------------------------------------------------


def guess_counts(scores: Any, included: Any, pairs: Sequence[tuple[int, int]]) -> np.ndarray:
  """Correct guesses of each ``(k+, k-)``: "in" for the k+ highest scores, "out" for the k- lowest.

  Ties are broken by canary index (a function of the output only, so the
  theorems apply). Returns an int array of v per pair.
  """
  s = np.asarray(scores, np.float64)
  inc = np.asarray(included, bool)
  order = np.argsort(-s, kind="stable")         # highest first
  hits_in = np.concatenate([[0], np.cumsum(inc[order])])              # correct "in" among top k
  hits_out = np.concatenate([[0], np.cumsum(~inc[order[::-1]])])      # correct "out" among bottom k
  return np.array([hits_in[kp] + hits_out[km] for kp, km in pairs], np.int64)


def default_k_grid(num_canaries: int, num_sizes: int = 8) -> list[tuple[int, int]]:
  """The (k+, k-) choices searched by default: (k, k), (k, 0) and (0, k) on a geometric grid.

  ``k`` runs over ``num_sizes`` geometric values from ``min(10, m // 2)`` to
  ``m // 2`` (symmetric guesses, and only "in" or only "out" guesses, as in
  Steinke et al.'s experiments).
  """
  m = _validation.check_positive_int(num_canaries, "num_canaries")
  half = max(1, m // 2)
  lo = max(1, min(10, half))
  sizes = np.unique(np.round(np.geomspace(lo, half, num_sizes)).astype(int))
  pairs = []
  for k in sizes:
    k = int(k)
    pairs += [(k, k), (k, 0), (0, k)]
  return [p for p in dict.fromkeys(pairs) if 0 < p[0] + p[1] <= m]


def _pairs(m: int, k_plus: Any, k_minus: Any) -> list[tuple[int, int]]:
  if k_plus is None and k_minus is None:
    return default_k_grid(m)
  if k_plus is None or k_minus is None:
    raise ValueError("give both k_plus and k_minus (ints, or equal-length sequences of pairs), "
                     "or neither (the default grid).")
  kp = np.atleast_1d(np.asarray(k_plus))
  km = np.atleast_1d(np.asarray(k_minus))
  if kp.ndim != 1 or km.ndim != 1 or kp.shape != km.shape or kp.size == 0:
    raise ValueError(f"k_plus and k_minus must be ints or equal-length 1-D sequences, got shapes "
                     f"{kp.shape} and {km.shape}.")
  pairs = []
  for a, b in zip(kp.tolist(), km.tolist()):
    if not (isinstance(a, int) and isinstance(b, int)) or a < 0 or b < 0:
      raise ValueError(f"k_plus and k_minus must be non-negative integers, got {a!r}, {b!r}.")
    if not 0 < a + b <= m:
      raise ValueError(f"need 0 < k_plus + k_minus <= num_canaries = {m}, got k_plus = {a}, "
                       f"k_minus = {b}.")
    pairs.append((a, b))
  return list(dict.fromkeys(pairs))


def one_run_audit(scores: Any, included: Any, *, epsilon_claimed: Optional[float] = None,
                  delta: float = 0.0, k_plus: Any = None, k_minus: Any = None,
                  confidence: float = 0.95, method: str = "steinke") -> OneRunAuditResult:
  """One-run lower bound on epsilon from canary scores (module docstring).

  Args:
    scores: ``(m,)`` finite canary scores, higher = more likely included
      (e.g. ``-loss`` of an input canary, or the projection of the parameter
      change on a gradient canary's direction).
    included: ``(m,)`` booleans (or 0/1): which canaries were in the training
      data. They must have been drawn independently with probability 1/2 from
      a key the mechanism does not see otherwise.
    epsilon_claimed: the accountant's epsilon for the run (stored; sets
      ``violates_claim``).
    delta: delta of the audited claim, in [0, 1) (``method="fdp"``: in (0, 1)).
    k_plus, k_minus: guesses "in" (highest scores) and "out" (lowest); ints
      for one choice, equal-length sequences for several (the best is
      reported, each tested at level ``(1 - confidence) / K``), or both None
      for :func:`default_k_grid`.
    confidence: family-wise confidence of the bound, in (0, 1).
    method: ``"steinke"`` (Steinke et al. 2023, (eps, delta)-DP) or ``"fdp"``
      (Mahloujifar et al. 2024, Gaussian f-DP converted to eps at delta).

  Returns:
    :class:`OneRunAuditResult` of the best choice.

  Raises:
    ValueError: bad arguments (checked before any computation).
  """
  if method not in METHODS:
    raise ValueError(f"method must be one of {METHODS}, got {method!r}.")
  s = _validation.check_finite_array(scores, "scores").astype(np.float64)
  if s.ndim != 1 or s.size < 1:
    raise ValueError(f"scores must be a non-empty 1-D array, got shape {s.shape}.")
  inc = np.asarray(included)
  if inc.shape != s.shape:
    raise ValueError(f"included must have the shape of scores {s.shape}, got {inc.shape}.")
  if inc.dtype != bool:
    if not np.issubdtype(inc.dtype, np.number) or not np.all((inc == 0) | (inc == 1)):
      raise ValueError("included must hold booleans or 0/1 values.")
    inc = inc.astype(bool)
  m = int(s.size)
  delta = _validation.check_delta(delta, allow_zero=(method == "steinke"))
  conf = _check_confidence(confidence)
  if epsilon_claimed is not None:
    epsilon_claimed = _validation.check_epsilon(epsilon_claimed, "epsilon_claimed", allow_inf=True)
  pairs = _pairs(m, k_plus, k_minus)
  num_hyp = len(pairs)
  beta = (1.0 - conf) / num_hyp
  v = guess_counts(s, inc, pairs)
  r = np.array([a + b for a, b in pairs], np.int64)
  if method == "steinke":
    eps = np.array([_steinke_bound(m, int(ri), int(vi), delta, beta) for ri, vi in zip(r, v)])
    mus = None
  else:
    mus = _fdp_mu_bounds(m, r, v, beta)
    eps = np.array([gdp_epsilon(float(mu), delta) for mu in mus])
  # Best choice; ties (e.g. all zero) go to the highest precision, then the most guesses.
  best = int(np.lexsort((r, v / r, eps))[-1])
  return OneRunAuditResult(
      epsilon_lower_bound=float(max(0.0, eps[best])), method=_METHOD_NAMES[method],
      num_canaries=m, num_guesses=int(r[best]), num_correct=int(v[best]),
      k_plus=pairs[best][0], k_minus=pairs[best][1], confidence=conf, num_hypotheses=num_hyp,
      delta=delta, epsilon_claimed=epsilon_claimed,
      mu_lower_bound=None if mus is None else float(mus[best]))


def one_run_audit_fdp(scores: Any, included: Any, *, delta: float, **kwargs: Any) -> OneRunAuditResult:
  """:func:`one_run_audit` with ``method="fdp"`` (Mahloujifar, Melis & Chaudhuri 2024)."""
  return one_run_audit(scores, included, delta=delta, method="fdp", **kwargs)


# ---------------------------------------------------------------------------
# Checks.
# ---------------------------------------------------------------------------


def _check_counts(m: Any, r: Any, v: Any) -> tuple[int, int, int]:
  m = _validation.check_positive_int(m, "num_canaries")
  r = _validation.check_positive_int(r, "num_guesses")
  if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
    raise ValueError(f"num_correct must be a non-negative integer, got {v!r}.")
  v = int(v)
  if not v <= r <= m:
    raise ValueError(f"need num_correct <= num_guesses <= num_canaries, got {v}, {r}, {m}.")
  return m, r, v


def _check_significance(beta: Any) -> float:
  b = float(beta)
  if not 0.0 < b < 1.0:
    raise ValueError(f"significance must be in (0, 1), got {beta!r}.")
  return b


def _check_confidence(confidence: Any) -> float:
  c = float(confidence)
  if not 0.0 < c < 1.0:
    raise ValueError(f"confidence must be in (0, 1), got {confidence!r}.")
  return c


__all__ = ["METHODS", "OneRunAuditResult", "default_k_grid", "fdp_epsilon_lower_bound",
           "fdp_rejects", "gdp_epsilon", "guess_counts", "one_run_audit", "one_run_audit_fdp",
           "steinke_epsilon_lower_bound", "steinke_p_value"]
