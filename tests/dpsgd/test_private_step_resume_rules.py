"""A run's ledger holds every step it released, however it was resumed; refusals keep the paid step."""

import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdp.accounting import PrivacyAccountant, PrivacyBudget
from jaxdp.dpsgd import make_per_example_loss, make_private
from jaxdp.dpsgd.correlated import BandMF

import _linear_problem as lp

N, D, K, T = lp.N, lp.D, lp.K, 6  # the plans' programs are shared with other files (_linear_problem)


def _data(order=None):
  rng = np.random.default_rng(1)
  x, y = rng.normal(size=(N, D)).astype(np.float32), rng.integers(0, K, N).astype(np.int32)
  return (x, y) if order is None else (x[order], y[order])


def _plan(**kw):
  args = dict(lp.PLAN, steps=T, key=jax.random.key(4))
  args.update(kw)
  return make_private(lp.loss, **args)


def _steps_in(ledger_owner):
  inner = getattr(ledger_owner, "accountant", ledger_owner)
  return sum(c for _, c in inner.ledger)


def _finish(private, sampler, params, state, data):
  while sampler.steps_remaining:
    params, state, _ = private.step(params, state, sampler.sample().gather(*data))
  return params, state


@pytest.mark.parametrize("durable", [False, True])
def test_start_step_on_an_empty_ledger_charges_the_earlier_steps(tmp_path, durable):
  acc = (PrivacyBudget(50.0, 1e-5, path=tmp_path / "b.json") if durable else PrivacyAccountant())
  private = _plan()
  params = jnp.zeros((D, K))
  sampler = private.sampler(acc, start_step=3)
  assert _steps_in(acc) == 3  # the 3 steps released before the sampler opened
  state = private.init(params)
  state = private._skip_to_unpaid(params, state, 3)[1]  # a state that has applied 3 updates
  _finish(private, sampler, params, state, _data())
  assert _steps_in(acc) == T
  if durable:
    stored = json.loads((tmp_path / "b.json").read_text())
    assert sum(c for _, c in PrivacyAccountant.from_state_dict(stored["accountant"]).ledger) == T


def test_start_step_is_not_charged_twice_when_the_ledger_holds_it():
  acc = PrivacyAccountant()
  first = _plan()
  smp = first.sampler(acc)
  smp.pay(3)
  resumed = _plan()
  resumed.sampler(acc, start_step=3)
  assert _steps_in(acc) == 3


def test_a_correlated_run_resumed_by_hand_records_its_event():
  acc = PrivacyAccountant()
  private = _plan(noise_strategy=BandMF.dp_sgd(), min_separation=1)
  private.sampler(acc, start_step=2)
  assert len(acc.ledger) == 1 and acc.ledger[0][1] == 1  # the run's one event, once


def test_a_durable_ledger_paid_by_another_budget_file_is_charged_again(tmp_path):
  run = tmp_path / "run"
  first = _plan(checkpoint_dir=run, checkpoint_every=2)
  params = jnp.zeros((D, K))
  p, s = first.restore(params, data=_data())
  budget_a = PrivacyBudget(50.0, 1e-5, path=tmp_path / "a.json")
  smp = first.sampler(budget_a)
  for _ in range(3):
    p, s, _ = first.step(p, s, smp.sample().gather(*_data()))
  first.close()
  # The same budget file: it holds the steps (not charged twice).
  again = _plan(checkpoint_dir=run, checkpoint_every=2)
  again.restore(params, data=_data())
  again.sampler(PrivacyBudget(50.0, 1e-5, path=tmp_path / "a.json"))
  assert _steps_in(PrivacyBudget(50.0, 1e-5, path=tmp_path / "a.json")) == 3
  # Another (empty) budget file with a path attribute: charged, not assumed.
  other = _plan(checkpoint_dir=run, checkpoint_every=2)
  other.restore(params, data=_data())
  budget_b = PrivacyBudget(50.0, 1e-5, path=tmp_path / "b.json")
  other.sampler(budget_b)
  assert _steps_in(budget_b) == 3


def _noise_keys_of_run(private, sampler, p, s, data, stop=None):
  keys = []
  while sampler.steps_remaining and sampler.steps_sampled != stop:
    keys.append(tuple(np.asarray(jax.random.key_data(s.opt_state[0].key)).tolist()))
    p, s, _ = private.step(p, s, sampler.sample().gather(*data))
  private.close()
  return keys, p


@pytest.mark.parametrize("change", ["reordered_rows", "no_data", "reinitialised_params"])
def test_lost_steps_are_replayed_only_on_the_runs_data_and_params(tmp_path, change):
  params = jnp.zeros((D, K))
  first = _plan(checkpoint_dir=tmp_path, checkpoint_every=100)  # no checkpoint before the end
  p, s = first.restore(params, data=_data())
  lost, _ = _noise_keys_of_run(first, first.sampler(PrivacyAccountant()), p, s, _data(), stop=3)
  data = _data(np.random.default_rng(0).permutation(N)) if change == "reordered_rows" else _data()
  start = params + 0.1 if change == "reinitialised_params" else params
  again = _plan(checkpoint_dir=tmp_path, checkpoint_every=100)
  p, s = again.restore(start, data=None if change == "no_data" else data)
  acc = PrivacyAccountant()
  sampler = again.sampler(acc)
  assert sampler.steps_sampled == 3  # continues at the first unpaid step
  after, _ = _noise_keys_of_run(again, sampler, p, s, data)
  assert not set(after) & set(lost)  # no released noise is drawn again
  assert _steps_in(acc) == T  # the lost steps stay spent


