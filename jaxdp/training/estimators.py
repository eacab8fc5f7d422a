"""Private linear classifiers that are scikit-learn estimators.

``PrivateLogisticRegression(epsilon=1.0, classes=range(10)).fit(x, y)``
trains with one of the pure functions of :mod:`jaxdp.training.output_perturbation`
/ :mod:`jaxdp.training.objective_perturbation`, then records the method's
DpEvent in the given accountant (a :class:`jaxdp.accounting.PrivacyAccountant`
or a budget-enforcing :class:`jaxdp.accounting.PrivacyBudget`). With a budget,
``can_spend`` is checked *before* touching the data, and the weights are only
stored after ``spend`` succeeded, so a refused spend releases nothing.

scikit-learn conventions (``sklearn.base.BaseEstimator``/``ClassifierMixin``).
The constructor stores its arguments unchanged; ``fit`` checks every parameter
and the data (:mod:`jaxdp._estimator_checks`) and raises a ``ValueError`` /
``TypeError`` naming the argument BEFORE any training or privacy spend. Fitted
attributes end in ``_``: ``coef_`` (private), ``classes_`` (the public label
set), ``n_features_in_`` (public: a shape) and ``event_`` (the DpEvent the fit
spent). ``get_params``/``set_params``/``clone``, ``Pipeline`` and
``GridSearchCV`` work.

Model selection costs privacy. Every ``fit`` is a private release of (part of)
the training data and is charged to ``accountant``: ``GridSearchCV`` with ``g``
candidates and ``k`` folds fits ``g k + 1`` times (``refit=True``). Clones
share the accountant (the ledger is never copied), so all those spends are
recorded. The cross-validation SCORES are computed on held-out private rows
without noise: they are not covered by any charged event, so releasing
``cv_results_``/``best_params_`` (a function of the scores) is not differentially
private. Use ``GridSearchCV`` on public or synthetic data, or a private
selection procedure (e.g. J. Liu, K. Talwar, "Private Selection from Private
Candidates", STOC 2019), which :class:`jaxdp.tuning.PrivateSearchCV` runs
with one charge for the whole search. ``n_jobs > 1`` would pickle the
accountant into worker processes, where the spends are lost: an estimator with
an accountant refuses to be pickled or deep-copied (``set_params(accountant=None)``
first, e.g. to save a fitted model), and under a process-based ``n_jobs > 1``
search the clone says so before joblib does. A budget refusal inside
scikit-learn model selection raises :class:`jaxdp.errors.BudgetExhausted` (a
``BaseException``: ``error_score`` cannot turn it into a ``FitFailedWarning``),
so the search ends instead of picking a winner among the affordable fits.

Noise keys (:mod:`jaxdp._keys`). With ``seed=None`` (the default) every ``fit``
draws its key from fresh OS entropy (scikit-learn's ``random_state=None``
semantics): two instances, or a refit on updated data, never add the same
noise, so the difference of two releases cannot cancel the noise and expose the
change in the data. An explicit ``seed`` gives fit ``i`` of an instance the key
``fold_in(key(seed), i)`` (reproducible experiments); it is the user's promise
not to reuse that seed for another release on overlapping data (two instances
with the same seed add identical noise). ``sklearn.base.clone`` builds a new
instance from the parameters, so its fit counter starts at 0: a clone of a
seeded estimator repeats the original's first key. Hence with an explicit seed
every fit inside ``GridSearchCV``/``cross_validate`` (each on a fresh clone)
uses the SAME key ``fold_in(key(seed), 0)`` on overlapping folds, and the
charged events do not compose (the noise is shared, not independent): leave
``seed=None`` for model selection (a seeded fit inside ``sklearn.model_selection``
warns, :func:`jaxdp._keys.fit_key`).

Non-private diagnostics. The fitted estimator keeps only private values
(``coef_``), public ones (``classes_``, ``n_features_in_``) and the event
(``event_``). The solver's diagnostics (iterations, gradient norm, objective
value, certificate) are computed from the data without noise; they are kept, as
``nonprivate_info_``, only when the estimator is built with
``return_nonprivate_diagnostics=True`` (see
:class:`jaxdp.training.linear.NonPrivateDiagnostics`).

Non-private baseline. ``epsilon=inf`` is refused by every private method
(it used to train the non-private model silently). The explicit opt-in is
``method="non_private"`` together with ``epsilon=math.inf``: the same objective,
solver and row-norm rule without noise (the matched baseline of the papers'
figures; its ``event_`` is a ``NonPrivateDpEvent``, which an accountant records
as an infinite loss); ``sklearn.linear_model.LogisticRegression`` is the other.

Neighbouring relation. Every method here is run under REPLACE-ONE neighbours
(model sensitivity, paper 000 Lemma 1; paper 003 Alg. 1 and 4), including loss
perturbation (``neighbouring="replace_one"``, noise doubled): so the events
spent in one accountant compose under one relation, and ``l2_reg > 0`` is
valid for loss perturbation (under add/remove the mean-normalised L2 term is
data-dependent; see :mod:`jaxdp.training.objective_perturbation`).
"""

