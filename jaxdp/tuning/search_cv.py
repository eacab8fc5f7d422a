"""``PrivateSearchCV``: a scikit-learn hyper-parameter search that is paid for, once.

``GridSearchCV`` over a jaxdp estimator charges every fit, but selects the
winner with cross-validation scores computed on private held-out rows WITHOUT
noise: ``best_params_``, ``best_score_`` and ``cv_results_`` are not covered
by any charged event, so releasing them is not differentially private (one
row can move a fold's score and flip the winner). :class:`PrivateSearchCV`
runs the private selection of Papernot & Steinke 2022 ("Hyperparameter tuning
with Renyi differential privacy", ICLR; arXiv 2110.03620, Algorithm 1) through
:func:`~jaxdp.tuning.repeat_and_select`:

1. Split the private data ``(X, y)`` into a training part and a validation
   part, each row independently into the validation part with probability
   ``validation_fraction`` (Bernoulli, from a ``jax.random`` key that does not
   depend on the data). BOTH parts are private. The assignment of a row does
   not depend on the other rows, so neighbouring datasets (one row replaced,
   or added/removed) give splits that differ in that one row only, in one
   part. (Or pass a private validation set to ``fit`` as ``X_val, y_val``.)
2. Draw K from the public law ``repetitions`` and run K times: draw a
   candidate uniformly from the grid (``param_grid``) or from ``n_iter``
   candidates sampled from ``param_distributions`` (sampled once, from the
   search key, before any data is read); fit
   ``clone(estimator).set_params(**candidate)`` on the training part (charged
   to NO accountant: its event is part of the run's); score it on the
   validation part with noise (:mod:`jaxdp.tuning.scoring`: Laplace on a count
   of correct predictions, or on a sum of per-row losses clipped to
   ``[0, score_bound]``, each ``score_epsilon``-DP).
3. Release the run with the highest private score only: its fitted model
   (``best_estimator_``), its candidate (``best_params_``) and its private
   score (``best_score_``).

Privacy. One run is ``fit event ∘ score event`` (basic composition of the
two, an upper bound: the row in which neighbours differ lies in one part
only). Every candidate's fit event is read before anything is spent -- each
jaxdp estimator spends its event on its accountant before computing its
release, so a stand-in accountant that records the event and stops the fit
there (:func:`fit_events`) reads it from the estimator's own calibration
without training. If the candidates' events differ (e.g. ``epsilon`` is
searched), the run's event is the one that dominates every other's RDP curve
(:func:`~jaxdp.tuning.dominating_event`; none dominates: ``ValueError``). The
whole search is ``RepeatAndSelectDpEvent(run event, E[K], shape)`` (PS22
Theorems 2 and 6; a pure ε-DP run gives (2 + η)ε, Liu & Talwar 2019's 3ε for
the geometric law), spent ONCE on the accountant BEFORE any fit: a budget that
refuses it fits nothing. Its cost does not grow with the number of candidates.

The number of runs K is NOT released (no ``n_runs_``, no per-run times or
scores): the theorems bound the output with K unknown, and given K = k the
selection can cost up to k runs (see :mod:`jaxdp.tuning.repeat_and_select`).
The wall-clock time of ``fit`` grows with K: do not publish it.

Refit. ``best_estimator_`` is the chosen run's model, trained on the training
part: already a private release, paid for by the search. ``refit=True``
additionally refits the chosen candidate on ALL of ``(X, y)``: a second
release of the same rows, adaptively chosen, so its event (the fit event on
the full data, dominating over the candidates) is composed with the search's
and charged with it, before any fit. The default is ``refit=False``, unlike
``GridSearchCV``: a silent second charge is what a DP user does not expect,
and the model it would add is worth only the ``validation_fraction`` of rows.

Accountant. The search's ``accountant``; if it is None, the one held by the
estimator (or its pipeline's jaxdp steps), so that a user who gave the
estimator a budget is charged; two different ledgers are refused.
``best_estimator_`` gets the estimator's own ``accountant`` and ``seed`` back
(later fits of it are charged as the user set them).

Pipelines. ``Pipeline`` steps are jaxdp estimators (private, e.g.
``PrivatePCA``), stateless transformers (``requires_fit`` is False, e.g.
``FunctionTransformer``, ``Normalizer``) or ``"passthrough"``; the last step is
a jaxdp estimator. A scikit-learn step that learns from the data
(``StandardScaler``, ...) is refused: its fitted state is computed from the
private rows without noise and is part of the released model and of every
scored prediction. Fit such a step on public data and apply it before the
search, or declare public bounds.

Keys. ``seed`` (an int, a ``jax.random`` key, or None for fresh OS entropy,
:mod:`jaxdp._keys`) gives the split, the candidate sampler, the runs (run i's
jaxdp steps get ``seed = fold_in(run key, j)``, distinct for every run and
step) and the refit their own keys; no key depends on the data.
"""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from sklearn.base import BaseEstimator, MetaEstimatorMixin, clone
from sklearn.exceptions import NotFittedError
from sklearn.model_selection import ParameterGrid, ParameterSampler
from sklearn.pipeline import Pipeline
from sklearn.utils import _safe_indexing, get_tags
from sklearn.utils.metaestimators import available_if
from sklearn.utils.validation import _num_samples

