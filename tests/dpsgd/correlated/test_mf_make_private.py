"""make_private(noise_strategy=...): correlated-noise training of Flax models on the ledger."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxdp.accounting import PrivacyAccountant, PrivacyBudget
from jaxdp.errors import BudgetExceededError
from jaxdp import dpsgd
from jaxdp.dpsgd.correlated import BLT, BandMF, mf_epsilon, mf_event

N, D, K = 240, 6, 3
RNG = np.random.default_rng(0)
X = RNG.normal(size=(N, D)).astype(np.float32)
Y = (X[:, 0] > 0).astype(np.int32) + (X[:, 1] > 1).astype(np.int32)


def _loss(w, x, y):
  return optax.softmax_cross_entropy_with_integer_labels(x @ w, y)


def _train(private, params, accountant, steps):
  sampler = private.sampler(accountant)
  state = private.init(params)
  for _ in range(steps):
    params, state, _ = private.step(params, state, sampler.sample().gather(X, Y))
  return params, sampler


def test_one_band_one_group_is_dp_sgd_bit_for_bit():
  common = dict(l2_clip_norm=1.0, num_examples=N, key=jax.random.key(4), sample_rate=0.1,
                noise_multiplier=1.2, delta=1e-5, steps=5)
  w0 = jnp.zeros((D, K))
  acc_a, acc_b = PrivacyAccountant(), PrivacyAccountant()
  a, _ = _train(dpsgd.make_private(_loss, **common), w0, acc_a, 5)
  b, _ = _train(dpsgd.make_private(_loss, noise_strategy=BandMF.dp_sgd(), min_separation=1,
                                   **common), w0, acc_b, 5)
  np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  for method in ("rdp", "pld"):
    assert acc_a.get_epsilon(1e-5, method) == acc_b.get_epsilon(1e-5, method)


class _Linear(nn.Module):
  """One dense layer: training a Flax model is what is checked, not its depth (a two-layer MLP
  compiles its steps in about twice the time)."""

  @nn.compact
  def __call__(self, x):
    return nn.Dense(K)(x)


@pytest.mark.parametrize("strategy,b", [(BandMF(np.array([1.0, 0.5, 0.25])), None),
                                        (BLT(np.array([0.8]), np.array([0.4])), 4)],
                         ids=["bandmf", "blt"])
def test_flax_model_trains_and_the_run_is_paid_once(strategy, b):
  model = _Linear()
  params = model.init(jax.random.key(0), X[:1])
  loss = dpsgd.make_per_example_loss(model.apply)
  steps = 24
  private = dpsgd.make_private(loss, l2_clip_norm=1.0, num_examples=N, key=jax.random.key(1),
                               expected_batch_size=40, noise_multiplier=0.5, delta=1e-5,
                               steps=steps, optimizer=optax.adam(0.05), noise_strategy=strategy,
                               min_separation=b)
  groups = 3 if b is None else b
  assert private.min_separation == groups
  assert private.sample_rate == pytest.approx(40 * groups / N)
  assert private.expected_batch_size == pytest.approx(40.0)
  acc = PrivacyAccountant()
  before = float(jnp.mean(jax.vmap(loss, (None, 0, 0))(params, X, Y)))
  trained, sampler = _train(private, params, acc, steps)
  after = float(jnp.mean(jax.vmap(loss, (None, 0, 0))(trained, X, Y)))
  assert after < before
  want = mf_event(strategy, noise_multiplier=0.5, num_steps=steps, min_separation=groups,
                  sample_rate=private.sample_rate)
  assert acc.ledger == ((want, 1),)
  assert private.epsilon(steps) == mf_epsilon(
      strategy, noise_multiplier=0.5, num_steps=steps, min_separation=groups,
      sample_rate=private.sample_rate, delta=1e-5)
  with pytest.raises(BudgetExceededError, match="exceed"):
    sampler.sample()  # step T + 1 is outside the participation schema
  assert acc.ledger == ((want, 1),)


def test_batches_follow_the_cyclic_groups():
  private = dpsgd.make_private(_loss, l2_clip_norm=1.0, num_examples=N, key=jax.random.key(2),
                               sample_rate=0.5, noise_multiplier=1.0, steps=12,
                               noise_strategy=BandMF(np.array([1.0, 0.5])), min_separation=3)
  sampler = private.sampler(PrivacyAccountant())
  when = {}
  for t in range(12):
    for chunk in sampler.sample().chunks:
      idx, mask = chunk.slots_and_mask()
      for i in idx[mask]:
        when.setdefault(int(i), []).append(t)
  assert when and all(len({t % 3 for t in ts}) == 1 and len(ts) <= 4 for ts in when.values())


@pytest.mark.slow  # always-on twin: the charge check of PrivateSGD.step[noise=BandMF, clip=fixed]
def test_short_budget_refuses_before_any_batch():
  strategy = BandMF(np.array([1.0, 0.5]))
  private = dpsgd.make_private(_loss, l2_clip_norm=1.0, num_examples=N, key=jax.random.key(3),
                               sample_rate=0.2, noise_multiplier=1.0, delta=1e-5, steps=10,
                               noise_strategy=strategy)
  full = private.epsilon(10)
  budget = PrivacyBudget(epsilon=0.5 * full, delta=1e-5)
  sampler = private.sampler(budget)
  with pytest.raises(BudgetExceededError, match="correlated-noise run"):
    sampler.sample()
  assert not budget.accountant.ledger and sampler.steps_sampled == 0


@pytest.mark.slow  # always-on twin: test_mf_accounting.py::test_calibration_meets_the_target_tightly
def test_target_epsilon_calibrates_the_run():
  private = dpsgd.make_private(_loss, l2_clip_norm=1.0, num_examples=N, key=jax.random.key(3),
                               expected_batch_size=30, target_epsilon=2.0, delta=1e-5, epochs=2,
                               noise_strategy=BandMF(np.array([1.0, 0.4])))
  # epochs -> steps: ceil(epochs * b / p) with p = 30 * 2 / N.
  assert private.steps == int(np.ceil(2 * 2 / (60 / N)))
  assert 1.9 < private.epsilon(private.steps) <= 2.0


def test_unsupported_combinations_are_refused_before_any_work(tmp_path):
  base = dict(l2_clip_norm=1.0, num_examples=N, key=jax.random.key(0), sample_rate=0.1,
              noise_multiplier=1.0, steps=4)
  blt = BLT(np.array([0.5]), np.array([0.2]))
  with pytest.raises(ValueError, match="min_separation is required"):
    dpsgd.make_private(_loss, noise_strategy=blt, **base)
  with pytest.raises(ValueError, match="min_separation needs noise_strategy"):
    dpsgd.make_private(_loss, min_separation=2, **base)
  with pytest.raises(TypeError, match="noise_strategy"):
    dpsgd.make_private(_loss, noise_strategy="bandmf", **base)
  # checkpoint_dir works (tests/dpsgd/test_plan_cells.py); allow_extra_steps has no row in C.
  with pytest.raises(ValueError, match="allow_extra_steps.*no row in C"):
    dpsgd.make_private(_loss, noise_strategy=blt, min_separation=1, allow_extra_steps=True,
                       **base)
  with pytest.raises(ValueError, match="accounted by PLD only"):
    dpsgd.make_private(_loss, noise_strategy=blt, min_separation=1, neighbouring="replace_one",
                       **base)
  with pytest.raises(ValueError, match="min_separation"):
    dpsgd.make_private(_loss, noise_strategy=blt, min_separation=N + 1, **base)
  with pytest.raises(ValueError, match="expected_batch_size"):
    dpsgd.make_private(_loss, noise_strategy=blt, min_separation=4,
                       **{**base, "sample_rate": None, "expected_batch_size": N / 2})
  private = dpsgd.make_private(_loss, noise_strategy=blt, min_separation=2, **base)
  # Device-resident data works too (equality with the host path: test_device_cells.py).
  assert private.sampler(PrivacyAccountant(), data=(X, Y)).device_resident
  with pytest.raises(ValueError, match="no per-step event"):
    private.step_event()
