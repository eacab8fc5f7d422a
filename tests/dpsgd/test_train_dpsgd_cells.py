"""train_dpsgd as a builder over make_private: correlated noise, adaptive clipping, the abort rule.

Each run: a small linen model (one dense layer: what is checked does not depend on the
model, and it compiles in about half the time of a two-layer MLP) on 64 synthetic examples,
4 steps. ``_loop`` is
the hand-written make_private loop (device-resident sampler, the planned run
prepaid) that train_dpsgd must equal for the same key, whichever path it
samples on (host by default; ``sample_on_device=True``).
"""

import math

import flax.linen as nn
import jax
import numpy as np
import pytest

from jaxdp import dpsgd
from jaxdp.accounting import events
from jaxdp.accounting.accountant import PrivacyAccountant
from jaxdp.dpsgd import correlated
from jaxdp.dpsgd.sampling import BatchOverflowError

N, D, K = 64, 6, 3
RNG = np.random.default_rng(0)
X = RNG.normal(size=(N, D)).astype(np.float32)
Y = np.argmax(X @ RNG.normal(size=(D, K)), axis=1).astype(np.int32)


class _Linear(nn.Module):

  @nn.compact
  def __call__(self, x):
    return nn.Dense(K)(x)


MODEL = _Linear()
PARAMS = MODEL.init(jax.random.key(5), X[:1])["params"]
LOSS = dpsgd.make_per_example_loss(lambda p, xb: MODEL.apply({"params": p}, xb))
COMMON = dict(l2_clip_norm=1.0, delta=1e-5, noise_multiplier=1.0, learning_rate=0.5,
              clipping_method="vmap")


def _loop(key, **kw):
  """The hand-written make_private loop train_dpsgd is built from: (params, ledger, plan)."""
  kw = {**COMMON, **kw}
  kw.pop("epochs_steps", None)
  private = dpsgd.make_private(LOSS, num_examples=N, key=key, **kw)
  acc = PrivacyAccountant()
  sampler = private.sampler(acc, data=(X, Y))
  sampler.pay(private.steps)  # the whole planned run, before the first batch
  params, state = PARAMS, private.init(PARAMS)
  for _ in range(private.steps):
    params, state, _ = private.step(params, state, sampler.sample())
  return params, acc.ledger, private


