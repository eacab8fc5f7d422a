r"""Plain numpy/scipy float64 reference of :func:`jaxdp.inference.confidence_intervals`.

Paper 003 = ``../shared/papers/003_dp_confidence_intervals_for_erm.md`` (Wang, Kifer & Lee).
``benchmarks/confidence_intervals.py`` times jaxdp's batched intervals against this code,
written the way a numpy user would write the same algorithm: one bootstrap replicate at a
time, on the ``n`` gathered rows ``x[rows]`` (cost ``O(n d)`` per replicate), float64
throughout. The noise scales come from :func:`jaxdp.inference.intervals.calibrate` (the
library's calibration: paper 003 Alg. 1 with its Approximate Minima Perturbation, Alg. 4,
Lemmas 2-5, Table 2), so this module implements the computation only:

1. ``theta^ = argmin (1/n) sum_i f(y_i theta^T x_i) + (Lambda/2)||theta||^2 + b^T theta / n``
   by damped Newton (Armijo backtracking), ``b ~ exp(-gamma ||b||)`` for objective
   perturbation (Alg. 1; ``b = 0`` for output perturbation), solved until
   ``||grad|| <= tol / 10`` as :mod:`jaxdp.inference.newton` is;
2. ``theta~ = theta^ + noise``: L2-Laplace of ``Calibration.release_scale`` (the AMP output
   noise of Alg. 1, or Alg. 4 under pure DP) or Gaussian (Alg. 4 under zCDP);
3. ``H~``, ``Sigma~``: PrivSPDMat (Alg. 2) of ``H(theta~)`` (Eq. 4.2, sensitivity Lemma 3/5)
   and ``Sigma(theta~)`` (Eq. 4.3, Lemma 2/4 at ``||theta~||``): spherical-Laplace (pure) or
   Gaussian (zCDP) matrix noise, symmetrised, eigenvalues floored (Hessian at ``Lambda``,
   covariance at ``Calibration.covariance_floor``);
4. the interval: under output perturbation with zCDP the closed form of Alg. 5 lines 18-22,
   ``theta~ +- z sqrt(diag(sigma^2 I + H~^{-1} Sigma~ H~^{-1} / n))``; otherwise the exact
   equal-tailed quantiles of the Gaussian scale mixture of Eq. 4.1 (Alg. 3) / Eq. 5.2
   (Alg. 5), by the Gauss-Laguerre rule of :func:`jaxdp.inference.mixture_quantiles.chi2_rule`
   (24 nodes per L2-Laplace mixing variable) and Newton on the convex tail
   ``P(T_j > q) = alpha / 2`` (:mod:`jaxdp.inference.mixture_quantiles`), here in float64.

This is a timing and cross-checking reference, not a private release API: its noise comes
from a ``numpy.random.Generator`` (jaxdp draws every noise from ``jax.random`` keys), it does
not validate its inputs, and it spends nothing (the caller accounts with the
:class:`Calibration`'s event, which at ``epsilon = inf`` is non-private).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np
from scipy import linalg, special

from jaxdp.inference import mixture_quantiles


class Interval(NamedTuple):
  """One replicate's interval: ``lower``, ``upper``, ``theta`` (``theta~``) and the number of
  Newton steps of the solve."""

  lower: np.ndarray
  upper: np.ndarray
  theta: np.ndarray
  num_iter: int


def loss_derivatives(z: np.ndarray, loss: str, h: float) -> tuple[np.ndarray, np.ndarray]:
  """``(f'(z), f''(z))``: logistic ``(-S(-z), S(z)S(-z))``; Huberized hinge (paper 003 Sec. 6)."""
  if loss == "logistic":
    s = special.expit(-z)
    return -s, s * (1.0 - s)
  d1 = np.where(z > 1.0 + h, 0.0, np.where(z < 1.0 - h, -1.0, -(1.0 + h - z) / (2.0 * h)))
  d2 = np.where(np.abs(1.0 - z) <= h, 1.0 / (2.0 * h), 0.0)
  return d1, d2


def loss_value(z: np.ndarray, loss: str, h: float) -> np.ndarray:
  """``f(z)``: ``log(1 + e^{-z})`` or the Huberized hinge of width ``h``."""
  if loss == "logistic":
    return np.logaddexp(0.0, -z)
  return np.where(z > 1.0 + h, 0.0,
                  np.where(z < 1.0 - h, 1.0 - z, (1.0 + h - z) ** 2 / (4.0 * h)))


def newton_solve(x: np.ndarray, y: np.ndarray, lam: float, lin: np.ndarray, *, loss: str,
                 h: float, grad_tol: float, init: np.ndarray | None = None,
                 max_iter: int = 50) -> tuple[np.ndarray, float, int]:
  r"""Damped Newton on ``J(theta) = mean f(y x theta) + (lam/2)||theta||^2 + lin^T theta``.

  ``x`` ``(n, d)`` (the gathered rows), ``y`` in ``{-1, +1}``. Start: ``init``, else 0
  (logistic) or the minimiser of the Huber loss's quadratic piece (as
  :func:`jaxdp.inference.newton.newton_minimize`). Full step when Armijo
  (``c1 = 1e-4``) holds, else halving. Returns ``(theta, ||grad J||, steps)``.
  """
  n, d = x.shape
  eye = lam * np.eye(d)
  if init is not None:
    theta = np.array(init, np.float64)
  elif loss == "huber":
    rhs = (1.0 + h) / (2.0 * h) * (x.T @ y) / n - lin
    theta = linalg.solve(x.T @ x / (2.0 * h * n) + eye, rhs, assume_a="pos")
  else:
    theta = np.zeros(d)

  def value(u, t):
    return np.mean(loss_value(y * u, loss, h)) + 0.5 * lam * t @ t + lin @ t

  u = x @ theta
  for k in range(max_iter + 1):
    d1, d2 = loss_derivatives(y * u, loss, h)
    g = x.T @ (y * d1) / n + lam * theta + lin
    gnorm = float(np.linalg.norm(g))
    if gnorm <= grad_tol or k == max_iter:
      break
    hess = x.T @ (x * (d2 / n)[:, None]) + eye
    step = -linalg.solve(hess, g, assume_a="pos")
    xs = x @ step
    f0, slope, t = value(u, theta), g @ step, 1.0
    while value(u + t * xs, theta + t * step) > f0 + 1e-4 * t * slope and t > 1e-12:
      t *= 0.5
    theta = theta + t * step
    u = x @ theta
  return theta, gnorm, k


def l2_laplace(rng: np.random.Generator, shape: Any, beta: float) -> np.ndarray:
  """Density ``∝ exp(-beta ||b||)`` over ``R^prod(shape)``: radius ``Gamma(prod(shape),
  1/beta)``, uniform direction (paper 003 Eq. 3.2). ``beta = inf``: zeros."""
  if math.isinf(beta):
    return np.zeros(shape)
  g = rng.standard_normal(shape)
  return rng.gamma(g.size, 1.0 / beta) * g / np.linalg.norm(g)


def spd_release(rng: np.random.Generator, matrix: np.ndarray, sensitivity: float, phi: float,
                privacy: str, floor: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """PrivSPDMat (paper 003 Alg. 2): ``(M~, eigenvalues, eigenvectors)`` after the floor."""
  d = matrix.shape[0]
  if math.isinf(phi):
    noise = np.zeros((d, d))
  elif privacy == "pure":
    noise = l2_laplace(rng, (d, d), phi / sensitivity)
  else:
    noise = rng.normal(0.0, sensitivity / math.sqrt(2.0 * phi), (d, d))
  m = matrix + noise
  lam, vec = np.linalg.eigh(0.5 * (m + m.T))
  lam = np.maximum(lam, floor)
  return (vec * lam) @ vec.T, lam, vec


def mixture_half_widths(a: np.ndarray, mixing: tuple, *, dim: int, alpha: float,
                        num_nodes: int = mixture_quantiles.DEFAULT_NODES) -> np.ndarray:
  r"""``q_j`` with ``P(sqrt(a_j + sum_m c_{m,j} V_m) N(0,1) > q_j) = alpha/2``, ``V_m ~
  chi^2_{dim+1}`` (Gauss-Laguerre tensor rule, Newton from the matched Gaussian quantile)."""
  nodes, w = mixture_quantiles.chi2_rule(dim + 1, num_nodes)
  var = a[:, None]
  weights = np.ones(1)
  for c in mixing:
    c = np.broadcast_to(np.asarray(c, np.float64), a.shape)
    var = (var[:, :, None] + c[:, None, None] * nodes).reshape(a.shape[0], -1)
    weights = np.outer(weights, w).reshape(-1)
  scale = var @ weights
  if np.any(scale <= 0):
    raise ValueError("a degenerate (zero-variance) coordinate")
  inv_s = 1.0 / np.sqrt(var / scale[:, None])  # unit-variance mixture per coordinate
  tail = alpha / 2.0
  q = special.ndtri(1.0 - tail) * np.ones_like(a)
  for _ in range(60):
    t = q[:, None] * inv_s
    f = special.ndtr(-t) @ weights
    df = -(np.exp(-0.5 * t * t) * inv_s) @ weights / math.sqrt(2.0 * math.pi)
    q_new = np.where(df < 0, q - (f - tail) / np.where(df < 0, df, -1.0), 0.5 * q)
    q_new = np.where(q_new > 0, q_new, 0.5 * q)
    done = np.all(np.abs(q_new - q) <= 8 * np.finfo(np.float64).eps * q_new)
    q = q_new
    if done:
      break
  return q * np.sqrt(scale)


def hessian_and_covariance(theta, x, y, lam, loss, h):
  """``H`` (Eq. 4.2) and ``Sigma`` (Eq. 4.3) of the ``n`` rows at ``theta``, one product."""
  n, d = x.shape
  d1, d2 = loss_derivatives(y * (x @ theta), loss, h)
  both = x.T @ np.concatenate([x * (d2 / n)[:, None], x * (d1 * d1 / n)[:, None]], axis=1)
  return both[:, :d] + lam * np.eye(d), both[:, d:] - lam * lam * np.outer(theta, theta)


def covariance_sensitivity(loss: str, n: int, theta_norm: float) -> float:
  """Lemma 2 (logistic: ``2 S(||theta||)^2 / n``) or Lemma 4 (Huber: ``2 / n``)."""
  if loss == "logistic":
    return 2.0 * special.expit(theta_norm) ** 2 / n
  return 2.0 / n


def interval(rng: np.random.Generator, x: np.ndarray, y: np.ndarray, cal: Any,
             init: np.ndarray | None = None) -> Interval:
  """One private interval from the ``n`` gathered rows ``x`` ``(n, d)``, ``y`` in ``{-1, +1}``.

  ``cal``: the :class:`jaxdp.inference.intervals.Calibration` for ``num_examples = n`` (its
  noise scales, budget split, floors, ``alpha`` and tolerance). ``init``: Newton's start
  (e.g. the full-data minimiser, as jaxdp starts bootstrap replicates).
  """
  if cal.quantiles != "exact":
    raise ValueError("the numpy reference implements quantiles='exact' only.")
  n, d = x.shape
  lam, loss, h, privacy = cal.l2_reg, cal.loss, cal.h, cal.privacy
  # Stage 1: the (objective-perturbed) minimiser, Alg. 1 / Alg. 4.
  if cal.perturbation == "objective":
    lin = l2_laplace(rng, (d,), cal.objective_gamma) / n
  else:
    lin = np.zeros(d)
  theta_hat, _, steps = newton_solve(x, y, lam, lin, loss=loss, h=h, grad_tol=0.1 * cal.tol,
                                     init=init)
  # Stage 2: the released theta~ and PrivSPDMat of H and Sigma at theta~.
  if cal.release_noise == "gaussian":
    theta = theta_hat + rng.normal(0.0, cal.release_scale, d)
  else:
    theta = theta_hat + l2_laplace(rng, (d,), cal.release_scale)
  hess, cov = hessian_and_covariance(theta, x, y, lam, loss, h)
  _, lam_h, vec_h = spd_release(rng, hess, cal.hessian_sensitivity, cal.split.hessian, privacy,
                                cal.hessian_floor)
  s_rel, _, _ = spd_release(rng, cov, covariance_sensitivity(loss, n, np.linalg.norm(theta)),
                            cal.split.covariance, privacy, cal.covariance_floor)
  h_inv = (vec_h / lam_h) @ vec_h.T
  sandwich = np.diag(h_inv @ s_rel @ h_inv) / n
  z = special.ndtri(1.0 - cal.alpha / 2.0)
  if cal.perturbation == "output" and privacy == "zcdp":  # Alg. 5 lines 18-22
    half = z * np.sqrt(cal.release_scale ** 2 + sandwich)
    return Interval(theta - half, theta + half, theta, steps)
  inv_rel2 = 0.0 if math.isinf(cal.release_scale) else cal.release_scale ** -2
  if cal.perturbation == "objective":  # Eq. 4.1: T = H^-1 (G + b/sqrt n)/sqrt n - Z
    inv_g2 = 0.0 if math.isinf(cal.objective_gamma) else cal.objective_gamma ** -2
    mixing = (np.sum(h_inv * h_inv, axis=0) * inv_g2 / (n * n), inv_rel2)
  else:  # Eq. 5.2: T = H^-1 G / sqrt n - b
    mixing = (inv_rel2,)
  half = mixture_half_widths(sandwich, mixing, dim=d, alpha=cal.alpha)
  return Interval(theta - half, theta + half, theta, steps)
