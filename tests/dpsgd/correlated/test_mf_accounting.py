"""Tests of jaxdp.dpsgd.correlated.accounting: one DpEvent per MF run."""

import dp_accounting
import numpy as np
import pytest

from jaxdp.accounting import dpsgd_accounting, events
from jaxdp.accounting.analytic_gaussian import analytic_gaussian_epsilon
from jaxdp.dpsgd.correlated import (BLT, BandMF, calibrate_mf_noise_multiplier, mf_epsilon,
                                       mf_event)
from jaxdp.dpsgd.correlated import accounting
from jaxdp.dpsgd.correlated.sensitivity import sensitivity

DELTA = 1e-5


def test_one_band_amplified_is_dp_sgd_event_and_epsilon():
  sigma, q, steps = 1.1, 0.01, 300
  ev = mf_event(BandMF.dp_sgd(), noise_multiplier=sigma, num_steps=steps, min_separation=1,
                sample_rate=q)
  assert ev == dpsgd_accounting.dpsgd_event(sigma, q, steps)
  for method in ("rdp", "pld"):
    assert mf_epsilon(BandMF.dp_sgd(), noise_multiplier=sigma, num_steps=steps,
                      min_separation=1, sample_rate=q, delta=DELTA, accountant=method) == \
        dpsgd_accounting.dpsgd_epsilon(sigma, q, steps, DELTA, method)


def test_one_band_full_batch_matches_dp_sgd_full_batch():
  sigma, steps = 3.0, 40
  ev = mf_event(BandMF.dp_sgd(), noise_multiplier=sigma, num_steps=steps, min_separation=1,
                sample_rate=1.0)
  assert isinstance(ev, events.GaussianDpEvent)
  assert ev.noise_multiplier == pytest.approx(sigma / np.sqrt(steps), rel=1e-12)
  got = mf_epsilon(BandMF.dp_sgd(), noise_multiplier=sigma, num_steps=steps, min_separation=1,
                   sample_rate=1.0, delta=DELTA)
  want = dpsgd_accounting.dpsgd_epsilon(sigma, 1.0, steps, DELTA)
  assert got == pytest.approx(want, rel=1e-9)


def test_amplified_bandmf_is_k_rounds_of_the_sampled_gaussian_in_dp_accounting():
  strategy = BandMF(np.array([1.0, 0.5, 0.3, 0.1]))
  n, b, p, sigma = 100, 4, 0.2, 0.9
  assert accounting.analysis(strategy, b, p) == accounting.AMPLIFIED
  k = int(np.ceil(n / b))
  acc = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
  acc.compose(dp_accounting.PoissonSampledDpEvent(p, dp_accounting.GaussianDpEvent(sigma)), k)
  got = mf_epsilon(strategy, noise_multiplier=sigma, num_steps=n, min_separation=b,
                   sample_rate=p, delta=DELTA, accountant="pld")
  assert got == pytest.approx(acc.get_epsilon(DELTA), rel=1e-6)


@pytest.mark.parametrize("strategy,b,p", [
    (BandMF(np.array([1.0, 0.5, 0.3])), 1, 0.3),   # bands > b: not amplifiable
    (BandMF(np.array([1.0, 0.5, 0.3])), 3, 1.0),   # p = 1: nothing to amplify
    (BLT(np.array([0.8, 0.3]), np.array([0.3, 0.2])), 5, 0.5),
])
def test_deterministic_run_is_one_gaussian_of_the_run_sensitivity(strategy, b, p):
  n, sigma = 20, 2.0
  assert accounting.analysis(strategy, b, p) == accounting.DETERMINISTIC
  k = int(np.ceil(n / b))
  sens = sensitivity(strategy, n, max_participations=k, min_separation=b)
  s1 = np.linalg.norm(strategy.coefficients(n))
  ev = mf_event(strategy, noise_multiplier=sigma, num_steps=n, min_separation=b, sample_rate=p)
  assert ev.noise_multiplier == pytest.approx(sigma * s1 / sens, rel=1e-12)
  got = mf_epsilon(strategy, noise_multiplier=sigma, num_steps=n, min_separation=b,
                   sample_rate=p, delta=DELTA, accountant="pld")
  exact = analytic_gaussian_epsilon(sigma * s1 / sens, DELTA)
  assert exact <= got <= exact * 1.01


