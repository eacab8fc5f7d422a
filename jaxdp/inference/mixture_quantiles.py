r"""Exact quantiles of the sampling laws of paper 003 Algorithms 3 and 5 (Monte Carlo free).

Paper 003's intervals (Alg. 3 lines 7-13, Alg. 5 lines 7-13) take equal-tailed quantiles of
``m`` Monte Carlo draws of the law of ``theta_0 - theta~``. That law is a Gaussian scale
mixture, so its coordinate quantiles can be computed to ~1e-9 instead of estimated to
``~1/sqrt(m)`` (about 1% of the half-width at the paper's ``m = 10,000``), at a fraction of
the cost. All of this is post-processing of released quantities: no data is touched.

**Fact (L2-Laplace is a Gaussian scale mixture).** If ``V ~ chi^2_{d+1}`` and
``G ~ N(0, I_d)`` are independent, then ``b = sqrt(V) G / beta`` has the density
``∝ exp(-beta ||b||)`` on ``R^d`` (the noise of :func:`jaxdp.mechanisms.l2_laplace_noise`).
Proof (``beta = 1``, ``r = ||b||``): the mixture density is

.. math::
   \int_0^\infty (2\pi v)^{-d/2} e^{-r^2/(2v)} \, c_d \, v^{(d-1)/2} e^{-v/2} \, dv
   \;\propto\; \int_0^\infty v^{-1/2} e^{-r^2/(2v) - v/2} \, dv = \sqrt{2\pi}\, e^{-r},

by ``∫_0^∞ v^{-1/2} exp(-a/v - c v) dv = sqrt(pi/c) exp(-2 sqrt(a c))``. (Check: ``E||b||^2 =
E[V] E||G||^2 = (d+1) d``, the second moment of the radius ``Gamma(d, 1)``.)

**Consequence.** Algorithm 3 (Eq. 4.1): ``T = H^{-1}(G + b/sqrt(n))/sqrt(n) - Z`` with
``G ~ N(0, Sigma)``, ``b ∝ exp(-gamma ||b||)`` and the AMP noise ``Z ∝ exp(-beta_z ||Z||)``,
independent. Given the two mixing variables, ``T`` is Gaussian, so each coordinate is

.. math::
   T_j \overset{d}{=} \sqrt{A_j + B_j V_b + C_j V_z}\; N(0, 1), \quad
   A_j = \frac{(H^{-1}\Sigma H^{-1})_{jj}}{n}, \;
   B_j = \frac{(H^{-2})_{jj}}{\gamma^2 n^2}, \; C_j = \frac{1}{\beta_z^2},

``V_b, V_z ~ chi^2_{d+1}`` i.i.d. Algorithm 5 with pure DP (Eq. 5.2, ``T = H^{-1}G/sqrt(n) -
b``, ``b ∝ exp(-beta ||b||)``) is the case ``B = 0``, ``C_j = 1/beta^2``. ``T_j`` is symmetric,
so the equal-tailed ``1 - alpha`` interval is ``theta~_j ± q_j`` with

.. math::
   F_j(q_j) := P(T_j > q_j) = E_V\big[\bar\Phi\big(q_j / s_j(V)\big)\big] = \alpha / 2 .

**Integration.** ``V = 2U``, ``U ~ Gamma((d+1)/2, 1)``: a generalised Gauss-Laguerre rule
(weight ``u^{(d-1)/2} e^{-u}``), tensor product over ``(V_b, V_z)``. With 24 nodes per
variable the tail probability is within 1e-9 of adaptive quadrature over the ratios ``A:B:C``
that occur (tests/inference/test_mixture_quantiles.py, which also checks the quantiles
against 10^6 draws of the library's L2-Laplace sampler).

**Root.** ``F_j`` is decreasing and convex on ``q > 0`` (``d^2/dq^2 Phibar(q/s) =
(q/s) phi(q/s)/s^2 > 0``), so a Newton step from any ``q > 0`` lands at or left of the root,
and from there Newton increases monotonically and quadratically to it. The start is the
quantile of the Gaussian with the same variance.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from scipy import special

DEFAULT_NODES = 24
"""Gauss-Laguerre nodes per mixing variable (tail probability error below 1e-9)."""


@functools.lru_cache(maxsize=64)
def chi2_rule(dof: int, num_nodes: int = DEFAULT_NODES) -> tuple[np.ndarray, np.ndarray]:
  """Nodes ``v_i``, weights ``w_i`` (sum 1): ``E f(V) ≈ sum_i w_i f(v_i)``, ``V ~ chi^2_dof``.

  Generalised Gauss-Laguerre for ``U = V/2 ~ Gamma(dof/2, 1)``, computed in float64 on the
  host (exact for polynomials of degree ``< 2 num_nodes`` in ``V``).
  """
  if dof <= 0 or num_nodes <= 0:
    raise ValueError(f"dof and num_nodes must be positive, got {dof}, {num_nodes}.")
  u, w = special.roots_genlaguerre(int(num_nodes), dof / 2.0 - 1.0)
  w = w / math.gamma(dof / 2.0)
  return 2.0 * u, w / w.sum()


def upper_tail(q: jax.Array, variances: jax.Array, weights: jax.Array) -> tuple[jax.Array,
                                                                                 jax.Array]:
  """``F(q) = sum_k w_k Phibar(q / s_k)`` and ``F'(q)`` per coordinate.

  Args:
    q: ``(d,)`` points; variances: ``(d, K)`` the conditional variances ``s_k^2`` at the
      nodes; weights: ``(K,)``.
  """
  pos = variances > 0
  inv_s = jnp.where(pos, jax.lax.rsqrt(jnp.where(pos, variances, 1.0)), 0.0)
  t = q[:, None] * inv_s
  # A zero variance is a point mass at 0: P(T > q) = 0 for q > 0.
  tail = jnp.where(pos, jax.scipy.special.ndtr(-t), 0.0)
  dens = jnp.where(pos, jnp.exp(-0.5 * t * t) * inv_s, 0.0) * (1.0 / math.sqrt(2.0 * math.pi))
  return tail @ weights, -(dens @ weights)


def symmetric_mixture_quantile(variances: jax.Array, weights: jax.Array, tail: Any,
                               gaussian_z: Any, max_iter: int = 60) -> jax.Array:
  """``q_j > 0`` with ``P(T_j > q_j) = tail`` for ``T_j ~ sum_k w_k N(0, variances[j, k])``.

  Newton on the convex decreasing ``F_j`` (module docstring), in the dtype of ``variances``,
  from the matched-variance Gaussian quantile ``gaussian_z * sqrt(sum_k w_k variances[j, k])``
  (``gaussian_z = Phi^{-1}(1 - tail)``), until every step is below ``8 eps q`` or
  ``max_iter`` steps. A coordinate whose variances are all 0 gets ``q = 0``.
  """
  dtype = variances.dtype
  tol = 8 * jnp.finfo(dtype).eps
  tail = jnp.asarray(tail, dtype)
  mean_var = variances @ weights
  degenerate = ~(mean_var > 0)
  q0 = jnp.where(degenerate, 1.0, jnp.asarray(gaussian_z, dtype) * jnp.sqrt(mean_var))

  def step(q):
    f, df = upper_tail(q, variances, weights)
    newton = q - (f - tail) / jnp.where(df < 0, df, -1.0)
    # F'(q) underflows far right of the root: halve instead (F convex: the root is left).
    q_new = jnp.where(df < 0, newton, 0.5 * q)
    # Convexity puts a Newton step at or left of the root, but never below 0: guard anyway.
    return jnp.where(q_new > 0, q_new, 0.5 * q)

  def cond(state):
    q, q_prev, k = state
    return (k < max_iter) & jnp.any(jnp.abs(q - q_prev) > tol * q)

  def body(state):
    q, _, k = state
    return step(q), q, k + 1

  q = jax.lax.while_loop(cond, body, (step(q0), q0, 1))[0]
  return jnp.where(degenerate, 0.0, q)


def interval_half_widths(a: jax.Array, mixing_scales: tuple, *, dim: int, alpha: Any,
                         gaussian_z: Any, num_nodes: int = DEFAULT_NODES,
                         compute_dtype: Any = jnp.float32) -> jax.Array:
  r"""Half-widths ``q_j`` of the exact equal-tailed intervals of Algorithms 3 and 5.

  ``T_j = sqrt(a_j + sum_m c_{m,j} V_m) N(0, 1)`` with independent ``V_m ~ chi^2_{dim+1}``
  (one ``V_m`` per L2-Laplace noise in ``R^dim``; module docstring).

  The conditional variances are formed in the dtype of ``a`` and divided, per coordinate,
  by their mean (the quantile scales with the standard deviation), so the root search can
  run in ``compute_dtype`` (default float32: its ~1e-7 relative error is far below the
  ~1e-2 Monte Carlo error it replaces) without under- or overflow; the result is scaled
  back in the dtype of ``a``.

  Args:
    a: ``(d,)`` the Gaussian part ``A_j``.
    mixing_scales: a tuple (static length 0, 1 or 2) of ``(d,)`` or scalar ``c_m`` (the
      ``B_j``, ``C_j`` of the module docstring).
    dim: the dimension of the L2-Laplace noises (``d``: the degrees of freedom are ``d+1``).
    alpha, gaussian_z: ``1 - alpha`` intervals and ``Phi^{-1}(1 - alpha/2)``.
    num_nodes: Gauss-Laguerre nodes per mixing variable.
    compute_dtype: dtype of the root search.
  """
  nodes, w = chi2_rule(dim + 1, num_nodes)
  dtype = a.dtype
  variances = a[:, None]
  weights = np.ones((1,))
  for c in mixing_scales:
    c = jnp.broadcast_to(jnp.asarray(c, dtype), a.shape)
    variances = (variances[:, :, None] + c[:, None, None] * jnp.asarray(nodes, dtype)).reshape(
        a.shape[0], -1)
    weights = np.outer(weights, w).reshape(-1)
  scale = variances @ jnp.asarray(weights, dtype)
  unit = jnp.where((scale > 0)[:, None], variances / jnp.where(scale > 0, scale, 1.0)[:, None], 0.0)
  q = symmetric_mixture_quantile(unit.astype(compute_dtype), jnp.asarray(weights, compute_dtype),
                                 jnp.asarray(alpha, compute_dtype) / 2, gaussian_z)
  return q.astype(dtype) * jnp.sqrt(scale)
