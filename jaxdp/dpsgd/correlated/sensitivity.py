r"""L2 sensitivity of a strategy matrix C under min-separation participation.

The matrix mechanism releases ``C x + z``. A user's example contributes a
vector ``u_i`` (norm <= 1 after clipping) to the gradient of each step ``i`` it
participates in. Under (k, b)-participation (Choquette-Choo et al. 2023,
"Multi-epoch matrix factorization mechanisms for private machine learning",
Sec. 2; McKenna 2024, "Scaling up the banded matrix factorization mechanism")
the participation pattern ``pi`` is any set of at most ``k`` steps in
``{0, ..., n-1}``, any two at least ``b`` apart, and

  sens(C) = max_pi max_{||u_i|| <= 1} || sum_{i in pi} C[:, i] u_i^T ||_F.

With ``X = C^T C`` the squared norm is ``sum_{i, j in pi} X_ij <u_i, u_j>``.
At most ``ceil(n / b)`` steps fit in a pattern (:func:`max_participations`), so
a larger ``max_participations`` is clamped to it (it describes the same set of
patterns).

Which rule is used (:func:`sensitivity_case` names it):

* ``"single"`` -- ``k = 1``: ``sens^2 = max_i X_ii`` (the largest column norm;
  column 0 for a Toeplitz C). Exact.
* ``"orthogonal"`` -- columns at distance ``>= b`` are orthogonal (a banded C
  with ``bands <= b``): the cross terms vanish, so ``sens^2`` is the largest
  ``sum_{i in pi} X_ii`` (exact, any signs). For Toeplitz C the column norms
  ``X_ii = sum_{u < n-i} c_u^2`` do not increase with i, so the pattern
  ``0, b, ..., (k-1) b`` is a maximiser; for a dense C a dynamic program over
  the columns finds the maximiser.
* ``"monotone"`` -- X is elementwise >= 0 and, on and above the diagonal,
  non-increasing along rows (``X_ij >= X_{i,j+1}``) and along diagonals
  (``X_ij >= X_{i+1,j+1}``). Then ``sens^2 = 1_q^T X 1_q = ||C 1_q||^2`` with
  ``q = {0, b, ..., (k-1) b}``. Exact. Proof: with ``X >= 0`` all
  ``u_i`` equal is a maximiser, so ``sens^2 = max_pi sum_{i,j in pi} X_ij``.
  Sort ``pi = {p_1 < ... < p_m}`` (``m <= k``) and let ``q_l = (l-1) b``.
  Then ``p_l >= q_l`` and, for ``l < m'``, ``p_{m'} - p_l >= q_{m'} - q_l``;
  ``(q_l, q_{m'})`` reaches ``(p_l, p_{m'})`` by ``p_l - q_l`` diagonal steps
  and then ``(p_{m'} - p_l) - (q_{m'} - q_l)`` row steps, none increasing X,
  so ``X_{p_l p_{m'}} <= X_{q_l q_{m'}}`` term by term; the remaining
  ``k - m`` elements of q only add nonnegative terms. A lower-triangular
  Toeplitz C with coefficients ``c_0 >= c_1 >= ... >= 0`` satisfies the
  condition: ``X_ij = sum_{u=0}^{n-1-j} c_u c_{u+j-i}`` for ``i <= j`` is a
  sum of nonnegative terms that loses terms as ``max(i, j)`` grows and whose
  terms shrink as ``|i - j|`` grows with ``max(i, j)`` fixed. This covers BLTs
  with ``theta`` in (0, 1), ``omega >= 0`` and ``sum(omega) <= 1``, and every
  nonnegative non-increasing BandMF. (JAX Privacy's
  ``toeplitz.minsep_sensitivity_squared`` uses the same worst-case pattern for
  such Toeplitz strategies, citing arXiv:2405.13763, Theorem 2; the proof here
  is self-contained.)
* ``"bound"`` -- otherwise (signed or increasing coefficients with cross
  terms): an upper bound, never smaller than the true sensitivity.
  ``sens^2 <= max_pi sum_{i,j in pi} |X_ij| <= sum of the k largest r_i`` with
  ``r_i = |X_ii| + (sum of the k-1 largest |X_ij|, |i - j| >= b)`` (each row of
  a pattern has at most k-1 other members, all at distance >= b), and also
  ``sens <= sum of the k largest column norms`` (triangle inequality); the
  smaller of the two is returned. Calibrating noise to a bound is private, but
  may add more noise than needed.

A :class:`~.strategies.ColumnNormalizedBanded` (banded, not Toeplitz) uses the
same rules on its column norms and its banded ``X``: ``"single"`` (the largest
column norm, 1), ``"orthogonal"`` when ``bands <= b`` (the dynamic program over
its column norms; ``k`` for unit columns and ``n`` steps, so
``sens = sqrt(k)``), else the dense rules (``"monotone"`` test, ``"bound"``) on
``X`` for n up to 4096 and the ``"bound"`` from row blocks of the banded ``X``
above.

The ``"monotone"`` test and the orthogonality test use exact comparisons (no
tolerance), so round-off can only move a strategy to a case that is valid for
it (``"bound"`` is valid for every C). Everything is float64 numpy (a strategy
is public: it depends on no data).
"""