from __future__ import annotations

import math
from typing import Any

import jax.numpy as jnp
import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin

from jaxdp import _estimator_checks as checks
from jaxdp import _keys, _validation
from jaxdp.accounting import events
from jaxdp.errors import ArgumentTypeError, BudgetExceededError
from jaxdp.training import linear, objective_perturbation, output_perturbation

METHODS = ("loss_perturbation", "model_sensitivity", "objective_perturbation",
           "output_perturbation", "non_private")
BINARY_METHODS = ("objective_perturbation", "output_perturbation")
BINARY_LOSSES = ("logistic", "huber")


def _check_bool(value: Any, name: str) -> bool:
  if not isinstance(value, (bool, np.bool_)):
    raise ArgumentTypeError(f"{name} must be True or False, got {type(value).__name__} "
                            f"{value!r}.")
  return bool(value)


class PrivateLinearClassifier(checks.SharedAccountantMixin, ClassifierMixin, BaseEstimator):
  """Private linear classifier (a scikit-learn classifier).

  Methods: ``fit``, ``predict``, ``predict_proba``, ``decision_function``,
  ``score`` (mean accuracy), ``get_params``/``set_params``. Every ``fit`` is a
  private release charged to ``accountant``; so is every fit that
  ``GridSearchCV``/``cross_validate`` makes, and their cross-validation scores
  are NOT private (module docstring, "Model selection costs privacy").

  Args:
    epsilon: privacy parameter, ``0 < epsilon < inf``. ``math.inf`` only with
      ``method="non_private"`` (the explicit non-private baseline); a private
      method refuses it.
    delta: 0 for pure DP, > 0 for the Gaussian variants (loss perturbation,
      model sensitivity).
    method: one of :data:`METHODS`. ``loss_perturbation`` (paper 000 Alg. 4/5)
      and ``model_sensitivity`` (Alg. 1/3) use the softmax loss for any number
      of classes; ``objective_perturbation`` (paper 003 Alg. 1) and
      ``output_perturbation`` (Alg. 4) are binary, with ``loss`` ``"logistic"``
      or ``"huber"``. ``non_private`` (with ``epsilon=math.inf``): the same
      objective without noise, for baselines only.
    l2_reg: ``lambda`` of ``(lambda/2)||theta||^2`` (> 0 where the sensitivity divides by it).
    loss: binary loss for the binary methods.
    h: Huberized hinge width.
    accountant: where each fit's DpEvent is spent (None: not recorded; the
      event is still available as ``event_``). Clones (``sklearn.base.clone``,
      hence ``GridSearchCV``) share it; an estimator holding one refuses to be
      pickled or deep-copied (the copy's spends would be lost).
    seed: ``None`` (default): fresh OS entropy for every fit. An integer or a
      ``jax.random`` key: fit ``i`` of this instance uses
      ``fold_in(key(seed), i)``; an explicit seed is the caller's promise not
      to reuse it for another release on overlapping data (two instances with
      one seed add the same noise, and so do a clone and its original: do not
      pass a seed to an estimator under ``GridSearchCV``). Floats, bools and
      strings raise ``ValueError`` at ``fit``.
    normalize: project rows outside the unit ball onto it (otherwise they raise).
    max_iter, tol: solver settings. ``tol=None``: 1e-6 for output perturbation /
      model sensitivity, and for the perturbed-objective methods the AMP default
      (:func:`jaxdp.training.objective_perturbation.amp_default_tol`).
    classes: the PUBLIC label set (e.g. ``range(10)``, or ``["cat", "dog"]``:
      any sortable labels; ``classes_`` is it, sorted), fixed before seeing the
      data. The number of classes sets the weight shape and loss
      perturbation's ``rho``, and ``classes_`` is released with the model, so a
      label set read off the training data is not protected: replacing one
      example can remove a class (changing the output's shape) or reveal a
      rare label. ``None`` infers it with ``np.unique(y)`` and warns.
    amp_fraction: share of epsilon (and delta) spent on the Approximate Minima
      Perturbation output noise of the perturbed-objective methods.
    return_nonprivate_diagnostics: keep the solver diagnostics of each fit as
      ``nonprivate_info_`` (NOT private: computed from the data without noise;
      for debugging on public or synthetic data). Default False: not kept.

  The attributes below are set by ``fit``.

  Attributes:
    coef_: ``(n_features, n_classes)`` softmax weights, or ``(n_features,)``
      for the binary methods (private).
    classes_: the label set (public when ``classes`` is given).
    n_features_in_: number of columns of ``x`` (public).
    event_: the DpEvent of the last fit (charged to ``accountant`` if given).
  """

  # The binary loss and Huber width of the class (PrivateLogisticRegression
  # fixes the loss to "logistic" and has no such parameters).
  loss = "logistic"
  h = 0.5

  def __init__(self, *, epsilon: float, delta: float = 0.0, method: str = "loss_perturbation",
               l2_reg: float = 1e-3, loss: str = "logistic", h: float = 0.5,
               accountant: Any = None, seed: Any = None, normalize: bool = False,
               max_iter: int = 500, tol: float | None = None, classes: Any = None,
               amp_fraction: float = 0.01, return_nonprivate_diagnostics: bool = False):
    self.epsilon = epsilon
    self.delta = delta
    self.method = method
    self.l2_reg = l2_reg
    self.loss = loss
    self.h = h
    self.accountant = accountant
    self.seed = seed
    self.normalize = normalize
    self.max_iter = max_iter
    self.tol = tol
    self.classes = classes
    self.amp_fraction = amp_fraction
    self.return_nonprivate_diagnostics = return_nonprivate_diagnostics
    self._num_fits = 0

  # -- scikit-learn protocol ------------------------------------------------------

  def __sklearn_tags__(self):
    tags = super().__sklearn_tags__()
    tags.classifier_tags.poor_score = True  # noise costs accuracy at small n and epsilon
    tags.target_tags.required = True
    tags.classifier_tags.multi_class = self.method not in BINARY_METHODS
    return tags

  # -- checks (before any work or spend) -------------------------------------------

  def _check_params(self) -> dict[str, Any]:
    """Every parameter checked; returns the converted values (the attributes are unchanged)."""
    if not isinstance(self.method, str) or self.method not in METHODS:
      raise ValueError(f"method must be one of {METHODS}, got {self.method!r}.")
    epsilon = _validation.check_epsilon(self.epsilon, "epsilon", allow_inf=True)
    if self.method == "non_private":
      if not math.isinf(epsilon):
        raise ValueError(
            f"method='non_private' trains WITHOUT noise (no privacy); pass epsilon=math.inf with "
            f"it so that the parameters say so (got epsilon={epsilon}), or choose a private "
            f"method from {METHODS[:-1]}.")
    elif math.isinf(epsilon):
      raise ValueError(
          f"epsilon=inf would train a NON-private model with method={self.method!r}. For a "
          "non-private baseline opt in explicitly: method='non_private' with epsilon=math.inf "
          "(same objective and solver, no noise), or sklearn.linear_model.LogisticRegression.")
    delta = _validation.check_delta(self.delta, "delta")
    l2_reg = _validation.check_nonnegative(self.l2_reg, "l2_reg")
    if not isinstance(self.loss, str) or self.loss not in BINARY_LOSSES:
      raise ValueError(f"loss must be one of {BINARY_LOSSES}, got {self.loss!r}.")
    h = _validation.check_positive(self.h, "h")
    acc = self.accountant
    if acc is not None and not callable(getattr(acc, "spend", None)):
      raise ArgumentTypeError(
          "accountant must be None, a jaxdp.accounting.PrivacyAccountant or a "
          f"jaxdp.accounting.PrivacyBudget (an object with spend(event)), got "
          f"{type(acc).__name__} {acc!r:.60}.")
    seed = _keys.check_seed(self.seed, "seed")
    normalize = _check_bool(self.normalize, "normalize")
    max_iter = _validation.check_positive_int(self.max_iter, "max_iter")
    tol = None if self.tol is None else _validation.check_positive(self.tol, "tol")
    classes = checks.check_classes(self.classes, "classes")
    amp_fraction = _validation._as_float(self.amp_fraction, "amp_fraction")  # pylint: disable=protected-access
    if not 0.0 < amp_fraction < 1.0:
      raise ValueError(f"amp_fraction must be in (0, 1), got {amp_fraction}.")
    diag = _check_bool(self.return_nonprivate_diagnostics, "return_nonprivate_diagnostics")
    return dict(epsilon=epsilon, delta=delta, l2_reg=l2_reg, h=h, seed=seed,
                normalize=normalize, max_iter=max_iter, tol=tol, classes=classes,
                amp_fraction=amp_fraction, diag=diag)

  def _predicted_event(self, p: dict[str, Any], n: int, num_classes: int, dim: int):
    """The event a fit will spend (computed from the calibration only, no data access)."""
    if self.method == "non_private":
      return events.NonPrivateDpEvent()
    if self.method == "loss_perturbation":
      return objective_perturbation.loss_perturbation_amp_calibration(
          epsilon=p["epsilon"], delta=p["delta"], num_examples=n, num_classes=num_classes,
          dim=dim, neighbouring="replace_one", l2_reg=p["l2_reg"],
          amp_fraction=p["amp_fraction"], tol=p["tol"]).event
    if self.method == "objective_perturbation":
      return objective_perturbation.objective_perturbation_amp_calibration(
          epsilon=p["epsilon"], num_examples=n, dim=dim, l2_reg=p["l2_reg"], loss=self.loss,
          h=p["h"], amp_fraction=p["amp_fraction"], tol=p["tol"]).event
    return output_perturbation.output_perturbation_calibration(
        num_examples=n, l2_reg=p["l2_reg"], epsilon=p["epsilon"], delta=p["delta"]).event

  # -- fit / predict --------------------------------------------------------------

  def fit(self, x: Any, y: Any) -> "PrivateLinearClassifier":
    """Trains privately and spends the method's DpEvent in ``accountant``.

    Every parameter and ``x``, ``y`` are checked first (named ``ValueError`` /
    ``TypeError``; nothing trained, nothing spent). ``x``: ``(n_samples,
    n_features)`` real, finite, rows in the unit L2 ball unless
    ``normalize=True``; ``y``: ``(n_samples,)`` labels, all in ``classes``.
    """
    p = self._check_params()
    x_np = checks.check_x(x, "x")
    y_np = checks.check_y(y, x_np.shape[0], "y")
    classes, y_idx = checks.encode_labels(y_np, p["classes"], "y", "classes", stacklevel=3)
    if self.method in BINARY_METHODS and classes.size != 2:
      raise ValueError(f"Only binary classification is supported by method={self.method!r}; y "
                       f"has {classes.size} classes.")
    linear.check_features(x_np, "x", normalize=p["normalize"])  # unit ball: before any key is drawn
    n = x_np.shape[0]
    event = self._predicted_event(p, n, classes.size, x_np.shape[1])
    if self.accountant is not None and hasattr(self.accountant, "can_spend"):
      if not self.accountant.can_spend(event):
        asked = f"fitting {type(self).__name__}"
        message = (self.accountant.refusal_message(event, asked)
                   if hasattr(self.accountant, "refusal_message") else
                   f"{asked} would exceed the privacy budget; nothing was spent.")
        raise _keys.budget_refusal(BudgetExceededError(message))  # stops a sklearn search
    key = _keys.fit_key(p["seed"], self._num_fits)
    self._num_fits += 1
    tol = 1e-6 if p["tol"] is None else p["tol"]
    diag = dict(return_nonprivate_diagnostics=p["diag"])
    common = dict(max_iter=p["max_iter"], tol=tol, normalize=p["normalize"], **diag)
    amp = dict(max_iter=p["max_iter"], tol=p["tol"], normalize=p["normalize"],
               amp_fraction=p["amp_fraction"], **diag)
    eps, delta, l2_reg = p["epsilon"], p["delta"], p["l2_reg"]
    if self.method == "non_private":
      x_c = linear.check_features(x_np, "x", normalize=p["normalize"])
      res = linear.fit_linear(x_c, y_idx, num_classes=classes.size, l2_reg=l2_reg,
                              max_iter=p["max_iter"], tol=tol)
      weights, ev = res.weights, events.NonPrivateDpEvent()
      res = linear.PrivateLinearModel(weights, ev, None, nonprivate_info=(
          linear.NonPrivateDiagnostics(res.info, None) if p["diag"] else None))
    elif self.method == "loss_perturbation":
      res = objective_perturbation.loss_perturbation(
          key, x_np, y_idx, num_classes=classes.size, epsilon=eps, delta=delta,
          l2_reg=l2_reg, neighbouring="replace_one", **amp)
      weights, ev = res.weights, res.event
    elif self.method == "model_sensitivity":
      res = output_perturbation.model_sensitivity(
          key, x_np, y_idx, num_classes=classes.size, l2_reg=l2_reg, epsilon=eps,
          delta=delta, **common)
      weights, ev = res.weights, res.event
    elif self.method == "objective_perturbation":
      res = objective_perturbation.objective_perturbation(
          key, x_np, y_idx, epsilon=eps, l2_reg=l2_reg, loss=self.loss, h=p["h"], **amp)
      weights, ev = res.weights, res.event
    else:
      res = output_perturbation.output_perturbation(
          key, x_np, y_idx, l2_reg=l2_reg, loss=self.loss, h=p["h"], epsilon=eps,
          delta=delta, **common)
      weights, ev = res.weights, res.event
    if self.accountant is not None:
      try:
        self.accountant.spend(ev)  # may raise BudgetExceededError: then nothing is stored
      except BudgetExceededError as err:
        raise _keys.budget_refusal(err)  # inside a sklearn search: BudgetExhausted (ends it)
    self.classes_ = classes
    checks.check_n_features(self, x_np, reset=True)
    self.coef_ = np.asarray(weights)
    self.event_ = ev
    if p["diag"]:
      self.nonprivate_info_ = res.nonprivate_info
    elif hasattr(self, "nonprivate_info_"):
      del self.nonprivate_info_  # a refit without diagnostics keeps none of an earlier fit's
    return self

  def _scores(self, x: Any) -> np.ndarray:
    """Raw scores ``x @ W`` (``(N, C)``, or ``(N,)`` for binary weights) after the checks."""
    checks.check_is_fitted(self, "coef_")
    x = checks.check_x(x, "x")
    checks.check_n_features(self, x, reset=False)
    x = np.asarray(x, np.float32)
    if self.normalize:
      x = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1.0)
    return np.asarray(linear.linear_logits(jnp.asarray(self.coef_), jnp.asarray(x)))

  def decision_function(self, x: Any) -> np.ndarray:
    """Scores in scikit-learn's layout: ``(N, C)``, or ``(N,)`` when there are two classes.

    Two classes: the log-odds of ``classes_[1]`` (``x @ w`` for the binary
    methods, ``x @ (W[:, 1] - W[:, 0])`` for the softmax ones): positive means
    ``classes_[1]``.
    """
    scores = self._scores(x)
    if scores.ndim == 2 and scores.shape[1] == 2:
      return scores[:, 1] - scores[:, 0]
    return scores

  def predict_proba(self, x: Any) -> np.ndarray:
    """Softmax (multiclass) or ``[1 - s, s]`` with ``s = sigmoid(score)`` (binary weights)."""
    scores = self._scores(x)
    if scores.ndim == 1:
      p = 1.0 / (1.0 + np.exp(-scores))
      return np.stack([1.0 - p, p], axis=1)
    scores = scores - scores.max(axis=1, keepdims=True)
    e = np.exp(scores)
    return e / e.sum(axis=1, keepdims=True)

  def predict_log_proba(self, x: Any) -> np.ndarray:
    """``log(predict_proba(x))``."""
    with np.errstate(divide="ignore"):
      return np.log(self.predict_proba(x))

  def predict(self, x: Any) -> np.ndarray:
    """Most probable class label (in the original label values of ``classes_``)."""
    proba = self.predict_proba(x)  # checks first (NotFittedError before classes_ is read)
    return self.classes_[np.argmax(proba, axis=1)]

  def score(self, x: Any, y: Any, sample_weight: Any = None) -> float:
    """Mean accuracy on ``(x, y)`` (weighted by ``sample_weight`` if given).

    ``y`` is the caller's data, read without noise: a score on private
    held-out data is not a private release (module docstring).
    """
    pred = self.predict(x)
    y_np = checks.check_y(y, pred.shape[0], "y")
    if sample_weight is None:
      return float(np.mean(pred == y_np))
    w = _validation.check_finite_array(sample_weight, "sample_weight")
    if w.shape != (pred.shape[0],):
      raise ValueError(f"sample_weight must have shape ({pred.shape[0]},), got {w.shape}.")
    return float(np.average(pred == y_np, weights=w))