from jaxdp import _estimator_checks as checks
from jaxdp import _keys, _validation
from jaxdp import mechanisms
from jaxdp.accounting import events
from jaxdp.accounting.accountant import PrivacyAccountant
from jaxdp.tuning.repeat_and_select import check_accountable, dominating_event, repeat_and_select
from jaxdp.tuning import repetitions as repetitions_lib
from jaxdp.tuning import scoring

SCORINGS = ("accuracy", "neg_mean_squared_error", "neg_mean_absolute_error", "neg_kmeans_cost",
            "neg_reconstruction_error")


# -- reading a fit's events without fitting -------------------------------------------------------

class _StopAtSpend(BaseException):
  """Raised by a stopping recorder at the spend: nothing after it runs (not an ``Exception``)."""


class _Recorder:
  """An accountant stand-in that records each spend (in order) and never refuses.

  ``stop=True``: raise :class:`_StopAtSpend` at the first ``can_spend`` or
  ``spend`` -- before the estimator computes its release (every jaxdp
  estimator checks/spends its event first).
  """

  def __init__(self, log: list, stop: bool = False):
    self.log, self.stop = log, stop

  def can_spend(self, event: events.DpEvent, count: int = 1) -> bool:
    if self.stop:
      self.log.append(_counted(event, count))
      raise _StopAtSpend
    return True

  def spend(self, event: events.DpEvent, count: int = 1) -> None:
    self.log.append(_counted(event, count))
    if self.stop:
      raise _StopAtSpend


def _counted(event: events.DpEvent, count: int) -> events.DpEvent:
  return event if int(count) == 1 else events.SelfComposedDpEvent(event, int(count))


def _is_jaxdp(est: Any) -> bool:
  """A jaxdp estimator (or a subclass): the shared-accountant mixin, with ``accountant``/``seed``."""
  if not isinstance(est, checks.SharedAccountantMixin) or isinstance(est, PrivateSearchCV):
    return False
  params = est.get_params(deep=False)
  return "accountant" in params and "seed" in params


def _private_steps(est: Any) -> list[tuple[str, Any]]:
  """``[(param prefix, jaxdp estimator)]`` of ``est`` (itself, or its pipeline's jaxdp steps)."""
  if isinstance(est, Pipeline):
    return [(f"{name}__", step) for name, step in est.steps if _is_jaxdp(step)]
  return [("", est)] if _is_jaxdp(est) else []


def _install(est: Any, log: list, keys: Any = None, stop_last: bool = False) -> None:
  """Sets every jaxdp step's accountant to a recorder (the last one stopping if asked) and seeds."""
  steps = _private_steps(est)
  params = {}
  for j, (prefix, _) in enumerate(steps):
    params[prefix + "accountant"] = _Recorder(log, stop=stop_last and j == len(steps) - 1)
    if keys is not None:
      params[prefix + "seed"] = jax.random.fold_in(keys, j)
  est.set_params(**params)


