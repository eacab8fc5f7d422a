"""make_private(checkpoint_dir=...): restore, replay rules and the ledger of a resumed run."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdp.accounting import PrivacyAccountant
from jaxdp.dpsgd import make_private

import _linear_problem as lp

N, D, K, T = lp.N, lp.D, lp.K, 8  # the plans' programs are shared with other files (_linear_problem)


def _data():
  rng = np.random.default_rng(1)
  return rng.normal(size=(N, D)).astype(np.float32), rng.integers(0, K, N).astype(np.int32)


def _plan(directory, noise_multiplier=1.0, **clip_options):
  return make_private(lp.loss, steps=T, key=jax.random.key(9), checkpoint_dir=directory,
                      checkpoint_every=3, **{**lp.PLAN, "noise_multiplier": noise_multiplier},
                      **clip_options)


def _train(directory, stop=None, step=None):
  """Runs (or resumes) the plan; stops after ``stop`` sampled steps like a pre-empted job."""
  private = _plan(directory)
  acc = PrivacyAccountant()
  params, state = private.restore(jnp.zeros((D, K), jnp.float32), step=step, data=_data())
  sampler = private.sampler(acc, data=_data())
  noise_keys = []
  while sampler.steps_remaining and sampler.steps_sampled != stop:
    noise_keys.append(np.asarray(jax.random.key_data(state.opt_state[0].key)).tolist())
    params, state, _ = private.step(params, state, sampler.sample())
  private.close()
  return np.asarray(params), acc, sampler, noise_keys


def _paid(acc):
  return sum(c for _, c in acc.ledger)


def test_resume_continues_bit_identically_and_pays_each_step_once(tmp_path):
  ref, acc_ref, _, _ = _train(tmp_path / "ref")
  assert _paid(acc_ref) == T
  _, acc, _, _ = _train(tmp_path / "run", stop=5)  # checkpoint at 3; steps 3, 4 paid, unsaved
  assert _paid(acc) == 5
  out, acc, sampler, _ = _train(tmp_path / "run")
  np.testing.assert_array_equal(out, ref)
  # A fresh in-memory accountant is charged the durable ledger's steps, then the rest.
  assert _paid(acc) == T == sampler.steps_paid
  assert json.loads((tmp_path / "run" / "ledger.json").read_text())["steps_paid"] == T


def test_an_older_checkpoint_never_replays_a_released_step(tmp_path):
  _, _, _, keys_first = _train(tmp_path, stop=7)  # checkpoints at 3 and 6, 7 steps paid
  out, acc, sampler, keys_after = _train(tmp_path, step=3)
  # Steps 3..6 were released in the checkpoint of step 6: the run goes on at step 7 with a
  # noise key no earlier step used, and the lost steps stay spent.
  assert len(keys_after) == T - 7
  assert not set(map(tuple, keys_after)) & set(map(tuple, keys_first))
  assert _paid(acc) == T == sampler.steps_paid


def test_another_plan_is_refused_before_anything_is_written(tmp_path):
  _train(tmp_path, stop=2)
  before = (tmp_path / "ledger.json").read_text()
  with pytest.raises(ValueError, match="another plan"):
    _plan(tmp_path, noise_multiplier=1.5)
  assert (tmp_path / "ledger.json").read_text() == before


@pytest.mark.parametrize("clip_options", [{"per_layer": True}, {"clipping_method": "reweight"},
                                          {"microbatch_size": 8}])
def test_another_clipping_rule_with_the_same_sensitivity_is_refused(tmp_path, clip_options):
  # Per-layer norms with the same total S, or another method or microbatching, release other
  # updates from the same batch and noise: a replay under them is not the lost step.
  _train(tmp_path, stop=2)
  with pytest.raises(ValueError, match="clip_rule"):
    _plan(tmp_path, **clip_options)


def test_checkpoint_arguments_are_checked():
  with pytest.raises(ValueError, match="checkpoint_every needs checkpoint_dir"):
    make_private(lp.loss, steps=T, key=jax.random.key(0), checkpoint_every=2, **lp.PLAN)
  with pytest.raises(ValueError, match="restore"):
    make_private(lp.loss, steps=T, key=jax.random.key(0), **lp.PLAN).restore(jnp.zeros((D, K)))


def test_start_step_with_a_checkpoint_dir_is_refused(tmp_path):
  private = _plan(tmp_path)
  private.restore(jnp.zeros((D, K), jnp.float32))
  with pytest.raises(ValueError, match="start_step cannot be combined"):
    private.sampler(PrivacyAccountant(), start_step=2)


# -- train_dpsgd(checkpoint_dir=...) ----------------------------------------------------------


class _Preempted(Exception):
  pass


@pytest.mark.slow
def test_train_dpsgd_resumes_to_the_uninterrupted_result(tmp_path):
  from jaxdp import models  # pylint: disable=import-outside-toplevel
  from jaxdp.accounting import PrivacyBudget  # pylint: disable=import-outside-toplevel
  from jaxdp.dpsgd import train_dpsgd  # pylint: disable=import-outside-toplevel
  x, y = _data()
  model = models.MLP(hidden_sizes=(8,), num_classes=K)
  kw = dict(key=jax.random.key(1), epochs=1.0, l2_clip_norm=1.0, delta=1e-5,
            expected_batch_size=30, noise_multiplier=1.0)
  ref = train_dpsgd(model, x, y, **kw)

  def preempt(params):
    raise _Preempted  # a crash after the checkpoint of step 4

  budget_path = tmp_path / "budget.json"
  budget = PrivacyBudget(50.0, 1e-5, path=budget_path)
  with pytest.raises(_Preempted):
    train_dpsgd(model, x, y, checkpoint_dir=tmp_path / "ckpt", checkpoint_every=2,
                accountant=budget, eval_fn=preempt, eval_every=5, **kw)
  resumed = train_dpsgd(model, x, y, checkpoint_dir=tmp_path / "ckpt", checkpoint_every=2,
                        accountant=PrivacyBudget(50.0, 1e-5, path=budget_path), **kw)
  assert resumed.steps == ref.steps
  for a, b in zip(jax.tree.leaves(ref.params), jax.tree.leaves(resumed.params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  # The durable budget holds the planned event once (it was paid before the first step).
  assert PrivacyBudget.load(budget_path).accountant.ledger == budget.accountant.ledger
  assert len(budget.accountant.ledger) == 1
  with pytest.raises(ValueError, match="another plan"):
    train_dpsgd(model, x, y, checkpoint_dir=tmp_path / "ckpt",
                **{**kw, "noise_multiplier": 2.0})
