r"""Private linear regression with declared bounds (paper 004, Sec. 3.1, Eqs. 18-20).

Paper 004 = ``../shared/papers/004_dp_machine_learning_survey.md``. Reuses the
functional mechanism of :mod:`jaxdp.training.functional_mechanism` (Zhang et
al. 2012; ``epsilon``-DP under REPLACE-ONE neighbours, ``Delta = 2(2 sqrt(D) + D)``
for rows with ``||z||_2 <= 1`` and ``|t| <= 1``). This module adds what
scikit-learn users expect: declared bounds and an intercept.

Reparametrisation (a fixed, data-independent per-record map, so the
sensitivity is kept). With declared feature bounds ``[l_j, u_j]`` and target
bounds ``[y_lo, y_hi]``:
``z = [2 (x - l)/(u - l) - 1, 1] / sqrt(d + 1)`` (the constant column carries
the intercept; ``||z||_2 <= 1``) and ``t = 2 (y - y_lo)/(y_hi - y_lo) - 1``.
The model ``t ~ theta^T z`` is an affine reparametrisation of
``y ~ w^T x + b``, so with ``epsilon = inf`` (and ``l2_reg = 0``) the
predictions equal ordinary least squares (scikit-learn's ``LinearRegression``).
No data-dependent centring is done (diffprivlib centres with private means,
spending budget on them).

Output and objective perturbation (paper 003 Alg. 1/4; :mod:`jaxdp.training`)
are not offered for regression: their theorems need a loss with a bounded
gradient (Lipschitz) in ``theta``, which the squared loss is not on an
unbounded parameter space.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import numpy as np
from sklearn.base import BaseEstimator, RegressorMixin

from jaxdp import _estimator_checks as checks
from jaxdp import _keys
from jaxdp import _validation
from jaxdp.accounting import events
from jaxdp.classic import _common
from jaxdp.training import functional_mechanism as fm


def _features(x, lo, hi):
  d = x.shape[1]
  z = 2.0 * (x - lo) / (hi - lo) - 1.0
  return np.concatenate([z, np.ones((x.shape[0], 1))], axis=1) / math.sqrt(d + 1)


def private_linear_regression(key: jax.Array, x: Any, y: Any, *, epsilon: float, lower: Any,
                              upper: Any, y_lower: float, y_upper: float, l2_reg: float = 0.0,
                              clip: bool = False, accountant: Any = None
                              ) -> tuple[np.ndarray, float, events.DpEvent]:
  """``epsilon``-DP (replace-one) linear regression with intercept by the functional mechanism.

  Args:
    key: a ``jax.random`` key, used once.
    x: ``(n, d)`` features inside ``[lower, upper]``; y: ``(n,)`` inside ``[y_lower, y_upper]``.
    epsilon: privacy parameter (``inf``: ordinary least squares / ridge).
    lower, upper, y_lower, y_upper: declared bounds (required).
    l2_reg: ``lambda`` of ``(lambda/2)||theta||^2`` in the mean-normalised objective.
    clip: clip out-of-bound values instead of raising.
    accountant: optional accountant/budget, spent before release.

  Returns:
    ``(coef (d,), intercept, event)`` in the original units.
  """
  _validation.check_key(key)
  arr, lo, hi = _common.check_bounded_data(x, lower, upper, clip=clip)
  ylo, yhi = _common.check_bounds(y_lower, y_upper, 1, "y bounds")
  yy = _validation.check_finite_array(y, "y").astype(np.float64)
  if yy.shape != (arr.shape[0],):
    raise ValueError(f"y must have shape ({arr.shape[0]},), got {yy.shape}.")
  yy = _common.check_data_in_bounds(yy[:, None], ylo, yhi, clip=clip, name="y")[:, 0]
  d = arr.shape[1]
  z = _features(arr, lo, hi)
  t = 2.0 * (yy - ylo[0]) / (yhi[0] - ylo[0]) - 1.0
  event = fm.functional_mechanism_calibration("linear", d + 1, epsilon).event
  _common.spend(accountant, event)
  res = fm.functional_mechanism(key, z.astype(np.float32), t.astype(np.float32), epsilon=epsilon,
                                task="linear", l2_reg=l2_reg)
  theta = np.asarray(res.weights, np.float64) / math.sqrt(d + 1)
  # t = sum_j theta_j (2 (x_j - l_j)/(u_j - l_j) - 1) + theta_d; y = ylo + (t + 1)(yhi - ylo)/2.
  w_t = theta[:d] * 2.0 / (hi - lo)
  b_t = theta[d] - np.sum(theta[:d]) - np.sum(w_t * lo)
  half = (yhi[0] - ylo[0]) / 2.0
  return w_t * half, float(ylo[0] + (b_t + 1.0) * half), res.event


class PrivateLinearRegression(checks.SharedAccountantMixin, RegressorMixin, BaseEstimator):
  """Private linear regression (functional mechanism, replace-one), a scikit-learn regressor.

  scikit-learn conventions, a shared ``accountant`` and the noise-key rule
  (``seed=None``: fresh OS entropy per fit):
  :class:`jaxdp._estimator_checks.SharedAccountantMixin`.
  """

  def __init__(self, *, epsilon: float, lower: Any = None, upper: Any = None, y_lower: Any = None,
               y_upper: Any = None, l2_reg: float = 0.0, clip: bool = False,
               accountant: Any = None, seed: Any = None):
    self.epsilon = epsilon
    self.lower, self.upper, self.y_lower, self.y_upper = lower, upper, y_lower, y_upper
    self.l2_reg, self.clip, self.accountant, self.seed = l2_reg, clip, accountant, seed
    self._fits = 0

  def fit(self, x: Any, y: Any) -> "PrivateLinearRegression":
    epsilon = _validation.check_epsilon(self.epsilon, "epsilon", allow_inf=True)
    _common.check_accountant(self.accountant)
    _keys.check_seed(self.seed, "seed")
    key = _keys.fit_key(self.seed, self._fits)
    self._fits += 1
    self.coef_, self.intercept_, self.event_ = private_linear_regression(
        key, x, y, epsilon=epsilon, lower=self.lower, upper=self.upper,
        y_lower=self.y_lower, y_upper=self.y_upper, l2_reg=self.l2_reg, clip=self.clip,
        accountant=self.accountant)
    self.n_features_in_ = int(np.shape(self.coef_)[0])
    return self

  def predict(self, x: Any) -> np.ndarray:
    checks.check_is_fitted(self, "coef_")  # NotFittedError (a ValueError)
    x = _common.check_query_x(x, self.n_features_in_, self).astype(np.float64)
    return x @ self.coef_ + self.intercept_

  def score(self, x: Any, y: Any) -> float:
    """Coefficient of determination R^2 (as scikit-learn)."""
    y = np.asarray(y, np.float64)
    resid = y - self.predict(x)
    return float(1.0 - np.sum(resid ** 2) / np.sum((y - y.mean()) ** 2))
