r"""Weighted (soft-label) regularised ERM and its float64 certificate (paper 001 Eq. 19 / 55).

Paper 001 = ``../shared/papers/001_learning_privately_from_multiparty_data.md``.
Targets are an ``(N, C)`` row-stochastic matrix ``T`` (soft labels ``alpha``,
or one-hot majority votes, or one-hot true labels):

* binary (``C = 2``, weights ``w`` of shape ``(D,)``, logistic loss
  ``l(t) = log(1 + e^{-t})``), Eq. 14/19:

  .. math:: J(w) = \frac1N \sum_n [\alpha_n l(w^\top x_n) + (1 - \alpha_n) l(-w^\top x_n)]
            + \frac\lambda2 \|w\|^2, \qquad \alpha_n = T_{n1};

  its gradient is ``(1/N) sum_n x_n (sigmoid(w^T x_n) - alpha_n) + lambda w``;
* multiclass (weights ``W`` of shape ``(D, C)``, softmax), Eq. 55:

  .. math:: J(W) = -\frac1N \sum_n \Big[\sum_k T_{nk} w_k^\top x_n - \log \sum_l e^{w_l^\top x_n}\Big]
            + \frac\lambda2 \|W\|_F^2 ,

  gradient ``(1/N) sum_n x_n (softmax(W^T x_n) - T_n)^T + lambda W`` (Eq. 56).

With one-hot targets both are exactly the hard-label objectives of
:mod:`jaxdp.training.linear` (``loss="logistic"`` / ``"softmax"``), so the
majority-vote ERM (Eq. 8) and the *batch* baseline use the same code.

Certificate (as :mod:`jaxdp.training.certified_solve`, whose helpers are reused):
``J`` is ``lambda``-strongly convex, so ``||w - w*|| <= ||grad J(w)|| / lambda``.
The float32 L-BFGS iterate (:func:`jaxdp.training.lbfgs.minimize_lbfgs`) is
checked in float64 on the host (plus the rounding bound
:func:`~jaxdp.training.certified_solve.certificate_rounding_bound`, valid here
because each row of ``softmax - T`` has the same bounds as for one-hot ``T``:
``|sigmoid - alpha| <= 1``, ``||P - T||_2 <= sqrt(2)``); if it fails, a float64
scipy L-BFGS polish, then Nesterov's accelerated gradient with the
data-independent iteration count
:func:`~jaxdp.training.certified_solve.accelerated_gradient_iterations`
(smoothness ``c + lambda``, ``c = 1/4`` binary, ``1/2`` softmax; start projected
onto the ball ``||w|| <= K/lambda`` that holds ``w*``). Every returned point
satisfies ``||w - w*|| <= tol/lambda`` on every input meeting the assumptions.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import scipy.optimize
import scipy.special

from jaxdp.training import certified_solve, linear_losses
from jaxdp.training.lbfgs import SolverInfo, minimize_lbfgs


def loss_name(num_classes: int) -> str:
  """``"logistic"`` (binary, weights ``(D,)``) or ``"softmax"`` (weights ``(D, C)``)."""
  return "logistic" if int(num_classes) == 2 else "softmax"


def lipschitz(num_classes: int) -> float:
  """``K``: 1 (binary logistic) or ``sqrt(2)`` (softmax) — the per-example gradient bound."""
  return linear_losses.lipschitz_constant(loss_name(num_classes))


def objective(w: jax.Array, x: jax.Array, targets: jax.Array, l2_reg) -> jax.Array:
  """``J`` of the module docstring (jax; binary iff ``w.ndim == 1``)."""
  scores = x @ w
  if w.ndim == 1:
    a = targets[:, 1]
    data = a * jax.nn.softplus(-scores) + (1.0 - a) * jax.nn.softplus(scores)
  else:
    data = jax.nn.logsumexp(scores, axis=-1) - jnp.sum(targets * scores, axis=-1)
  return jnp.mean(data) + 0.5 * l2_reg * jnp.sum(w * w)


@functools.partial(jax.jit, static_argnames=("num_classes", "max_iter"))
def _fit32(x, targets, l2_reg, tol, *, num_classes, max_iter):
  d = x.shape[-1]
  init = jnp.zeros((d,) if num_classes == 2 else (d, num_classes), x.dtype)
  return minimize_lbfgs(lambda w: objective(w, x, targets, l2_reg), init, max_iter=max_iter,
                        tol=tol)


def grad64(w: np.ndarray, x: np.ndarray, targets: np.ndarray, l2_reg: float) -> np.ndarray:
  """float64 ``grad J``; leading batch axes allowed (``w (..., D[, C])``, ``x (..., N, D)``)."""
  n = x.shape[-2]
  binary = w.ndim == x.ndim - 1
  if binary:
    t = np.einsum("...nd,...d->...n", x, w)
    g = scipy.special.expit(t) - targets[..., 1]
    return np.einsum("...nd,...n->...d", x, g) / n + l2_reg * w
  s = np.einsum("...nd,...dc->...nc", x, w)
  p = scipy.special.softmax(s, axis=-1)
  return np.einsum("...nd,...nc->...dc", x, p - targets) / n + l2_reg * w


def value_and_grad64(w, x, targets, l2_reg):
  """float64 ``(J(w), grad J(w))`` for one problem."""
  s = x @ w
  if w.ndim == 1:
    a = targets[:, 1]
    data = a * np.logaddexp(0.0, -s) + (1.0 - a) * np.logaddexp(0.0, s)
  else:
    data = scipy.special.logsumexp(s, axis=-1) - np.sum(targets * s, axis=-1)
  return float(data.mean() + 0.5 * l2_reg * np.sum(w * w)), grad64(w, x, targets, l2_reg)


def certificate(w, x, targets, l2_reg, num_classes):
  """``||grad J(w)||`` in float64 plus its rounding bound (batched over leading axes of ``w``)."""
  g = grad64(w, x, targets, l2_reg)
  batch = w.shape[:w.ndim - (1 if num_classes == 2 else 2)]
  gn = np.linalg.norm(g.reshape(batch + (-1,)), axis=-1)
  wn = np.linalg.norm(w.reshape(batch + (-1,)), axis=-1)
  dim = int(np.prod(w.shape[len(batch):]))
  err = certified_solve.certificate_rounding_bound(x.shape[-2], dim, wn, 0.0,
                                                   loss=loss_name(num_classes), h=0.5,
                                                   l2_total=l2_reg)
  return gn + err


def _polish(w0, x, targets, l2_reg, tol, max_iter=500):
  shape = w0.shape
  def fun(v):
    val, g = value_and_grad64(v.reshape(shape), x, targets, l2_reg)
    return val, g.reshape(-1)
  res = scipy.optimize.minimize(fun, w0.reshape(-1), jac=True, method="L-BFGS-B",
                                options=dict(maxiter=max_iter, maxcor=20, ftol=0.0,
                                             gtol=0.1 * tol / math.sqrt(w0.size)))
  return res.x.reshape(shape)


def _agd(w_pre, gnorm_pre, x, targets, l2_reg, tol, num_classes, check_every=10):
  """Nesterov's constant-step scheme (certified_solve docstring, route 2)."""
  mu = l2_reg
  smooth = linear_losses.curvature_bound(loss_name(num_classes)) + mu
  radius = lipschitz(num_classes) / mu
  nrm = np.linalg.norm(w_pre)
  xk = w_pre if nrm <= radius else w_pre * (radius / nrm)
  dist0 = min(2.0 * radius, gnorm_pre / mu)
  t_max = certified_solve.accelerated_gradient_iterations(mu, smooth, dist0, tol)
  q = math.sqrt(mu / smooth)
  mom = (1.0 - q) / (1.0 + q)
  yk = xk
  for k in range(1, t_max + 1):
    x_new = yk - grad64(yk, x, targets, l2_reg) / smooth
    yk = x_new + mom * (x_new - xk)
    xk = x_new
    if k % check_every == 0 and certificate(xk, x, targets, l2_reg, num_classes) <= tol:
      break
  return xk


