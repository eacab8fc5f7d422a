r"""Baselines of paper 001 Section 6: *batch*, *avg* (Pathak et al. 2010) and *indiv*.

Paper 001 = ``../shared/papers/001_learning_privately_from_multiparty_data.md``.

* *batch* (:func:`batch_classifier`): one classifier on all private data,
  ignoring privacy (an upper reference, never private).
* *indiv* (:func:`indiv_accuracy`): mean test accuracy of the local classifiers,
  each trained on its own data only (private as long as they stay local).
* *avg* (:func:`private_parameter_averaging`): the noisy average of the ``M``
  local weight vectors (Pathak, Rane & Raj 2010), with the party-level
  sensitivity of App. B.4. Replacing ALL samples of party 1 changes only
  ``w_1``; for party 1's regularised ERM every one of its ``n`` per-sample
  gradients may change, ``||grad g|| <= (1/n) sum_j 2K = 2K``, so
  ``||w_1 - w_1'|| <= 2K/lambda`` (Chaudhuri et al. 2011 Cor. 8) and the
  average moves by at most

  .. math:: \Delta_{avg} = \frac{2K}{M\lambda}
     \quad (K = 1 \text{ binary: } 2/(M\lambda); \ K = \sqrt2 \text{ softmax: } 2\sqrt2/(M\lambda),\ \text{Eq. B.4}).

  Pathak et al.'s own ``2/(M n lambda)`` protects ONE sample of a party, not
  the party; we use the party-level bound so that all methods share one unit.
  The local minimisers are certified in float64 (``||w_i - w_i*|| <= tol/lambda``,
  :mod:`jaxdp.training.certified_solve`), adding ``2 tol/(M lambda)``. Needs
  every party's features in the unit L2 ball.

**Which K, and why binary weights must be ``(M, D)``.** ``K`` bounds the norm of
one sample's loss gradient in the parameterisation that is averaged.

* ``num_classes = 2``, logistic weights ``w`` of shape ``(D,)`` (labels
  ``{0, 1}``, ``s = 2y - 1``): ``grad l = -s x sigmoid(-s w.x)``, norm ``<= ||x||
  <= 1``, so ``K = 1`` and ``Delta_avg = 2/(M lambda)`` (+ the ``tol`` term).
* softmax weights ``W`` of shape ``(D, C)``: ``grad l = x (P - e_y)^T``,
  Frobenius norm ``||x|| ||P - e_y||_2 <= sqrt(2)``, ``K = sqrt(2)`` for every
  ``C >= 2`` (Eq. B.4). For ``C = 2`` the per-sample constant is still
  ``sqrt(2)``: ``||P - e_y||_2 = sqrt(2) (1 - p_y)``, whose supremum is
  ``sqrt(2)``, so Chaudhuri et al.'s argument gives ``2 sqrt(2)/lambda`` for
  ``W``. The other route gives the same: the regularised minimiser has ``w_0 =
  -w_1``, so ``v = w_1 - w_0`` minimises the logistic risk with ``l2_reg =
  lambda/2`` (``K = 1`` applies to ``v``), and ``||W - W'||_F = ||v - v'||/sqrt(2)
  <= (2/(lambda/2))/sqrt(2) = 2 sqrt(2)/lambda``.

Neither route proves ``2/lambda`` for ``(D, 2)`` softmax weights: calibrating
them with the binary ``K = 1`` would claim the guarantee with ``1/sqrt(2)`` of
the noise its proof needs. So ``num_classes=2`` requires ``(M, D)`` logistic
weights and refuses ``(M, D, 2)`` softmax weights (refit the parties with
``loss="logistic"``); ``num_classes = C > 2`` requires ``(M, D, C)``.
Every shape, the labels (integers in ``[0, C)``) and the finiteness of the
local weights are checked before anything is computed
(:func:`check_local_problem`): a ``(1, D)`` weight array for ``M > 1``
parties, for instance, would otherwise broadcast and release party 0's own
model with noise sized for an ``M``-party average, and a NaN weight would
skip the certificate (``NaN > tol`` is False).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import numpy as np

from jaxdp import _validation
from jaxdp.multiparty import _soft_erm, local, private_global
from jaxdp.training import certified_solve, linear


class IndivAccuracy(NamedTuple):
  """Mean and standard deviation over parties of the local classifiers' test accuracy."""

  mean: float
  std: float
  per_party: np.ndarray


def batch_classifier(x: Any, y: Any, *, num_classes: int, l2_reg: float, max_iter: int = 500,
                     tol: float = 1e-6) -> linear.LinearModel:
  """*batch*: non-private ERM on all the private data (paper 001 Sec. 6), via :func:`~jaxdp.training.linear.fit_linear`."""
  loss = _soft_erm.loss_name(num_classes)
  return linear.fit_linear(x, y, num_classes=num_classes if loss == "softmax" else None,
                           l2_reg=l2_reg, loss=loss, max_iter=max_iter, tol=tol)


