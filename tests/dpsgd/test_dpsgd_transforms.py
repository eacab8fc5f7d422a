"""Tests of the noisy aggregation transform (paper 000 Section 3.1 Equation 4)."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxdp import models
from jaxdp.dpsgd import clipping, transforms


def _problem():
  model = models.LinearClassifier(num_classes=3)
  x = jax.random.normal(jax.random.key(0), (16, 6))
  y = jax.random.randint(jax.random.key(1), (16,), 0, 3)
  params = model.init(jax.random.key(2), x[:1])["params"]

  def loss(p, xi, yi):
    return optax.softmax_cross_entropy_with_integer_labels(model.apply({"params": p}, xi[None])[0], yi)

  return loss, params, x, y


class NoisyAggregateTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_infinite_clip_zero_noise_equals_sgd(self):
    loss, params, x, y = _problem()
    grad_fn = clipping.clipped_grad(loss, l2_clip_norm=float("inf"), batch_argnums=(1, 2))
    dp = transforms.private_sgd(0.3, noise_multiplier=0.0, l2_sensitivity=grad_fn.sensitivity,
                          expected_batch_size=x.shape[0], key=jax.random.key(3))
    sgd = optax.sgd(0.3)
    mean_loss = lambda p: jnp.mean(jax.vmap(loss, (None, 0, 0))(p, x, y))

    @self.variant
    def dp_step(p, s):
      g, _ = grad_fn(p, x, y)
      u, s = dp.update(g, s, p)
      return optax.apply_updates(p, u), s

    @self.variant
    def sgd_step(p, s):
      u, s = sgd.update(jax.grad(mean_loss)(p), s, p)
      return optax.apply_updates(p, u), s

    p_dp, s_dp = params, dp.init(params)
    p_sgd, s_sgd = params, sgd.init(params)
    for _ in range(3):
      p_dp, s_dp = dp_step(p_dp, s_dp)
      p_sgd, s_sgd = sgd_step(p_sgd, s_sgd)
    chex.assert_trees_all_close(p_dp, p_sgd, rtol=1e-5, atol=1e-6)
    # ...and the parameters actually moved.
    self.assertGreater(float(optax.global_norm(jax.tree.map(jnp.subtract, p_dp, params))), 1e-3)

  def test_noise_std_and_divisor(self):
    # Zero gradient sum: the output is pure noise z / (qN), z ~ N(0, (sigma C)^2).
    sigma, clip, qn = 1.3, 0.7, 250.0
    tx = transforms.noisy_aggregate(sigma, clip, qn, jax.random.key(0))
    zeros = {"a": jnp.zeros((400, 500)), "b": jnp.zeros((1000,))}
    state = tx.init(zeros)
    out, state2 = jax.jit(tx.update)(zeros, state)
    flat = np.concatenate([np.ravel(v) for v in jax.tree.leaves(out)]) * qn
    # 201000 draws: the sample std has relative s.e. 1/sqrt(2n) = 0.16%; a 1% band
    # fails for a wrong scale (e.g. dividing by |B| instead of qN, or sigma alone).
    np.testing.assert_allclose(flat.std(), sigma * clip, rtol=0.01)
    self.assertLess(abs(flat.mean()), 5 * sigma * clip / np.sqrt(flat.size))
    # Fourth moment of a Gaussian: kurtosis 3 (s.e. ~ sqrt(24/n) = 0.011).
    kurt = np.mean((flat / flat.std()) ** 4)
    self.assertLess(abs(kurt - 3.0), 0.06)
    # The next step uses fresh noise; the same key reproduces the same noise.
    out2, _ = tx.update(zeros, state2)
    self.assertFalse(np.allclose(out2["b"], out["b"]))
    out_again, _ = jax.jit(tx.update)(zeros, tx.init(zeros))
    np.testing.assert_array_equal(out_again["b"], out["b"])
    self.assertEqual(transforms.noise_stddev(sigma, clip), sigma * clip)

  def test_chains_with_any_optimizer(self):
    loss, params, x, y = _problem()
    grad_fn = clipping.clipped_grad(loss, l2_clip_norm=1.0, batch_argnums=(1, 2))
    tx = transforms.dp_optimizer(optax.adam(1e-2), noise_multiplier=1.0, l2_sensitivity=grad_fn.sensitivity,
                                 expected_batch_size=16.0, key=jax.random.key(5))
    state = tx.init(params)
    g, _ = jax.jit(grad_fn)(params, x, y)
    u, state = jax.jit(tx.update)(g, state, params)
    chex.assert_trees_all_equal_shapes(u, params)
    chex.assert_tree_all_finite(u)

  def test_bad_arguments(self):
    key = jax.random.key(0)
    with self.assertRaisesRegex(ValueError, "noise_multiplier"):
      transforms.noisy_aggregate(-1.0, 1.0, 10.0, key)
    with self.assertRaisesRegex(ValueError, "l2_sensitivity"):
      transforms.noisy_aggregate(1.0, float("inf"), 10.0, key)
    with self.assertRaisesRegex(ValueError, "l2_sensitivity"):
      transforms.noisy_aggregate(1.0, 0.0, 10.0, key)
    with self.assertRaisesRegex(ValueError, "expected_batch_size"):
      transforms.noisy_aggregate(1.0, 1.0, 0.0, key)
    with self.assertRaisesRegex(ValueError, "key"):
      transforms.noisy_aggregate(1.0, 1.0, 10.0, 0)


def test_bf16_sum_is_noised_in_float32_with_the_right_std():
  # A bf16 clipped sum: the noise must be drawn and added in float32 (the old code drew
  # it in bf16, 8 mantissa bits: quantised noise) with std sigma * S, then divided by qN.
  sigma, s, denom, d = 1.3, 0.7, 4.0, 40_000
  tx = transforms.noisy_aggregate(sigma, s, denom, jax.random.key(11))
  g = {"w": jnp.zeros((d,), jnp.bfloat16)}
  out, _ = jax.jit(tx.update)(g, tx.init(g))
  w = np.asarray(out["w"])
  assert w.dtype == np.float32
  # Relative s.e. of the std over 40,000 draws is 0.35%; 2% band.
  np.testing.assert_allclose(w.std(), sigma * s / denom, rtol=0.02)
  assert abs(w.mean()) < 4 * sigma * s / denom / np.sqrt(d)
  # Not on the bf16 grid: a float32 normal is bf16-representable with prob ~2^-16.
  on_bf16_grid = np.mean(w.astype(jnp.bfloat16).astype(np.float32) == w)
  assert on_bf16_grid < 0.01, on_bf16_grid


if __name__ == "__main__":
  pytest.main([__file__])
