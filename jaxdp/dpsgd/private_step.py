"""``make_private``: the pieces of a custom DP-SGD loop, wired once, in one place.

DP-SGD (survey ``004_dp_machine_learning_survey.md`` Section 4.2 Algorithm 1;
paper ``000_tradeoffs_of_private_prediction.md`` Section 3.1 Equation 4)
releases, at each of T steps,

  theta_{t+1} = opt( ( sum_{n in B_t} clip(g_n) + N(0, sigma^2 S^2 I) ) / (q N) ),

with B_t a POISSON sample (each of the N examples independently with
probability q), S the L2 sensitivity of the clipped sum (the clip norm), and
sigma the noise multiplier. Its guarantee is the T-fold composition of the
Poisson-subsampled Gaussian mechanism (Abadi et al. 2016; Mironov, Talwar &
Zhang 2019), computed in float64 by :mod:`jaxdp.accounting.dpsgd_accounting`
for add/remove neighbours.

The guarantee only holds when five numbers agree: the q the sampler uses, the
q the accountant is told, the divisor ``q N``, the S the noise is scaled by
(the clip norm actually applied), and the number of steps paid for. Written by
hand they drift apart (a padded batch summed without its mask, a fixed-size
shuffled batch accounted as Poisson, noise calibrated to the sum but added to
the mean, more steps run than calibrated). :func:`make_private` derives all of
them from one set of arguments and returns a :class:`PrivateSGD` whose pieces
can only be used together:

* :meth:`PrivateSGD.sampler` -> :class:`PaidSampler`: the ONLY source of
  batches. It owns the Poisson sampler (rate q, static padded chunks of size
  P, overflow split into extra chunks, never truncated) and the sampling keys,
  and it spends each step's event ``PoissonSampled(q, Gaussian(sigma))``
  (add/remove, per ``unit``) on the user's ``PrivacyAccountant`` or
  ``PrivacyBudget`` BEFORE it hands out that step's batch (spend before
  release, never refunded). ``pay(k)`` prepays k steps at once (one budget
  check per epoch); a budget that cannot pay raises ``BudgetExceededError``
  before any batch exists. Steps beyond the planned T raise unless
  ``allow_extra_steps=True`` (then they are paid and accounted like the others).
* :class:`PrivateBatch` (from ``sampler.sample().gather(x, y)``): the padded
  chunks with their masks, tagged with the plan and the step index.
* :meth:`PrivateSGD.step`: ``(params, state, batch) -> (params, state, info)``.
  It refuses anything but a :class:`PrivateBatch` of its own plan (a raw
  ``(x, y)`` batch has no mask and no paid step), refuses a batch twice and a
  batch whose step index differs from the state's (an old state would reuse a
  noise key). Inside one jit-compiled function it sums the clipped gradients
  of all chunks (gradient accumulation, exact for an overflowing batch), adds
  ``N(0, (sigma S)^2 I)`` once to the SUM, divides by ``q N`` and applies the
  optax optimiser (:func:`.transforms.noisy_aggregate`).
* :meth:`PrivateSGD.epsilon` and :meth:`PaidSampler.epsilon`: epsilon of the
  steps paid so far, ``dpsgd_epsilon(sigma, q, t, delta, accountant_method)``,
  by the method sigma was calibrated with; ``guarantee()`` returns it as a
  ``PrivacyGuarantee`` that names the method. The accountant's ledger holds
  the same t steps (one merged entry ``t x PoissonSampled``), and
  ``accountant.get_epsilon(delta, accountant_method)`` gives the same number
  (its default ``"auto"`` is the smallest of all sound bounds, possibly smaller).

Device-resident data: ``sampler(accountant, data=(x, y), mesh=None)`` places the
dataset on the device(s) once; ``sample()`` then pays and hands out a
:class:`DeviceBatch` (the step's key only) and ``step`` samples, gathers,
clips, noises and updates in ONE jit-compiled call, with the same batches as
the host path (:mod:`.device_sampling`); with a mesh spanning several
processes this is multi-host DP-SGD (:mod:`.multihost`), paid once per step by
process 0. Checkpoints: ``make_private(..., checkpoint_dir=)`` with
:meth:`PrivateSGD.restore` resumes a killed run bit-identically, each step paid
once (:mod:`.checkpointing`).

Inputs: ``gather`` and ``step`` check the data and the model before any
gradient (the checks :func:`.train.train_dpsgd` runs, shared in ``_inputs``);
a refused call consumes nothing, and the next ``sampler.sample()`` hands out
the same paid batch again, so the ledger keeps exactly one paid step per
applied update. :meth:`PrivateSGD.check_inputs` runs them on the whole
dataset before anything is paid.

Randomness: ``key`` is split exactly as :func:`.train.train_dpsgd` splits it
(:mod:`.keys`: disjoint ``split`` branches for the step keys, the keys of extra
steps, the cyclic groups, the gradient and count noise and a resumed run's
noise), so the same key gives the same run as the built-in loop. The noise key lives in the optimiser state and is split every step.
One plan is one training run: it opens one sampler (a second raises; make a
new plan with a fresh key for another run).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
import os
import warnings
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxdp import _validation
from jaxdp.accounting import dpsgd_accounting
from jaxdp.accounting import events
from jaxdp.errors import BudgetExceededError
from jaxdp.dpsgd import (_inputs, adaptive_clipping, checkpointing, clipping, data_digest,
                         device_sampling, multihost, sampling, transforms)
from jaxdp.dpsgd import fixed_size_sampling, user_sampling
from jaxdp.dpsgd import keys as keys_lib

PyTree = Any

# Every key of a run comes from disjoint split branches of its one key (:mod:`.keys`).


def _mf_accounting():
  """:mod:`jaxdp.dpsgd.correlated.accounting` (imported late: that package builds on this one)."""
  from jaxdp.dpsgd.correlated import accounting  # pylint: disable=g-import-not-at-top
  return accounting


class _PrivateStateFields(NamedTuple):
  opt_state: Any


class PrivateState(_PrivateStateFields):
  """State of a :class:`PrivateSGD` run: the optax state of ``PrivateSGD.optimizer``.

  ``opt_state[0]`` is the :class:`~.transforms.NoisyAggregateState` (the
  noise key, split every step, and the count of noisy updates applied).
  A pytree (save it with :meth:`PrivateSGD.save` or any checkpointer). The
  states :meth:`PrivateSGD.step` returns also remember their step count on
  the host, so the step check needs no device round trip.
  """

  @property
  def step(self) -> jax.Array:
    """Number of noisy updates applied so far (int32 scalar on device)."""
    return self.opt_state[0].count

  def _host_step(self) -> int:
    """The step count without a device sync when this state came from ``step``."""
    known = self.__dict__.get("_known_step")
    return int(self.step) if known is None else known


@dataclasses.dataclass(frozen=True)
class StepInfo:
  """NON-PRIVATE diagnostics of one step (never publish them unaccounted).

  They depend on individual examples: the realised batch size differs between
  add/remove neighbours, and the loss sum and clip count are unnoised sums over
  the batch. Their names say so (``nonprivate_*``, the library's rule for every
  value computed from private data without noise).

  Attributes:
    nonprivate_loss_sum: sum of the per-example losses of the batch (before the update).
    nonprivate_num_examples: realised Poisson batch size.
    nonprivate_num_clipped: examples whose gradient was scaled down.
  """

  nonprivate_loss_sum: jax.Array
  nonprivate_num_examples: jax.Array
  nonprivate_num_clipped: jax.Array


jax.tree_util.register_dataclass(
    StepInfo,
    data_fields=["nonprivate_loss_sum", "nonprivate_num_examples", "nonprivate_num_clipped"],
    meta_fields=[])


class PoissonBatch:
  """The index chunks of one paid Poisson batch (host side); see :meth:`gather`.

  A batch is consumed only by a successful :meth:`PrivateSGD.step`. A
  :meth:`gather` or ``step`` that refuses its inputs leaves it usable: gather it
  again (or call ``sampler.sample()``, which hands the same paid batch out
  again), so a failed call never wastes a paid step.

  Attributes:
    step_index: the step this batch was paid for (0-based).
    chunks: list of :class:`~.sampling.PaddedBatch` of size P (more than one
      only when the batch overflowed P, or with a small ``physical_batch_size``).
  """

  def __init__(self, plan: "PrivateSGD", step_index: int, chunks: list[sampling.PaddedBatch],
               sampler: "PaidSampler | None" = None):
    self._plan = plan
    self._sampler = sampler
    self.step_index = step_index
    self.chunks = chunks
    self._used = False

  @property
  def num_examples(self) -> int:
    """Realised batch size (NON-PRIVATE: do not publish it)."""
    return int(sum(c.num_examples for c in self.chunks))

  def _kept(self) -> str:
    return (f" Nothing was spent by this call: the paid batch of step {self.step_index} is kept "
            "for a corrected call (sampler.sample() hands it out again).")

  def _refused(self) -> None:
    """Marks the batch for reuse after a refused gather/step (the next sample() returns it)."""
    if self._sampler is not None and not self._used:
      self._sampler._hand_out_again(self)  # pylint: disable=protected-access

  def gather(self, *arrays: Any) -> "PrivateBatch":
    """The batch's examples of ``arrays`` (dataset on the leading axis), stacked per chunk.

    One argument per batch argument of the per-example loss (``batch_argnums``),
    e.g. ``gather(x, y)``. Every array must be real numeric data with exactly
    ``num_examples`` rows (the N that q and ``q N`` were computed from), finite
    in the sampled rows, and integer labels for a loss made by
    :func:`~.train.make_per_example_loss` (the checks of
    :func:`~.train.train_dpsgd`, shared in ``_inputs``). A refused call leaves
    the batch usable (class docstring).
    """
    try:
      return self._gather(arrays)
    except (TypeError, ValueError):
      self._refused()
      raise

  def _gather(self, arrays: tuple) -> "PrivateBatch":
    plan = self._plan
    kept = self._kept()
    if len(arrays) != len(plan.batch_argnums):
      raise ValueError(f"gather needs {len(plan.batch_argnums)} arrays (one per batch argument "
                       f"of the loss, batch_argnums={plan.batch_argnums}), got {len(arrays)}."
                       + kept)
    names = tuple(f"gather argument {i}" for i in range(len(arrays)))
    label = plan._label_position()  # pylint: disable=protected-access
    if label is not None:
      _inputs.check_label_dtype(arrays[label], names[label] + " (labels)", kept)
      _inputs.check_label_shape(arrays[label], names[label] + " (labels)", kept)
    slots = [c.slots_and_mask() for c in self.chunks]
    idx = np.stack([i for i, _ in slots])  # (K, P)
    mask = np.stack([m for _, m in slots])  # (K, P)
    # Index where the data lives (host numpy or device), then move only the batch.
    taken = _inputs.check_examples(arrays, names, plan.num_examples, take=idx, where=kept)
    if self._sampler is not None:
      try:
        self._sampler._bind_data(arrays, self.step_index)  # pylint: disable=protected-access
      except ValueError as err:
        raise ValueError(f"{err}{kept}") from None
    host_labels = taken[label] if label is not None else None
    taken = jax.tree.map(jnp.asarray, taken)
    return PrivateBatch(self, sampling.MaskedBatch(taken, jnp.asarray(mask)), host_labels)


class PrivateBatch:
  """A gathered :class:`PoissonBatch`: stacked chunks ``(K, P, ...)`` with their ``(K, P)`` mask.

  The only batch type :meth:`PrivateSGD.step` accepts; usable once.
  """

  def __init__(self, ticket: PoissonBatch, masked: sampling.MaskedBatch, host_labels: Any = None):
    self._ticket = ticket
    self.masked = masked
    self._host_labels = host_labels

  @property
  def step_index(self) -> int:
    return self._ticket.step_index

  @property
  def num_chunks(self) -> int:
    return int(self.masked.mask.shape[0])


class DeviceBatch(PrivateBatch):
  """A paid step of a sampler with device-resident data (``sampler(..., data=)``).

  Holds only the step's sampling key: the Poisson batch is drawn, gathered
  and padded inside the jit-compiled :meth:`PrivateSGD.step`
  (:mod:`.device_sampling`). Usable once, like :class:`PrivateBatch`.
  """

  def __init__(self, ticket: "PoissonBatch", step_key_data: np.ndarray):
    super().__init__(ticket, None, None)
    self._step_key_data = step_key_data

  @property
  def num_chunks(self) -> int:
    raise AttributeError("a DeviceBatch is sampled inside the step; it has no host chunks.")

  def gather(self, *arrays: Any) -> "DeviceBatch":
    """Refused: a device-resident sampler already holds the data (nothing is consumed)."""
    del arrays
    raise TypeError(
        "a DeviceBatch needs no gather: the sampler holds the data (sampler(accountant, "
        "data=...)) and PrivateSGD.step samples and gathers inside the jitted update. Pass the "
        f"batch to step as it is. Nothing was spent: the paid batch of step {self.step_index} "
        "is still usable.")


def _fresh_noise_state(noise: Any, gradient_key: jax.Array, count_key: jax.Array,
                       paid: int) -> Any:
  """The noise state at slot ``paid`` with keys no earlier step used (:meth:`PrivateSGD.restore`)."""
  if isinstance(noise, adaptive_clipping.AdaptiveClipState):
    inner = _fresh_noise_state(noise.inner, gradient_key, count_key, paid)
    return noise._replace(inner=inner, key=count_key,
                          count=jnp.asarray(paid, noise.count.dtype))
  return noise._replace(key=gradient_key, count=jnp.asarray(paid, noise.count.dtype))


def _check_batch_selection(selection: Any, n: int, *, relation: str, accountant_method: str,
                           unit: str, given: dict) -> tuple[float, str]:
  """Checks a ``batch_selection`` sampler against the plan; returns ``(rate, unit)``.

  * :class:`~.fixed_size_sampling.FixedSizeSampler` (B of N without
    replacement): replace-one neighbours by RDP (Wang, Balle & Kasiviswanathan
    2019, the only analysis dp_accounting has for this event); the rate
    reported is ``B / N``.
  * :class:`~.user_sampling.UserPoissonSampler`: Poisson sampling of users,
    one clipped contribution per user; the privacy unit is ``"user"`` (the
    default unit becomes ``"user"``; another explicit unit is refused).

  Both fix the batch size themselves (no ``sample_rate`` /
  ``expected_batch_size``). Correlated noise, adaptive clip norms, per-layer
  clipping and microbatches are refused with them: jaxdp has no analysis of
  those combinations (the amplified matrix-mechanism and Andrew et al.
  bounds are proven for Poisson sampling of examples under add/remove).
  """
  fixed = isinstance(selection, fixed_size_sampling.FixedSizeSampler)
  if not fixed and not isinstance(selection, user_sampling.UserPoissonSampler):
    raise TypeError("batch_selection must be a FixedSizeSampler or a UserPoissonSampler (None: "
                    f"Poisson sampling at sample_rate), got {type(selection).__name__}.")
  name = type(selection).__name__
  for arg in ("sample_rate", "expected_batch_size"):
    if given[arg] is not None:
      raise ValueError(f"{arg} is fixed by batch_selection={name}; leave it out.")
  for arg, off in (("noise_strategy", None), ("min_separation", None), ("per_layer", False),
                   ("microbatch_size", None), ("adaptive", False)):
    if given[arg] != off:
      what = "an adaptive l2_clip_norm" if arg == "adaptive" else f"{arg}={given[arg]!r}"
      raise ValueError(f"{what} is not available with batch_selection={name}: no analysis of "
                       "that combination is implemented (the correlated-noise and adaptive-"
                       "clipping guarantees used here assume Poisson sampling of examples).")
  if selection.num_examples != n:
    raise ValueError(f"batch_selection was built for {selection.num_examples} examples but "
                     f"num_examples={n}.")
  if fixed:
    if relation != events.REPLACE_ONE:
      raise ValueError("batch_selection=FixedSizeSampler needs neighbouring='replace_one': a "
                       "fixed-size batch reveals nothing about N only under replace-one, and the "
                       "subsampling-without-replacement bound is proven for it.")
    dpsgd_accounting.check_fixed_size_accountant(accountant_method)
    return selection.sample_rate, unit
  if unit not in (events.DEFAULT_UNIT, user_sampling.USER_UNIT):
    raise ValueError(f"batch_selection=UserPoissonSampler protects one user: unit must be "
                     f"{user_sampling.USER_UNIT!r}, got {unit!r}.")
  return selection.sample_rate, user_sampling.USER_UNIT


def _fixed_size_noise_multiplier(selection: Any, target_epsilon: Any, noise_multiplier: Any,
                                 delta: Any, steps: int) -> float:
  """sigma for a fixed-size plan: given, or calibrated by RDP to (target_epsilon, delta)."""
  return dpsgd_accounting.resolve_with(
      target_epsilon, noise_multiplier, delta,
      lambda eps, d: selection.calibrate_noise_multiplier(eps, d, steps))


def _noise_transform(strategy: Any, adaptive: Any, *, sigma: float, grad_sigma: float,
                     sensitivity: float, expected: float, steps: int, min_separation: int,
                     sample_rate: float, grad_key: jax.Array, count_key: Any,
                     count_sigma: Any) -> optax.GradientTransformation:
  """The plan's noise: independent or correlated, wrapped by adaptive clipping's count noise.

  With an adaptive clip norm the wrapper BUILDS the gradient noise from the total
  sigma (Andrew et al. 2021 Thm 1: ``sigma_Delta`` leaves room for the count
  noise; for the unamplified matrix mechanism with k participations and run
  sensitivity ratio r, :func:`~.adaptive_clipping.gradient_noise_multiplier`),
  so the counts can never go unpaid.
  """
  from jaxdp.dpsgd import correlated  # pylint: disable=g-import-not-at-top

  def inner(noise_multiplier: float, s: float = sensitivity):
    if strategy is None:
      return transforms.noisy_aggregate(noise_multiplier, s, expected, grad_key)
    return correlated.correlated_noise(strategy, steps, noise_multiplier, s, expected, grad_key)

  if adaptive is None:
    return inner(grad_sigma)
  k, r = 1, 1.0
  if strategy is not None and correlated.accounting.analysis(
      strategy, min_separation, sample_rate) == correlated.accounting.DETERMINISTIC:
    k = correlated.max_participations(steps, min_separation)
    r = correlated.accounting.run_sensitivity(strategy, steps, min_separation)
  return adaptive_clipping.adaptive_clip_noise(
      lambda s: inner(s, 1.0), adaptive, noise_multiplier=sigma, expected_batch_size=expected,
      key=count_key, count_noise_multiplier=count_sigma, participations=k, sensitivity_ratio=r)


def _strategy_digest(strategy: Any, steps: int) -> str | None:
  """SHA-256 of a correlated-noise strategy (its class and its T x T coefficients), or None."""
  if strategy is None:
    return None
  h = hashlib.sha256(type(strategy).__name__.encode())
  h.update(np.asarray(strategy.fingerprint(steps), np.float64).tobytes())
  return h.hexdigest()


def _selection_digest(selection: Any) -> str | None:
  """What fixes a batch_selection sampler's batches: its parameters and (users) its user table."""
  if selection is None:
    return None
  h = hashlib.sha256(repr(selection).encode())
  if isinstance(selection, user_sampling.UserPoissonSampler):
    h.update(data_digest.digest(np.asarray(selection._rows)).encode())  # pylint: disable=protected-access
  return h.hexdigest()


