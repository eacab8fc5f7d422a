"""repeat_and_select: only the best run leaves, one event spent before any run, keys, refusals."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdp import tuning
from jaxdp.accounting import PrivacyAccountant, PrivacyBudget, events
from jaxdp.errors import BudgetExceededError

EVENT = events.LaplaceDpEvent(2.0, neighbouring="replace_one")
LAW = tuning.GeometricRepetitions(6.0)


class Recorder:
  """A Laplace-scored mechanism that records every run (the test's view, not a release)."""

  def __init__(self, log=None):
    self.runs = []
    self.log = log

  def __call__(self, key, candidate):
    if self.log is not None:
      self.log.append("run")
    score = candidate + 2.0 * jax.random.laplace(key, ())
    release = {"value": score * 10.0, "key_data": jax.random.key_data(key)}
    self.runs.append((candidate, float(score), release))
    return release, score, EVENT


def test_only_the_best_run_leaves():
  mech = Recorder()
  out = tuning.repeat_and_select(jax.random.key(0), mech, [0.0, 1.0, 2.0], repetitions=LAW,
                                 event=EVENT)
  assert [f.name for f in dataclasses.fields(out)] == ["release", "candidate", "score", "event"]
  scores = [s for _, s, _ in mech.runs]
  best = int(np.argmax(scores))
  assert out.score == pytest.approx(scores[best])
  assert out.candidate == mech.runs[best][0]
  assert float(out.release["value"]) == pytest.approx(float(mech.runs[best][2]["value"]))
  assert out.event == LAW.event(EVENT)
  others = {float(r["value"]) for i, (_, _, r) in enumerate(mech.runs) if i != best}
  assert float(out.release["value"]) not in others
  assert not hasattr(out, "num_runs")


def test_spends_one_event_before_any_run():
  log = []

  class Ledger(PrivacyAccountant):
    def spend(self, event, count=1):
      log.append("spend")
      super().spend(event, count)

  acc = Ledger()
  tuning.repeat_and_select(jax.random.key(1), Recorder(log), [1.0], repetitions=LAW, event=EVENT,
                           accountant=acc)
  assert log[0] == "spend" and log.count("spend") == 1 and "run" in log
  assert acc.ledger == ((LAW.event(EVENT), 1),)
  assert acc.get_epsilon(0.0) == pytest.approx(3 * 0.5)  # Liu-Talwar: 3 x (1/2)


def test_refused_budget_runs_nothing():
  mech = Recorder()
  budget = PrivacyBudget(1.0)
  with pytest.raises(BudgetExceededError):
    tuning.repeat_and_select(jax.random.key(2), mech, [1.0], repetitions=LAW, event=EVENT,
                             accountant=budget)
  assert mech.runs == [] and budget.spent_epsilon == 0.0


def test_same_key_same_result_fresh_keys_fresh_noise():
  def run(key, vectorize=False):
    return tuning.repeat_and_select(key, Recorder(), [0.0, 1.0], repetitions=LAW, event=EVENT,
                                    vectorize=vectorize)
  a, b = run(jax.random.key(3)), run(jax.random.key(3))
  assert a.score == b.score and a.candidate == b.candidate
  scores = {run(k).score for k in jax.random.split(jax.random.key(4), 8)}
  assert len(scores) == 8

  def pure(key, candidate):
    score = candidate + 2.0 * jax.random.laplace(key, ())
    return {"value": score * 10.0}, score, EVENT
  loop = tuning.repeat_and_select(jax.random.key(3), pure, [0.0, 1.0], repetitions=LAW, event=EVENT)
  vec = tuning.repeat_and_select(jax.random.key(3), pure, [0.0, 1.0], repetitions=LAW, event=EVENT,
                                 vectorize=True)
  assert loop.score == a.score and loop.candidate == a.candidate
  assert vec.score == pytest.approx(a.score, rel=1e-6) and vec.candidate == a.candidate
  with pytest.raises(ValueError, match="vectorize=False"):
    run(jax.random.key(3), vectorize=True)  # float() of a tracer: not vectorisable


def test_no_key_is_used_twice():
  mech = Recorder()
  tuning.repeat_and_select(jax.random.key(5), mech, [0.0], repetitions=tuning.PoissonRepetitions(30.0),
                           event=EVENT)
  keys = [tuple(np.asarray(r["key_data"]).ravel()) for _, _, r in mech.runs]
  assert len(keys) == len(set(keys)) > 10


def test_event_mismatch_is_refused():
  def mech(key, candidate):
    event = EVENT if candidate == 0 else events.LaplaceDpEvent(1.0, neighbouring="replace_one")
    return candidate, jax.random.laplace(key, ()), event
  with pytest.raises(ValueError, match="differs from event="):
    tuning.repeat_and_select(jax.random.key(6), mech, [0, 1], repetitions=tuning.PoissonRepetitions(40.0),
                             event=EVENT)


def test_bad_arguments_raise_before_any_run():
  mech = Recorder()
  key = jax.random.key(7)
  with pytest.raises(TypeError, match="event"):
    tuning.repeat_and_select(key, mech, [1.0], repetitions=LAW, event=None)
  with pytest.raises(TypeError, match="repetitions"):
    tuning.repeat_and_select(key, mech, [1.0], repetitions=6, event=EVENT)
  with pytest.raises(ValueError, match="candidates"):
    tuning.repeat_and_select(key, mech, [], repetitions=LAW, event=EVENT)
  with pytest.raises(TypeError, match="key"):
    tuning.repeat_and_select(None, mech, [1.0], repetitions=LAW, event=EVENT)
  with pytest.raises(ValueError, match="no accounting method"):
    tuning.repeat_and_select(key, mech, [1.0], repetitions=LAW,
                             event=events.ApproxDpEvent(1.0, 1e-6, neighbouring="add_remove"))
  assert mech.runs == []


def test_pure_epsilon_requirement():
  key = jax.random.key(8)
  out = tuning.repeat_and_select(key, Recorder(), [1.0], repetitions=LAW, event=EVENT,
                                 pure_epsilon=1.5)
  assert out.release is not None
  mech = Recorder()
  with pytest.raises(ValueError, match="pure_epsilon"):
    tuning.repeat_and_select(key, mech, [1.0], repetitions=LAW, event=EVENT, pure_epsilon=1.4)
  with pytest.raises(ValueError, match="pure_epsilon"):
    tuning.repeat_and_select(key, mech, [1.0], repetitions=tuning.PoissonRepetitions(6.0),
                             event=EVENT, pure_epsilon=10.0)
  assert mech.runs == []


def test_poisson_zero_runs_release_nothing():
  law = tuning.PoissonRepetitions(1.0)
  for k in jax.random.split(jax.random.key(9), 20):
    mech = Recorder()
    out = tuning.repeat_and_select(k, mech, [1.0], repetitions=law, event=EVENT)
    if not mech.runs:
      assert (out.release, out.candidate, out.score) == (None, None, None)
      assert out.event == law.event(EVENT)
      return
  pytest.fail("no K = 0 in 20 draws of Poisson(1) (probability e^-20)")


def test_ties_go_to_the_first_and_nonfinite_scores_rank_last():
  def tie(key, candidate):
    return jax.random.key_data(key), jnp.float32(1.0), EVENT
  out = tuning.repeat_and_select(jax.random.key(10), tie, [0], repetitions=LAW, event=EVENT)
  repetitions_key, runs_key = jax.random.split(jax.random.key(10))
  first = jax.random.split(jax.random.fold_in(runs_key, 0))[1]
  np.testing.assert_array_equal(np.asarray(out.release), np.asarray(jax.random.key_data(first)))

  def nan(key, candidate):
    return candidate, jnp.float32(jnp.nan) if candidate == 0 else jax.random.laplace(key, ()), EVENT
  for k in jax.random.split(jax.random.key(11), 5):
    out = tuning.repeat_and_select(k, nan, [0, 1], repetitions=LAW, event=EVENT)
    assert out.candidate in (1, None) and (out.score is None or np.isfinite(out.score))


def test_callable_candidates():
  def draw(key):
    return float(jnp.exp(jax.random.uniform(key, (), minval=-3.0, maxval=0.0)))
  out = tuning.repeat_and_select(jax.random.key(12), Recorder(), draw, repetitions=LAW, event=EVENT)
  assert np.exp(-3.0) <= out.candidate <= 1.0


def test_dominating_event():
  from jaxdp.accounting import dpsgd_event
  short, long_ = dpsgd_event(1.0, 0.01, 100), dpsgd_event(1.0, 0.01, 300)
  assert tuning.dominating_event([short, long_, short]) is long_
  crossing = [events.GaussianDpEvent(3.0, neighbouring="add_remove"),
              events.LaplaceDpEvent(2.0, neighbouring="add_remove")]
  with pytest.raises(ValueError, match="dominates"):
    tuning.dominating_event(crossing)
