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
  steps paid so far, ``dpsgd_epsilon(sigma, q, t, delta)``; the accountant's
  ledger holds the same t steps (one merged entry ``t x PoissonSampled``).

Randomness: ``key`` is split exactly as :func:`.train.train_dpsgd` splits it
(``init, sampling, noise = split(key, 3)``; step t samples with
``split(sampling, T)[t]``), so the same key gives the same run as the built-in
loop. The noise key lives in the optimiser state and is split every step.
One plan is one training run: it opens one sampler (a second raises; make a
new plan with a fresh key for another run).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxdp import _validation
from jaxdp.accounting import dpsgd_accounting
from jaxdp.accounting import events
from jaxdp.errors import BudgetExceededError
from jaxdp.training.dpsgd import clipping, sampling, transforms

PyTree = Any

# Key for the sampling keys of steps beyond the planned T (allow_extra_steps=True):
# fold_in of the sampling key, a branch disjoint from split(sampling_key, T).
_EXTRA_STEPS_FOLD = 0x5EED


class PrivateState(NamedTuple):
  """State of a :class:`PrivateSGD` run: the optax state of ``PrivateSGD.optimizer``.

  ``opt_state[0]`` is the :class:`~.transforms.NoisyAggregateState` (the
  noise key, split every step, and the count of noisy updates applied).
  """

  opt_state: Any

  @property
  def step(self) -> jax.Array:
    """Number of noisy updates applied so far (int32 scalar on device)."""
    return self.opt_state[0].count


@dataclasses.dataclass(frozen=True)
class StepInfo:
  """NON-PRIVATE diagnostics of one step (never publish them unaccounted).

  They depend on individual examples: the realised batch size differs between
  add/remove neighbours, and the loss sum and clip count are unnoised sums over
  the batch. Their names say so (``nonprivate_*``, the library's rule for every
  value computed from private data without noise); ``loss_sum``,
  ``num_examples`` and ``num_clipped`` are read-only aliases kept for old code.

  Attributes:
    nonprivate_loss_sum: sum of the per-example losses of the batch (before the update).
    nonprivate_num_examples: realised Poisson batch size.
    nonprivate_num_clipped: examples whose gradient was scaled down.
  """

  nonprivate_loss_sum: jax.Array
  nonprivate_num_examples: jax.Array
  nonprivate_num_clipped: jax.Array

  @property
  def loss_sum(self) -> jax.Array:
    """Alias of ``nonprivate_loss_sum`` (NON-PRIVATE)."""
    return self.nonprivate_loss_sum

  @property
  def num_examples(self) -> jax.Array:
    """Alias of ``nonprivate_num_examples`` (NON-PRIVATE)."""
    return self.nonprivate_num_examples

  @property
  def num_clipped(self) -> jax.Array:
    """Alias of ``nonprivate_num_clipped`` (NON-PRIVATE)."""
    return self.nonprivate_num_clipped


jax.tree_util.register_dataclass(
    StepInfo,
    data_fields=["nonprivate_loss_sum", "nonprivate_num_examples", "nonprivate_num_clipped"],
    meta_fields=[])


class PoissonBatch:
  """The index chunks of one paid Poisson batch (host side); see :meth:`gather`.

  Attributes:
    step_index: the step this batch was paid for (0-based).
    chunks: list of :class:`~.sampling.PaddedBatch` of size P (more than one
      only when the batch overflowed P, or with a small ``physical_batch_size``).
  """

  def __init__(self, plan: "PrivateSGD", step_index: int, chunks: list[sampling.PaddedBatch]):
    self._plan = plan
    self.step_index = step_index
    self.chunks = chunks
    self._used = False

  @property
  def num_examples(self) -> int:
    """Realised batch size (NON-PRIVATE: do not publish it)."""
    return int(sum(c.num_examples for c in self.chunks))

  def gather(self, *arrays: Any) -> "PrivateBatch":
    """The batch's examples of ``arrays`` (dataset on the leading axis), stacked per chunk.

    One argument per batch argument of the per-example loss (``batch_argnums``),
    e.g. ``gather(x, y)``. Every array must have exactly ``num_examples`` rows
    (the N that q and ``q N`` were computed from) and finite floats.
    """
    plan = self._plan
    if len(arrays) != len(plan.batch_argnums):
      raise ValueError(f"gather needs {len(plan.batch_argnums)} arrays (one per batch argument "
                       f"of the loss, batch_argnums={plan.batch_argnums}), got {len(arrays)}.")
    for i, a in enumerate(arrays):
      for leaf in jax.tree.leaves(a):
        rows = np.shape(leaf)[0] if np.ndim(leaf) else None
        if rows != plan.num_examples:
          raise ValueError(
              f"gather argument {i} has {rows} rows but the plan was made for num_examples="
              f"{plan.num_examples}: q and the divisor q N would not match this dataset.")
    idx = np.stack([c.padded_indices for c in self.chunks])  # (K, P)
    mask = np.stack([c.mask for c in self.chunks])  # (K, P)
    # Index where the data lives (host numpy or device), then move only the batch.
    taken = tuple(jax.tree.map(lambda a: a[idx], a) for a in arrays)
    for i, a in enumerate(taken):
      for leaf in jax.tree.leaves(a):
        xp = np if isinstance(leaf, np.ndarray) else jnp
        if xp.issubdtype(leaf.dtype, np.inexact) and not bool(xp.all(xp.isfinite(leaf))):
          raise ValueError(f"gather argument {i} holds NaN or inf values in the sampled rows; "
                           "a non-finite example breaks the clipping bound.")
    taken = jax.tree.map(jnp.asarray, taken)
    return PrivateBatch(self, sampling.MaskedBatch(taken, jnp.asarray(mask)))