def fit_certified(x: np.ndarray, targets: np.ndarray, *, num_classes: int, l2_reg: float,
                  tol: float, max_iter: int = 500):
  """Float32 L-BFGS, then the float64 certificate/repair of the module docstring.

  Args:
    x: ``(N, D)`` features, rows in the unit ball (checked by the caller).
    targets: ``(N, C)`` row-stochastic targets.
    num_classes: ``C`` (2: binary weights ``(D,)``).
    l2_reg: ``lambda > 0``.
    tol: certified gradient norm; ``||w - w*|| <= tol / lambda``.
    max_iter: float32 L-BFGS iteration cap.

  Returns:
    ``(CertifiedSolution, SolverInfo)`` (weights float64).
  """
  x64 = np.asarray(x, np.float64)
  t64 = np.asarray(targets, np.float64)
  w32, info = _fit32(jnp.asarray(x, jnp.float32), jnp.asarray(targets, jnp.float32),
                     jnp.float32(l2_reg), jnp.float32(tol), num_classes=int(num_classes),
                     max_iter=int(max_iter))
  w = np.asarray(w32, np.float64)
  g = float(certificate(w, x64, t64, l2_reg, num_classes))
  route = 0
  if g > tol:
    wp = _polish(w, x64, t64, l2_reg, tol)
    gp = float(certificate(wp, x64, t64, l2_reg, num_classes))
    route = 1
    if gp < g:
      w, g = wp, gp
  if g > tol:
    w = _agd(w, g, x64, t64, l2_reg, tol, num_classes)
    g = float(certificate(w, x64, t64, l2_reg, num_classes))
    route = 2
    if g > tol:
      raise certified_solve.CertificationError(
          f"float64 gradient certificate {g:.3g} > tol={tol:.3g} after the guaranteed "
          "accelerated-gradient iterations (float64 round-off); nothing is released.")
  cert = certified_solve.CertifiedSolution(w, np.float64(g), np.float64(g / l2_reg), tol / l2_reg,
                                           np.int32(route), np.int64(0))
  return cert, info


def one_hot(labels, num_classes: int) -> np.ndarray:
  """``(N, C)`` float one-hot targets."""
  return np.eye(int(num_classes), dtype=np.float32)[np.asarray(labels, np.int64)]


__all__ = ["SolverInfo", "certificate", "fit_certified", "grad64", "lipschitz", "loss_name",
           "objective", "one_hot", "value_and_grad64"]
