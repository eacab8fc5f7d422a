"""Tests of make_private: same run as train_dpsgd, exact ledger, spend-before-release, refusals."""

import doctest
import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jaxdp.accounting import dpsgd_accounting
from jaxdp.accounting import events
from jaxdp.accounting.accountant import PrivacyAccountant, PrivacyBudget
from jaxdp.errors import BudgetExceededError
from jaxdp import dpsgd
from jaxdp.dpsgd import private_step
from jaxdp.dpsgd.private_step import make_private


class _Net(nn.Module):

  @nn.compact
  def __call__(self, x):
    return nn.Dense(3)(x)


def _toy(n=200, d=5, c=3, seed=0):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(n, d)).astype(np.float32)
  y = np.argmax(x @ rng.normal(size=(d, c)), axis=1).astype(np.int32)
  return x, y


@functools.lru_cache(maxsize=None)
def _linen_setup():
  # Cached: one model, loss and data for every test (a plan's programs are traced for the same
  # loss function; the arrays are never modified).
  x, y = _toy()
  model = _Net()
  params = model.init(jax.random.key(9), x[:1])["params"]
  apply = lambda p, xb: model.apply({"params": p}, xb)
  return model, params, dpsgd.make_per_example_loss(apply), x, y


def _run(private, params, x, y, accountant, steps=None):
  sampler = private.sampler(accountant)
  state = private.init(params)
  infos = []
  for _ in range(private.steps if steps is None else steps):
    params, state, info = private.step(params, state, sampler.sample().gather(x, y))
    infos.append(info)
  return params, state, sampler, infos


