"""Private hyper-parameter tuning: the best of a random number of private runs.

Algorithm (Papernot & Steinke 2022, "Hyperparameter tuning with Renyi
differential privacy", ICLR; arXiv 2110.03620v2, Algorithm 1; Liu & Talwar
2019, "Private selection from private candidates", STOC, Section 3): draw K
from a public law (:mod:`jaxdp.tuning.repetitions`); run K times the mechanism
Q = "draw a candidate at random, run the private training and the private
scoring with it"; release only the run with the highest (private) score.

Guarantee. If one run of Q is (λ, ε(λ))-RDP at every order, the whole
procedure is bounded by PS22 Theorem 2 (K truncated negative binomial of
shape η >= 0, incl. logarithmic η = 0 and geometric η = 1) or Theorem 6 (K
Poisson); dp_accounting's RDP accountant computes both from
``RepeatAndSelectDpEvent(per_run_event, E[K], η)``, which
:class:`~jaxdp.accounting.PrivacyAccountant` spends with ``method="rdp"`` (or
``"auto"``). A pure ε-DP run gives ``(2 + η) ε`` pure DP (Thm 2 as λ, λ̂ → ∞;
η = 1: Liu & Talwar's 3ε). The cost does not grow with the number of
candidates.

What the guarantee covers, and what must stay secret:

* Released: the best run's release, its candidate and its score (or nothing
  when K = 0, Poisson only). No other run's release or score leaves
  :func:`repeat_and_select`.
* K itself is NOT released: it is independent of the data, but the theorems
  bound the best run's output with K unknown. Given K = k the output is a
  best-of-k selection, which can cost up to k times a run's ε (e.g. "every
  score is low" has probability ratio e^{kε}). So :class:`TuningResult` has no
  number of runs, and the wall-clock time of a call (about K runs) must not be
  published either.
* Every run must have the same event (the per-run guarantee the theorem
  takes): ``event=`` is required upfront and each run's returned event must
  equal it (compared by :func:`~jaxdp.accounting.events.event_to_dict`); a run
  whose guarantee is only dominated by it (fewer epochs, ...) must return the
  dominating event (see :func:`dominating_event` and
  :func:`~jaxdp.tuning.dpsgd_tuning.tune_dpsgd`).
* The score must be private: computed inside the mechanism with noise and paid
  for in its event (:mod:`jaxdp.tuning.scoring`).
* Ties between equal scores go to the first run. Runs are i.i.d., so this has
  the law of a uniformly random tie-break, which is the paper's total order
  extended by an independent uniform label (post-processing of each run). A
  non-finite score ranks below every finite one; if the best score is not
  finite the procedure releases nothing (a function of the selected run).
"""

from __future__ import annotations

import dataclasses
import json
import math
import weakref
from collections.abc import Sequence
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxdp import _validation
from jaxdp.accounting import events
from jaxdp.accounting.accountant import PrivacyAccountant, UnsupportedEventError
from jaxdp.tuning import repetitions as repetitions_lib


@dataclasses.dataclass(frozen=True)
class TuningResult:
  """The outcome of :func:`repeat_and_select`.

  Attributes:
    release: the best run's release (``None`` when nothing is released: K = 0
      under Poisson repetitions, or the best score was not finite).
    candidate: the candidate of the best run (``None`` likewise).
    score: the best run's private score as a float (``None`` likewise).
    event: the ONE event of the whole procedure,
      ``RepeatAndSelectDpEvent(per_run_event, E[K], shape)`` (public).

  The number of runs K is deliberately absent (see the module docstring).
  """

  release: Any
  candidate: Any
  score: float | None
  event: events.DpEvent


def _event_key(event: Any, name: str) -> dict:
  if not isinstance(event, events.DpEvent):
    raise TypeError(f"{name} must be a DpEvent, got {type(event).__name__}.")
  try:
    return events.event_to_dict(event)
  except ValueError as err:
    raise ValueError(f"{name}: {err}") from None


def check_accountable(total_event: events.DpEvent) -> None:
  """Raises ValueError unless some accounting method bounds ``total_event`` (before any run)."""
  key = json.dumps(events.event_to_dict(total_event), sort_keys=True)
  if key in _ACCOUNTABLE:
    return
  _check_accountable(total_event)
  if len(_ACCOUNTABLE) > 1024:
    _ACCOUNTABLE.clear()
  _ACCOUNTABLE.add(key)


_ACCOUNTABLE: set[str] = set()  # events already found accountable (the RDP check costs ~30 ms)