from __future__ import annotations

import math

import numpy as np

from jaxdp import _validation
from jaxdp.dpsgd.correlated import strategies as _strategies
from jaxdp.dpsgd.correlated.participation import max_participations  # ceil(n / b)

_BLOCK_ROWS = 256
_DENSE_GRAM_MAX_N = 4096  # X as one n x n float64 array up to this n (128 MiB)


def _check_participation(num_steps, max_participations_, min_separation) -> tuple[int, int, int]:
  n = _validation.check_positive_int(num_steps, "num_steps")
  k = _validation.check_positive_int(max_participations_, "max_participations")
  b = _validation.check_positive_int(min_separation, "min_separation")
  return n, min(k, max_participations(n, b)), b


def _max_separated_sum(col_norm2: np.ndarray, k: int, b: int) -> float:
  """Largest sum of at most k entries of ``col_norm2``, pairwise >= b apart (dynamic program).

  From the last column: ``best[i, m]`` = the best total of <= m picks among columns i..n-1.
  """
  n = col_norm2.shape[0]
  best = np.zeros((n + b + 1, k + 1))
  for i in range(n - 1, -1, -1):
    take = col_norm2[i] + best[i + b, :-1]
    best[i, 1:] = np.maximum(best[i + 1, 1:], take)
  return float(best[0, k])


def _banded_gram(table: np.ndarray) -> np.ndarray:
  """``G[i, l] = X[i, i + l]`` (``X = C^T C``, lags ``l < bands``) of the banded C with ``table[t, r] = C[t + r, t]``.

  ``X[i, i + l] = sum_r C[i + l + r, i] C[i + l + r, i + l] = sum_r table[i, r + l] table[i + l, r]``.
  """
  n, bands = table.shape
  g = np.zeros((n, bands))
  for lag in range(min(bands, n)):
    g[:n - lag, lag] = np.sum(table[:n - lag, lag:] * table[lag:, :bands - lag], axis=1)
  return g


def _banded_gram_rows(g: np.ndarray, rows: np.ndarray, n: int) -> np.ndarray:
  """Rows ``rows`` of the symmetric banded X (all n columns) from :func:`_banded_gram`."""
  bands = g.shape[1]
  j = np.arange(n)[None, :]
  i = rows[:, None]
  lag = np.abs(i - j)
  lo = np.minimum(i, j)
  vals = g[np.clip(lo, 0, n - 1), np.clip(lag, 0, bands - 1)]
  return np.where(lag < bands, vals, 0.0)


def _column_normalized_banded_sensitivity_squared(strategy, n: int, k: int,
                                                  b: int) -> tuple[float, str]:
  table = strategy.band_table(n)
  col_norm2 = np.sum(table * table, axis=1)
  if k == 1:
    return float(col_norm2.max()), "single"
  nonzero = np.flatnonzero(np.any(table != 0, axis=0))
  width = int(nonzero[-1]) + 1 if nonzero.size else 1
  if width <= b:
    return _max_separated_sum(col_norm2, k, b), "orthogonal"
  if n <= _DENSE_GRAM_MAX_N:
    return _dense_sensitivity_squared(strategy.matrix(n), k, b)
  g = _banded_gram(table)
  blocks = [np.arange(s, min(s + _BLOCK_ROWS, n)) for s in range(0, n, _BLOCK_ROWS)]
  rows = ((rows, _banded_gram_rows(g, rows, n)) for rows in blocks)
  return _bound_from_rows(rows, col_norm2, k, b), "bound"


def _strategy_coefficients(strategy, n: int) -> np.ndarray:
  coefficients = getattr(strategy, "coefficients", None)
  if not callable(coefficients):
    raise TypeError("strategy must be a Toeplitz strategy with a coefficients(n) method "
                    f"(BandMF or BLT), got {type(strategy).__name__}.")
  c = np.asarray(coefficients(n), dtype=np.float64)
  if c.shape != (n,) or not np.all(np.isfinite(c)):
    raise ValueError(f"strategy.coefficients({n}) must be {n} finite numbers.")
  return c


