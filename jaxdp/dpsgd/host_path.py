"""The host execution of a private plan: the jitted update of a gathered, paid batch.

The host path draws each Poisson batch on the host (:class:`.PaidSampler`),
gathers its padded chunks (:meth:`~.batches.PoissonBatch.gather`) and hands
them to one jit-compiled update that

  1. sums the masked clipped per-example gradients of ALL chunks (gradient
     accumulation: exact for a batch that overflowed one chunk of size P),
  2. adds ``N(0, (sigma S)^2 I)`` once to the SUM and divides by ``q N``
     (paper ``000_tradeoffs_of_private_prediction.md`` Section 3.1
     Equation 4; :func:`~.transforms.noisy_aggregate`, or the plan's
     correlated / adaptive noise transform),
  3. applies the optax optimiser.

With an adaptive clip norm the gradients are clipped in units of the state's
current clip norm C_t and the centred unclipped count goes with the sum to
the noise transform (Andrew et al. 2021); per-layer, one clip norm and one
count per params leaf (the per-group counts are summed over the chunks). For data that does not fit on the
device; the device-resident form is :mod:`.device_path`.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxdp.dpsgd import _inputs, adaptive_clipping, sampling, user_sampling
from jaxdp.dpsgd.plan_state import PrivateState, StepInfo


def base_optimizer(optimizer: Any, learning_rate: float) -> optax.GradientTransformation:
  """The optimiser of the private average: ``optimizer`` (checked), or ``optax.sgd(learning_rate)``."""
  if optimizer is not None and not (hasattr(optimizer, "init") and hasattr(optimizer, "update")):
    raise TypeError(f"optimizer must be an optax GradientTransformation, got "
                    f"{type(optimizer).__name__}.")
  return optimizer if optimizer is not None else optax.sgd(learning_rate)


def adaptive_grad_fn(per_example_loss: Callable[..., Any], clip_template: Any, *,
                     batch_argnums: tuple, users: bool) -> Callable[[Any], Any]:
  """``clip_norm -> clipped-gradient function`` of an adaptive plan, in units of the clip norm.

  Flat: :func:`~.adaptive_clipping.adaptive_clipped_grad` (every example clipped to
  C_t and divided by it); per-layer (``clip_template.per_layer``): the same with
  the pytree of per-group C_t^l, divided by their Pythagorean sum D; users:
  :func:`~.user_sampling.adaptive_user_clipped_grad` (each user's gradient
  clipped to C_t and divided by it). All have sensitivity 1 (Andrew et al.
  2021 Alg. 1; McMahan et al. 2018 Sec. 3). ``clip_template`` is the plan's
  clipping template (:func:`.plan_clipping.build`): its method and microbatches.
  """
  if users:
    return lambda clip: user_sampling.adaptive_user_clipped_grad(
        per_example_loss, clip, batch_argnums=batch_argnums)
  method = getattr(clip_template, "method", None) or "auto"
  return lambda clip: adaptive_clipping.adaptive_clipped_grad(
      per_example_loss, clip, batch_argnums=batch_argnums,
      microbatch_size=clip_template.microbatch_size, method=method,
      per_layer=clip_template.per_layer)


def host_update(per_example_loss: Callable[..., Any], clip: Any,
                tx: optax.GradientTransformation, *, batch_selection: Any,
                donate_state: bool) -> Callable[..., Any]:
  """``update(params, opt_state, masked) -> (params, opt_state, StepInfo)``, jit-compiled.

  ``masked`` is the :class:`~.sampling.MaskedBatch` of a gathered batch:
  leaves ``(K, P, ...)`` and mask ``(K, P)``. ``clip`` is the plan's
  :class:`~.plan_clipping.Clipping` part (user-level clipping with a
  ``UserPoissonSampler`` ``batch_selection``).
  With an adaptive clip norm the step's clipped-gradient function is built
  from the state's current clip norm(s) (:func:`adaptive_grad_fn`);
  per-layer, the per-group clipped counts are summed over the chunks for the
  G noisy counts. ``donate_state``:
  the optimiser state is donated (a correlated-noise plan's noise history is
  then updated in place, not copied every step; the state a step consumed is
  never valid again anyway, since ``step`` refuses an old state).
  """
  donate = (1,) if donate_state else ()
  grad_fn, make_grad_fn = clip.grad_fn, None
  if clip.adaptive is not None:
    users = isinstance(batch_selection, user_sampling.UserPoissonSampler)
    make_grad_fn = adaptive_grad_fn(per_example_loss, grad_fn, batch_argnums=clip.batch_argnums,
                                    users=users)
  per_layer = make_grad_fn is not None and getattr(grad_fn, "per_layer", False)

  @functools.partial(jax.jit, donate_argnums=donate)
  def update(params, opt_state, masked):
    arrays, mask = masked.arrays, masked.mask  # leaves (K, P, ...), mask (K, P)
    step_grad_fn, clip_now = grad_fn, None
    if make_grad_fn is not None:  # clip to the current C_t, in units of C_t (adaptive_clipping)
      clip_now = opt_state[0].clip_norm
      step_grad_fn = make_grad_fn(clip_now)
    zeros = jax.tree.map(
        lambda p: jnp.zeros(jnp.shape(p), jnp.promote_types(jnp.result_type(p), jnp.float32)),
        params)

    def body(carry, chunk):
      acc, loss, count, clipped, groups = carry
      chunk_arrays, chunk_mask = chunk
      g, info = step_grad_fn(params, sampling.MaskedBatch(chunk_arrays, chunk_mask))
      if per_layer:
        groups = groups + info.num_clipped_per_group
      return (jax.tree.map(jnp.add, acc, g), loss + info.loss_sum,
              count + info.num_examples, clipped + info.num_clipped, groups), None

    n_groups = len(jax.tree.leaves(params)) if per_layer else 0
    init = (zeros, jnp.zeros((), jnp.float32), jnp.zeros((), jnp.float32),
            jnp.zeros((), jnp.int32), jnp.zeros((n_groups,), jnp.int32))
    first = jax.tree.map(lambda a: a[0], (arrays, mask))
    carry, _ = body(init, first)  # chunk 0 as straight-line code (XLA optimises it better)
    if mask.shape[0] > 1:
      carry, _ = jax.lax.scan(body, carry, jax.tree.map(lambda a: a[1:], (arrays, mask)))
    gsum, loss, count, clipped, groups = carry
    return noisy_update(tx, params, opt_state, gsum, loss, count, clipped, clip_now,
                        groups if per_layer else None)

  return update


def noisy_update(tx: optax.GradientTransformation, params: Any, opt_state: Any, gsum: Any,
                 loss: jax.Array, num: jax.Array, clipped: jax.Array, clip: Any,
                 group_clipped: Any = None) -> tuple:
  """Noises the clipped SUM ``gsum`` and applies the update: ``(params, opt_state, StepInfo)``.

  ``tx`` adds the noise to the SUM and divides by the expected batch size
  (:func:`~.transforms.noisy_aggregate`, paper 000 Eq. 4) before the base
  optimiser. With an adaptive clip norm (``clip``, the current C_t; None for
  a fixed one) the centred unclipped count goes with the sum to the count
  noise (Andrew et al. 2021) and the loss sum, computed in units of C_t, is
  rescaled. Per-layer adaptive (``group_clipped``: the (G,) examples clipped
  per group; ``clip`` the pytree of C_t^l): G centred counts, and the loss is
  in units of ``D = sqrt(sum_l (C_t^l)^2)``. Traced inside the host and the
  device updates.
  """
  if clip is not None:
    if group_clipped is None:
      unit = clip
      count = adaptive_clipping.centered_unclipped_count(num, clipped)
    else:
      unit, _ = adaptive_clipping.per_layer_normalisation(clip)
      count = adaptive_clipping.centered_unclipped_count(num, group_clipped)
    gsum = (gsum, count)
    loss = loss * unit
  updates, opt_state = tx.update(gsum, opt_state, params)
  return (optax.apply_updates(params, updates), opt_state,
          StepInfo(nonprivate_loss_sum=loss, nonprivate_num_examples=num,
                   nonprivate_num_clipped=clipped))


def step(plan: Any, params: Any, state: PrivateState, batch: Any, kept: str) -> tuple:
  """The update of a gathered :class:`~.batches.PrivateBatch`: ``(params, opt_state, info)``.

  Checks the model on one chunk's shapes (without touching the data) and the
  batch's labels against the model's classes first (``kept``: what a refusal
  says about the paid batch).
  """
  lead = 2 if isinstance(plan.batch_selection, user_sampling.UserPoissonSampler) else 1
  chunk = jax.tree.map(  # (P, ...) per chunk; users: (P * K, ...) examples
      lambda a: jax.ShapeDtypeStruct((int(np.prod(a.shape[1:lead + 1])),)
                                     + a.shape[lead + 1:], a.dtype), batch.masked.arrays)
  classes = plan._check_model(params, chunk, kept)  # pylint: disable=protected-access
  label = plan._label_position()  # pylint: disable=protected-access
  if label is not None:
    host_labels = batch._host_labels  # pylint: disable=protected-access
    _inputs.check_labels(host_labels, f"gather argument {label} (labels)", classes, kept)
  with warnings.catch_warnings():
    # A correlated-noise step donates its state; under jax.vmap (a batch of runs)
    # the donated buffers cannot be reused in place, which is harmless.
    warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
    return plan._update(params, state.opt_state, batch.masked)  # pylint: disable=protected-access


__all__ = ["base_optimizer", "host_update", "noisy_update", "step"]
