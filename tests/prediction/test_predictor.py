"""Tests of the budget-enforcing private predictors."""

import json

import jax
import numpy as np
import pytest

from jaxdp.accounting.accountant import PrivacyBudget
from jaxdp.errors import BudgetExceededError
from jaxdp.prediction import predictor as pr
from jaxdp.prediction import subsample_aggregate as sa

D, C = 4, 3


def _weights(seed=0):
  return np.random.default_rng(seed).normal(size=(D, C)).astype(np.float32)


def _queries(m, seed=1):
  x = np.random.default_rng(seed).normal(size=(m, D))
  return (x / (1.5 * np.linalg.norm(x, axis=1, keepdims=True))).astype(np.float32)


def _ps_predictor(budget=5, delta=0.0, seed=0, **kwargs):
  return pr.PredictionSensitivityPredictor.from_weights(
      _weights(seed), num_examples=500, l2_reg=0.1, epsilon=1.0, delta=delta, budget=budget,
      key=jax.random.key(42), **kwargs)


def test_answers_up_to_budget_then_refuses_whole_batches():
  p = _ps_predictor(budget=5)
  assert p.predict(_queries(3)).shape == (3, C)
  with pytest.raises(BudgetExceededError):
    p.predict(_queries(3))  # would cross: refused whole
  assert p.queries_answered == 3 and p.remaining_queries == 2
  assert p.predict(_queries(2)).shape == (2, C)
  with pytest.raises(BudgetExceededError):
    p.predict(_queries(1))  # the (B+1)-th query
  assert p.queries_answered == 5
  assert p.predict(_queries(0)).shape == (0, C)  # an empty batch spends nothing
  assert p.spent_epsilon() == pytest.approx(1.0, rel=1e-9)


def test_single_queries_b_plus_one_refused():
  p = _ps_predictor(budget=3, delta=1e-5)
  for i in range(3):
    p.predict(_queries(1, seed=i))
  with pytest.raises(BudgetExceededError):
    p.predict(_queries(1))
  assert p.spent_epsilon() <= 1.0 * (1 + 1e-3)


def test_bad_queries_raise_before_spending():
  p = _ps_predictor(budget=5)
  with pytest.raises(ValueError, match="unit L2 ball"):
    p.predict(3.0 * _queries(2))
  with pytest.raises(ValueError, match="features"):
    p.predict(np.zeros((2, D + 1), np.float32))
  with pytest.raises(ValueError, match="NaN"):
    p.predict(np.full((1, D), np.nan, np.float32))
  assert p.queries_answered == 0


def test_fresh_noise_per_query_and_determinism():
  x = _queries(1)
  p = _ps_predictor(budget=4)
  a, b = p.predict(x), p.predict(x)
  assert not np.allclose(np.asarray(a), np.asarray(b))
  q = _ps_predictor(budget=4)  # same key, new instance -> a fresh nonce, fresh noise
  assert not np.allclose(np.asarray(q.predict(x)), np.asarray(a))
  # Reproducible only on explicit request (same key, same unsafe_fixed_nonce).
  r1 = _ps_predictor(budget=4, unsafe_fixed_nonce=7)
  r2 = _ps_predictor(budget=4, unsafe_fixed_nonce=7)
  np.testing.assert_array_equal(np.asarray(r1.predict(x)), np.asarray(r2.predict(x)))
  # Noise has the calibrated scale: answers differ from the exact logits.
  assert not np.allclose(np.asarray(a), x @ _weights())


def test_state_path_restart_keeps_spent_budget(tmp_path):
  path = tmp_path / "pred.json"
  p = _ps_predictor(budget=5, state_path=path)
  first = np.asarray(p.predict(_queries(3)))
  saved = json.loads(path.read_text())
  assert saved["queries_answered"] == 3
  assert set(saved) == {"format", "kind", "budget", "epsilon", "delta", "queries_answered",
                        "query_event", "fingerprint"}  # the secret key is not saved
  restarted = _ps_predictor(budget=5, state_path=path)  # e.g. after a process restart
  assert restarted.queries_answered == 3
  nxt = np.asarray(restarted.predict(_queries(2)))
  # No noise reuse across the restart: query 3 differs from query 0 on the same input.
  assert not np.allclose(nxt[0], first[0])
  with pytest.raises(BudgetExceededError):
    restarted.predict(_queries(1))
  assert json.loads(path.read_text())["queries_answered"] == 5


def test_state_dict_round_trip_and_refusals():
  p = _ps_predictor(budget=5)
  p.predict(_queries(2))
  state = p.state_dict()
  q = _ps_predictor(budget=5)
  q.load_state_dict(state)
  assert q.queries_answered == 2
  q.predict(_queries(1))
  with pytest.raises(ValueError, match="reset"):
    q.load_state_dict(state)  # would lower the count
  with pytest.raises(ValueError, match="fingerprint"):
    _ps_predictor(budget=5, seed=9).load_state_dict(state)  # other model
  with pytest.raises(ValueError, match="budget"):
    _ps_predictor(budget=6).load_state_dict(state)
  with pytest.raises(ValueError, match="format"):
    q.load_state_dict({**state, "format": "other"})
  with pytest.raises(ValueError, match="budget"):
    _ps_predictor(budget=2**32)