def _max_abs_diff(a, b):
  # In NumPy: no compilation per leaf shape, as op-by-op jnp would need.
  return max(float(np.max(np.abs(np.asarray(u) - np.asarray(v))))
             for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


# P = 8 < q N = 20: nearly every Poisson batch is split into several chunks.
_OVERFLOW = dict(l2_clip_norm=1.0, delta=1e-5, expected_batch_size=20, noise_multiplier=1.1,
                 epochs=0.4, clipping_method="vmap")


def _overflow_plan(physical_batch_size=None):
  _, _, loss, _, y = _linen_setup()
  return make_private(loss, num_examples=len(y), key=jax.random.key(1), optimizer=optax.adam(0.05),
                      physical_batch_size=physical_batch_size, **_OVERFLOW)


@functools.lru_cache(maxsize=None)
def _overflow_run():
  """make_private's run in chunks of P = 8: (plan, params, state, step infos).

  Cached (the arrays are immutable): two tests check this one run, against train_dpsgd and
  against the run of the same plan in one big chunk, so its programs (one per number of chunks
  in a batch) are compiled once.
  """
  _, params, _, x, y = _linen_setup()
  private = _overflow_plan(physical_batch_size=8)
  out, state, _, infos = _run(private, params, x, y, PrivacyAccountant())
  return private, out, state, infos


def test_same_key_same_run_as_train_dpsgd_with_overflow_chunks():
  model, params, loss, x, y = _linen_setup()
  ref = dpsgd.train_dpsgd(model, x, y, key=jax.random.key(1), params=params, accountant=None,
                          optimizer=optax.adam(0.05), physical_batch_size=8, **_OVERFLOW)
  private, out, state, infos = _overflow_run()
  assert (private.steps, private.padded_size, private.expected_batch_size) == (
      ref.steps, ref.padded_size, ref.expected_batch_size)
  assert max(int(i.nonprivate_num_examples) for i in infos) > private.padded_size  # overflow exercised
  assert int(state.step) == ref.steps
  assert _max_abs_diff(out, ref.params) <= 1e-6
  assert _max_abs_diff(out, params) > 1e-2  # it trained


def test_ledger_holds_exactly_the_steps_taken():
  _, params, loss, x, y = _linen_setup()
  private = make_private(loss, l2_clip_norm=1.0, num_examples=len(y), key=jax.random.key(2),
                         expected_batch_size=20, target_epsilon=2.0, delta=1e-5, epochs=2)
  acc = PrivacyAccountant()
  _, _, sampler, _ = _run(private, params, x, y, acc, steps=3)
  assert (sampler.steps_paid, sampler.steps_sampled) == (3, 3)
  ((event, count),) = acc.ledger
  assert count == 3 and acc.neighbouring == events.ADD_REMOVE
  assert event.sampling_probability == private.sample_rate
  assert event.event.noise_multiplier == private.noise_multiplier
  want = dpsgd_accounting.dpsgd_epsilon(private.noise_multiplier, private.sample_rate, 3, 1e-5)
  assert acc.get_epsilon(1e-5, "rdp") == pytest.approx(want, rel=1e-12)
  assert sampler.epsilon() == pytest.approx(want, rel=1e-12)
  assert private.epsilon(3) == pytest.approx(want, rel=1e-12)
  assert 0 < want < 2.0 and private.epsilon(0) == 0.0


def test_prepaid_epoch_is_one_ledger_entry_and_sampling_consumes_it():
  _, params, loss, x, y = _linen_setup()
  private = make_private(loss, l2_clip_norm=1.0, num_examples=len(y), key=jax.random.key(3),
                         expected_batch_size=20, noise_multiplier=1.0, delta=1e-5, steps=6)
  acc = PrivacyAccountant()
  sampler = private.sampler(acc)
  sampler.pay(4)
  for _ in range(4):
    sampler.sample()
  assert acc.ledger[0][1] == 4 and sampler.steps_paid == 4
  sampler.sample()  # not prepaid: pays one more first
  assert acc.ledger[0][1] == 5 and sampler.steps_paid == sampler.steps_sampled == 5


def test_budget_exceeded_raises_before_any_batch_or_update():
  _, params, loss, x, y = _linen_setup()
  # sigma = 1: the plan (and its compiled step) of the tests below.
  private = make_private(loss, l2_clip_norm=1.0, num_examples=len(y), key=jax.random.key(4),
                         expected_batch_size=20, noise_multiplier=1.0, delta=1e-5, steps=50)
  eps3 = private.epsilon(3)
  eps4 = private.epsilon(4)
  budget = PrivacyBudget(epsilon=0.5 * (eps3 + eps4), delta=1e-5, method="rdp")
  sampler = private.sampler(budget)
  with pytest.raises(BudgetExceededError, match="nothing was sampled"):
    sampler.pay(10)  # a whole epoch that cannot be paid: nothing spent
  assert sampler.steps_paid == 0 and budget.accountant.ledger == ()
  state = private.init(params)
  p = params
  for _ in range(3):
    p, state, _ = private.step(p, state, sampler.sample().gather(x, y))
  with pytest.raises(BudgetExceededError):
    sampler.sample()
  assert sampler.steps_sampled == 3 and int(state.step) == 3
  assert budget.accountant.ledger[0][1] == 3
  assert budget.spent_epsilon == pytest.approx(eps3, rel=1e-12)


def test_more_steps_than_planned_raise_unless_allowed_and_then_accounted():
  _, params, loss, x, y = _linen_setup()
  kw = dict(l2_clip_norm=1.0, num_examples=len(y), expected_batch_size=20, target_epsilon=1.0,
            delta=1e-5, steps=2)
  private = make_private(loss, key=jax.random.key(5), **kw)
  sampler = private.sampler(PrivacyAccountant())
  sampler.sample()
  sampler.sample()
  assert sampler.steps_remaining == 0
  with pytest.raises(BudgetExceededError, match="calibrated for"):
    sampler.sample()
  assert sampler.steps_paid == 2
  assert private.epsilon(2) <= 1.0

  extra = make_private(loss, key=jax.random.key(5), allow_extra_steps=True, **kw)
  acc = PrivacyAccountant()
  p, _, s2, _ = _run(extra, params, x, y, acc, steps=4)
  assert acc.ledger[0][1] == 4 and s2.epsilon() == pytest.approx(extra.epsilon(4))
  assert extra.epsilon(4) > 1.0  # accounted honestly beyond the target
  assert all(bool(jnp.all(jnp.isfinite(v))) for v in jax.tree.leaves(p))


def test_raw_foreign_reused_and_stale_batches_are_refused():
  _, params, loss, x, y = _linen_setup()
  kw = dict(l2_clip_norm=1.0, num_examples=len(y), expected_batch_size=20, noise_multiplier=1.0,
            delta=1e-5, steps=5)
  private = make_private(loss, key=jax.random.key(6), **kw)
  other = make_private(loss, key=jax.random.key(7), **kw)
  sampler = private.sampler(PrivacyAccountant())
  state = private.init(params)
  with pytest.raises(TypeError, match="PrivateBatch"):
    private.step(params, state, (x[:20], y[:20]))
  chunk = sampler.sample()
  with pytest.raises(TypeError, match="PrivateBatch"):  # a hand-made MaskedBatch
    private.step(params, state, chunk.chunks[0].gather(x, y))
  foreign = other.sampler(PrivacyAccountant()).sample().gather(x, y)
  with pytest.raises(ValueError, match="another plan"):
    private.step(params, state, foreign)
  batch = chunk.gather(x, y)
  p1, s1, _ = private.step(params, state, batch)
  with pytest.raises(ValueError, match="already used"):
    private.step(p1, s1, batch)
  batch2 = sampler.sample().gather(x, y)
  with pytest.raises(ValueError, match="noise key"):
    private.step(p1, state, batch2)  # the old state would reuse its noise key
  private.step(p1, s1, batch2)
  with pytest.raises(ValueError, match="num_examples"):
    sampler.sample().gather(x[:100], y[:100])
  x_nan = x.copy()
  x_nan[:] = np.nan
  with pytest.raises(ValueError, match="NaN"):
    sampler.sample().gather(x_nan, y)
  with pytest.raises(ValueError, match="one plan is one training run"):
    private.sampler(PrivacyAccountant())
  with pytest.raises(TypeError, match="accountant"):
    other.sampler(None)


def test_overflow_chunks_accumulate_to_the_same_update_as_one_big_chunk():
  # The plan of the test above (its run in chunks of P = 8 is shared) against the same plan
  # with one padded chunk per batch.
  _, params, _, x, y = _linen_setup()
  small, p_small, _, infos = _overflow_run()
  big = _overflow_plan()
  assert big.padded_size > 20 > small.padded_size
  p_big, _, _, infos_big = _run(big, params, x, y, PrivacyAccountant())
  assert ([int(i.nonprivate_num_examples) for i in infos]
          == [int(i.nonprivate_num_examples) for i in infos_big])
  assert _max_abs_diff(p_small, p_big) <= 1e-5


def test_noise_on_the_clipped_sum_has_std_sigma_times_sensitivity():
  # loss = <w, x>: every per-example gradient is x = 2 e_0 / ... of norm 2 > C = 1, so the
  # clipped sum is |B| * x / 2 exactly; sgd(lr=1): w1 = -(sum + z) / (q N).
  d, n, q_n, sigma, clip = 20_000, 100, 10.0, 1.7, 1.0
  x = np.zeros((n, d), np.float32)
  x[:, 0] = 2.0
  y = np.zeros((n,), np.int32)
  loss = lambda w, xn, yn: jnp.dot(w, xn)
  private = make_private(loss, l2_clip_norm=clip, num_examples=n, expected_batch_size=q_n,
                         noise_multiplier=sigma, delta=1e-5, steps=1, key=jax.random.key(11),
                         optimizer=optax.sgd(1.0))
  w0 = jnp.zeros((d,), jnp.float32)
  w1, _, _, (info,) = _run(private, w0, x, y, PrivacyAccountant())
  clipped_sum = np.zeros(d)
  clipped_sum[0] = float(info.nonprivate_num_examples) * 1.0
  z = -np.asarray(w1, np.float64) * q_n - clipped_sum
  std = z.std()
  # Std of a sample std of 20000 normals: sigma S / sqrt(2 * 20000) = 0.5 %; 3 % is 6 of them.
  assert std == pytest.approx(sigma * clip, rel=0.03)
  assert abs(z.mean()) < 6 * sigma * clip / math.sqrt(d)
  assert private.noise_stddev == pytest.approx(sigma * clip)


def test_calibrates_sigma_to_the_target_epsilon_for_exactly_q_and_t():
  loss = lambda w, xn, yn: jnp.dot(w, xn)
  private = make_private(loss, l2_clip_norm=1.0, num_examples=1000, sample_rate=0.05,
                         target_epsilon=1.5, delta=1e-6, epochs=3, key=jax.random.key(0))
  assert private.steps == 60
  sigma = dpsgd_accounting.calibrate_noise_multiplier(1.5, 1e-6, 0.05, 60)
  assert private.noise_multiplier == sigma
  assert private.epsilon(60) <= 1.5
  assert dpsgd_accounting.dpsgd_epsilon(0.98 * sigma, 0.05, 60, 1e-6) > 1.5


def test_nnx_model_without_clipping_or_noise_is_plain_sgd_on_the_poisson_batch():
  x, y = _toy()

  class Net(nnx.Module):

    def __init__(self, rngs):
      self.lin = nnx.Linear(5, 3, rngs=rngs)

    def __call__(self, xb):
      return self.lin(xb)

  net = Net(nnx.Rngs(0))
  graphdef, params, rest = nnx.split(net, nnx.Param, ...)
  apply = lambda p, xb: nnx.merge(graphdef, p, rest)(xb)
  loss = dpsgd.make_per_example_loss(apply)
  private = make_private(loss, l2_clip_norm=math.inf, num_examples=len(y), expected_batch_size=25,
                         noise_multiplier=0.0, steps=1, key=jax.random.key(3),
                         optimizer=optax.sgd(0.3), clipping_method="vmap")
  acc = PrivacyAccountant()
  sampler = private.sampler(acc)
  ticket = sampler.sample()
  out, _, _ = private.step(params, private.init(params), ticket.gather(x, y))
  idx = np.concatenate([c.indices for c in ticket.chunks])
  total = lambda p: jnp.sum(jax.vmap(loss, in_axes=(None, 0, 0))(p, x[idx], y[idx]))
  want = jax.tree.map(lambda p, g: p - 0.3 * g / 25.0, params, jax.jit(jax.grad(total))(params))
  assert _max_abs_diff(out, want) <= 1e-5
  assert isinstance(acc.ledger[0][0], events.NonPrivateDpEvent)
  assert private.epsilon(1, delta=1e-5) == math.inf
  with pytest.raises(BudgetExceededError):  # a budget never pays a non-private step
    make_private(loss, l2_clip_norm=math.inf, num_examples=len(y), expected_batch_size=25,
                 noise_multiplier=0.0, steps=1, key=jax.random.key(4)).sampler(
                     PrivacyBudget(epsilon=100.0, delta=1e-5)).sample()


def test_same_key_same_result():
  _, params, loss, x, y = _linen_setup()
  kw = dict(l2_clip_norm=1.0, num_examples=len(y), expected_batch_size=20, noise_multiplier=1.0,
            delta=1e-5, steps=2, key=jax.random.key(12))
  a, _, _, _ = _run(make_private(loss, **kw), params, x, y, PrivacyAccountant())
  b, _, _, _ = _run(make_private(loss, **kw), params, x, y, PrivacyAccountant())
  c, _, _, _ = _run(make_private(loss, **dict(kw, key=jax.random.key(13))), params, x, y,
                    PrivacyAccountant())
  assert _max_abs_diff(a, b) == 0.0 and _max_abs_diff(a, c) > 1e-3


@pytest.mark.parametrize("bad, match", [
    (dict(target_epsilon=0.0), "target_epsilon"),
    (dict(target_epsilon=1.0, delta=1.0), "delta"),
    (dict(target_epsilon=1.0, delta=None), "delta is required"),
    (dict(noise_multiplier=1.0, target_epsilon=1.0), "exactly one of target_epsilon"),
    (dict(expected_batch_size=300), "expected_batch_size"),
    (dict(expected_batch_size=None, sample_rate=1.5), "sample_rate"),
    (dict(sample_rate=0.1), "exactly one of sample_rate"),
    (dict(epochs=1), "exactly one of epochs"),
    (dict(l2_clip_norm=math.inf), "finite"),
    (dict(l2_clip_norm=-1.0), "l2_clip_norm"),
    (dict(noise_multiplier=-1.0, target_epsilon=None), "noise_multiplier"),
    (dict(physical_batch_size=0), "padded_size"),
    (dict(accountant_method="moments"), "accountant_method"),
    (dict(num_examples=0), "num_examples"),
])
def test_bad_arguments_raise_naming_the_argument(bad, match):
  loss = lambda w, xn, yn: jnp.dot(w, xn)
  kw = dict(l2_clip_norm=1.0, num_examples=200, expected_batch_size=20, target_epsilon=1.0,
            delta=1e-5, steps=10, key=jax.random.key(0))
  kw.update(bad)
  with pytest.raises(ValueError, match=match):
    make_private(loss, **kw)


def test_bad_key_loss_or_optimizer_is_refused():
  kw = dict(l2_clip_norm=1.0, num_examples=10, expected_batch_size=2, noise_multiplier=1.0,
            steps=1)
  loss = lambda w, xn, yn: jnp.dot(w, xn)
  with pytest.raises((TypeError, ValueError)):
    make_private(loss, key=0, **kw)
  with pytest.raises(TypeError, match="per_example_loss"):
    make_private("loss", key=jax.random.key(0), **kw)
  with pytest.raises(TypeError, match="optimizer"):
    make_private(loss, key=jax.random.key(0), optimizer=0.1, **kw)
  with pytest.raises(ValueError, match="give delta"):
    make_private(loss, key=jax.random.key(0), **kw).epsilon(1)


def test_docstring_examples():
  failures, tried = doctest.testmod(private_step, verbose=False)
  assert tried >= 2 and failures == 0


def test_resume_from_a_checkpoint_continues_the_same_run():
  _, params, loss, x, y = _linen_setup()
  kw = dict(l2_clip_norm=1.0, num_examples=len(y), expected_batch_size=20, noise_multiplier=1.0,
            delta=1e-5, steps=4, key=jax.random.key(14))
  straight, _, _, _ = _run(make_private(loss, **kw), params, x, y, PrivacyAccountant())
  acc = PrivacyAccountant()
  half, state, _, _ = _run(make_private(loss, **kw), params, x, y, acc, steps=2)
  resumed = make_private(loss, **kw)  # e.g. in a new process, same arguments and key
  sampler = resumed.sampler(acc, start_step=2)
  with pytest.raises(ValueError, match="noise key"):  # a fresh state is not the checkpoint
    resumed.step(half, resumed.init(params), sampler.sample().gather(x, y))
  resumed2 = make_private(loss, **kw)
  sampler2 = resumed2.sampler(acc, start_step=2)
  p = half
  for _ in range(2):
    p, state, _ = resumed2.step(p, state, sampler2.sample().gather(x, y))
  assert _max_abs_diff(p, straight) <= 1e-6
  assert sampler2.steps_remaining == 0
  with pytest.raises(ValueError, match="start_step"):
    make_private(loss, **kw).sampler(acc, start_step=5)
