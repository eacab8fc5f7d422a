"""Private predictors never replay noise, never overspend a shared state file, refuse bad queries.

Privacy review: query i's noise used to be ``fold_in(key, i)`` with i counted
per instance, so two predictors with one key (a restart without
``state_path``, a second instance, or two processes on one state file)
answered with identical noise and ``answer1 - answer2 = (x1 - x2) W``
exactly. These tests fail on that code: the noise of two instances is
perfectly correlated there, and two processes on one state file answer 2B.
"""

import json
import multiprocessing
import os
import threading

import jax
import numpy as np
import pytest

from jaxdp.accounting.accountant import PrivacyBudget
from jaxdp.errors import BudgetExceededError
from jaxdp.prediction import predictor as pr

D, C = 4, 3
KINDS = ["prediction_sensitivity", "exponential", "lnmax", "gnmax"]


def _weights(seed=0):
  return np.random.default_rng(seed).normal(size=(D, C)).astype(np.float32)


def _queries(m, seed=1):
  x = np.random.default_rng(seed).normal(size=(m, D))
  return (x / (1.5 * np.linalg.norm(x, axis=1, keepdims=True))).astype(np.float32)


def _ps(budget, delta=0.0, key_seed=42, **kwargs):
  return pr.PredictionSensitivityPredictor.from_weights(
      _weights(), num_examples=500, l2_reg=0.1, epsilon=1.0, delta=delta, budget=budget,
      key=jax.random.key(key_seed), **kwargs)


def _predictor(kind, budget=10, epsilon=1.0, **kwargs):
  if kind == "prediction_sensitivity":
    return pr.PredictionSensitivityPredictor.from_weights(
        _weights(), num_examples=500, l2_reg=0.1, epsilon=epsilon, delta=1e-5, budget=budget,
        key=jax.random.key(3), **kwargs)
  teachers = np.random.default_rng(0).normal(size=(9, D, C)).astype(np.float32)
  common = dict(epsilon=epsilon, budget=budget, key=jax.random.key(3), **kwargs)
  if kind == "exponential":
    return pr.SubsampleAggregatePredictor.from_linear_teachers(teachers, delta=0.0, **common)
  return pr.NoisyMaxPredictor.from_linear_teachers(
      teachers, mechanism=kind, delta=1e-5 if kind == "gnmax" else 0.0, **common)


# -- same key, two instances ----------------------------------------------------


@pytest.mark.parametrize("delta", [0.0, 1e-5])  # L2-Laplace and Gaussian logits
def test_two_instances_with_one_key_draw_independent_noise(delta):
  m = 300
  x1, x2 = _queries(m, seed=1), _queries(m, seed=2)
  w = _weights()
  a1 = np.asarray(_ps(m, delta).predict(x1), np.float64)
  a2 = np.asarray(_ps(m, delta).predict(x2), np.float64)  # same key, e.g. after a restart
  noise1, noise2 = a1 - x1 @ w, a2 - x2 @ w
  # Replayed noise would make the difference of answers reveal (x1 - x2) W exactly.
  leak = np.abs((a1 - a2) - (x1 - x2) @ w)
  assert np.median(leak) > 0.1 * np.median(np.abs(noise1))
  # Independent noise: the correlation of the 900 noise coordinates has standard
  # deviation about 1/30 (0.25 is > 7 of them); replayed noise gives exactly 1.
  corr = np.corrcoef(noise1.ravel(), noise2.ravel())[0, 1]
  assert abs(corr) < 0.25, corr


@pytest.mark.parametrize("kind", ["exponential", "lnmax", "gnmax"])
def test_two_voting_instances_with_one_key_draw_independent_labels(kind):
  # epsilon = 0.5 over B = 300: the noise swamps 9 teachers' votes, so the labels
  # of two independent instances agree with probability near 1/3; replayed
  # noise makes them agree always.
  x = np.random.default_rng(5).normal(size=(300, D)).astype(np.float32)
  y1 = np.asarray(_predictor(kind, budget=300, epsilon=0.5).predict(x))
  y2 = np.asarray(_predictor(kind, budget=300, epsilon=0.5).predict(x))
  assert np.mean(y1 == y2) < 0.6


