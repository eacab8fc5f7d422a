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
  x = np.array([[0.5, 0.2], [1.7314159, 0.1]])
  with pytest.raises(ValueError, match=r"x\[1, 0\] lies outside") as err:
    _common.check_data_in_bounds(x, lo, hi, clip=False)
  assert "1.73" not in str(err.value)  # issue 26 item 7: never the private value
  np.testing.assert_array_equal(_common.check_data_in_bounds(x, lo, hi, clip=True),
                                [[0.5, 0.2], [1.0, 0.1]])
  with pytest.raises(ValueError, match=r"y must lie in \{0, ..., 2\}.*row 2 does not") as err:
    _common.check_labels(np.array([0, 2, 137, 1]), 3, 4)
  assert "137" not in str(err.value)
  with pytest.raises(ValueError, match="integer class indices; row 1") as err:
    _common.check_labels(np.array([0, 0.625, 1]), 3, 3)
  assert "0.625" not in str(err.value)
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


def _spy_logits(monkeypatch):
  """Records the logits every draw of jaxdp.classic.quantile receives."""
  seen = []
  real = quantile._draw_grid_index

  def spy(key, logits):
    seen.append(np.array(logits, np.float64))
    return real(key, logits)

  monkeypatch.setattr(quantile, "_draw_grid_index", spy)
  return seen


def _law(x, q, lower, upper, eps, points):
  """First principles: p(o_k) ∝ exp((eps/2) u(o_k)), u = -|#{clip(x) < o_k} - q n|."""
  grid = lower + np.arange(points) * (upper - lower) / (points - 1)
  xc = np.clip(np.asarray(x, np.float64), lower, upper)
  u = np.array([-abs(np.sum(xc < o) - q * len(xc)) for o in grid])
  w = np.exp(eps / 2 * (u - u.max()))
  return w / w.sum()


def _softmax(logits):
  w = np.exp(logits - logits.max(-1, keepdims=True))
  return w / w.sum(-1, keepdims=True)


def test_private_quantile_selects_with_exp_eps_over_2_utility(monkeypatch):
  # Catches beta = eps instead of eps/2 (that law puts e^{eps/2} times more mass on the
  # best candidates) and any other change of the utility or of beta.
  seen = _spy_logits(monkeypatch)
  x = np.array([0.25, 0.75, 0.6])
  quantile.private_quantile(jax.random.key(0), x, 0.5, lower=0.0, upper=1.0, epsilon=1.0,
                            num_grid_points=5)
  np.testing.assert_allclose(_softmax(seen[0]), _law(x, 0.5, 0.0, 1.0, 1.0, 5), rtol=1e-12)
  quantile.private_bounds(jax.random.key(0), np.stack([x, 1 - x], 1), lower=0.0, upper=1.0,
                          epsilon=2.0, quantiles=(0.2, 0.9), num_grid_points=5)
  eps_each = 2.0 / 4  # 2 d = 4 draws
  for j, col in enumerate((x, 1 - x)):
    for r, qq in enumerate((0.2, 0.9)):
      np.testing.assert_allclose(_softmax(seen[1 + j][r]), _law(col, qq, 0.0, 1.0, eps_each, 5),
                                 rtol=1e-12)


def test_private_quantile_clips_data_to_the_search_range(monkeypatch):
  # Records outside [lower, upper] count as the nearest end: same law and same draw as the
  # clipped data (without the clip, the record at -5 would rank below the candidate 0).
  seen = _spy_logits(monkeypatch)
  x_out, x_clip = np.array([-5.0, 0.25, 0.75, 7.0]), np.array([0.0, 0.25, 0.75, 1.0])
  for q in (0.0, 0.3, 1.0):
    a = quantile.private_quantile(jax.random.key(1), x_out, q, lower=0, upper=1, epsilon=1.0,
                                  num_grid_points=5)
    b = quantile.private_quantile(jax.random.key(1), x_clip, q, lower=0, upper=1, epsilon=1.0,
                                  num_grid_points=5)
    assert a == b and 0.0 <= a <= 1.0
    np.testing.assert_array_equal(seen[-2], seen[-1])
    np.testing.assert_allclose(_softmax(seen[-1]), _law(x_clip, q, 0.0, 1.0, 1.0, 5), rtol=1e-12)


def test_grid_draw_follows_the_softmax_of_its_logits():
  # The sampler itself: 40,000 float64 Gumbel-max rows against the exact law.
  logits = np.log(_law(np.array([0.25, 0.75, 0.6]), 0.5, 0.0, 1.0, 1.0, 5))
  idx = quantile._draw_grid_index(jax.random.key(0), np.tile(logits, (40_000, 1)))
  emp = np.bincount(idx, minlength=5) / 40_000
  np.testing.assert_allclose(emp, np.exp(logits), atol=4 * np.sqrt(0.25 / 40_000))


def test_output_support_is_the_public_grid_for_every_dataset():
  # Issue 26 item 4: the release used to be edges[i] + u * lengths[i] in float32, a lattice
  # anchored at a record. Now every output of D and of its neighbour lies on the same grid.
  grid = quantile.quantile_grid(-1.0, 2.0, 257)
  assert grid[0] == -1.0 and grid[-1] == 2.0 and np.all(np.diff(grid) > 0)
  rng = np.random.default_rng(0)
  x = rng.uniform(-1, 2, size=30)
  xn = x.copy()
  xn[0] = 1.2345678
  outs = [quantile.private_quantile(jax.random.key(i), d, 0.5, lower=-1, upper=2, epsilon=1.0,
                                    num_grid_points=257) for i in range(5) for d in (x, xn)]
  assert np.all(np.isin(outs, grid))
  lo, hi = quantile.private_bounds(jax.random.key(0), np.stack([x, xn], 1), lower=-1, upper=2,
                                   epsilon=1.0, num_grid_points=257)
  assert np.all(np.isin(np.concatenate([lo, hi]), grid))
  for bad in (1, 2.5, 0):
    with pytest.raises(ValueError, match="num_grid_points"):
      quantile.private_quantile(jax.random.key(0), x, 0.5, lower=-1, upper=2, epsilon=1.0,
                                num_grid_points=bad)


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