@pytest.mark.parametrize("strategy,b,p", [
    (BandMF(np.array([1.0, 0.4])), 2, 0.1),
    (BLT(np.array([0.6]), np.array([0.3])), 3, 1.0),
])
def test_calibration_meets_the_target_tightly(strategy, b, p):
  n, eps = 30, 2.0
  sigma = calibrate_mf_noise_multiplier(eps, DELTA, strategy, num_steps=n, min_separation=b,
                                        sample_rate=p)
  got = mf_epsilon(strategy, noise_multiplier=sigma, num_steps=n, min_separation=b,
                   sample_rate=p, delta=DELTA)
  assert got <= eps
  more = mf_epsilon(strategy, noise_multiplier=sigma * 0.99, num_steps=n, min_separation=b,
                    sample_rate=p, delta=DELTA)
  assert more > eps


def test_event_tags_and_bad_arguments():
  ev = mf_event(BLT(np.array([0.5]), np.array([0.2])), noise_multiplier=1.0, num_steps=5,
                min_separation=1, sample_rate=1.0, unit="user")
  assert ev.neighbouring == "add_remove" and ev.unit == "user"
  assert isinstance(mf_event(BandMF.dp_sgd(), noise_multiplier=0.0, num_steps=5,
                             min_separation=1, sample_rate=0.5), events.NonPrivateDpEvent)
  with pytest.raises(ValueError, match="min_separation"):
    mf_event(BandMF.dp_sgd(), noise_multiplier=1.0, num_steps=5, min_separation=0,
             sample_rate=0.5)
  with pytest.raises(ValueError, match="sample_rate"):
    mf_event(BandMF.dp_sgd(), noise_multiplier=1.0, num_steps=5, min_separation=1,
             sample_rate=0.0)
  with pytest.raises(TypeError, match="strategy"):
    mf_event(np.eye(2), noise_multiplier=1.0, num_steps=5, min_separation=1, sample_rate=0.5)
  with pytest.raises(ValueError, match="pld"):
    mf_epsilon(BandMF.dp_sgd(), noise_multiplier=1.0, num_steps=5, min_separation=1,
               sample_rate=0.5, delta=DELTA, accountant="moments")


def test_replace_one_runs_pay_the_replace_one_event_of_twice_the_sensitivity():
  """Amplified: k replace-one sampled Gaussians (sigma / 2); unamplified: sigma s_1 / (2 sens)."""
  from jaxdp.accounting import events as ev
  from jaxdp.dpsgd.correlated import BLT, BandMF
  from jaxdp.dpsgd.correlated import accounting as mfa
  amplified = mfa.mf_event(BandMF(np.array([1.0, 0.5])), noise_multiplier=1.2, num_steps=8,
                           min_separation=2, sample_rate=0.1, neighbouring="replace_one")
  inner = amplified.event
  assert amplified.count == 4 and inner.sampling_probability == 0.1
  assert inner.event.noise_multiplier == pytest.approx(0.6)
  assert inner.event.neighbouring == ev.REPLACE_ONE
  blt = BLT(theta=[0.5], omega=[0.3])
  add = mfa.mf_event(blt, noise_multiplier=1.2, num_steps=8, min_separation=2, sample_rate=0.1)
  rep = mfa.mf_event(blt, noise_multiplier=1.2, num_steps=8, min_separation=2, sample_rate=0.1,
                     neighbouring="replace_one")
  assert rep.noise_multiplier == pytest.approx(add.noise_multiplier / 2)
  sigma = mfa.calibrate_mf_noise_multiplier(2.0, 1e-5, blt, num_steps=8, min_separation=2,
                                            sample_rate=0.1, accountant="pld",
                                            neighbouring="replace_one")
  eps = mfa.mf_epsilon(blt, noise_multiplier=sigma, num_steps=8, min_separation=2,
                       sample_rate=0.1, delta=1e-5, accountant="pld", neighbouring="replace_one")
  assert 1.9 < eps <= 2.0
  assert mfa.mf_epsilon(blt, noise_multiplier=0.99 * sigma, num_steps=8, min_separation=2,
                        sample_rate=0.1, delta=1e-5, accountant="pld",
                        neighbouring="replace_one") > 2.0


def test_a_replace_one_correlated_plan_pays_what_it_reports():
  import jax
  from jaxdp.accounting import PrivacyAccountant
  from jaxdp.dpsgd import make_private
  from jaxdp.dpsgd.correlated import BandMF
  plan = make_private(lambda w, x, y: (x @ w - y) ** 2, l2_clip_norm=1.0, num_examples=64,
                      expected_batch_size=8, noise_multiplier=2.5, delta=1e-5, steps=8,
                      key=jax.random.key(0), noise_strategy=BandMF(np.array([1.0, 0.5])),
                      min_separation=2, neighbouring="replace_one", accountant_method="pld")
  acc = PrivacyAccountant()
  plan.sampler(acc).pay(1)
  assert acc.neighbouring == "replace_one" and len(acc.ledger) == 1
  assert acc.get_epsilon(1e-5, "pld") == pytest.approx(plan.epsilon(8), rel=1e-9)