def test_fixed_nonce_is_reproducible_and_distinct_nonces_are_not():
  x = _queries(5)
  same = [np.asarray(_ps(5, unsafe_fixed_nonce=3).predict(x)) for _ in range(2)]
  np.testing.assert_array_equal(same[0], same[1])
  other = np.asarray(_ps(5, unsafe_fixed_nonce=3 + 2**64).predict(x))  # differs in word 2
  assert not np.any(np.isclose(other, same[0]))
  a, b = _ps(5), _ps(5)
  assert a.nonce != b.nonce and 0 <= a.nonce < 2**128


@pytest.mark.parametrize("nonce, error", [
    (-1, ValueError), (2**128, ValueError), (1.0, TypeError), (True, TypeError), ("1", TypeError)])
def test_bad_fixed_nonce_is_refused(nonce, error):
  with pytest.raises(error, match="unsafe_fixed_nonce"):
    _ps(5, unsafe_fixed_nonce=nonce)


def test_bad_key_is_refused():
  with pytest.raises(TypeError, match="key"):
    _ps_with_key(42)
  with pytest.raises(ValueError, match="key"):
    _ps_with_key(jax.random.split(jax.random.key(0), 2))
  _ps_with_key(jax.random.PRNGKey(0)).predict(_queries(1))  # legacy raw keys still work


def _ps_with_key(key):
  return pr.PredictionSensitivityPredictor.from_weights(
      _weights(), num_examples=500, l2_reg=0.1, epsilon=1.0, delta=0.0, budget=5, key=key)


# -- one state file, many users ----------------------------------------------------


def test_second_instance_on_one_state_file_sees_the_first_ones_answers(tmp_path):
  path = tmp_path / "state.json"
  p = _ps(5, state_path=path)
  p.predict(_queries(3))
  q = _ps(5, state_path=path)  # built while p is still serving
  p.predict(_queries(2))
  with pytest.raises(BudgetExceededError):
    q.predict(_queries(1))  # the old code let q answer 2 more (7 > B)
  assert q.queries_answered == 5 and q.remaining_queries == 0
  assert json.loads(path.read_text())["queries_answered"] == 5
  assert set(json.loads(path.read_text())) == {
      "format", "kind", "budget", "epsilon", "delta", "queries_answered", "query_event",
      "fingerprint"}  # neither the key nor the nonce is stored


