"""Correlated noise with fixed-size batches or Poisson-sampled users: the unamplified run event.

Every expected value is recomputed here from the explicit strategy matrix C (a brute-force
maximum of ``||C u||`` over the participation patterns ``u in {0, 1}^n``) and dp_accounting
directly, not from the functions under test.
"""

import itertools

import dp_accounting
import numpy as np
import pytest
from dp_accounting.rdp import rdp_privacy_accountant

from jaxdp.accounting import dpsgd_accounting, events
from jaxdp.dpsgd import adaptive_clipping
from jaxdp.dpsgd.correlated import BLT, BandMF, ColumnNormalizedBanded
from jaxdp.dpsgd.correlated import accounting

DELTA = 1e-5
N, B = 500, 25  # fixed-size: B of N


def _brute_force_sensitivity(c: np.ndarray) -> float:
  """max over u in {0,1}^n of ||C u|| (exact sensitivity for X = C^T C >= 0, all u_i equal)."""
  n = c.shape[0]
  assert np.all(c.T @ c >= -1e-15)  # the strategies below: all u_i equal is a maximiser
  return max(np.linalg.norm(c @ np.array(u, float)) for u in itertools.product((0, 1), repeat=n))


STRATEGIES = [
    BandMF(np.array([1.0, 0.6, 0.3])),
    BLT(np.array([0.8, 0.3]), np.array([0.3, 0.2])),
]


@pytest.mark.parametrize("strategy", STRATEGIES, ids=["bandmf3", "blt"])
def test_fixed_size_run_is_one_gaussian_of_twice_the_all_steps_sensitivity(strategy):
  n, sigma = 8, 3.0
  c = strategy.matrix(n)
  s1 = np.max(np.linalg.norm(c, axis=0))
  want = sigma * s1 / (2.0 * _brute_force_sensitivity(c))
  assert accounting.fixed_size_analysis(strategy, N, B) == accounting.DETERMINISTIC
  event = accounting.fixed_size_mf_event(strategy, noise_multiplier=sigma, num_steps=n,
                                         num_examples=N, batch_size=B)
  assert isinstance(event, events.GaussianDpEvent)
  assert event.noise_multiplier == pytest.approx(want, rel=1e-12)
  assert events.leaf_tags(event) == {("replace_one", "example")}
  # The same rule as the Poisson plans' unamplified event at (k, b) = (n, 1), doubled.
  assert event == accounting.mf_event(strategy, noise_multiplier=sigma, num_steps=n,
                                      min_separation=1, sample_rate=1.0,
                                      neighbouring="replace_one")
  # Epsilon: dp_accounting's RDP on the explicit Gaussian (PLD: the next test).
  acc = rdp_privacy_accountant.RdpAccountant()
  acc.compose(dp_accounting.GaussianDpEvent(want))
  got = accounting.fixed_size_mf_epsilon(strategy, noise_multiplier=sigma, num_steps=n,
                                         num_examples=N, batch_size=B, delta=DELTA)
  assert got == pytest.approx(acc.get_epsilon(DELTA), rel=1e-9)


def test_fixed_size_pld_epsilon_is_dp_accounting_pld_of_the_explicit_gaussian():
  strategy, n, sigma = STRATEGIES[0], 8, 12.0
  want = sigma / (2.0 * _brute_force_sensitivity(strategy.matrix(n)))  # s_1 = ||c|| here
  want *= np.linalg.norm(strategy.coefficients(n))
  acc = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
  acc.compose(dp_accounting.GaussianDpEvent(want))
  got = accounting.fixed_size_mf_epsilon(strategy, noise_multiplier=sigma, num_steps=n,
                                         num_examples=N, batch_size=B, delta=DELTA,
                                         accountant="pld")
  assert got == pytest.approx(acc.get_epsilon(DELTA), rel=1e-6)