def test_the_same_data_and_params_replay_bit_identically(tmp_path):
  params = jnp.zeros((D, K))
  ref_plan = _plan()
  _, ref = _noise_keys_of_run(ref_plan, ref_plan.sampler(PrivacyAccountant()), params,
                              ref_plan.init(params), _data())
  first = _plan(checkpoint_dir=tmp_path, checkpoint_every=100)
  p, s = first.restore(params, data=_data())
  _noise_keys_of_run(first, first.sampler(PrivacyAccountant()), p, s, _data(), stop=3)
  again = _plan(checkpoint_dir=tmp_path, checkpoint_every=100)
  p, s = again.restore(params, data=_data())
  acc = PrivacyAccountant()
  sampler = again.sampler(acc)
  assert sampler.steps_sampled == 0
  _, out = _noise_keys_of_run(again, sampler, p, s, _data())
  np.testing.assert_array_equal(np.asarray(out), np.asarray(ref))
  assert _steps_in(acc) == T
  # Replayed steps gathered from other data are refused before the update, step kept.
  third = _plan(checkpoint_dir=tmp_path / "x", checkpoint_every=100)
  p, s = third.restore(params, data=_data())
  smp = third.sampler(PrivacyAccountant())
  _noise_keys_of_run(third, smp, p, s, _data(), stop=2)
  fourth = _plan(checkpoint_dir=tmp_path / "x", checkpoint_every=100)
  p, s = fourth.restore(params, data=_data())
  smp = fourth.sampler(PrivacyAccountant())
  ticket = smp.sample()
  with pytest.raises(ValueError, match="differ from the data the run's lost steps"):
    ticket.gather(*_data(np.arange(N)[::-1]))
  assert smp.sample() is ticket


def test_checkpoint_and_mesh_arguments_are_checked_before_any_work(tmp_path):
  with pytest.raises(ValueError, match="checkpoint_dir must name a directory"):
    _plan(checkpoint_dir="")
  with pytest.raises(TypeError, match="mesh must be a jax.sharding.Mesh"):
    _plan().sampler(PrivacyAccountant(), data=_data(), mesh="data")
  run = _plan(checkpoint_dir=tmp_path, checkpoint_every=1)
  p, s = run.restore(jnp.zeros((D, K)), data=_data())
  smp = run.sampler(PrivacyAccountant())
  run.step(p, s, smp.sample().gather(*_data()))
  run.close()
  with pytest.raises(ValueError, match=r"call restore\(params\) before sampler"):
    _plan(checkpoint_dir=tmp_path, checkpoint_every=1).sampler(PrivacyAccountant())
  with pytest.raises(ValueError, match="does not match params") as info:
    _plan(checkpoint_dir=tmp_path, checkpoint_every=1).restore({"w": jnp.zeros((D + 1, K))})
  assert info.value.__cause__ is None and "orbax" not in str(info.value).lower()


def test_device_batches_used_out_of_order_or_gathered_keep_their_paid_step():
  private = _plan()
  acc = PrivacyAccountant()
  sampler = private.sampler(acc, data=_data())
  params = jnp.zeros((D, K))
  state = private.init(params)
  first = sampler.sample()
  with pytest.raises(TypeError, match="needs no gather"):
    first.gather(*_data())
  second = sampler.sample()
  with pytest.raises(ValueError, match="Use it first"):
    private.step(params, state, second)
  again = sampler.sample()
  assert again.step_index == 0
  params, state, _ = private.step(params, state, again)
  params, state, _ = private.step(params, state, sampler.sample())
  assert int(state.step) == 2 and _steps_in(acc) == 2


@pytest.mark.parametrize("bad, match", [
    ("labels_out_of_range", r"outside \[0, 3\)"),
    ("labels_column", r"labels.*one label per example|labels.*shape"),
    ("feature_count", r"features|per_example_loss"),
])
def test_device_data_refused_then_a_corrected_sampler_continues_the_run(bad, match):
  x, y = _data()
  if bad == "labels_out_of_range":
    wrong = (x, y + K)
  elif bad == "labels_column":
    wrong = (x, y[:, None])
  else:
    wrong = (np.ones((N, D + 1), np.float32), y)
  private = make_private(make_per_example_loss(lambda w, xb: xb @ w), l2_clip_norm=1.0,
                         num_examples=N, expected_batch_size=20, noise_multiplier=1.0,
                         delta=1e-5, steps=T, key=jax.random.key(4))
  acc = PrivacyAccountant()
  params = jnp.zeros((D, K))
  state = private.init(params)
  try:
    sampler = private.sampler(acc, data=wrong)
    batch = sampler.sample()
    private.step(params, state, batch)
  except (TypeError, ValueError) as err:
    assert re.search(match, str(err), re.S), str(err)
    assert "jax" not in type(err).__module__
  else:
    pytest.fail("bad device data was accepted")
  paid = _steps_in(acc)
  assert paid <= 1
  sampler = private.sampler(acc, data=(x, y))  # corrected: continues, pays nothing again
  params, state, _ = private.step(params, state, sampler.sample())
  assert _steps_in(acc) == max(paid, 1) and int(state.step) == 1
