r"""Optimised BandMF and BLT strategies, and their expected error.

The expected squared error of the matrix mechanism with strategy C, noise
multiplier 1 and clipping norm 1 is (Choquette-Choo et al. 2023, "Multi-epoch
matrix factorization mechanisms for private machine learning", Eq. (3);
McKenna 2024, "Scaling up the banded matrix factorization mechanism", Sec. 2)

  L(C) = sens(C)^2 * err(A C^{-1}),

with ``sens`` from :mod:`.sensitivity` and ``err`` one of the three norms of
:mod:`.workloads` (``"total"`` = ``||A C^{-1}||_F^2``, ``"mean"`` = that over
n, ``"max"`` = the largest squared row norm). The ``"mean"`` and ``"max"``
values are JAX Privacy's ``mean_error`` / ``max_error`` losses
(``sens^2 * error``); the RMSE that McKenna 2024 reports is
``sqrt(expected_error(..., error="mean"))``. ``L`` is invariant to rescaling C,
so the diagonal is fixed to ``c_0 = 1``.

Both families are optimised in float64 (inside ``jax.enable_x64(True)``; the
global flag is left as it is) with L-BFGS (SciPy's L-BFGS-B driving a jitted
``value_and_grad`` of L, normalised by its value at the start):

* :func:`optimize_bandmf` -- ``c_1..c_{bands-1}`` free, initialised at the
  square-root factorization ``r_j = binom(2j, j) / 4^j`` truncated to the
  bands (Fichtenberger, Henzinger & Upadhyay 2023, "Constant matters:
  fine-grained error bound on differentially private continual observation";
  Henzinger, Upadhyay & Upadhyay 2023). With several participations the
  separation must be at least ``bands``, where the sensitivity is exactly
  ``sum_{m<k} ||C[:, m b]||^2`` (the ``"orthogonal"`` case).
* :func:`optimize_blt` -- ``theta_i = sigmoid(a_i)`` in (0, 1) and
  ``omega = softmax(w)[:buffers]`` (so ``omega >= 0`` and ``sum(omega) < 1``):
  the coefficients are then nonnegative and non-increasing and the
  ``"monotone"`` sensitivity ``||C 1_q||^2`` is exact. Initialised by a
  nonnegative least-squares fit of ``omega`` to the square-root coefficients on
  a log-spaced grid of ``theta``.

The workload error uses :func:`.workloads.toeplitz_inverse` (Newton iteration
with FFTs) and the O(n log n) (constant learning rate) or O(n^2) (schedule)
error evaluation, so one evaluation at n = 2000 takes about a millisecond.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import scipy.optimize

from jaxdp import _validation
from jaxdp.dpsgd.correlated import sensitivity as _sens
from jaxdp.dpsgd.correlated import workloads as _work
from jaxdp.dpsgd.correlated.strategies import BLT, BandMF


def square_root_coefs(num_steps) -> np.ndarray:
  """Coefficients of the square root of the prefix-sum matrix, ``r_j = binom(2j, j) / 4^j`` (float64).

  ``r_0 = 1``, ``r_j = r_{j-1} (2j - 1) / (2j)``; the Toeplitz ``R`` has
  ``R R = S`` (Fichtenberger et al. 2023; Henzinger et al. 2023).
  """
  n = _validation.check_positive_int(num_steps, "num_steps")
  j = np.arange(1, n, dtype=np.float64)
  return np.concatenate([[1.0], np.cumprod((2 * j - 1) / (2 * j))])


def _check_common(num_steps, momentum, learning_rates, max_participations, min_separation,
                  error):
  n = _validation.check_positive_int(num_steps, "num_steps")
  beta = _work.check_momentum(momentum)
  eta = _work.check_learning_rates(learning_rates, n)
  k = _validation.check_positive_int(max_participations, "max_participations")
  if min_separation is not None:
    min_separation = _validation.check_positive_int(min_separation, "min_separation")
  error = _work.check_error_kind(error)
  return n, beta, eta, k, min_separation, error


def _check_solver(max_iterations, tol):
  max_iterations = _validation.check_positive_int(max_iterations, "max_iterations")
  tol = _validation.check_positive(tol, "tol")
  return max_iterations, tol


def expected_error(strategy, num_steps, *, momentum=0.0, learning_rates=None,
                   max_participations=1, min_separation=1, error="total") -> float:
  """``sens(C)^2 * err(A C^{-1})`` for a Toeplitz strategy (float64), see the module docstring.

  Args:
    strategy: :class:`BandMF` or :class:`BLT`.
    num_steps: n.
    momentum: ``beta`` in [0, 1).
    learning_rates: length-n positive rates, or None (constant 1).
    max_participations: k.
    min_separation: b.
    error: ``"total"``, ``"mean"`` or ``"max"``.

  Returns:
    The expected squared error (``"total"``: summed over the n steps;
    ``"mean"``: per step; ``"max"``: the worst step). Uses the exact
    sensitivity where :func:`.sensitivity.sensitivity_case` is exact, else its
    upper bound.
  """
  n, beta, eta, k, b, error = _check_common(num_steps, momentum, learning_rates,
                                            max_participations, min_separation, error)
  if b is None:
    raise ValueError("min_separation must be an integer >= 1, got None.")
  sens = _sens.sensitivity(strategy, n, max_participations=k, min_separation=b)
  c = np.asarray(strategy.coefficients(n), np.float64)
  with jax.enable_x64(True):
    d = np.asarray(_inverse_jit(jnp.asarray(c, jnp.float64)))
  err = float(_work.workload_error(d, momentum=beta, learning_rates=eta, kind=error))
  return sens * sens * err


_inverse_jit = jax.jit(_work.toeplitz_inverse)


def _pattern_steps(n: int, k: int, b: int) -> np.ndarray:
  return np.arange(min(k, -(-n // b))) * b


# ---------------------------------------------------------------------------
# BandMF


def _bandmf_loss(x, eta, *, n, beta, kind, steps):
  c = jnp.zeros(n, x.dtype).at[0].set(1.0).at[1:1 + x.shape[0]].set(x)
  col_norm2 = jnp.cumsum(c * c)[::-1]  # ||C[:, i]||^2
  sens2 = jnp.sum(col_norm2[np.asarray(steps)])
  d = _work.toeplitz_inverse(c)
  return sens2 * _work._workload_error_impl(d, beta, eta, kind)  # pylint: disable=protected-access


@functools.partial(jax.jit, static_argnames=("n", "beta", "kind", "steps"))
def _bandmf_value_and_grad(x, eta, scale, *, n, beta, kind, steps):
  value, grad = jax.value_and_grad(_bandmf_loss)(x, eta, n=n, beta=beta, kind=kind, steps=steps)
  return value / scale, grad / scale


def _lbfgs(value_and_grad, x0, max_iterations, tol):
  # L-BFGS on log(loss): the loss spans many orders of magnitude (a trial step can make C
  # nearly singular, loss ~1e58), and a line search on the raw value would stop at x0.
  def fun(x):
    v, g = value_and_grad(jnp.asarray(x, jnp.float64))
    v = float(v)
    if not (np.isfinite(v) and v > 0):
      return np.inf, np.zeros_like(np.asarray(x, np.float64))
    return math.log(v), np.asarray(g, np.float64) / v

  res = scipy.optimize.minimize(fun, np.asarray(x0, np.float64), jac=True, method="L-BFGS-B",
                                options={"maxiter": max_iterations, "ftol": tol,
                                         "gtol": tol, "maxcor": 20})
  x = np.asarray(res.x, np.float64)
  if not np.all(np.isfinite(x)):
    raise RuntimeError("strategy optimisation diverged (non-finite parameters).")
  return x


def optimize_bandmf(num_steps, bands, *, momentum=0.0, learning_rates=None, max_participations=1,
                    min_separation=None, error="total", max_iterations=500,
                    tol=1e-10) -> BandMF:
  """The BandMF strategy minimising ``sens(C)^2 * err(A C^{-1})`` (module docstring).

  Args:
    num_steps: n, the number of training steps.
    bands: number of bands (``1 <= bands <= n``); one band is DP-SGD.
    momentum: ``beta`` in [0, 1) folded into the workload.
    learning_rates: length-n positive rates, or None (constant 1).
    max_participations: k, the most steps one example takes part in.
    min_separation: b, steps between two participations. Default ``bands``
      when ``k > 1`` (and irrelevant for ``k = 1``). Must be ``>= bands`` when
      ``k > 1`` (and more than one participation fits): the exact sensitivity
      used here needs columns at distance ``>= b`` to be orthogonal.
    error: ``"total"``/``"mean"`` (same optimum) or ``"max"``.
    max_iterations: L-BFGS iteration cap.
    tol: relative tolerance on the (normalised) loss decrease and gradient.

  Returns:
    ``BandMF`` with ``coefs[0] = 1``.
  """
  n, beta, eta, k, b, error = _check_common(num_steps, momentum, learning_rates,
                                            max_participations, min_separation, error)
  bands = _validation.check_positive_int(bands, "bands")
  if bands > n:
    raise ValueError(f"bands must be <= num_steps ({n}), got {bands}.")
  max_iterations, tol = _check_solver(max_iterations, tol)
  if b is None:
    b = bands if k > 1 else 1
  k = min(k, -(-n // b))
  if k > 1 and b < bands:
    raise ValueError(f"min_separation ({b}) must be >= bands ({bands}) when an example can "
                     "participate more than once: BandMF's exact sensitivity needs it.")
  if bands == 1:
    return BandMF.dp_sgd()
  steps = tuple(int(s) for s in _pattern_steps(n, k, b))
  x0 = square_root_coefs(bands)[1:]
  with jax.enable_x64(True):
    eta_j = None if eta is None else jnp.asarray(eta, jnp.float64)
    kw = dict(n=n, beta=beta, kind=error, steps=steps)
    scale = float(_bandmf_value_and_grad(jnp.asarray(x0), eta_j, 1.0, **kw)[0])
    vg = lambda x: _bandmf_value_and_grad(x, eta_j, scale, **kw)
    x = _lbfgs(vg, x0, max_iterations, tol)
  return BandMF(np.concatenate([[1.0], x]))


# ---------------------------------------------------------------------------
# BLT


def _blt_params(p, buffers):
  theta = jax.nn.sigmoid(p[:buffers])
  omega = jax.nn.softmax(p[buffers:])[:buffers]
  return theta, omega


def _blt_coefs(theta, omega, n):
  j = jnp.arange(n - 1, dtype=theta.dtype)
  powers = jnp.exp(j[:, None] * jnp.log(theta)[None, :])
  return jnp.concatenate([jnp.ones(1, theta.dtype), powers @ omega])


def _blt_loss(p, eta, *, n, buffers, beta, kind, steps):
  theta, omega = _blt_params(p, buffers)
  c = _blt_coefs(theta, omega, n)
  if len(steps) == 1:
    sens2 = jnp.sum(c * c)
  else:  # "monotone" case: ||C 1_q||^2
    q = np.zeros(n)
    q[np.asarray(steps)] = 1.0
    v = _work._fft_conv(c, jnp.asarray(q, c.dtype), n)  # pylint: disable=protected-access
    sens2 = jnp.sum(v * v)
  d = _work.toeplitz_inverse(c)
  return sens2 * _work._workload_error_impl(d, beta, eta, kind)  # pylint: disable=protected-access


@functools.partial(jax.jit, static_argnames=("n", "buffers", "beta", "kind", "steps"))
def _blt_value_and_grad(p, eta, scale, *, n, buffers, beta, kind, steps):
  value, grad = jax.value_and_grad(_blt_loss)(p, eta, n=n, buffers=buffers, beta=beta, kind=kind,
                                              steps=steps)
  return value / scale, grad / scale


def _blt_init(n: int, buffers: int) -> np.ndarray:
  """Logits of a BLT fitted to the square-root coefficients (nonnegative least squares)."""
  target = square_root_coefs(n)[1:]
  gaps = np.logspace(np.log10(1.0 / max(n, 4)), np.log10(0.5), buffers)  # 1 - theta_i
  theta = 1.0 - gaps
  design = theta[None, :] ** np.arange(n - 1)[:, None]
  if n > 1:
    omega, _ = scipy.optimize.nnls(design, target)
  else:
    omega = np.full(buffers, 0.5 / buffers)
  omega = np.maximum(omega, 1e-6)
  total = omega.sum()
  if total > 0.99:
    omega *= 0.99 / total
  logits_w = np.concatenate([np.log(omega), [np.log(1.0 - omega.sum())]])
  logits_theta = np.log(theta) - np.log1p(-theta)
  return np.concatenate([logits_theta, logits_w])


def optimize_blt(num_steps, buffers, *, momentum=0.0, learning_rates=None, max_participations=1,
                 min_separation=None, error="total", max_iterations=500, tol=1e-10) -> BLT:
  """The BLT strategy (``theta`` in (0,1), ``omega >= 0``, ``sum(omega) < 1``) minimising the loss.

  Args:
    num_steps: n.
    buffers: number of buffers (>= 1).
    momentum, learning_rates, error, max_iterations, tol: as
      :func:`optimize_bandmf`.
    max_participations: k.
    min_separation: b; default 1 (any k steps), the weakest assumption. The
      sensitivity is exact for every b (``"monotone"`` case).

  Returns:
    ``BLT(theta, omega)``.
  """
  n, beta, eta, k, b, error = _check_common(num_steps, momentum, learning_rates,
                                            max_participations, min_separation, error)
  buffers = _validation.check_positive_int(buffers, "buffers")
  max_iterations, tol = _check_solver(max_iterations, tol)
  if b is None:
    b = 1
  steps = tuple(int(s) for s in _pattern_steps(n, k, b))
  p0 = _blt_init(n, buffers)
  with jax.enable_x64(True):
    eta_j = None if eta is None else jnp.asarray(eta, jnp.float64)
    kw = dict(n=n, buffers=buffers, beta=beta, kind=error, steps=steps)
    scale = float(_blt_value_and_grad(jnp.asarray(p0), eta_j, 1.0, **kw)[0])
    vg = lambda p: _blt_value_and_grad(p, eta_j, scale, **kw)
    p = _lbfgs(vg, p0, max_iterations, tol)
    theta, omega = (np.asarray(a, np.float64) for a in _blt_params(jnp.asarray(p), buffers))
  theta = np.clip(theta, np.finfo(np.float64).tiny, 1.0 - np.finfo(np.float64).epsneg)
  return BLT(theta, omega)


__all__ = ["expected_error", "optimize_blt", "optimize_bandmf", "square_root_coefs"]
