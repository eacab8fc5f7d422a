r"""A jitted, vmappable damped Newton solver for the small binary ERM problems of paper 003.

Minimises (paper 003 Eq. 3.1 and Alg. 1 line 3, with ``Lambda = 2c``)

.. math::
   J(\theta) = \frac1n \sum_i w_i f(y_i \theta^\top x_i) + \frac{\Lambda}{2}\|\theta\|^2 + b^\top\theta ,

``n = sum_i w_i``, for the logistic and Huberized hinge losses. ``J`` is ``Lambda``-strongly
convex; with ``d`` around 10 a Newton step (a ``d x d`` Cholesky solve) costs about one
pass over ``X`` and Newton needs a handful of steps where L-BFGS needs tens, so this is the
fast path for one confidence interval (``benchmarks/confidence_intervals.py`` measures it).

Globalisation: the full Newton step ``-H^{-1} g`` is accepted when ``J`` provably decreased
along it (the directional derivative at its end is ``<= 0``: no objective evaluation, the
float64 loss being the costliest elementwise work) or when it passes the Armijo test;
otherwise backtracking (Armijo, ``c1 = 1e-4``, halving) on that direction, a descent
direction since ``H >= Lambda I``. The Huber loss is only piecewise twice differentiable;
its generalised Hessian (``1/(2h)`` on ``|1 - z| <= h``) is used.

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
                    init: jax.Array | None = None,
                    xt: jax.Array | None = None,
                    xt_hessian: jax.Array | None = None,
                    init_hessian: jax.Array | None = None) -> NewtonResult:
  """Damped Newton from ``init`` (default 0) until ``||grad J|| <= grad_tol`` or ``max_iter`` steps.

  Start: ``init``; else 0 (logistic) or the minimiser of the Huber loss's quadratic piece
  extended to all margins (one Hessian-sized pass; from 0 every Huber margin sits in the
  linear piece and the first steps backtrack far).

  Step acceptance: the full Newton step is taken when the directional derivative at its end
  is ``<= 0`` (then, ``J`` being convex along the step, ``J`` decreased; no loss
  evaluation), for the logistic loss when the trapezoid bound on ``J(full) - J(theta)`` from
  the two directional derivatives and ``|f'''| <= 1/(6 sqrt 3)`` already passes the Armijo
  test (no loss evaluation either), or when it passes the Armijo test; this costs the
  passes the next iteration needs anyway: ``X theta``, ``X^T f'`` for the gradient and
  ``X^T diag(f'') X`` for the Hessian. Otherwise the step is damped by Armijo backtracking
  on ``J`` (``c1 = 1e-4``, halving), one more pass and a float64 loss evaluation per trial.
  Every accepted step decreases ``J``. Only the float64 certificate of the final point
  enters any guarantee.

  ``X^T`` is materialised once per solve (XLA:CPU runs a dot that contracts ``X``'s leading
  axis about 4x slower than the same product with ``X^T`` in memory). The Hessian only sets
  the search direction, so it may be computed in lower precision (``x_hessian =
  x.astype(float32)``: about 3x faster on a CPU than float64); the gradient, objective and
  iterate stay in ``x.dtype``, and the iteration converges linearly at rate
  ~ ``||H_32 - H|| / Lambda`` (about 1e-5) near the optimum, to the ``x.dtype`` round-off
  floor.

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
    xt, xt_hessian: ``X^T`` and ``x_hessian^T`` if the caller has them in memory (default:
      materialised here).
    init_hessian: a ``(d, d)`` Hessian (or any SPD approximation of it) for the first step
      from ``init``, saving that Hessian's pass: e.g. the Hessian of the unweighted problem
      at a warm start shared by many bootstrap replicates (the first step is then a chord
      step; Newton's convergence follows from the second).
  """
  dtype = x.dtype
  xh = x if x_hessian is None else x_hessian
  if xt is None:
    xt = jax.lax.optimization_barrier(jnp.transpose(x))
  if xt_hessian is not None:
    xht = xt_hessian
  else:
    xht = xt if x_hessian is None else jax.lax.optimization_barrier(jnp.transpose(xh))
  n = jnp.sum(w)
  wy = w * y
  wh = (w / n).astype(xh.dtype)
  eye = l2_total * jnp.eye(x.shape[1], dtype=dtype)

  def value(u):  # the loss part of J as a function of the margins' pre-image u = X theta
    return jnp.sum(w * sensitivities.loss_value(y * u, loss, h)) / n

  def reg(theta):
    return 0.5 * l2_total * jnp.sum(theta * theta) + jnp.sum(linear_term * theta)

  def hessian(d2):
    return (xht @ (xh * (wh * d2.astype(xh.dtype))[:, None])).astype(dtype) + eye

  def gradient(theta, d1):
    return xt @ (wy * d1) / n + l2_total * theta + linear_term

  def derivs(theta, u, k):
    d1, d2 = sensitivities.loss_derivatives(y * u, loss, h)
    g = gradient(theta, d1)
    # The Hessian (the costliest pass) only if another step follows.
    more = (jnp.linalg.norm(g) > grad_tol) & (k < max_iter)
    return g, jax.lax.cond(more, hessian, lambda _: eye, d2)

  if init is not None:
    theta0 = jnp.asarray(init, dtype)
  elif loss == "huber":
    # Start at the minimiser of the quadratic piece's model (as if every margin were in
    # |1 - z| <= h, where f = (1 + h - z)^2 / (4h)): from 0 every margin is in the linear
    # piece, the Hessian there is Lambda I and the first steps backtrack far.
    rhs = (1.0 + h) / (2.0 * h) * (xt @ wy) / n - linear_term
    h_quad = hessian(jnp.full((x.shape[0],), 1.0, dtype) / (2.0 * h))
    theta0 = jax.scipy.linalg.cho_solve(jax.scipy.linalg.cho_factor(h_quad, lower=True), rhs)
  else:
    theta0 = jnp.zeros((x.shape[1],), dtype)
  if init is None and loss == "logistic":
    # At theta = 0 every margin is 0: f'(0) = -1/2, f''(0) = 1/4 (no margin pass, no sigmoid).
    u0 = jnp.zeros((x.shape[0],), dtype)
    g0 = gradient(theta0, jnp.full((x.shape[0],), -0.5, dtype))
    h0 = hessian(jnp.full((x.shape[0],), 0.25, dtype))
  elif init_hessian is None:
    u0 = x @ theta0
    g0, h0 = derivs(theta0, u0, 0)
  else:
    u0 = x @ theta0
    g0 = gradient(theta0, sensitivities.loss_derivatives(y * u0, loss, h)[0])
    h0 = jnp.asarray(init_hessian, dtype)

  def cond(state):
    _, _, g, _, k, moved = state
    return (k < max_iter) & (jnp.linalg.norm(g) > grad_tol) & moved

  def body(state):
    theta, u, g, hess, k, _ = state
    step = -jax.scipy.linalg.cho_solve(jax.scipy.linalg.cho_factor(hess, lower=True), g)
    full = theta + step
    u_full = x @ full
    g_full, h_full = derivs(full, u_full, k + 1)

    slope = jnp.dot(g, step)

    def damped(_):
      xs = x @ step
      f0 = value(u) + reg(theta)

      def ls_cond(s):
        t, j, f_t = s
        return (f_t > f0 + 1e-4 * t * slope) & (j < max_backtracks)

      def ls_body(s):
        t = 0.5 * s[0]
        return t, s[1] + 1, value(u + t * xs) + reg(theta + t * step)

      one = jnp.asarray(1.0, dtype)
      t, _, _ = jax.lax.while_loop(ls_cond, ls_body, (one, 0, value(u_full) + reg(full)))
      new = theta + t * step
      u_new = x @ new  # recomputed (not u + t xs) so round-off does not accumulate
      return (new, u_new) + derivs(new, u_new, k + 1)

    def armijo_at_one(_):
      return value(u_full) + reg(full) <= value(u) + reg(theta) + 1e-4 * slope

    # phi(t) = J(theta + t step) is convex, so phi'(1) = grad J(full) . step <= 0 means J
    # decreased along the whole step: accepted without evaluating the loss. Otherwise the
    # Armijo test at t = 1, then backtracking. Every accepted step decreases J, so the
    # iterates cannot cycle (a test on the gradient norm alone can: Huber's kinks).
    dphi1 = jnp.dot(g_full, step)
    free = dphi1 <= 0
    if loss == "logistic":
      # Trapezoid rule for J(full) - J(theta) = int_0^1 phi': its error is at most
      # max|phi'''| / 12, and phi''' = (1/n) sum_i w_i f'''(z_i) (y_i x_i.step)^3 with
      # |f'''| <= 1/(6 sqrt 3) for the logistic loss, so |phi'''| <= max_i |x_i.step|^3 /
      # (6 sqrt 3) (x_i.step is the change of the margins' pre-image). Armijo then holds
      # without a loss pass when the bound is below c1 * slope.
      cube = jnp.max(jnp.abs(u_full - u)) ** 3 / (6.0 * jnp.sqrt(3.0))
      free = free | (0.5 * (slope + dphi1) + cube / 12.0 <= 1e-4 * slope)
    accept = jax.lax.cond(free, lambda _: jnp.asarray(True), armijo_at_one, None)
    new, u_new, g_new, h_new = jax.lax.cond(
        accept, lambda _: (full, u_full, g_full, h_full), damped, None)
    moved = jnp.any(new != theta)  # round-off floor reached: stop
    return new, u_new, g_new, h_new, k + 1, moved

  theta, _, g, _, k, _ = jax.lax.while_loop(
      cond, body, (theta0, u0, g0, h0, 0, jnp.asarray(True)))
  return NewtonResult(theta, jnp.linalg.norm(g), k)
