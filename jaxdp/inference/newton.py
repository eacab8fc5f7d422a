r"""A jitted, vmappable damped Newton solver for the small binary ERM problems of paper 003.

Minimises (paper 003 Eq. 3.1 and Alg. 1 line 3, with ``Lambda = 2c``)

.. math::
   J(\theta) = \frac1n \sum_i w_i f(y_i \theta^\top x_i) + \frac{\Lambda}{2}\|\theta\|^2 + b^\top\theta ,

``n = sum_i w_i``, for the logistic and Huberized hinge losses. ``J`` is ``Lambda``-strongly
convex; with ``d`` around 10 a Newton step (a ``d x d`` Cholesky solve) costs about one
pass over ``X`` and Newton needs a handful of steps where L-BFGS needs tens, so this is the
fast path for one confidence interval (``benchmarks/confidence_intervals.py`` measures it).

Globalisation: backtracking (Armijo, ``c1 = 1e-4``, halving) on the Newton direction
``-H^{-1} g``, which is a descent direction since ``H >= Lambda I``. The Huber loss is only
piecewise twice differentiable; its generalised Hessian (``1/(2h)`` on ``|1 - z| <= h``) is
used, and the line search keeps every step a descent step.

Run it in float64 (``with jax.enable_x64(True)``): the privacy proofs are about the exact
minimiser, and :mod:`jaxdp.inference.intervals` certifies the result with the
strong-convexity bound ``||theta - theta*|| <= ||grad J(theta)|| / Lambda`` (the certificate
of :mod:`jaxdp.training.certified_solve`) before releasing anything.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from jaxdp.inference import sensitivities


class NewtonResult(NamedTuple):
  """Result of :func:`newton_minimize` (leading batch axes under vmap).

  Attributes:
    theta: the final iterate.
    grad_norm: ``||grad J(theta)||`` (as computed, without a rounding bound).
    num_iter: Newton steps taken.
  """

  theta: jax.Array
  grad_norm: jax.Array
  num_iter: jax.Array


def objective(theta, x, y, w, l2_total, linear_term, *, loss, h):
  """``J(theta)`` of the module docstring."""
  n = jnp.sum(w)
  val = jnp.sum(w * sensitivities.loss_value(y * (x @ theta), loss, h)) / n
  return val + 0.5 * l2_total * jnp.sum(theta * theta) + jnp.sum(linear_term * theta)


def _hessian(x, w, d2, l2_total, n):
  return x.T @ (x * (w * d2)[:, None]) / n + l2_total * jnp.eye(x.shape[1], dtype=x.dtype)


def grad_and_hessian(theta, x, y, w, l2_total, linear_term, *, loss, h):
  """``(grad J(theta), H J(theta))`` (``H`` the generalised Hessian for Huber)."""
  n = jnp.sum(w)
  d1, d2 = sensitivities.loss_derivatives(y * (x @ theta), loss, h)
  g = x.T @ (w * y * d1) / n + l2_total * theta + linear_term
  return g, _hessian(x, w, d2, l2_total, n)


def newton_minimize(x: jax.Array, y: jax.Array, w: jax.Array, l2_total: Any,
                    linear_term: jax.Array, *, loss: str, h: Any = 0.5, grad_tol: Any = 0.0,
                    max_iter: int = 50, max_backtracks: int = 40,
                    x_hessian: jax.Array | None = None,
                    init: jax.Array | None = None) -> NewtonResult:
  """Damped Newton from ``init`` (default 0) until ``||grad J|| <= grad_tol`` or ``max_iter`` steps.

  Each step costs three passes over ``X``: ``X s`` for the step (the line search then only
  needs elementwise work on the margins, which are carried), ``X^T g'`` for the gradient and
  ``X^T diag(f'') X`` for the Hessian. The Hessian only sets the search direction, so it may
  be computed in lower precision (``x_hessian = x.astype(float32)``: about 3x faster on a
  CPU than float64); the gradient, objective and iterate stay in ``x.dtype``, and the
  iteration converges linearly at rate ~ ``||H_32 - H|| / Lambda`` (about 1e-5) near the
  optimum, to the ``x.dtype`` round-off floor.

  Args:
    x: ``(N, d)``; y: ``(N,)`` in ``{-1, +1}``; w: ``(N,)`` row multiplicities.
    l2_total: ``Lambda > 0``; linear_term: ``(d,)`` ``b`` (zeros for no perturbation).
    loss, h: ``"logistic"`` or ``"huber"`` and its width.
    grad_tol: stop once the gradient norm is at most this (0: run until no progress or
      ``max_iter``).
    max_iter, max_backtracks: static iteration caps.
    x_hessian: ``x`` in the precision used for the Hessian (default ``x``).
    init: starting point ``(d,)`` (default zeros). Any start, even a data-dependent one,
      keeps the guarantees of :mod:`jaxdp.inference.intervals`: they rest on the float64
      certificate of the returned point only (the argument of
      :mod:`jaxdp.training.objective_perturbation`, "Warm starts").
  """
  dtype = x.dtype
  xh = x if x_hessian is None else x_hessian
  n = jnp.sum(w)
  wy = w * y

  def value(u):  # J as a function of the margins' pre-image u = X theta (and theta)
    return jnp.sum(w * sensitivities.loss_value(y * u, loss, h)) / n

  def derivs(theta, u):
    d1, d2 = sensitivities.loss_derivatives(y * u, loss, h)
    g = x.T @ (wy * d1) / n + l2_total * theta + linear_term
    hess = _hessian(xh, w.astype(xh.dtype), d2.astype(xh.dtype), l2_total, n.astype(xh.dtype))
    return g, hess

  def reg(theta):
    return 0.5 * l2_total * jnp.sum(theta * theta) + jnp.sum(linear_term * theta)

  if init is None:
    theta0 = jnp.zeros((x.shape[1],), dtype)
    u0 = jnp.zeros((x.shape[0],), dtype)
  else:
    theta0 = jnp.asarray(init, dtype)
    u0 = x @ theta0
  g0, h0 = derivs(theta0, u0)
  f_init = value(u0) + reg(theta0)

  def cond(state):
    _, _, g, _, _, k, moved = state
    return (k < max_iter) & (jnp.linalg.norm(g) > grad_tol) & moved

  def body(state):
    theta, u, g, hess, f0, k, _ = state
    hess = hess.astype(dtype)
    step = -jax.scipy.linalg.cho_solve(jax.scipy.linalg.cho_factor(hess, lower=True), g)
    xs = x @ step
    slope = jnp.dot(g, step)

    def ls_cond(s):
      t, j, f_t = s
      return (f_t > f0 + 1e-4 * t * slope) & (j < max_backtracks)

    def ls_body(s):
      t = 0.5 * s[0]
      return t, s[1] + 1, value(u + t * xs) + reg(theta + t * step)

    one = jnp.asarray(1.0, dtype)
    # The objective at the accepted step is carried to the next iteration (one float64 loss
    # pass per iteration fewer than re-evaluating it at the start of each).
    t, _, f_new = jax.lax.while_loop(ls_cond, ls_body,
                                     (one, 0, value(u + xs) + reg(theta + step)))
    new = theta + t * step
    u_new = x @ new  # recomputed (not u + t xs) so round-off does not accumulate
    g_new, h_new = derivs(new, u_new)
    moved = jnp.any(new != theta)  # round-off floor reached: stop
    return new, u_new, g_new, h_new, f_new, k + 1, moved

  theta, _, g, _, _, k, _ = jax.lax.while_loop(
      cond, body, (theta0, u0, g0, h0, f_init, 0, jnp.asarray(True)))
  return NewtonResult(theta, jnp.linalg.norm(g), k)
