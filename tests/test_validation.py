"""Tests of the shared argument checks."""

import math

import numpy as np
import pytest

from jaxdp import _validation as v


@pytest.mark.parametrize("value,match", [(0.0, "> 0"), (-1.0, "> 0"), (math.inf, "finite"),
                                         (math.nan, "NaN"), ("x", "real number")])
def test_epsilon(value, match):
  with pytest.raises(ValueError, match=match):
    v.check_epsilon(value)


def test_epsilon_inf_allowed_where_asked():
  assert v.check_epsilon(math.inf, allow_inf=True) == math.inf


@pytest.mark.parametrize("value", [-0.1, 1.0, 1.5, math.nan])
def test_delta(value):
  with pytest.raises(ValueError, match="delta"):
    v.check_delta(value)
  assert v.check_delta(0.0) == 0.0
  with pytest.raises(ValueError, match=r"\(0, 1\)"):
    v.check_delta(0.0, allow_zero=False)


@pytest.mark.parametrize("value", [0.0, -0.1, 1.01, math.nan])
def test_sample_rate(value):
  with pytest.raises(ValueError, match="sample_rate"):
    v.check_sample_rate(value)
  assert v.check_sample_rate(1.0) == 1.0


def test_sensitivity_and_arrays():
  with pytest.raises(ValueError, match="sensitivity"):
    v.check_sensitivity(-1)
  with pytest.raises(ValueError, match="NaN"):
    v.check_finite_array(np.array([1.0, np.nan]), "x")
  with pytest.raises(ValueError, match="normalize_rows"):
    v.check_unit_ball(np.array([[1.0, 1.0]]))
  v.check_unit_ball(np.array([[0.6, 0.8], [0.0, 0.0]]))
  with pytest.raises(ValueError, match="integer"):
    v.check_positive_int(1.5, "k")


@pytest.mark.parametrize("value", [math.inf, math.nan, None, "3", 0, -2, 2.5, True])
def test_positive_int_rejects_with_a_named_value_error(value):
  with pytest.raises(ValueError, match="k must be an integer >= 1"):
    v.check_positive_int(value, "k")
  assert v.check_positive_int(np.int64(3), "k") == 3


def test_unit_ball_pulls_rounding_overshoot_strictly_inside():
  x = np.array([[0.6, 0.8000003], [0.3, 0.4]], dtype=np.float32)  # norm 1 + 2.4e-7
  assert np.linalg.norm(x[0].astype(np.float64)) > 1.0
  out = v.check_unit_ball(x)
  assert out.dtype == np.float32
  assert np.all(np.linalg.norm(out.astype(np.float64), axis=1) <= 1.0)
  np.testing.assert_array_equal(out[1], x[1])  # rows inside the ball are untouched
  np.testing.assert_allclose(out[0], x[0], rtol=1e-6)
