"""The paid sampler of a private plan: no batch exists before its step is spent on the accountant.

Spend before release: :class:`PaidSampler` spends each step's event (or, for
a correlated-noise run, the run's one event) on the user's
``PrivacyAccountant`` or ``PrivacyBudget`` BEFORE it hands out that step's
batch, never refunds it, and records it in the run's durable ledger first
when the run is checkpointed (:mod:`.checkpointing`). A budget that cannot
pay raises ``BudgetExceededError`` before any batch exists, so the ledger
holds every step whose output can be released.

With several processes (``jax.distributed``) process 0 alone spends (a
durable budget file is written by it only) and broadcasts whether it could
(:func:`_spend_once`); a step can only be computed with process 0 taking part
in its collectives, and process 0 joins only after its spend returned. Steps
released before the sampler opened (``start_step``, a restarted run) are
charged to an accountant that does not provably hold them
(:func:`charge_earlier_steps`). :func:`open_sampler` checks the arguments of
:meth:`.PrivateSGD.sampler` and opens the plan's one sampler.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

import jax
import numpy as np

from jaxdp import _validation
from jaxdp.accounting import events
from jaxdp.errors import BudgetExceededError
from jaxdp.dpsgd import multihost, plan_checkpoints, plan_selection
from jaxdp.dpsgd.batches import DeviceBatch, PoissonBatch


def _check_accountant(accountant: Any) -> None:
  if not hasattr(accountant, "spend"):
    raise TypeError("accountant must be a PrivacyAccountant or PrivacyBudget (anything with "
                    f"spend(event, count)), got {type(accountant).__name__}.")


def _ledger_holds(accountant: Any, event: events.DpEvent, count: int, ckpt: Any) -> bool:
  """Whether ``accountant`` provably holds ``count`` x ``event`` of this run already.

  True for the durable budget file the run's ledger says paid it, or a ledger
  with at least ``count`` entries of ``event`` (compared field by field).
  """
  path = getattr(accountant, "path", None)
  if ckpt is not None and path is not None and ckpt.budget_path() == os.path.abspath(path):
    return True
  inner = getattr(accountant, "accountant", accountant)  # PrivacyBudget -> its ledger
  if path is not None and hasattr(accountant, "_refresh"):
    accountant._refresh()  # pylint: disable=protected-access
    inner = accountant.accountant
  want = events.event_to_dict(event)
  held = sum(c for e, c in getattr(inner, "ledger", ()) if events.event_to_dict(e) == want)
  return held >= count


def _spend_once(accountant: Any, event: events.DpEvent, count: int) -> None:
  """Spends ``count`` x ``event`` once for the whole run, also with several processes.

  One process: ``accountant.spend``. Several (``jax.distributed``): process 0
  alone spends on its accountant (a durable ``PrivacyBudget`` file is written
  by it only, under its lock) and broadcasts whether it could; every process
  then raises ``BudgetExceededError`` together, or goes on together. The other
  processes mirror the spend on an in-memory ``PrivacyAccountant`` (so each
  process can report epsilon) but never on a budget. A step can only be
  computed with process 0 taking part in its collectives, and process 0 joins
  only after its spend returned: no step is released unpaid, also when some
  process dies.
  """
  if jax.process_count() == 1:
    accountant.spend(event, count=count)
    return
  from jaxdp.accounting.accountant import PrivacyAccountant  # pylint: disable=g-import-not-at-top
  error = None
  if multihost.is_coordinator():
    try:
      accountant.spend(event, count=count)
    except BudgetExceededError as err:
      error = err
  if not multihost.broadcast_from_coordinator(error is None):
    raise error if error is not None else BudgetExceededError(
        "process 0's accountant could not pay the step(s); nothing was spent.")
  if not multihost.is_coordinator() and isinstance(accountant, PrivacyAccountant):
    accountant.spend(event, count=count)


class PaidSampler:
  """Poisson batches that are paid for on the accountant before they exist.

  Made by :meth:`PrivateSGD.sampler`; see the module docstring.

  Attributes:
    accountant: the ``PrivacyAccountant`` / ``PrivacyBudget`` (anything with
      ``spend(event, count)``) the steps are spent on.
    steps_paid: steps spent on the accountant so far (by this sampler,
      including ``start_step``).
    steps_sampled: batches handed out so far (including ``start_step``).
  """

  def __init__(self, plan: Any, accountant: Any, start_step: int,
               steps_paid: int | None = None):
    _check_accountant(accountant)  # once: sampler() opens through here
    self._plan = plan
    self.accountant = accountant
    self.steps_paid = start_step if steps_paid is None else steps_paid
    if plan.noise_strategy is not None and self.steps_paid > 0:
      self.steps_paid = plan.steps  # a resumed correlated-noise run was paid as a whole
    self.steps_sampled = start_step
    self._batch_sampler = plan_selection.host_sampler(plan)  # the selection's host form
    self._keys = plan._run_keys.step_keys(plan.steps)  # pylint: disable=protected-access
    self._key_data: np.ndarray | None = None  # host copy of the step keys (device path)
    self._device: Any = None  # (data, update) of the device-resident path
    self._again: list[PoissonBatch] = []  # paid batches whose gather/step was refused
    self._handed: dict[int, PoissonBatch] = {}  # every batch handed out, by step
    self._closed = False  # replaced by a corrected sampler() before any update
    self._data_ids: tuple | None = None  # ids of the arrays whose digest was checked

  def _reopenable(self, accountant: Any) -> bool:
    """A corrected ``sampler()`` may replace this one: same accountant, no update applied yet."""
    used = any(t._used for t in self._handed.values())  # pylint: disable=protected-access
    return accountant is self.accountant and not used

  def _check_open(self) -> None:
    if self._closed:
      raise ValueError("this sampler was replaced by a newer plan.sampler(...) call; use that one.")

  def _bind_data(self, arrays: Any, step: int | None = None) -> None:
    """Binds the run's data to its ledger (``checkpoint_dir``): :func:`.plan_checkpoints.bind_data`."""
    self._data_ids = plan_checkpoints.bind_data(self._plan, arrays, step, self._data_ids)

  @property
  def device_resident(self) -> bool:
    """Whether batches are sampled inside the jitted step from device-resident data."""
    return self._device is not None

  def _hand_out_again(self, batch: PoissonBatch) -> None:
    if batch not in self._again:
      self._again.append(batch)

  @property
  def steps_remaining(self) -> int:
    """Planned steps not yet sampled (0 once T batches were handed out)."""
    return max(self._plan.steps - self.steps_sampled, 0)

  def pay(self, steps: int = 1) -> None:
    """Spends ``steps`` DP-SGD steps on the accountant now (before their batches exist).

    Raises:
      BudgetExceededError: the accountant (a ``PrivacyBudget``) cannot pay, or
        the plan's T steps would be exceeded without ``allow_extra_steps``;
        nothing is spent then.
    """
    steps = _validation.check_positive_int(steps, "steps")
    self._check_open()
    plan = self._plan
    if plan.noise_strategy is not None and self.steps_paid == 0 and steps <= plan.steps:
      # Correlated noise: the run is ONE mechanism (its sensitivity covers all n steps),
      # so its event is spent once, in full, before the first batch exists.
      try:
        _spend_once(self.accountant, plan.run_event(), 1)
      except BudgetExceededError as err:
        raise BudgetExceededError(
            f"the accountant cannot pay the correlated-noise run ({plan.steps} steps, "
            f"noise_multiplier={plan.noise_multiplier}); nothing was sampled or spent. ({err})"
        ) from err
      self.steps_paid = plan.steps
      if plan._checkpointer is not None:  # pylint: disable=protected-access
        plan._checkpointer.record_paid(plan.steps)  # pylint: disable=protected-access
      return
    if not plan.allow_extra_steps and self.steps_paid + steps > plan.steps:
      raise BudgetExceededError(
          f"paying {steps} more step(s) would exceed the {plan.steps} steps this plan was "
          f"calibrated for (paid so far: {self.steps_paid}); pass allow_extra_steps=True to "
          "make_private to run (and account) more. Nothing was spent.")
    try:
      _spend_once(self.accountant, plan.step_event(), steps)
    except BudgetExceededError as err:
      raise BudgetExceededError(
          f"the accountant cannot pay {steps} DP-SGD step(s) (q={plan.sample_rate}, "
          f"noise_multiplier={plan.noise_multiplier}); nothing was sampled or spent. ({err})"
      ) from err
    self.steps_paid += steps
    if plan._checkpointer is not None:  # pylint: disable=protected-access
      # Durable before any of these steps' batches exists (spend before release).
      plan._checkpointer.record_paid(self.steps_paid)  # pylint: disable=protected-access

  def _key(self, t: int) -> jax.Array:
    if t < self._plan.steps:
      return self._keys[t]
    return self._plan._run_keys.extra_step_key(t)  # pylint: disable=protected-access

  def sample(self) -> PoissonBatch:
    """The next step's Poisson batch (index chunks); pays one step first if none is prepaid.

    A paid batch whose ``gather`` or ``step`` was refused (and that was not
    used since) is handed out again, unpaid a second time, before any new one.
    """
    self._check_open()
    self._again = sorted((b for b in self._again if not b._used),  # pylint: disable=protected-access
                         key=lambda b: b.step_index)
    if self._again:
      ticket = self._again.pop(0)
      if self._device is not None:
        return DeviceBatch(ticket, self._step_key_data(ticket.step_index))
      return ticket
    if self.steps_sampled >= self.steps_paid:
      self.pay(1)
    t = self.steps_sampled
    if self._device is not None:
      ticket = PoissonBatch(self._plan, t, [], self)
      self.steps_sampled += 1
      self._handed[t] = ticket
      return DeviceBatch(ticket, self._step_key_data(t))
    cyclic = self._plan._participation is not None  # pylint: disable=protected-access
    chunks = (self._batch_sampler.sample(t, self._key(t)) if cyclic
              else self._batch_sampler.sample(self._key(t)))
    self.steps_sampled += 1
    ticket = PoissonBatch(self._plan, t, chunks, self)
    self._handed[t] = ticket
    return ticket

  def _hand_out_step_first(self, step: int) -> bool:
    """Queues the unused batch of ``step`` (handed out earlier) to be handed out next."""
    ticket = self._handed.get(step)
    if ticket is None or ticket._used:  # pylint: disable=protected-access
      return False
    self._hand_out_again(ticket)
    return True

  def _step_key_data(self, t: int) -> np.ndarray:
    if t < self._plan.steps:
      if self._key_data is None:
        self._key_data = np.asarray(jax.random.key_data(self._keys))
      return self._key_data[t]
    return np.asarray(jax.random.key_data(self._key(t)))

  def epsilon(self, delta: float | None = None) -> float:
    """Epsilon of the DP-SGD steps paid so far (at the plan's ``delta`` by default).

    By the plan's ``accountant_method`` (the calibration's); :meth:`guarantee`
    returns it with the method named.
    """
    return self._plan.epsilon(self.steps_paid, delta)

  def guarantee(self, delta: float | None = None) -> Any:
    """:meth:`epsilon` as a ``PrivacyGuarantee`` naming its method, relation and unit."""
    return self._plan.guarantee(self.steps_paid, delta)



