"""Tests for jaxdp.dpsgd.linear: batched DP-SGD for softmax linear models."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from scipy import stats

from jaxdp.accounting import dpsgd_accounting
from jaxdp.dpsgd import clipping, linear as dlinear, sampling


def _data(n=300, d=12, c=4, seed=0):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(n, d)).astype(np.float32)
  x /= np.maximum(1.0, np.linalg.norm(x, axis=1, keepdims=True)) * 0.7
  w = rng.normal(size=(d, c))
  y = np.argmax(x @ w + 0.3 * rng.normal(size=(n, c)), axis=1).astype(np.int32)
  return x, y


def _ce(w, x, y):
  return optax.softmax_cross_entropy_with_integer_labels((x @ w)[None], y[None])[0]


def test_closed_form_clipped_sum_matches_generic_per_example_clipping():
  x, y = _data()
  w = jnp.asarray(np.random.default_rng(1).normal(size=(12, 4)), jnp.float32)
  key = jax.random.key(3)
  q = 0.2
  idx = sampling.poisson_sample_indices(key, len(y), q)
  mask = np.zeros(len(y), bool)
  mask[idx] = True
  csum = jnp.cumsum(jnp.asarray(mask), dtype=jnp.int32)
  clip = 0.3
  # Jitted: one compilation each, instead of one per primitive run op by op.
  got = jax.jit(lambda *a: dlinear._clipped_chunk_sum(*a, 0, padded=len(idx) + 5, safe_clip=clip,
                                                      num_classes=4))(
      w, jnp.asarray(x), jnp.asarray(y), csum, csum[-1])
  ref, _ = jax.jit(clipping.clipped_grad(_ce, l2_clip_norm=clip, batch_argnums=(1, 2),
                                         method="vmap"))(w, x[idx], y[idx])
  np.testing.assert_allclose(got, ref, rtol=2e-4, atol=2e-6)


def test_in_jit_sampling_is_poisson_sample_indices():
  """The mask of one step is exactly the library's Poisson sampler on the same key."""
  n, q = 5000, 0.013
  key = jax.random.key(11)
  thr = sampling._inclusion_threshold(q)
  mask = np.asarray(jax.random.bits(key, (n,), jnp.uint32) < jnp.uint32(thr))
  np.testing.assert_array_equal(np.flatnonzero(mask), sampling.poisson_sample_indices(key, n, q))
  csum = jnp.cumsum(jnp.asarray(mask), dtype=jnp.int32)
  ranks = jnp.arange(1, int(csum[-1]) + 1)
  np.testing.assert_array_equal(np.asarray(jnp.searchsorted(csum, ranks, side="left")),
                                np.flatnonzero(mask))


def test_overflowing_batches_are_summed_in_full_not_truncated():
  """A padded size far below the batch size gives exactly the same training run."""
  x, y = _data(n=400)
  kw = dict(lr=jnp.float32(0.5), momentum=jnp.float32(0.9), clip=jnp.float32(0.4),
            noise_std=jnp.float32(0.2), steps=6, threshold=sampling._inclusion_threshold(0.25),
            expected_batch=100.0, num_classes=4)
  key = jax.random.key(5)
  run = lambda p: jax.jit(lambda k: dlinear._train_one(k, jnp.asarray(x), jnp.asarray(y),
                                                        padded=p, **kw))(key)
  big, small = run(400), run(17)  # ~100 examples per batch: 6+ chunks of 17
  np.testing.assert_allclose(small, big, rtol=1e-5, atol=1e-6)


def test_noise_scale_matches_calibration_on_zero_gradients():
  """With x = 0 every gradient is 0, so one step leaves W = -lr N(0, (z c)^2)/(qN)."""
  n, d, c = 200, 6, 5
  x = np.zeros((n, d), np.float32)
  y = np.arange(n, dtype=np.int32) % c
  lr, clip, eb = 0.7, 0.25, 50.0
  res = dlinear.linear_dpsgd(jax.random.split(jax.random.key(0), 64), x, y, num_classes=c,
                             noise_multiplier=1.3, delta=1e-5, epochs=eb / n,
                             expected_batch_size=eb, l2_clip_norm=clip, learning_rate=lr,
                             momentum=0.0)
  assert res.steps == 1
  w = np.asarray(res.weights, np.float64).ravel()
  expected_std = lr * 1.3 * clip / eb
  k = w.size
  s2 = np.sum(w ** 2)  # mean 0: s2 / sigma^2 ~ chi2(k)
  lo, hi = stats.chi2.ppf([1e-4, 1 - 1e-4], k)
  assert lo <= s2 / expected_std ** 2 <= hi
  assert abs(np.mean(w)) < 5 * expected_std / math.sqrt(k)