def test_column_normalized_banded_fixed_size_uses_the_same_sensitivity_rule():
  n, sigma = 6, 2.0
  table = np.abs(np.random.default_rng(0).normal(size=(n, 2))) + 0.1
  table[-1, 1] = 0.0  # outside the n x n matrix
  strategy = ColumnNormalizedBanded(table)
  c = strategy.matrix(n)
  want = sigma * 1.0 / (2.0 * _brute_force_sensitivity(c))  # unit columns: s_1 = 1
  event = accounting.fixed_size_mf_event(strategy, noise_multiplier=sigma, num_steps=n,
                                         num_examples=N, batch_size=B)
  assert event.noise_multiplier == pytest.approx(want, rel=1e-9)


def test_one_band_fixed_size_is_fixed_size_dp_sgd():
  # C diagonal: each step is an independent Gaussian on that step's sum, i.e. fixed-size DP-SGD.
  n, sigma = 30, 1.5
  strategy = BandMF.dp_sgd()
  assert accounting.fixed_size_analysis(strategy, N, B) == accounting.AMPLIFIED
  event = accounting.fixed_size_mf_event(strategy, noise_multiplier=sigma, num_steps=n,
                                         num_examples=N, batch_size=B)
  assert event == dpsgd_accounting.fixed_size_dpsgd_event(sigma, N, B, n)
  acc = rdp_privacy_accountant.RdpAccountant(
      neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
  acc.compose(dp_accounting.SampledWithoutReplacementDpEvent(
      N, B, dp_accounting.GaussianDpEvent(sigma / 2)), n)
  got = accounting.fixed_size_mf_epsilon(strategy, noise_multiplier=sigma, num_steps=n,
                                         num_examples=N, batch_size=B, delta=DELTA)
  assert got == pytest.approx(acc.get_epsilon(DELTA), rel=1e-9)
  # Full batch (B = N): nothing to amplify, the deterministic Gaussian(sigma / (2 sqrt(n))).
  full = accounting.fixed_size_mf_event(strategy, noise_multiplier=sigma, num_steps=n,
                                        num_examples=N, batch_size=N)
  assert full.noise_multiplier == pytest.approx(sigma / (2 * np.sqrt(n)), rel=1e-12)


def test_fixed_size_refuses_add_remove_and_pld_of_sampling_without_replacement():
  strategy = STRATEGIES[0]
  with pytest.raises(ValueError, match="replace_one"):
    accounting.fixed_size_mf_event(strategy, noise_multiplier=1.0, num_steps=5, num_examples=N,
                                   batch_size=B, neighbouring="add_remove")
  with pytest.raises(ValueError, match="pld|PLD"):
    accounting.fixed_size_mf_epsilon(BandMF.dp_sgd(), noise_multiplier=1.0, num_steps=5,
                                     num_examples=N, batch_size=B, delta=DELTA,
                                     accountant="pld")
  with pytest.raises(ValueError, match="batch_size"):
    accounting.fixed_size_mf_event(strategy, noise_multiplier=1.0, num_steps=5, num_examples=10,
                                   batch_size=11)
  with pytest.raises(ValueError, match="num_steps"):
    accounting.fixed_size_mf_event(ColumnNormalizedBanded(np.ones((4, 1))), noise_multiplier=1.0,
                                   num_steps=5, num_examples=N, batch_size=B)
  with pytest.raises(TypeError, match="Strategy"):
    accounting.fixed_size_mf_event("bandmf", noise_multiplier=1.0, num_steps=5, num_examples=N,
                                   batch_size=B)
  assert isinstance(accounting.fixed_size_mf_event(
      strategy, noise_multiplier=0.0, num_steps=5, num_examples=N, batch_size=B),
      events.NonPrivateDpEvent)


@pytest.mark.parametrize("method", ["rdp", pytest.param("pld", marks=pytest.mark.slow)])
def test_fixed_size_calibration_meets_the_target_tightly(method):
  strategy, n, target = STRATEGIES[0], 12, 4.0
  sigma = accounting.calibrate_fixed_size_mf_noise_multiplier(
      target, DELTA, strategy, num_steps=n, num_examples=N, batch_size=B, accountant=method)
  eps = lambda s: accounting.fixed_size_mf_epsilon(strategy, noise_multiplier=s, num_steps=n,
                                                   num_examples=N, batch_size=B, delta=DELTA,
                                                   accountant=method)
  assert eps(sigma) <= target < eps(0.995 * sigma)
  # Through the plan's shared argument rule.
  assert dpsgd_accounting.resolve_with(
      target, None, DELTA, lambda e, d: accounting.calibrate_fixed_size_mf_noise_multiplier(
          e, d, strategy, num_steps=n, num_examples=N, batch_size=B,
          accountant=method)) == sigma


def test_fixed_size_adaptive_split_keeps_the_replace_one_run_at_sigma():
  # Whitened replace-one run: gradient stream moves by 2 sens_{n,1}(C) (noise sigma_Delta s_1
  # per unit), each of the n G counts by 1 (noise sigma_b). Its multiplier must be sigma / (2 r).
  strategy, n, g, sigma, sigma_b = STRATEGIES[0], 10, 2, 1.5, 40.0
  c = strategy.matrix(n)
  s1 = np.max(np.linalg.norm(c, axis=0))
  sens = _brute_force_sensitivity(c)
  sd = accounting.fixed_size_adaptive_gradient_noise_multiplier(
      strategy, noise_multiplier=sigma, count_noise_multiplier=sigma_b, num_steps=n,
      num_examples=N, batch_size=B, num_counts=g)
  whitened_sq = (2 * sens / (sd * s1)) ** 2 + n * g * (1.0 / sigma_b) ** 2
  event = accounting.fixed_size_mf_event(strategy, noise_multiplier=sigma, num_steps=n,
                                         num_examples=N, batch_size=B)
  assert whitened_sq ** -0.5 == pytest.approx(event.noise_multiplier, rel=1e-9)
  assert whitened_sq ** -0.5 >= event.noise_multiplier  # rounding only adds noise
  # One band: per step, the add/remove split (replace-one doubles both blocks).
  sd1 = accounting.fixed_size_adaptive_gradient_noise_multiplier(
      BandMF.dp_sgd(), noise_multiplier=sigma, count_noise_multiplier=sigma_b, num_steps=n,
      num_examples=N, batch_size=B, num_counts=g)
  assert sd1 == adaptive_clipping.gradient_noise_multiplier(sigma, sigma_b, participations=g)
  with pytest.raises(ValueError, match="count_noise_multiplier"):
    accounting.fixed_size_adaptive_gradient_noise_multiplier(
        strategy, noise_multiplier=sigma, count_noise_multiplier=0.1, num_steps=n,
        num_examples=N, batch_size=B)


def test_poisson_users_at_one_group_is_mf_event_with_k_equal_n():
  # Poisson sampling of users = cyclic Poisson with b = 1: multi-band strategies are
  # unamplified at (k, b) = (n, 1); the one-band strategy is amplified DP-SGD.
  n, sigma, q = 8, 3.0, 0.1
  strategy = STRATEGIES[0]
  c = strategy.matrix(n)
  s1 = np.max(np.linalg.norm(c, axis=0))
  for relation, scale in (("add_remove", 1.0), ("replace_one", 2.0)):
    event = accounting.mf_event(strategy, noise_multiplier=sigma, num_steps=n, min_separation=1,
                                sample_rate=q, unit="user", neighbouring=relation)
    assert event.noise_multiplier == pytest.approx(
        sigma * s1 / (scale * _brute_force_sensitivity(c)), rel=1e-12)
    assert events.leaf_tags(event) == {(relation, "user")}
  one = accounting.mf_event(BandMF.dp_sgd(), noise_multiplier=sigma, num_steps=n,
                            min_separation=1, sample_rate=q, unit="user")
  assert one == dpsgd_accounting.dpsgd_event(sigma, q, n, unit="user")