def indiv_accuracy(local_weights: Any, x_test: Any, y_test: Any) -> IndivAccuracy:
  """*indiv*: mean (and s.d.) over parties of each local classifier's test accuracy."""
  acc = local.local_accuracies(local_weights, x_test, y_test)
  return IndivAccuracy(float(acc.mean()), float(acc.std()), acc)


def parameter_averaging_sensitivity(l2_reg: float, *, num_parties: int, num_classes: int,
                                    solver_tol: float = 0.0) -> float:
  """``(2K + 2 tol)/(M lambda)``: party-level L2 sensitivity of the averaged local minimisers (App. B.4)."""
  lam = _validation.check_positive(l2_reg, "l2_reg")
  m = _validation.check_positive_int(num_parties, "num_parties")
  tol = _validation.check_nonnegative(solver_tol, "solver_tol")
  k = _soft_erm.lipschitz(private_global._check_classes(num_classes))
  return (2.0 * k + 2.0 * tol) / (m * lam)


def certify_local_classifiers(weights: Any, xs: Any, ys: Any, *, num_classes: int,
                              l2_reg: float, tol: float) -> np.ndarray:
  """float64 local minimisers within ``tol/lambda`` of each party's exact minimiser.

  All ``M`` certificates are computed in one vectorised float64 pass; the few
  parties whose float32 iterate fails are repaired one by one by
  :func:`jaxdp.training.certified_solve.certify_minimizers` (float64 polish /
  accelerated gradient). Returns ``(M, D)`` or ``(M, D, C)`` float64 weights.
  """
  c = private_global._check_classes(num_classes)
  lam = _validation.check_positive(l2_reg, "l2_reg")
  w, xs, ys_int = check_local_problem(weights, xs, ys, num_classes=c, weights_name="weights")
  xs64 = np.asarray(xs, np.float64)
  return _certify(w, xs64, ys_int, c, lam, _check_local_tol(tol, w, xs64, c))


def _check_local_tol(tol, w, xs, c) -> float:
  return certified_solve.check_tol(tol, num_examples=xs.shape[1], dim=int(np.prod(w.shape[1:])),
                                   loss=_soft_erm.loss_name(c))


def _certify(w, xs64, ys_int, c, lam, tol) -> np.ndarray:
  """The certification loop of :func:`certify_local_classifiers` on validated inputs."""
  w = np.array(w, np.float64)
  targets = np.eye(c)[ys_int]
  loss = _soft_erm.loss_name(c)
  g = _soft_erm.certificate(w, xs64, targets, lam, c)
  for i in np.flatnonzero(g > tol):
    cert = certified_solve.certify_minimizers(w[i], xs64[i], ys_int[i], loss=loss, h=0.5,
                                              l2_total=lam, tol=tol)
    w[i] = cert.weights
  return w


def _first_bad(mask: np.ndarray) -> str:
  """``"[i, j]"`` index of the first True entry (the row, never the value)."""
  return "[" + ", ".join(str(int(t)) for t in np.argwhere(mask)[0]) + "]"