def test_calibration_meets_target_epsilon():
  x, y = _data()
  res = dlinear.linear_dpsgd(jax.random.key(1), x, y, num_classes=4, epsilon=1.0, delta=1e-5,
                             epochs=2, expected_batch_size=30, l2_clip_norm=0.5)
  q = sampling.effective_sample_rate(30 / 300)
  assert res.sample_rate == q
  assert res.steps == math.ceil(2 / 0.1)
  assert res.epsilon <= 1.0
  z = dpsgd_accounting.calibrate_noise_multiplier(1.0, 1e-5, q, res.steps)
  assert res.noise_multiplier == pytest.approx(z)
  assert res.weights.shape == (12, 4)


def test_keys_batch_equals_single_runs_and_is_deterministic():
  x, y = _data()
  keys = jax.random.split(jax.random.key(9), 4)
  # A given noise multiplier: the runs, not the calibration (test_calibration_meets_target_epsilon),
  # are checked here, and calibrating costs each of the three calls ~0.6 s of accounting.
  kw = dict(num_classes=4, noise_multiplier=1.0, delta=1e-5, epochs=1, expected_batch_size=60,
            l2_clip_norm=0.5)
  batch = dlinear.linear_dpsgd(keys, x, y, **kw).weights
  again = dlinear.linear_dpsgd(keys, x, y, **kw).weights
  np.testing.assert_array_equal(batch, again)
  single = dlinear.linear_dpsgd(keys[2], x, y, **kw).weights
  np.testing.assert_allclose(batch[2], single, rtol=1e-6, atol=1e-7)
  assert not np.allclose(batch[0], batch[1])


def test_learns_without_noise_and_noise_hurts():
  x, y = _data(n=600)
  kw = dict(num_classes=4, delta=1e-5, epochs=5, expected_batch_size=60, l2_clip_norm=1.0,
            learning_rate=1.0)
  keys = jax.random.split(jax.random.key(2), 4)
  acc = lambda w: float(np.mean(np.argmax(np.einsum("nd,mdc->mnc", x, w), -1) == y))
  clean = dlinear.linear_dpsgd(keys, x, y, epsilon=math.inf, **kw)
  assert clean.noise_multiplier == 0.0 and math.isinf(clean.epsilon)
  noisy = dlinear.linear_dpsgd(keys, x, y, epsilon=0.05, **kw)
  assert acc(clean.weights) > 0.85
  assert acc(noisy.weights) < acc(clean.weights) - 0.1


def test_safe_clip_norm_is_slightly_below_clip():
  s = dlinear.safe_clip_norm(0.5, 784, 10)
  assert s < 0.5 and s > 0.5 * (1 - 1e-4)
  assert np.float32(s) == s


@pytest.mark.parametrize("kwargs, match", [
    (dict(epsilon=1.0, delta=0.0), "delta"),
    (dict(epsilon=0.0, delta=1e-5), "epsilon"),
    (dict(epsilon=1.0, delta=1e-5, expected_batch_size=1000), "expected_batch_size"),
    (dict(epsilon=1.0, delta=1e-5, l2_clip_norm=0.0), "l2_clip_norm"),
    (dict(epsilon=1.0, delta=1e-5, momentum=1.0), "momentum"),
    (dict(epsilon=1.0, noise_multiplier=1.0, delta=1e-5), "exactly one"),
])
def test_bad_arguments_raise(kwargs, match):
  x, y = _data()
  base = dict(num_classes=4, epochs=1, expected_batch_size=30)
  with pytest.raises(ValueError, match=match):
    dlinear.linear_dpsgd(jax.random.key(0), x, y, **dict(base, **kwargs))


def test_nan_features_and_bad_labels_raise():
  x, y = _data()
  bad = x.copy()
  bad[3, 1] = np.nan
  kw = dict(num_classes=4, epsilon=1.0, delta=1e-5, epochs=1, expected_batch_size=30)
  with pytest.raises(ValueError):
    dlinear.linear_dpsgd(jax.random.key(0), bad, y, **kw)
  with pytest.raises(ValueError, match="labels"):
    dlinear.linear_dpsgd(jax.random.key(0), x, y + 4, **kw)
