"""Empirical lower bounds on epsilon from a distinguishing attack.

An (epsilon, delta)-DP mechanism M satisfies, for neighbouring datasets D, D'
and every measurable event S (and with the roles of D and D' swapped),

  P[M(D') in S] <= e^epsilon P[M(D) in S] + delta.                    (1)

An auditor who runs M many times on D and on D', reduces each output to a
scalar statistic s, and uses the test "guess D' when s > t" (or "when s <= t")
sees a false-positive rate FPR = P[test says D' | D] and a false-negative rate
FNR = P[test says D | D']. Applying (1) to the rejection region and to its
complement gives the two inequalities of the hypothesis-testing view of DP
(Kairouz, Oh, Viswanath 2015, Thm 2.1; used for auditing by Jagielski, Ullman,
Oprea 2020, Sec. 4 and Nasr et al. 2021, Sec. 3):

  epsilon >= ln((1 - delta - FNR) / FPR),
  epsilon >= ln((1 - delta - FPR) / FNR).                              (2)

Replacing FPR and FNR by Clopper-Pearson *upper* confidence bounds makes the
right-hand side of (2) a lower bound on the true epsilon that holds with the
stated confidence; a mechanism whose lower bound exceeds its claimed epsilon
is not (claimed epsilon, delta)-DP, with that confidence.

Choosing the test (threshold t, direction, and which line of (2)) on the same
trials that are then used to bound FPR/FNR would bias the bound upwards. This
module offers two statistically sound ways to pick it:

* ``thresholds=None`` (default, "split"): a ``selection_fraction`` of the trials
  on each dataset picks the best test among candidate thresholds (quantiles of
  the selection trials), ranked by their Clopper-Pearson bound on the selection
  trials; the remaining, independent trials evaluate that single test. Two
  one-sided Clopper-Pearson bounds (FPR and FNR) are combined with a
  Bonferroni correction, each at level 1 - (1 - confidence) / 2.
* ``thresholds=array`` ("grid"): a fixed, data-independent grid of m thresholds
  is evaluated on all trials; a union bound over the 4m one-sided intervals
  (FPR and FNR upper bounds for both directions at every threshold) gives each
  one level 1 - (1 - confidence) / (4m), so the maximum over the grid is valid.

Everything statistical here is float64 numpy/scipy; only the trials run in JAX
(vmapped over keys, jitted once per call).

Reading a report (sharp edges):

* The result is a *lower* bound: a value far below the claim proves nothing
  about the claim's tightness unless D, D' realise the worst case and the
  statistic is (close to) the likelihood ratio -- see
  :mod:`jaxdp.audit.cases`. For pure Laplace at epsilon = 1 with 10^6 trials
  per dataset the bound is within 1% of the claim (benchmarks/audit.py).
* Audit the guarantee under the neighbouring relation it was proven for
  (add/remove vs replace-one) and pass its delta: with delta = 0 a Gaussian
  mechanism's tail can exceed any finite epsilon, and replace-one neighbours
  can legitimately cost up to twice an add/remove epsilon.
* Statistics that detect exact floating-point cancellations can exceed the
  claim on float32 noise: that is the genuine leak of naive floating-point
  mechanisms (Mironov 2012), not an audit error.
* ``num_trials`` counts runs on *each* dataset; small delta and large epsilon
  need rare events, hence many trials (the bound is limited by roughly
  ln(num_trials) when one error rate must be ~1/num_trials).
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from scipy import stats as sp_stats
import tqdm

from jaxdp import _validation

Mechanism = Callable[[jax.Array, Any], Any]
Statistic = Callable[[Any], jax.Array]

_DIRECTIONS = (">", "<=")


@dataclasses.dataclass(frozen=True)
class AuditReport:
  """Result of an empirical privacy audit.

  Attributes:
    epsilon_lower_bound: epsilon that the mechanism provably exceeds or equals
      with probability >= ``confidence`` over the audit's randomness (>= 0).
    claimed_epsilon: the epsilon the mechanism claims (None if not given).
    delta: the delta used in the bound (should be the mechanism's claimed delta).
    confidence: confidence level of the lower bound.
    num_trials: mechanism runs on *each* of the two datasets.
    num_evaluation_trials: runs per dataset used to evaluate the chosen test
      (the rest chose it; equals ``num_trials`` for a fixed grid).
    method: "split" (test chosen on held-out trials) or "grid" (union bound
      over a fixed threshold grid).
    num_thresholds: thresholds considered.
    threshold: the threshold t of the chosen test.
    direction: ">" means "guess the neighbour when statistic > t", "<=" means
      "guess the neighbour when statistic <= t".
    fpr, fnr: empirical false-positive / false-negative rates of that test on
      the evaluation trials.
    fpr_upper, fnr_upper: their Clopper-Pearson upper bounds.
    epsilon_estimate: the same formula (2) with the empirical rates (a point
      estimate, not a bound).
    seconds: wall-clock time of the trials (compilation included).
  """

  epsilon_lower_bound: float
  claimed_epsilon: Optional[float]
  delta: float
  confidence: float
  num_trials: int
  num_evaluation_trials: int
  method: str
  num_thresholds: int
  threshold: float
  direction: str
  fpr: float
  fnr: float
  fpr_upper: float
  fnr_upper: float
  epsilon_estimate: float
  seconds: float = float("nan")

  @property
  def violates_claim(self) -> bool:
    """True when the lower bound exceeds the claimed epsilon (a privacy bug)."""
    return self.claimed_epsilon is not None and self.epsilon_lower_bound > self.claimed_epsilon

  @property
  def tightness(self) -> float:
    """epsilon_lower_bound / claimed_epsilon (nan without a claim)."""
    if self.claimed_epsilon is None:
      return float("nan")
    return self.epsilon_lower_bound / self.claimed_epsilon

  def as_dict(self) -> dict:
    """The report's fields (and derived figures) as a JSON-friendly dict."""
    out = dataclasses.asdict(self)
    out["violates_claim"] = self.violates_claim
    out["trials_per_second"] = self.trials_per_second
    return out

  @property
  def trials_per_second(self) -> float:
    """Mechanism runs per second over both datasets."""
    if not self.seconds or math.isnan(self.seconds):
      return float("nan")
    return 2 * self.num_trials / self.seconds

  def __str__(self) -> str:
    if self.claimed_epsilon is None:
      verdict = "no claim given"
      claimed = "-"
    else:
      claimed = f"{self.claimed_epsilon:.4g}"
      verdict = (
          "VIOLATION: lower bound exceeds the claim"
          if self.violates_claim
          else f"consistent with the claim ({100 * self.tightness:.1f}% of it)"
      )
    if self.method == "split":
      how = (
          f"{self.num_trials - self.num_evaluation_trials:,} to choose the test, "
          f"{self.num_evaluation_trials:,} to evaluate it"
      )
    else:
      how = f"all used; union bound over {self.num_thresholds} thresholds"
    lines = [
        f"Privacy audit ({self.method}; Clopper-Pearson, {100 * self.confidence:g}% confidence)",
        f"  claimed epsilon     : {claimed}   (delta = {self.delta:.3g})",
        f"  epsilon lower bound : {self.epsilon_lower_bound:.4f}   [{verdict}]",
        f"  epsilon estimate    : {self.epsilon_estimate:.4f}   (empirical rates, not a bound)",
        f"  trials per dataset  : {self.num_trials:,} ({how})",
        f"  best test           : guess neighbour when statistic {self.direction} {self.threshold:.6g}",
        f"  FPR / FNR           : {self.fpr:.5f} / {self.fnr:.5f}",
        f"  FPR / FNR upper     : {self.fpr_upper:.5f} / {self.fnr_upper:.5f}",
    ]
    if not math.isnan(self.seconds):
      lines.append(
          f"  time                : {self.seconds:.2f} s ({self.trials_per_second:,.0f} trials/s)"
      )
    return "\n".join(lines)


# ---------------------------------------------------------------------------
# Clopper-Pearson bounds and the epsilon bound (float64 scipy).
# ---------------------------------------------------------------------------


def clopper_pearson_upper(successes: Any, trials: Any, alpha: float) -> np.ndarray:
  """One-sided Clopper-Pearson upper bound on a binomial proportion.

  P[p <= U] >= 1 - alpha with U = Beta^{-1}(1 - alpha; k + 1, n - k) and U = 1
  when k = n (Clopper & Pearson 1934).

  Args:
    successes: counts k (array-like of ints in [0, n]).
    trials: numbers of trials n (broadcastable with ``successes``).
    alpha: one-sided error probability in (0, 1).

  Returns:
    float64 array of upper bounds.
  """
  k = np.asarray(successes, dtype=np.float64)
  n = np.asarray(trials, dtype=np.float64) * np.ones_like(k)
  out = np.ones_like(k)
  mask = k < n
  out[mask] = sp_stats.beta.ppf(1.0 - alpha, k[mask] + 1.0, n[mask] - k[mask])
  return out


def clopper_pearson_lower(successes: Any, trials: Any, alpha: float) -> np.ndarray:
  """One-sided Clopper-Pearson lower bound, Beta^{-1}(alpha; k, n - k + 1) (0 when k = 0)."""
  k = np.asarray(successes, dtype=np.float64)
  n = np.asarray(trials, dtype=np.float64) * np.ones_like(k)
  out = np.zeros_like(k)
  mask = k > 0
  out[mask] = sp_stats.beta.ppf(alpha, k[mask], n[mask] - k[mask] + 1.0)
  return out


def histogram_epsilon_lower_bound(samples: Any, neighbour_samples: Any, num_bins: int = 20,
                                  alpha: float = 1e-3) -> float:
  """High-confidence lower bound on a pure-DP epsilon from two samples of a scalar output.

  Bins are quantiles of the pooled samples. For each bin and direction, a
  Clopper-Pearson lower bound on one output's bin probability is divided by an
  upper bound on the other's (Bonferroni over bins, directions and the two
  intervals: total level ``alpha``). If the mechanism is ε-DP (δ = 0), every
  bin-probability ratio is at most e^ε, so the returned value exceeds ε with
  probability at most ``alpha``. Coarser than :func:`epsilon_lower_bound`
  (which picks one threshold) but needs no statistic design.

  Args:
    samples: outputs of the mechanism on D (1-D array).
    neighbour_samples: outputs on the neighbouring D'.
    num_bins: number of quantile bins (>= 2).
    alpha: total error probability in (0, 1).

  Returns:
    The lower bound (may be negative or -inf when nothing is detected).
  """
  num_bins = _validation.check_positive_int(num_bins, "num_bins")
  if num_bins < 2 or not 0.0 < float(alpha) < 1.0:
    raise ValueError(f"need num_bins >= 2 and alpha in (0, 1), got {num_bins}, {alpha}.")
  s1 = np.asarray(samples, np.float64).ravel()
  s2 = np.asarray(neighbour_samples, np.float64).ravel()
  edges = np.quantile(np.concatenate([s1, s2]), np.linspace(0, 1, num_bins + 1)[1:-1])
  edges = np.concatenate([[-np.inf], edges, [np.inf]])
  k1, k2 = np.histogram(s1, edges)[0], np.histogram(s2, edges)[0]
  level = float(alpha) / (4 * num_bins)
  with np.errstate(divide="ignore"):
    r12 = np.log(clopper_pearson_lower(k1, s1.size, level)) - np.log(
        clopper_pearson_upper(k2, s2.size, level))
    r21 = np.log(clopper_pearson_lower(k2, s2.size, level)) - np.log(
        clopper_pearson_upper(k1, s1.size, level))
  return float(np.max(np.concatenate([r12, r21])))


def epsilon_from_rates(fpr: Any, fnr: Any, delta: float = 0.0) -> np.ndarray:
  """Largest epsilon implied by a test's error rates, formula (2) of the module doc.

  max(ln((1 - delta - FNR) / FPR), ln((1 - delta - FPR) / FNR)), with -inf
  where a numerator is <= 0 and +inf where a denominator is 0 with a positive
  numerator. Pass Clopper-Pearson upper bounds to get a high-confidence lower
  bound on epsilon; pass empirical rates to get a point estimate.
  """
  fpr = np.asarray(fpr, dtype=np.float64)
  fnr = np.asarray(fnr, dtype=np.float64)

  def one(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
      out = np.log(num) - np.log(den)
    out = np.where(num <= 0, -np.inf, out)
    return out

  return np.maximum(one(1.0 - delta - fnr, fpr), one(1.0 - delta - fpr, fnr))


def _rates(sorted0: np.ndarray, sorted1: np.ndarray, thresholds: np.ndarray):
  """Error counts of both tests at each threshold.

  Returns (fp, fn) of shape (2, m): row 0 is the test "neighbour if s > t",
  row 1 the test "neighbour if s <= t". Statistics of D are the negatives, D'
  the positives.
  """
  n0, n1 = sorted0.size, sorted1.size
  greater0 = n0 - np.searchsorted(sorted0, thresholds, side="right")
  greater1 = n1 - np.searchsorted(sorted1, thresholds, side="right")
  fp = np.stack([greater0, n0 - greater0])  # D classified as D'.
  fn = np.stack([n1 - greater1, greater1])  # D' classified as D.
  return fp, fn


def _bounds_at(sorted0, sorted1, thresholds, alpha_each, delta):
  fp, fn = _rates(sorted0, sorted1, thresholds)
  fpr_u = clopper_pearson_upper(fp, sorted0.size, alpha_each)
  fnr_u = clopper_pearson_upper(fn, sorted1.size, alpha_each)
  eps = epsilon_from_rates(fpr_u, fnr_u, delta)
  return eps, fp, fn, fpr_u, fnr_u


def _candidate_thresholds(values: np.ndarray, max_candidates: int) -> np.ndarray:
  uniq = np.unique(values)
  if uniq.size <= max_candidates:
    return uniq
  qs = np.linspace(0.0, 1.0, max_candidates)
  return np.unique(np.quantile(values, qs, method="lower"))


def epsilon_lower_bound(
    stats_dataset: Any,
    stats_neighbour: Any,
    *,
    delta: float = 0.0,
    confidence: float = 0.95,
    thresholds: Optional[Sequence[float]] = None,
    selection_fraction: float = 0.5,
    max_candidates: int = 2000,
    claimed_epsilon: Optional[float] = None,
    seconds: float = float("nan"),
) -> AuditReport:
  """High-confidence lower bound on epsilon from samples of a scalar statistic.

  Args:
    stats_dataset: i.i.d. statistics of M(D) (1-D array-like), n trials.
    stats_neighbour: i.i.d. statistics of M(D') (1-D array-like), same n.
    delta: the delta of the guarantee being audited, in [0, 1).
    confidence: confidence of the bound, in (0, 1).
    thresholds: None for the held-out "split" method; otherwise a fixed grid of
      thresholds chosen *before* seeing the statistics ("grid" method, union
      bound over the grid).
    selection_fraction: fraction of the trials (per dataset) that choose the
      test in the split method, in (0, 1).
    max_candidates: at most this many candidate thresholds (quantiles of the
      pooled selection statistics) in the split method.
    claimed_epsilon: the mechanism's claimed epsilon, stored in the report.
    seconds: time spent producing the statistics, stored in the report.

  Returns:
    An :class:`AuditReport`.

  Raises:
    ValueError: on bad arguments (empty or non-finite statistics, mismatched
      sizes, a confidence or delta out of range).
  """
  s0 = _validation.check_finite_array(stats_dataset, "stats_dataset").astype(np.float64).ravel()
  s1 = _validation.check_finite_array(stats_neighbour, "stats_neighbour").astype(np.float64).ravel()
  if s0.size < 2 or s1.size < 2:
    raise ValueError(
        f"need at least 2 statistics per dataset, got {s0.size} and {s1.size}."
    )
  if s0.size != s1.size:
    raise ValueError(
        f"stats_dataset and stats_neighbour must have the same number of trials, "
        f"got {s0.size} and {s1.size}."
    )
  delta = _validation.check_delta(delta)
  confidence = _check_confidence(confidence)
  if claimed_epsilon is not None:
    claimed_epsilon = _validation.check_epsilon(claimed_epsilon, "claimed_epsilon", allow_inf=True)
  alpha = 1.0 - confidence
  n = s0.size

  if thresholds is None:
    if not 0.0 < selection_fraction < 1.0:
      raise ValueError(f"selection_fraction must be in (0, 1), got {selection_fraction}.")
    max_candidates = _validation.check_positive_int(max_candidates, "max_candidates")
    n_sel = int(round(selection_fraction * n))
    if n_sel < 1 or n_sel >= n:
      raise ValueError(
          f"selection_fraction={selection_fraction} leaves no trials to select or "
          f"evaluate with num_trials={n}."
      )
    sel0, sel1 = np.sort(s0[:n_sel]), np.sort(s1[:n_sel])
    ev0, ev1 = np.sort(s0[n_sel:]), np.sort(s1[n_sel:])
    cand = _candidate_thresholds(np.concatenate([sel0, sel1]), max_candidates)
    # Two one-sided intervals (FPR, FNR) at the evaluated test: Bonferroni.
    alpha_each = alpha / 2.0
    # Rank candidates by a more conservative bound (level alpha / (2 sqrt(m)))
    # so that thresholds supported by few selection trials, whose bound is
    # inflated by chance (winner's curse over m candidates), are not preferred.
    # This only affects which test is chosen, never the validity of the bound.
    eps_sel, *_ = _bounds_at(sel0, sel1, cand, alpha_each / math.sqrt(cand.size), delta)
    eps_pt_sel = epsilon_from_rates(*_empirical(sel0, sel1, cand), delta)
    # Rank by the selection-half bound; break ties (e.g. all -inf) by the point
    # estimate so that some test is always chosen.
    order = np.lexsort((eps_pt_sel.ravel(), eps_sel.ravel()))
    best = order[-1]
    d_idx, t_idx = np.unravel_index(best, eps_sel.shape)
    t = np.array([cand[t_idx]])
    eps, fp, fn, fpr_u, fnr_u = _bounds_at(ev0, ev1, t, alpha_each, delta)
    n_eval = ev0.size
    method, m = "split", int(cand.size)
    pick = (d_idx, 0)
    threshold = float(cand[t_idx])
  else:
    grid = _validation.check_finite_array(thresholds, "thresholds").astype(np.float64).ravel()
    if grid.size == 0:
      raise ValueError("thresholds must contain at least one value.")
    m = int(grid.size)
    alpha_each = alpha / (4.0 * m)
    sorted0, sorted1 = np.sort(s0), np.sort(s1)
    eps, fp, fn, fpr_u, fnr_u = _bounds_at(sorted0, sorted1, grid, alpha_each, delta)
    eps_pt = epsilon_from_rates(fp / n, fn / n, delta)
    order = np.lexsort((eps_pt.ravel(), eps.ravel()))
    pick = np.unravel_index(order[-1], eps.shape)
    threshold = float(grid[pick[1]])
    n_eval = n
    method = "grid"

  fpr = float(fp[pick] / n_eval)
  fnr = float(fn[pick] / n_eval)
  lower = float(eps[pick])
  estimate = float(epsilon_from_rates(fpr, fnr, delta))
  return AuditReport(
      epsilon_lower_bound=max(0.0, lower),
      claimed_epsilon=claimed_epsilon,
      delta=delta,
      confidence=confidence,
      num_trials=n,
      num_evaluation_trials=n_eval,
      method=method,
      num_thresholds=m,
      threshold=threshold,
      direction=_DIRECTIONS[pick[0]],
      fpr=fpr,
      fnr=fnr,
      fpr_upper=float(fpr_u[pick]),
      fnr_upper=float(fnr_u[pick]),
      epsilon_estimate=max(0.0, estimate),
      seconds=seconds,
  )


def _empirical(sorted0, sorted1, thresholds):
  fp, fn = _rates(sorted0, sorted1, thresholds)
  return fp / sorted0.size, fn / sorted1.size


def _check_confidence(confidence: Any) -> float:
  c = float(confidence)
  if not 0.0 < c < 1.0:
    raise ValueError(f"confidence must be in (0, 1), got {confidence!r}.")
  return c


# ---------------------------------------------------------------------------
# Running the trials (JAX, vmapped over keys, jitted once).
# ---------------------------------------------------------------------------


def make_trial_fn(mechanism: Mechanism, statistic: Optional[Statistic] = None,
                  batched: bool = False) -> Callable:
  """``(keys (B,), dataset) -> statistics (B,)``.

  ``batched=False``: ``mechanism(key, data)`` handles one key; it is vmapped
  over the keys and jitted (the dataset is an argument, not a closure
  constant, so D and D' of the same shapes share one compilation).
  ``batched=True``: ``mechanism(keys, data)`` already takes the whole batch of
  keys and returns outputs with a leading batch axis (e.g. the library's
  training functions, which validate on the host and vmap internally); only
  the statistic is vmapped and jitted.
  """

  def reduce(out):
    s = out if statistic is None else statistic(out)
    s = jnp.asarray(s)
    if s.shape != ():
      raise ValueError(
          "the statistic must map a mechanism output to a scalar; got shape "
          f"{s.shape}" + (" (pass statistic=...)" if statistic is None else "") + "."
      )
    return s.astype(jnp.float32) if not jnp.issubdtype(s.dtype, jnp.floating) else s

  if batched:
    reduce_batch = jax.jit(jax.vmap(reduce))

    def trial_fn(keys, data):
      out = mechanism(keys, data)
      leading = {int(jnp.shape(v)[0]) if jnp.ndim(v) else -1 for v in jax.tree.leaves(out)}
      if leading != {int(keys.shape[0])}:
        raise ValueError(
            "with batched=True the mechanism must return outputs with a leading axis of "
            f"size {keys.shape[0]} (one per key); got leading sizes {sorted(leading)}."
        )
      return reduce_batch(out)

    return trial_fn
  return jax.jit(jax.vmap(lambda key, data: reduce(mechanism(key, data)), in_axes=(0, None)))


def run_trials(
    trial_fn: Callable,
    data: Any,
    *,
    key: jax.Array,
    num_trials: int,
    batch_size: int,
    progress: Optional[tqdm.tqdm] = None,
) -> np.ndarray:
  """Runs ``num_trials`` trials in batches of ``batch_size`` keys.

  Batch b uses ``split(fold_in(key, b), batch_size)``: every trial gets a fresh
  key and the result depends only on (key, num_trials, batch_size). The last
  batch is computed at full size and truncated so that one compiled shape
  serves every batch.
  """
  _validation.check_key(key)
  num_batches = -(-num_trials // batch_size)
  out = np.empty(num_batches * batch_size, dtype=np.float64)
  for b in range(num_batches):
    keys = jax.random.split(jax.random.fold_in(key, b), batch_size)
    out[b * batch_size:(b + 1) * batch_size] = np.asarray(trial_fn(keys, data), dtype=np.float64)
    if progress is not None:
      progress.update(min(batch_size, num_trials - b * batch_size))
  return out[:num_trials]


def audit_epsilon(
    mechanism: Mechanism,
    dataset: Any,
    neighbour: Any,
    statistic: Optional[Statistic] = None,
    *,
    key: jax.Array,
    num_trials: int,
    batch_size: int = 10_000,
    claimed_epsilon: Optional[float] = None,
    delta: float = 0.0,
    confidence: float = 0.95,
    thresholds: Optional[Sequence[float]] = None,
    selection_fraction: float = 0.5,
    max_candidates: int = 2000,
    progress: bool = True,
    batched: bool = False,
) -> AuditReport:
  """Audits a randomized mechanism: lower-bounds its epsilon from trials.

  Runs ``mechanism(key, dataset)`` and ``mechanism(key, neighbour)``
  ``num_trials`` times each with independent keys (vmapped batches, one jit),
  reduces outputs with ``statistic`` to scalars, and applies
  :func:`epsilon_lower_bound` (formula (2) of the module docstring with
  Clopper-Pearson upper bounds on FPR and FNR; Jagielski et al. 2020 Sec. 4,
  Nasr et al. 2021 Sec. 3).

  Args:
    mechanism: ``f(key, data) -> output`` (any pytree); must be jittable and
      vmappable over ``key``. Close over everything except the data.
    dataset: D, a pytree of arrays passed as ``data``.
    neighbour: D', a neighbouring dataset (same pytree structure).
    statistic: ``output -> scalar``; None when the output already is a scalar.
      The bound is only as tight as the statistic: use the (log-)likelihood
      ratio or a projection on the direction that separates M(D) from M(D').
    key: a ``jax.random`` key; D and D' use independent sub-keys.
    num_trials: mechanism runs on each dataset (>= 2).
    batch_size: trials per vmapped batch (memory vs. dispatch overhead).
    claimed_epsilon: the epsilon the mechanism claims, stored in the report.
    delta: the mechanism's claimed delta, used in the bound, in [0, 1).
    confidence: confidence level of the bound, in (0, 1).
    thresholds: None (held-out split) or a fixed grid (union bound).
    selection_fraction: split method: fraction of trials choosing the test.
    max_candidates: split method: number of candidate thresholds.
    progress: show a tqdm progress bar.
    batched: the mechanism takes a batch of keys ``(B,)`` and returns outputs
      with a leading axis B (see :func:`make_trial_fn`); use it for library
      functions that validate inputs on the host and cannot be jitted whole.

  Returns:
    An :class:`AuditReport` (``print(report)`` for a summary).
  """
  _validation.check_key(key)
  num_trials = _validation.check_positive_int(num_trials, "num_trials")
  if num_trials < 2:
    raise ValueError(f"num_trials must be >= 2, got {num_trials}.")
  batch_size = _validation.check_positive_int(batch_size, "batch_size")
  batch_size = min(batch_size, num_trials)
  # Validate the statistical arguments before spending time on trials.
  _validation.check_delta(delta)
  _check_confidence(confidence)
  if claimed_epsilon is not None:
    _validation.check_epsilon(claimed_epsilon, "claimed_epsilon", allow_inf=True)
  if jax.tree_util.tree_structure(dataset) != jax.tree_util.tree_structure(neighbour):
    raise ValueError("dataset and neighbour must have the same pytree structure.")

  trial_fn = make_trial_fn(mechanism, statistic, batched=batched)
  key_d, key_n = jax.random.split(key)
  start = time.perf_counter()
  with tqdm.tqdm(
      total=2 * num_trials, desc="audit trials", unit="trial", disable=not progress,
      leave=False, dynamic_ncols=True,
  ) as bar:
    s0 = run_trials(trial_fn, dataset, key=key_d, num_trials=num_trials,
                    batch_size=batch_size, progress=bar)
    s1 = run_trials(trial_fn, neighbour, key=key_n, num_trials=num_trials,
                    batch_size=batch_size, progress=bar)
  seconds = time.perf_counter() - start
  return epsilon_lower_bound(
      s0, s1, delta=delta, confidence=confidence, thresholds=thresholds,
      selection_fraction=selection_fraction, max_candidates=max_candidates,
      claimed_epsilon=claimed_epsilon, seconds=seconds,
  )
