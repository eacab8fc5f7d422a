"""Per-user clipped gradients: the clipper of user-level DP-SGD (:mod:`.user_sampling`).

Each sampled user contributes ONE clipped gradient, of its reduced loss (the mean
or the sum of its examples' losses), so adding or removing one user moves the sum
by at most the clip norm C whatever the user's number of examples (McMahan,
Ramage, Talwar & Zhang 2018). :func:`user_clipped_grad` clips to a fixed C;
:func:`adaptive_user_clipped_grad` clips to a clip norm C_t carried by the plan's
state and returns the sum in units of C_t (sensitivity 1) with the count of
clipped users for the private quantile update (Andrew et al. 2021, stated for
user-level DP). A user whose gradient is not finite contributes exactly zero.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxdp import _validation
from jaxdp.dpsgd import _inputs
from jaxdp.dpsgd import clipping
from jaxdp.dpsgd.clipping import ClippedGradInfo
from jaxdp.errors import ArgumentTypeError

PyTree = Any


class UserClippedGradFn:
  """Callable returned by :func:`user_clipped_grad`; see that function.

  Attributes:
    sensitivity: the L2 sensitivity of the sum of per-user clipped gradients
      under add/remove of one user: ``l2_clip_norm``, or 1 for
      :func:`adaptive_user_clipped_grad` (units of C_t).
    l2_clip_norm, reduction, batch_argnums: as given (adaptive: C_t).
    per_layer: False; microbatch_size: None (for ``make_private``'s checks).
  """

  per_layer = False
  microbatch_size = None

  def __init__(self, fn: Callable[..., Any], sensitivity: float, reduction: str,
               batch_argnums: tuple[int, ...], l2_clip_norm: Any = None):
    self._fn = fn
    self.sensitivity = sensitivity
    self.l2_clip_norm = sensitivity if l2_clip_norm is None else l2_clip_norm
    self.reduction = reduction
    self.batch_argnums = batch_argnums

  def __call__(self, *args: Any, mask: Any = None) -> tuple[PyTree, ClippedGradInfo]:
    args, mask = clipping.unpack_masked_batch(args, mask, self.batch_argnums)
    return self._fn(*args, mask=mask)

  def __repr__(self) -> str:
    return (f"UserClippedGradFn(sensitivity={self.sensitivity}, reduction={self.reduction!r}, "
            f"batch_argnums={self.batch_argnums})")


def user_clipped_grad(loss_fn: Callable[..., Any], *, l2_clip_norm: float,
                      batch_argnums: int | Sequence[int] = 1,
                      reduction: str = "mean") -> UserClippedGradFn:
  """Sum over users of the clipped gradient of each user's reduced loss.

  ``loss_fn(params, *example_args)`` is the loss of ONE example (as for
  :func:`~jaxdp.dpsgd.clipped_grad`). The returned function takes the
  ``batch_argnums`` arguments with two leading axes ``(P, K)`` (user slot,
  example slot), e.g. ``f(params, chunk.gather(x, y))``, or arrays and
  ``mask=(P, K)``, and returns ``(grad_sum, info)`` with

    grad_sum = sum_{u : n_u > 0, g_u finite} g_u min(1, C / ||g_u||),
    g_u = grad_params R_u,   R_u = (1 / n_u) sum_{k : mask[u, k]} loss_fn(params, ex_{u,k})
                             (``reduction="mean"``; ``"sum"`` drops the 1 / n_u),

  ``n_u = sum_k mask[u, k]``. One backward pass per user (``jax.vmap`` over the
  users of ``jax.value_and_grad`` of ``R_u``): memory ``P x params``, not
  ``P K x params``. Clipping is float32-safe (the clip norm shrunk by a few
  ulps, :func:`jaxdp.dpsgd.clipping.clip_groups`), so every contribution has norm ``<= C``;
  the sum has L2 sensitivity ``C`` under add/remove of one user
  (``.sensitivity``), whatever the users' example counts (module docstring).

  Masked example slots must hold an example of the SAME user (the layout of
  :class:`UserPaddedBatch` and :meth:`UserPoissonSampler.place_data` does):
  their gradient is multiplied by zero, and ``0 x NaN`` would otherwise let
  another user's data zero this user's contribution.

  Args:
    loss_fn: per-example loss ``(params, *args) -> scalar``.
    l2_clip_norm: C > 0 (``inf`` disables clipping: infinite sensitivity).
    batch_argnums: positional arguments (>= 1) carrying the ``(P, K)`` axes.
    reduction: ``"mean"`` (default) or ``"sum"`` of a user's example losses.

  Returns:
    A :class:`UserClippedGradFn`; its ``info`` is a
    :class:`~jaxdp.dpsgd.ClippedGradInfo` in USER units (NON-PRIVATE):
    ``loss_sum`` = sum of ``R_u`` over the contributing users,
    ``per_example_norms`` = (P,) per-user norms ``||g_u||`` (0 if none),
    ``num_clipped`` = users scaled down, ``num_examples`` = users with at least
    one example (slots with a non-finite ``g_u`` included, contributing 0).
  """
  c = _validation.check_positive(l2_clip_norm, "l2_clip_norm", allow_inf=True)
  fn, reduction, batch_argnums = _build_user_clipped_grad(
      loss_fn, clip=c, unit_inverse=None, batch_argnums=batch_argnums, reduction=reduction)
  return UserClippedGradFn(fn, c, reduction, batch_argnums)


def adaptive_user_clipped_grad(loss_fn: Callable[..., Any], clip_norm: Any, *,
                               batch_argnums: int | Sequence[int] = 1,
                               reduction: str = "mean") -> UserClippedGradFn:
  """Sum over users of ``clip_C(g_u) / C``: user-level adaptive clipping (sensitivity 1).

  The user-level twin of :func:`jaxdp.dpsgd.adaptive_clipping.adaptive_clipped_grad`
  (Andrew et al. 2021, Algorithm 1, which is stated for user-level DP in federated
  learning: each sampled user contributes one clipped update and one bit). ``clip_norm``
  is C_t (a traced float32 scalar inside the step, e.g. ``current_clip_norm(state)``; a
  concrete one must be a positive normal float32). Returns ``(grad_sum, info)`` with

    grad_sum = sum_u (g_u / C) min(1, C / ||g_u||),

  ``g_u`` as in :func:`user_clipped_grad` (the gradient of user u's reduced loss), clipped
  FIRST and then divided by C without forming ``g_u / C`` for a huge ``g_u``
  (:func:`jaxdp.dpsgd.clipping.clip_groups` with ``unit_inverse``), so every contribution
  has norm <= 1: ``.sensitivity`` is 1 under add/remove of one user (2 under replace-one).
  ``info`` (NON-PRIVATE, user units): ``num_examples`` = users present,
  ``num_clipped`` = present users whose ``g_u`` was scaled down OR is not finite (it then
  contributes zero and counts as clipped, the rule of :mod:`jaxdp.dpsgd.clipping`), so
  ``centered_unclipped_count(info.num_examples, info.num_clipped) = sum_u (b_u - 1/2)``
  with ``b_u = 1[user u unclipped]`` a function of user u's data alone: it moves by 1/2
  when a user is added or removed, by at most 1 when one is replaced. ``loss_sum`` and
  ``per_example_norms`` are in units of C, as for the example-level function.
  """
  if not _validation._is_tracer(clip_norm):  # pylint: disable=protected-access
    c = _validation.check_positive(float(np.asarray(clip_norm)), "clip_norm")
    tiny, big = float(np.finfo(np.float32).tiny), float(np.finfo(np.float32).max)
    if not tiny <= c <= big:  # 1 / C and C * noise are formed in float32
      raise ValueError(f"clip_norm must be a positive normal float32 (in [{tiny:.4g}, "
                       f"{big:.4g}]), got {c!r}.")
  unit = jnp.asarray(clip_norm, jnp.float32)
  fn, reduction, batch_argnums = _build_user_clipped_grad(
      loss_fn, clip=1.0, unit_inverse=1.0 / unit, batch_argnums=batch_argnums,
      reduction=reduction)
  return UserClippedGradFn(fn, 1.0, reduction, batch_argnums, l2_clip_norm=clip_norm)


def _build_user_clipped_grad(loss_fn: Callable[..., Any], *, clip: float, unit_inverse: Any,
                             batch_argnums: Any, reduction: str):
  """``(fn, reduction, batch_argnums)`` of :func:`user_clipped_grad` (``unit_inverse=None``)
  or :func:`adaptive_user_clipped_grad` (``unit_inverse = 1 / C_t``, ``clip = 1``)."""
  c = clip
  adaptive = unit_inverse is not None
  if reduction not in ("mean", "sum"):
    raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}.")
  if isinstance(batch_argnums, (int, np.integer)) and not isinstance(batch_argnums, bool):
    batch_argnums = (int(batch_argnums),)
  try:
    batch_argnums = tuple(sorted(int(a) for a in batch_argnums))
  except (TypeError, ValueError):
    raise ArgumentTypeError(f"batch_argnums must be an int or a sequence of ints >= 1, got "
                            f"{batch_argnums!r}.") from None
  if not batch_argnums or batch_argnums[0] < 1:
    raise ValueError(f"batch_argnums must be indices >= 1 (argument 0 is params), got "
                     f"{batch_argnums}.")
  mean = reduction == "mean"

  def per_user(params, m, *args):
    in_axes = [0 if (i + 1) in batch_argnums else None for i in range(len(args))]

    def reduced(p):
      losses = jax.vmap(lambda *a: loss_fn(p, *a), in_axes=in_axes)(*args)
      losses = losses.astype(jnp.promote_types(losses.dtype, jnp.float32))
      total = jnp.sum(jnp.where(m, losses, 0.0))
      return total / jnp.maximum(jnp.sum(m), 1).astype(total.dtype) if mean else total

    value, grads = jax.value_and_grad(reduced)(params)
    leaves, treedef = jax.tree.flatten(grads)
    leaves = [g.astype(jnp.promote_types(g.dtype, jnp.float32)) for g in leaves]
    # One clip group: the float32-safe clip of clipping.clip_groups (power-of-two scaled, so a
    # huge finite g_u is clipped correctly; a non-finite one gives zeros and finite=False).
    clipped, norm, was_scaled, _, finite = clipping.clip_groups(
        leaves, [list(range(len(leaves)))], [c], unit_inverse)
    present = jnp.any(m)
    ok = present & finite
    # Value-level selection (not differentiated): an absent or non-finite g_u is exactly 0.
    clipped = jax.tree.unflatten(treedef, [jnp.where(ok, v, jnp.zeros_like(v)) for v in clipped])
    if adaptive:  # units of C_t; a non-finite g_u counts as clipped (was_scaled includes it)
      return (clipped, jnp.where(ok, value * unit_inverse, 0.0),
              jnp.where(ok, norm * unit_inverse, 0.0), present & was_scaled, present)
    return (clipped, jnp.where(ok, value, 0.0), jnp.where(ok, norm, 0.0), ok & was_scaled,
            present)

  def fn(*args, mask=None):
    if len(args) < 1 + batch_argnums[-1]:
      raise ValueError(f"expected at least {1 + batch_argnums[-1]} positional arguments "
                       f"(params and batch_argnums={batch_argnums}), got {len(args)}.")
    params, rest = args[0], args[1:]
    leaves = [leaf for i in batch_argnums for leaf in jax.tree.leaves(rest[i - 1])]
    if not leaves:
      raise ValueError("the batch_argnums arguments contain no arrays.")
    if any(np.ndim(leaf) < 2 for leaf in leaves):
      raise ValueError("user-level batches need two leading axes (user slot, example slot) on "
                       "every batch_argnums array: build them with UserPaddedBatch.gather.")
    shape = tuple(np.shape(leaves[0])[:2])
    if any(tuple(np.shape(leaf)[:2]) != shape for leaf in leaves):
      raise ValueError("all batch_argnums arrays must share the leading (users, examples) axes.")
    if mask is None:
      raise ValueError("a user-level batch needs its (users, examples) mask: pass the "
                       "MaskedBatch of UserPaddedBatch.gather (padding slots must not count).")
    mask = jnp.asarray(mask)
    if mask.shape != shape:
      raise ValueError(f"mask must have shape {shape} (users, examples) to match the batch, got "
                       f"{mask.shape} (a per-example batch goes to clipped_grad instead).")
    # One abstract evaluation of the loss on one example: a named error, not a jax traceback.
    one_user = [jax.tree.map(lambda a: jax.ShapeDtypeStruct(np.shape(a)[1:], a.dtype), a)
                if (i + 1) in batch_argnums else a for i, a in enumerate(rest)]
    _inputs.probe_loss(loss_fn, params, one_user, batch_argnums=batch_argnums,
                       what="loss_fn (user-level)")
    in_axes = [None, 0] + [0 if (i + 1) in batch_argnums else None for i in range(len(rest))]
    clipped, values, norms, was_clipped, present = jax.vmap(per_user, in_axes=in_axes)(
        params, mask.astype(bool), *rest)
    gsum = jax.tree.map(lambda g: jnp.sum(g, axis=0), clipped)
    info = ClippedGradInfo(loss_sum=jnp.sum(values), per_example_norms=norms,
                           num_clipped=jnp.sum(was_clipped.astype(jnp.int32)),
                           num_examples=jnp.sum(present.astype(jnp.float32)), aux=None)
    return gsum, info

  return fn, reduction, batch_argnums
