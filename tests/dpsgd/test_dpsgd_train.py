"""Tests of the DP-SGD training loop: calibration, accounting, accumulation, nnx, MNIST."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from scipy import stats

from jaxdp import data as jdata
from jaxdp import models
from jaxdp.accounting import dpsgd_accounting as dpsgd_accounting
from jaxdp.accounting import events
from jaxdp.accounting.accountant import PrivacyAccountant, PrivacyBudget
from jaxdp.errors import BudgetExceededError
from jaxdp import dpsgd


def _toy(n=400, d=10, c=3, seed=0):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(n, d)).astype(np.float32)
  y = np.argmax(x @ rng.normal(size=(d, c)), axis=1).astype(np.int32)
  return x, y


class _Recorder:
  def __init__(self):
    self.calls = []

  def spend(self, event, count=1):
    self.calls.append((event, count))


def _planned(sigma, q, steps):
  """The ledger entry of a planned run: (one step's event, steps), paid before the first step."""
  return (dpsgd_accounting.dpsgd_event(sigma, q, 1).event, steps)


def test_accountant_receives_q_steps_and_calibrated_sigma():
  x, y = _toy()
  rec = _Recorder()
  res = dpsgd.train_dpsgd(models.LinearClassifier(num_classes=3), x, y, key=jax.random.key(0),
                          epochs=1.5, l2_clip_norm=1.0, delta=1e-5, expected_batch_size=40,
                          target_epsilon=3.0, accountant=rec)
  q = 40 / 400
  assert res.sample_rate == pytest.approx(q)
  assert res.steps == math.ceil(1.5 / q) == 15
  assert res.expected_batch_size == pytest.approx(40.0)
  sigma = res.noise_multiplier
  # Calibrated through the shared accountant for exactly (q, T): meets the target,
  # and 1% less noise would not (so it is not grossly over-noised either).
  assert dpsgd_accounting.dpsgd_epsilon(sigma, q, 15, 1e-5) <= 3.0
  assert dpsgd_accounting.dpsgd_epsilon(0.99 * sigma, q, 15, 1e-5) > 3.0
  # The planned run is paid at once by make_private's sampler: ONE call, 15 x the step event
  # (the ledger entry (step_event, 15); the same epsilon as dpsgd_event(sigma, q, 15)).
  ((event, count),) = rec.calls
  assert count == 15
  assert isinstance(event, events.PoissonSampledDpEvent)
  assert event.sampling_probability == pytest.approx(q, rel=1e-15)
  assert event.event.noise_multiplier == pytest.approx(sigma, rel=1e-15)
  # Reported epsilon is the accountant's, and meets the target.
  assert res.epsilon == pytest.approx(dpsgd_accounting.dpsgd_epsilon(sigma, q, 15, 1e-5), rel=1e-12)
  assert 2.9 < res.epsilon <= 3.0
  # The shared accountant gives the same epsilon from its ledger.
  acc = PrivacyAccountant()
  dpsgd.train_dpsgd(models.LinearClassifier(num_classes=3), x, y, key=jax.random.key(0), epochs=1.5,
                    l2_clip_norm=1.0, delta=1e-5, sample_rate=q, noise_multiplier=sigma, accountant=acc)
  assert acc.get_epsilon(1e-5, "rdp") == pytest.approx(res.epsilon, rel=1e-9)


def test_killed_run_has_spent_the_planned_event():
  # Training stops (here: an exception from eval_fn) after 3 of 15 planned steps. The
  # evaluation and anything else released so far must be paid for: the planned event
  # (all 15 steps) was reserved before the first step and is not refunded. (The old
  # code spent only the 3 steps run, in a `finally`; a killed process spent nothing.)
  # (N = 100, q = 0.1, sigma = 1: the step program of the next test.)
  x, y = _toy(n=100)
  rec = _Recorder()
  budget = PrivacyBudget(epsilon=50.0, delta=1e-5, method="rdp")

  class Stop(Exception):
    pass

  def eval_fn(params):
    # Killed during the run: the reservation is already in the ledger.
    assert rec.calls == [_planned(1.0, 0.1, 15)]
    raise Stop()

  for acc in (rec, budget):
    with pytest.raises(Stop):
      dpsgd.train_dpsgd(models.LinearClassifier(num_classes=3), x, y, key=jax.random.key(3),
                        epochs=1.5, l2_clip_norm=1.0, delta=1e-5, sample_rate=0.1,
                        noise_multiplier=1.0, accountant=acc, eval_fn=eval_fn, eval_every=3)
  assert rec.calls == [_planned(1.0, 0.1, 15)]
  assert budget.accountant.ledger == (_planned(1.0, 0.1, 15),)


def test_two_runs_sharing_a_budget_cannot_both_run():
  # A budget that affords exactly one run. A second run started while the first is
  # training (from its eval_fn, i.e. after the first passed its check) must be refused
  # before training. (The old code checked can_spend first and spent at the end, so
  # both runs passed the check and trained.)
  x, y = _toy(n=100)
  common = dict(epochs=1.0, l2_clip_norm=1.0, delta=1e-5, sample_rate=0.1, noise_multiplier=1.0)
  one = dpsgd_accounting.dpsgd_event(1.0, 0.1, 10)
  eps_one = dpsgd_accounting.dpsgd_epsilon(1.0, 0.1, 10, 1e-5)
  budget = PrivacyBudget(epsilon=1.01 * eps_one, delta=1e-5, method="rdp")
  assert budget.can_spend(one) and not budget.can_spend(one, count=2)  # precondition
  model = models.LinearClassifier(num_classes=3)
  outcomes = []

  def eval_fn(params):
    if not outcomes:
      try:
        dpsgd.train_dpsgd(model, x, y, key=jax.random.key(8), accountant=budget, **common)
        outcomes.append("trained")
      except BudgetExceededError:
        outcomes.append("refused")
    return {}

  res = dpsgd.train_dpsgd(model, x, y, key=jax.random.key(7), accountant=budget, eval_fn=eval_fn,
                          eval_every=2, **common)
  assert res.steps == 10
  assert outcomes == ["refused"]
  assert budget.accountant.ledger == (_planned(1.0, 0.1, 10),)


def test_overflow_raise_adds_abort_delta_or_refuses():
  # on_overflow="raise" aborts when a Poisson batch exceeds P, which depends on the data:
  # the guarantee is (eps, delta + (1 + e^eps) * steps * p), p = Pr[Bin(N + 1, q) > P].
  x, y = _toy()
  n, q, steps, sigma = 400, 0.1, 5, 1.0
  model = models.LinearClassifier(num_classes=3)
  common = dict(key=jax.random.key(3), epochs=0.5, l2_clip_norm=0.5, delta=1e-5, sample_rate=q,
                noise_multiplier=sigma, on_overflow="raise")
  res = dpsgd.train_dpsgd(model, x, y, physical_batch_size=80, accountant=None, **common)
  p = stats.binom.sf(80, n + 1, q)
  assert 0.0 < p < 1e-9
  eps = dpsgd_accounting.dpsgd_epsilon(sigma, q, steps, 1e-5)
  expected = (1.0 + math.exp(eps)) * steps * p
  assert res.steps == steps and res.epsilon == pytest.approx(eps, rel=1e-12)
  assert res.overflow_delta == pytest.approx(expected, rel=1e-9)
  assert res.delta == pytest.approx(1e-5 + expected, rel=1e-12)
  # "split" is exact: no extra delta.
  split = dpsgd.train_dpsgd(model, x, y, physical_batch_size=80, accountant=None,
                            **dict(common, on_overflow="split"))
  assert split.overflow_delta == 0.0 and split.delta == 1e-5
  # A physical batch size far below q N would abort almost surely: refused before training
  # and before anything is spent (p ~ 1 makes the extra delta >> 0.1 * delta).
  rec = _Recorder()
  with pytest.raises(ValueError, match="max_overflow_delta_fraction"):
    dpsgd.train_dpsgd(model, x, y, physical_batch_size=8, accountant=rec, **common)
  assert rec.calls == []
  # Same rule for the padded size chosen from overflow_prob.
  with pytest.raises(ValueError, match="max_overflow_delta_fraction"):
    dpsgd.train_dpsgd(model, x, y, overflow_prob=1e-3, accountant=None, **common)
  ok = dpsgd.train_dpsgd(model, x, y, overflow_prob=1e-12, accountant=None, **common)
  p_ok = stats.binom.sf(ok.padded_size, n + 1, q)
  assert ok.overflow_delta == pytest.approx((1.0 + math.exp(eps)) * steps * p_ok, rel=1e-9)
  assert ok.overflow_delta <= 0.1 * 1e-5


def test_bf16_params_train_with_float32_sums():
  x, y = _toy()
  model = models.LinearClassifier(num_classes=3)
  init = model.init(jax.random.key(9), x[:1])["params"]
  init16 = jax.tree.map(lambda a: a.astype(jnp.bfloat16), init)
  res = dpsgd.train_dpsgd(model, x, y, params=init16, key=jax.random.key(2), epochs=0.5,
                          l2_clip_norm=1.0, delta=1e-5, sample_rate=0.1, noise_multiplier=1.0,
                          accountant=None)
  assert all(a.dtype == jnp.bfloat16 for a in jax.tree.leaves(res.params))
  assert all(np.all(np.isfinite(np.asarray(a, np.float32))) for a in jax.tree.leaves(res.params))


def test_budget_refused_before_training():
  x, y = _toy()
  budget = PrivacyBudget(epsilon=0.5, delta=1e-5)
  with pytest.raises(BudgetExceededError):
    dpsgd.train_dpsgd(models.LinearClassifier(num_classes=3), x, y, key=jax.random.key(0), epochs=1,
                      l2_clip_norm=1.0, delta=1e-5, sample_rate=0.1, noise_multiplier=0.8,
                      accountant=budget)
  assert budget.accountant.ledger == ()


# train_dpsgd runs make_private's step: the default run checks accumulation over chunks in
# test_private_step.py (test_overflow_chunks_accumulate_to_the_same_update_as_one_big_chunk,
# and test_same_key_same_run_as_train_dpsgd_with_overflow_chunks ties train_dpsgd to it).
@pytest.mark.slow
def test_accumulation_matches_single_chunk_and_overflow_raise():
  x, y = _toy()
  model = models.MLP(hidden_sizes=(8,), num_classes=3)
  common = dict(key=jax.random.key(3), epochs=0.5, l2_clip_norm=0.5, delta=1e-5, sample_rate=0.1,
                noise_multiplier=1.0, learning_rate=0.5, accountant=None)
  one = dpsgd.train_dpsgd(model, x, y, **common)
  acc = dpsgd.train_dpsgd(model, x, y, physical_batch_size=8, **common)  # ~40 examples in chunks of 8
  assert acc.padded_size == 8 and one.padded_size > 40
  for a, b in zip(jax.tree.leaves(one.params), jax.tree.leaves(acc.params)):
    np.testing.assert_allclose(a, b, atol=2e-6)
  # P = 8 for ~40 examples would abort almost surely; refused (see the overflow test).
  with pytest.raises(ValueError, match="max_overflow_delta_fraction"):
    dpsgd.train_dpsgd(model, x, y, physical_batch_size=8, on_overflow="raise", **common)


def test_nnx_model_and_zero_noise_is_recorded_non_private():
  x, y = _toy()

  class Net(nnx.Module):
    def __init__(self, rngs):
      self.lin = nnx.Linear(10, 3, rngs=rngs)

    def __call__(self, z):
      return self.lin(z)

  net = Net(nnx.Rngs(0))
  before = np.asarray(net.lin.kernel[...]).copy()
  acc = PrivacyAccountant()
  res = dpsgd.train_dpsgd(net, x, y, key=jax.random.key(1), epochs=2, l2_clip_norm=1.0, delta=1e-5,
                          sample_rate=0.2, noise_multiplier=0.0, learning_rate=1.0, accountant=acc,
                          optimizer=optax.sgd(1.0))
  assert math.isinf(res.epsilon)
  assert isinstance(acc.ledger[0][0], events.NonPrivateDpEvent)
  after = np.asarray(net.lin.kernel[...])
  assert np.abs(after - before).max() > 1e-2  # trained params were written back
  acc_train = float(np.mean(np.argmax(net(jnp.asarray(x)), 1) == y))
  assert acc_train > 0.8


def test_mostly_empty_batches_still_get_noise():
  # N = 20, q = 0.05: about a third of the 20 steps sample no example at all.
  # Each step must still add noise (the accountant counts all 20 steps).
  x, y = _toy(n=20)
  model = models.LinearClassifier(num_classes=3)
  init = model.init(jax.random.key(9), x[:1])["params"]
  res = dpsgd.train_dpsgd(model, x, y, params=init, key=jax.random.key(2), epochs=1, l2_clip_norm=1.0,
                          delta=1e-3, sample_rate=0.05, noise_multiplier=2.0, learning_rate=1.0,
                          accountant=None, optimizer=optax.sgd(1.0))
  assert res.steps == 20 and res.padded_size >= 1
  moved = jax.tree.map(lambda a, b: np.asarray(a - b), res.params, init)
  # Pure-noise updates: each coordinate moves by ~ sqrt(20) * sigma * C / (qN) = 8.9.
  spread = float(np.std(moved["Dense_0"]["kernel"]))
  assert 5.0 < spread < 14.0, spread
  assert all(np.all(np.isfinite(v)) for v in jax.tree.leaves(moved))


def test_train_step_noise_uses_per_layer_sensitivity_and_qn():
  # One step, lr 1: the parameter change is (clipped sum + N(0, (sigma S)^2)) / (qN).
  # With per-layer norms (0.3, 0.4), S = sqrt(0.3^2 + 0.4^2) = 0.5, so the noise std
  # per coordinate is 3.0 * 0.5 / 10 = 0.15. The clipped signal (norm <= |B| S / qN
  # ~ 0.5 over 1539 coordinates) adds < 1% to the variance. The std over 1539
  # coordinates has relative s.e. 1.8%; the 6% band rejects S = max c_k (0.12),
  # S = sum c_k (0.21) and dividing by a realised |B| != qN.
  x, y = _toy(n=200, d=20)
  model = models.MLP(hidden_sizes=(64,), num_classes=3)
  init = model.init(jax.random.key(4), x[:1])["params"]
  res = dpsgd.train_dpsgd(model, x, y, params=init, key=jax.random.key(5), epochs=0.05,
                          l2_clip_norm={"Dense_0": 0.3, "Dense_1": 0.4}, per_layer=True,
                          delta=1e-5, sample_rate=0.05, noise_multiplier=3.0,
                          optimizer=optax.sgd(1.0), accountant=None)
  assert res.steps == 1 and res.sensitivity == pytest.approx(0.5)
  delta = np.concatenate([np.ravel(a - b) for a, b in
                          zip(jax.tree.leaves(res.params), jax.tree.leaves(init))])
  assert delta.size == 1539
  np.testing.assert_allclose(delta.std(), 0.15, rtol=0.06)


def test_bad_arguments():
  x, y = _toy()
  m = models.LinearClassifier(num_classes=3)
  base = dict(key=jax.random.key(0), epochs=1, l2_clip_norm=1.0, delta=1e-5)
  with pytest.raises(ValueError, match="exactly one of target_epsilon"):
    dpsgd.train_dpsgd(m, x, y, sample_rate=0.1, **base)
  with pytest.raises(ValueError, match="exactly one of sample_rate"):
    dpsgd.train_dpsgd(m, x, y, noise_multiplier=1.0, **base)
  with pytest.raises(ValueError, match="delta"):
    dpsgd.train_dpsgd(m, x, y, sample_rate=0.1, noise_multiplier=1.0,
                      **dict(base, delta=0.0))
  with pytest.raises(ValueError, match="l2_clip_norm"):
    dpsgd.train_dpsgd(m, x, y, sample_rate=0.1, noise_multiplier=1.0,
                      **dict(base, l2_clip_norm=float("inf")))


def _mnist_linear(data_dir, n_train, epochs, batch, lr):
  ds = jdata.load("mnist", data_dir=data_dir)
  model = models.LinearClassifier()
  res = dpsgd.train_dpsgd(model, ds.x_train[:n_train], ds.y_train[:n_train], key=jax.random.key(0),
                          epochs=epochs, l2_clip_norm=1.0, delta=1e-5, expected_batch_size=batch,
                          target_epsilon=1.0, optimizer=optax.sgd(lr, momentum=0.9), accountant=None)
  acc = dpsgd.accuracy(lambda p, xb: model.apply({"params": p}, xb), res.params, ds.x_test, ds.y_test)
  return res, acc


@pytest.mark.slow
@pytest.mark.data
def test_mnist_linear_eps1_subset(data_dir):
  # 20k training images, expected batch 500 (q = 0.025), 2 epochs = 80 steps,
  # sigma calibrated to (1, 1e-5) ~ 1.38. A non-private linear model reaches ~92%
  # on MNIST; paper 000 Fig. 1b reports ~88-90% for DP-SGD linear models at
  # eps = 1, delta = 1e-5 on the full 60k. This run gives 89.0% (seed 0); we
  # require >= 86%, well above the 10% of chance and the ~80% of an untrained-
  # quality or mis-scaled-noise model.
  res, acc = _mnist_linear(data_dir, 20_000, 2, 500, 1.0)
  assert res.epsilon <= 1.0 and res.steps == 80
  assert acc >= 0.86, acc


@pytest.mark.slow
@pytest.mark.data
def test_mnist_linear_eps1_full(data_dir):
  # Full 60k, expected batch 1000 (q = 1/60), 3 epochs = 180 steps, sigma ~ 1.31:
  # 91.1% measured (seed 0); required >= 90%.
  res, acc = _mnist_linear(data_dir, 60_000, 3, 1000, 1.0)
  assert res.epsilon <= 1.0 and res.steps == 180
  assert acc >= 0.90, acc
