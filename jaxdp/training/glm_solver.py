r"""L-BFGS specialised to linear-model objectives: two passes over ``X`` per iteration.

Objective (the one of :mod:`jaxdp.training.linear`):

.. math::
   J(W) = \frac1N \sum_n \ell(x_n^\top W, y_n) + \frac{\Lambda}{2}\|W\|_F^2 + \langle b, W\rangle ,

with ``Lambda = l2_reg + extra_l2`` and ``b`` the (mean-normalised) linear term.
``J`` depends on the data only through the scores ``A = X W``, and ``A`` is
linear in ``W``: along a search direction ``P`` the scores are
``A + t Q`` with ``Q = X P``. So one iteration needs exactly two passes over
``X`` (``Q = X P`` and the gradient ``X^T ell'(A_new) / N``), whatever the line
search does: every trial step costs ``O(N C)`` (no matmul), where the generic
:func:`jaxdp.training.lbfgs.minimize_lbfgs` pays a full value-and-gradient
(three passes with its cancellation-free difference) per trial step.

Line search. :math:`\phi(t) = J(W + tP)` is convex (strongly when
``Lambda > 0``), with

.. math::
   \phi'(t) = \frac1N\sum_n \langle \ell'(a_n + t q_n), q_n\rangle + \Lambda(\langle W, P\rangle
     + t\|P\|^2) + \langle b, P\rangle, \qquad
   \phi''(t) = \frac1N\sum_n q_n^\top \ell''(a_n + t q_n) q_n + \Lambda\|P\|^2 ,

both ``O(NC)``. A safeguarded Newton iteration on ``phi'(t) = 0`` (bracketed,
bisection fallback, started at the quasi-Newton step ``t = 1``) stops at the
first ``t`` with ``|phi'(t)| <= c2 |phi'(0)|`` and ``phi(t) - phi(0) <= c1 t
phi'(0)`` (strong Wolfe conditions, Nocedal & Wright 2006, *Numerical
Optimization*, Eq. 3.7). ``c2`` trades search steps against iterations: one
search step costs ``O(NC)`` and one iteration two ``O(NDC)`` passes over ``X``,
so for wide ``X`` (``D >= 256``) a nearly exact search (``c2 = 0.1``: fewer
iterations) is free, while for narrow ``X`` a search step costs about as much
as a pass and the usual quasi-Newton value ``c2 = 0.9`` (Nocedal & Wright,
Sec. 3.1: the first trial step is usually accepted) is faster (MNIST: 41 vs 50
iterations, 2.0 vs 2.3 s with D = 784; 21 vs 15 ms per fit at D = 50, N = 10,000).
``phi(t) - phi(0)`` is evaluated as a difference of per-example losses without
cancellation (the float32 device of
:func:`jaxdp.training.linear.linear_objective_diff`), up to a few-ulp slack.

Direction: the L-BFGS two-loop recursion (Nocedal & Wright 2006, Alg. 7.4)
with memory ``memory_size`` and initial scaling ``s^T y / y^T y`` (Eq. 7.20).

Scores are carried from iteration to iteration (``A <- A + t Q``); their
float32 drift is the round-off of the summed steps, the same order as
recomputing ``X W``. The reported :class:`~jaxdp.training.lbfgs.SolverInfo`
(value, gradient norm, ``converged``) is computed afresh from ``X W`` at the
returned point (one extra pass pair), so it is never a carried quantity.

Privacy: this is an optimiser only. Every private method certifies the point
it releases in float64 (:mod:`jaxdp.training.certified_solve`), so the solver's
float32 round-off never enters a guarantee.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from jaxdp.training.lbfgs import SolverInfo

_EPS32 = float(jnp.finfo(jnp.float32).eps)

# XLA compiler options of every jitted linear-model fit (``jax.jit(...,
# compiler_options=COMPILER_OPTIONS)``). On XLA:CPU (jax 0.10) the YNNPACK
# fusions of the skinny ``N x C`` reductions and matmuls of a small fit are
# slower than XLA's own emitters: with them switched off one softmax fit at
# N = 10,000, D = 50 takes 13-14 ms instead of 16-17 ms, and 100 batched fits
# 0.9 s instead of 1.15 s, while the full-MNIST fit is unchanged (2.0-2.1 s).
# The option is an XLA:CPU debug option; other backends ignore it.
COMPILER_OPTIONS = {"xla_cpu_experimental_ynn_fusion_type": ""}


class _Data(NamedTuple):
  x: jax.Array
  xt: jax.Array  # X^T (D, N), materialised once per solve (see _xt_dot)
  y: jax.Array  # one-hot (N, C) for softmax, signs (N,) for binary losses
  lam: jax.Array
  b: jax.Array
  h: jax.Array


def _matmul(x, w):
  return jnp.matmul(x, w, precision=jax.lax.Precision.HIGHEST)


def _xt_dot(d: _Data, r):
  """``X^T R`` as ``X^T`` (materialised, ``(D, N)``) times ``R``.

  XLA:CPU's dot contracting ``X``'s leading axis (``X^T R`` or ``(R^T X)^T``
  on the stored ``X``) runs at half the speed of a plain ``(D, N) x (N, C)``
  product (jax 0.10, 2 cores: 29 vs 15 ms on MNIST 60,000 x 784, 0.30 vs
  0.18 ms at 10,000 x 50), so each solve keeps one transposed copy of ``X``
  (twice ``X``'s memory during the solve).
  """
  return jnp.matmul(d.xt, r, precision=jax.lax.Precision.HIGHEST)


def _loss_value_and_deriv(a, d: _Data, loss):
  """Per-example loss ``(N,)`` and ``d loss / d scores`` (shape of ``a``)."""
  if loss == "softmax":
    logp = jax.nn.log_softmax(a, axis=-1)
    return -jnp.sum(d.y * logp, axis=-1), jnp.exp(logp) - d.y
  z = d.y * a
  if loss == "logistic":
    return jax.nn.softplus(-z), -d.y * jax.nn.sigmoid(-z)
  h = d.h
  val = jnp.where(z > 1 + h, 0.0, jnp.where(z < 1 - h, 1 - z, (1 + h - z) ** 2 / (4 * h)))
  dz = jnp.where(z > 1 + h, 0.0, jnp.where(z < 1 - h, -1.0, -(1 + h - z) / (2 * h)))
  return val, d.y * dz


def _grad_from_probs(w, probs, d: _Data):
  """Softmax ``grad J(w)`` from ``probs = softmax(X w)``: ``X^T (probs - Y) / N + Lambda w + b``."""
  return _xt_dot(d, probs - d.y) / probs.shape[0] + d.lam * w + d.b


def _objective_and_grad(w, a, d: _Data, loss):
  """``(J(w), grad J(w))`` given the scores ``a = X w`` (one pass: the gradient)."""
  n = a.shape[0]
  val, r = _loss_value_and_deriv(a, d, loss)
  value = jnp.mean(val) + 0.5 * d.lam * jnp.sum(w * w) + jnp.sum(d.b * w)
  grad = _xt_dot(d, r) / n + d.lam * w + d.b
  return value, grad


def _line_terms(t, a, q, aux, d: _Data, loss):
  """``(phi(t) - phi(0) data part, its abs scale, phi'(t) data part, phi''(t) data part)``.

  ``aux`` is the per-iteration precomputation at ``t = 0`` (softmax
  probabilities and the label scores ``y.q``, or binary margins).
  """
  v = t * q
  if loss == "softmax":
    p0, yq = aux
    r = jnp.max(v, axis=-1, keepdims=True)
    em1 = jnp.expm1(v - r)  # <= 0, no overflow
    s = jnp.sum(p0 * em1, axis=-1, keepdims=True)  # in (-1, 0]
    # log sum_c p0_c e^{v_c} = r + log1p(s): no cancellation against log-sum-exp(a).
    # The label's score y.v = t (y.q) uses y.q precomputed once per search: cheaper, and
    # the form jnp.sum(y * v) inside this fusion is miscompiled by XLA:CPU (jax 0.10.2)
    # under jit(vmap) for batches >= 4 (tests/training/test_glm_solver.py, vmap test).
    diff = r[..., 0] + jnp.log1p(s[..., 0]) - t * yq
    p = p0 * (1.0 + em1) / (1.0 + s)
    pq = jnp.sum(p * q, axis=-1)
    d1 = pq - yq
    d2 = jnp.sum(p * q * q, axis=-1) - pq * pq
    return jnp.mean(diff), jnp.mean(jnp.abs(diff)), jnp.mean(d1), jnp.mean(d2)
  z = aux
  dz = d.y * v
  zn = z + dz
  qs = d.y * q
  if loss == "logistic":
    small = jnp.abs(dz) < 10.0
    diff = jnp.where(small, jnp.log1p(jax.nn.sigmoid(-z) * jnp.expm1(-jnp.where(small, dz, 0.0))),
                     jax.nn.softplus(-zn) - jax.nn.softplus(-z))
    sig = jax.nn.sigmoid(-zn)
    d1 = -sig * qs
    d2 = sig * (1.0 - sig) * qs * qs
    return jnp.mean(diff), jnp.mean(jnp.abs(diff)), jnp.mean(d1), jnp.mean(d2)
  h = d.h
  f = lambda u: jnp.where(u > 1 + h, 0.0, jnp.where(u < 1 - h, 1 - u, (1 + h - u) ** 2 / (4 * h)))
  both_quad = (jnp.abs(1.0 - z) <= h) & (jnp.abs(1.0 - zn) <= h)
  both_lin = (z < 1.0 - h) & (zn < 1.0 - h)
  both_zero = (z > 1.0 + h) & (zn > 1.0 + h)
  quad = dz * (dz - 2.0 * (1.0 + h - z)) / (4.0 * h)
  diff = jnp.where(both_quad, quad, jnp.where(both_lin, -dz, jnp.where(both_zero, 0.0,
                                                                      f(zn) - f(z))))
  fp = jnp.where(zn > 1 + h, 0.0, jnp.where(zn < 1 - h, -1.0, -(1 + h - zn) / (2 * h)))
  fpp = jnp.where(jnp.abs(1.0 - zn) <= h, 1.0 / (2 * h), 0.0)
  return jnp.mean(diff), jnp.mean(jnp.abs(diff)), jnp.mean(fp * qs), jnp.mean(fpp * qs * qs)


def _line_search(a, probs, q, w, p, g, d: _Data, loss, *, c1, c2, max_steps):
  """Safeguarded Newton search on ``phi'(t) = 0`` (module docstring). Returns ``(t, dphi, ok)``.

  ``probs`` is ``softmax(a)`` for the softmax loss (carried by the solver), else None.
  """
  if loss == "softmax":
    aux = (probs, jnp.sum(d.y * q, axis=-1))
  else:
    aux = d.y * a
  wp, pp, bp = jnp.sum(w * p), jnp.sum(p * p), jnp.sum(d.b * p)
  slope0 = jnp.sum(g * p)  # phi'(0) < 0 for a descent direction
  dtype = a.dtype

  def evaluate(t):
    df, scale, d1, d2 = _line_terms(t, a, q, aux, d, loss)
    reg = d.lam * (t * wp + 0.5 * t * t * pp) + t * bp
    df = df + reg
    slack = 16.0 * _EPS32 * (scale + jnp.abs(reg))
    return df, slack, d1 + d.lam * (wp + t * pp) + bp, d2 + d.lam * pp

  def cond(c):
    _, _, _, _, k, done, *_ = c
    return (k < max_steps) & ~done

  def body(c):
    t, lo, hi, _, k, _, best_t, best_df, best_ok = c
    df, slack, d1, d2 = evaluate(t)
    finite = jnp.isfinite(df) & jnp.isfinite(d1)
    armijo = finite & (df <= c1 * t * slope0 + slack)
    curv = jnp.abs(d1) <= c2 * jnp.abs(slope0)
    done = armijo & curv
    better = finite & (df <= slack) & (df < best_df)
    best_t = jnp.where(better, t, best_t)
    best_df = jnp.where(better, df, best_df)
    best_ok = best_ok | better
    lo = jnp.where(finite & (d1 < 0), t, lo)
    hi = jnp.where(~finite | (d1 >= 0), t, hi)
    newton = t - d1 / d2
    inside = finite & (d2 > 0) & (newton > lo) & (newton < hi) & jnp.isfinite(newton)
    fallback = jnp.where(jnp.isfinite(hi), 0.5 * (lo + hi), 4.0 * jnp.maximum(t, lo))
    t_next = jnp.where(inside, newton, fallback)
    t_out = jnp.where(done, t, t_next)
    return (t_out, lo, hi, df, k + 1, done, best_t, best_df, best_ok)

  zero = jnp.zeros((), dtype)
  init = (jnp.ones((), dtype), zero, jnp.asarray(jnp.inf, dtype), zero, jnp.asarray(0, jnp.int32),
          jnp.asarray(False), zero, jnp.asarray(jnp.inf, dtype), jnp.asarray(False))
  t, _, _, df, _, done, best_t, best_df, best_ok = jax.lax.while_loop(cond, body, init)
  t = jnp.where(done, t, best_t)
  df = jnp.where(done, df, best_df)
  ok = (done | best_ok) & (slope0 < 0)
  return t, df, ok


def _two_loop(g, s_hist, y_hist, rho, valid, newest, memory_size):
  """L-BFGS two-loop recursion (Nocedal & Wright 2006, Alg. 7.4); ``newest`` = latest slot.

  The valid pairs always form a run of consecutive slots ending at ``newest``
  (pairs are stored in ring order and a reset invalidates all of them), so
  both loops run over the ``count = sum(valid)`` stored pairs only: a fit that
  converges in 12 iterations with ``memory_size = 50`` does 12, not 50, steps
  per loop (the steps are small and sequential, so on a CPU their number, not
  their size, is the cost for small problems).
  """
  count = jnp.sum(valid.astype(jnp.int32))

  def first(i, c):
    qv, alphas = c
    j = (newest - i) % memory_size
    alpha = jnp.where(valid[j], rho[j] * jnp.sum(s_hist[j] * qv), 0.0)
    return qv - alpha * y_hist[j], alphas.at[j].set(alpha)

  qv, alphas = jax.lax.fori_loop(0, count, first, (g, jnp.zeros_like(rho)))
  yy = jnp.sum(y_hist[newest] * y_hist[newest])
  gamma = jnp.where(valid[newest] & (yy > 0), 1.0 / (rho[newest] * yy), 1.0)
  r = gamma * qv

  def second(i, r):
    j = (newest - count + 1 + i) % memory_size
    beta = rho[j] * jnp.sum(y_hist[j] * r)
    return r + jnp.where(valid[j], alphas[j] - beta, 0.0) * s_hist[j]

  return -jax.lax.fori_loop(0, count, second, r)


def minimize_glm(
    x: jax.Array,
    y: jax.Array,
    *,
    loss: str,
    l2_total: float | jax.Array,
    init: jax.Array,
    linear_term: jax.Array | None = None,
    h: float | jax.Array = 0.5,
    max_iter: int = 500,
    tol: float | jax.Array = 1e-6,
    memory_size: int = 50,
    max_linesearch_steps: int = 20,
    patience: int = 50,
    c1: float = 1e-4,
    c2: float | None = None,
) -> tuple[jax.Array, SolverInfo]:
  r"""Minimises the linear-model objective ``J`` (module docstring) by L-BFGS on the scores.

  Same contract as :func:`jaxdp.training.lbfgs.minimize_lbfgs`: stops when
  ``||grad J||_2 <= tol``, at ``max_iter`` iterations, when the line search
  cannot decrease ``J`` (float32 round-off), or after ``patience`` iterations
  without a new smallest gradient norm; jittable and vmappable (over the data,
  ``l2_total``, ``linear_term``, ``tol``).

  Args:
    x: ``(N, D)`` float features.
    y: ``(N,)`` labels: integers in ``[0, C)`` (softmax) or ``{0, 1}``/``{-1, 1}``.
    loss: ``"softmax"``, ``"logistic"`` or ``"huber"`` (static).
    l2_total: ``Lambda >= 0``, the total L2 coefficient.
    init: starting weights, ``(D, C)`` (softmax) or ``(D,)``; fixes the shape.
    linear_term: ``b`` with the weights' shape, or None.
    h: Huberized-hinge width.
    max_iter, tol, memory_size, patience: as in :func:`~jaxdp.training.lbfgs.minimize_lbfgs`.
    max_linesearch_steps: cap on ``O(NC)`` line-search steps per iteration (static).
    c1, c2: strong Wolfe constants (static); ``c2=None``: 0.1 when ``D >= 256``, else 0.9
      (module docstring).

  Returns:
    ``(weights, SolverInfo)``; ``SolverInfo`` is evaluated afresh at ``weights``.
  """
  if int(max_iter) < 0:
    raise ValueError(f"max_iter must be >= 0, got {max_iter}.")
  if c2 is None:
    c2 = 0.1 if x.shape[-1] >= 256 else 0.9
  if not 0 < c1 < c2 < 1:
    raise ValueError(f"need 0 < c1 < c2 < 1, got c1={c1}, c2={c2}.")
  dtype = x.dtype
  w0 = jnp.asarray(init, dtype)
  if loss == "softmax":
    yv = jax.nn.one_hot(y, w0.shape[-1], dtype=dtype)
  else:
    yv = jnp.where(y > 0, 1.0, -1.0).astype(dtype)
  b = jnp.zeros_like(w0) if linear_term is None else jnp.broadcast_to(
      jnp.asarray(linear_term, dtype), w0.shape)
  # The barrier keeps XLA from folding the transpose back into the dot (see _xt_dot).
  xt = jax.lax.optimization_barrier(jnp.transpose(x))
  d = _Data(x, xt, yv, jnp.asarray(l2_total, dtype), b, jnp.asarray(h, dtype))
  tol = jnp.asarray(tol, dtype)
  m = int(memory_size)

  a0 = _matmul(x, w0)
  if loss == "softmax":  # the probabilities at the start serve the gradient and the first search
    probs0 = jax.nn.softmax(a0, axis=-1)
    g0 = _grad_from_probs(w0, probs0, d)
  else:
    probs0 = None
    _, g0 = _objective_and_grad(w0, a0, d, loss)
  hist = jnp.zeros((m,) + w0.shape, dtype)
  # L-BFGS memory: s and y pairs, rho = 1/s^T y, validity, index of the newest slot.
  history = (hist, hist, jnp.zeros((m,), dtype), jnp.zeros((m,), bool),
             jnp.asarray(m - 1, jnp.int32))

  def cond(c):
    g, k, moved, stale = c[3], c[9], c[10], c[12]
    return (k < max_iter) & (jnp.linalg.norm(g) > tol) & moved & (stale < patience)

  def body(c):
    w, a, probs, g, s_hist, y_hist, rho, valid, newest, k, _, best, stale = c
    p = _two_loop(g, s_hist, y_hist, rho, valid, newest, m)
    descent = jnp.sum(p * g) < 0
    p = jnp.where(descent, p, -g)  # round-off broke the curvature pairs: steepest descent
    valid = valid & descent
    q = _matmul(x, p)
    t, _, ok = _line_search(a, probs, q, w, p, g, d, loss, c1=c1, c2=c2,
                            max_steps=max_linesearch_steps)
    s = t * p
    w_new = w + s
    a_new = a + t * q
    if loss == "softmax":
      # One softmax per iteration: the gradient here and the next line search share it.
      # (Fresh from the scores: updating the probabilities multiplicatively along the
      # search would drift, and a class whose probability underflowed could never return.)
      probs_new = jax.nn.softmax(a_new, axis=-1)
      g_new = _grad_from_probs(w_new, probs_new, d)
    else:
      probs_new = None
      _, g_new = _objective_and_grad(w_new, a_new, d, loss)
    yv_ = g_new - g
    sy = jnp.sum(s * yv_)
    store = ok & (sy > _EPS32 * jnp.sqrt(jnp.sum(s * s) * jnp.sum(yv_ * yv_)))
    slot = (newest + 1) % m
    s_hist = jnp.where(store, s_hist.at[slot].set(s), s_hist)
    y_hist = jnp.where(store, y_hist.at[slot].set(yv_), y_hist)
    rho = jnp.where(store, rho.at[slot].set(1.0 / jnp.where(sy > 0, sy, 1.0)), rho)
    valid = jnp.where(store, valid.at[slot].set(True), valid)
    newest = jnp.where(store, slot, newest)
    keep = lambda new, old: jnp.where(ok, new, old)
    g_out = keep(g_new, g)
    gnorm = jnp.linalg.norm(g_out)
    improved = gnorm < best
    probs_out = None if probs is None else keep(probs_new, probs)
    return (keep(w_new, w), keep(a_new, a), probs_out, g_out, s_hist, y_hist, rho, valid, newest,
            k + 1, ok, jnp.minimum(gnorm, best), jnp.where(improved, 0, stale + 1))

  carry = (w0, a0, probs0, g0, *history, jnp.asarray(0, jnp.int32), jnp.asarray(True),
           jnp.linalg.norm(g0), jnp.asarray(0, jnp.int32))
  out = jax.lax.while_loop(cond, body, carry)
  w, k = out[0], out[9]
  value, grad = _objective_and_grad(w, _matmul(x, w), d, loss)  # fresh, not carried
  gnorm = jnp.linalg.norm(grad)
  return w, SolverInfo(converged=gnorm <= tol, num_iter=k, grad_norm=gnorm, value=value)
