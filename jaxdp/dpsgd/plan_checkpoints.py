"""Checkpoints of a private plan: where a restarted run continues, and when it may replay.

A run with ``checkpoint_dir`` keeps Orbax checkpoints and a durable ledger
(:class:`~.checkpointing.RunCheckpointer`: steps paid, newest step ever
checkpointed, the digests binding the run's data and starting parameters).
A killed run may have paid steps whose updates were lost with the process.
Restarting, it either

* replays them with their original batches and noise -- allowed only when no
  checkpoint of them was ever finalised and the data (and, from step 0, the
  parameters) have the digests bound in the ledger, so the replayed updates
  are bit-identical to the lost ones and nothing new is released; or
* continues at the first unpaid step with fresh sampling and noise keys
  (:func:`skip_to_unpaid`; the lost steps stay spent). A correlated-noise run
  cannot (its later rows mix every earlier step's noise) and is refused.

With several processes the ledger is written by process 0 and read by all;
a process reading it just after process 0 rewrote it may see the older file.
So process 0's reading decides: :func:`ledger_view` reads the ledger on every
process (their Orbax managers stay in step) and broadcasts process 0's numbers
and verdicts (:func:`.multihost.broadcast_from_coordinator`, as the payment of
a step is), and every process acts on the same decision.
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

import jax

from jaxdp.errors import BudgetExceededError
from jaxdp.dpsgd import checkpointing, data_digest, multihost, plan_noise, plan_selection
from jaxdp.dpsgd.plan_state import PrivateState

PyTree = Any


def run_checkpointer(checkpoint_dir: Any, checkpoint_every: int | None, *, key: Any,
                     selection: Any, clip: Any, noise: Any, noise_multiplier: float,
                     noise_strategy: Any, accountant_method: str) -> tuple[Any, int | None]:
  """``(RunCheckpointer or None, checkpoint_every)`` for a plan (arguments checked before).

  ``selection``, ``clip`` and ``noise`` are the plan's
  :class:`~.plan_selection.Selection`, :class:`~.plan_clipping.Clipping` and
  :class:`~.plan_noise.Noise` parts; ``noise_multiplier`` its calibrated sigma.
  The fingerprint holds every public number that fixes the run's steps (N, q,
  sigma, S, T, P, relation, unit, method, the key's digest, b, the strategy's
  and the batch selection's digests, the adaptive rule, :func:`clip_rule`): a
  directory written by another plan is refused before anything is read. ``checkpoint_every``
  defaults to ``max(1, T // 10)``.
  """
  if checkpoint_dir is None:
    return None, checkpoint_every
  sel = selection
  fingerprint = {
      "num_examples": sel.num_examples, "sample_rate": sel.sample_rate,
      "noise_multiplier": float(noise_multiplier), "sensitivity": clip.sensitivity,
      "steps": sel.steps, "padded_size": int(sel.padded_size), "unit": sel.unit,
      "neighbouring": sel.neighbouring, "accountant_method": accountant_method,
      "key_sha256": checkpointing.key_digest(key),
      "gradient_noise_multiplier": float(noise.gradient_noise_multiplier),
      "min_separation": sel.min_separation,
      "noise_strategy": plan_noise.strategy_digest(noise_strategy, sel.steps),
      "adaptive_clip_norm": None if clip.adaptive is None else repr(clip.adaptive),
      "batch_selection": plan_selection.selection_digest(sel.batch_selection),
      "clip_rule": clip_rule(clip),
  }
  checkpointer = checkpointing.RunCheckpointer(os.fspath(checkpoint_dir), fingerprint)
  if checkpoint_every is None:
    checkpoint_every = max(1, sel.steps // 10)
  return checkpointer, checkpoint_every


def clip_rule(clip: Any) -> dict:
  """The clipping rule a replay must share: flat or per layer, the group norms, microbatches, method.

  Two rules with the same sensitivity (flat C, or per-layer norms whose root sum of
  squares is C) release different updates from the same batch and noise, so a lost step
  replayed under the other rule would release a noise-free difference; the rule is part
  of the fingerprint (norms as ``repr`` strings: JSON has no ``inf``).
  """
  fn = clip.grad_fn
  return {"per_layer": bool(getattr(fn, "per_layer", False)),
          "l2_clip_norms": [repr(float(c)) for c in jax.tree.leaves(fn.l2_clip_norm)],
          "microbatch_size": getattr(fn, "microbatch_size", None),
          "method": getattr(fn, "method", None),
          "reduction": getattr(fn, "reduction", None)}


def _replay_is_bound(binding: dict | None, data_sha: str | None, params_sha: str | None) -> bool:
  """Whether lost steps may be replayed: the data (and starting params, for step 0) are the run's."""
  if binding is None or data_sha is None or binding.get("data") != data_sha:
    return False
  return params_sha is None or binding.get("params") == params_sha


class LedgerView(NamedTuple):
  """The run ledger as process 0 reads it, and its verdicts on this restart's data.

  Attributes:
    newest: the newest finalised checkpoint step (-1: none).
    paid: the steps paid.
    through: the largest step ever in a finalised checkpoint.
    bound: whether the ledger holds the replay binding (the first update's digests).
    replay_from_start: the binding is this restart's data AND starting parameters.
    replay_from_checkpoint: the binding is this restart's data.
  """

  newest: int
  paid: int
  through: int
  bound: bool
  replay_from_start: bool
  replay_from_checkpoint: bool


def ledger_view(ckpt: Any, data_sha: str | None, params_sha: str | None) -> LedgerView:
  """Reads the ledger on every process; returns process 0's :class:`LedgerView` on all."""
  binding = ckpt.replay_binding()
  newest = ckpt.latest_step()
  view = LedgerView(-1 if newest is None else newest, ckpt.steps_paid(),
                    ckpt.checkpointed_through(), binding is not None,
                    _replay_is_bound(binding, data_sha, params_sha),
                    _replay_is_bound(binding, data_sha, None))
  return LedgerView(*multihost.broadcast_from_coordinator(tuple(view)))


def restore(plan: Any, params: PyTree, *, step: int | None,
            data: Any) -> tuple[PyTree, PrivateState]:
  """:meth:`.PrivateSGD.restore` (its docstring has the rules)."""
  ckpt = plan._require_checkpointer("restore")  # pylint: disable=protected-access
  if plan._opened:  # pylint: disable=protected-access
    raise ValueError("restore must come before sampler(): the sampler starts at the restored "
                     "step.")
  fresh = plan.init(params)
  template = {"params": params, "opt_state": fresh.opt_state}
  params_sha = data_digest.digest(params)
  data_sha = None
  if data is not None:
    data_sha = data_digest.digest(tuple(data) if isinstance(data, (tuple, list)) else (data,))
  view = ledger_view(ckpt, data_sha, params_sha)
  run = plan._run  # pylint: disable=protected-access
  run["params_sha"] = params_sha
  run["bound"] = view.bound
  run.pop("replay_data", None)
  if view.newest < 0 and step is None:
    run["resume_step"] = 0
    if view.paid:
      # Paid steps but no checkpoint: replay them from the starting state only if no
      # checkpoint of them was ever written and data and parameters are the run's.
      if view.through > 0 or not view.replay_from_start:
        return skip_to_unpaid(plan, params, fresh, view.paid)
      run["replay_data"] = data_sha
      run["replay_until"] = view.paid
    return params, fresh
  tree = _restore_tree(ckpt, template, view.newest if step is None else step)
  state = PrivateState(tree["opt_state"])
  at = int(state.step)
  if at < view.through and view.paid > at:
    return skip_to_unpaid(plan, tree["params"], state, view.paid)
  if view.paid > at:
    if not view.replay_from_checkpoint:
      return skip_to_unpaid(plan, tree["params"], state, view.paid)
    run["replay_data"] = data_sha
    run["replay_until"] = view.paid
  run["resume_step"] = at
  state._known_step = at  # pylint: disable=protected-access
  return tree["params"], state


def _restore_tree(ckpt: Any, template: PyTree, step: int) -> PyTree:
  """The checkpoint of ``step``; another model's checkpoint is refused with a ValueError."""
  try:
    _, tree = ckpt.restore(template, step=step)
  except FileNotFoundError:
    raise
  except Exception as err:  # pylint: disable=broad-except  (Orbax/TensorStore errors)
    raise ValueError(
        f"the checkpoint in {ckpt.directory} does not match params (another model, parameter "
        f"shapes or dtypes, or optimiser): {type(err).__name__}. Pass the freshly initialised "
        "parameters of the model this run trains.") from None
  return tree


def skip_to_unpaid(plan: Any, params: PyTree, state: PrivateState,
                   paid: int) -> tuple[PyTree, PrivateState]:
  """State that continues at slot ``paid`` with a noise key no earlier step used."""
  if paid > plan.steps and not plan.allow_extra_steps:
    raise BudgetExceededError(
        f"all {plan.steps} planned steps were paid already ({paid}); restoring an older "
        "checkpoint cannot replay them. Pass allow_extra_steps=True to pay more steps.")
  if plan.noise_strategy is not None:
    raise ValueError(
        "restoring this correlated-noise run would continue it with fresh noise after steps "
        "that may have been released (an older checkpoint, a deleted newest one, or lost steps "
        "whose replay is not bound to the run's data: pass data= to restore): the strategy's "
        "later rows mix the noise of every earlier step, so the continuation is a second run "
        "of the matrix mechanism, which this plan has not paid. Restore the newest checkpoint "
        "with the run's data, or start a new run (new key, new checkpoint_dir) and pay for it.")
  gradient_key, count_key = plan._run_keys.resume_noise(paid)  # pylint: disable=protected-access
  noise = plan_noise.fresh_noise_state(state.opt_state[0], gradient_key, count_key, paid)
  state = PrivateState((noise,) + tuple(state.opt_state[1:]))
  state._known_step = paid  # pylint: disable=protected-access
  plan._run["resume_step"] = paid  # pylint: disable=protected-access
  return params, state


def bind_data(plan: Any, arrays: Any, step: int | None, checked_ids: tuple | None) -> tuple | None:
  """Binds the run's data to its ledger: recorded once, checked on a replay; returns the ids checked.

  The run's first update records the digest of its data (and of the
  parameters given to ``restore`` when the run starts at step 0). A run that
  replays its lost paid steps (``restore`` found its ``data=`` and
  ``params`` bound to the ledger) must gather those steps from data with
  the same digest, or the replayed updates would differ from the lost ones
  by a noise-free function of the data: refused before the update. Digests
  are computed where the arrays live (:mod:`.data_digest`), once per set of
  array objects (``checked_ids``: the ids of the arrays last checked), and
  only while something is to be recorded or checked.
  """
  ckpt, run = plan._checkpointer, plan._run  # pylint: disable=protected-access
  if ckpt is None:
    return checked_ids
  replay = run.get("replay_data")
  replaying = replay is not None and (step is None or step < run.get("replay_until", 0))
  if not replaying and run.get("bound"):
    return checked_ids
  ids = tuple(id(a) for a in jax.tree.leaves(arrays))
  if ids == checked_ids:
    return checked_ids
  sha = data_digest.digest(tuple(arrays))
  if replaying and sha != replay:
    raise ValueError(
        "these data differ from the data the run's lost steps were computed on (another order, "
        "subset or content; the digest restore(..., data=) was given): replaying those steps' "
        "batches and noise on them would release a noise-free difference. Gather the replayed "
        "steps from the same data, or restart and restore without data= (the run then "
        "continues at the first unpaid step with fresh keys).")
  params_sha = run.get("params_sha") if plan._resume_step == 0 else None  # pylint: disable=protected-access
  ckpt.record_replay_binding(sha, params_sha)
  run["bound"] = True
  return ids


__all__ = ["LedgerView", "bind_data", "ledger_view", "restore", "run_checkpointer",
           "skip_to_unpaid"]