def fit_events(estimator: Any, X: Any, y: Any = None, *, seed: Any = None) -> list[events.DpEvent]:
  """The DpEvents ``estimator.fit(X, y)`` would spend, read at its spend, without a release.

  Each jaxdp estimator checks its parameters and data, computes its event
  from its calibration and spends it BEFORE computing its release (the
  library's rule). A clone of ``estimator`` is fitted with a stand-in
  accountant that records the event and stops the fit there: nothing is
  trained, spent or released (``estimator`` is left untouched). In a
  ``Pipeline`` the jaxdp steps before the last one are fitted for real on a
  clone (their output is needed to reach the next step; it is discarded) and
  their events recorded in order.

  Args:
    estimator: a jaxdp estimator, or a ``Pipeline`` whose last step is one.
    X, y: the data the fit would see (private: only checked, as ``fit`` does).
    seed: keys of the discarded fits of the earlier pipeline steps.

  Returns:
    The events, in the order of the spends.

  Raises:
    ValueError: the fit spends nothing (not a jaxdp estimator), or the
      estimator's own argument/data errors.
  """
  est = clone(estimator)
  log: list = []
  _install(est, log, keys=_keys.key_from_seed(seed), stop_last=True)
  try:
    est.fit(X) if y is None else est.fit(X, y)
  except _StopAtSpend:
    return log
  raise ValueError(f"{type(estimator).__name__}.fit spent no DpEvent: PrivateSearchCV tunes jaxdp "
                   "estimators (and pipelines ending in one), which spend their event before "
                   "releasing.")


# -- scores --------------------------------------------------------------------------------

def _final(est: Any) -> Any:
  return est.steps[-1][1] if isinstance(est, Pipeline) else est


def _before_final(est: Any, X: Any) -> Any:
  return est[:-1].transform(X) if isinstance(est, Pipeline) and len(est.steps) > 1 else X


def _per_row_losses(kind: str, est: Any, X: Any, y: Any) -> np.ndarray:
  """Per-row losses of a fitted model on the validation rows (row i's depends on row i only)."""
  if kind in ("neg_mean_squared_error", "neg_mean_absolute_error"):
    diff = np.asarray(est.predict(X), np.float64) - np.asarray(y, np.float64)
    return diff ** 2 if kind == "neg_mean_squared_error" else np.abs(diff)
  if callable(kind):
    return np.asarray(kind(est, X, y), np.float64)
  final, xt = _final(est), np.asarray(_before_final(est, X), np.float64)
  if kind == "neg_kmeans_cost":
    centres = np.asarray(final.cluster_centers_, np.float64)
    return np.min(np.sum((xt[:, None, :] - centres[None]) ** 2, axis=-1), axis=1)
  centre = getattr(final, "center", None)  # neg_reconstruction_error (PrivatePCA)
  xc = xt - (0.0 if centre is None else np.asarray(centre, np.float64))
  comps = np.asarray(final.components_, np.float64)
  resid = xc - (xc @ comps.T) @ comps
  return np.sum(resid ** 2, axis=1)


# -- the search -------------------------------------------------------------------------------