def open_sampler(plan: Any, accountant: Any, *, start_step: int | None, data: Any,
                 mesh: Any) -> PaidSampler:
  """:meth:`.PrivateSGD.sampler` (its docstring has the arguments): checks them, opens the sampler.

  One plan is one run: a second sampler is refused unless it replaces the
  first before any update with the same accountant. The steps released
  before this sampler (``start_step``, or the durable ledger of a restored
  run, as process 0 reads it) are charged unless the accountant holds them.
  """
  if mesh is not None and data is None:
    raise ValueError("mesh needs data=: the device-resident path shards the data over it.")
  if mesh is not None and not isinstance(mesh, jax.sharding.Mesh):
    raise TypeError(f"mesh must be a jax.sharding.Mesh with axis 'data' (make_data_mesh, "
                    f"multihost.global_mesh), got {type(mesh).__name__}.")
  ckpt = plan._checkpointer  # pylint: disable=protected-access
  if start_step is None:
    start = plan._resume_step if ckpt is not None else 0  # pylint: disable=protected-access
  else:
    if ckpt is not None:
      raise ValueError("start_step cannot be combined with checkpoint_dir: the position comes "
                       "from restore() and the run's durable ledger.")
    start = int(start_step) if not isinstance(start_step, bool) else -1
  if start < 0 or (start > plan.steps and not plan.allow_extra_steps):
    raise ValueError(f"start_step must be in [0, steps={plan.steps}], got {start_step!r}.")
  earlier = start  # steps released before this sampler: the durable ledger's, or start_step's
  if ckpt is not None:
    paid = ckpt.steps_paid()
    unrestored = "resume_step" not in plan._run and (  # pylint: disable=protected-access
        paid > 0 or ckpt.latest_step() is not None)
    paid, unrestored = multihost.broadcast_from_coordinator((paid, unrestored))  # process 0 decides
    if unrestored:
      raise ValueError(f"checkpoint_dir {ckpt.directory} holds this run's steps "
                       f"({paid} paid): call restore(params) before sampler(); it "
                       "returns the parameters and state to continue from.")
    earlier = max(start, paid)
  previous = plan._opened[-1] if plan._opened else None  # pylint: disable=protected-access
  if previous is not None:
    earlier = max(earlier, previous.steps_paid)
  sampler = PaidSampler(plan, accountant, start, earlier)  # checks the accountant
  if previous is not None and not previous._reopenable(accountant):  # pylint: disable=protected-access
    raise ValueError("this plan already opened its sampler: one plan is one training run (a "
                     "second sampler would reuse its sampling and noise keys). A corrected "
                     "sampler(...) call may replace the first only before any update was "
                     "applied and with the same accountant. Call make_private again with a "
                     "fresh key for another run.")
  if jax.process_count() > 1:
    _check_same_plan_on_every_process(plan)
  if data is not None:
    sampler._device = plan._device_path(data, mesh)  # pylint: disable=protected-access
    if ckpt is not None:
      sampler._bind_data(data)  # pylint: disable=protected-access
  if ckpt is not None:
    ckpt.record_budget_path(getattr(accountant, "path", None))
  if earlier and previous is None:
    charge_earlier_steps(plan, accountant, earlier)
  if previous is not None:
    previous._closed = True  # pylint: disable=protected-access
  plan._opened.append(sampler)  # pylint: disable=protected-access
  return sampler