def _check_accountable(total_event: events.DpEvent) -> None:
  tags = sorted(t for t in events.leaf_tags(total_event) if t[0] is not None)
  relation, unit = tags[0] if tags else (events.ADD_REMOVE, events.DEFAULT_UNIT)
  acc = PrivacyAccountant(relation, unit)
  acc.spend(total_event)  # mixed relations or units raise ValueError here
  for method, delta in (("rdp", 1e-6), ("pure", 0.0)):
    try:
      if math.isfinite(acc.get_epsilon(delta, method)):
        return
    except UnsupportedEventError:
      continue
  raise ValueError("event: no accounting method bounds the repeat-and-select of this per-run "
                   "event (it needs an RDP bound, e.g. Gaussian, Laplace, zCDP or pure-DP "
                   "events; an (epsilon, delta) ApproxDpEvent has none).")


def dominating_event(candidate_events: Sequence[events.DpEvent],
                     orders: Sequence[float] | None = None) -> events.DpEvent:
  """The event among ``candidate_events`` whose RDP curve dominates every other's.

  If every candidate's run is (λ, ε_c(λ))-RDP and ε_d(λ) >= ε_c(λ) at every
  order λ of the grid, then the run with a random (data-independent)
  candidate is (λ, ε_d(λ))-RDP at those orders (Rényi divergence of mixtures
  with the same weights is at most the largest component's, by convexity of
  exp((λ − 1) D_λ)); PS22 Theorems 2 and 6 use the per-run RDP only at grid
  orders, so ``event_d`` is a valid per-run event for
  :func:`repeat_and_select`. Ties: the first dominating event.

  Args:
    candidate_events: the per-candidate events (non-empty).
    orders: RDP orders (default dp_accounting's ``DEFAULT_RDP_ORDERS``, the
      accountant's).

  Returns:
    The dominating event.

  Raises:
    ValueError: no event dominates all others at every order (then calibrate
      the candidates to a common event, or restrict the search space).
  """
  from dp_accounting.rdp import rdp_privacy_accountant as rdp  # pylint: disable=import-outside-toplevel
  from jaxdp.accounting import accountant as acc_lib  # pylint: disable=import-outside-toplevel
  candidate_events = list(candidate_events)
  if not candidate_events:
    raise ValueError("candidate_events must be non-empty.")
  grid = list(rdp.DEFAULT_RDP_ORDERS if orders is None else orders)
  curves = []
  for i, event in enumerate(candidate_events):
    _event_key(event, f"candidate_events[{i}]")
    accountant = acc_lib._RdpAccountant(orders=grid)  # pylint: disable=protected-access
    if not accountant.supports(event):
      raise ValueError(f"candidate_events[{i}] has no RDP bound.")
    accountant.compose(event)
    curves.append(np.asarray(accountant._rdp, np.float64))  # pylint: disable=protected-access
  for i, curve in enumerate(curves):
    if all(np.all(curve >= other) for other in curves):
      return candidate_events[i]
  raise ValueError("no candidate's event dominates every other's RDP curve at every order; "
                   "give the candidates one common event (e.g. one noise multiplier and the "
                   "largest number of steps), or restrict the search space.")


def _draw_candidate(key: jax.Array, candidates: Any) -> Any:
  if callable(candidates):
    return candidates(key)
  index = int(jax.random.randint(key, (), 0, len(candidates)))
  return candidates[index]


def _run_key_pair(run_key: jax.Array, i: Any) -> jax.Array:
  """(candidate key, mechanism key) of run i: ``split(fold_in(run_key, i))``."""
  return jax.random.split(jax.random.fold_in(run_key, i))


_batched_run_keys = jax.jit(jax.vmap(_run_key_pair, in_axes=(None, 0)))


def _run_keys(run_key: jax.Array, count: int) -> tuple[jax.Array, jax.Array]:
  """(candidate keys, mechanism keys) of runs 0..count-1 (the same keys as :func:`_run_key_pair`)."""
  pairs = _batched_run_keys(run_key, jnp.arange(count, dtype=jnp.uint32))
  return pairs[:, 0], pairs[:, 1]


def _score_of(score: Any, where: str) -> float:
  arr = np.asarray(score)
  if arr.size != 1 or arr.dtype.kind not in "fiub":
    raise ValueError(f"the mechanism's score must be a real scalar ({where}), got shape "
                     f"{arr.shape} and dtype {arr.dtype}.")
  return float(arr.reshape(()))


def _pad(count: int) -> int:
  """The next power of two (vectorised runs reuse one compiled shape per bucket)."""
  return 1 << max(0, int(count - 1).bit_length())