def test_threads_with_own_instances_on_one_state_file_answer_exactly_budget(tmp_path):
  path, budget, workers = tmp_path / "state.json", 24, 4
  predictors = [_ps(budget, state_path=path) for _ in range(workers)]
  x = _queries(1)
  predictors[0].predict(x[:0])  # compile once, spends nothing
  answers = [[] for _ in range(workers)]
  barrier = threading.Barrier(workers)

  def hammer(i):
    barrier.wait()
    while True:
      try:
        answers[i].append(np.asarray(predictors[i].predict(x))[0])
      except BudgetExceededError:
        return

  threads = [threading.Thread(target=hammer, args=(i,)) for i in range(workers)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  flat = np.array([a for per in answers for a in per])
  assert len(flat) == budget  # old code: each instance answered B (4B in total)
  assert len(np.unique(flat[:, 0])) == budget  # no two answers share noise
  assert json.loads(path.read_text())["queries_answered"] == budget


def _process_worker(path, budget, barrier, results):
  """Runs in a spawned process: builds its own predictor, then answers until refused."""
  got = []
  try:
    p = _ps(budget, state_path=path)
    x = _queries(1)
    p.predict(x[:0])  # compile before the race
    barrier.wait(timeout=120)
    while True:
      try:
        got.append(np.asarray(p.predict(x))[0].tolist())
      except BudgetExceededError:
        break
  except Exception as e:  # pylint: disable=broad-except  # reported to the parent, not hung
    results.put((os.getpid(), f"{type(e).__name__}: {e}"))
    return
  results.put((os.getpid(), got))


def _run_processes(tmp_path, budget, processes):
  ctx = multiprocessing.get_context("spawn")
  barrier, results = ctx.Barrier(processes), ctx.Queue()
  path = str(tmp_path / "shared_state.json")
  procs = [ctx.Process(target=_process_worker, args=(path, budget, barrier, results))
           for _ in range(processes)]
  for proc in procs:
    proc.start()
  try:
    out = [results.get(timeout=240) for _ in procs]
  finally:
    for proc in procs:
      proc.join(timeout=60)
      if proc.is_alive():
        proc.kill()
  errors = [got for _, got in out if isinstance(got, str)]
  assert not errors, errors
  assert all(proc.exitcode == 0 for proc in procs)
  answers = np.array([a for _, got in out for a in got])
  return answers, json.loads(open(path, encoding="utf-8").read())


def test_two_processes_on_one_state_file_answer_exactly_budget(tmp_path):
  budget = 30
  answers, state = _run_processes(tmp_path, budget, processes=2)
  # Old code: both processes started from 0 and each answered B (2B in total),
  # query i of one process replaying query i of the other.
  assert len(answers) == budget
  assert len(np.unique(answers[:, 0])) == budget
  assert state["queries_answered"] == budget


@pytest.mark.slow
def test_many_processes_on_one_state_file_answer_exactly_budget(tmp_path):
  budget = 200
  answers, state = _run_processes(tmp_path, budget, processes=4)
  assert len(answers) == budget
  assert len(np.unique(answers[:, 0])) == budget
  assert state["queries_answered"] == budget


def test_refused_shared_budget_leaves_the_state_file_unchanged(tmp_path):
  path = tmp_path / "state.json"
  shared = PrivacyBudget(epsilon=0.3)  # 3 of the predictor's 10 x 0.1
  p = _ps(10, state_path=path, privacy_budget=shared)
  p.predict(_queries(2))
  with pytest.raises(BudgetExceededError):
    p.predict(_queries(2))
  assert json.loads(path.read_text())["queries_answered"] == 2
  assert shared.spent_epsilon == pytest.approx(0.2, rel=1e-9)


def test_deleted_or_rolled_back_state_file_is_refused(tmp_path):
  path = tmp_path / "state.json"
  p = _ps(5, state_path=path)
  p.predict(_queries(2))
  snapshot = path.read_text()
  p.predict(_queries(1))
  path.write_text(snapshot)  # rolled back to 2 answers
  with pytest.raises(ValueError, match="reset"):
    p.predict(_queries(1))
  os.remove(path)  # deleted
  with pytest.raises(ValueError, match="reset"):
    p.predict(_queries(1))
  assert not path.exists()  # nothing recreated, nothing answered


def test_state_file_of_another_model_is_refused(tmp_path):
  path = tmp_path / "state.json"
  _ps(5, state_path=path).predict(_queries(1))
  with pytest.raises(ValueError, match="fingerprint"):  # same calibration, other weights
    pr.PredictionSensitivityPredictor.from_weights(
        _weights(seed=9), num_examples=500, l2_reg=0.1, epsilon=1.0, delta=0.0, budget=5,
        key=jax.random.key(42), state_path=path)
  with pytest.raises(ValueError, match="delta"):  # other calibration
    _predictor("prediction_sensitivity", budget=5, state_path=path)


def test_save_never_lowers_a_count(tmp_path):
  path = tmp_path / "state.json"
  p = _ps(5, state_path=path)
  p.predict(_queries(3))
  fresh = _ps(5)
  with pytest.raises(ValueError, match="reset"):
    fresh.save(path)
  assert json.loads(path.read_text())["queries_answered"] == 3
  other = tmp_path / "copy.json"
  p.save(other)
  fresh.load(other)
  assert fresh.queries_answered == 3


# -- bad queries, every predictor kind -----------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("bad, what", [
    (np.concatenate([_queries(2), np.full((1, D), np.nan, np.float32)]), "NaN"),
    (np.concatenate([_queries(1), np.array([[0.1, np.inf, 0, 0]], np.float32)]), "inf"),
    (np.zeros((2, D + 1), np.float32), "features"),
    (np.zeros((2, D - 1), np.float32), "features"),
    (np.zeros((D,), np.float32), "shape"),
    (np.array([["a"] * D]), "real"),
    (np.array([[1j] * D]), "real"),
    ([[0.1] * D, [0.1] * (D - 1)], "x"),  # ragged
])
def test_bad_queries_raise_value_error_naming_x_before_spending(kind, bad, what):
  p = _predictor(kind)
  with pytest.raises(ValueError, match=r"\bx\b") as info:
    p.predict(bad)
  if what != "x":
    assert what in str(info.value) or what == "features" and "fit" in str(info.value)
  assert p.queries_answered == 0
  p.predict(_queries(1))  # still usable
