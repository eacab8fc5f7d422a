"""Tests of PrivSPDMat (jaxdp/inference/spd_release.py; paper 003 Algorithm 2, Lemma 1)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdp.accounting import events
from jaxdp.audit import epsilon_lower_bound
from jaxdp.inference import sensitivities as sens
from jaxdp.inference import spd_release as spd


def _spd(rng, d):
  a = rng.normal(size=(d, d))
  return a @ a.T / d + 0.01 * np.eye(d)


@pytest.mark.parametrize("privacy", ["pure", "zcdp"])
@pytest.mark.parametrize("floor", [0.0, 0.3])
def test_output_symmetric_with_eigenvalues_at_or_above_floor(privacy, floor):
  rng = np.random.default_rng(0)
  m = jnp.asarray(_spd(rng, 5), jnp.float32)
  keys = jax.random.split(jax.random.key(1), 50)
  out = jax.jit(jax.vmap(lambda k: spd.priv_spd_matrix(k, m, 0.5, 1.0, privacy=privacy,
                                                       floor=floor)))(keys)
  out = np.asarray(out, np.float64)
  np.testing.assert_allclose(out, np.swapaxes(out, 1, 2), atol=1e-6)
  eig = np.linalg.eigvalsh(out)
  assert eig.min() >= floor - 1e-5
  # Noise this large must have pushed some eigenvalue onto the floor.
  assert np.any(np.abs(eig - floor) < 1e-5)


def test_infinite_phi_is_symmetrise_and_floor_only():
  rng = np.random.default_rng(2)
  m = _spd(rng, 4)
  out = spd.priv_spd_matrix(jax.random.key(0), jnp.asarray(m, jnp.float32), 0.1, phi=math.inf,
                            floor=0.0)
  np.testing.assert_allclose(out, m, rtol=1e-5, atol=1e-6)


def test_pure_noise_calibration():
  """eta ~ exp(-(phi/Delta)||eta||) in R^{d^2}: ||eta|| ~ Gamma(d^2, Delta/phi)."""
  d, delta_s, phi = 3, 0.2, 0.5
  keys = jax.random.split(jax.random.key(3), 5000)
  eta = jax.jit(jax.vmap(lambda k: spd.spd_noise(k, d, delta_s, phi, privacy="pure")))(keys)
  norms = np.linalg.norm(np.asarray(eta).reshape(len(keys), -1), axis=1)
  mean, sd = d * d * delta_s / phi, math.sqrt(d * d) * delta_s / phi
  assert abs(norms.mean() - mean) < 5 * sd / math.sqrt(len(keys))


def test_zcdp_noise_calibration():
  """eta ~ N(0, Delta^2/(2 phi) I) (Bun & Steinke Prop. 3)."""
  d, delta_s, phi = 4, 0.3, 0.05
  eta = np.asarray(spd.spd_noise(jax.random.key(4), 300, delta_s, phi, privacy="zcdp"))
  sigma = delta_s / math.sqrt(2 * phi)
  n = eta.size
  assert abs(eta.std() / sigma - 1) < 5 / math.sqrt(2 * n)
  del d


def test_events_and_validation():
  assert spd.priv_spd_matrix_event(0.3) == events.PureDpEvent(0.3, neighbouring="replace_one")
  assert spd.priv_spd_matrix_event(phi=0.3, privacy="zcdp") == events.ZCDpEvent(
      0.3, neighbouring="replace_one")
  assert isinstance(spd.priv_spd_matrix_event(math.inf), events.NonPrivateDpEvent)
  m = jnp.eye(2)
  k = jax.random.key(0)
  with pytest.raises(ValueError, match="sensitivity"):
    spd.priv_spd_matrix(k, m, 0.0, 1.0)
  with pytest.raises(ValueError, match="phi"):
    spd.priv_spd_matrix(k, m, 1.0, -1.0)
  with pytest.raises(ValueError, match="phi"):
    spd.priv_spd_matrix_event(0.0, privacy="zcdp")
  with pytest.raises(ValueError, match="square"):
    spd.priv_spd_matrix(k, jnp.ones((2, 3)), 1.0, 1.0)
  with pytest.raises(ValueError, match="privacy"):
    spd.priv_spd_matrix(k, m, 1.0, 1.0, privacy="approx")
  with pytest.raises(ValueError):
    spd.priv_spd_matrix(k, jnp.array([[jnp.nan, 0.0], [0.0, 1.0]]), 1.0, 1.0)


def _audit_pair():
  """Worst-case neighbours for the logistic Hessian at theta = 0 (Lemma 3 nearly tight)."""
  x = jnp.array([[1.0, 0.0], [0.0, 1.0]])
  x_nb = jnp.array([[1.0, 0.0], [-1.0, 0.0]])  # the second row replaced
  y = jnp.array([1.0, 1.0])
  th = jnp.zeros(2)
  f = lambda xx: sens.hessian(th, xx, y, loss="logistic", l2_reg=0.0)
  return f(x), f(x_nb), sens.logistic_hessian_sensitivity(2)


def _audit_stat(k, m, direction, sensitivity, phi):
  return jnp.dot(spd.priv_spd_matrix(k, m, sensitivity, phi, floor=-1e9).ravel(), direction)


# One compiled program for every audit run: the sensitivity and phi are arguments (traced), not
# constants, so the correct and the understated sensitivity share it.
_audit_run = jax.jit(jax.vmap(_audit_stat, in_axes=(0, None, None, None, None)))


def _audit_stats(h0, h1, sensitivity, phi, key, trials=10000):
  direction = (h1 - h0).ravel()
  direction = direction / jnp.linalg.norm(direction)
  k0, k1 = jax.random.split(key)
  args = (direction, jnp.float32(sensitivity), jnp.float32(phi))
  return (np.asarray(_audit_run(jax.random.split(k0, trials), h0, *args)),
          np.asarray(_audit_run(jax.random.split(k1, trials), h1, *args)))


def test_audit_priv_spd_matrix_respects_epsilon_and_catches_a_bug():
  """Empirical lower bound <= phi; with the sensitivity understated 8x it exceeds phi."""
  h0, h1, s = _audit_pair()
  phi = 1.0
  a, b = _audit_stats(h0, h1, s, phi, jax.random.key(11))
  ok = epsilon_lower_bound(a, b, confidence=0.95, claimed_epsilon=phi)
  assert ok.epsilon_lower_bound <= phi
  a, b = _audit_stats(h0, h1, s / 8, phi, jax.random.key(12))
  buggy = epsilon_lower_bound(a, b, confidence=0.95, claimed_epsilon=phi)
  assert buggy.epsilon_lower_bound > phi


@pytest.mark.parametrize("floor", [math.nan, math.inf, None, "0", jnp.ones(2)])
def test_floor_must_be_a_real_number(floor):
  with pytest.raises(ValueError, match="floor"):
    spd.priv_spd_matrix(jax.random.key(0), jnp.eye(2), 1.0, 1.0, floor=floor)
  # -inf (no floor) is allowed.
  out = spd.priv_spd_matrix(jax.random.key(0), jnp.eye(2), 1.0, 1.0, floor=-math.inf)
  assert np.all(np.isfinite(np.asarray(out)))