def repeat_and_select(key: jax.Array, mechanism: Callable[[jax.Array, Any], tuple[Any, Any, Any]],
                      candidates: Any, *, repetitions: Any, event: events.DpEvent,
                      accountant: Any = None, pure_epsilon: float | None = None,
                      vectorize: bool = False) -> TuningResult:
  """Runs ``mechanism`` K times on random candidates and releases only the best run.

  See the module docstring for the algorithm, the theorems and what the
  guarantee covers. Keys: ``key`` is split into a repetitions branch (K) and a
  runs branch; run i uses ``fold_in(runs, i)`` split into a candidate key and
  a mechanism key, so no key is used twice and run i's randomness does not
  depend on K or on ``vectorize``.

  Args:
    key: a ``jax.random`` key.
    mechanism: ``(key_i, candidate) -> (release, score, event)``; ``score`` a
      real scalar, PRIVATE (noised inside, paid in ``event``), higher is
      better; ``event`` the run's DpEvent, which must equal ``event``.
    candidates: a non-empty sequence of candidates (drawn uniformly), or a
      callable ``(key) -> candidate`` (any data-independent law, e.g. a
      log-uniform learning rate).
    repetitions: the law of K (:class:`~jaxdp.tuning.TruncatedNegativeBinomial`,
      :class:`~jaxdp.tuning.GeometricRepetitions`,
      :class:`~jaxdp.tuning.LogarithmicRepetitions`,
      :class:`~jaxdp.tuning.PoissonRepetitions`).
    event: the per-run DpEvent, the same for every candidate (required).
    accountant: optional ``PrivacyAccountant`` / ``PrivacyBudget`` (anything with
      ``spend(event)``): the ONE event of the procedure is spent before any run,
      so a refused budget runs nothing. It is not refunded if a run fails.
    pure_epsilon: optional: require the procedure to be ``pure_epsilon``-DP
      (pure): ``event`` must have a pure-DP bound ε and the law a finite shape η
      with ``(2 + η) ε <= pure_epsilon`` (geometric: 3ε, Liu & Talwar 2019).
    vectorize: run the K mechanisms as ONE ``jax.vmap`` call (candidates must be
      pytrees of arrays with one structure; ``mechanism`` traceable; its event
      must not depend on traced values). Run i gets the same keys either way.
      K is padded to a power of two (extra runs computed with fresh keys and
      discarded, never returned).

  Returns:
    :class:`TuningResult` ``(release, candidate, score, event)``.

  Raises:
    TypeError / ValueError: bad arguments (before anything is spent or run); a
      run whose event differs from ``event`` (nothing is released).
    BudgetExceededError: ``accountant`` is a budget that cannot afford the procedure.
  """
  _validation.check_key(key)
  if not callable(mechanism):
    raise TypeError(f"mechanism must be callable, got {type(mechanism).__name__}.")
  if not callable(candidates):
    if isinstance(candidates, (str, bytes)) or not isinstance(candidates, Sequence):
      raise TypeError("candidates must be a sequence of candidates or a callable (key) -> "
                      f"candidate, got {type(candidates).__name__}.")
    if len(candidates) == 0:
      raise ValueError("candidates must be non-empty.")
  repetitions_lib.check_repetitions(repetitions)
  expected = _event_key(event, "event")
  total_event = repetitions.event(event)
  check_accountable(total_event)
  if pure_epsilon is not None:
    limit = _validation.check_epsilon(pure_epsilon, "pure_epsilon")
    tags = sorted(t for t in events.leaf_tags(total_event) if t[0] is not None)
    acc = PrivacyAccountant(*(tags[0] if tags else (events.ADD_REMOVE, events.DEFAULT_UNIT)))
    acc.spend(total_event)
    try:
      eps = acc.get_epsilon(0.0, "pure")
    except UnsupportedEventError as err:
      raise ValueError(f"pure_epsilon: the procedure has no pure-DP bound: {err}") from None
    if not eps <= limit:
      raise ValueError(f"pure_epsilon={limit}: the procedure is only {eps:.6g}-DP (pure).")
  if not isinstance(vectorize, bool):
    raise TypeError(f"vectorize must be a bool, got {vectorize!r}.")
  if accountant is not None:
    if not hasattr(accountant, "spend"):
      raise TypeError("accountant must be a PrivacyAccountant or PrivacyBudget (with spend), "
                      f"got {type(accountant).__name__}.")
    accountant.spend(total_event)  # before any run; a budget refuses atomically

  repetitions_key, runs_key = jax.random.split(key)
  count = int(repetitions.sample(repetitions_key))
  if count == 0:  # Poisson only: the algorithm releases nothing (PS22 Thm 6 covers it)
    return TuningResult(None, None, None, total_event)
  if vectorize:
    releases, scores, chosen = _run_vectorized(mechanism, candidates, runs_key, count, expected)
  else:
    releases, scores, chosen = _run_loop(mechanism, candidates, runs_key, count, expected)
  ranked = np.where(np.isfinite(scores), scores, -np.inf)
  best = int(np.argmax(ranked))  # the first of equal scores
  if not np.isfinite(scores[best]):
    return TuningResult(None, None, None, total_event)
  release = releases(best)
  return TuningResult(release, chosen[best], float(scores[best]), total_event)