def _paid_event_and_count(plan: Any, steps: int) -> tuple[events.DpEvent, int]:
  """What ``steps`` released steps of ``plan`` cost: the run's event once (correlated), or T x step."""
  if plan.noise_strategy is not None:
    return plan.run_event(), 1
  return plan.step_event(), steps


def charge_earlier_steps(plan: Any, accountant: Any, steps: int) -> None:
  """Charges the ``steps`` released before this sampler unless ``accountant`` provably holds them.

  A run's ledger must hold every step it released, however it was resumed
  (``start_step``, a restart on ``checkpoint_dir``). The accountant holds
  them when it is the durable ``PrivacyBudget`` file that paid the run
  (recorded in the run's ledger), or when its ledger already has at least
  that many of this run's events; otherwise they are charged to it now,
  before any batch exists. With several processes, process 0's accountant
  decides for all (the charge is collective).
  """
  event, count = _paid_event_and_count(plan, steps)
  holds = multihost.is_coordinator() and _ledger_holds(accountant, event, count,
                                                       plan._checkpointer)  # pylint: disable=protected-access
  if not multihost.broadcast_from_coordinator(holds):
    try:
      _spend_once(accountant, event, count)
    except BudgetExceededError as err:
      raise BudgetExceededError(
          f"the accountant does not hold the {steps} step(s) this run released before the "
          f"sampler was opened (start_step or the checkpoint ledger), and cannot pay them; "
          f"nothing was sampled. ({err})") from err