class PrivateSearchCV(checks.SharedAccountantMixin, MetaEstimatorMixin, BaseEstimator):
  """Private hyper-parameter search of a jaxdp estimator, paid for once (module docstring).

  ``GridSearchCV``'s interface where it can be private: ``fit``, then
  ``best_params_``, ``best_estimator_``, ``best_score_``, ``cv_results_`` and
  ``predict``/``predict_proba``/``decision_function``/``transform``/``score``
  delegated to ``best_estimator_``. What is released is the chosen run only.

  Args:
    estimator: a jaxdp estimator (:mod:`jaxdp.training`, :mod:`jaxdp.classic`)
      or a ``Pipeline`` ending in one (module docstring, "Pipelines").
    param_grid: a dict (or list of dicts) of lists, as ``GridSearchCV``; the
      candidates are its points, drawn uniformly at random by each run.
    param_distributions: as ``RandomizedSearchCV`` (lists or scipy
      distributions): ``n_iter`` candidates are sampled from it with a key of
      the search (data-independent), then drawn uniformly by each run. Give
      exactly one of ``param_grid`` and ``param_distributions``. Neither may set
      an ``accountant`` or ``seed``.
    n_iter: number of candidates sampled from ``param_distributions``.
    repetitions: the law of the number of runs K
      (:class:`~jaxdp.tuning.LogarithmicRepetitions`,
      :class:`~jaxdp.tuning.GeometricRepetitions`,
      :class:`~jaxdp.tuning.TruncatedNegativeBinomial`,
      :class:`~jaxdp.tuning.PoissonRepetitions`), or a number m > 1:
      ``LogarithmicRepetitions(m)`` (E[K] = m; the cheapest of these laws for
      a given mean: a pure ε-DP run gives 2ε, PS22 Thm 2 with η = 0; its K is
      1 with probability about 0.28 at m = 10).
    scoring: ``"accuracy"`` (classifiers), ``"neg_mean_squared_error"``,
      ``"neg_mean_absolute_error"`` (regressors), ``"neg_kmeans_cost"``
      (``PrivateKMeans``: squared distance to the nearest centre),
      ``"neg_reconstruction_error"`` (``PrivatePCA``), a callable
      ``(fitted_estimator, X_val, y_val) -> per-row losses`` (row i's loss must
      depend on row i only; not a scikit-learn scorer, whose one number is
      computed without noise), or None: by the estimator's type. Accuracy adds
      Laplace noise to the count of correct predictions (sensitivity 1); the
      losses add it to the sum of per-row losses clipped to ``[0,
      score_bound]`` (sensitivity ``score_bound``), negated (higher is better).
      Both divide by the public number of validation rows
      (:mod:`jaxdp.tuning.scoring`).
    score_epsilon: ε of the Laplace score (pure DP, Dwork & Roth Thm 3.6),
      paid by every run.
    score_bound: the public bound B of a per-row loss (loss scorings only).
    validation_fraction: the probability that a row goes to the validation
      part (module docstring, step 1); not used when ``fit`` gets ``X_val``.
    refit: False (default): ``best_estimator_`` is the chosen run's model. True:
      refit the chosen candidate on all rows, paid (module docstring, "Refit").
    accountant: where the search's ONE event is spent, before any fit (None:
      the estimator's accountant, if any; module docstring, "Accountant").
    delta: the δ at which ``epsilon_`` is reported.
    seed: None (fresh OS entropy), an int or a ``jax.random`` key (the
      caller's promise not to reuse it for another release of these rows).

  The attributes below are set by ``fit`` (None when nothing is released -- K = 0
  under ``PoissonRepetitions``, or no finite score).

  Attributes:
    best_estimator_: the chosen run's fitted model (or its paid refit).
    best_params_: the chosen candidate.
    best_score_: its private validation score (noisy; may leave [0, 1]).
    best_index_: 0, the row of ``cv_results_``.
    cv_results_: ``GridSearchCV``'s layout holding the chosen run only:
      ``params``, ``param_<name>``, ``mean_test_score`` (the private score),
      ``rank_test_score`` (1). No other candidate's score exists to report.
    event_: the search's DpEvent (with the refit's when ``refit=True``), spent
      on the accountant.
    per_run_event_: one run's event (fit, then score).
    epsilon_: ε of ``event_`` at ``delta`` (the accountant's ``auto`` method).
    scorer_: the scoring used (its name or the callable).
    n_candidates_: the number of candidates (public).
  """

  def __init__(self, estimator: Any, param_grid: Any = None, param_distributions: Any = None, *,
               score_epsilon: float, n_iter: int = 10, repetitions: Any = 10,
               scoring: Any = None, score_bound: float | None = None,
               validation_fraction: float = 0.2, refit: bool = False, accountant: Any = None,
               delta: float = 1e-6, seed: Any = None):
    self.estimator = estimator
    self.param_grid = param_grid
    self.param_distributions = param_distributions
    self.score_epsilon = score_epsilon
    self.n_iter = n_iter
    self.repetitions = repetitions
    self.scoring = scoring
    self.score_bound = score_bound
    self.validation_fraction = validation_fraction
    self.refit = refit
    self.accountant = accountant
    self.delta = delta
    self.seed = seed

  # -- checks (before any spend) ------------------------------------------------------

  def _check_estimator(self) -> None:
    est = self.estimator
    if isinstance(est, Pipeline):
      for name, step in est.steps[:-1]:
        if step is None or (isinstance(step, str) and step == "passthrough") or _is_jaxdp(step):
          continue
        if not hasattr(step, "fit") or get_tags(step).requires_fit:
          raise ValueError(
              f"estimator: pipeline step {name!r} ({type(step).__name__}) learns from the "
              "training rows without noise: its fitted state is part of the released model and "
              "of every scored prediction, so the search would not be private. Use a jaxdp "
              "private step, a stateless transformer (FunctionTransformer, Normalizer), or fit "
              "it on public data and apply it to X before the search.")
    if not _is_jaxdp(_final(est)):
      raise ValueError(f"estimator must be a jaxdp estimator (jaxdp.training, jaxdp.classic) or a "
                       f"Pipeline ending in one, got {type(_final(est)).__name__}.")

  def _check_scoring(self) -> tuple[Any, float]:
    """``(kind, sensitivity)`` after checking it fits the estimator."""
    final = _final(self.estimator)
    kind = get_tags(self.estimator).estimator_type
    scoring = self.scoring
    if scoring is None:
      from jaxdp.classic import kmeans, pca  # pylint: disable=import-outside-toplevel
      if kind == "classifier":
        scoring = "accuracy"
      elif kind == "regressor":
        scoring = "neg_mean_squared_error"
      elif isinstance(final, kmeans.PrivateKMeans):
        scoring = "neg_kmeans_cost"
      elif isinstance(final, pca.PrivatePCA):
        scoring = "neg_reconstruction_error"
      else:
        raise ValueError(f"scoring: no default for {type(final).__name__}; pass one of "
                         f"{SCORINGS} or a per-row loss callable.")
    if not callable(scoring) and (not isinstance(scoring, str) or scoring not in SCORINGS):
      raise ValueError(f"scoring must be one of {SCORINGS}, a callable (estimator, X_val, y_val) "
                       f"-> per-row losses, or None; got {scoring!r}.")
    need = {"accuracy": "classifier", "neg_mean_squared_error": "regressor",
            "neg_mean_absolute_error": "regressor"}.get(scoring if isinstance(scoring, str) else "")
    if need is not None and kind != need:
      raise ValueError(f"scoring={scoring!r} needs a {need}; {type(final).__name__} is not one.")
    if scoring in ("neg_kmeans_cost", "neg_reconstruction_error"):
      from jaxdp.classic import kmeans, pca  # pylint: disable=import-outside-toplevel
      want = kmeans.PrivateKMeans if scoring == "neg_kmeans_cost" else pca.PrivatePCA
      if not isinstance(final, want):
        raise ValueError(f"scoring={scoring!r} needs a {want.__name__} as the last step, got "
                         f"{type(final).__name__}.")
    if scoring == "accuracy":
      if self.score_bound is not None:
        raise ValueError("score_bound is for the loss scorings; scoring='accuracy' has "
                         "sensitivity 1.")
      return scoring, 1.0
    if self.score_bound is None:
      raise ValueError(f"scoring={scoring!r}: give score_bound, the public bound B of a per-row "
                       "loss (losses are clipped to [0, B]; B is the score's sensitivity).")
    bound = _validation.check_positive(self.score_bound, "score_bound")
    if not math.isfinite(bound):
      raise ValueError(f"score_bound must be finite, got {self.score_bound!r}.")
    return scoring, bound

  def _candidates(self, key: jax.Array) -> list[dict]:
    if (self.param_grid is None) == (self.param_distributions is None):
      raise ValueError("give exactly one of param_grid (GridSearchCV's) or param_distributions "
                       "(RandomizedSearchCV's).")
    try:
      if self.param_grid is not None:
        cands = list(ParameterGrid(self.param_grid))
      else:
        n_iter = _validation.check_positive_int(self.n_iter, "n_iter")
        state = int(jax.random.randint(key, (), 0, np.iinfo(np.int32).max))
        cands = list(ParameterSampler(self.param_distributions, n_iter, random_state=state))
    except (TypeError, ValueError) as err:
      name = "param_grid" if self.param_grid is not None else "param_distributions"
      raise ValueError(f"{name}: {err}") from None
    if not cands:
      raise ValueError("the search space is empty.")
    for cand in cands:
      bad = sorted(k for k in cand if k.split("__")[-1] in ("accountant", "seed"))
      if bad:
        raise ValueError(f"the search space may not set {bad}: the search charges its own "
                         "accountant once and gives every run its own key.")
    return cands

  def _resolve_accountant(self) -> Any:
    held = []
    for _, step in _private_steps(self.estimator):
      acc = step.get_params(deep=False)["accountant"]
      if acc is not None and all(acc is not h for h in held):
        held.append(acc)
    acc = self.accountant
    if acc is not None:
      if not callable(getattr(acc, "spend", None)):
        raise TypeError("accountant must be None, a PrivacyAccountant or a PrivacyBudget, got "
                        f"{type(acc).__name__}.")
      if any(h is not acc for h in held):
        raise ValueError("accountant: the estimator holds another accountant; one search is "
                         "charged to one ledger (pass it once, to the search or the estimator).")
      return acc
    if len(held) > 1:
      raise ValueError("the pipeline's jaxdp steps hold different accountants; pass the "
                       "search one accountant=.")
    return held[0] if held else None

  def _split(self, key: jax.Array, X: Any, y: Any, X_val: Any, y_val: Any):
    n = _num_samples(X)
    if y is not None and _num_samples(y) != n:
      raise ValueError(f"X and y must have the same number of rows, got {n} and "
                       f"{_num_samples(y)}.")
    if X_val is not None:
      if (y is None) != (y_val is None) or _num_samples(X_val) < 1 or (
          y_val is not None and _num_samples(y_val) != _num_samples(X_val)):
        raise ValueError("X_val (and y_val, when y is given) must be a non-empty private "
                         "validation set with one label per row.")
      return X, y, X_val, y_val
    frac = _validation._as_float(self.validation_fraction, "validation_fraction")  # pylint: disable=protected-access
    if not 0.0 < frac < 1.0:
      raise ValueError(f"validation_fraction must be in (0, 1), got {self.validation_fraction!r}.")
    to_val = np.asarray(jax.random.uniform(key, (n,)) < frac)
    if to_val.all() or not to_val.any():
      raise ValueError(f"the random split of {n} rows with validation_fraction={frac} left a part "
                       "empty (the split depends on the seed and n only); use more rows or another "
                       "validation_fraction.")
    tr, va = np.flatnonzero(~to_val), np.flatnonzero(to_val)
    pick = lambda a, idx: None if a is None else _safe_indexing(a, idx)  # noqa: E731
    return pick(X, tr), pick(y, tr), pick(X, va), pick(y, va)

  # -- fit --------------------------------------------------------------------------------

  def fit(self, X: Any, y: Any = None, *, X_val: Any = None, y_val: Any = None
          ) -> "PrivateSearchCV":
    """Runs the private search (module docstring); charges its one event before any fit.

    Args:
      X, y: the private data (``y`` None for ``PrivateKMeans``/``PrivatePCA``).
      X_val, y_val: optional private validation rows; then ``(X, y)`` is all
        training data and ``validation_fraction`` is not used.

    Raises:
      ValueError / TypeError: bad parameters, data, search space or pipeline
        (nothing spent).
      BudgetExceededError: the accountant refuses the search (nothing fitted).
      RuntimeError: a run spent another event than the one read before (the
        search's event stays spent; nothing is released).
    """
    self._check_estimator()
    score_kind, sensitivity = self._check_scoring()
    law = self.repetitions
    if isinstance(law, numbers.Real) and not isinstance(law, bool):
      law = repetitions_lib.LogarithmicRepetitions(float(law))
    repetitions_lib.check_repetitions(law)
    score_eps = _validation.check_epsilon(self.score_epsilon, "score_epsilon")
    delta = _validation.check_delta(self.delta, "delta")
    if not isinstance(self.refit, (bool, np.bool_)):
      raise TypeError(f"refit must be True or False, got {self.refit!r}.")
    accountant = self._resolve_accountant()
    root = _keys.key_from_seed(self.seed)
    k_split, k_cands, k_probe, k_search, k_refit = jax.random.split(root, 5)
    candidates = self._candidates(k_cands)
    X_tr, y_tr, X_va, y_va = self._split(k_split, X, y, X_val, y_val)
    n_val = _num_samples(X_va)

    # Every candidate's fit events, read at the spend (nothing trained, nothing spent).
    def probe(cand, xs, ys):
      return fit_events(clone(self.estimator).set_params(**cand), xs, ys, seed=k_probe)
    fits = [probe(c, X_tr, y_tr) for c in candidates]
    refits = [probe(c, X, y) for c in candidates] if self.refit else None
    tags = set().union(*[events.leaf_tags(e) for f in fits for e in f])
    if len(tags) > 1:
      raise ValueError(f"the candidates' fits hold for different relations or units {sorted(tags)}; "
                       "one search is accounted under one.")
    relation, unit = next(iter(tags)) if tags else (events.REPLACE_ONE, events.DEFAULT_UNIT)
    relation = relation or events.REPLACE_ONE
    score_event = mechanisms.laplace_mechanism_event(sensitivity, score_eps,
                                                     neighbouring=relation, unit=unit)
    run_events = [events.ComposedDpEvent([*f, score_event]) for f in fits]
    per_run = _dominating(run_events, "run")
    total = law.event(per_run)
    check_accountable(total)  # e.g. an (eps, delta) ApproxDpEvent fit has no RDP bound: refused
    if self.refit:
      total = events.ComposedDpEvent(
          [total, _dominating([events.ComposedDpEvent(f) for f in refits], "refit")])
    ledger = PrivacyAccountant(relation, unit)
    ledger.spend(total)
    epsilon = float(ledger.get_epsilon(delta))
    planned = [[events.event_to_dict(e) for e in f] for f in fits]
    score_dict = events.event_to_dict(score_event)

    if accountant is not None:
      accountant.spend(total)  # ONE spend, before any fit; a budget refuses atomically

    def mechanism(run_key, index):
      fit_key, score_key = jax.random.split(run_key)
      est, log = clone(self.estimator).set_params(**candidates[index]), []
      _install(est, log, keys=fit_key)
      est.fit(X_tr) if y_tr is None else est.fit(X_tr, y_tr)
      if [events.event_to_dict(e) for e in log] != planned[index]:
        raise RuntimeError("a run spent other events than those read before the search; "
                           "nothing is released.")
      score, ev = _private_score(score_key, score_kind, est, X_va, y_va, score_eps, sensitivity,
                                 relation, unit, n_val)
      if events.event_to_dict(ev) != score_dict:
        raise RuntimeError("the score's event differs from the planned one; nothing is released.")
      return est, score, per_run

    out = repeat_and_select(k_search, mechanism, list(range(len(candidates))),
                                repetitions=law, event=per_run)
    best = out.release
    if out.candidate is not None and self.refit:
      log = []
      best = clone(self.estimator).set_params(**candidates[out.candidate])
      _install(best, log, keys=k_refit)
      best.fit(X) if y is None else best.fit(X, y)
      if [events.event_to_dict(e) for e in log] != [
          events.event_to_dict(e) for e in refits[out.candidate]]:
        raise RuntimeError("the refit spent other events than those read before the search; "
                           "nothing is released.")
    if best is not None:
      best.set_params(**{prefix + name: step.get_params(deep=False)[name]
                         for prefix, step in _private_steps(self.estimator)
                         for name in ("accountant", "seed")})
    self.event_, self.per_run_event_, self.epsilon_ = total, per_run, epsilon
    self.scorer_, self.n_candidates_, self.best_index_ = score_kind, len(candidates), 0
    self.multimetric_ = False
    self.best_estimator_ = best
    self.best_params_ = None if out.candidate is None else dict(candidates[out.candidate])
    self.best_score_ = out.score
    self.cv_results_ = _results(self.best_params_, out.score)
    if best is None:
      warnings.warn("the private search released nothing (K = 0 runs under PoissonRepetitions, or "
                    "no run had a finite score); its event was spent.", UserWarning, stacklevel=2)
    return self

  # -- delegation to the released model ---------------------------------------------------

  def _released(self) -> Any:
    if not hasattr(self, "best_estimator_"):
      raise NotFittedError(f"this {type(self).__name__} instance is not fitted yet; call fit "
                           "first.")
    if self.best_estimator_ is None:
      raise NotFittedError("the private search released no model (K = 0 runs, or no finite "
                           "score): nothing to predict with.")
    return self.best_estimator_

  def _has(name):  # pylint: disable=no-self-argument
    def check(self):
      est = self.best_estimator_ if hasattr(self, "best_estimator_") else self.estimator
      if est is None:
        est = self.estimator
      getattr(est, name)
      return True
    return check

  @available_if(_has("predict"))
  def predict(self, X: Any) -> np.ndarray:
    return self._released().predict(X)

  @available_if(_has("predict_proba"))
  def predict_proba(self, X: Any) -> np.ndarray:
    return self._released().predict_proba(X)

  @available_if(_has("decision_function"))
  def decision_function(self, X: Any) -> np.ndarray:
    return self._released().decision_function(X)

  @available_if(_has("transform"))
  def transform(self, X: Any) -> np.ndarray:
    return self._released().transform(X)

  @available_if(_has("score"))
  def score(self, X: Any, y: Any = None) -> float:
    """The released model's ``score`` on the caller's data (no noise: not private on private rows)."""
    return self._released().score(X, y)

  @property
  def classes_(self) -> np.ndarray:
    return self._released().classes_

  @property
  def n_features_in_(self) -> int:
    return self._released().n_features_in_

  def __sklearn_tags__(self):
    tags = super().__sklearn_tags__()
    inner = get_tags(self.estimator)
    tags.estimator_type = inner.estimator_type
    tags.target_tags.required = inner.target_tags.required
    return tags