def _check_run_event(run_event: Any, expected: dict, where: str) -> None:
  if not isinstance(run_event, events.DpEvent):
    raise TypeError(f"the mechanism must return (release, score, event); {where} returned "
                    f"{type(run_event).__name__} as its event.")
  if events.event_to_dict(run_event) != expected:
    raise ValueError(f"{where} returned an event that differs from event=: every run must have "
                     "the same per-run event (the guarantee of repeat-and-select is stated for "
                     "one); nothing was released.")


def _run_loop(mechanism, candidates, runs_key, count, expected):
  outputs, scores, chosen = [], np.empty(count, np.float64), []
  for i in range(count):
    candidate_key, mechanism_key = _run_key_pair(runs_key, np.uint32(i))
    candidate = _draw_candidate(candidate_key, candidates)
    out = mechanism(mechanism_key, candidate)
    if not isinstance(out, tuple) or len(out) != 3:
      raise TypeError("the mechanism must return a tuple (release, score, event).")
    release, score, run_event = out
    _check_run_event(run_event, expected, f"run {i}")
    scores[i] = _score_of(score, f"run {i}")
    outputs.append(release)
    chosen.append(candidate)
  return outputs.__getitem__, scores, chosen


_draw_indices = jax.jit(jax.vmap(lambda k, n: jax.random.randint(k, (), 0, n), in_axes=(0, None)),
                        static_argnums=1)

# mechanism -> (jit(vmap(mechanism without its event)), the events seen while tracing it)
_VECTORIZED: "weakref.WeakKeyDictionary[Any, tuple[Callable, list]]" = weakref.WeakKeyDictionary()


def _vectorized(mechanism) -> tuple[Callable, list]:
  try:
    cached = _VECTORIZED.get(mechanism)
  except TypeError:  # not weak-referenceable: no cache
    cached = None
  if cached is not None:
    return cached
  seen: list = []

  def one(k, c):
    out = mechanism(k, c)
    if not isinstance(out, tuple) or len(out) != 3:
      raise TypeError("the mechanism must return a tuple (release, score, event).")
    seen.append(out[2])
    return out[0], out[1]

  entry = (jax.jit(jax.vmap(one)), seen)
  try:
    _VECTORIZED[mechanism] = entry
  except TypeError:
    pass
  return entry


def _run_vectorized(mechanism, candidates, runs_key, count, expected):
  padded = _pad(count)
  candidate_keys, mechanism_keys = _run_keys(runs_key, padded)
  if callable(candidates):
    chosen = [_draw_candidate(candidate_keys[i], candidates) for i in range(padded)]
  else:  # the same indices as one randint per candidate key
    chosen = [candidates[int(i)] for i in np.asarray(_draw_indices(candidate_keys,
                                                                   len(candidates)))]
  try:
    stacked = jax.tree.map(lambda *xs: np.stack([np.asarray(x) for x in xs]), *chosen)
  except (TypeError, ValueError) as err:
    raise ValueError("vectorize=True needs candidates that are pytrees of numbers with one "
                     f"structure: {err}") from None
  batched, seen = _vectorized(mechanism)
  try:
    releases, scores = batched(mechanism_keys, stacked)
  except (jax.errors.ConcretizationTypeError, jax.errors.TracerArrayConversionError,
          jax.errors.TracerBoolConversionError) as err:
    raise ValueError("vectorize=True: the mechanism is not traceable under jax.jit(jax.vmap) (or "
                     f"its event depends on the candidate); use vectorize=False. ({err})") from None
  if not seen:
    raise ValueError("vectorize=True: the mechanism's event could not be read.")
  try:
    for run_event in seen:  # every trace (one per padded size) must give the same event
      _check_run_event(run_event, expected, "the vectorised runs")
  except (TypeError, ValueError, jax.errors.ConcretizationTypeError) as err:
    if isinstance(err, ValueError) and "differs" in str(err):
      raise
    raise ValueError("vectorize=True: the mechanism's event depends on traced values; "
                     "use vectorize=False.") from None
  scores = np.asarray(scores, np.float64)
  if scores.shape != (padded,):
    raise ValueError(f"the mechanism's score must be a real scalar, got shape {scores.shape[1:]}.")
  scores = scores[:count]  # the padded runs are discarded, never compared or returned

  def release(i):
    return jax.tree.map(lambda x: x[i], releases)

  return release, scores, chosen[:count]


__all__ = ["TuningResult", "check_accountable", "dominating_event", "repeat_and_select"]