class PrivateLogisticRegression(PrivateLinearClassifier):
  """Private (multinomial) logistic regression (a scikit-learn classifier).

  Default method: loss perturbation (paper 000 Alg. 4/5); the arguments and
  attributes are those of :class:`PrivateLinearClassifier` with the loss fixed
  to ``"logistic"``. Every ``fit`` (and so every fit made by ``GridSearchCV``)
  is a private release charged to ``accountant``; cross-validation scores are
  not private (module docstring, "Model selection costs privacy").
  """

  def __init__(self, *, epsilon: float, delta: float = 0.0, method: str = "loss_perturbation",
               l2_reg: float = 1e-3, accountant: Any = None, seed: Any = None,
               normalize: bool = False, max_iter: int = 500, tol: float | None = None,
               classes: Any = None, amp_fraction: float = 0.01,
               return_nonprivate_diagnostics: bool = False):
    self.epsilon = epsilon
    self.delta = delta
    self.method = method
    self.l2_reg = l2_reg
    self.accountant = accountant
    self.seed = seed
    self.normalize = normalize
    self.max_iter = max_iter
    self.tol = tol
    self.classes = classes
    self.amp_fraction = amp_fraction
    self.return_nonprivate_diagnostics = return_nonprivate_diagnostics
    self._num_fits = 0