def _dominating(evs: Sequence[events.DpEvent], what: str) -> events.DpEvent:
  """The one event of the candidates' (distinct) events, or the RDP-dominating one."""
  distinct = _distinct(evs)
  if len(distinct) == 1:
    return distinct[0]
  try:
    return dominating_event(distinct)
  except ValueError as err:
    raise ValueError(f"the candidates' {what} events differ and {err} (the search needs one "
                     "per-run event: an RDP-accountable one that dominates the others).") from None


def _distinct(evs: Sequence[events.DpEvent]) -> list[events.DpEvent]:
  seen, out = set(), []
  for e in evs:
    key = repr(events.event_to_dict(e))
    if key not in seen:
      seen.add(key)
      out.append(e)
  return out


def _private_score(key, kind, est, X, y, epsilon, sensitivity, relation, unit, n):
  """``(private score, event)`` of a fitted model on the private validation rows."""
  if kind == "accuracy":
    correct = (np.asarray(est.predict(X)) == np.asarray(y)).astype(np.int32)
    return scoring.private_accuracy(key, correct, np.ones_like(correct), epsilon=epsilon,
                                    neighbouring=relation, unit=unit, num_examples=n)
  losses = _per_row_losses(kind, est, X, y)
  if losses.shape != (n,):
    raise ValueError(f"the scoring callable must return one loss per validation row, shape "
                     f"({n},), got {losses.shape} (a scikit-learn scorer's single number is "
                     "computed without noise and cannot be used).")
  noisy, event = scoring.private_loss(key, losses, bound=sensitivity, epsilon=epsilon,
                                      neighbouring=relation, unit=unit, num_examples=n)
  return -noisy, event


def _results(params: Mapping | None, score: float | None) -> dict:
  if params is None:
    return {"params": [], "mean_test_score": np.array([]), "rank_test_score": np.array([], np.int32)}
  out: dict = {"params": [dict(params)]}
  for name, value in params.items():
    out[f"param_{name}"] = np.ma.MaskedArray([value], mask=[False], dtype=object)
  out["mean_test_score"] = np.array([score], np.float64)
  out["rank_test_score"] = np.array([1], np.int32)
  return out


__all__ = ["PrivateSearchCV", "fit_events"]
