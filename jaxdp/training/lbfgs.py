"""Jittable, vmappable L-BFGS with a strong-Wolfe (zoom) line search.

Paper 000 Sec. 4.1 trains every linear model "using L-BFGS with a line search
that checks the Wolfe conditions". We use :func:`optax.lbfgs` with its default
:func:`optax.scale_by_zoom_linesearch` (strong Wolfe conditions) and drive it
with a :func:`jax.lax.while_loop`, so that one compiled call can be
:func:`jax.vmap`-ed over many problems (noise draws, lambda grids, teachers).

Why convergence matters for privacy: objective/loss perturbation is only
private at the *exact* minimiser of the perturbed objective (paper 000 App. B.2
and paper 003 App. A.1 invert the stationarity condition grad J(theta) = 0 to
recover the noise). :class:`SolverInfo` therefore reports the final gradient
norm and a ``converged`` flag (``||grad J||_2 <= tol``); callers that release a
perturbed-objective minimiser should check it.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

Params = Any


class SolverInfo(NamedTuple):
  """Diagnostics of :func:`minimize_lbfgs` (arrays, batched under vmap).

  Attributes:
    converged: ``||grad||_2 <= tol`` at the returned parameters.
    num_iter: number of L-BFGS iterations taken.
    grad_norm: global L2 norm of the gradient at the returned parameters.
    value: objective value at the returned parameters.
  """

  converged: jax.Array
  num_iter: jax.Array
  grad_norm: jax.Array
  value: jax.Array


def minimize_lbfgs(
    fun: Callable[[Params], jax.Array],
    init_params: Params,
    *,
    max_iter: int = 500,
    tol: float | jax.Array = 1e-6,
    memory_size: int = 10,
    max_linesearch_steps: int = 30,
    patience: int = 50,
    value_diff: Callable[[Params, Params], jax.Array] | None = None,
) -> tuple[Params, SolverInfo]:
  r"""Minimises a smooth scalar ``fun`` with L-BFGS + zoom line search.

  Iterates :math:`\theta_{k+1} = \theta_k + \eta_k P_k \nabla J(\theta_k)`
  (``optax.lbfgs``, memory ``memory_size``, step ``eta_k`` satisfying the strong
  Wolfe conditions) until :math:`\|\nabla J(\theta_k)\|_2 \le` ``tol``, the
  iteration cap ``max_iter`` is hit, or the line search can no longer move the
  iterate (float round-off); ``converged`` reports which.

  Jittable and vmappable: ``jax.vmap(lambda d: minimize_lbfgs(lambda p: f(p, d), p0))``
  trains one model per batch element (the while loop runs until every element
  has stopped; finished elements are frozen).

  Args:
    fun: objective ``params -> scalar``.
    init_params: starting point (any pytree of float arrays).
    max_iter: iteration cap (static).
    tol: tolerance on the global L2 norm of the gradient (may be traced).
    memory_size: number of stored curvature pairs (static).
    max_linesearch_steps: cap on zoom line-search steps per iteration (static).
    patience: stop (not converged) after this many iterations without a new
      smallest gradient norm: float32 round-off sets a floor on the gradient
      norm, and iterating at the floor only burns time (static).
    value_diff: optional ``(base, delta) -> fun(base + delta) - fun(base)``
      computed without cancellation. In float32 the line search cannot see
      decreases below ``eps * |fun|``; objective perturbation adds a large
      linear term ``<b, theta>``, so comparing *differences* (exact for the
      linear and quadratic terms) lets the solver reach small gradient norms.

  Returns:
    ``(params, SolverInfo)``.
  """
  if int(max_iter) < 0:
    raise ValueError(f"max_iter must be >= 0, got {max_iter}.")
  linesearch = optax.scale_by_zoom_linesearch(
      max_linesearch_steps=max_linesearch_steps, initial_guess_strategy="one")
  opt = optax.lbfgs(memory_size=memory_size, linesearch=linesearch)
  tol = jnp.asarray(tol, dtype=jnp.result_type(float))

  value0, grad0 = jax.value_and_grad(fun)(init_params)
  state0 = opt.init(init_params)

  def cond(carry):
    _, _, value, grad, k, moved, _, stale = carry
    gnorm = optax.tree.norm(grad)
    return (k < max_iter) & (gnorm > tol) & moved & jnp.isfinite(value) & (stale < patience)

  def body(carry):
    params, state, value, grad, k, _, best, stale = carry
    if value_diff is None:
      updates, state = opt.update(grad, state, params, value=value, grad=grad, value_fn=fun)
      new_value = optax.tree.get(state, "value")
      decrease = new_value - value
    else:
      # Line search on g(p) = fun(p) - fun(params), evaluated as a difference.
      rel = lambda p: value_diff(params, jax.tree.map(jnp.subtract, p, params))
      updates, state = opt.update(grad, state, params, value=jnp.zeros_like(value), grad=grad,
                                  value_fn=rel)
      decrease = optax.tree.get(state, "value")
      new_value = value + decrease
    new_params = optax.apply_updates(params, updates)
    new_grad = optax.tree.get(state, "grad")
    # Stop when round-off prevents progress: no movement, or no decrease in value.
    # Near the optimum float32 cannot resolve value decreases (the gradient is
    # still informative), so accept steps whose value rises by at most a few
    # ulps; a step that clearly increases the objective is rejected and stops
    # the loop (line-search failure), keeping the previous iterate.
    slack = 8.0 * jnp.finfo(jnp.result_type(value)).eps * jnp.abs(value)
    if value_diff is not None:
      slack = 8.0 * jnp.finfo(jnp.result_type(value)).eps * (1.0 + jnp.abs(decrease))
    moved = (optax.tree.norm(updates) > 0) & (decrease <= slack)
    keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(moved, a, b), new, old)
    new_grad = keep(new_grad, grad)
    gnorm = optax.tree.norm(new_grad)
    improved = gnorm < best
    return (keep(new_params, params), state, keep(new_value, value), new_grad, k + 1, moved,
            jnp.minimum(gnorm, best), jnp.where(improved, 0, stale + 1))

  carry = (init_params, state0, value0, grad0, jnp.asarray(0, jnp.int32), jnp.asarray(True),
           optax.tree.norm(grad0), jnp.asarray(0, jnp.int32))
  params, _, value, grad, k, _, _, _ = jax.lax.while_loop(cond, body, carry)
  if value_diff is not None:
    value = fun(params)  # the running sum of differences drifts; report the exact value
  gnorm = optax.tree.norm(grad)
  return params, SolverInfo(converged=gnorm <= tol, num_iter=k, grad_norm=gnorm, value=value)
