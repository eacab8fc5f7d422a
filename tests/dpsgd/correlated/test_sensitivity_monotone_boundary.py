"""The ``"monotone"`` sensitivity rule needs BOTH its row and its diagonal condition.

``jaxdp.dpsgd.correlated.sensitivity``: for ``X = C^T C >= 0``, non-increasing along
rows AND along diagonals on and above the diagonal, ``sens^2 = 1_q^T X 1_q`` with
``q = {0, b, ..., (k-1) b}``. Without the diagonal condition the pattern q need not be
a maximiser and the rule underestimates the sensitivity (too little noise). The
checks here compare the returned value with a brute-force maximum over every
participation pattern (n small), which for ``X >= 0`` is ``max_pi sum_{i,j in pi} X_ij``
(all ``u_i`` equal maximise ``sum X_ij <u_i, u_j>``).
"""

import itertools
import math

import numpy as np
import pytest

from jaxdp.dpsgd.correlated import BandMF
from jaxdp.dpsgd.correlated.sensitivity import (sensitivity, sensitivity_case,
                                                  sensitivity_of_matrix)


def _patterns(n, k, b):
  for m in range(1, k + 1):
    for pi in itertools.combinations(range(n), m):
      if all(pi[i + 1] - pi[i] >= b for i in range(m - 1)):
        yield pi


def _brute_force(c: np.ndarray, k: int, b: int) -> float:
  """``max_pi ||C 1_pi||`` over all patterns of <= k steps pairwise >= b apart (X >= 0)."""
  x = c.T @ c
  assert np.all(x >= 0)  # then equal u_i maximise, and the maximum is over patterns only
  n = x.shape[0]
  return math.sqrt(max(x[np.ix_(pi, pi)].sum() for pi in _patterns(n, k, b)))


def _prefix_matrix(eps_root: float) -> np.ndarray:
  """Rows (1,1,0,0), (1,1,1,1), (0,e,0,0), 0: ``X = C^T C`` (exact in float64)

  ``X = [[2, 2, 1, 1], [2, 2+e^2, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1]]``: >= 0, rows
  non-increasing, and for ``e > 0`` the diagonal condition fails at one place only,
  by ``e^2`` (``X_11 = X_00 + e^2``). With n = 4, b = 2, k = 2, q = {0, 2} gives
  ``5`` and the pattern {1, 3} gives ``5 + e^2``.
  """
  return np.array([[1.0, 1.0, 0.0, 0.0],
                   [1.0, 1.0, 1.0, 1.0],
                   [0.0, eps_root, 0.0, 0.0],
                   [0.0, 0.0, 0.0, 0.0]])


@pytest.mark.parametrize("eps_root", [2.0 ** -10, 2.0 ** -3])
def test_row_condition_alone_is_not_monotone_and_never_underestimates(eps_root):
  c = _prefix_matrix(eps_root)
  x = c.T @ c
  n, k, b = 4, 2, 2
  assert x[1, 1] - x[0, 0] == eps_root ** 2  # the only diagonal violation, exactly
  value, case = sensitivity_of_matrix(c, max_participations=k, min_separation=b,
                                      return_case=True)
  exact = _brute_force(c, k, b)
  assert exact ** 2 == pytest.approx(5.0 + eps_root ** 2, rel=1e-15)
  assert case != "monotone"
  assert value >= exact  # a sound rule: never below the true sensitivity
  assert value ** 2 > 5.0  # the pattern q = {0, 2} alone (5) would undercharge


def test_diagonal_condition_alone_is_not_monotone_and_never_underestimates():
  """``X = [[12, 6, 2, 4], [6, 6, 3, 2], [2, 3, 5, 2], [4, 2, 2, 4]]``: diagonals fine, row 0 rises.

  q = {0, 2} gives 21, the pattern {0, 3} gives 24.
  """
  c = np.array([[2.0, 1, 1, 2], [2, 2, 0, 0], [2, 0, 0, 0], [0, 1, 2, 0]])
  value, case = sensitivity_of_matrix(c, max_participations=2, min_separation=2,
                                      return_case=True)
  exact = _brute_force(c, 2, 2)
  assert exact == pytest.approx(math.sqrt(24.0), rel=1e-15)
  assert case != "monotone"
  assert value >= exact


def test_both_conditions_with_equality_are_monotone_and_exact():
  c = _prefix_matrix(0.0)  # X_00 == X_11: the diagonal condition holds with equality
  value, case = sensitivity_of_matrix(c, max_participations=2, min_separation=2,
                                      return_case=True)
  assert case == "monotone"
  assert value == pytest.approx(_brute_force(c, 2, 2), rel=1e-15)
  assert value == pytest.approx(math.sqrt(5.0), rel=1e-15)


def test_non_monotone_toeplitz_coefficients_meeting_both_conditions_are_exact():
  """BandMF (1, 0.375, 0.5): not non-increasing, but its Gram meets both conditions."""
  strategy, n, b = BandMF(np.array([1.0, 0.375, 0.5])), 6, 2
  k = 3
  assert sensitivity_case(strategy, n, max_participations=k, min_separation=b) == "monotone"
  c = strategy.matrix(n)
  got = sensitivity(strategy, n, max_participations=k, min_separation=b)
  assert got == pytest.approx(_brute_force(c, k, b), rel=1e-12)


@pytest.mark.parametrize("seed", range(3))
def test_every_rule_is_at_least_the_brute_force_on_random_nonnegative_matrices(seed):
  rng = np.random.default_rng(seed)
  n, b, k = 6, 2, 3
  cases = set()
  for _ in range(40):
    c = np.tril(rng.integers(0, 4, (n, n))).astype(np.float64)
    c[np.diag_indices(n)] += 1.0
    value, case = sensitivity_of_matrix(c, max_participations=k, min_separation=b,
                                        return_case=True)
    exact = _brute_force(c, k, b)
    cases.add(case)
    assert value >= exact * (1 - 1e-12), (c, case)
    if case in ("single", "orthogonal", "monotone"):
      assert value == pytest.approx(exact, rel=1e-12), (c, case)
  assert "bound" in cases
