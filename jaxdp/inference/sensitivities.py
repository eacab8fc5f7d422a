r"""Hessian and gradient covariance of the regularised ERM objective and their L2 sensitivities.

Paper 003 = ``../shared/papers/003_dp_confidence_intervals_for_erm.md``.

For the binary linear objective (paper 003 Eq. 3.1, with our ``l2_reg = lambda = 2c``)

.. math::
   J_n(\theta) = \frac1n \sum_i w_i f(y_i \theta^\top x_i) + \frac{\Lambda}{2}\|\theta\|^2
     \ [+\ \tfrac1n \beta^\top\theta],

(``w_i`` = multiplicity of row ``i``, 1 by default, so a bootstrap replicate is the
same ``x`` with multinomial counts; ``n = sum_i w_i``), the two matrices the
confidence intervals need are (paper 003 Eqs. 4.2 and 4.3; Alg. 3 lines 3 and 5)

.. math::
   H(\theta) = \frac1n \sum_i w_i f''(z_i) x_i x_i^\top + \Lambda I ,\qquad
   \Sigma(\theta) = \frac1n \sum_i w_i f'(z_i)^2 x_i x_i^\top - \Lambda^2 \theta\theta^\top ,

with ``z_i = y_i theta^T x_i`` (``grad f = y f'(z) x``, so ``grad f grad f^T = f'(z)^2 x x^T``;
the paper's ``4c^2 = Lambda^2``). Both are evaluated at the RELEASED (private) parameters,
so their sensitivities may depend on them.

L2 (Frobenius) sensitivities under replace-one neighbours, ``||x|| <= 1``, ``y in {-1, 1}``
(only the ``1/n`` data sums change; the ``Lambda`` terms are data-independent):

==================  ===============================  ==================================
loss                Hessian ``H``                    covariance ``Sigma``
==================  ===============================  ==================================
logistic            ``1/(2n)`` (Lemma 3, App. A.6)    ``2 S(||theta||)^2 / n`` (Lemma 2, App. A.5)
Huberized hinge     ``1/(n h)`` (Lemma 5, App. A.8)   ``2/n`` (Lemma 4, App. A.7)
==================  ===============================  ==================================

(``S`` the sigmoid.) Each is ``(2/n) max_{x, y} ||vec(a a^T)||`` for the per-example
rank-one term ``a a^T`` (triangle inequality), and ``||vec(x x^T)|| = ||x||^2 <= 1``.

With row multiplicities ``w_i`` these bounds are for ONE replaced record of the weighted
multiset (``n = sum w_i`` records). Replacing a row of ``x`` that has multiplicity ``k``
replaces ``k`` records and moves each matrix by up to ``k`` times the bound (the same
triangle inequality, ``w_i = k`` in front of the rank-one term); the pipeline
(:mod:`jaxdp.inference.intervals`) does not widen the sensitivities but accounts a row of
multiplicity ``k`` by group privacy (``k phi`` pure, ``k^2 rho`` zCDP), which is the same
guarantee for these additive mechanisms.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxdp import _validation
from jaxdp.training import linear_losses

LOSSES = ("logistic", "huber")


def check_loss(loss: str) -> str:
  """Raises ValueError unless ``loss`` is ``"logistic"`` or ``"huber"`` (Huberized SVM)."""
  if loss not in LOSSES:
    raise ValueError(f"loss must be one of {LOSSES} (binary logistic regression or Huberized "
                     f"SVM, paper 003 Sec. 6), got {loss!r}.")
  return loss


def as_signed_labels(y: Any, name: str = "y") -> np.ndarray:
  """Labels in ``{-1, +1}`` (float64) from labels in ``{-1, +1}`` or ``{0, 1}``.

  Raises:
    ValueError: other values (paper 003 Sec. 3 assumes ``y in {-1, 1}``; ``{0, 1}`` is
      mapped ``0 -> -1``), or not one-dimensional.
  """
  arr = np.asarray(y)
  if arr.ndim != 1:
    raise ValueError(f"{name} must be one-dimensional, got shape {arr.shape}.")
  if arr.dtype == bool:
    raise ValueError(f"{name} must hold labels in {{-1, +1}} or {{0, 1}}, got booleans.")
  pos = arr == 1
  if np.all(pos | (arr == -1)):  # elementwise checks: np.unique sorts (10x slower)
    return arr.astype(np.float64)
  if np.all(pos | (arr == 0)):
    return np.where(pos, 1.0, -1.0)
  # Name the rule and the first offending row, never a label value (it is private data).
  in_pm1 = np.isin(arr, (-1, 1)) if np.issubdtype(arr.dtype, np.number) else np.zeros(
      arr.shape, bool)
  in_01 = np.isin(arr, (0, 1)) if np.issubdtype(arr.dtype, np.number) else in_pm1
  # Report against the label set the data mostly uses (the row that breaks it).
  bad = ~in_01 if in_01.sum() >= in_pm1.sum() else ~in_pm1
  row = int(np.flatnonzero(bad)[0])
  raise ValueError(f"{name} must hold labels in {{-1, +1}} or {{0, 1}} (paper 003 Sec. 3); "
                   f"{name}[{row}] is outside the label set (both sets cannot be mixed).")


def loss_derivatives(margin: jax.Array, loss: str, h: Any = 0.5) -> tuple[jax.Array, jax.Array]:
  r"""``(f'(z), f''(z))`` of the margin loss (paper 003 Sec. 6).

  Logistic: ``f' = -S(-z)``, ``f'' = S(z) S(-z)``. Huberized hinge: ``f' = 0, -(1+h-z)/(2h), -1``
  and ``f'' = 0, 1/(2h), 0`` for ``z > 1+h``, ``|1-z| <= h``, ``z < 1-h``.
  """
  check_loss(loss)
  if loss == "logistic":
    s_neg = jax.nn.sigmoid(-margin)
    return -s_neg, s_neg * (1.0 - s_neg)
  quad = jnp.abs(1.0 - margin) <= h
  d1 = jnp.where(margin > 1.0 + h, 0.0, jnp.where(margin < 1.0 - h, -1.0,
                                                  -(1.0 + h - margin) / (2.0 * h)))
  d2 = jnp.where(quad, 1.0 / (2.0 * h), 0.0)
  return d1, d2


def loss_value(margin: jax.Array, loss: str, h: Any = 0.5) -> jax.Array:
  """``f(z)``: :func:`jaxdp.training.linear_losses.binary_logistic` or ``huberized_hinge``."""
  check_loss(loss)
  if loss == "logistic":
    return linear_losses.binary_logistic(margin)
  return linear_losses.huberized_hinge(margin, h)


def _weights(x, counts):
  if counts is None:
    return jnp.ones((x.shape[0],), x.dtype)
  return jnp.asarray(counts, x.dtype)


def hessian(theta: jax.Array, x: jax.Array, y: jax.Array, *, loss: str, l2_reg: Any,
            h: Any = 0.5, counts: jax.Array | None = None) -> jax.Array:
  r"""``H = (1/n) sum_i w_i f''(z_i) x_i x_i^T + Lambda I`` (paper 003 Eq. 4.2, ``Lambda = 2c``).

  Args:
    theta: ``(d,)`` parameters at which to evaluate (the released ones).
    x: ``(N, d)`` features; y: ``(N,)`` labels in ``{-1, +1}``.
    loss: ``"logistic"`` or ``"huber"``; h: the Huber width.
    l2_reg: ``Lambda`` (the objective's ``(Lambda/2)||theta||^2``).
    counts: optional ``(N,)`` row multiplicities ``w_i`` (``n = sum w_i``).
  """
  w = _weights(x, counts)
  _, d2 = loss_derivatives(y * (x @ theta), loss, h)
  n = jnp.sum(w)
  xs = x * (w * d2)[:, None]
  return x.T @ xs / n + l2_reg * jnp.eye(x.shape[1], dtype=x.dtype)


def gradient_covariance(theta: jax.Array, x: jax.Array, y: jax.Array, *, loss: str,
                        l2_reg: Any, h: Any = 0.5, counts: jax.Array | None = None) -> jax.Array:
  r"""``Sigma = (1/n) sum_i w_i f'(z_i)^2 x_i x_i^T - Lambda^2 theta theta^T`` (paper 003 Eq. 4.3).

  The estimate of the covariance of one example's gradient of ``f + (Lambda/2)||theta||^2``
  (the last line of Eq. 4.3; ``4c^2 = Lambda^2``). Arguments as in :func:`hessian`.
  """
  w = _weights(x, counts)
  d1, _ = loss_derivatives(y * (x @ theta), loss, h)
  n = jnp.sum(w)
  xs = x * (w * d1 * d1)[:, None]
  return x.T @ xs / n - (l2_reg ** 2) * jnp.outer(theta, theta)


def hessian_and_covariance(theta: jax.Array, x: jax.Array, y: jax.Array, *, loss: str,
                           l2_reg: Any, h: Any = 0.5, counts: jax.Array | None = None,
                           xt: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
  """``(hessian(...), gradient_covariance(...))`` from one margin pass and one product.

  The same two matrices as :func:`hessian` and :func:`gradient_covariance` (same arguments),
  computed as ``X^T [X diag(w f''), X diag(w f'^2)] / n``: one ``(d, N) x (N, 2d)`` product
  instead of two. ``xt``: ``X^T`` already in memory (XLA:CPU contracts ``X``'s leading axis
  about 4x slower than a materialised ``X^T``); default ``x.T``.
  """
  w = _weights(x, counts)
  d1, d2 = loss_derivatives(y * (x @ theta), loss, h)
  n = jnp.sum(w)
  d = x.shape[1]
  both = (xt if xt is not None else x.T) @ jnp.concatenate(
      [x * (w * d2)[:, None], x * (w * d1 * d1)[:, None]], axis=1) / n
  hess = both[:, :d] + l2_reg * jnp.eye(d, dtype=x.dtype)
  cov = both[:, d:] - (l2_reg ** 2) * jnp.outer(theta, theta)
  return hess, cov


def logistic_hessian_sensitivity(num_examples: Any) -> Any:
  """``1/(2n)``: L2 sensitivity of the logistic-regression Hessian (paper 003 Lemma 3)."""
  return 1.0 / (2.0 * num_examples)


def logistic_covariance_sensitivity(num_examples: Any, theta_norm: Any) -> Any:
  """``2 S(||theta||)^2 / n``: L2 sensitivity of the logistic covariance (paper 003 Lemma 2).

  ``theta_norm`` is the norm of the (released) parameters at which ``Sigma`` is evaluated;
  it may be traced. ``|S(-y theta^T x)| <= S(||theta||)`` for ``||x|| <= 1`` (App. A.5).
  """
  return 2.0 * jax.nn.sigmoid(theta_norm) ** 2 / num_examples


def huber_hessian_sensitivity(num_examples: Any, h: Any) -> Any:
  """``1/(n h)``: L2 sensitivity of the Huberized-SVM Hessian (paper 003 Lemma 5)."""
  return 1.0 / (num_examples * h)


def huber_covariance_sensitivity(num_examples: Any) -> Any:
  """``2/n``: L2 sensitivity of the Huberized-SVM covariance (paper 003 Lemma 4)."""
  return 2.0 / num_examples


def hessian_sensitivity(loss: str, num_examples: Any, h: Any = 0.5) -> Any:
  """Lemma 3 (logistic) or Lemma 5 (Huber) of paper 003."""
  check_loss(loss)
  if loss == "logistic":
    return logistic_hessian_sensitivity(num_examples)
  return huber_hessian_sensitivity(num_examples, h)


def covariance_sensitivity(loss: str, num_examples: Any, theta_norm: Any, h: Any = 0.5) -> Any:
  """Lemma 2 (logistic, depends on ``||theta||``) or Lemma 4 (Huber) of paper 003."""
  del h  # Lemma 4 does not depend on h (|f'| <= 1).
  check_loss(loss)
  if loss == "logistic":
    return logistic_covariance_sensitivity(num_examples, theta_norm)
  return huber_covariance_sensitivity(num_examples) + 0.0 * theta_norm


def check_huber_width(h: Any) -> float:
  """``h > 0`` (the Huber width; Lemma 5 divides by it)."""
  return _validation.check_positive(h, "h")
