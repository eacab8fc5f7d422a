"""Shared machinery of the strategy optimisers: argument checks and L-BFGS on log(loss).

The optimisers of :mod:`.optimize_toeplitz` (BandMF, BLT) and
:mod:`.optimize_banded` (column-normalised banded) minimise the expected error
``sens(C)^2 * err(A C^{-1})`` of :mod:`.optimize` over different families of
strategies C. They validate the same arguments (steps, momentum, learning
rates, participations, separation, error kind, solver settings) and drive the
same solver: SciPy's L-BFGS-B on ``log(loss)``, because the loss spans many
orders of magnitude (a trial step can make C nearly singular) and a line
search on the raw value would stop at the start. :func:`_pattern_steps` is the
participation pattern at which the exact sensitivity is evaluated (k
participations b steps apart, from step 0).
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import scipy.optimize

from jaxdp import _validation
from jaxdp.dpsgd.correlated import workloads as _work


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


def _pattern_steps(n: int, k: int, b: int) -> np.ndarray:
  return np.arange(min(k, -(-n // b))) * b


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


def _check_banded(num_steps, bands, momentum, learning_rates, max_participations,
                  min_separation, error, max_iterations, tol, *, why: str):
  """The checks of the banded optimisers; b defaults to ``bands`` (1 for one participation).

  Returns ``(n, beta, eta, k, b, error, bands, max_iterations, tol)`` with ``k`` capped at
  ``ceil(n / b)``; ``why`` ends the message refusing ``b < bands`` with several participations.
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
                     f"participate more than once: {why}")
  return n, beta, eta, k, b, error, bands, max_iterations, tol