def _check_accountant(accountant: Any) -> None:
  if not hasattr(accountant, "spend"):
    raise TypeError("accountant must be a PrivacyAccountant or PrivacyBudget (anything with "
                    f"spend(event, count)), got {type(accountant).__name__}.")


def _replay_is_bound(binding: dict | None, data_sha: str | None, params_sha: str | None) -> bool:
  """Whether lost steps may be replayed: the data (and starting params, for step 0) are the run's."""
  if binding is None or data_sha is None or binding.get("data") != data_sha:
    return False
  return params_sha is None or binding.get("params") == params_sha


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


class _DevicePath(NamedTuple):
  data: tuple
  update: Callable[..., Any]
  replicated: Any  # NamedSharding for params/state on the mesh, or None
  host_labels: Any  # this process's labels, for the first step's range check


def _local_rows(a: jax.Array) -> np.ndarray:
  """This process's rows of a global array sharded along its leading axis (host copy)."""
  shards = sorted(a.addressable_shards, key=lambda sh: sh.index[0].start or 0)
  seen, parts = set(), []
  for sh in shards:
    start = sh.index[0].start or 0
    if start not in seen:
      seen.add(start)
      parts.append(np.asarray(sh.data))
  return np.concatenate(parts)


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

  def __init__(self, plan: "PrivateSGD", accountant: Any, start_step: int,
               steps_paid: int | None = None):
    _check_accountant(accountant)
    self._plan = plan
    self.accountant = accountant
    self.steps_paid = start_step if steps_paid is None else steps_paid
    if plan.noise_strategy is not None and self.steps_paid > 0:
      self.steps_paid = plan.steps  # a resumed correlated-noise run was paid as a whole
    self.steps_sampled = start_step
    if plan.noise_strategy is not None:
      self._poisson = plan._participation  # pylint: disable=protected-access
    elif plan.batch_selection is not None:
      self._poisson = plan.batch_selection
    else:
      self._poisson = sampling.PoissonSampler(plan.num_examples, plan.sample_rate,
                                              padded_size=plan.padded_size, on_overflow="split")
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
    """Binds the run's data to its ledger (``checkpoint_dir``): recorded once, checked on a replay.

    The run's first update records the digest of its data (and of the
    parameters given to ``restore`` when the run starts at step 0). A run that
    replays its lost paid steps (``restore`` found its ``data=`` and
    ``params`` bound to the ledger) must gather those steps from data with
    the same digest, or the replayed updates would differ from the lost ones
    by a noise-free function of the data: refused before the update. Digests
    are computed where the arrays live (:mod:`.data_digest`), once per set of
    array objects, and only while something is to be recorded or checked.
    """
    plan = self._plan
    ckpt = plan._checkpointer  # pylint: disable=protected-access
    if ckpt is None:
      return
    replay = plan._run.get("replay_data")  # pylint: disable=protected-access
    replaying = replay is not None and (step is None or step < plan._run.get("replay_until", 0))  # pylint: disable=protected-access
    if not replaying and plan._run.get("bound"):  # pylint: disable=protected-access
      return
    ids = tuple(id(a) for a in jax.tree.leaves(arrays))
    if ids == self._data_ids:
      return
    sha = data_digest.digest(tuple(arrays))
    if replaying and sha != replay:
      raise ValueError(
          "these data differ from the data the run's lost steps were computed on (another order, "
          "subset or content; the digest restore(..., data=) was given): replaying those steps' "
          "batches and noise on them would release a noise-free difference. Gather the replayed "
          "steps from the same data, or restart and restore without data= (the run then "
          "continues at the first unpaid step with fresh keys).")
    params_sha = plan._run.get("params_sha") if plan._resume_step == 0 else None  # pylint: disable=protected-access
    ckpt.record_replay_binding(sha, params_sha)
    plan._run["bound"] = True  # pylint: disable=protected-access
    self._data_ids = ids

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
    chunks = (self._poisson.sample(t, self._key(t)) if self._plan.noise_strategy is not None
              else self._poisson.sample(self._key(t)))
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


