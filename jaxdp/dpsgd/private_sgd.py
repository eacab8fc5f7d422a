"""The plan of a private training run: :class:`PrivateSGD`, its parts wired together.

A :class:`PrivateSGD` holds the resolved parts of one run -- batch selection
(:mod:`.plan_selection`), clipping (:mod:`.plan_clipping`), noise
(:mod:`.plan_noise`), accounting (:mod:`.plan_accounting`) and execution
(host :mod:`.host_path` or device :mod:`.device_path`, checkpoints
:mod:`.plan_checkpoints`) -- and the rules that keep them consistent:
batches come only from its :class:`~.paid_sampler.PaidSampler` (paid before
they exist), :meth:`PrivateSGD.step` accepts only those batches, in the order
they were paid, each once, and the epsilon it reports is that of the steps
paid, by the analysis the noise was calibrated with. :func:`.make_private`
builds it from one set of arguments; the methods here check the per-call
inputs and delegate the work to the parts.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import numpy as np
import optax

from jaxdp.accounting import events
from jaxdp.dpsgd import (_inputs, adaptive_clipping, clipping, device_path, host_path,
                         paid_sampler, plan_accounting, plan_checkpoints)
from jaxdp.dpsgd.batches import DeviceBatch, PrivateBatch
from jaxdp.dpsgd.plan_state import PrivateState, StepInfo

PyTree = Any


@dataclasses.dataclass(frozen=True, eq=False)
class PrivateSGD:
  """Everything a custom DP-SGD loop needs, from one place (see :func:`.make_private`).

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
      (Andrew et al. 2021 Thm 1), so that both together cost ``noise_multiplier``. With
      per-layer adaptive clipping the split depends on the number G of clip groups (params
      leaves), known at :meth:`init`: until then the value for one group, after it the
      value for the G of the params given (``noise_stddev`` likewise).
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
  _noise_split: Any = dataclasses.field(default=None, repr=False)

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
    ledger is written by process 0 under a POSIX file lock), and process 0's
    reading of the ledger decides for every process what is replayed from
    which step (:func:`.plan_checkpoints.ledger_view`).
    """
    return plan_checkpoints.restore(self, params, step=step, data=data)

  def _skip_to_unpaid(self, params: PyTree, state: PrivateState,
                      paid: int) -> tuple[PyTree, PrivateState]:
    """State that continues at slot ``paid`` with a noise key no earlier step used."""
    return plan_checkpoints.skip_to_unpaid(self, params, state, paid)

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
    """The optimiser state for ``params`` (noise key, step count 0, base optimiser state).

    Per-layer adaptive clipping: G = the number of params leaves (one clip norm,
    one quantile and one noisy count each); the noise transform splits sigma for
    that G (a ValueError naming ``num_groups`` and ``count_noise_multiplier`` when
    the G counts alone would cost more than sigma, before any noise exists), and
    ``gradient_noise_multiplier`` / ``noise_stddev`` report that split.
    """
    state = PrivateState(self.optimizer.init(params))
    if self._noise_split is not None:
      grad_sigma, _, stddev = self._noise_split(len(jax.tree.leaves(params)))
      # G is known only now; the plan reports the split its transform uses.
      object.__setattr__(self, "gradient_noise_multiplier", float(grad_sigma))
      object.__setattr__(self, "noise_stddev", float(stddev))
    return state

  def sampler(self, accountant: Any, *, start_step: int | None = None, data: Any = None,
              mesh: Any = None) -> paid_sampler.PaidSampler:
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
        follow (:func:`.paid_sampler._spend_once`).
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
    return paid_sampler.open_sampler(self, accountant, start_step=start_step, data=data,
                                     mesh=mesh)

  def _device_path(self, data: Any, mesh: Any) -> tuple:
    """Checks and places ``data``; builds the jitted sample-and-update (:func:`.device_path.build`)."""
    return device_path.build(self, data, mesh)

  def step_event(self) -> events.DpEvent:
    """The event of ONE step: :func:`~jaxdp.accounting.dpsgd_event` with one step.

    ``PoissonSampled(q, Gaussian(sigma))`` tagged add/remove, or
    ``PoissonSampled(q, Gaussian(sigma / 2))`` tagged replace-one (noise over the
    replace-one sensitivity ``2S``), for ``unit``.
    """
    return plan_accounting.step_event(self)

  def clip_norm(self, state: PrivateState) -> Any:
    """The clip norm the next step uses: fixed, or C_t of an adaptive ``l2_clip_norm``.

    A float for flat clipping (and for per-layer clipping with one float C, the
    C split evenly over the leaves). Per-layer with per-group norms: the pytree
    given, as floats. Per-layer ADAPTIVE clipping: the per-group C_t^l as a
    pytree of floats with the structure of params (one group per leaf). C_t is
    public (a function of the noisy unclipped counts only; Andrew et al. 2021).
    """
    if self.adaptive_clip_norm is None:
      clip = self.clipped_grad_fn.l2_clip_norm
    else:
      clip = adaptive_clipping.current_clip_norm(state.opt_state)
    if jax.tree_util.treedef_is_leaf(jax.tree.structure(clip)):
      return float(clip)
    return jax.tree.map(float, clip)

  def run_event(self) -> events.DpEvent:
    """The DpEvent of the whole run: ``T x step_event()``, or the correlated-noise run's event.

    With ``noise_strategy``: :func:`jaxdp.dpsgd.correlated.mf_event` (amplified
    BandMF: ``k x PoissonSampled(p, Gaussian(sigma))``; otherwise one Gaussian of
    the strategy's (k, b)-participation sensitivity), what the sampler pays once.
    """
    return plan_accounting.run_event(self)

  def guarantee(self, steps: int, delta: float | None = None) -> Any:
    """:meth:`epsilon` as a ``PrivacyGuarantee`` (``neighbouring``, ``unit``, ``accountant_method``).

    The one number to report for the run: the method is the calibration's, and
    ``accountant.get_epsilon(delta, private.accountant_method)`` on the ledger
    gives the same value (the ledger's default ``"auto"`` takes the smallest of
    all its sound bounds and can be smaller).
    """
    return plan_accounting.guarantee(self, steps, delta)

  def epsilon(self, steps: int, delta: float | None = None) -> float:
    """``dpsgd_epsilon(sigma, q, steps, delta, accountant_method)`` (0 steps: 0; sigma = 0: inf)."""
    return plan_accounting.epsilon(self, steps, delta)

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
      path = device_path if isinstance(batch, DeviceBatch) else host_path
      params, opt_state, info = path.step(self, params, state, batch, kept)
    except (TypeError, ValueError):
      ticket._refused()  # pylint: disable=protected-access  (no-op for a used batch)
      raise
    ticket._used = True  # pylint: disable=protected-access
    new_state = PrivateState(opt_state)
    new_state._known_step = ticket.step_index + 1  # pylint: disable=protected-access
    self._after_step(params, new_state, ticket.step_index + 1)
    return params, new_state, info


__all__ = ["PrivateSGD"]
