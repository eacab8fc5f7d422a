"""Tests of jaxdp.prediction.pate (LNMax/GNMax labelling, student, accounting)."""

import dataclasses
import math

import jax
import numpy as np
import pytest
from scipy import stats

from jaxdp.accounting import analytic_gaussian
from jaxdp.accounting import events
from jaxdp.accounting.accountant import PrivacyAccountant
from jaxdp.prediction import pate


def _votes_with_unique_plurality(m=300, c=5, t=25, seed=0):
  rng = np.random.default_rng(seed)
  out = []
  while len(out) < m:
    v = np.bincount(rng.integers(0, c, size=t), minlength=c)
    if np.sum(v == v.max()) == 1:
      out.append(v)
  return np.array(out)


@pytest.mark.parametrize("mechanism", ["lnmax", "gnmax"])
def test_labels_equal_plurality_without_noise(mechanism):
  votes = _votes_with_unique_plurality()
  labels = np.asarray(pate.noisy_max_labels(jax.random.key(0), votes, mechanism, 1e-4))
  np.testing.assert_array_equal(labels, np.argmax(votes, axis=1))
  keys = jax.random.split(jax.random.key(1), votes.shape[0])
  labels = np.asarray(pate.noisy_max_labels_from_keys(keys, votes, mechanism, 1e-4))
  np.testing.assert_array_equal(labels, np.argmax(votes, axis=1))
  # With large noise the labels do differ from the plurality (the noise is real).
  noisy = np.asarray(pate.noisy_max_labels(jax.random.key(2), votes, mechanism, 50.0))
  assert np.mean(noisy != np.argmax(votes, axis=1)) > 0.3


def test_noise_scales_and_events_match_formulas():
  eps, delta, budget = 2.0, 1e-5, 100
  b = pate.noisy_max_scale("lnmax", eps, 0.0, budget)
  assert b == pytest.approx(2 * budget / eps)  # Lap(2/eps') per label, eps' = eps/B
  ev = pate.noisy_max_event("lnmax", b)
  assert isinstance(ev, events.LaplaceDpEvent) and ev.noise_multiplier == pytest.approx(b / 2)
  sigma = pate.noisy_max_scale("gnmax", eps, delta, budget)
  assert sigma == pytest.approx(
      analytic_gaussian.analytic_gaussian_sigma(eps, delta, math.sqrt(2 * budget)), rel=1e-12)
  ev = pate.noisy_max_event("gnmax", sigma)
  assert ev.noise_multiplier == pytest.approx(sigma / math.sqrt(2))
  # Through the shared accountant the B labels stay within (eps, delta).
  for mech, scale, dlt in [("lnmax", b, 0.0), ("gnmax", sigma, delta)]:
    acc = PrivacyAccountant()
    acc.spend(pate.noisy_max_event(mech, scale), budget)
    assert acc.get_epsilon(dlt) <= eps * (1 + 1e-3)
  with pytest.raises(ValueError, match="delta"):
    pate.noisy_max_scale("gnmax", eps, 0.0, budget)
  with pytest.raises(ValueError, match="mechanism"):
    pate.noisy_max_scale("rnm", eps, delta, budget)


def _blobs(n, c=3, d=5, seed=0):
  rng = np.random.default_rng(seed)
  centers = 2.0 * rng.normal(size=(c, d))
  y = rng.integers(0, c, size=n)
  x = centers[y] + 0.5 * rng.normal(size=(n, d))
  x = x / np.linalg.norm(x, axis=1, keepdims=True)
  return x.astype(np.float32), y


def test_pate_end_to_end_small():
  x, y = _blobs(400, seed=1)
  x_pub, y_pub = _blobs(60, seed=1)  # same centers (seeded), fresh points
  res = pate.pate_label_and_train(jax.random.key(0), x, y, x_pub, num_teachers=16, num_classes=3,
                                  mechanism="gnmax", scale=3.0, delta=1e-5, max_iter=200)
  votes = np.asarray(res.nonprivate_votes)
  assert votes.shape == (60, 3) and np.all(votes.sum(axis=1) == 16)
  # The un-noised histograms are returned only under a name that says so (issue 26).
  assert "votes" not in {f.name for f in dataclasses.fields(res)}
  assert not hasattr(res, "votes")  # no alias under a name that does not say non-private
  assert np.mean(np.argmax(votes, axis=1) == y_pub) > 0.9  # the teachers learned
  plurality = np.argmax(votes, axis=1)
  assert np.mean(np.asarray(res.labels) == plurality) > 0.9
  student_pred = np.argmax(x_pub @ np.asarray(res.student.weights), axis=1)
  assert np.mean(student_pred == np.asarray(res.labels)) > 0.9
  # The reported epsilon is the accountant's for 60 GNMax labels of sigma=3.
  acc = PrivacyAccountant()
  acc.spend(events.GaussianDpEvent(noise_multiplier=3.0 / math.sqrt(2), neighbouring="replace_one"),
            60)
  assert res.epsilon == pytest.approx(acc.get_epsilon(1e-5), rel=1e-9)


