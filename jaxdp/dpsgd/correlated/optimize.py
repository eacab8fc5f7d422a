r"""Optimised strategies for the matrix mechanism, and their expected error.

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
``sqrt(expected_error(..., error="mean"))``. :func:`expected_error` evaluates
it for any strategy. ``L`` is invariant to rescaling C, so every optimiser
fixes the diagonal (``c_0 = 1``, or unit columns).

The optimisers, all in float64 with L-BFGS on log(L), live in one module per
family and are re-exported here:

* :mod:`.optimize_toeplitz` -- :func:`optimize_bandmf` (banded Toeplitz, from
  the square-root factorization, :func:`square_root_coefs`) and
  :func:`optimize_blt` (buffered linear Toeplitz, several starts so buffers
  do not merge);
* :mod:`.optimize_banded` -- :func:`optimize_column_normalized_banded`
  (general banded C with unit columns, explicit gradient by banded solves);
* :mod:`.optimize_solver` -- the argument checks and the L-BFGS driver they
  share.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxdp.dpsgd.correlated import sensitivity as _sens
from jaxdp.dpsgd.correlated import workloads as _work
from jaxdp.dpsgd.correlated.optimize_banded import (  # pylint: disable=unused-import
    _banded_row_errors, _cnb_value_and_grad, optimize_column_normalized_banded)
from jaxdp.dpsgd.correlated.optimize_solver import _check_common
from jaxdp.dpsgd.correlated.optimize_toeplitz import (optimize_bandmf, optimize_blt,
                                                      square_root_coefs)
from jaxdp.dpsgd.correlated.strategies import ColumnNormalizedBanded, Strategy


def expected_error(strategy, num_steps, *, momentum=0.0, learning_rates=None,
                   max_participations=1, min_separation=1, error="total") -> float:
  """``sens(C)^2 * err(A C^{-1})`` for a Toeplitz strategy (float64), see the module docstring.

  Args:
    strategy: :class:`BandMF`, :class:`BLT` or :class:`ColumnNormalizedBanded`.
    num_steps: n (at most ``strategy.max_steps``).
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
  if not isinstance(strategy, Strategy):
    raise TypeError(f"strategy must be a BandMF, BLT or ColumnNormalizedBanded, got "
                    f"{type(strategy).__name__}.")
  n = strategy.check_num_steps(n)
  sens = _sens.sensitivity(strategy, n, max_participations=k, min_separation=b)
  if isinstance(strategy, ColumnNormalizedBanded):
    a_t = _work.sgd_workload(n, momentum=beta, learning_rates=eta).T
    with jax.enable_x64(True):
      per_row = np.asarray(_banded_row_errors(jnp.asarray(strategy.band_table(n)),
                                              jnp.asarray(a_t)))
    err = {"total": per_row.sum(), "mean": per_row.sum() / n, "max": per_row.max()}[error]
    return sens * sens * float(err)
  c = np.asarray(strategy.coefficients(n), np.float64)
  with jax.enable_x64(True):
    d = np.asarray(_inverse_jit(jnp.asarray(c, jnp.float64)))
  err = float(_work.workload_error(d, momentum=beta, learning_rates=eta, kind=error))
  return sens * sens * err


_inverse_jit = jax.jit(_work.toeplitz_inverse)


__all__ = ["expected_error", "optimize_blt", "optimize_bandmf",
           "optimize_column_normalized_banded", "square_root_coefs"]
