"""Tests of the worst-case neighbouring datasets, the statistics and the canary audit's checks."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdp import audit
from jaxdp import mechanisms
from jaxdp.prediction import subsample_aggregate as sa
from jaxdp.dpsgd import clipping

from _jitted_grad import Jitted as _Jitted


def test_scalar_query_pair_is_at_sensitivity_distance():
  p = audit.scalar_query_pair(2.5)
  assert float(p.neighbour - p.dataset) == 2.5
  v = audit.scalar_query_pair(0.5, dim=3)
  np.testing.assert_array_equal(np.asarray(v.neighbour - v.dataset), [0.5, 0.0, 0.0])
  with pytest.raises(ValueError, match="sensitivity"):
    audit.scalar_query_pair(0.0)
  with pytest.raises(ValueError, match="dim"):
    audit.scalar_query_pair(1.0, dim=0)


@pytest.mark.parametrize("c", [2, 10, 1000])
def test_exponential_mechanism_pair_log_ratio(c):
  beta = 0.5
  p = audit.exponential_mechanism_pair(c)
  assert np.max(np.abs(np.asarray(p.neighbour - p.dataset))) == 1.0  # every score moves by Delta
  probs_d = np.asarray(mechanisms.exponential_mechanism_probs(p.dataset, beta), np.float64)
  probs_n = np.asarray(mechanisms.exponential_mechanism_probs(p.neighbour, beta), np.float64)
  exact = audit.exponential_mechanism_log_ratio(c, beta)
  assert math.log(probs_n[0] / probs_d[0]) == pytest.approx(exact, rel=1e-4)
  assert beta <= exact < 2 * beta  # between the naive and the correct bound
  if c == 1000:
    assert exact > 0.99 * 2 * beta  # tends to 2 beta Delta


def test_flipped_label_pair():
  p = audit.flipped_label_pair(6, 3, num_classes=3, replaced_index=2)
  (x, y), (x2, y2) = p.dataset, p.neighbour
  np.testing.assert_allclose(np.linalg.norm(np.asarray(x), axis=1), 1.0)  # on the unit sphere
  np.testing.assert_array_equal(np.asarray(x), np.asarray(x2))
  diff = np.flatnonzero(np.asarray(y) != np.asarray(y2))
  np.testing.assert_array_equal(diff, [2])
  assert int(y2[2]) == (int(y[2]) + 1) % 3
  assert p.relation == "replace-one"
  with pytest.raises(ValueError, match="replaced_index"):
    audit.flipped_label_pair(4, 2, replaced_index=4)
  with pytest.raises(ValueError, match="num_classes"):
    audit.flipped_label_pair(4, 2, num_classes=1)


def test_teacher_vote_pair_flips_exactly_one_vote():
  t = 5
  p = audit.teacher_vote_pair(t, 3, dim=2)
  query = jnp.array([[1.0, 0.0]])
  votes = []
  for x, y in (p.dataset, p.neighbour):
    teachers = sa.train_linear_teachers(x, y, num_teachers=t, num_classes=2, l2_reg=0.1)
    votes.append(np.asarray(sa.linear_teacher_votes(teachers.weights, query))[0])
  np.testing.assert_array_equal(votes[0], [1, t - 1])
  np.testing.assert_array_equal(votes[1], [0, t])
  assert np.sum(np.asarray(p.dataset[1]) != np.asarray(p.neighbour[1])) == 1
  with pytest.raises(ValueError, match="odd"):
    audit.teacher_vote_pair(5, 2)


def test_statistics():
  c0, c1 = jnp.zeros(3), jnp.array([3.0, 4.0, 0.0])
  proj = audit.projection_statistic(c1 - c0)
  assert float(proj(c1)) == pytest.approx(5.0)
  assert float(proj(jnp.array([4.0, -3.0, 7.0]))) == pytest.approx(0.0, abs=1e-6)
  # Pytrees are flattened in leaf order.
  tree_proj = audit.projection_statistic({"a": jnp.ones(2), "b": jnp.zeros(1)})
  assert float(tree_proj({"a": jnp.array([1.0, 1.0]), "b": jnp.array([9.0])})) == pytest.approx(math.sqrt(2))
  lr = audit.l2_distance_statistic(c0, c1)
  assert float(lr(c1)) == pytest.approx(5.0) and float(lr(c0)) == pytest.approx(-5.0)
  ind = audit.indicator_statistic(2)
  assert float(ind(jnp.int32(2))) == 1.0 and float(ind(jnp.int32(1))) == 0.0
  with pytest.raises(ValueError, match="non-zero"):
    audit.projection_statistic(jnp.zeros(3))
  with pytest.raises(ValueError, match="same size"):
    audit.l2_distance_statistic(jnp.zeros(2), jnp.zeros(3))


def _loss(w, x, y):
  return jnp.logaddexp(0.0, -y * jnp.dot(w, x))


def test_canary_audit_argument_checks():
  fn = _Jitted(clipping.clipped_grad(_loss, l2_clip_norm=1.0, batch_argnums=(1, 2)))
  xb, yb = jnp.ones((4, 3)) / 2.0, jnp.ones(4)
  kw = dict(noise_multiplier=1.0, key=jax.random.key(0), num_trials=10, progress=False)
  with pytest.raises(ValueError, match="shape"):
    audit.dpsgd_canary_audit(fn, jnp.zeros(3), (xb, yb), (jnp.ones(2), jnp.float32(1)), **kw)
  with pytest.raises(ValueError, match="same number"):
    audit.dpsgd_canary_audit(fn, jnp.zeros(3), (xb, yb), (jnp.ones(3),), **kw)
  with pytest.raises(ValueError, match="zero"):  # a zero input has a zero gradient
    audit.dpsgd_canary_audit(fn, jnp.zeros(3), (xb, yb), (jnp.zeros(3), jnp.float32(1)), **kw)


def test_canary_mechanism_statistic_has_the_predicted_law():
  # Without the canary the projection is N(<G, c>/b, (sigma S / b)^2); with it
  # the mean moves by ||c|| / b = S / b (the canary's gradient is clipped to S).
  fn = _Jitted(clipping.clipped_grad(_loss, l2_clip_norm=2.0, batch_argnums=(1, 2)))
  xb = jnp.array([[0.5, 0.0, 0.0], [0.0, 0.5, 0.0]])
  yb = jnp.array([1.0, -1.0])
  examples = (jnp.concatenate([xb, jnp.array([[0.0, 0.0, 30.0]])]), jnp.array([1.0, -1.0, 1.0]))
  setup = audit.canary_mechanism(fn, jnp.zeros(3), examples, noise_multiplier=1.5,
                                 expected_batch_size=4.0, num_steps=3)
  # The clip is shrunk by ~1e-5 relative so the float32 clipped norm never exceeds S
  # (see clipping._safe_clip), so the canary moves the mean by S / b up to that factor.
  assert setup.shift == pytest.approx(0.5, rel=2e-5) and setup.shift <= 0.5
  assert setup.noise_std == pytest.approx(0.75)
  # At params = 0 each logistic gradient is -y x / 2: <G, e_3> = 0.
  assert setup.offset == pytest.approx(0.0, abs=1e-7)
  keys = jax.random.split(jax.random.key(0), 10_000)
  without = jax.vmap(lambda k: setup.mechanism(k, jnp.array([1.0, 1.0, 0.0])))(keys)
  with_c = jax.vmap(lambda k: setup.mechanism(k, jnp.array([1.0, 1.0, 1.0])))(keys)
  assert without.shape == (10_000, 3)
  # Same keys, so the difference is exactly the canary's contribution S / b = 0.5.
  np.testing.assert_allclose(np.asarray(with_c - without), 0.5, atol=1e-4)
  # The noise std is sigma S / b = 0.75 per step, independent across steps.
  np.testing.assert_allclose(np.std(np.asarray(without), axis=0), 0.75, rtol=0.03)
  assert abs(np.corrcoef(np.asarray(without).T)[0, 1]) < 0.03
  # q = 1: the statistic is the Gaussian log-likelihood ratio, affine in the sum.
  p = jnp.array([0.1, -0.3, 0.7])
  expected = float(jnp.sum((0.5 * p - 0.125) / 0.75**2))
  assert float(setup.statistic(p)) == pytest.approx(expected, rel=1e-5)


def test_canary_poisson_sampling_includes_the_canary_at_rate_q():
  fn = _Jitted(clipping.clipped_grad(_loss, l2_clip_norm=1.0, batch_argnums=(1, 2)))
  examples = (jnp.array([[0.5, 0.0], [0.0, 40.0]]), jnp.array([1.0, 1.0]))
  setup = audit.canary_mechanism(fn, jnp.zeros(2), examples, noise_multiplier=0.0,
                                 expected_batch_size=2.0, num_steps=4, sample_rate=0.3)
  keys = jax.random.split(jax.random.key(1), 5_000)
  proj = np.asarray(jax.vmap(lambda k: setup.mechanism(k, jnp.ones(2)))(keys))
  # Without noise the projection is offset (0) or offset + shift (0.5): the canary's inclusions.
  included = np.isclose(proj, 0.5, atol=1e-5)
  assert np.all(included | np.isclose(proj, 0.0, atol=1e-5))
  assert abs(included.mean() - 0.3) < 0.02
  assert abs(np.corrcoef(included[:, 0], included[:, 1])[0, 1]) < 0.05  # fresh draw per step