@dataclasses.dataclass(frozen=True, eq=False)
class PrivateSGD:
  """Everything a custom DP-SGD loop needs, from one place (see :func:`make_private`).

  Attributes:
    noise_multiplier: sigma (noise std on the clipped SUM is ``sigma * sensitivity``).
    sample_rate: Poisson rate q.
    num_examples: dataset size N.
    expected_batch_size: ``q N``, the divisor of the noisy sum.
    steps: planned number of steps T.
    sensitivity: L2 sensitivity S of the clipped sum.
    padded_size: static chunk size P.
    delta: the delta epsilon is reported at (None when only a noise
      multiplier was given without delta).
    target_epsilon: the calibration target (None when sigma was given).
    noise_stddev: ``sigma * S`` (with correlated noise, the std ``sigma S s_1`` of
      ``z``; with an adaptive clip norm, in units of the current clip norm C_t).
    optimizer: the optax transform ``chain(noisy_aggregate(sigma, S, q N, noise_key), base)``
      (expects the clipped SUM; :meth:`step` feeds it).
    base_optimizer: the optax optimiser applied to the private average.
    clipped_grad_fn: the :func:`~.clipping.clipped_grad` function (``.sensitivity``).
    batch_argnums: batch arguments of the per-example loss.
    accountant_method: ``"rdp"`` or ``"pld"``.
    unit: the privacy unit of the events.
    allow_extra_steps: whether steps beyond T may be paid.
    neighbouring: ``"add_remove"`` or ``"replace_one"``: the relation of the events and epsilon.
    noise_strategy: the correlated-noise strategy (``make_private(noise_strategy=)``), or None.
    min_separation: b, the cyclic groups of a correlated-noise plan (1 for DP-SGD).
    adaptive_clip_norm: the :class:`~.adaptive_clipping.AdaptiveClipNorm`, or None.
    gradient_noise_multiplier: the multiplier of the gradient noise: ``noise_multiplier``,
      or with an adaptive clip norm the sigma_Delta that leaves room for the count noise
      (Andrew et al. 2021 Thm 1), so that both together cost ``noise_multiplier``.
  """

  noise_multiplier: float
  sample_rate: float
  num_examples: int
  expected_batch_size: float
  steps: int
  sensitivity: float
  padded_size: int
  delta: float | None
  target_epsilon: float | None
  noise_stddev: float
  optimizer: optax.GradientTransformation = dataclasses.field(repr=False)
  base_optimizer: optax.GradientTransformation = dataclasses.field(repr=False)
  clipped_grad_fn: clipping.ClippedGradFn
  batch_argnums: tuple[int, ...]
  accountant_method: str
  unit: str
  allow_extra_steps: bool
  _sample_key: jax.Array = dataclasses.field(repr=False)
  _update: Callable[..., Any] = dataclasses.field(repr=False)
  _opened: list = dataclasses.field(repr=False)
  per_example_loss: Callable[..., Any] = dataclasses.field(default=None, repr=False)
  _checked: dict = dataclasses.field(default_factory=dict, repr=False)
  neighbouring: str = events.ADD_REMOVE
  _checkpointer: Any = dataclasses.field(default=None, repr=False)
  _checkpoint_every: int | None = dataclasses.field(default=None, repr=False)
  _run: dict = dataclasses.field(default_factory=dict, repr=False)
  _physical_batch_size: int | None = dataclasses.field(default=None, repr=False)
  _overflow_prob: float = dataclasses.field(default=1e-9, repr=False)
  _noise_key: Any = dataclasses.field(default=None, repr=False)
  noise_strategy: Any = None
  min_separation: int = 1
  adaptive_clip_norm: Any = None
  gradient_noise_multiplier: float | None = None
  _participation: Any = dataclasses.field(default=None, repr=False)
  _run_keys: Any = dataclasses.field(default=None, repr=False)
  batch_selection: Any = None

  @property
  def _resume_step(self) -> int:
    return int(self._run.get("resume_step", 0))

  @property
  def checkpoint_dir(self) -> str | None:
    """The run's checkpoint directory (``make_private(checkpoint_dir=)``), or None."""
    return None if self._checkpointer is None else self._checkpointer.directory

  def _require_checkpointer(self, what: str):
    if self._checkpointer is None:
      raise ValueError(f"{what} needs make_private(..., checkpoint_dir=...).")
    return self._checkpointer

  def restore(self, params: PyTree, *, step: int | None = None,
              data: Any = None) -> tuple[PyTree, PrivateState]:
    """Resumes the run from ``checkpoint_dir``, or starts it: ``(params, state)``.

    ``params`` is the freshly initialised model (it gives the structure and
    dtypes, and is returned with ``init(params)`` when the directory holds no
    checkpoint yet). Call it before :meth:`sampler`, which then continues at
    the restored position. Rules (the run's durable ledger, ``ledger.json``,
    holds the steps paid, the newest step ever checkpointed, and the digests
    of the data and starting parameters of the run's first update):

    * the newest checkpoint, with paid steps after it lost (the process died
      between checkpoints): given ``data=`` (the arrays the run gathers from,
      or hands to ``sampler(data=)``) whose digest is the ledger's, the run
      continues at the checkpoint's step with the SAME batches and noise as
      the lost steps, bit-identical to an uninterrupted run, and those steps
      are not paid again (their outputs died unreleased with the process). A
      replay from step 0 (no checkpoint yet) also needs ``params`` to be the
      parameters the run started from. Without ``data=``, or with other data
      or parameters, the replay could differ from the lost updates by a
      noise-free function of the data, so the run continues at the first
      unpaid step with fresh keys instead, as for an older checkpoint;
    * an OLDER checkpoint (``step=`` below the newest step ever saved): its
      later steps were released in a newer checkpoint, so replaying them would
      publish two outputs with the same noise. The run continues at the first
      step never paid instead, with fresh sampling and noise keys; the lost
      steps stay spent and count towards the plan's T. A correlated-noise run
      cannot continue with fresh noise (its later rows mix every earlier
      step's noise) and is refused there.

    A directory written by another plan (another N, q, sigma, S, T, P, key,
    relation, unit, strategy or clip rule) is refused before anything is
    read; a checkpoint of another model (``params`` of another structure) is
    refused with the differing structure. A checkpoint holds the noise key:
    keep it as private as the data (publish only parameters). With several
    hosts, ``checkpoint_dir`` must be on a filesystem every host sees (the
    ledger is written by process 0 under a POSIX file lock).
    """
    ckpt = self._require_checkpointer("restore")
    if self._opened:
      raise ValueError("restore must come before sampler(): the sampler starts at the restored "
                       "step.")
    fresh = self.init(params)
    template = {"params": params, "opt_state": fresh.opt_state}
    params_sha = data_digest.digest(params)
    data_sha = None
    if data is not None:
      data_sha = data_digest.digest(tuple(data) if isinstance(data, (tuple, list)) else (data,))
    binding = ckpt.replay_binding()
    self._run["params_sha"] = params_sha
    self._run["bound"] = binding is not None
    self._run.pop("replay_data", None)
    newest, paid = ckpt.latest_step(), ckpt.steps_paid()
    if newest is None and step is None:
      self._run["resume_step"] = 0
      if paid:
        # Paid steps but no checkpoint: replay them from the starting state only if no
        # checkpoint of them was ever written and data and parameters are the run's.
        if (ckpt.checkpointed_through() > 0
            or not _replay_is_bound(binding, data_sha, params_sha)):
          return self._skip_to_unpaid(params, fresh, paid)
        self._run["replay_data"] = data_sha
        self._run["replay_until"] = paid
      return params, fresh
    try:
      _, tree = ckpt.restore(template, step=step)
    except FileNotFoundError:
      raise
    except Exception as err:  # pylint: disable=broad-except  (Orbax/TensorStore errors)
      raise ValueError(
          f"the checkpoint in {ckpt.directory} does not match params (another model, parameter "
          f"shapes or dtypes, or optimiser): {type(err).__name__}. Pass the freshly initialised "
          "parameters of the model this run trains.") from None
    state = PrivateState(tree["opt_state"])
    at = int(state.step)
    if at < ckpt.checkpointed_through() and paid > at:
      return self._skip_to_unpaid(tree["params"], state, paid)
    if paid > at:
      if not _replay_is_bound(binding, data_sha, None):
        return self._skip_to_unpaid(tree["params"], state, paid)
      self._run["replay_data"] = data_sha
      self._run["replay_until"] = paid
    self._run["resume_step"] = at
    state._known_step = at  # pylint: disable=protected-access
    return tree["params"], state

  def _skip_to_unpaid(self, params: PyTree, state: PrivateState,
                      paid: int) -> tuple[PyTree, PrivateState]:
    """State that continues at slot ``paid`` with a noise key no earlier step used."""
    if paid > self.steps and not self.allow_extra_steps:
      raise BudgetExceededError(
          f"all {self.steps} planned steps were paid already ({paid}); restoring an older "
          "checkpoint cannot replay them. Pass allow_extra_steps=True to pay more steps.")
    if self.noise_strategy is not None:
      raise ValueError(
          "restoring this correlated-noise run would continue it with fresh noise after steps "
          "that may have been released (an older checkpoint, a deleted newest one, or lost steps "
          "whose replay is not bound to the run's data: pass data= to restore): the strategy's "
          "later rows mix the noise of every earlier step, so the continuation is a second run "
          "of the matrix mechanism, which this plan has not paid. Restore the newest checkpoint "
          "with the run's data, or start a new run (new key, new checkpoint_dir) and pay for it.")
    gradient_key, count_key = self._run_keys.resume_noise(paid)
    noise = _fresh_noise_state(state.opt_state[0], gradient_key, count_key, paid)
    state = PrivateState((noise,) + tuple(state.opt_state[1:]))
    state._known_step = paid  # pylint: disable=protected-access
    self._run["resume_step"] = paid
    return params, state

  def save(self, params: PyTree, state: PrivateState, *, wait: bool = False) -> int:
    """Checkpoints ``(params, state)`` at the state's step in ``checkpoint_dir``; returns the step.

    :meth:`step` calls it every ``checkpoint_every`` steps and after the last
    planned step. Orbax (``orbax-checkpoint``) writes the parameters and the
    optimiser state (noise key, step count, optimiser moments); the sampler's
    position is the step count, and the steps paid are in the durable ledger.
    """
    ckpt = self._require_checkpointer("save")
    at = state._host_step()  # pylint: disable=protected-access
    ckpt.save(at, {"params": params, "opt_state": state.opt_state}, wait=wait)
    return at

  def close(self) -> None:
    """Waits for pending checkpoint saves (no-op without ``checkpoint_dir``)."""
    if self._checkpointer is not None:
      self._checkpointer.close()

  def _after_step(self, params: PyTree, state: PrivateState, done: int) -> None:
    if self._checkpointer is None:
      return
    every = self._checkpoint_every
    if done == self.steps or (every and done % every == 0):
      self.save(params, state, wait=done == self.steps)

  def _label_position(self) -> int | None:
    """Index of the labels among the gathered arrays, for a make_per_example_loss loss."""
    if getattr(self.per_example_loss, "integer_labels", False) and self.batch_argnums == (1, 2):
      return 1
    return None

  def _check_model(self, params: PyTree, arrays: tuple, where: str) -> int | None:
    """Probes the loss on one example (once per shapes); returns the number of classes or None.

    ``arrays`` carry a leading example axis (the dataset, or one chunk of a batch).
    """
    p_leaves, a_leaves = jax.tree.leaves(params), jax.tree.leaves(arrays)
    dtype = _inputs._dtype_of  # pylint: disable=protected-access
    sig = (jax.tree.structure(params), jax.tree.structure(arrays),
           tuple((np.shape(a), str(dtype(a))) for a in p_leaves),
           tuple((np.shape(a)[1:], str(dtype(a))) for a in a_leaves))
    if sig not in self._checked:
      names = [f"gather argument {i}" for i in range(len(arrays))]
      try:
        _inputs.probe_loss(self.per_example_loss, params, arrays,
                           batch_argnums=tuple(range(1, len(arrays) + 1)), names=names,
                           what="per_example_loss")
      except ValueError as err:
        raise ValueError(f"{err}{where}") from err
      classes = None
      if self._label_position() is not None:
        logits_fn = getattr(self.per_example_loss, "logits_fn")
        classes = _inputs.num_classes_of(logits_fn, params, _inputs.example_spec(arrays[0]))
      self._checked[sig] = classes
    return self._checked[sig]

  def _data_names(self, arrays: tuple, what: str, name: str) -> tuple[tuple[str, ...], int | None]:
    """One array per batch argument, integer labels where the loss needs them: (names, label)."""
    if len(arrays) != len(self.batch_argnums):
      raise ValueError(f"{what} {len(self.batch_argnums)} arrays (one per batch argument of the "
                       f"loss, batch_argnums={self.batch_argnums}), got {len(arrays)}.")
    names = tuple(name.format(i) for i in range(len(arrays)))
    label = self._label_position()
    if label is not None:
      _inputs.check_label_dtype(arrays[label], names[label] + " (labels)")
      _inputs.check_label_shape(arrays[label], names[label] + " (labels)")
    return names, label

  def check_inputs(self, params: PyTree, *arrays: Any) -> None:
    """Runs every input check of :meth:`step` on the WHOLE dataset, before anything is paid.

    The same checks as ``gather`` + ``step`` (and :func:`~.train.train_dpsgd`):
    real, finite data with ``num_examples`` rows, integer labels in range for a
    :func:`~.train.make_per_example_loss` loss, and a loss that evaluates to a
    scalar on one example (no BatchNorm in training mode). Optional: ``step``
    runs them on each batch anyway; calling this first finds a problem
    before the first step is paid. Nothing is spent.
    """
    names, label = self._data_names(arrays, "check_inputs needs params and", "gather argument {}")
    _inputs.check_examples(arrays, names, self.num_examples)
    classes = self._check_model(params, arrays, "")
    if label is not None:
      _inputs.check_labels(arrays[label], names[label] + " (labels)", classes)

  def init(self, params: PyTree) -> PrivateState:
    """The optimiser state for ``params`` (noise key, step count 0, base optimiser state)."""
    return PrivateState(self.optimizer.init(params))

  def sampler(self, accountant: Any, *, start_step: int | None = None, data: Any = None,
              mesh: Any = None) -> PaidSampler:
    """The plan's batch source, paying each step on ``accountant`` before sampling it.

    Two paths, the same batches for the same key:

    * host (default): ``sampler.sample()`` draws the Poisson batch on the
      host; ``.gather(x, y)`` copies its padded chunks to the device. For data
      that does not fit on the device.
    * device-resident (``data=(x, y)``): the data is placed on the device (or
      sharded over ``mesh``) once, ``sampler.sample()`` returns a
      :class:`DeviceBatch` holding only the step's key, and :meth:`step`
      samples, gathers, clips, noises and updates in ONE jit-compiled call
      (:mod:`.device_sampling`): no host work per step.

    Args:
      accountant: a ``PrivacyAccountant`` or ``PrivacyBudget`` (required: a
        batch without a ledger entry cannot exist). With several processes
        (``jax.distributed``), process 0 alone spends on it and the others
        follow (:func:`_spend_once`).
      start_step: resume a run after ``start_step`` steps that were already
        paid (e.g. on a persistent ``PrivacyBudget``) and applied to the
        state you pass to :meth:`step`; sampling continues with that step's
        key. With ``checkpoint_dir`` leave it out: the position comes from
        :meth:`restore` and the run's durable ledger.
      data: the dataset, one array (or pytree) per batch argument of the loss,
        N rows each (``num_examples``); or, on several processes, the global
        arrays of :func:`.multihost.global_dataset`. Checked once here (real,
        finite, N rows, integer labels for a ``make_per_example_loss`` loss).
      mesh: a 1-D mesh with axis ``"data"`` (:func:`.data_parallel.make_data_mesh`,
        :func:`.multihost.global_mesh`): data parallelism over its devices
        (of one or several processes), the clipped sums ``psum``-reduced and
        the noise added once. Only with ``data``.
    """
    if mesh is not None and data is None:
      raise ValueError("mesh needs data=: the device-resident path shards the data over it.")
    if mesh is not None and not isinstance(mesh, jax.sharding.Mesh):
      raise TypeError(f"mesh must be a jax.sharding.Mesh with axis 'data' (make_data_mesh, "
                      f"multihost.global_mesh), got {type(mesh).__name__}.")
    ckpt = self._checkpointer
    if start_step is None:
      start = self._resume_step if ckpt is not None else 0
    else:
      if ckpt is not None:
        raise ValueError("start_step cannot be combined with checkpoint_dir: the position comes "
                         "from restore() and the run's durable ledger.")
      start = int(start_step) if not isinstance(start_step, bool) else -1
    if start < 0 or (start > self.steps and not self.allow_extra_steps):
      raise ValueError(f"start_step must be in [0, steps={self.steps}], got {start_step!r}.")
    if ckpt is not None and "resume_step" not in self._run and (
        ckpt.steps_paid() or ckpt.latest_step() is not None):
      raise ValueError(f"checkpoint_dir {ckpt.directory} holds this run's steps "
                       f"({ckpt.steps_paid()} paid): call restore(params) before sampler(); it "
                       "returns the parameters and state to continue from.")
    _check_accountant(accountant)
    previous = self._opened[-1] if self._opened else None
    if previous is not None and not previous._reopenable(accountant):  # pylint: disable=protected-access
      raise ValueError("this plan already opened its sampler: one plan is one training run (a "
                       "second sampler would reuse its sampling and noise keys). A corrected "
                       "sampler(...) call may replace the first only before any update was "
                       "applied and with the same accountant. Call make_private again with a "
                       "fresh key for another run.")
    # Steps released before this sampler: the durable ledger's, or start_step's.
    earlier = max(start, ckpt.steps_paid()) if ckpt is not None else start
    if previous is not None:
      earlier = max(earlier, previous.steps_paid)
    sampler = PaidSampler(self, accountant, start, earlier)  # validates the accountant first
    if jax.process_count() > 1:
      self._check_same_plan_on_every_process()
    if data is not None:
      sampler._device = self._device_path(data, mesh)  # pylint: disable=protected-access
      if ckpt is not None:
        sampler._bind_data(data)  # pylint: disable=protected-access
    if ckpt is not None:
      ckpt.record_budget_path(getattr(accountant, "path", None))
    if earlier and previous is None:
      self._charge_earlier_steps(accountant, earlier)
    if previous is not None:
      previous._closed = True  # pylint: disable=protected-access
    self._opened.append(sampler)
    return sampler

  def _paid_event_and_count(self, steps: int) -> tuple[events.DpEvent, int]:
    """What ``steps`` released steps of this run cost: the run's event once (correlated), or T x step."""
    if self.noise_strategy is not None:
      return self.run_event(), 1
    return self.step_event(), steps

  def _charge_earlier_steps(self, accountant: Any, steps: int) -> None:
    """Charges the ``steps`` released before this sampler unless ``accountant`` provably holds them.

    A run's ledger must hold every step it released, however it was resumed
    (``start_step``, a restart on ``checkpoint_dir``). The accountant holds
    them when it is the durable ``PrivacyBudget`` file that paid the run
    (recorded in the run's ledger), or when its ledger already has at least
    that many of this run's events; otherwise they are charged to it now,
    before any batch exists. With several processes, process 0's accountant
    decides for all (the charge is collective).
    """
    event, count = self._paid_event_and_count(steps)
    holds = multihost.is_coordinator() and _ledger_holds(accountant, event, count,
                                                         self._checkpointer)
    if not multihost.broadcast_from_coordinator(holds):
      try:
        _spend_once(accountant, event, count)
      except BudgetExceededError as err:
        raise BudgetExceededError(
            f"the accountant does not hold the {steps} step(s) this run released before the "
            f"sampler was opened (start_step or the checkpoint ledger), and cannot pay them; "
            f"nothing was sampled. ({err})") from err

  def _check_same_plan_on_every_process(self) -> None:
    """Every process must run the same plan: same keys, sigma, q, S, T, N, P (one all-gather)."""
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    digest = hashlib.sha256()
    for part in (jax.random.key_data(self._sample_key), jax.random.key_data(self._noise_key)):
      digest.update(np.asarray(part).tobytes())
    digest.update(repr((self.noise_multiplier, self.sample_rate, self.sensitivity, self.steps,
                        self.num_examples, self.padded_size, self.unit,
                        self.neighbouring, self.min_separation,
                        self.gradient_noise_multiplier,
                        _selection_digest(self.batch_selection))).encode())
    if self.noise_strategy is not None:  # the correlated noise must be the same C everywhere
      digest.update(np.asarray(self.noise_strategy.fingerprint(self.steps)).tobytes())
    words = np.frombuffer(digest.digest(), np.int32)  # exact in any dtype setting
    every = np.asarray(multihost_utils.process_allgather(words))
    if not (every == every[0]).all():
      raise ValueError(
          "the processes of this job made different plans (key, noise multiplier, sample rate, "
          "clip norm, steps or N differ): every process must call make_private with the same "
          "arguments and key, or it would add noise its peers and the accountant do not assume.")

  def _device_path(self, data: Any, mesh: Any) -> tuple:
    """Checks and places ``data``; builds the jitted sample-and-update (:mod:`.device_sampling`).

    Every sampler and clipper of the host path: with ``noise_strategy`` the
    batch of step t is the cyclic Poisson batch of
    :class:`~.correlated.CyclicPoissonSampler` (Poisson bits of the step key
    AND group ``t mod b`` of :func:`~.correlated.participation.cyclic_groups`,
    computed once where the rows live; t is the noise state's step count,
    which :meth:`step` checks equals the batch's paid step); with an adaptive
    ``l2_clip_norm`` the gradients are clipped in units of the state's C_t and
    the centred unclipped count goes with the sum to the noise, as in the host
    ``update`` of :func:`make_private`.
    """
    selection = self.batch_selection
    arrays = tuple(data) if isinstance(data, (tuple, list)) else (data,)
    names, label = self._data_names(arrays, "data needs", "data[{}]")
    leaves = jax.tree.leaves(arrays)
    if all(not isinstance(a, jax.Array) or a.is_fully_addressable for a in leaves):
      _inputs.check_examples(arrays, names, self.num_examples)
      local = arrays
    else:
      if mesh is None:
        raise ValueError("global (multi-process) data arrays need the mesh they are sharded over.")
      if isinstance(selection, user_sampling.UserPoissonSampler):
        raise ValueError("batch_selection=UserPoissonSampler with data= lays the data out "
                         "user-major on the host: pass the N-row host arrays (and a mesh), not "
                         "global arrays.")
      local = tuple(jax.tree.map(_local_rows, a) for a in arrays)
      _inputs.check_examples(local, names, int(jax.tree.leaves(local[0])[0].shape[0]))
    if mesh is not None:
      if device_sampling.DATA_AXIS not in mesh.axis_names or len(mesh.axis_names) != 1:
        raise ValueError(f"mesh must be 1-D with axis {device_sampling.DATA_AXIS!r}, got "
                         f"{mesh.axis_names}.")
      shards = mesh.shape[device_sampling.DATA_AXIS]
    else:
      shards = 1
    b = self.min_separation
    # Chunk size P: the binomial bound at the batch's rate (p / b for cyclic Poisson).
    padded = (self.padded_size if mesh is None else device_sampling.local_padded_size(
        self.num_examples, self.sample_rate / b, shards, self._physical_batch_size,
        self._overflow_prob))
    adaptive = self.adaptive_clip_norm is not None
    checked = None  # what step()'s model check sees, when not the placed arrays
    if selection is not None:
      # Fixed-size subsets / Poisson users, sampled in jit by the sampler's own device path:
      # the batches of its host sample() for the same key (make_private refuses adaptive
      # clipping and noise_strategy with a batch_selection).
      placed = selection.place_data(arrays, mesh)
      clipped_sum = selection.device_clipped_sum_fn(self.clipped_grad_fn, mesh=mesh,
                                                    overflow_prob=self._overflow_prob)
      if isinstance(selection, user_sampling.UserPoissonSampler):
        # The placed data is user-major (U, K, ...) plus the example mask; step() probes the
        # loss on the example layout, so it gets the N-row shapes and update uses the placed.
        checked = jax.tree.map(lambda a: jax.ShapeDtypeStruct(np.shape(a), _inputs._dtype_of(a)),  # pylint: disable=protected-access
                               arrays)
    elif adaptive:  # the clipped gradients of C_t, built in the step (as make_private's update)
      placed = device_sampling.place_data(arrays, self.num_examples, mesh)
      loss_fn, argnums = self.per_example_loss, self.batch_argnums
      micro = self.clipped_grad_fn.microbatch_size
      method = getattr(self.clipped_grad_fn, "method", None) or "auto"
      clipped_sum = device_sampling.clipped_sum_fn(
          None, num_examples=self.num_examples, sample_rate=self.sample_rate,
          padded_size=padded, mesh=mesh,
          make_grad_fn=lambda c: adaptive_clipping.adaptive_clipped_grad(
              loss_fn, c, batch_argnums=argnums, microbatch_size=micro, method=method))
    else:
      placed = device_sampling.place_data(arrays, self.num_examples, mesh)
      clipped_sum = device_sampling.clipped_sum_fn(
          self.clipped_grad_fn, num_examples=self.num_examples, sample_rate=self.sample_rate,
          padded_size=padded, mesh=mesh)
    groups = None
    if self.noise_strategy is not None and b > 1:
      from jaxdp.dpsgd.correlated import participation  # pylint: disable=g-import-not-at-top
      group_key = self._participation.group_key  # pylint: disable=protected-access
      group_data = np.asarray(jax.random.key_data(group_key))
      group_impl = jax.random.key_impl(group_key)
      groups = device_sampling.computed_rows(
          lambda rows: participation.cyclic_groups(
              jax.random.wrap_key_data(jnp.asarray(group_data), impl=group_impl), rows, b),
          self.num_examples, mesh)
    tx = self.optimizer
    impl = jax.random.key_impl(self._sample_key)
    # As the host update: a correlated-noise plan donates its state (the noise history).
    donate = (1,) if self.noise_strategy is not None and self.noise_strategy.state_size else ()

    @functools.partial(jax.jit, donate_argnums=donate)
    def update_with(params, opt_state, key_data, arrays, groups):
      step_key = jax.random.wrap_key_data(key_data, impl=impl)
      row_mask = None
      if groups is not None:  # step t samples group t mod b (t: the state's step count)
        row_mask = groups == (opt_state[0].count % b).astype(groups.dtype)
      clip = adaptive_clipping.current_clip_norm(opt_state) if adaptive else None
      extra = {} if row_mask is None else {"row_mask": row_mask}
      if adaptive:
        extra["clip_norm"] = clip
      gsum, (loss, num, clipped) = clipped_sum(params, step_key, arrays, **extra)
      if adaptive:
        gsum = (gsum, adaptive_clipping.centered_unclipped_count(num, clipped))
        loss = loss * clip
      updates, opt_state = tx.update(gsum, opt_state, params)
      return (optax.apply_updates(params, updates), opt_state,
              StepInfo(nonprivate_loss_sum=loss, nonprivate_num_examples=num,
                       nonprivate_num_clipped=clipped))

    def update(params, opt_state, key_data, arrays):
      # (user-level sampling: ``arrays`` are the shapes step() checked; the data is ``placed``)
      return update_with(params, opt_state, key_data, placed if checked is not None else arrays,
                         groups)

    replicated = None if mesh is None else jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    host_labels = None if label is None else local[label]
    return _DevicePath(placed if checked is None else checked, update, replicated, host_labels)

  def step_event(self) -> events.DpEvent:
    """The event of ONE step: :func:`~jaxdp.accounting.dpsgd_event` with one step.

    ``PoissonSampled(q, Gaussian(sigma))`` tagged add/remove, or
    ``PoissonSampled(q, Gaussian(sigma / 2))`` tagged replace-one (noise over the
    replace-one sensitivity ``2S``), for ``unit``.
    """
    if self.noise_multiplier == 0.0:
      return events.NonPrivateDpEvent()
    if self.noise_strategy is not None:
      raise ValueError("a correlated-noise run has no per-step event: its steps form one "
                       "mechanism, paid once (run_event()).")
    if isinstance(self.batch_selection, fixed_size_sampling.FixedSizeSampler):
      return self.batch_selection.event(self.noise_multiplier, 1, unit=self.unit).event
    return dpsgd_accounting.dpsgd_event(self.noise_multiplier, self.sample_rate, 1,
                                        neighbouring=self.neighbouring, unit=self.unit).event

  def clip_norm(self, state: PrivateState) -> float:
    """The clip norm the next step uses: fixed, or C_t of an adaptive ``l2_clip_norm``.

    C_t is public (a function of the noisy unclipped counts only; Andrew et al. 2021).
    """
    if self.adaptive_clip_norm is None:
      return float(self.clipped_grad_fn.l2_clip_norm)
    return float(adaptive_clipping.current_clip_norm(state.opt_state))

  def run_event(self) -> events.DpEvent:
    """The DpEvent of the whole run: ``T x step_event()``, or the correlated-noise run's event.

    With ``noise_strategy``: :func:`jaxdp.dpsgd.correlated.mf_event` (amplified
    BandMF: ``k x PoissonSampled(p, Gaussian(sigma))``; otherwise one Gaussian of
    the strategy's (k, b)-participation sensitivity), what the sampler pays once.
    """
    if self.noise_strategy is None:
      event = self.step_event()
      return event if self.steps == 1 else events.SelfComposedDpEvent(event, self.steps)
    return _mf_accounting().mf_event(self.noise_strategy, noise_multiplier=self.noise_multiplier,
                                  num_steps=self.steps, min_separation=self.min_separation,
                                  sample_rate=self.sample_rate, unit=self.unit,
                                  neighbouring=self.neighbouring)

  def guarantee(self, steps: int, delta: float | None = None) -> Any:
    """:meth:`epsilon` as a ``PrivacyGuarantee`` (``neighbouring``, ``unit``, ``accountant_method``).

    The one number to report for the run: the method is the calibration's, and
    ``accountant.get_epsilon(delta, private.accountant_method)`` on the ledger
    gives the same value (the ledger's default ``"auto"`` takes the smallest of
    all its sound bounds and can be smaller).
    """
    from jaxdp.accounting.accountant import PrivacyGuarantee  # pylint: disable=g-import-not-at-top
    eps = self.epsilon(steps, delta)
    return PrivacyGuarantee(eps, float(self.delta if delta is None else delta),
                            self.neighbouring, self.unit, self.accountant_method)

  def epsilon(self, steps: int, delta: float | None = None) -> float:
    """``dpsgd_epsilon(sigma, q, steps, delta, accountant_method)`` (0 steps: 0; sigma = 0: inf)."""
    if delta is None:
      if self.delta is None:
        raise ValueError("give delta: the plan was made with a noise multiplier and no delta.")
      delta = self.delta
    steps = int(steps)
    if steps < 0:
      raise ValueError(f"steps must be >= 0, got {steps}.")
    if steps == 0:
      return 0.0
    if self.noise_multiplier == 0.0:
      return math.inf
    if self.noise_strategy is not None:
      return _mf_accounting().mf_epsilon(
          self.noise_strategy, noise_multiplier=self.noise_multiplier, num_steps=self.steps,
          min_separation=self.min_separation, sample_rate=self.sample_rate, delta=delta,
          accountant=self.accountant_method, neighbouring=self.neighbouring)
    if isinstance(self.batch_selection, fixed_size_sampling.FixedSizeSampler):
      return self.batch_selection.epsilon(self.noise_multiplier, steps, delta,
                                          self.accountant_method)
    return dpsgd_accounting.dpsgd_epsilon(self.noise_multiplier, self.sample_rate, steps,
                                          delta, self.accountant_method, self.neighbouring)

  def step(self, params: PyTree, state: PrivateState,
           batch: PrivateBatch) -> tuple[PyTree, PrivateState, StepInfo]:
    """One DP-SGD update from a paid batch (jit-compiled; see the module docstring).

    ``grad_sum = sum over all chunks of the masked clipped per-example
    gradients``; ``update = opt((grad_sum + N(0, (sigma S)^2 I)) / (q N))``
    (paper 000 Section 3.1 Equation 4 with the divisor ``q N``).

    Raises:
      TypeError: ``batch`` is not a :class:`PrivateBatch` (e.g. a raw
        ``(x, y)`` tuple or a ``MaskedBatch`` made by hand).
      ValueError: the batch comes from another plan, was already used, or its
        step index is not the state's step count; or the inputs are refused
        before the update (labels outside the model's classes, a loss that
        fails or is not a scalar on one example, e.g. a wrong feature count,
        BatchNorm in training mode). A refused batch of this plan is not
        consumed: the next ``sampler.sample()`` hands it out again.
    """
    if not isinstance(batch, PrivateBatch):
      raise TypeError(
          f"step accepts only a PrivateBatch from sampler.sample().gather(...), got "
          f"{type(batch).__name__}: a raw batch has no mask for its padding and no paid "
          "ledger entry, and a fixed-size batch is not the Poisson sample the accountant assumes.")
    ticket = batch._ticket  # pylint: disable=protected-access
    if ticket._plan is not self:  # pylint: disable=protected-access
      raise ValueError("this batch was sampled by another plan (another q, N, P or key).")
    kept = ticket._kept()  # pylint: disable=protected-access
    try:
      if ticket._used:  # pylint: disable=protected-access
        raise ValueError(f"the batch of step {ticket.step_index} was already used for an update; "
                         "every update needs a freshly sampled (and paid) batch.")
      if not isinstance(state, PrivateState):
        raise TypeError(f"state must be the PrivateState from init(), got "
                        f"{type(state).__name__}.{kept}")
      current = state._host_step()  # pylint: disable=protected-access
      if current != ticket.step_index:
        sampler = ticket._sampler  # pylint: disable=protected-access
        if (current < ticket.step_index and sampler is not None
            and sampler._hand_out_step_first(current)):  # pylint: disable=protected-access
          raise ValueError(
              f"the batch was paid for step {ticket.step_index} but the state has applied "
              f"{current} updates: the batch of step {current} was handed out earlier and not "
              f"used yet. Use it first: sampler.sample() hands it out again, then this one. "
              f"Nothing was spent by this call.")
        raise ValueError(
            f"the batch was paid for step {ticket.step_index} but the state has applied "
            f"{current} updates: batches must be applied in the order they were paid, each to "
            f"the state the previous step returned (an older state would reuse its noise "
            f"key).{kept}")
      label = self._label_position()
      if isinstance(batch, DeviceBatch):
        sampler = ticket._sampler  # pylint: disable=protected-access
        dev = sampler._device  # pylint: disable=protected-access
        classes = self._check_model(params, dev.data, kept)
        if label is not None and dev.host_labels is not None:
          _inputs.check_labels(dev.host_labels, f"data[{label}] (labels)", classes, kept)
          sampler._device = dev._replace(host_labels=None)  # pylint: disable=protected-access
        opt_state = state.opt_state
        if dev.replicated is not None:  # one process: jax.device_put; several: global arrays
          params, opt_state = multihost.replicate((params, opt_state), dev.replicated.mesh)
        params, opt_state, info = dev.update(params, opt_state, batch._step_key_data, dev.data)  # pylint: disable=protected-access
      else:
        # Shapes of one chunk (P, ...), without touching the data.
        lead = 2 if isinstance(self.batch_selection, user_sampling.UserPoissonSampler) else 1
        chunk = jax.tree.map(  # (P, ...) per chunk; users: (P * K, ...) examples
            lambda a: jax.ShapeDtypeStruct((int(np.prod(a.shape[1:lead + 1])),)
                                           + a.shape[lead + 1:], a.dtype), batch.masked.arrays)
        classes = self._check_model(params, chunk, kept)
        if label is not None:
          host_labels = batch._host_labels  # pylint: disable=protected-access
          _inputs.check_labels(host_labels, f"gather argument {label} (labels)", classes, kept)
        with warnings.catch_warnings():
          # A correlated-noise step donates its state; under jax.vmap (a batch of runs)
          # the donated buffers cannot be reused in place, which is harmless.
          warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
          params, opt_state, info = self._update(params, state.opt_state, batch.masked)
    except (TypeError, ValueError):
      ticket._refused()  # pylint: disable=protected-access  (no-op for a used batch)
      raise
    ticket._used = True  # pylint: disable=protected-access
    new_state = PrivateState(opt_state)
    new_state._known_step = ticket.step_index + 1  # pylint: disable=protected-access
    self._after_step(params, new_state, ticket.step_index + 1)
    return params, new_state, info


