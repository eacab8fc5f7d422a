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
noise), so the same key gives the same run as the built-in loop. The noise key
lives in the optimiser state and is split every step.
One plan is one training run: it opens one sampler (a second raises; make a
new plan with a fresh key for another run).

The plan is assembled from parts, each checking its own arguments once:
batch selection (:mod:`.plan_selection`: Poisson, cyclic Poisson, fixed-size,
user-level), clipping (:mod:`.plan_clipping`), noise (:mod:`.plan_noise`:
independent, BandMF, BLT, adaptive clip noise), accounting
(:mod:`.plan_accounting`: the calibration and the run's one DpEvent, derived
from the parts) and execution (:mod:`.host_path`, :mod:`.device_path`,
:mod:`.paid_sampler`, :mod:`.plan_checkpoints`). :func:`make_private` is the
builder over them; :class:`PrivateSGD` (:mod:`.private_sgd`) holds the result.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import optax

from jaxdp import _validation
from jaxdp.accounting import events
from jaxdp.dpsgd import (checkpointing, host_path, plan_accounting, plan_checkpoints,
                         plan_clipping, plan_noise, plan_selection)
from jaxdp.dpsgd import keys as keys_lib
from jaxdp.dpsgd.batches import DeviceBatch, PoissonBatch, PrivateBatch
from jaxdp.dpsgd.paid_sampler import PaidSampler
from jaxdp.dpsgd.plan_state import PrivateState, StepInfo
from jaxdp.dpsgd.private_sgd import PrivateSGD


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
      by checkpoints). Host or device data, with or without correlated noise,
      any batch selection; flat or, with ``per_layer=True``, one clip norm,
      one target quantile and one noisy count per params leaf (G read from
      the params at :meth:`PrivateSGD.init`; the G counts share sigma with
      the gradient, ``per_layer_gradient_noise_multiplier``; not with users).
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
      Either works with fixed or adaptive clip norms and with correlated noise
      (then b = 1, the sampler's batches, and the run's event is that of the
      matrix mechanism WITHOUT amplification, every unit in up to all T
      steps: ``FixedSizeSampler.mf_event`` / ``UserPoissonSampler.mf_event``;
      one band: DP-SGD's event). An adaptive clip norm leaves every event
      unchanged (its split makes gradient and counts cost sigma together:
      ``FixedSizeSampler.adaptive_event``, ``UserPoissonSampler.adaptive_event``).
      Fixed-size batches also take ``per_layer`` and ``microbatch_size``.

  Cells (selection x clip x noise; host or device, 1 or 2 processes,
  checkpoints: all work alike):

  * working: Poisson, cyclic Poisson and fixed-size x {fixed, adaptive,
    per-layer (fixed or adaptive)} x {independent, BandMF, BLT}; users x
    {fixed, adaptive} x {independent, BandMF, BLT};
  * refused, with the reason in the error: ``min_separation > 1`` with a
    ``batch_selection`` sampler (it guarantees no separation between two
    participations; amplified banded MF needs b-min-separated cyclic Poisson
    sampling, Choquette-Choo et al. 2023 Thm 4: a cyclic fixed-size or user
    sampler would be needed); fixed-size with ``neighbouring="add_remove"``
    (N is public and the subset's law depends on it; the bounds are
    replace-one); fixed-size with ``accountant_method="pld"`` when the event
    is sampled without replacement (independent or adaptive noise, one-band
    MF: dp_accounting has no PLD of it; RDP works); ``per_layer`` or
    ``microbatch_size`` with users (user-level clipping has neither mode), so
    per-layer adaptive clipping with users too.

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
  base = host_path.base_optimizer(optimizer, learning_rate)
  delta = plan_accounting.check_arguments(delta, allow_extra_steps)
  checkpoint_every = checkpointing.check_arguments(checkpoint_dir, checkpoint_every)
  plan_noise.check_strategy(noise_strategy, allow_extra_steps)
  selection = plan_selection.resolve(
      num_examples, sample_rate=sample_rate, expected_batch_size=expected_batch_size,
      epochs=epochs, steps=steps, neighbouring=neighbouring, accountant_method=accountant_method,
      unit=unit, batch_selection=batch_selection, noise_strategy=noise_strategy,
      min_separation=min_separation,
      refused=dict(per_layer=per_layer, microbatch_size=microbatch_size))
  clip = plan_clipping.build(per_example_loss, l2_clip_norm, batch_argnums=batch_argnums,
                             microbatch_size=microbatch_size, per_layer=per_layer,
                             clipping_method=clipping_method, batch_selection=batch_selection)
  run_keys = keys_lib.derive(key)
  selection = plan_selection.with_chunks(selection, physical_batch_size=physical_batch_size,
                                         overflow_prob=overflow_prob, group_key=run_keys.groups)
  # Calibration last: the slow part (seconds), after every cheap check.
  sigma = plan_accounting.calibrate(selection, noise_strategy, target_epsilon=target_epsilon,
                                    noise_multiplier=noise_multiplier, delta=delta,
                                    accountant_method=accountant_method)
  noise = plan_noise.build(noise_strategy, clip.adaptive, sigma=sigma,
                           sensitivity=clip.sensitivity, selection=selection, run_keys=run_keys,
                           per_layer=clip.grad_fn.per_layer)
  checkpointer, checkpoint_every = plan_checkpoints.run_checkpointer(
      checkpoint_dir, checkpoint_every, key=key, selection=selection, clip=clip, noise=noise,
      noise_multiplier=sigma, noise_strategy=noise_strategy, accountant_method=accountant_method)
  tx = optax.chain(noise.transform, base)
  update = host_path.host_update(
      per_example_loss, clip, tx, batch_selection=batch_selection,
      donate_state=noise_strategy is not None and bool(noise_strategy.state_size))
  return PrivateSGD(
      noise_multiplier=float(sigma), sample_rate=selection.sample_rate, steps=selection.steps,
      num_examples=selection.num_examples, expected_batch_size=selection.expected_batch_size,
      sensitivity=clip.sensitivity, padded_size=selection.padded_size, delta=delta,
      target_epsilon=target_epsilon, noise_stddev=noise.noise_stddev, optimizer=tx,
      base_optimizer=base, clipped_grad_fn=clip.grad_fn, batch_argnums=clip.batch_argnums,
      accountant_method=accountant_method, unit=selection.unit, _opened=[], _update=update,
      allow_extra_steps=allow_extra_steps, _sample_key=run_keys.steps, _run_keys=run_keys,
      _noise_key=run_keys.gradient_noise, per_example_loss=per_example_loss,
      neighbouring=selection.neighbouring, _checkpointer=checkpointer,
      _checkpoint_every=checkpoint_every, _physical_batch_size=physical_batch_size,
      _overflow_prob=overflow_prob, noise_strategy=noise_strategy, batch_selection=batch_selection,
      min_separation=selection.min_separation, _participation=selection.participation,
      adaptive_clip_norm=clip.adaptive, _noise_split=noise.split,
      gradient_noise_multiplier=float(noise.gradient_noise_multiplier))


__all__ = ["DeviceBatch", "PaidSampler", "PoissonBatch", "PrivateBatch", "PrivateSGD", "PrivateState",
           "StepInfo", "make_private"]
