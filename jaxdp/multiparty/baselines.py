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
  w = np.array(weights, np.float64)
  xs64 = np.asarray(xs, np.float64)
  ys_int = np.asarray(ys).astype(np.int64)
  targets = np.eye(c)[ys_int]
  loss = _soft_erm.loss_name(c)
  tol = certified_solve.check_tol(tol, num_examples=xs64.shape[1], dim=int(np.prod(w.shape[1:])),
                                  loss=loss)
  g = _soft_erm.certificate(w, xs64, targets, lam, c)
  for i in np.flatnonzero(g > tol):
    cert = certified_solve.certify_minimizers(w[i], xs64[i], ys_int[i], loss=loss, h=0.5,
                                              l2_total=lam, tol=tol)
    w[i] = cert.weights
  return w


def private_parameter_averaging(key: jax.Array, local_weights: Any, xs: Any, ys: Any, *,
                                num_classes: int, l2_reg: float, epsilon: float | None = None,
                                delta: float = 0.0, rho: float | None = None, tol: float = 1e-6
                                ) -> linear.PrivateLinearModel:
  """*avg*: noisy average of the certified local minimisers (Pathak et al. 2010; paper 001 App. B.4).

  Args:
    key: a key, or a batch of keys (one release per key).
    local_weights: ``(M, D)`` / ``(M, D, C)`` float32 local fits (e.g.
      :func:`jaxdp.multiparty.fit_local_classifiers` with the same ``l2_reg``).
    xs, ys: the parties' data ``(M, n, D)`` (rows in the unit ball), ``(M, n)``;
      used only to certify the local fits.
    num_classes, l2_reg: as the local fits.
    epsilon, delta, rho: the guarantee (:func:`jaxdp.multiparty.party_calibration`).
    tol: certified local gradient norm.

  Returns:
    :class:`jaxdp.training.linear.PrivateLinearModel` (event ``unit="party"``; ``info`` None).
  """
  _validation.check_key(key, allow_batch=True)
  xs = _validation.check_finite_array(xs, "xs")
  if xs.ndim != 3:
    raise ValueError(f"xs must have shape (M, n, D), got {xs.shape}.")
  m = xs.shape[0]
  xs = _validation.check_unit_ball(xs.reshape(-1, xs.shape[-1]), "xs").reshape(xs.shape)
  sens = parameter_averaging_sensitivity(l2_reg, num_parties=m, num_classes=num_classes,
                                         solver_tol=tol)
  cal = private_global.party_calibration(sens, epsilon=epsilon, delta=delta, rho=rho)
  w = certify_local_classifiers(local_weights, xs, ys, num_classes=num_classes, l2_reg=l2_reg,
                                tol=tol)
  avg = w.mean(axis=0)
  return linear.PrivateLinearModel(private_global.release(key, avg, cal), None, cal.event, cal,
                                   None)
