"""The strategy optimisers' modules: the facade re-exports them, the shared checks and solver."""

import jax
import numpy as np
import pytest

from jaxdp.dpsgd import correlated
from jaxdp.dpsgd.correlated import optimize, optimize_banded, optimize_solver, optimize_toeplitz


def test_facade_and_package_export_the_family_modules_objects():
  assert optimize.optimize_bandmf is optimize_toeplitz.optimize_bandmf is correlated.optimize_bandmf
  assert optimize.optimize_blt is optimize_toeplitz.optimize_blt is correlated.optimize_blt
  assert optimize.square_root_coefs is optimize_toeplitz.square_root_coefs
  assert (optimize.optimize_column_normalized_banded
          is optimize_banded.optimize_column_normalized_banded
          is correlated.optimize_column_normalized_banded)
  assert optimize._cnb_value_and_grad is optimize_banded._cnb_value_and_grad  # pylint: disable=protected-access
  for name in optimize.__all__:
    assert getattr(optimize, name) is not None


def test_banded_checks_default_the_separation_and_cap_participations():
  check = optimize_solver._check_banded  # pylint: disable=protected-access
  args = (0.0, None, 3, None, "total", 10, 1e-8)
  n, _, _, k, b, _, bands, _, _ = check(20, 4, *args, why="x")
  assert (n, k, b, bands) == (20, 3, 4, 4)  # b defaults to bands for several participations
  _, _, _, k, b, _, _, _, _ = check(20, 4, 0.0, None, 1, None, "total", 10, 1e-8, why="x")
  assert (k, b) == (1, 1)
  _, _, _, k, _, _, _, _, _ = check(10, 2, 0.0, None, 9, 4, "total", 10, 1e-8, why="x")
  assert k == 3  # at most ceil(n / b) participations fit
  with pytest.raises(ValueError, match="min_separation \\(2\\) must be >= bands \\(4\\).*why"):
    check(20, 4, 0.0, None, 3, 2, "total", 10, 1e-8, why="why")
  with pytest.raises(ValueError, match="bands must be <= num_steps"):
    check(3, 4, *args, why="x")
  assert list(optimize_solver._pattern_steps(10, 9, 4)) == [0, 4, 8]  # pylint: disable=protected-access


def test_lbfgs_minimises_on_the_log_scale():
  # A bowl whose value spans orders of magnitude: the driver works on log(loss), in float64.
  def value_and_grad(x):
    x = np.asarray(x)
    return 1.0 + 1e6 * np.sum((x - 2.0) ** 2), 2e6 * (x - 2.0)

  with jax.enable_x64(True):
    x = optimize_solver._lbfgs(value_and_grad, np.array([0.0, 1.0]), 200, 1e-14)  # pylint: disable=protected-access
  np.testing.assert_allclose(x, [2.0, 2.0], atol=1e-5)