def _check_same_plan_on_every_process(plan: Any) -> None:
  """Every process must run the same plan: same keys, sigma, q, S, T, N, P (one all-gather)."""
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  digest = hashlib.sha256()
  for part in (jax.random.key_data(plan._sample_key), jax.random.key_data(plan._noise_key)):  # pylint: disable=protected-access
    digest.update(np.asarray(part).tobytes())
  digest.update(repr((plan.noise_multiplier, plan.sample_rate, plan.sensitivity, plan.steps,
                      plan.num_examples, plan.padded_size, plan.unit,
                      plan.neighbouring, plan.min_separation,
                      plan.gradient_noise_multiplier,
                      plan_selection.selection_digest(plan.batch_selection))).encode())
  if plan.noise_strategy is not None:  # the correlated noise must be the same C everywhere
    digest.update(np.asarray(plan.noise_strategy.fingerprint(plan.steps)).tobytes())
  words = np.frombuffer(digest.digest(), np.int32)  # exact in any dtype setting
  every = np.asarray(multihost_utils.process_allgather(words))
  if not (every == every[0]).all():
    raise ValueError(
        "the processes of this job made different plans (key, noise multiplier, sample rate, "
        "clip norm, steps or N differ): every process must call make_private with the same "
        "arguments and key, or it would add noise its peers and the accountant do not assume.")


__all__ = ["PaidSampler", "charge_earlier_steps", "open_sampler"]
