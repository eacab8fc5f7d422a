"""Per-example losses of linear models and the constants their privacy proofs need.

Every loss here is a function of the model output only (logits ``a = W^T x`` or
the binary margin ``z = y w^T x``), so for inputs in the unit L2 ball
(``||x||_2 <= 1``) its gradient w.r.t. the parameters has norm at most ``K``
(the Lipschitz constant w.r.t. the output) and its Hessian w.r.t. the
parameters has largest eigenvalue at most ``L`` (the curvature bound w.r.t. the
output).

=====================  =================  ======================  ===============================
loss                   Lipschitz ``K``    curvature bound         reference
=====================  =================  ======================  ===============================
softmax (multiclass)   ``sqrt(2)``        ``L = 1/2``             paper 000 App. D, Thm 9 and 10
binary logistic        ``1``              ``t = 1/4``             paper 003 Sec. 6
Huberized hinge (h)    ``1``              ``t = 1/(2h)``          paper 003 Sec. 3.3 and 6
=====================  =================  ======================  ===============================

Papers: ``../shared/papers/000_tradeoffs_of_private_prediction.md`` (paper 000)
and ``../shared/papers/003_dp_confidence_intervals_for_erm.md`` (paper 003).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from jaxdp import _validation

SOFTMAX_LIPSCHITZ: float = math.sqrt(2.0)
"""K for the multiclass logistic loss: ||y - softmax(a)||_2 <= sqrt(2) (paper 000 Thm 9)."""

SOFTMAX_HESSIAN_BOUND: float = 0.5
"""L for the multiclass logistic loss: lambda_max(diag(p) - p p^T) <= 1/2 (paper 000 Thm 10)."""

LOGISTIC_LIPSCHITZ: float = 1.0
"""|f'(z)| <= 1 for f(z) = log(1 + exp(-z)) (paper 003 Sec. 6)."""

LOGISTIC_CURVATURE: float = 0.25
"""|f''(z)| = S(z) S(-z) <= 1/4 for the binary logistic loss (paper 003 Sec. 6)."""

HUBER_LIPSCHITZ: float = 1.0
"""|f'(z)| <= 1 for the Huberized hinge loss (paper 003 Sec. 6)."""

LOSSES = ("softmax", "logistic", "huber")


def softmax_cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
  r"""Multiclass logistic loss ``-log softmax(a)_y`` per example.

  Paper 000 App. D, Eq. 62 (with the sign that makes it a loss):
  :math:`\ell(a, y) = \log \sum_j e^{a_j} - a_y`.

  Args:
    logits: ``(..., C)`` model outputs ``a = W^T x``.
    labels: ``(...)`` integer labels in ``[0, C)``.

  Returns:
    ``(...)`` per-example losses.
  """
  # One-hot contraction instead of a gather: cheaper to differentiate and vmap.
  onehot = jax.nn.one_hot(labels, logits.shape[-1], dtype=logits.dtype)
  return jax.nn.logsumexp(logits, axis=-1) - jnp.sum(onehot * logits, axis=-1)


def binary_logistic(margin: jax.Array) -> jax.Array:
  r"""Binary logistic loss :math:`f(z) = \log(1 + e^{-z})` of the margin ``z = y w^T x``.

  Paper 003 Sec. 3.3; ``|f'| <= 1`` and ``|f''| <= 1/4`` (Sec. 6).
  """
  return jax.nn.softplus(-margin)


def huberized_hinge(margin: jax.Array, h: float | jax.Array = 0.5) -> jax.Array:
  r"""Huberized hinge loss of the margin ``z = y w^T x`` (Chapelle 2007; paper 003 Sec. 3.3).

  .. math::
     f(z) = 0 \ (z > 1 + h), \quad \frac{(1 + h - z)^2}{4h} \ (|1 - z| \le h),
     \quad 1 - z \ (z < 1 - h).

  Convex, differentiable, ``|f'| <= 1`` and piecewise ``|f''| <= 1/(2h)``.
  """
  quad = (1.0 + h - margin) ** 2 / (4.0 * h)
  return jnp.where(margin > 1.0 + h, 0.0, jnp.where(margin < 1.0 - h, 1.0 - margin, quad))


def lipschitz_constant(loss: str) -> float:
  """``K``: bound on the output-gradient norm of ``loss`` (see the module table)."""
  check_loss(loss)
  return {"softmax": SOFTMAX_LIPSCHITZ, "logistic": LOGISTIC_LIPSCHITZ,
          "huber": HUBER_LIPSCHITZ}[loss]


def curvature_bound(loss: str, h: float = 0.5) -> float:
  """Bound on the output-Hessian eigenvalues: ``L = 1/2`` softmax, ``t = 1/4`` logistic, ``1/(2h)`` Huber."""
  check_loss(loss)
  if loss == "softmax":
    return SOFTMAX_HESSIAN_BOUND
  if loss == "logistic":
    return LOGISTIC_CURVATURE
  h = _validation.check_positive(h, "h")
  return 1.0 / (2.0 * h)


def check_loss(loss: str) -> str:
  """Raises ValueError unless ``loss`` is one of :data:`LOSSES`."""
  if loss not in LOSSES:
    raise ValueError(f"loss must be one of {LOSSES}, got {loss!r}.")
  return loss
