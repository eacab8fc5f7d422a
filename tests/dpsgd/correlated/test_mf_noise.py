"""Tests of jaxdp.dpsgd.correlated.noise: the streamed C^{-1} z."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdp import dpsgd
from jaxdp.dpsgd.correlated import BLT, BandMF, correlated_noise, noise_stddev
from jaxdp.dpsgd.correlated.noise import single_participation_sensitivity

N_STEPS = 7
PARAMS = {"w": jnp.zeros((4, 3), jnp.float32), "b": jnp.zeros((5,), jnp.float32)}


def _run(tx, grads, steps=N_STEPS):
  state = tx.init(PARAMS)
  out = []
  for _ in range(steps):
    u, state = tx.update(grads, state)
    out.append(u)
  return out, state


def _flat(outs, minus=0.0):
  return np.stack([np.concatenate([np.ravel(np.asarray(o["b"], np.float64) - minus),
                                   np.ravel(np.asarray(o["w"], np.float64) - minus)])
                   for o in outs])


GRADS = jax.tree.map(lambda p: jnp.full_like(p, 0.25), PARAMS)


def test_one_band_is_noisy_aggregate_bit_for_bit():
  key = jax.random.key(11)
  a, _ = _run(dpsgd.noisy_aggregate(1.3, 2.0, 10.0, key), GRADS)
  b, _ = _run(correlated_noise(BandMF.dp_sgd(), N_STEPS, 1.3, 2.0, 10.0, key), GRADS)
  for x, y in zip(a, b):
    for leaf in ("w", "b"):
      np.testing.assert_array_equal(np.asarray(x[leaf]), np.asarray(y[leaf]))


@pytest.mark.parametrize("strategy", [
    BandMF(np.array([1.0, 0.5, 0.25])),
    BandMF(np.array([2.0, -0.3, 0.1])),   # c_0 != 1, signed coefficients
    BLT(np.array([0.9, 0.3]), np.array([0.4, 0.2])),
], ids=["bandmf", "bandmf-signed", "blt"])
def test_streamed_noise_equals_dense_inverse(strategy):
  key = jax.random.key(5)
  # z_t: exactly what noisy_aggregate draws at std s_1 (same key splits, divisor 1).
  s1 = single_participation_sensitivity(strategy, N_STEPS)
  z, _ = _run(dpsgd.noisy_aggregate(s1, 1.0, 1.0, key), GRADS)
  w, _ = _run(correlated_noise(strategy, N_STEPS, 1.0, 1.0, 1.0, key), GRADS)
  zm, wm = _flat(z, 0.25), _flat(w, 0.25)
  c = strategy.matrix(N_STEPS)
  np.testing.assert_allclose(wm, np.linalg.solve(c, zm), atol=2e-5 * np.abs(zm).max())


def test_state_holds_bands_minus_one_or_buffers_vectors():
  key = jax.random.key(0)
  _, st = _run(correlated_noise(BandMF(np.array([1.0, 0.5, 0.2, 0.1])), 5, 1.0, 1.0, 1.0, key),
               GRADS, 2)
  assert st.history["w"].shape == (3, 4, 3) and int(st.count) == 2
  _, st = _run(correlated_noise(BLT(np.array([0.5, 0.9]), np.array([0.1, 0.2])), 5, 1.0, 1.0,
                                1.0, key), GRADS, 2)
  assert st.history["b"].shape == (2, 5)
  _, st = _run(correlated_noise(BandMF.dp_sgd(), 5, 1.0, 1.0, 1.0, key), GRADS, 1)
  assert st.history["w"].shape == (0, 4, 3)


def test_jit_same_key_same_noise_and_fresh_keys_differ():
  strategy = BLT(np.array([0.8]), np.array([0.3]))
  tx = correlated_noise(strategy, 4, 1.0, 1.0, 1.0, jax.random.key(3))
  state = tx.init(PARAMS)
  eager, s_eager = tx.update(GRADS, state)
  jitted, s_jit = jax.jit(tx.update)(GRADS, state)
  np.testing.assert_allclose(np.asarray(eager["w"]), np.asarray(jitted["w"]), rtol=1e-6)
  second, _ = tx.update(GRADS, s_eager)
  assert not np.allclose(np.asarray(second["w"]), np.asarray(eager["w"]))
  other, _ = correlated_noise(strategy, 4, 1.0, 1.0, 1.0, jax.random.key(4)).update(
      GRADS, correlated_noise(strategy, 4, 1.0, 1.0, 1.0, jax.random.key(4)).init(PARAMS))
  assert not np.allclose(np.asarray(other["w"]), np.asarray(eager["w"]))


def test_first_step_std_is_sigma_S_s1_over_c0():
  strategy = BandMF(np.array([1.0, 0.6, 0.3]))
  n, sigma, clip = 6, 1.5, 0.7
  want = sigma * clip * np.linalg.norm([1.0, 0.6, 0.3])
  assert noise_stddev(strategy, n, sigma, clip) == pytest.approx(want, rel=1e-12)
  keys = jax.random.split(jax.random.key(9), 2000)
  zero = {"v": jnp.zeros((8,), jnp.float32)}

  def first(k):
    tx = correlated_noise(strategy, n, sigma, clip, 1.0, k)
    return tx.update(zero, tx.init(zero))[0]["v"]

  draws = np.asarray(jax.vmap(first)(keys), np.float64).ravel()
  # 16,000 draws: the sample std is within 2% of the truth with probability > 1 - 1e-7.
  assert abs(draws.std() / want - 1) < 0.02


def test_bad_arguments_are_refused():
  key = jax.random.key(0)
  with pytest.raises(TypeError, match="strategy"):
    correlated_noise(np.eye(3), 3, 1.0, 1.0, 1.0, key)
  with pytest.raises(ValueError, match="num_steps"):
    correlated_noise(BandMF.dp_sgd(), 0, 1.0, 1.0, 1.0, key)
  with pytest.raises(ValueError, match="expected_batch_size"):
    correlated_noise(BandMF.dp_sgd(), 3, 1.0, 1.0, 0.0, key)
  with pytest.raises(ValueError, match="noise_multiplier"):
    correlated_noise(BandMF.dp_sgd(), 3, -1.0, 1.0, 1.0, key)
  with pytest.raises(ValueError, match="coefs"):
    BandMF(np.array([0.0, 1.0]))
  with pytest.raises(ValueError, match="theta"):
    BLT(np.array([1.2]), np.array([0.1]))
  with pytest.raises(ValueError, match="omega"):
    BLT(np.array([0.5]), np.array([-0.1]))