class PrivateBatch:
  """A gathered :class:`PoissonBatch`: stacked chunks ``(K, P, ...)`` with their ``(K, P)`` mask.

  The only batch type :meth:`PrivateSGD.step` accepts; usable once.
  """

  def __init__(self, ticket: PoissonBatch, masked: sampling.MaskedBatch):
    self._ticket = ticket
    self.masked = masked

  @property
  def step_index(self) -> int:
    return self._ticket.step_index

  @property
  def num_chunks(self) -> int:
    return int(self.masked.mask.shape[0])


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

  def __init__(self, plan: "PrivateSGD", accountant: Any, start_step: int):
    if not hasattr(accountant, "spend"):
      raise TypeError("accountant must be a PrivacyAccountant or PrivacyBudget (anything with "
                      f"spend(event, count)), got {type(accountant).__name__}.")
    self._plan = plan
    self.accountant = accountant
    self.steps_paid = start_step
    self.steps_sampled = start_step
    self._poisson = sampling.PoissonSampler(plan.num_examples, plan.sample_rate,
                                            padded_size=plan.padded_size, on_overflow="split")
    self._keys = jax.random.split(plan._sample_key, plan.steps)  # pylint: disable=protected-access

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
    plan = self._plan
    if not plan.allow_extra_steps and self.steps_paid + steps > plan.steps:
      raise BudgetExceededError(
          f"paying {steps} more step(s) would exceed the {plan.steps} steps this plan was "
          f"calibrated for (paid so far: {self.steps_paid}); pass allow_extra_steps=True to "
          "make_private to run (and account) more. Nothing was spent.")
    try:
      self.accountant.spend(plan.step_event(), count=steps)
    except BudgetExceededError as err:
      raise BudgetExceededError(
          f"the accountant cannot pay {steps} DP-SGD step(s) (q={plan.sample_rate}, "
          f"noise_multiplier={plan.noise_multiplier}); nothing was sampled or spent. ({err})"
      ) from err
    self.steps_paid += steps

  def _key(self, t: int) -> jax.Array:
    if t < self._plan.steps:
      return self._keys[t]
    return jax.random.fold_in(jax.random.fold_in(self._plan._sample_key, _EXTRA_STEPS_FOLD), t)  # pylint: disable=protected-access

  def sample(self) -> PoissonBatch:
    """The next step's Poisson batch (index chunks); pays one step first if none is prepaid."""
    if self.steps_sampled >= self.steps_paid:
      self.pay(1)
    t = self.steps_sampled
    chunks = self._poisson.sample(self._key(t))
    self.steps_sampled += 1
    return PoissonBatch(self._plan, t, chunks)

  def epsilon(self, delta: float | None = None) -> float:
    """Epsilon of the DP-SGD steps paid so far (at the plan's ``delta`` by default)."""
    return self._plan.epsilon(self.steps_paid, delta)


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
    noise_stddev: ``sigma * S``.
    optimizer: the optax transform ``chain(noisy_aggregate(sigma, S, q N, noise_key), base)``
      (expects the clipped SUM; :meth:`step` feeds it).
    base_optimizer: the optax optimiser applied to the private average.
    clipped_grad_fn: the :func:`~.clipping.clipped_grad` function (``.sensitivity``).
    batch_argnums: batch arguments of the per-example loss.
    accountant_method: ``"rdp"`` or ``"pld"``.
    unit: the privacy unit of the events.
    allow_extra_steps: whether steps beyond T may be paid.
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

  def init(self, params: PyTree) -> PrivateState:
    """The optimiser state for ``params`` (noise key, step count 0, base optimiser state)."""
    return PrivateState(self.optimizer.init(params))

  def sampler(self, accountant: Any, *, start_step: int = 0) -> PaidSampler:
    """The plan's batch source, paying each step on ``accountant`` before sampling it.

    Args:
      accountant: a ``PrivacyAccountant`` or ``PrivacyBudget`` (required: a
        batch without a ledger entry cannot exist).
      start_step: resume a run after ``start_step`` steps that were already
        paid (e.g. on a persistent ``PrivacyBudget``) and applied to the
        checkpointed state; sampling continues with that step's key.
    """
    start = int(start_step) if not isinstance(start_step, bool) else -1
    if start < 0 or (start > self.steps and not self.allow_extra_steps):
      raise ValueError(f"start_step must be in [0, steps={self.steps}], got {start_step!r}.")
    sampler = PaidSampler(self, accountant, start)  # validates the accountant first
    if self._opened:
      raise ValueError("this plan already opened its sampler: one plan is one training run "
                       "(a second sampler would reuse its sampling and noise keys). Call "
                       "make_private again with a fresh key for another run.")
    self._opened.append(True)
    return sampler

  def step_event(self) -> events.DpEvent:
    """The event of ONE step: ``PoissonSampled(q, Gaussian(sigma))``, add/remove, ``unit``."""
    if self.noise_multiplier == 0.0:
      return events.NonPrivateDpEvent()
    return events.PoissonSampledDpEvent(
        self.sample_rate,
        events.GaussianDpEvent(self.noise_multiplier, neighbouring=events.ADD_REMOVE,
                               unit=self.unit))

  def epsilon(self, steps: int, delta: float | None = None) -> float:
    """``dpsgd_epsilon(sigma, q, steps, delta)`` (0 for 0 steps, inf for sigma = 0)."""
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
    return dpsgd_accounting.dpsgd_epsilon(self.noise_multiplier, self.sample_rate, steps,
                                          delta, self.accountant_method)

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
        step index is not the state's step count.
    """
    if not isinstance(batch, PrivateBatch):
      raise TypeError(
          f"step accepts only a PrivateBatch from sampler.sample().gather(...), got "
          f"{type(batch).__name__}: a raw batch has no mask for its padding and no paid "
          "ledger entry, and a fixed-size batch is not the Poisson sample the accountant assumes.")
    ticket = batch._ticket  # pylint: disable=protected-access
    if ticket._plan is not self:  # pylint: disable=protected-access
      raise ValueError("this batch was sampled by another plan (another q, N, P or key).")
    if ticket._used:  # pylint: disable=protected-access
      raise ValueError(f"the batch of step {ticket.step_index} was already used for an update; "
                       "every update needs a freshly sampled (and paid) batch.")
    if isinstance(state, PrivateState):
      current = int(state.step)
    else:
      raise TypeError(f"state must be the PrivateState from init(), got {type(state).__name__}.")
    if current != ticket.step_index:
      raise ValueError(
          f"the batch was paid for step {ticket.step_index} but the state has applied "
          f"{current} updates: reusing an old state would reuse its noise key.")
    ticket._used = True  # pylint: disable=protected-access
    params, opt_state, info = self._update(params, state.opt_state, batch.masked)
    return params, PrivateState(opt_state), info


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
) -> PrivateSGD:
  """Wires clipping, Poisson sampling, noise, optimiser and accounting for a custom loop.

  In the spirit of Opacus' ``make_private`` / ``make_private_with_epsilon``
  and JAX Privacy's training config, but pure-functional: nothing is wrapped
  or mutated except the accountant you pass to :meth:`PrivateSGD.sampler`.

  Privacy: with ``target_epsilon``, sigma is the smallest noise multiplier
  (``calibrate_noise_multiplier``, float64) for which T steps of Poisson rate
  q are (target_epsilon, delta)-DP for add/remove neighbours of one ``unit``;
  with ``noise_multiplier``, epsilon is reported for the steps actually paid.
  N is treated as public (q and ``q N`` are computed from it), as in
  :func:`.train.train_dpsgd`, Opacus and TF Privacy.

  Args:
    per_example_loss: ``(params, *example) -> scalar`` loss of ONE example,
      e.g. ``make_per_example_loss(apply)`` for a Flax model.
    l2_clip_norm: clip norm (per-group norms with ``per_layer``); must be
      finite unless ``noise_multiplier=0``.
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
    accountant_method: ``"rdp"`` or ``"pld"`` for calibration and epsilon.
    unit: privacy unit of the events (default ``"example"``).
    allow_extra_steps: allow paying (and running) more than T steps; each is
      accounted, so epsilon grows past the target.

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
  q = sampling.resolve_sample_rate(sample_rate, expected_batch_size, n)
  if (epochs is None) == (steps is None):
    raise ValueError("give exactly one of epochs or steps.")
  t_planned = (dpsgd_accounting.steps_for_epochs(epochs, q) if steps is None
               else _validation.check_positive_int(steps, "steps"))
  if accountant_method not in ("rdp", "pld"):
    raise ValueError(f"accountant_method must be 'rdp' or 'pld', got {accountant_method!r}.")
  if delta is not None:
    delta = _validation.check_delta(delta, allow_zero=False)
  sigma = dpsgd_accounting.resolve_noise_multiplier(target_epsilon, noise_multiplier, delta, q,
                                                    t_planned, accountant=accountant_method)
  unit = events.check_unit(unit)
  if not isinstance(allow_extra_steps, bool):
    raise TypeError(f"allow_extra_steps must be a bool, got {allow_extra_steps!r}.")
  if isinstance(batch_argnums, int):
    batch_argnums = (batch_argnums,)
  batch_argnums = tuple(int(a) for a in batch_argnums)

  grad_fn = clipping.clipped_grad(per_example_loss, l2_clip_norm=l2_clip_norm,
                                  batch_argnums=batch_argnums, microbatch_size=microbatch_size,
                                  per_layer=per_layer, method=clipping_method)
  sensitivity = float(grad_fn.sensitivity)
  if sigma > 0 and math.isinf(sensitivity):
    raise ValueError("l2_clip_norm must be finite for private training (noise_multiplier > 0).")
  # Validates physical_batch_size / overflow_prob and fixes P once.
  padded = sampling.PoissonSampler(n, q, padded_size=physical_batch_size,
                                   overflow_prob=overflow_prob, on_overflow="split").padded_size
  _, sample_key, noise_key = jax.random.split(key, 3)
  expected = q * n
  base = optimizer if optimizer is not None else optax.sgd(learning_rate)
  tx = optax.chain(transforms.noisy_aggregate(sigma, sensitivity, expected, noise_key), base)

  @jax.jit
  def update(params, opt_state, masked):
    arrays, mask = masked.arrays, masked.mask  # leaves (K, P, ...), mask (K, P)
    zeros = jax.tree.map(
        lambda p: jnp.zeros(jnp.shape(p), jnp.promote_types(jnp.result_type(p), jnp.float32)),
        params)

    def body(carry, chunk):
      acc, loss, count, clipped = carry
      chunk_arrays, chunk_mask = chunk
      g, info = grad_fn(params, sampling.MaskedBatch(chunk_arrays, chunk_mask))
      return (jax.tree.map(jnp.add, acc, g), loss + info.loss_sum,
              count + info.num_examples, clipped + info.num_clipped), None

    init = (zeros, jnp.zeros((), jnp.float32), jnp.zeros((), jnp.float32),
            jnp.zeros((), jnp.int32))
    (gsum, loss, count, clipped), _ = jax.lax.scan(body, init, (arrays, mask))
    # Noise on the SUM, then / (q N): transforms.noisy_aggregate (paper 000 Eq. 4).
    updates, opt_state = tx.update(gsum, opt_state, params)
    return (optax.apply_updates(params, updates), opt_state,
            StepInfo(nonprivate_loss_sum=loss, nonprivate_num_examples=count,
                     nonprivate_num_clipped=clipped))

  return PrivateSGD(
      noise_multiplier=float(sigma), sample_rate=q, num_examples=n, expected_batch_size=expected,
      steps=t_planned, sensitivity=sensitivity, padded_size=padded, delta=delta,
      target_epsilon=target_epsilon, noise_stddev=transforms.noise_stddev(sigma, sensitivity),
      optimizer=tx, base_optimizer=base, clipped_grad_fn=grad_fn, batch_argnums=batch_argnums,
      accountant_method=accountant_method, unit=unit, allow_extra_steps=allow_extra_steps,
      _sample_key=sample_key, _update=update, _opened=[])


__all__ = ["PaidSampler", "PoissonBatch", "PrivateBatch", "PrivateSGD", "PrivateState",
           "StepInfo", "make_private"]
