"""``adaptive_noisy_aggregate`` splits sigma between the gradient (sigma_Delta) and the count.

Andrew, Thakkar, McMahan & Ramaswamy 2021, Theorem 1: one update releases the
normalised clipped sum (sensitivity 1) with noise std ``sigma_Delta`` and the centered
unclipped count (sensitivity 1/2) with std ``sigma_b``; together they cost the DP-SGD
step of multiplier sigma exactly when ``sigma^-2 = sigma_Delta^-2 + (2 sigma_b)^-2``.
Noise of std sigma on the gradient leaves the count unpaid. These tests measure the
noise actually drawn: ``update * q N / C_t`` is the gradient noise when the clipped sum
is 0, and the count noise is recovered from ``C_{t+1} / C_t`` (inverting the geometric
update). sigma_Delta is computed here from the theorem, not by the library.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdp.dpsgd import adaptive_clipping as ac

SIGMA = 1.0
SIGMA_B = 1.0
QN = 64.0
C0 = 0.5
ETA = 0.25
GAMMA = 0.5
SIGMA_DELTA = (SIGMA ** -2 - (2.0 * SIGMA_B) ** -2) ** -0.5  # 1.1547: 15% above sigma


def _noise_draws(key, dim: int, steps: int):
  """``steps`` updates of a zero clipped sum and zero centered count.

  Returns ``(gradient noise (steps, dim), count noise (steps,))`` in float64, both
  in the units of the theorem (normalised sum, centered count).
  """
  config = ac.AdaptiveClipNorm(initial=C0, target_quantile=GAMMA, learning_rate=ETA,
                               count_noise_multiplier=SIGMA_B)
  tx = ac.adaptive_noisy_aggregate(config, noise_multiplier=SIGMA, expected_batch_size=QN,
                                   key=key)
  params = jnp.zeros((dim,), jnp.float32)
  state = tx.init(params)

  def body(state, _):
    c_t = ac.current_clip_norm(state)
    updates, new = tx.update((jnp.zeros((dim,), jnp.float32), jnp.float32(0.0)), state, params)
    return new, (updates, c_t, ac.current_clip_norm(new))

  _, (upd, c_t, c_next) = jax.jit(lambda s: jax.lax.scan(body, s, None, length=steps))(state)
  upd, c_t, c_next = (np.asarray(a, np.float64) for a in (upd, c_t, c_next))
  grad = upd * QN / c_t[:, None]
  btilde = GAMMA - np.log(c_next / c_t) / ETA
  count = QN * btilde - QN / 2.0
  return grad, count


def _variance_ratio_z(draws: np.ndarray, std: float) -> float:
  """``(s^2 / std^2 - 1) / sqrt(2 / m)``: the sample variance (known mean 0) in standard errors."""
  m = draws.size
  return (np.mean(draws ** 2) / std ** 2 - 1.0) / math.sqrt(2.0 / m)


@pytest.fixture(scope="module")
def draws():
  """One compiled program (compiling dominates): 1000 updates of a 64-dim zero sum."""
  return _noise_draws(jax.random.key(11), dim=64, steps=1000)


def test_gradient_noise_std_is_sigma_delta_and_count_noise_std_is_sigma_b(draws):
  grad, count = draws
  z_grad = _variance_ratio_z(grad, SIGMA_DELTA)
  assert abs(z_grad) < 5.0, (z_grad, np.std(grad), SIGMA_DELTA)
  # The total sigma on the gradient would be 25% less variance: hundreds of standard errors.
  assert _variance_ratio_z(grad, SIGMA) > 50.0
  z_count = _variance_ratio_z(count, SIGMA_B)
  assert abs(z_count) < 5.0, (z_count, np.std(count), SIGMA_B)


def test_gradient_and_count_noise_are_uncorrelated(draws):
  grad, count = draws
  m = count.shape[0]
  r = np.array([np.corrcoef(grad[:, j], count)[0, 1] for j in range(grad.shape[1])])
  # Each r is about N(0, 1/m) under independence; the largest of 64 stays below 4.5 SE.
  assert np.max(np.abs(r)) < 4.5 / math.sqrt(m), r
  # Pooled: sum_j r_j sqrt(m) / sqrt(64) is about N(0, 1).
  assert abs(np.sum(r) * math.sqrt(m) / math.sqrt(r.size)) < 4.0


def test_library_sigma_delta_matches_the_theorem():
  assert ac.gradient_noise_multiplier(SIGMA, SIGMA_B) == pytest.approx(SIGMA_DELTA, rel=1e-9)
  assert ac.gradient_noise_multiplier(SIGMA, SIGMA_B) >= SIGMA_DELTA  # rounded up, never down