def _max_diff(a, b):
  return max(float(np.max(np.abs(np.asarray(u) - np.asarray(v))))
             for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def test_same_key_same_params_and_ledger_as_a_make_private_loop():
  key = jax.random.key(1)
  acc = PrivacyAccountant()
  res = dpsgd.train_dpsgd(MODEL, X, Y, key=key, params=PARAMS, epochs=1.0, sample_rate=0.25,
                          accountant=acc, **COMMON)
  ref, ledger, private = _loop(key, epochs=1.0, sample_rate=0.25)
  assert res.steps == private.steps == 4
  assert _max_diff(res.params, ref) <= 1e-6
  assert _max_diff(res.params, PARAMS) > 1e-2  # it trained
  assert acc.ledger == ledger == ((private.step_event(), 4),)
  assert res.epsilon == pytest.approx(acc.get_epsilon(1e-5, "rdp"), rel=1e-9)


def test_bandmf_noise_strategy_trains_and_pays_one_run_event():
  # b = 2 cyclic groups, in-group rate 1/2, one epoch: T = ceil(1 / (0.5 / 2)) = 4 steps.
  strategy = correlated.optimize_bandmf(4, 2)
  key = jax.random.key(2)
  acc = PrivacyAccountant()
  kw = dict(epochs=1.0, sample_rate=0.5, noise_strategy=strategy, min_separation=2)
  res = dpsgd.train_dpsgd(MODEL, X, Y, key=key, params=PARAMS, accountant=acc, eval_fn=lambda p: {},
                          eval_every=2, **COMMON, **kw)
  ref, ledger, private = _loop(key, **kw)
  assert res.steps == private.steps == 4 and private.min_separation == 2
  assert res.expected_batch_size == pytest.approx(N * 0.5 / 2)
  # The ledger holds exactly the run's ONE event (amplified BandMF), paid before step 1.
  assert acc.ledger == ledger == ((private.run_event(), 1),)
  eps = correlated.mf_epsilon(strategy, noise_multiplier=1.0, num_steps=4, min_separation=2,
                              sample_rate=0.5, delta=1e-5)
  assert res.epsilon == pytest.approx(eps, rel=1e-12) and 0 < eps < math.inf
  assert [r["step"] for r in res.history] == [2, 4]
  assert res.history[0]["epoch"] == pytest.approx(2 * 0.5 / 2)
  assert _max_diff(res.params, ref) <= 1e-6
  assert _max_diff(res.params, PARAMS) > 1e-2
  assert all(np.all(np.isfinite(np.asarray(a))) for a in jax.tree.leaves(res.params))


class _Preempted(Exception):
  pass


@pytest.mark.slow  # always on: test_plan_cells.py resumes a BandMF plan; train_dpsgd's own resume in test_private_step_checkpoints.py
def test_bandmf_run_resumes_from_its_checkpoint_paid_once(tmp_path):
  # Killed after step 3 (checkpoint of step 2); the restart replays step 3 with the same
  # batch and noise (the data and starting params are the run's) and equals the full run.
  kw = dict(key=jax.random.key(7), params=PARAMS, epochs=1.0, sample_rate=0.5,
            noise_strategy=correlated.optimize_bandmf(4, 2), min_separation=2, **COMMON)
  full = dpsgd.train_dpsgd(MODEL, X, Y, accountant=None, **kw)
  acc = PrivacyAccountant()

  def preempt(params):
    raise _Preempted

  ckpt = dict(checkpoint_dir=tmp_path / "ckpt", checkpoint_every=2, accountant=acc)
  with pytest.raises(_Preempted):
    dpsgd.train_dpsgd(MODEL, X, Y, eval_fn=preempt, eval_every=3, **ckpt, **kw)
  assert len(acc.ledger) == 1  # the whole run was paid before its first step
  resumed = dpsgd.train_dpsgd(MODEL, X, Y, **ckpt, **kw)
  assert resumed.steps == 4 and [r["step"] for r in resumed.history] == [4]
  assert _max_diff(resumed.params, full.params) == 0.0
  # The accountant holds the run's one event once: the restart saw it there and paid nothing.
  event = correlated.mf_event(kw["noise_strategy"], noise_multiplier=1.0, num_steps=4,
                              min_separation=2, sample_rate=0.5)
  assert acc.ledger == ((event, 1),)


@pytest.mark.slow  # always on: the adaptive plan cells of test_plan_cells.py
def test_adaptive_clip_norm_trains_like_the_make_private_loop():
  clip = dpsgd.AdaptiveClipNorm(initial=0.1, target_quantile=0.5, learning_rate=0.2)
  key = jax.random.key(3)
  acc = PrivacyAccountant()
  kw = dict(epochs=1.0, sample_rate=0.25, l2_clip_norm=clip)
  res = dpsgd.train_dpsgd(MODEL, X, Y, key=key, params=PARAMS, accountant=acc,
                          sample_on_device=True, **{**COMMON, **kw})
  ref, ledger, private = _loop(key, **kw)
  assert private.adaptive_clip_norm is clip and res.sensitivity == 1.0  # in units of C_t
  assert acc.ledger == ledger == ((private.step_event(), 4),)
  assert res.epsilon == pytest.approx(private.epsilon(4), rel=1e-12)
  assert _max_diff(res.params, ref) <= 1e-6
  assert _max_diff(res.params, PARAMS) > 1e-3


def test_refusals_come_before_any_spend():
  acc = PrivacyAccountant()
  base = dict(key=jax.random.key(4), params=PARAMS, epochs=1.0, accountant=acc, **COMMON)
  with pytest.raises(ValueError, match="on_overflow='raise' is not available with noise_strategy"):
    dpsgd.train_dpsgd(MODEL, X, Y, sample_rate=0.5, on_overflow="raise",
                      noise_strategy=correlated.BandMF.dp_sgd(), min_separation=1, **base)
  with pytest.raises(ValueError, match="mesh needs sample_on_device"):
    dpsgd.train_dpsgd(MODEL, X, Y, sample_rate=0.5, mesh=dpsgd.make_data_mesh(1),
                      sample_on_device=False, **base)
  with pytest.raises(ValueError, match="on_overflow must be"):
    dpsgd.train_dpsgd(MODEL, X, Y, sample_rate=0.5, on_overflow="truncate", **base)
  # make_private's own refusals reach the caller unchanged, also before any spend.
  with pytest.raises(ValueError, match="min_separation needs noise_strategy"):
    dpsgd.train_dpsgd(MODEL, X, Y, sample_rate=0.5, min_separation=2, **base)
  assert acc.ledger == ()


def test_on_overflow_raise_aborts_before_the_overflowing_batch_is_used():
  # sigma = 0 (no abort term to bound): P = 2 for ~16 examples aborts at the first step,
  # after the planned (non-private) run was recorded and before any update.
  acc = PrivacyAccountant()
  seen = []
  with pytest.raises(BatchOverflowError):
    dpsgd.train_dpsgd(MODEL, X, Y, key=jax.random.key(6), params=PARAMS, epochs=1.0,
                      sample_rate=0.25, physical_batch_size=2, on_overflow="raise",
                      accountant=acc, eval_fn=lambda p: seen.append(p) or {}, eval_every=1,
                      **{**COMMON, "noise_multiplier": 0.0})
  assert seen == []
  assert len(acc.ledger) == 1 and isinstance(acc.ledger[0][0], events.NonPrivateDpEvent)


@pytest.mark.slow
def test_train_dpsgd_takes_a_batch_selection():
  """Fixed-size (replace-one, RDP) and user-level (unit "user") selections pass through."""
  from jaxdp.dpsgd.fixed_size_sampling import FixedSizeSampler
  from jaxdp.dpsgd.user_sampling import UserPoissonSampler
  import flax.linen as nn
  rng = np.random.default_rng(0)
  x = rng.normal(size=(48, 4)).astype(np.float32)
  y = (x[:, 0] > 0).astype(np.int32)
  model = nn.Dense(2)
  fixed = dpsgd.train_dpsgd(model, x, y, key=jax.random.key(0), epochs=0.5, l2_clip_norm=1.0,
                            delta=1e-5, noise_multiplier=1.0, neighbouring="replace_one",
                            batch_selection=FixedSizeSampler(48, 8))
  assert fixed.steps == 3 and fixed.neighbouring == "replace_one"
  assert fixed.accountant.ledger[0][1] == 3
  users = dpsgd.train_dpsgd(model, x, y, key=jax.random.key(1), epochs=0.5, l2_clip_norm=1.0,
                            delta=1e-5, noise_multiplier=1.0,
                            batch_selection=UserPoissonSampler(np.arange(48) // 4,
                                                               sample_rate=0.25,
                                                               max_examples_per_user=4))
  assert users.accountant.unit == "user" and users.steps == 2
  with pytest.raises(ValueError, match="on_overflow='raise' is not available with batch_selection"):
    dpsgd.train_dpsgd(model, x, y, key=jax.random.key(0), epochs=0.5, l2_clip_norm=1.0,
                      delta=1e-5, noise_multiplier=1.0, neighbouring="replace_one",
                      on_overflow="raise", batch_selection=FixedSizeSampler(48, 8))