def _pattern_vector(n: int, k: int, b: int) -> np.ndarray:
  v = np.zeros(n)
  v[np.arange(k) * b] = 1.0
  return v


def _toeplitz_gram_table(c: np.ndarray, width: int) -> np.ndarray:
  """``T[l, L] = sum_{u < L} c_u c_{u+l}`` for lags ``l < width``, ``L = 0..n``.

  ``X_ij = T[|i-j|, n - max(i, j)]`` for Toeplitz C (entries with ``u + l >= n``
  are zero).
  """
  n = c.shape[0]
  lag = np.arange(width)[:, None]
  u = np.arange(n)[None, :]
  shifted = np.where(u + lag < n, c[np.clip(u + lag, 0, n - 1)], 0.0)
  table = np.zeros((width, n + 1))
  table[:, 1:] = np.cumsum(c[None, :] * shifted, axis=1)
  return table


def _toeplitz_gram_rows(table: np.ndarray, rows: np.ndarray, n: int) -> np.ndarray:
  """Rows ``rows`` of ``X = C^T C`` (all n columns) from the table."""
  width = table.shape[0]
  j = np.arange(n)[None, :]
  i = rows[:, None]
  lag = np.abs(i - j)
  length = n - np.maximum(i, j)
  vals = table[np.clip(lag, 0, width - 1), length]
  return np.where(lag < width, vals, 0.0)


def _bound_from_rows(row_iter, col_norm2: np.ndarray, k: int, b: int) -> float:
  """The ``"bound"`` rule (module docstring) from blocks of rows of X."""
  n = col_norm2.shape[0]
  r = np.empty(n)
  for rows, block in row_iter:
    a = np.abs(block)
    diag = a[np.arange(len(rows)), rows]
    far = np.abs(rows[:, None] - np.arange(n)[None, :]) >= b
    a = np.where(far, a, 0.0)
    if k - 1 >= n:
      top = a.sum(axis=1)
    elif k > 1:
      top = -np.partition(-a, k - 2, axis=1)[:, :k - 1].sum(axis=1)
    else:
      top = np.zeros(len(rows))
    r[rows] = diag + top
  bound_abs = np.sort(r)[::-1][:k].sum()
  bound_triangle = np.sort(np.sqrt(col_norm2))[::-1][:k].sum() ** 2
  return float(min(bound_abs, bound_triangle))


def _is_monotone_gram(x: np.ndarray) -> bool:
  """Exact test of the ``"monotone"`` condition on a dense X."""
  upper = np.triu(np.ones(x.shape, bool))
  if np.any(x[upper] < 0):
    return False
  row_ok = np.all(np.where(upper[:, :-1], x[:, :-1] >= x[:, 1:], True))
  diag_ok = np.all(np.where(upper[:-1, :-1], x[:-1, :-1] >= x[1:, 1:], True))
  return bool(row_ok and diag_ok)


def _toeplitz_sensitivity_squared(c: np.ndarray, k: int, b: int) -> tuple[float, str]:
  n = c.shape[0]
  col_norm2 = np.cumsum(c * c)[::-1]  # ||C[:, i]||^2 = sum_{u < n-i} c_u^2
  if k == 1:
    return float(col_norm2[0]), "single"
  nonzero = np.flatnonzero(c)
  width = int(nonzero[-1]) + 1 if nonzero.size else 1  # effective number of bands
  if width <= b:
    return float(col_norm2[np.arange(k) * b].sum()), "orthogonal"
  pattern = _pattern_vector(n, k, b)
  if np.all(c >= 0) and np.all(np.diff(c) <= 0):
    v = np.convolve(c, pattern)[:n]  # C 1_q
    return float(v @ v), "monotone"
  table = _toeplitz_gram_table(c, width)
  if n <= _DENSE_GRAM_MAX_N:  # one dense X: test the "monotone" condition on it
    x = _toeplitz_gram_rows(table, np.arange(n), n)
    if _is_monotone_gram(x):
      v = np.convolve(c, pattern)[:n]
      return float(v @ v), "monotone"
    rows = [(np.arange(n), x)]
  else:
    blocks = [np.arange(s, min(s + _BLOCK_ROWS, n)) for s in range(0, n, _BLOCK_ROWS)]
    rows = ((rows, _toeplitz_gram_rows(table, rows, n)) for rows in blocks)
  return _bound_from_rows(rows, col_norm2, k, b), "bound"


