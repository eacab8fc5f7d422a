"""A resumed run never draws a released step's noise again, whichever piece of its state is gone.

``make_private(checkpoint_dir=...)`` keeps two things (:mod:`jaxdp.dpsgd.checkpointing`):
``ledger.json`` (steps paid, the newest step ever checkpointed, the replay binding: the
digests of the run's data and starting parameters) and ``orbax/<step>`` (the states).
Replaying a paid step with its original noise is allowed only when that step's output
never left the process (no checkpoint of it was ever finalised) and the replay is bound
to the same data and parameters; otherwise the run continues at the first unpaid step
with fresh keys (``PrivateSGD.restore``). Each test removes one piece and checks the
documented outcome: the noise keys of the continued steps against those of the released
ones, and the accountant's total.
"""

import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdp.accounting import PrivacyAccountant
from jaxdp.dpsgd import make_private

import _linear_problem as lp

N, D, K, T = lp.N, lp.D, lp.K, 5  # the plans' programs are shared with other files (_linear_problem)


def _data():
  rng = np.random.default_rng(7)
  return rng.normal(size=(N, D)).astype(np.float32), rng.integers(0, K, N).astype(np.int32)


def _plan(directory, every):
  return make_private(lp.loss, steps=T, key=jax.random.key(21), checkpoint_dir=directory,
                      checkpoint_every=every, **lp.PLAN)


def _run(directory, every, stop=None, data=True):
  """Restores (or starts) the run and steps it; returns (keys of each step, sampler, accountant).

  ``keys[i]`` is ``(step index, noise key data)`` of the i-th update this call applied.
  """
  private = _plan(directory, every)
  params, state = private.restore(jnp.zeros((D, K), jnp.float32),
                                  data=_data() if data else None)
  acc = PrivacyAccountant()
  sampler = private.sampler(acc)
  start = sampler.steps_sampled
  keys = []
  while sampler.steps_remaining and sampler.steps_sampled != stop:
    at = sampler.steps_sampled
    keys.append((at, tuple(np.asarray(jax.random.key_data(state.opt_state[0].key)).ravel())))
    params, state, _ = private.step(params, state, sampler.sample().gather(*_data()))
  private.close()
  return keys, start, sampler, acc


def _paid(acc):
  return sum(c for _, c in acc.ledger)


def _ledger(directory):
  return json.loads((directory / "ledger.json").read_text())


def test_checkpoints_gone_ledger_kept_continues_with_fresh_noise(tmp_path):
  first, _, _, _ = _run(tmp_path, every=1, stop=3)  # steps 0, 1, 2 paid and checkpointed
  ledger = _ledger(tmp_path)
  assert ledger["steps_paid"] == 3 and ledger["checkpointed_through"] == 3
  assert ledger.get("replay_binding") is not None  # same data and params: replay WOULD bind
  shutil.rmtree(tmp_path / "orbax")  # every checkpoint gone, the ledger kept
  after, start, sampler, acc = _run(tmp_path, every=1)
  # The released steps 0..2 are not replayed from the initial keys: the run continues at
  # the first unpaid step, with keys no released step used.
  assert start == 3
  assert [i for i, _ in after] == [3, 4]
  assert not {k for _, k in after} & {k for _, k in first}
  # Steps 0..2 charged once (from the durable ledger), then the new ones.
  assert _paid(acc) == T == sampler.steps_paid
  assert _ledger(tmp_path)["steps_paid"] == T


def test_ledger_gone_checkpoints_kept_never_undercharges(tmp_path):
  first, _, _, _ = _run(tmp_path, every=1, stop=3)
  (tmp_path / "ledger.json").unlink()  # the durable ledger gone, checkpoints kept
  after, start, sampler, acc = _run(tmp_path, every=1)
  # The checkpoint of step 3 is restored: its state holds the key of step 3, never used.
  assert start == 3
  assert not {k for _, k in after} & {k for _, k in first}
  # The restored parameters carry steps 0..2: an accountant of this run must hold them.
  assert _paid(acc) == T, _paid(acc)


def test_replay_binding_gone_does_not_replay_lost_steps(tmp_path):
  first, _, _, _ = _run(tmp_path, every=2, stop=3)  # checkpoint at 2; step 2 paid, lost
  ledger = _ledger(tmp_path)
  assert ledger["steps_paid"] == 3 and ledger["checkpointed_through"] == 2
  ledger.pop("replay_binding")
  (tmp_path / "ledger.json").write_text(json.dumps(ledger))
  after, start, sampler, acc = _run(tmp_path, every=2)
  assert start == 3  # step 2 is not replayed: nothing binds it to the run's data
  assert not {k for _, k in after} & {k for _, k in first}
  assert _paid(acc) == T == sampler.steps_paid


def test_with_every_piece_kept_a_lost_step_replays_bit_identically(tmp_path):
  """The control: a bound replay of the lost (never released) step 2 reuses its key."""
  first, _, _, _ = _run(tmp_path, every=2, stop=3)
  after, start, sampler, acc = _run(tmp_path, every=2)
  assert start == 2
  assert after[0] == first[2]  # the same step, the same noise key: bit-identical replay
  assert not {k for _, k in after[1:]} & {k for _, k in first}
  assert _paid(acc) == T == sampler.steps_paid
