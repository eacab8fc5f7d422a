"""The optax core of adaptive clipping: its state, the count noise and the clip-norm step.

One update of Andrew, Thakkar, McMahan & Ramaswamy 2021 (Algorithm 1) takes
the pair ``(normalised clipped gradient sum, centered unclipped count)``:

1. the gradient sum goes through the inner noise transform (sensitivity 1,
   noise std sigma_Delta, divided by ``qN``) and is multiplied by the public
   unit (C_t flat; ``D = sqrt(sum_l C_l^2)`` per layer) -- post-processing;
2. the count (one per clip group per layer) gets Gaussian noise of std
   sigma_b (:func:`jaxdp.mechanisms.gaussian_noise`, std rounded up to
   float32) from the state's own key, split every step;
3. the clip norm(s) move by the geometric update of
   :mod:`jaxdp.dpsgd.adaptive_clip_norm` from the NOISY count only.

The clip norm of the next step is thus a function of earlier noisy releases
only (public, safe to log), and the two noises draw from disjoint keys (the
state refuses an inner transform holding the count key). The noise scales
are decided elsewhere (:mod:`jaxdp.dpsgd.adaptive_accounting`) and the
transforms users build are in :mod:`jaxdp.dpsgd.adaptive_noise`; this module
is the shared mechanics of the flat and per-layer variants.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxdp import _validation
from jaxdp import mechanisms
from jaxdp.dpsgd import clipping, transforms
from jaxdp.dpsgd.adaptive_clip_norm import AdaptiveClipNorm, _geometric_update
from jaxdp.dpsgd.adaptive_grad import per_layer_normalisation


class AdaptiveClipState(NamedTuple):
  """State of :func:`~jaxdp.dpsgd.adaptive_noise.adaptive_clip_noise` (and the per-layer variant).

  Attributes:
    inner: the inner noise transform's state (its own noise key).
    clip_norm: C_t, the clip norm of the NEXT update (float32 scalar). Public:
      a function of the noisy counts only, safe to log.
    key: ``jax.random`` key of the count noise, split every step.
    count: number of updates applied (int32), the step counter.
  """

  inner: Any
  clip_norm: jax.Array
  key: jax.Array
  count: jax.Array


def current_clip_norm(state: Any) -> jax.Array:
  """C_t from an :class:`AdaptiveClipState` or an optax chain state whose first entry is one."""
  if isinstance(state, AdaptiveClipState):
    return state.clip_norm
  if isinstance(state, (tuple, list)) and state and isinstance(state[0], AdaptiveClipState):
    return state[0].clip_norm
  raise TypeError(f"expected an AdaptiveClipState or an optax.chain state starting with one, got "
                  f"{type(state).__name__}.")


def reseed_state(state: AdaptiveClipState, key: jax.Array, count: int) -> AdaptiveClipState:
  """``state`` continuing at step ``count`` with fresh keys for BOTH noises.

  For resuming from an older checkpoint when later steps were already run
  with the checkpoint's keys: replacing only ``state.key`` would leave the
  inner (gradient) noise key as it was, and the replayed steps would reuse its
  noise. The count key becomes ``fold_in(key, 0)``, the inner key
  ``fold_in(key, 1)``; ``count`` is set on both. The inner state must have
  ``key`` and ``count`` fields (``NoisyAggregateState`` does). The clip norm
  is kept (it is public).
  """
  if not isinstance(state, AdaptiveClipState):
    raise TypeError(f"state must be an AdaptiveClipState, got {type(state).__name__}.")
  _validation.check_key(key)
  inner = state.inner
  if not all(hasattr(inner, f) for f in ("key", "count", "_replace")):
    raise TypeError(f"the inner state {type(inner).__name__} has no key/count fields to reseed.")
  inner = inner._replace(key=jax.random.fold_in(key, 1),
                         count=jnp.asarray(count, jnp.asarray(inner.count).dtype))
  return state._replace(inner=inner, key=jax.random.fold_in(key, 0),
                        count=jnp.asarray(count, state.count.dtype))


def _key_data(key: Any) -> np.ndarray | None:
  """Host copy of a concrete key's bits (None when traced)."""
  if _validation._is_tracer(key):  # pylint: disable=protected-access
    return None
  with jax.ensure_compile_time_eval():  # a concrete key stays concrete inside jit
    if jax.dtypes.issubdtype(jnp.asarray(key).dtype, jax.dtypes.prng_key):
      key = jax.random.key_data(key)
  if _validation._is_tracer(key):  # pylint: disable=protected-access
    return None
  return np.asarray(key)