def _dense_sensitivity_squared(c: np.ndarray, k: int, b: int) -> tuple[float, str]:
  n = c.shape[0]
  x = c.T @ c
  col_norm2 = np.diag(x).copy()
  if k == 1:
    return float(col_norm2.max()), "single"
  lag = np.abs(np.arange(n)[:, None] - np.arange(n)[None, :])
  if np.all(x[lag >= b] == 0):
    # Largest sum of at most k column norms, pairwise >= b apart.
    return _max_separated_sum(col_norm2, k, b), "orthogonal"
  if _is_monotone_gram(x):
    q = _pattern_vector(n, k, b)
    return float(q @ x @ q), "monotone"
  rows = [(np.arange(n), x)]
  return _bound_from_rows(rows, col_norm2, k, b), "bound"


def _strategy_case(strategy, num_steps, max_participations_, min_separation):
  n, k, b = _check_participation(num_steps, max_participations_, min_separation)
  if isinstance(strategy, _strategies.ColumnNormalizedBanded):
    n = strategy.check_num_steps(n)
    return _column_normalized_banded_sensitivity_squared(strategy, n, k, b)
  if isinstance(strategy, _strategies.Strategy):
    strategy.check_num_steps(n)
  c = _strategy_coefficients(strategy, n)
  return _toeplitz_sensitivity_squared(c, k, b)


def sensitivity(strategy, num_steps, *, max_participations=1, min_separation=1) -> float:
  """L2 sensitivity of a strategy (BandMF, BLT or ColumnNormalizedBanded) for n steps (float64).

  Args:
    strategy: a :class:`~jaxdp.dpsgd.correlated.strategies.BandMF`,
      :class:`~jaxdp.dpsgd.correlated.strategies.BLT` (or anything with
      ``coefficients(n)`` giving the lower-triangular Toeplitz coefficients), or
      a :class:`~jaxdp.dpsgd.correlated.strategies.ColumnNormalizedBanded`.
    num_steps: n.
    max_participations: k, the most steps one example takes part in (clamped
      to ``ceil(n / min_separation)``).
    min_separation: b, the fewest steps between two participations.

  Returns:
    ``sens(C)`` as defined in the module docstring: exact for the
    ``"single"``, ``"orthogonal"`` and ``"monotone"`` cases, a valid upper
    bound for ``"bound"`` (see :func:`sensitivity_case`). O(n log n + n k) for
    the exact cases; O(n * bands) memory per row block and O(n^2) time for the
    bound.
  """
  value, _ = _strategy_case(strategy, num_steps, max_participations, min_separation)
  return math.sqrt(value)


def sensitivity_case(strategy, num_steps, *, max_participations=1, min_separation=1) -> str:
  """Which rule :func:`sensitivity` uses: ``"single"``, ``"orthogonal"``, ``"monotone"`` (exact) or ``"bound"``."""
  _, case = _strategy_case(strategy, num_steps, max_participations, min_separation)
  return case


def sensitivity_of_matrix(strategy_matrix, *, max_participations=1, min_separation=1,
                          return_case: bool = False):
  """L2 sensitivity of a dense square strategy matrix C (float64), same rules.

  A lower-triangular Toeplitz C is recognised (exact equality of its
  diagonals) and handled as :func:`sensitivity` does. For any other C the exact
  rules are tested on ``X = C^T C`` directly (orthogonal columns at distance
  >= b; the elementwise ``"monotone"`` condition, which round-off in ``C^T C``
  can break, giving the ``"bound"``); otherwise the ``"bound"``. O(n^3) for
  ``C^T C``.

  Args:
    strategy_matrix: n x n C (typically lower-triangular).
    max_participations: k (clamped to ``ceil(n / b)``).
    min_separation: b.
    return_case: also return the rule's name.

  Returns:
    ``sens(C)``, or ``(sens(C), case)`` with ``return_case``.
  """
  try:
    c = np.asarray(strategy_matrix, dtype=np.float64)
  except (TypeError, ValueError) as err:
    raise TypeError("strategy_matrix must be a square matrix of real numbers.") from err
  if c.ndim != 2 or c.shape[0] != c.shape[1] or c.shape[0] == 0:
    raise ValueError(f"strategy_matrix must be a non-empty square matrix, got shape {c.shape}.")
  if not np.all(np.isfinite(c)):
    raise ValueError("strategy_matrix must be finite.")
  n, k, b = _check_participation(c.shape[0], max_participations, min_separation)
  lag = np.subtract.outer(np.arange(n), np.arange(n))
  if np.array_equal(c, np.where(lag >= 0, c[np.clip(lag, 0, None), 0], 0.0)):
    value, case = _toeplitz_sensitivity_squared(c[:, 0].copy(), k, b)  # lower-triangular Toeplitz
  else:
    value, case = _dense_sensitivity_squared(c, k, b)
  sens = math.sqrt(value)
  return (sens, case) if return_case else sens


__all__ = ["max_participations", "sensitivity", "sensitivity_case", "sensitivity_of_matrix"]
