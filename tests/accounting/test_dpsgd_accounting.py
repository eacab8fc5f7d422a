"""Tests of DP-SGD accounting against literature values and round trips."""

import math

import pytest

from jaxdp.accounting import dpsgd_accounting


def test_opacus_pinned_rdp_value():
  # Opacus' RDP accountant test pins 7.32911 for sigma=1.5, q=0.04, 2250 steps, delta=1e-5.
  # dp_accounting's fractional-order RDP series gives 7.32933 (3e-5 relative): same orders and
  # the same (Balle et al. 2020) RDP -> DP conversion.
  eps = dpsgd_accounting.dpsgd_epsilon(1.5, 0.04, 2250, 1e-5, accountant="rdp")
  assert eps == pytest.approx(7.32911, rel=5e-5)


def test_abadi_et_al_mnist_setting():
  # Abadi et al. 2016 (moments accountant): q=0.01, sigma=4, E=... quoted eps ~ 1.26 for
  # T=10,000 steps at delta=1e-5 with their looser accountant; tighter RDP must not exceed it.
  eps = dpsgd_accounting.dpsgd_epsilon(4.0, 0.01, 10_000, 1e-5)
  assert 0.9 < eps < 1.26


def test_pld_is_tighter_than_rdp():
  rdp = dpsgd_accounting.dpsgd_epsilon(1.1, 256 / 60_000, 60 * 60_000 // 256, 1e-5, "rdp")
  pld = dpsgd_accounting.dpsgd_epsilon(1.1, 256 / 60_000, 60 * 60_000 // 256, 1e-5, "pld")
  assert pld < rdp
  assert pld > 0.8 * rdp


@pytest.mark.parametrize("accountant,target", [
    pytest.param("rdp", 0.5, marks=pytest.mark.slow), ("rdp", 1.0),
    pytest.param("rdp", 8.0, marks=pytest.mark.slow), ("pld", 0.5),
    pytest.param("pld", 1.0, marks=pytest.mark.slow),  # ~7 s; pld-0.5 and rdp-1.0 stay on
    pytest.param("pld", 8.0, marks=pytest.mark.slow),  # large-eps PLD grids take ~30 s
])
def test_calibrate_round_trip(accountant, target):
  q, steps, delta = 0.01, 1_000, 1e-5
  z = dpsgd_accounting.calibrate_noise_multiplier(target, delta, q, steps, accountant=accountant)
  assert dpsgd_accounting.dpsgd_epsilon(z, q, steps, delta, accountant) <= target
  # Near-minimal: 1% less noise overshoots the target.
  assert dpsgd_accounting.dpsgd_epsilon(0.99 * z, q, steps, delta, accountant) > target


def test_event_structure():
  event = dpsgd_accounting.dpsgd_event(1.3, 0.02, 500)
  assert event.count == 500
  assert event.event.sampling_probability == 0.02
  assert event.event.event.noise_multiplier == 1.3


def test_helpers():
  assert dpsgd_accounting.steps_for_epochs(2, 0.01) == 200
  assert dpsgd_accounting.expected_batch_size(0.01, 60_000) == pytest.approx(600.0)


@pytest.mark.parametrize("kwargs,match", [
    (dict(noise_multiplier=1.0, sample_rate=0.0, steps=10, delta=1e-5), "sample_rate"),
    (dict(noise_multiplier=1.0, sample_rate=1.5, steps=10, delta=1e-5), "sample_rate"),
    (dict(noise_multiplier=0.0, sample_rate=0.1, steps=10, delta=1e-5), "noise_multiplier"),
    (dict(noise_multiplier=1.0, sample_rate=0.1, steps=0, delta=1e-5), "steps"),
    (dict(noise_multiplier=1.0, sample_rate=0.1, steps=10, delta=0.0), "delta"),
    (dict(noise_multiplier=math.nan, sample_rate=0.1, steps=10, delta=1e-5), "NaN"),
])
def test_bad_input(kwargs, match):
  with pytest.raises(ValueError, match=match):
    dpsgd_accounting.dpsgd_epsilon(**kwargs)


def test_calibrate_bad_input():
  with pytest.raises(ValueError, match="target_epsilon"):
    dpsgd_accounting.calibrate_noise_multiplier(0.0, 1e-5, 0.01, 100)
  with pytest.raises(ValueError, match="accountant"):
    dpsgd_accounting.dpsgd_epsilon(1.0, 0.1, 10, 1e-5, accountant="moments")