def test_shared_privacy_budget_refuses_whole_batch():
  shared = PrivacyBudget(epsilon=0.5)  # half of the predictor's eps=1 over B=10
  p = _ps_predictor(budget=10, privacy_budget=shared)
  p.predict(_queries(4))  # 4 x 0.1
  with pytest.raises(BudgetExceededError):
    p.predict(_queries(2))
  assert p.queries_answered == 4
  assert shared.spent_epsilon == pytest.approx(0.4, rel=1e-9)
  p.predict(_queries(1))
  assert shared.spent_epsilon == pytest.approx(0.5, rel=1e-9)


def _teacher_weights(t=9, seed=0):
  return np.random.default_rng(seed).normal(size=(t, D, C)).astype(np.float32)


@pytest.mark.parametrize("kind", ["exponential", "lnmax", "gnmax"])
def test_voting_predictors(kind):
  w = _teacher_weights()
  kwargs = dict(epsilon=1.0, budget=6, key=jax.random.key(3))
  if kind == "exponential":
    p = pr.SubsampleAggregatePredictor.from_linear_teachers(w, delta=0.0, **kwargs)
    assert p.beta == pytest.approx(1.0 / 12)
  else:
    p = pr.NoisyMaxPredictor.from_linear_teachers(
        w, mechanism=kind, delta=1e-5 if kind == "gnmax" else 0.0, **kwargs)
  x = np.random.default_rng(5).normal(size=(6, D)).astype(np.float32)
  labels = np.asarray(p.predict(x))
  assert labels.shape == (6,) and labels.min() >= 0 and labels.max() < C
  np.testing.assert_array_equal(np.asarray(p.nonprivate_votes(x)), np.asarray(sa.linear_teacher_votes(w, x)))
  with pytest.raises(BudgetExceededError):
    p.predict(x[:1])
  assert p.spent_epsilon() <= 1.0 * (1 + 1e-3)
  # Different teachers -> a saved state does not load.
  other = type(p).from_linear_teachers(_teacher_weights(seed=1), **(
      dict(delta=0.0) if kind == "exponential" else
      dict(mechanism=kind, delta=1e-5 if kind == "gnmax" else 0.0)), **kwargs)
  with pytest.raises(ValueError, match="fingerprint"):
    other.load_state_dict(p.state_dict())


def _fold_keys(key, first, m):
  return jax.vmap(lambda i: jax.random.fold_in(key, i))(first + np.arange(m, dtype=np.uint32))


@pytest.mark.parametrize("delta", [0.0, 1e-5])
def test_prediction_sensitivity_answers_use_the_calibrated_noise_and_fresh_keys(delta):
  """predict() == calibrated noise on the exact logits, query i drawn with fold_in(k_inst, i)."""
  from jaxdp.prediction import prediction_sensitivity as ps
  p = _ps_predictor(budget=6, delta=delta, unsafe_fixed_nonce=2**100 + 5)
  inst = pr._instance_key(jax.random.key(42), 2**100 + 5)  # pylint: disable=protected-access
  cal = ps.calibrate_prediction_sensitivity(1.0, delta, 6, 500, 0.1)
  assert p.calibration == cal
  x = _queries(3)
  logits = x @ _weights()
  first = np.asarray(p.predict(x))
  second = np.asarray(p.predict(x))
  for start, got in ((0, first), (3, second)):
    expected = ps.noisy_logits_from_keys(_fold_keys(inst, start, 3), logits,
                                         cal.noise, cal.scale)
    np.testing.assert_allclose(got, np.asarray(expected), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("kind", ["exponential", "lnmax", "gnmax"])
def test_voting_predictor_answers_use_the_calibrated_noise(kind):
  from jaxdp.prediction import pate
  w = _teacher_weights()
  # A large epsilon keeps the noise comparable to the votes, so a wrong scale changes many labels.
  eps = 200.0
  kwargs = dict(epsilon=eps, budget=400, key=jax.random.key(7), unsafe_fixed_nonce=11)
  x = np.random.default_rng(6).normal(size=(400, D)).astype(np.float32)
  votes = sa.linear_teacher_votes(w, x)
  keys = _fold_keys(pr._instance_key(jax.random.key(7), 11), 0, 400)  # pylint: disable=protected-access
  if kind == "exponential":
    p = pr.SubsampleAggregatePredictor.from_linear_teachers(w, delta=0.0, **kwargs)
    expected = sa.aggregate_exponential_from_keys(keys, votes, eps / 800)
    wrong = sa.aggregate_exponential_from_keys(keys, votes, 2 * eps / 800)
  else:
    delta = 1e-5 if kind == "gnmax" else 0.0
    p = pr.NoisyMaxPredictor.from_linear_teachers(w, mechanism=kind, delta=delta, **kwargs)
    scale = pate.noisy_max_scale(kind, eps, delta, 400)
    expected = pate.noisy_max_labels_from_keys(keys, votes, kind, scale)
    wrong = pate.noisy_max_labels_from_keys(keys, votes, kind, scale / 2)
  assert np.sum(np.asarray(wrong) != np.asarray(expected)) > 10  # the check has power
  np.testing.assert_array_equal(np.asarray(p.predict(x)), np.asarray(expected))


def test_non_finite_weights_are_refused():
  w = _weights()
  w[0, 0] = np.nan
  with pytest.raises(ValueError, match="weights"):
    pr.PredictionSensitivityPredictor.from_weights(
        w, num_examples=500, l2_reg=0.1, epsilon=1.0, delta=0.0, budget=5, key=jax.random.key(0))