def check_local_problem(local_weights: Any, xs: Any, ys: Any, *, num_classes: int,
                        weights_name: str = "local_weights"
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Validates the ``M`` parties' local weights and data for :func:`private_parameter_averaging`.

  Rules (each a ``ValueError`` naming the argument and the offending party or
  row, never a value): ``xs`` finite ``(M, n, D)`` with rows in the unit L2
  ball; ``ys`` of shape ``(M, n)`` holding integer labels in ``[0, C)`` (binary:
  ``{0, 1}``, not ``{-1, +1}``); ``local_weights`` finite, ``(M, D)`` for
  ``num_classes = 2`` (logistic; ``(M, D, 2)`` softmax weights are refused,
  module docstring) and ``(M, D, C)`` for ``C > 2``, with the same ``M`` and
  ``D`` as ``xs``.

  Returns:
    ``(weights, xs, ys)``: the weights (their own dtype), ``xs`` pulled into
    the unit ball (:func:`jaxdp._validation.check_unit_ball`), int64 labels.
  """
  c = private_global._check_classes(num_classes)
  x = _validation.check_numeric_array(xs, "xs")
  if x.ndim != 3 or min(x.shape) < 1:
    raise ValueError(f"xs must be a non-empty (M, n, D) array (parties x samples x features), "
                     f"got shape {x.shape}.")
  m, n, d = x.shape
  x = _validation.check_unit_ball(x.reshape(m * n, d), "xs").reshape(x.shape)
  y = _validation.check_numeric_array(ys, "ys")
  if y.shape != (m, n):
    raise ValueError(f"ys must have shape (M, n) = {(m, n)} to match xs, got {y.shape}.")
  if np.iscomplexobj(y) or y.dtype == np.bool_:
    raise ValueError(f"ys must hold integer labels in [0, {c}), got dtype {y.dtype}.")
  with np.errstate(invalid="ignore"):
    bad = ~np.isfinite(y) | (y != np.round(y)) | (y < 0) | (y >= c)
  if np.any(bad):
    hint = " (binary labels are {0, 1}, not {-1, +1})" if c == 2 else ""
    raise ValueError(f"ys must hold integer labels in [0, {c}){hint}; ys{_first_bad(bad)} "
                     "(party, sample) is not one.")
  w = _validation.check_numeric_array(local_weights, weights_name)
  if np.iscomplexobj(w):
    raise ValueError(f"{weights_name} must be real, got dtype {w.dtype}.")
  expected = (m, d) if c == 2 else (m, d, c)
  if c == 2 and w.shape == (m, d, 2):
    raise ValueError(
        f"{weights_name} has shape {w.shape}: (M, D, 2) softmax weights with num_classes=2. "
        "Their proven per-sample gradient bound is K = sqrt(2), not the logistic K = 1 that "
        "num_classes=2 is calibrated with (jaxdp.multiparty.baselines docstring): fit the "
        "parties with loss='logistic' to get (M, D) weights.")
  if w.shape != expected:
    what = "(M, D) logistic" if c == 2 else "(M, D, C) softmax"
    raise ValueError(f"{weights_name} must be {what} weights of shape {expected} (M = {m} "
                     f"parties and D = {d} features from xs, C = num_classes), got {w.shape}.")
  finite = np.isfinite(w.reshape(m, -1)).all(axis=1)
  if not finite.all():
    raise ValueError(f"{weights_name} must be finite: party {int(np.argmin(finite))}'s weights "
                     "contain NaN or inf.")
  return w, x, y.astype(np.int64)


def private_parameter_averaging(key: jax.Array, local_weights: Any, xs: Any, ys: Any, *,
                                num_classes: int, l2_reg: float, epsilon: float | None = None,
                                delta: float = 0.0, rho: float | None = None, tol: float = 1e-6,
                                accountant: Any = None) -> linear.PrivateLinearModel:
  """*avg*: noisy average of the certified local minimisers (Pathak et al. 2010; paper 001 App. B.4).

  Args:
    key: a key, or a batch of keys (one release per key).
    local_weights: ``(M, D)`` (``num_classes=2``, logistic) / ``(M, D, C)``
      (``C > 2``, softmax) finite local fits (e.g.
      :func:`jaxdp.multiparty.fit_local_classifiers` with the same ``l2_reg``);
      ``M`` and ``D`` must match ``xs`` (:func:`check_local_problem`).
    xs, ys: the parties' data ``(M, n, D)`` (rows in the unit ball), ``(M, n)``
      integer labels in ``[0, C)``; used only to certify the local fits.
    num_classes, l2_reg: as the local fits.
    epsilon, delta, rho: the guarantee (:func:`jaxdp.multiparty.party_calibration`).
    tol: certified local gradient norm.
    accountant: optional accountant or budget (``unit="party"``), charged one
      event per key after validation and before any computation on the data
      (as :func:`jaxdp.multiparty.private_vote_erm`).

  Returns:
    :class:`jaxdp.training.linear.PrivateLinearModel` (noisy weights, event
    ``unit="party"``, public calibration).

  Raises:
    ValueError: a rule of :func:`check_local_problem`, or bad privacy
      parameters, before anything is computed on the data.
  """
  # Everything is validated before any computation on the data (module docstring).
  _validation.check_key(key, allow_batch=True)
  c = private_global._check_classes(num_classes)
  lam = _validation.check_positive(l2_reg, "l2_reg")
  w, xs, ys_int = check_local_problem(local_weights, xs, ys, num_classes=c)
  xs64 = np.asarray(xs, np.float64)
  tol = _check_local_tol(tol, w, xs64, c)
  sens = parameter_averaging_sensitivity(lam, num_parties=w.shape[0], num_classes=c,
                                         solver_tol=tol)
  cal = private_global.party_calibration(sens, epsilon=epsilon, delta=delta, rho=rho)
  private_global._spend_before_release(accountant, cal.event, key)
  avg = _certify(w, xs64, ys_int, c, lam, tol).mean(axis=0)
  return linear.PrivateLinearModel(weights=private_global.release(key, avg, cal),
                                   event=cal.event, calibration=cal)
