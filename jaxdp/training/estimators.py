"""Thin scikit-learn-like estimators over the private linear-model functions.

``PrivateLogisticRegression(epsilon=1.0, classes=range(10)).fit(x, y)``
trains with one of the pure functions of :mod:`jaxdp.training.output_perturbation`
/ :mod:`jaxdp.training.objective_perturbation`, then records the method's
DpEvent in the given accountant (a :class:`jaxdp.accounting.PrivacyAccountant`
or a budget-enforcing :class:`jaxdp.accounting.PrivacyBudget`). With a budget,
``can_spend`` is checked *before* touching the data, and the weights are only
stored after ``spend`` succeeded, so a refused spend releases nothing.

Noise keys (:mod:`jaxdp._keys`). With ``seed=None`` (the default) every ``fit``
draws its key from fresh OS entropy (scikit-learn's ``random_state=None``
semantics): two instances, or a refit on updated data, never add the same
noise, so the difference of two releases cannot cancel the noise and expose the
change in the data. An explicit ``seed`` gives fit ``i`` of an instance the key
``fold_in(key(seed), i)`` (reproducible experiments); it is the user's promise
not to reuse that seed for another release on overlapping data (two instances
with the same seed add identical noise).

Non-private diagnostics. The fitted estimator keeps only private values
(``coef_``), public ones (``classes_``) and the event (``event_``). The
solver's diagnostics (iterations, gradient norm, objective value, certificate)
are computed from the data without noise; they are kept, as
``nonprivate_info_``, only when the estimator is built with
``return_nonprivate_diagnostics=True`` (see
:class:`jaxdp.training.linear.NonPrivateDiagnostics`).

Neighbouring relation. Every method here is run under REPLACE-ONE neighbours
(model sensitivity, paper 000 Lemma 1; paper 003 Alg. 1 and 4), including loss
perturbation (``neighbouring="replace_one"``, noise doubled): so the events
spent in one accountant compose under one relation, and ``l2_reg > 0`` is
valid for loss perturbation (under add/remove the mean-normalised L2 term is
data-dependent; see :mod:`jaxdp.training.objective_perturbation`).
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import jax.numpy as jnp
import numpy as np

from jaxdp import _keys, _validation
from jaxdp.accounting import events
from jaxdp.training import linear, objective_perturbation, output_perturbation

METHODS = ("loss_perturbation", "model_sensitivity", "objective_perturbation",
           "output_perturbation", "non_private")


class PrivateLinearClassifier:
  """Private linear classifier with ``fit`` / ``predict`` / ``predict_proba`` / ``score``.

  Args:
    epsilon: privacy parameter (``inf`` only with ``method="non_private"`` or to
      reproduce the non-private model through a private method).
    delta: 0 for pure DP, > 0 for the Gaussian variants (loss perturbation,
      model sensitivity).
    method: one of :data:`METHODS`. ``loss_perturbation`` (paper 000 Alg. 4/5)
      and ``model_sensitivity`` (Alg. 1/3) use the softmax loss for any number
      of classes; ``objective_perturbation`` (paper 003 Alg. 1) and
      ``output_perturbation`` (Alg. 4) are binary, with ``loss`` ``"logistic"``
      or ``"huber"``.
    l2_reg: ``lambda`` of ``(lambda/2)||theta||^2`` (> 0 where the sensitivity divides by it).
    loss: binary loss for the binary methods.
    h: Huberized hinge width.
    accountant: where each fit's DpEvent is spent (None: not recorded; the
      event is still available as ``self.event_``).
    seed: ``None`` (default): fresh OS entropy for every fit. An integer or a
      ``jax.random`` key: fit ``i`` uses ``fold_in(key(seed), i)``; an explicit
      seed is the caller's promise not to reuse it for another release on
      overlapping data (two instances with one seed add the same noise, and
      the difference of their releases exposes the change in the data).
      Floats, bools and strings raise ``ValueError``.
    normalize: project rows outside the unit ball onto it (otherwise they raise).
    max_iter, tol: solver settings. ``tol=None``: 1e-6 for output perturbation /
      model sensitivity, and for the perturbed-objective methods the AMP default
      (:func:`jaxdp.training.objective_perturbation.amp_default_tol`).
    amp_fraction: share of epsilon (and delta) spent on the Approximate Minima
      Perturbation output noise of the perturbed-objective methods.
    classes: the PUBLIC label set (e.g. ``range(10)``), fixed before seeing the
      data. The number of classes sets the weight shape and loss
      perturbation's ``rho``, and ``classes_`` is released with the model, so a
      label set read off the training data is not protected: replacing one
      example can remove a class (changing the output's shape) or reveal a
      rare label. ``None`` infers it with ``np.unique(y)`` and warns.
    return_nonprivate_diagnostics: keep the solver diagnostics of each fit as
      ``nonprivate_info_`` (NOT private: computed from the data without noise;
      for debugging on public or synthetic data). Default False: not kept.
  """

  def __init__(self, *, epsilon: float, delta: float = 0.0, method: str = "loss_perturbation",
               l2_reg: float = 1e-3, loss: str = "logistic", h: float = 0.5,
               accountant: Any = None, seed: Any = None, normalize: bool = False,
               max_iter: int = 500, tol: float | None = None, classes: Any = None,
               amp_fraction: float = 0.01, return_nonprivate_diagnostics: bool = False):
    if method not in METHODS:
      raise ValueError(f"method must be one of {METHODS}, got {method!r}.")
    self.epsilon = _validation.check_epsilon(epsilon, "epsilon", allow_inf=True)
    self.delta = _validation.check_delta(delta, "delta")
    self.method = method
    self.l2_reg = l2_reg
    self.loss = loss
    self.h = h
    self.accountant = accountant
    self.seed = _keys.check_seed(seed, "seed")
    self.normalize = normalize
    self.max_iter = max_iter
    self.tol = tol
    self.amp_fraction = amp_fraction
    if classes is not None:
      classes = np.asarray(classes)
      if classes.ndim != 1 or classes.size < 2 or np.unique(classes).size != classes.size:
        raise ValueError("classes must be a 1-D sequence of at least two distinct labels.")
    self.classes = classes
    self.return_nonprivate_diagnostics = bool(return_nonprivate_diagnostics)
    self._num_fits = 0

  def _predicted_event(self, n: int, num_classes: int, dim: int):
    """The event a fit will spend (computed from the calibration only, no data access)."""
    if self.method == "non_private":
      return events.NonPrivateDpEvent()
    if math.isinf(self.epsilon):
      return events.NonPrivateDpEvent()
    if self.method == "loss_perturbation":
      return objective_perturbation.loss_perturbation_amp_calibration(
          epsilon=self.epsilon, delta=self.delta, num_examples=n, num_classes=num_classes,
          dim=dim, neighbouring="replace_one", l2_reg=self.l2_reg,
          amp_fraction=self.amp_fraction, tol=self.tol).event
    if self.method == "objective_perturbation":
      return objective_perturbation.objective_perturbation_amp_calibration(
          epsilon=self.epsilon, num_examples=n, dim=dim, l2_reg=self.l2_reg, loss=self.loss,
          h=self.h, amp_fraction=self.amp_fraction, tol=self.tol).event
    return output_perturbation.output_perturbation_calibration(
        num_examples=n, l2_reg=self.l2_reg, epsilon=self.epsilon, delta=self.delta).event

  def fit(self, x: Any, y: Any) -> "PrivateLinearClassifier":
    """Trains privately and spends the method's DpEvent in ``accountant``."""
    x_np = np.asarray(x)
    y_np = np.asarray(y)
    if y_np.ndim != 1 or y_np.shape[0] != x_np.shape[0]:
      raise ValueError(f"y must have shape ({x_np.shape[0]},), got {y_np.shape}.")
    if self.classes is None:
      warnings.warn(
          "classes was not given: the label set is inferred from the training labels and is "
          "NOT differentially private (it fixes the output shape and is released as classes_). "
          "Pass classes=<public label set>.", UserWarning, stacklevel=2)
      classes, y_idx = np.unique(y_np, return_inverse=True)
    else:
      classes = np.sort(self.classes)
      y_idx = np.searchsorted(classes, y_np)
      y_idx = np.clip(y_idx, 0, classes.size - 1)
      outside = classes[y_idx] != y_np
      if np.any(outside):
        raise ValueError(f"y contains labels outside classes (the public label set); row "
                         f"{_validation.first_index(outside)} is one.")
    if classes.size < 2:
      raise ValueError("y must contain at least two classes.")
    binary_method = self.method in ("objective_perturbation", "output_perturbation")
    if binary_method and classes.size != 2:
      raise ValueError(f"method={self.method!r} is binary; y has {classes.size} classes.")
    n = x_np.shape[0]
    event = self._predicted_event(n, classes.size, x_np.shape[1])
    if self.accountant is not None and hasattr(self.accountant, "can_spend"):
      if not self.accountant.can_spend(event):
        from jaxdp.errors import BudgetExceededError  # pylint: disable=import-outside-toplevel
        raise BudgetExceededError(f"fitting would exceed the privacy budget ({event}).")
    key = _keys.fit_key(self.seed, self._num_fits)
    self._num_fits += 1
    tol = 1e-6 if self.tol is None else self.tol
    diag = dict(return_nonprivate_diagnostics=self.return_nonprivate_diagnostics)
    common = dict(max_iter=self.max_iter, tol=tol, normalize=self.normalize, **diag)
    amp = dict(max_iter=self.max_iter, tol=self.tol, normalize=self.normalize,
               amp_fraction=self.amp_fraction, **diag)
    if self.method == "non_private":
      x_c = linear.check_features(x_np, "x", normalize=self.normalize)
      res = linear.fit_linear(x_c, y_idx, num_classes=classes.size, l2_reg=self.l2_reg,
                              max_iter=self.max_iter, tol=tol)
      weights, ev = res.weights, events.NonPrivateDpEvent()
      res = linear.PrivateLinearModel(weights, ev, None, nonprivate_info=(
          linear.NonPrivateDiagnostics(res.info, None) if self.return_nonprivate_diagnostics
          else None))
    elif self.method == "loss_perturbation":
      res = objective_perturbation.loss_perturbation(
          key, x_np, y_idx, num_classes=classes.size, epsilon=self.epsilon, delta=self.delta,
          l2_reg=self.l2_reg, neighbouring="replace_one", **amp)
      weights, ev = res.weights, res.event
    elif self.method == "model_sensitivity":
      res = output_perturbation.model_sensitivity(
          key, x_np, y_idx, num_classes=classes.size, l2_reg=self.l2_reg, epsilon=self.epsilon,
          delta=self.delta, **common)
      weights, ev = res.weights, res.event
    elif self.method == "objective_perturbation":
      res = objective_perturbation.objective_perturbation(
          key, x_np, y_idx, epsilon=self.epsilon, l2_reg=self.l2_reg, loss=self.loss, h=self.h,
          **amp)
      weights, ev = res.weights, res.event
    else:
      res = output_perturbation.output_perturbation(
          key, x_np, y_idx, l2_reg=self.l2_reg, loss=self.loss, h=self.h, epsilon=self.epsilon,
          delta=self.delta, **common)
      weights, ev = res.weights, res.event
    if self.accountant is not None:
      self.accountant.spend(ev)  # may raise BudgetExceededError: then nothing is stored
    self.classes_ = classes
    self.coef_ = np.asarray(weights)
    self.event_ = ev
    if self.return_nonprivate_diagnostics:
      self.nonprivate_info_ = res.nonprivate_info
    return self

  def _check_fitted(self):
    if not hasattr(self, "coef_"):
      raise ValueError("this estimator is not fitted yet; call fit(x, y) first.")

  def decision_function(self, x: Any) -> np.ndarray:
    """Scores ``x @ W``: ``(N, C)`` or ``(N,)`` for binary weights."""
    self._check_fitted()
    x = np.asarray(x, np.float32)
    if self.normalize:
      x = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1.0)
    return np.asarray(linear.linear_logits(jnp.asarray(self.coef_), jnp.asarray(x)))

  def predict_proba(self, x: Any) -> np.ndarray:
    """Softmax (multiclass) or ``[1 - s, s]`` with ``s = sigmoid(score)`` (binary)."""
    scores = self.decision_function(x)
    if scores.ndim == 1:
      p = 1.0 / (1.0 + np.exp(-scores))
      return np.stack([1.0 - p, p], axis=1)
    scores = scores - scores.max(axis=1, keepdims=True)
    e = np.exp(scores)
    return e / e.sum(axis=1, keepdims=True)

  def predict(self, x: Any) -> np.ndarray:
    """Most probable class label (in the original label values)."""
    self._check_fitted()
    return self.classes_[np.argmax(self.predict_proba(x), axis=1)]

  def score(self, x: Any, y: Any) -> float:
    """Mean accuracy on ``(x, y)``."""
    return float(np.mean(self.predict(x) == np.asarray(y)))


class PrivateLogisticRegression(PrivateLinearClassifier):
  """Private (multinomial) logistic regression; default method: loss perturbation (paper 000 Alg. 4/5)."""

  def __init__(self, *, epsilon: float, delta: float = 0.0, method: str = "loss_perturbation",
               l2_reg: float = 1e-3, accountant: Any = None, seed: Any = None,
               normalize: bool = False, max_iter: int = 500, tol: float | None = None,
               classes: Any = None, amp_fraction: float = 0.01,
               return_nonprivate_diagnostics: bool = False):
    super().__init__(epsilon=epsilon, delta=delta, method=method, l2_reg=l2_reg, loss="logistic",
                     accountant=accountant, seed=seed, normalize=normalize, max_iter=max_iter,
                     tol=tol, classes=classes, amp_fraction=amp_fraction,
                     return_nonprivate_diagnostics=return_nonprivate_diagnostics)
