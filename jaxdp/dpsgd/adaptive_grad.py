"""Adaptive clipping's gradient side: clipped sums in units of the clip norm, and the counts.

Andrew, Thakkar, McMahan & Ramaswamy 2021 (Algorithm 1) clip every
per-example gradient to the current clip norm C_t and noise the sum with a
std proportional to C_t. Working in NORMALISED space makes the noise
independent of C_t: each clipped gradient is divided by C_t,
``gbar_i = (g_i / C_t) min(1, C_t / ||g_i||)``, so the sum has L2 sensitivity
1 whatever C_t is, and the noise transform is built once for sensitivity 1.

* :func:`adaptive_clipped_grad` -- that sum (clip FIRST, so ``g_i / C_t`` is
  never formed for an unclipped ``g_i``, which could overflow for a small
  C_t), flat or per clip group, with every clipping method of
  :mod:`jaxdp.dpsgd.clipping` and a traced C_t;
* :func:`per_layer_normalisation` -- per-layer clip norms C_l share one unit
  ``D >= sqrt(sum_l C_l^2)`` (McMahan et al. 2018, Sec. 3), so the per-layer
  normalised sum has sensitivity 1 too;
* :func:`centered_unclipped_count` -- the statistic ``sum_i (b_i - 1/2)``
  (``b_i = 1`` for an unclipped example) whose noisy release moves C_t; one
  example moves it by 1/2 (Andrew et al.'s centring halves the sensitivity of
  ``sum_i b_i``);
* :func:`normalized_loss` -- ``loss / C``, whose per-example gradient is
  ``g_i / C``.

Nothing here adds noise: the sums and counts are the non-private statistics
that :mod:`jaxdp.dpsgd.adaptive_noise` privatises.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxdp import _validation
from jaxdp.dpsgd import clipping, transforms
from jaxdp.dpsgd.adaptive_clip_norm import _check_normal_float32

PyTree = Any


def centered_unclipped_count(num_examples: Any, num_clipped: Any) -> jax.Array:
  """``sum_i (b_i - 1/2) = num_examples / 2 - num_clipped`` (float32), NOT private.

  From the :class:`~jaxdp.dpsgd.clipping.ClippedGradInfo` of the
  normalised clipped gradient: ``centered_unclipped_count(info.num_examples,
  info.num_clipped)`` (``num_examples`` counts the unmasked examples,
  ``num_clipped`` those among them whose gradient was scaled down). Summed over
  several chunks of one batch it is the batch's value (it is additive). One
  example moves it by exactly 1/2, the sensitivity
  :func:`~jaxdp.dpsgd.adaptive_noise.adaptive_clip_noise` noises it for. An example counts as unclipped when its normalised gradient
  norm is at most the float32-safe clip bound (a few ulps below 1).

  >>> float(centered_unclipped_count(10.0, 3))
  2.0
  """
  n = jnp.asarray(num_examples, jnp.float32)
  c = jnp.asarray(num_clipped, jnp.float32)
  return n / 2.0 - c


def normalized_loss(loss_fn: Callable[..., Any], clip_norm: Any, *,
                    has_aux: bool = False) -> Callable[..., Any]:
  """``loss_fn / clip_norm``: its per-example gradient is ``g_i / C``.

  ``clip_norm`` may be a traced scalar (the state's C_t inside ``jit``). With
  ``has_aux`` only the loss is divided. A concrete ``clip_norm`` must be
  finite and > 0.
  """
  if not callable(loss_fn):
    raise TypeError(f"loss_fn must be callable, got {type(loss_fn).__name__}.")
  if not _validation._is_tracer(clip_norm):  # pylint: disable=protected-access
    _validation.check_positive(clip_norm, "clip_norm")

  def fn(params, *args):
    out = loss_fn(params, *args)
    if has_aux:
      value, aux = out
      return value / clip_norm, aux
    return out / clip_norm

  return fn


def per_layer_normalisation(clip_norms: PyTree) -> tuple[jax.Array, PyTree]:
  """``(D, nu)``: the common unit ``D >= sqrt(sum_l C_l^2)`` and the normalised group clips.

  Per-layer adaptive clipping clips group l of every per-example gradient to
  ``C_l`` and divides the whole vector by D (:func:`adaptive_clipped_grad`
  with ``per_layer=True``): in units of D, group l is clipped to ``nu_l ~=
  C_l / D``, so the normalised sum has sensitivity ``sqrt(sum_l nu_l^2) <= 1``
  (McMahan et al. 2018, Sec. 3: per-layer bounds compose as the Pythagorean
  sum), whatever the C_l are. Rounding: D is computed as ``m sqrt(sum (C_l /
  m)^2)`` (``m = max C_l``, no overflow), inflated by ``(1 + r)^(L + 8)`` and
  every ``nu_l`` deflated by ``(1 - r)^3`` (r = 2^-24), so ``D`` is at least
  the exact Pythagorean sum of the float32 ``C_l`` and ``sum nu_l^2 <= 1``
  exactly. Both :func:`adaptive_clipped_grad` and the noise wrapper call this
  on the same state, so they use the same D.
  """
  leaves, treedef = jax.tree.flatten(clip_norms)
  if not leaves:
    raise ValueError("clip_norms must hold at least one clip norm.")
  c = jnp.stack([jnp.asarray(x, jnp.float32).reshape(()) for x in leaves])
  n = len(leaves)
  r = 2.0 ** -24
  up = transforms._round_up((1.0 + r) ** (n + 8), np.float32)  # pylint: disable=protected-access
  down = np.float32(clipping.float32_at_most((1.0 - r) ** 3))
  m = jnp.max(c)
  d = m * jnp.sqrt(jnp.sum(jnp.square(c / m))) * jnp.float32(up)
  nus = [(ci / d) * down for ci in c]
  return d, jax.tree.unflatten(treedef, nus)


def adaptive_clipped_grad(
    loss_fn: Callable[..., Any],
    clip_norm: Any,
    *,
    batch_argnums: int | Sequence[int] = 1,
    microbatch_size: int | None = None,
    has_aux: bool = False,
    method: str = "auto",
    per_layer: bool = False,
) -> clipping.ClippedGradFn:
  """Sum of per-example gradients clipped to C and divided by C (sensitivity 1).

  ``sum_i (g_i / C) min(1, C / ||g_i||)``, what
  :func:`~jaxdp.dpsgd.adaptive_noise.adaptive_clip_noise` takes. The clip comes FIRST: the factor on ``g_i`` is ``min(1/C, c'/||g_i||)``
  computed from sums of squares that cannot overflow
  (:func:`jaxdp.dpsgd.clip_factors.factor_from_sums`; the ghost clipper's
  power-of-two-scaled rule), so ``g_i / C`` is never formed
  for a huge unclipped ``g_i`` (a tiny C and a large gradient cannot overflow);
  a non-finite ``g_i`` contributes zero and counts as clipped (the clipping
  module's rule). Build it inside the jitted step with
  ``current_clip_norm(state)`` (construction is cheap and traces once);
  every ``method`` (``"auto"``, ``"vmap"``, ``"reweight"``, ``"ghost"``) and
  ``microbatch_size`` work with a traced C. ``info.loss_sum`` and
  ``info.per_example_norms`` are in units of C (multiply by C for the loss).

  ``per_layer=True``: ``clip_norm`` is the pytree of per-group clip norms
  ``C_l`` of the state of
  :func:`~jaxdp.dpsgd.adaptive_noise.per_layer_adaptive_clip_noise` (a
  prefix of params); group l is clipped to ``C_l`` and everything is divided by
  :func:`per_layer_normalisation`'s D (sensitivity 1);
  ``info.num_clipped_per_group`` gives the per-group counts.
  """
  if per_layer:
    probe = clipping.clipped_grad(loss_fn, l2_clip_norm=1.0, batch_argnums=batch_argnums,
                                  microbatch_size=microbatch_size, has_aux=has_aux,
                                  method=method, per_layer=True)
    for c in jax.tree.leaves(clip_norm):
      if not _validation._is_tracer(c):  # pylint: disable=protected-access
        _check_normal_float32(float(np.asarray(c)), "clip_norm entry")
    unit, spec = per_layer_normalisation(clip_norm)
  else:
    probe = clipping.clipped_grad(loss_fn, l2_clip_norm=1.0, batch_argnums=batch_argnums,
                                  microbatch_size=microbatch_size, has_aux=has_aux,
                                  method=method)
    if not _validation._is_tracer(clip_norm):  # pylint: disable=protected-access
      _check_normal_float32(float(np.asarray(clip_norm)), "clip_norm")
    unit, spec = jnp.asarray(clip_norm, jnp.float32), 1.0
  return clipping._build_clipped_grad(  # pylint: disable=protected-access
      loss_fn, clip_spec=spec, even_split=False, per_layer=per_layer, sensitivity=1.0,
      l2_clip_norm=clip_norm, batch_argnums=probe.batch_argnums,
      microbatch_size=probe.microbatch_size, has_aux=has_aux, method=probe.method,
      unit_inverse=1.0 / unit)


__all__ = ["adaptive_clipped_grad", "centered_unclipped_count", "normalized_loss",
           "per_layer_normalisation"]
