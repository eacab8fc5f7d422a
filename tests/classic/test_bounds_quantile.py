"""Bounds policy and the private quantile (jaxdp.classic._common, jaxdp.classic.quantile)."""

import jax
import numpy as np
import pytest

from jaxdp.accounting import PrivacyAccountant
from jaxdp.accounting import events
from jaxdp.classic import _common
from jaxdp.classic import quantile


def test_missing_bound_is_an_error_not_a_data_bound():
  with pytest.raises(ValueError, match="bounds are required"):
    _common.check_bounds(None, 1.0, 3)
  with pytest.raises(ValueError, match="lower < upper"):
    _common.check_bounds([0.0, 1.0], [1.0, 1.0], 2)


def test_out_of_bound_values_rejected_unless_clip():
  lo, hi = _common.check_bounds(0.0, 1.0, 2)
  x = np.array([[0.5, 0.2], [1.5, 0.1]])
  with pytest.raises(ValueError, match=r"x\[1, 0\] = 1.5 lies outside"):
    _common.check_data_in_bounds(x, lo, hi, clip=False)
  np.testing.assert_array_equal(_common.check_data_in_bounds(x, lo, hi, clip=True),
                                [[0.5, 0.2], [1.0, 0.1]])
  with pytest.raises(ValueError, match="NaN"):
    _common.check_data_in_bounds(np.array([[np.nan, 0.0]]), lo, hi, clip=True)


@pytest.mark.parametrize("rel,factor", [("add_remove", 1.0), ("replace_one", 2.0)])
def test_sum_sensitivity(rel, factor):
  assert _common.sum_sensitivity(3.5, rel) == factor * 3.5
  with pytest.raises(ValueError, match="neighbouring"):
    _common.sum_sensitivity(1.0, "swap")


def test_quantile_event_is_exponential_mechanism_with_beta_eps_over_2():
  ev = quantile.quantile_event(0.8, neighbouring="add_remove")
  assert isinstance(ev, events.ExponentialMechanismDpEvent)
  assert ev.beta == pytest.approx(0.4) and ev.sensitivity == 1.0
  assert ev.epsilon == pytest.approx(0.8) and ev.neighbouring == "add_remove"


def test_private_quantile_is_accurate_and_spends():
  x = np.random.default_rng(0).normal(size=2000)
  acc = PrivacyAccountant()
  qs = [quantile.private_quantile(jax.random.key(i), x, 0.5, lower=-10, upper=10, epsilon=1.0,
                                  accountant=acc) for i in range(5)]
  # The rank error of the exponential mechanism is O(log(range/gap)/eps) ~ a few dozen points.
  ranks = [np.mean(x < q) for q in qs]
  assert np.all(np.abs(np.array(ranks) - 0.5) < 0.03)
  assert acc.pure_epsilon() == pytest.approx(5.0)
  # Same key, same result.
  a = quantile.private_quantile(jax.random.key(3), x, 0.5, lower=-10, upper=10, epsilon=1.0)
  assert a == qs[3]


def test_private_quantile_distribution_matches_the_exponential_mechanism():
  # Data {0.25, 0.75} in [0, 1], q = 0.5: intervals [0,.25) rank 0, [.25,.75) rank 1,
  # [.75, 1] rank 2; u = -|rank - 1|; P(interval) ∝ length * exp(beta u).
  x = np.array([0.25, 0.75])
  beta = 1.0
  outs = np.asarray(jax.vmap(lambda k: quantile._quantile_core(
      k, jax.numpy.asarray(x, "float32"), 0.5, 0.0, 1.0, beta))(jax.random.split(jax.random.key(0), 40000)))
  w = np.array([0.25 * np.exp(-beta), 0.5, 0.25 * np.exp(-beta)])
  p = w / w.sum()
  emp = np.array([np.mean(outs < 0.25), np.mean((outs >= 0.25) & (outs < 0.75)), np.mean(outs >= 0.75)])
  np.testing.assert_allclose(emp, p, atol=4 * np.sqrt(0.25 / 40000))


def test_private_bounds_composes_2d_draws():
  x = np.random.default_rng(1).uniform(-1, 1, size=(3000, 3))
  acc = PrivacyAccountant()
  lo, hi = quantile.private_bounds(jax.random.key(0), x, lower=-5, upper=5, epsilon=3.0,
                                   quantiles=(0.05, 0.95), accountant=acc)
  assert acc.pure_epsilon() == pytest.approx(3.0)
  np.testing.assert_allclose(lo, -0.9, atol=0.1)
  np.testing.assert_allclose(hi, 0.9, atol=0.1)
  with pytest.raises(ValueError, match="epsilon"):
    quantile.private_bounds(jax.random.key(0), x, lower=-5, upper=5, epsilon=0.0)
  with pytest.raises(ValueError, match="bounds are required"):
    quantile.private_bounds(jax.random.key(0), x, lower=None, upper=5, epsilon=1.0)
