"""Tests of private selection among candidates (jaxdp/training/selection.py)."""

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from jaxdp import accounting
from jaxdp.accounting import events
from jaxdp.training import private_argmax, private_argmax_event
from jaxdp.training import selection


def _exact_probs(scores, beta):
  """softmax(beta * scores) in float64, written here (not the library's)."""
  z = beta * np.asarray(scores, np.float64)
  w = np.exp(z - z.max())
  return w / w.sum()


def _draws(scores, epsilon, sensitivity, num, seed=0):
  keys = jax.random.split(jax.random.key(seed), num)
  f = lambda k: private_argmax(k, scores, sensitivity=sensitivity, epsilon=epsilon)
  return np.asarray(jax.vmap(f)(keys))


def _check_law(num):
  """Empirical law vs the exact exponential-mechanism law beta = eps/(2 Delta); the
  monotone report-noisy-max scale beta = eps/Delta (wrong for these scores) is rejected."""
  n_val, eps = 50, 2.0
  # mean held-out accuracies of four candidates (multiples of 1/n_val)
  scores = np.array([40, 38, 35, 41], np.float64) / n_val
  sens = 1.0 / n_val
  out = _draws(jnp.asarray(scores, jnp.float32), eps, sens, num)
  counts = np.bincount(out, minlength=4)
  assert counts.sum() == num and out.min() >= 0 and out.max() <= 3
  right = _exact_probs(scores, eps / (2 * sens))
  wrong = _exact_probs(scores, eps / sens)
  p_right = stats.chisquare(counts, num * right).pvalue
  p_wrong = stats.chisquare(counts, num * wrong).pvalue
  assert p_right > 1e-6, (counts, num * right)
  assert p_wrong < 1e-6, (counts, num * wrong)


def test_law_is_the_exponential_mechanism():
  _check_law(20_000)


@pytest.mark.slow
def test_law_is_the_exponential_mechanism_slow():
  _check_law(400_000)


def test_mean_accuracy_sensitivity_and_factor_two_exact():
  """Exact worst case over every replacement of one held-out row (replace-one).

  Candidates' predictions on n_val held-out rows; a row is described by which
  candidates classify it correctly (a 0/1 pattern over the C candidates): every
  replacement of row 0 is a change of its pattern. With beta = eps/(2/n_val)
  every output's log-ratio is <= eps; with the monotone scale eps/(1/n_val) some
  exceeds eps (the scores are not monotone).
  """
  rng = np.random.default_rng(3)
  c, n_val, num_draws, eps = 5, 12, 3, 1.0
  correct = rng.integers(0, 2, size=(num_draws, c, n_val))  # draw x candidate x row
  worst_right = worst_wrong = 0.0
  for pattern in itertools.product((0, 1), repeat=c):
    other = correct.copy()
    other[:, :, 0] = np.asarray(pattern)[None, :]
    u, v = correct.mean(axis=(0, 2)), other.mean(axis=(0, 2))
    assert np.max(np.abs(u - v)) <= 1.0 / n_val + 1e-15  # averaging over draws keeps 1/n_val
    for beta, name in ((eps / (2.0 / n_val), "right"), (eps / (1.0 / n_val), "wrong")):
      lr = np.max(np.abs(np.log(_exact_probs(u, beta)) - np.log(_exact_probs(v, beta))))
      if name == "right":
        worst_right = max(worst_right, lr)
      else:
        worst_wrong = max(worst_wrong, lr)
  assert worst_right <= eps + 1e-12
  assert worst_wrong > eps


def test_same_key_same_result_and_keys_matter():
  scores = jnp.array([3.0, 2.0, 3.0, 1.0])
  key = jax.random.key(7)
  a = private_argmax(key, scores, sensitivity=1.0, epsilon=1.0)
  b = private_argmax(key, scores, sensitivity=1.0, epsilon=1.0)
  assert int(a) == int(b)
  assert a.dtype == jnp.int32 and a.shape == ()
  outs = {int(private_argmax(k, scores, sensitivity=1.0, epsilon=1.0))
          for k in jax.random.split(jax.random.key(8), 64)}
  assert len(outs) > 1  # the output is random, not the argmax


def test_single_candidate_and_lists():
  assert int(private_argmax(jax.random.key(0), [0.3], sensitivity=0.1, epsilon=1.0)) == 0
  assert 0 <= int(private_argmax(jax.random.key(0), [1, 5, 2], sensitivity=1, epsilon=0.5)) < 3


def test_event_and_accounting():
  ev = private_argmax_event(sensitivity=0.02, epsilon=0.3)
  assert isinstance(ev, events.ExponentialMechanismDpEvent)
  assert ev.epsilon == pytest.approx(0.3, rel=1e-15)
  assert ev.beta == pytest.approx(0.3 / (2 * 0.02), rel=1e-15)
  assert ev.neighbouring == "replace_one" and ev.unit == "example"
  assert private_argmax_event(sensitivity=1.0, epsilon=1.0,
                              neighbouring="add_remove").neighbouring == "add_remove"
  # composes with the candidates' releases in a replace-one accountant: eps shares add up
  acc = accounting.PrivacyAccountant(neighbouring="replace_one")
  acc.spend(ev)
  acc.spend(events.PureDpEvent(0.3, neighbouring="replace_one"), count=5)
  assert acc.pure_epsilon() == pytest.approx(6 * 0.3, rel=1e-12)


class _Called(Exception):
  pass


@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(key=None), TypeError, "key"),
    (dict(epsilon=0.0), ValueError, "epsilon"),
    (dict(epsilon=-1.0), ValueError, "epsilon"),
    (dict(epsilon=math.inf), ValueError, "epsilon"),
    (dict(epsilon=math.nan), ValueError, "epsilon"),
    (dict(epsilon=True), TypeError, "epsilon"),
    (dict(sensitivity=0.0), ValueError, "sensitivity"),
    (dict(sensitivity=math.inf), ValueError, "sensitivity"),
    (dict(sensitivity="1"), TypeError, "sensitivity"),
    (dict(scores=np.zeros((2, 3))), ValueError, "scores"),
    (dict(scores=np.zeros((0,))), ValueError, "scores"),
    (dict(scores=np.array([0.1, np.nan])), ValueError, "scores"),
    (dict(scores=np.array([0.1, np.inf])), ValueError, "scores"),
    (dict(scores=np.array([0.1, -np.inf])), ValueError, "scores"),
    (dict(scores=np.array(0.5)), ValueError, "scores"),
])
def test_bad_inputs_raise_before_any_work(kwargs, exc, match, monkeypatch):
  def boom(*args, **kw):
    raise _Called("the mechanism was called")
  monkeypatch.setattr(selection._exponential, "exponential_mechanism", boom)
  args = dict(key=jax.random.key(0), scores=np.array([0.5, 0.4]), sensitivity=0.1,
              epsilon=1.0)
  args.update(kwargs)
  with pytest.raises(exc, match=match):
    private_argmax(args["key"], args["scores"], sensitivity=args["sensitivity"],
                   epsilon=args["epsilon"])


def test_bad_event_inputs_and_traced_privacy_parameters():
  with pytest.raises(ValueError, match="epsilon"):
    private_argmax_event(sensitivity=1.0, epsilon=0.0)
  with pytest.raises(ValueError, match="sensitivity"):
    private_argmax_event(sensitivity=-1.0, epsilon=1.0)
  with pytest.raises(TypeError, match="epsilon"):
    jax.jit(lambda e: private_argmax(jax.random.key(0), jnp.ones(3), sensitivity=1.0,
                                     epsilon=e))(1.0)