def make_private(
    per_example_loss: Callable[..., jax.Array],
    *,
    l2_clip_norm: Any,
    num_examples: int,
    key: jax.Array,
    expected_batch_size: float | None = None,
    sample_rate: float | None = None,
    target_epsilon: float | None = None,
    noise_multiplier: float | None = None,
    delta: float | None = None,
    epochs: float | None = None,
    steps: int | None = None,
    optimizer: optax.GradientTransformation | None = None,
    learning_rate: float = 0.1,
    physical_batch_size: int | None = None,
    overflow_prob: float = 1e-9,
    clipping_method: str = "auto",
    per_layer: bool = False,
    microbatch_size: int | None = None,
    batch_argnums: int | Sequence[int] = (1, 2),
    accountant_method: str = "rdp",
    unit: str = events.DEFAULT_UNIT,
    allow_extra_steps: bool = False,
    neighbouring: str = "add_remove",
    checkpoint_dir: str | None = None,
    checkpoint_every: int | None = None,
    noise_strategy: Any = None,
    min_separation: int | None = None,
    batch_selection: Any = None,
) -> PrivateSGD:
  """Wires clipping, Poisson sampling, noise, optimiser and accounting for a custom loop.

  In the spirit of Opacus' ``make_private`` / ``make_private_with_epsilon``
  and JAX Privacy's training config, but pure-functional: nothing is wrapped
  or mutated except the accountant you pass to :meth:`PrivateSGD.sampler`.

  Privacy: with ``target_epsilon``, sigma is the smallest noise multiplier
  (``calibrate_noise_multiplier``, float64) for which T steps of Poisson rate
  q are (target_epsilon, delta)-DP for add/remove neighbours of one ``unit``
  (replace-one with ``neighbouring="replace_one"``: PLD of the replace-one
  subsampled Gaussian, :mod:`jaxdp.accounting.dpsgd_accounting`);
  with ``noise_multiplier``, epsilon is reported for the steps actually paid.
  N is treated as public (q and ``q N`` are computed from it), as in
  :func:`.train.train_dpsgd`, Opacus and TF Privacy.

  Args:
    per_example_loss: ``(params, *example) -> scalar`` loss of ONE example,
      e.g. ``make_per_example_loss(apply)`` for a Flax model.
    l2_clip_norm: clip norm (per-group norms with ``per_layer``); must be
      finite unless ``noise_multiplier=0``. Or an
      :class:`~.adaptive_clipping.AdaptiveClipNorm`: adaptive clipping
      (Andrew et al. 2021) to a privately tracked quantile of the gradient
      norms; the gradient noise gets sigma_Delta and the unclipped count
      sigma_b so that together they cost the calibrated sigma (Theorem 1; for
      a correlated-noise run without amplification, the run-level version in
      :func:`~.adaptive_clipping.gradient_noise_multiplier`). The current
      clip norm is :meth:`PrivateSGD.clip_norm` ``(state)`` (public; carried
      by checkpoints). Host or device data, with or without correlated noise;
      flat clipping.
    num_examples: dataset size N (the batches are gathered from N rows).
    key: ``jax.random`` key, split like ``train_dpsgd``'s into
      ``(init, sampling, noise) = split(key, 3)``; the init part is not used
      here (initialise the params with a key of your own, not this one).
    expected_batch_size / sample_rate: ``q N`` or q (exactly one).
    target_epsilon / noise_multiplier: exactly one (sigma = 0: non-private,
      epsilon inf, refused by any ``PrivacyBudget``).
    delta: in (0, 1); required with ``target_epsilon``; the delta epsilon is
      reported at.
    epochs / steps: planned T = ``ceil(epochs / q)`` or ``steps`` (exactly one).
    optimizer: optax optimiser for the private average (default
      ``optax.sgd(learning_rate)``).
    physical_batch_size: static chunk size P (default: the binomial bound at
      ``overflow_prob``); a Poisson batch larger than P is processed as
      several chunks accumulated before ONE noisy update.
    clipping_method, per_layer, microbatch_size, batch_argnums: see
      :func:`~.clipping.clipped_grad` (``batch_argnums`` default ``(1, 2)``
      for ``loss(params, x, y)``).
    accountant_method: ``"rdp"`` (default) or ``"pld"``: ONE method for the
      calibration and every reported epsilon (``guarantee()`` names it);
      ``"pld"`` is tighter (5-10% less noise) but calibrates in tens of seconds.
    unit: privacy unit of the events (default ``"example"``).
    allow_extra_steps: allow paying (and running) more than T steps; each is
      accounted, so epsilon grows past the target.
    neighbouring: ``"add_remove"`` (default) or ``"replace_one"`` (needs
      ``accountant_method="pld"``): the relation of the calibration, the events
      the sampler pays and the reported epsilon.
    checkpoint_dir: make the run resumable: Orbax checkpoints of the params
      and optimiser state (noise key and step included) and a durable ledger
      of the steps paid, written before each batch exists
      (:mod:`.checkpointing`). Call :meth:`PrivateSGD.restore` before the
      sampler; a killed run restarted with the same arguments continues
      bit-identically, and its accountant holds exactly the steps paid.
    checkpoint_every: with ``checkpoint_dir``, save every this many steps
      (default: every ``max(1, T // 10)`` steps); the last planned step is
      always saved.
    noise_strategy: correlated noise instead of DP-SGD's independent noise: a
      :class:`~jaxdp.dpsgd.correlated.BandMF` or
      :class:`~jaxdp.dpsgd.correlated.BLT` strategy C (e.g. from
      ``optimize_bandmf(T, bands, ...)``). The noise becomes the streamed
      ``C^{-1} z`` (:func:`~jaxdp.dpsgd.correlated.correlated_noise`), the
      batches cyclic Poisson over ``min_separation`` groups (step t samples
      group ``t mod b`` at rate q: ``sample_rate`` is the IN-GROUP rate and
      ``expected_batch_size = q N / b``), and the run is paid as ONE event
      before its first batch (:func:`~jaxdp.dpsgd.correlated.mf_event`:
      amplified BandMF when ``bands <= b`` and ``q < 1``, else the Gaussian of
      the strategy's (k, b)-participation sensitivity). ``BandMF.dp_sgd()``
      with ``min_separation=1`` is DP-SGD bit for bit. Host or device data
      (the cyclic groups are drawn where the rows live), one or many
      processes, ``checkpoint_dir`` (the noise history is in the state;
      restoring an older checkpoint is refused, since the strategy's later
      rows mix every earlier step's noise); add/remove neighbours, and no
      ``allow_extra_steps`` (C has no row T + 1). ``sampler(accountant,
      start_step=s)`` with ``s > 0`` continues a run whose event was paid (in
      full, as the first ``sample()`` pays it); an accountant that does not
      hold that event is charged it when the sampler opens.
    min_separation: b, the number of cyclic groups (two participations of one
      example are at least b steps apart); default ``bands`` for BandMF;
      required for BLT.
    batch_selection: how batches are drawn when not by Poisson sampling of
      examples at ``sample_rate``: a
      :class:`~.fixed_size_sampling.FixedSizeSampler` (exactly B of the N
      examples without replacement; replace-one neighbours, accounted by RDP
      as ``SampledWithoutReplacement(N, B, Gaussian(sigma / 2))``, Wang, Balle
      & Kasiviswanathan 2019; divisor B) or a
      :class:`~.user_sampling.UserPoissonSampler` (users sampled at rate q,
      each contributing ONE clipped gradient of its examples; the privacy unit
      is ``"user"``, McMahan et al. 2018). The sampler fixes the batch size
      (no ``sample_rate`` / ``expected_batch_size``) and its chunk size P.
      Not combined with correlated noise, adaptive clip norms, per-layer
      clipping or microbatches (refused: no analysis of those cells here).

  Returns:
    A :class:`PrivateSGD`.

  >>> import jax, jax.numpy as jnp
  >>> private = make_private(lambda w, x, y: (jnp.dot(w, x) - y) ** 2, l2_clip_norm=1.0,
  ...                        num_examples=1000, expected_batch_size=100, noise_multiplier=1.0,
  ...                        delta=1e-5, steps=10, key=jax.random.key(0))
  >>> private.sample_rate, private.expected_batch_size, private.noise_stddev
  (0.1, 100.0, 1.0)
  """
  _validation.check_key(key)
  if not callable(per_example_loss):
    raise TypeError(f"per_example_loss must be callable, got {type(per_example_loss).__name__}.")
  if optimizer is not None and not (hasattr(optimizer, "init") and hasattr(optimizer, "update")):
    raise TypeError(f"optimizer must be an optax GradientTransformation, got "
                    f"{type(optimizer).__name__}.")
  n = _validation.check_positive_int(num_examples, "num_examples")
  if isinstance(batch_selection, fixed_size_sampling.FixedSizeSampler):
    # Fixed-size batches are accounted by RDP (the only bound for sampling without replacement).
    relation = events.check_neighbouring(neighbouring)
  else:
    relation = dpsgd_accounting.check_relation_and_accountant(neighbouring, accountant_method,
                                                              "accountant_method")
  unit = events.check_unit(unit)
  if batch_selection is None:
    q = sampling.resolve_sample_rate(sample_rate, expected_batch_size, n)
  else:
    q, unit = _check_batch_selection(
        batch_selection, n, relation=relation, accountant_method=accountant_method, unit=unit,
        given=dict(sample_rate=sample_rate, expected_batch_size=expected_batch_size,
                   noise_strategy=noise_strategy, min_separation=min_separation,
                   per_layer=per_layer, microbatch_size=microbatch_size,
                   adaptive=isinstance(l2_clip_norm, adaptive_clipping.AdaptiveClipNorm)))
  if (epochs is None) == (steps is None):
    raise ValueError("give exactly one of epochs or steps.")
  t_planned = (dpsgd_accounting.steps_for_epochs(epochs, q) if steps is None
               else _validation.check_positive_int(steps, "steps"))
  if delta is not None:
    delta = _validation.check_delta(delta, allow_zero=False)
  if not isinstance(allow_extra_steps, bool):
    raise TypeError(f"allow_extra_steps must be a bool, got {allow_extra_steps!r}.")
  if isinstance(batch_argnums, (int, np.integer)) and not isinstance(batch_argnums, bool):
    batch_argnums = (batch_argnums,)
  try:
    batch_argnums = tuple(sorted(_validation.check_positive_int(a, "batch_argnums entry")
                                 for a in batch_argnums))
  except TypeError as err:
    raise TypeError(f"batch_argnums must be an int or a sequence of ints >= 1, got "
                    f"{batch_argnums!r}.") from err
  if batch_argnums != tuple(range(1, len(batch_argnums) + 1)):
    raise ValueError(f"batch_argnums must be (1, ..., k): every argument of per_example_loss "
                     f"after params is gathered from the batch, got {batch_argnums}.")
  checkpoint_every = checkpointing.check_arguments(checkpoint_dir, checkpoint_every)
  if noise_strategy is not None:
    from jaxdp.dpsgd import correlated  # pylint: disable=g-import-not-at-top
    if not isinstance(noise_strategy, correlated.Strategy):
      raise TypeError(f"noise_strategy must be a jaxdp.dpsgd.correlated strategy (BandMF, BLT, "
                      f"...), got {type(noise_strategy).__name__}.")
    if allow_extra_steps:
      raise ValueError(
          "allow_extra_steps=True is refused with noise_strategy: the strategy C is a T x T "
          "matrix and the run's sensitivity and event cover exactly its T steps; a step T + 1 "
          "has no row in C, so its noise would not be part of the mechanism that was paid. "
          "Plan more steps (steps=/epochs=) instead.")
    if min_separation is None:
      if noise_strategy.bands is None:
        raise ValueError("min_separation is required with a BLT noise_strategy (the number of "
                         "cyclic groups b; e.g. the steps of one epoch).")
      min_separation = noise_strategy.bands
    b = _validation.check_positive_int(min_separation, "min_separation")
    if b > n:
      raise ValueError(f"min_separation must be <= num_examples={n}, got {b}.")
    if sample_rate is None and expected_batch_size is not None:
      eb = _validation.check_positive(expected_batch_size, "expected_batch_size")
      if eb * b > n:
        raise ValueError(f"expected_batch_size must be in (0, num_examples / min_separation = "
                         f"{n / b}], got {eb}.")
      q = _validation.check_sample_rate(eb * b / n)
    t_planned = (correlated.accounting.steps_for_epochs(epochs, q, b) if steps is None
                 else t_planned)
    noise_strategy.check_num_steps(t_planned)  # a strategy built for fewer steps is refused
  elif min_separation is not None:
    raise ValueError("min_separation needs noise_strategy (DP-SGD samples every example at "
                     "every step).")
  adaptive = None
  if isinstance(l2_clip_norm, adaptive_clipping.AdaptiveClipNorm):
    adaptive = l2_clip_norm
    if per_layer:
      raise ValueError("per_layer=True is not available with an adaptive l2_clip_norm "
                       "(flat clipping of the normalised gradient).")
    l2_clip_norm = 1.0  # gradients are clipped in units of the current clip norm C_t

  if isinstance(batch_selection, user_sampling.UserPoissonSampler):
    grad_fn = user_sampling.user_clipped_grad(per_example_loss, l2_clip_norm=l2_clip_norm,
                                              batch_argnums=batch_argnums)
  else:
    grad_fn = clipping.clipped_grad(per_example_loss, l2_clip_norm=l2_clip_norm,
                                    batch_argnums=batch_argnums, microbatch_size=microbatch_size,
                                    per_layer=per_layer, method=clipping_method)
  sensitivity = float(grad_fn.sensitivity)
  run_keys = keys_lib.derive(key)
  participation = None
  if batch_selection is not None:
    if physical_batch_size is not None:
      raise ValueError("physical_batch_size is set on the batch_selection sampler "
                       "(padded_size=), not on make_private.")
    padded, expected = batch_selection.padded_size, batch_selection.expected_batch_size
  elif noise_strategy is None:
    # Validates physical_batch_size / overflow_prob and fixes P once.
    padded = sampling.PoissonSampler(n, q, padded_size=physical_batch_size,
                                     overflow_prob=overflow_prob, on_overflow="split").padded_size
    expected = q * n
  else:
    participation = correlated.CyclicPoissonSampler(
        n, b, q, t_planned, run_keys.groups,
        padded_size=physical_batch_size, overflow_prob=overflow_prob)
    padded = participation.padded_size
    expected = participation.expected_batch_size
  # Calibration last: the slow part (seconds), after every cheap check.
  if isinstance(batch_selection, fixed_size_sampling.FixedSizeSampler):
    sigma = _fixed_size_noise_multiplier(batch_selection, target_epsilon, noise_multiplier,
                                         delta, t_planned)
  elif noise_strategy is None:
    sigma = dpsgd_accounting.resolve_noise_multiplier(target_epsilon, noise_multiplier, delta, q,
                                                      t_planned, accountant=accountant_method,
                                                      neighbouring=relation)
  else:
    sigma = dpsgd_accounting.resolve_with(
        target_epsilon, noise_multiplier, delta,
        lambda eps, d: correlated.calibrate_mf_noise_multiplier(
            eps, d, noise_strategy, num_steps=t_planned, min_separation=b, sample_rate=q,
            accountant=accountant_method, neighbouring=relation))
  if sigma > 0 and math.isinf(sensitivity):
    raise ValueError("l2_clip_norm must be finite for private training (noise_multiplier > 0).")
  grad_sigma, count_sigma = sigma, None
  if adaptive is not None:
    # Andrew et al. 2021 Thm 1: gradient and count noise together cost sigma (whitening).
    count_sigma = adaptive.resolved_count_noise_multiplier(expected)
    if noise_strategy is None:
      grad_sigma = adaptive_clipping.gradient_noise_multiplier(sigma, count_sigma)
    else:
      grad_sigma = correlated.accounting.adaptive_gradient_noise_multiplier(
          noise_strategy, noise_multiplier=sigma, count_noise_multiplier=count_sigma,
          num_steps=t_planned, min_separation=b, sample_rate=q)
  checkpointer = None
  b_groups = 1 if noise_strategy is None else b
  if checkpoint_dir is not None:
    fingerprint = {
        "num_examples": n, "sample_rate": q, "noise_multiplier": float(sigma),
        "sensitivity": sensitivity, "steps": t_planned, "padded_size": int(padded),
        "unit": unit, "neighbouring": relation, "accountant_method": accountant_method,
        "key_sha256": checkpointing.key_digest(key),
        "gradient_noise_multiplier": float(grad_sigma), "min_separation": b_groups,
        "noise_strategy": _strategy_digest(noise_strategy, t_planned),
        "adaptive_clip_norm": None if adaptive is None else repr(adaptive),
        "batch_selection": _selection_digest(batch_selection),
    }
    checkpointer = checkpointing.RunCheckpointer(os.fspath(checkpoint_dir), fingerprint)
    if checkpoint_every is None:
      checkpoint_every = max(1, t_planned // 10)
  base = optimizer if optimizer is not None else optax.sgd(learning_rate)
  # Adaptive clipping: the count noise and the gradient noise have disjoint keys (.keys).
  grad_key = run_keys.gradient_noise
  count_key = None if adaptive is None else run_keys.count_noise
  noise_tx = _noise_transform(noise_strategy, adaptive, sigma=sigma, grad_sigma=grad_sigma,
                              sensitivity=sensitivity, expected=expected, steps=t_planned,
                              min_separation=b_groups, sample_rate=q, grad_key=grad_key,
                              count_key=count_key, count_sigma=count_sigma)
  tx = optax.chain(noise_tx, base)

  # A correlated-noise plan donates the optimiser state: BandMF's noise history is then
  # updated in place (state_size x params floats), not copied every step. The state a step
  # consumed is never valid again anyway (step refuses an old state).
  donate = (1,) if noise_strategy is not None and noise_strategy.state_size else ()

  @functools.partial(jax.jit, donate_argnums=donate)
  def update(params, opt_state, masked):
    arrays, mask = masked.arrays, masked.mask  # leaves (K, P, ...), mask (K, P)
    step_grad_fn, clip = grad_fn, None
    if adaptive is not None:  # clip to the current C_t, in units of C_t (adaptive_clipping)
      clip = opt_state[0].clip_norm
      step_grad_fn = adaptive_clipping.adaptive_clipped_grad(
          per_example_loss, clip, batch_argnums=batch_argnums, microbatch_size=microbatch_size,
          method=clipping_method)
    zeros = jax.tree.map(
        lambda p: jnp.zeros(jnp.shape(p), jnp.promote_types(jnp.result_type(p), jnp.float32)),
        params)

    def body(carry, chunk):
      acc, loss, count, clipped = carry
      chunk_arrays, chunk_mask = chunk
      g, info = step_grad_fn(params, sampling.MaskedBatch(chunk_arrays, chunk_mask))
      return (jax.tree.map(jnp.add, acc, g), loss + info.loss_sum,
              count + info.num_examples, clipped + info.num_clipped), None

    init = (zeros, jnp.zeros((), jnp.float32), jnp.zeros((), jnp.float32),
            jnp.zeros((), jnp.int32))
    first = jax.tree.map(lambda a: a[0], (arrays, mask))
    carry, _ = body(init, first)  # chunk 0 as straight-line code (XLA optimises it better)
    if mask.shape[0] > 1:
      carry, _ = jax.lax.scan(body, carry, jax.tree.map(lambda a: a[1:], (arrays, mask)))
    gsum, loss, count, clipped = carry
    if adaptive is not None:
      gsum = (gsum, adaptive_clipping.centered_unclipped_count(count, clipped))
      loss = loss * clip
    # Noise on the SUM, then / (q N): transforms.noisy_aggregate (paper 000 Eq. 4).
    updates, opt_state = tx.update(gsum, opt_state, params)
    return (optax.apply_updates(params, updates), opt_state,
            StepInfo(nonprivate_loss_sum=loss, nonprivate_num_examples=count,
                     nonprivate_num_clipped=clipped))

  return PrivateSGD(
      noise_multiplier=float(sigma), sample_rate=q, num_examples=n, expected_batch_size=expected,
      steps=t_planned, sensitivity=sensitivity, padded_size=padded, delta=delta,
      target_epsilon=target_epsilon,
      noise_stddev=(transforms.noise_stddev(grad_sigma, sensitivity) if noise_strategy is None else
                    correlated.noise_stddev(noise_strategy, t_planned, grad_sigma, sensitivity)),
      optimizer=tx, base_optimizer=base, clipped_grad_fn=grad_fn, batch_argnums=batch_argnums,
      accountant_method=accountant_method, unit=unit, allow_extra_steps=allow_extra_steps,
      _sample_key=run_keys.steps, _update=update, _opened=[], per_example_loss=per_example_loss,
      neighbouring=relation, _checkpointer=checkpointer, _checkpoint_every=checkpoint_every,
      _physical_batch_size=physical_batch_size, _overflow_prob=overflow_prob,
      _noise_key=run_keys.gradient_noise, noise_strategy=noise_strategy, _run_keys=run_keys,
      batch_selection=batch_selection,
      min_separation=1 if noise_strategy is None else b, _participation=participation,
      adaptive_clip_norm=adaptive, gradient_noise_multiplier=float(grad_sigma))


__all__ = ["DeviceBatch", "PaidSampler", "PoissonBatch", "PrivateBatch", "PrivateSGD", "PrivateState",
           "StepInfo", "make_private"]