def test_gnmax_log_q_is_union_bound_and_caps():
  votes = np.array([30, 10, 5, 0])
  sigma = 8.0
  expected = sum(stats.norm.sf(30 - v, scale=math.sqrt(2) * sigma) for v in votes[1:])
  assert math.exp(pate.gnmax_log_q(votes, sigma)) == pytest.approx(expected, rel=1e-10)
  # Monte Carlo: the true q is below the bound.
  rng = np.random.default_rng(0)
  noisy = votes + sigma * rng.normal(size=(200_000, 4))
  q_mc = np.mean(np.argmax(noisy, axis=1) != 0)
  assert q_mc <= expected * 1.02
  # A tie caps at log(1 - 1/C).
  assert pate.gnmax_log_q(np.array([5, 5, 5]), 1.0) == pytest.approx(math.log(2 / 3))


def _bernoulli_renyi(p, q, lam):
  return math.log(p**lam * q**(1 - lam) + (1 - p)**lam * (1 - q)**(1 - lam)) / (lam - 1)


@pytest.mark.parametrize("gap", [20, 30, 40])
def test_data_dependent_rdp_bounds_exact_two_class_divergence(gap):
  """Two classes: GNMax outputs the top class w.p. Phi(gap / (sqrt2 sigma)); exact Renyi."""
  sigma = 5.0
  log_q = pate.gnmax_log_q(np.array([50 + gap // 2, 50 - gap // 2]), sigma)
  orders = np.array([1.5, 2.0, 4.0, 8.0, 16.0])
  bound = pate.gnmax_data_dependent_rdp(log_q, sigma, orders)
  assert np.all(bound <= orders / sigma**2 + 1e-15) and np.all(bound >= 0)
  assert np.any(bound < 0.5 * orders / sigma**2)  # strictly data-dependent gain
  p = stats.norm.cdf(gap / (math.sqrt(2) * sigma))
  for shift in (-2, 2):  # one vote moves between the two classes
    q = stats.norm.cdf((gap + shift) / (math.sqrt(2) * sigma))
    for lam, b in zip(orders, bound):
      assert _bernoulli_renyi(p, q, lam) <= b + 1e-12


def test_data_dependent_rdp_falls_back_and_is_marked():
  sigma = 4.0
  orders = np.array([2.0, 5.0, 20.0])
  tie = pate.gnmax_data_dependent_rdp(pate.gnmax_log_q(np.array([10, 10]), sigma), sigma, orders)
  np.testing.assert_allclose(tie, orders / sigma**2)
  assert np.all(pate.gnmax_data_dependent_rdp(-math.inf, sigma, orders) == 0)
  with pytest.raises(ValueError, match="orders"):
    pate.gnmax_data_dependent_rdp(-1.0, sigma, [1.0])
  votes = np.tile(np.array([95, 3, 2]), (50, 1))
  res = pate.gnmax_data_dependent_epsilon(votes, 10.0, 1e-5)
  assert res.is_dp_guarantee is False
  assert res.epsilon < 0.5 * res.data_independent_epsilon
  # Its data-independent epsilon matches the RDP of 50 Gaussian events.
  lam = pate.DEFAULT_ORDERS
  assert res.data_independent_epsilon == pytest.approx(
      pate.rdp_to_epsilon(lam, 50 * lam / 100.0, 1e-5)[0])
  # Ambiguous votes give no gain.
  ambiguous = pate.gnmax_data_dependent_epsilon(np.tile(np.array([34, 33, 33]), (50, 1)), 10.0,
                                                1e-5)
  assert ambiguous.epsilon == pytest.approx(ambiguous.data_independent_epsilon)


@pytest.mark.parametrize("kwargs,match", [(dict(delta=1.5), "delta"), (dict(delta=math.nan), "delta"),
                                          (dict(scale=0.0), "scale"), (dict(scale=math.inf), "scale")])
def test_pate_bad_privacy_arguments_raise_before_training(kwargs, match):
  x, y = _blobs(40, seed=1)
  args = dict(num_teachers=4, num_classes=3, mechanism="gnmax", scale=3.0, delta=1e-5)
  args.update(kwargs)
  with pytest.raises(ValueError, match=match):
    pate.pate_label_and_train(jax.random.key(0), x, y, x[:5], **args)
