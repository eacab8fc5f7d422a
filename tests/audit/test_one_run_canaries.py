"""Tests of the one-run audit canaries and run helpers (jaxdp.audit.one_run_canaries)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxdp.accounting import PrivacyAccountant
from jaxdp.audit import one_run
from jaxdp.audit import one_run_canaries as oc


def _loss(params, x, y):
  return -jax.nn.log_softmax(x @ params["w"])[y]


def _data(n=32, d=4, seed=0):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(n, d)).astype(np.float32) / 3
  return x, (x[:, 0] > 0).astype(np.int32)


def _params(d=4):
  return {"w": jnp.zeros((d, 2))}


def test_dirac_canary_gradients():
  m = 5
  loss = oc.with_dirac_canaries(_loss, scale=2.0)
  params = (_params(), jnp.zeros(m))
  x = jnp.ones(4) / 4
  # One compiled gradient for the three rows (the label and row id are traced scalars).
  grad = jax.jit(jax.grad(loss))
  g_canary = grad(params, x, 0, 3)
  np.testing.assert_allclose(g_canary[1], 2.0 * np.eye(m)[3])
  assert float(jnp.abs(g_canary[0]["w"]).sum()) == 0.0
  g_real = grad(params, x, 1, oc.REAL_ROW)
  assert float(jnp.abs(g_real[1]).sum()) == 0.0 and float(jnp.abs(g_real[0]["w"]).sum()) > 0
  g_null = grad(params, x, 0, oc.NULL_ROW)
  assert all(float(jnp.abs(leaf).sum()) == 0.0 for leaf in jax.tree.leaves(g_null))


def test_gradient_canaries_point_along_their_direction_and_score():
  key = jax.random.key(3)
  loss = oc.with_gradient_canaries(_loss, key, scale=1.5)
  params = _params()
  u = oc.canary_directions(key, 4, 8)
  np.testing.assert_allclose(np.linalg.norm(np.asarray(u), axis=1), 1.0, rtol=1e-5)
  g = jax.jit(jax.grad(loss))(params, jnp.zeros(4), 0, 2)  # one program, not one per primitive
  np.testing.assert_allclose(np.asarray(g["w"]).ravel(), 1.5 * np.asarray(u[2]), rtol=1e-5)
  moved = {"w": params["w"] - 0.1 * g["w"]}
  scores = oc.gradient_canary_scores(key, 4, params, moved)
  assert int(np.argmax(scores)) == 2 and scores[2] == pytest.approx(0.15, rel=1e-4)


def test_mislabelled_canaries_and_mixing():
  x, y = _data(50)
  xc, y_wrong, y_true = oc.mislabelled_canaries(jax.random.key(0), x, y, 20, 2)
  assert xc.shape == (20, 4) and np.all(y_wrong != y_true)
  inc = oc.include_coins(jax.random.key(1), 20)
  xa, ya, w = oc.mix_input_canaries(x, y, xc, y_wrong, inc)
  assert xa.shape == (70, 4) and np.array_equal(w[50:], inc.astype(np.float32))
  xg, yg, ids = oc.mix_gradient_canaries(x, y, inc)
  assert np.all(ids[:50] == oc.REAL_ROW)
  assert np.all(ids[50:][inc] == np.arange(20)[inc]) and np.all(ids[50:][~inc] == oc.NULL_ROW)


def _run(**kw):
  x, y = _data()
  acc = PrivacyAccountant()
  args = dict(key=jax.random.key(5), accountant=acc, delta=1e-5, num_canaries=40,
              l2_clip_norm=1.0, sample_rate=1.0, steps=2, optimizer=optax.sgd(1.0),
              k_plus=10, k_minus=10)
  args.update(kw)
  return oc.audit_dpsgd_run(_loss, _params(), x, y, **args), acc


def test_audit_dpsgd_run_nearly_noiseless_dirac_is_perfect_and_paid():
  res, acc = _run(noise_multiplier=0.01)
  assert res.steinke.num_correct == res.steinke.num_guesses == 20
  p = 0.05 ** (1 / 20)
  # Perfect guesses: the Steinke bound is the closed form up to its delta term (tiny here).
  assert res.steinke.epsilon_lower_bound == pytest.approx(math.log(p / (1 - p)), abs=0.05)
  assert res.fdp.epsilon_lower_bound > res.steinke.epsilon_lower_bound
  assert acc.ledger[0][1] == 2 and res.epsilon_claimed > 100
  assert res.scores.shape == (40,) and res.included.dtype == bool
  assert np.all(res.scores[res.included] > res.scores[~res.included].max())


@pytest.mark.slow
def test_audit_dpsgd_run_correct_plan_stays_below_claim_slow():
  res, _ = _run(noise_multiplier=1.0, sample_rate=0.5, steps=3, k_plus=None, k_minus=None)
  assert not res.steinke.violates_claim and not res.fdp.violates_claim
  assert res.steinke.num_hypotheses == len(one_run.default_k_grid(40))


def test_audit_dpsgd_run_bad_input_before_spend():
  acc = PrivacyAccountant()
  x, y = _data()
  with pytest.raises(ValueError, match="canary"):
    oc.audit_dpsgd_run(_loss, _params(), x, y, key=jax.random.key(0), accountant=acc, delta=1e-5,
                       canary="nope", l2_clip_norm=1.0, sample_rate=1.0, steps=1,
                       noise_multiplier=1.0)
  with pytest.raises(ValueError, match="num_examples"):
    oc.audit_dpsgd_run(_loss, _params(), x, y, key=jax.random.key(0), accountant=acc, delta=1e-5,
                       num_examples=3, l2_clip_norm=1.0, sample_rate=1.0, steps=1,
                       noise_multiplier=1.0)
  with pytest.raises(ValueError, match="canary_examples"):
    oc.audit_dpsgd_run(_loss, _params(), x, y, key=jax.random.key(0), accountant=acc, delta=1e-5,
                       canary="input", l2_clip_norm=1.0, sample_rate=1.0, steps=1,
                       noise_multiplier=1.0)
  with pytest.raises(ValueError, match="accountant"):
    oc.audit_dpsgd_run(_loss, _params(), x, y, key=jax.random.key(0), accountant=None,
                       delta=1e-5, l2_clip_norm=1.0, sample_rate=1.0, steps=1,
                       noise_multiplier=1.0)
  assert not acc.ledger


@pytest.mark.slow
def test_audit_dpsgd_run_input_canaries_and_bandmf_slow():
  from jaxdp.dpsgd.correlated import BandMF
  x, y = _data(64)
  xc, y_wrong, _ = oc.mislabelled_canaries(jax.random.key(2), *_data(80, seed=1), 40, 2)
  res, acc = _run(canary="input", canary_examples=(xc, y_wrong), noise_multiplier=0.01, steps=5)
  assert res.steinke.num_guesses == 20 and acc.ledger
  res, acc = _run(noise_multiplier=0.5, noise_strategy=BandMF.dp_sgd(), min_separation=1,
                  sample_rate=0.5, steps=4)
  assert acc.ledger and not res.steinke.violates_claim and not res.fdp.violates_claim


@pytest.mark.slow
def test_audit_dpsgd_run_broken_noise_exceeds_claim_slow():
  # Noise 10x below the claim's sigma on full batches: the audit must refute the claim.
  from jaxdp.accounting import dpsgd_epsilon
  claimed = dpsgd_epsilon(5.0, 1.0, 4, 1e-5)
  res, _ = _run(noise_multiplier=0.5, steps=4, num_canaries=400, k_plus=None, k_minus=None,
                epsilon_claimed=claimed)
  assert res.steinke.violates_claim and res.fdp.violates_claim


@pytest.mark.slow
def test_audit_training_run_logistic_regression_slow():
  from jaxdp.training import PrivateLogisticRegression
  x, y = _data(60)
  pool_x, pool_y = _data(80, seed=1)
  canaries = oc.mislabelled_canaries(jax.random.key(4), pool_x, pool_y, 40, 2)
  acc = PrivacyAccountant()
  est = PrivateLogisticRegression(epsilon=1.0, accountant=acc, seed=0, classes=[0, 1],
                                  normalize=True)
  res = oc.audit_training_run(est, x, y, canaries, key=jax.random.key(9))
  assert res.epsilon_claimed == 1.0 and res.delta == 0.0 and len(acc.ledger) == 1
  assert not res.steinke.violates_claim and res.fdp is not None
  assert res.scores.shape == (40,) and np.all(np.isfinite(res.scores))