def _check_pair(updates: Any, count_shape: tuple) -> tuple[Any, jax.Array]:
  if not isinstance(updates, (tuple, list)) or len(updates) != 2:
    got = type(updates).__name__
    if isinstance(updates, (tuple, list)):
      got += f" of length {len(updates)}"
    raise TypeError("adaptive_clip_noise's update takes the pair (normalised clipped gradient "
                    f"sum, centered unclipped count), got a {got}.")
  grad_sum, centered = updates
  centered = jnp.asarray(centered)
  if centered.shape != count_shape:
    what = "a scalar" if count_shape == () else f"of shape {count_shape} (one per clip group)"
    raise ValueError(f"the centered unclipped count (second entry of updates) must be {what}, "
                     f"got shape {centered.shape}.")
  if not (jnp.issubdtype(centered.dtype, jnp.floating)
          or jnp.issubdtype(centered.dtype, jnp.integer)):
    raise TypeError(f"the centered unclipped count must be a real number, got dtype "
                    f"{centered.dtype}.")
  return grad_sum, centered


def _adaptive_wrapper(inner: Any, config: AdaptiveClipNorm, *, qn: float, key: jax.Array,
                      sigma_b: float, groups: Any, per_layer: bool) -> optax.GradientTransformation:
  """The transform of the flat and per-layer wrappers (module docstring).

  ``inner``: the built noise transform of the gradient sum (sensitivity 1);
  ``sigma_b``: the std of each count's noise; ``groups``: None or the per-layer
  initial clip norms (a prefix of params), read only with ``per_layer``.
  """
  _validation.check_key(key)
  dtype = jnp.float32
  std_b = transforms._round_up(sigma_b, dtype)  # pylint: disable=protected-access
  initial = np.asarray(config.initial, np.float32)

  def initial_clip_norms(params):
    if not per_layer:
      return jnp.asarray(initial)
    if groups is None:
      return jax.tree.map(lambda _: jnp.asarray(initial), params)
    clipping.leaf_groups(params, True, groups, False)  # named error for a wrong structure
    return jax.tree.map(lambda c: jnp.asarray(np.float32(c)), groups)

  def init_fn(params):
    inner_state = inner.init(params)
    inner_key = getattr(inner_state, "key", None)
    if inner_key is not None:
      a, b = _key_data(inner_key), _key_data(key)
      if a is not None and b is not None and a.shape == b.shape and np.array_equal(a, b):
        raise ValueError("the inner noise transform and adaptive_clip_noise were given the same "
                         "key: the gradient and count noises would share randomness. Split the "
                         "key (jax.random.split(key)) and give each its own part.")
    return AdaptiveClipState(inner=inner_state, clip_norm=initial_clip_norms(params),
                             key=key, count=jnp.zeros((), jnp.int32))

  def update_fn(updates, state, params=None):
    clip_leaves, clip_def = jax.tree.flatten(state.clip_norm)
    shape = (len(clip_leaves),) if per_layer else ()
    grad_sum, centered = _check_pair(updates, shape)
    noisy_avg, inner_state = inner.update(grad_sum, state.inner, params)
    if per_layer:
      unit, _ = per_layer_normalisation(state.clip_norm)
      clip = jnp.stack([jnp.asarray(x, dtype) for x in clip_leaves])
    else:
      unit = clip = jnp.asarray(state.clip_norm, dtype)
    out = jax.tree.map(lambda u: u * unit.astype(u.dtype), noisy_avg)
    next_key, noise_key = jax.random.split(state.key)
    noisy = centered.astype(dtype) + mechanisms.gaussian_noise(noise_key, shape, std_b, dtype)
    new_clip = _geometric_update(config, clip, noisy, qn)
    if per_layer:
      new_clip = jax.tree.unflatten(clip_def, list(new_clip))
    return out, AdaptiveClipState(inner_state, new_clip, next_key, state.count + 1)

  return optax.GradientTransformation(init_fn, update_fn)


__all__ = ["AdaptiveClipState", "current_clip_norm", "reseed_state"]
