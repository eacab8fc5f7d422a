"""Per-example gradient clipping in the spirit of ``jax.grad``.

DP-SGD (paper ``000_tradeoffs_of_private_prediction.md`` Section 3.1, Equation 4;
``004_dp_machine_learning_survey.md`` Section 4.2, Algorithm 1, line 7) bounds the
influence of one example on a gradient step by clipping its gradient ``g_n`` to
L2 norm at most ``nu`` (called ``l2_clip_norm`` here):

  g_n_clipped = g_n / max(1, ||g_n||_2 / nu) = g_n * min(1, nu / ||g_n||_2),

and releasing the SUM ``sum_n g_n_clipped`` plus Gaussian noise. Under add/remove
neighbouring datasets (the relation that Poisson-subsampled accounting uses)
adding or removing one example changes the sum by one clipped vector, so the L2
sensitivity of the sum is exactly ``nu``.

:func:`clipped_grad` returns a callable whose ``.sensitivity`` attribute carries
that bound, so the noise calibration (``jaxdp.dpsgd.transforms``) cannot
drift away from the clipping.

Per-layer (group-wise) clipping: the parameters are split into K groups (by
default every leaf is one group) and group ``k`` of each per-example gradient is
clipped to its own norm ``c_k``. The concatenation of the clipped groups then
has norm at most ``sqrt(sum_k c_k^2)``, which is the L2 sensitivity of the sum
(McMahan et al. 2018, "A general approach to adding differential privacy to
iterative training procedures", Section 3; the bound is the Pythagorean sum of
the per-group bounds).

Floating point: the bound must hold for the float32 numbers actually summed,
not only in exact arithmetic. Gradients are clipped and summed in at least
float32 (bfloat16/float16 per-example gradients are cast up first, exactly), and
the computed norm can be a few ulps BELOW the true one, so ``min(1, c/||g||)``
alone can leave a clipped norm a few ulps above c. The squared norm is
therefore reduced in blocks of at most ``_BLOCK = 256`` terms (L levels), so in
any summation order every term suffers at most ``E = 1 + L (B - 1) + (K - 1)``
roundings (squaring, L block reductions, K leaves; unit roundoff
``r = 2^-24``) and the computed norm satisfies
``||g||_hat >= ||g|| (1 - r)^(E/2 + 1)`` (Higham, "Accuracy and Stability of
Numerical Algorithms", 2nd ed., Section 4.2, Eq. 4.4, for sums of nonnegative
terms, plus one rounding of the square root). The clip uses
``c' = c (1 - r)^(E/2 + 1) / (1 + r)^2`` rounded down to float32 (the last
factor covers the rounding of ``c'/||g||_hat`` and of the product), so the
exact norm of every float32 clipped vector is ``<= c``. ``c' / c - 1`` is
about ``-1e-5`` for a million parameters: a negligible change of the clip norm.

Huge and non-finite gradients. The squares are never formed from the raw
gradient: each clip group is first multiplied by ``2^-e``, with ``2^e`` the
power of two just above its largest entry (``jnp.frexp``; exact, a change of
exponent only), so the largest scaled entry lies in ``[1/2, 1)`` and the
scaled sum of squares ``S`` in ``[1/4, 16 n]`` can neither overflow nor be
dominated by underflow. The clipped vector is ``u min(2^e, c'/sqrt(S))`` with
``u = 2^-e g`` -- the raw ``g`` itself when unclipped -- so a finite gradient of
any size (entries of 1e30 in float32, whose squares overflow) is clipped
correctly to norm ``<= c``. Entries whose squares underflow after the scaling
are below ``2^-63`` relative to the largest: ``E`` above counts one more
rounding (``E = 2 + L (B - 1) + (K - 1)``) that covers them (their total is
below ``n 2^-124`` relative, ``<= r`` for any ``n <= 2^100``).

A per-example gradient with an inf or NaN entry (overflow in the loss, an
inf input) cannot be clipped: ``min(1, c/inf) = 0`` and ``inf * 0 = NaN``, a
NaN sum exactly when that record is sampled, which its absence can never
produce. Such an example contributes EXACTLY ZERO (``jnp.where``, never a
product) on every path (``"vmap"``, ``"reweight"``, ``"ghost"``, flat and
per-layer, microbatched or not): a zero vector has norm ``0 <= c``, so the
sensitivity is unchanged and the sum stays finite. In the non-private
diagnostics the example counts as clipped (``num_clipped``) and its
``per_example_norms`` entry is ``inf``; its loss enters ``loss_sum`` as computed
(so a NaN loss stays visible there).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxdp import _validation
from jaxdp.dpsgd import _inputs
from jaxdp.dpsgd.sampling import MaskedBatch

PyTree = Any

_BLOCK = 256  # at most this many terms per reduction in the norm (see module docstring)
_UNIT_ROUNDOFF = 2.0 ** -24  # float32


@dataclasses.dataclass(frozen=True)
class ClippedGradInfo:
  """Non-private diagnostics returned beside the clipped gradient sum.

  None of these fields are privatised: they depend on individual examples and
  must not be released (logged, used for decisions that are published) without
  accounting for them separately.

  Attributes:
    loss_sum: sum over the unmasked examples of the per-example loss.
    per_example_norms: (B,) L2 norms of the per-example gradients BEFORE
      clipping (global norm, also under per-layer clipping); 0 for masked slots.
    num_clipped: number of unmasked examples whose gradient was scaled down
      (in any group under per-layer clipping); an example whose gradient is
      not finite contributes zero and counts as clipped.
    num_examples: number of unmasked examples (sum of the mask).
    aux: per-example auxiliary outputs of ``loss_fn`` (leading axis B) when
      ``has_aux=True``, else ``None``.
    num_clipped_per_group: with per-layer clipping, a (G,) int32 vector: the
      unmasked examples whose group g was scaled down (non-finite examples
      count in every group), groups in the order of
      ``jax.tree.leaves(l2_clip_norm)`` (one per leaf for a float
      ``l2_clip_norm``); ``None`` for flat clipping.
  """

  loss_sum: jax.Array
  per_example_norms: jax.Array
  num_clipped: jax.Array
  num_examples: jax.Array
  aux: Any = None
  num_clipped_per_group: Any = None


jax.tree_util.register_dataclass(
    ClippedGradInfo,
    data_fields=["loss_sum", "per_example_norms", "num_clipped", "num_examples", "aux",
                 "num_clipped_per_group"],
    meta_fields=[],
)


def _compute_dtype(dtype: Any) -> Any:
  """At least float32: bfloat16/float16 gradients are clipped and summed in float32."""
  return jnp.promote_types(dtype, jnp.float32)


def _upcast(tree: PyTree) -> PyTree:
  return jax.tree.map(lambda g: g.astype(_compute_dtype(g.dtype)), tree)


def _sum_squares(x: jax.Array) -> jax.Array:
  """Sum of squares with every reduction over at most ``_BLOCK`` terms."""
  v = jnp.square(x.astype(_compute_dtype(x.dtype))).reshape(-1)
  while v.shape[0] > _BLOCK:
    m = -(-v.shape[0] // _BLOCK)
    v = jnp.pad(v, (0, m * _BLOCK - v.shape[0])).reshape(m, _BLOCK).sum(axis=1)
  return jnp.sum(v)


def _reduction_levels(size: int) -> int:
  levels, n = 1, max(int(size), 1)
  while n > _BLOCK:
    n = -(-n // _BLOCK)
    levels += 1
  return levels


def _global_norm(tree: PyTree) -> jax.Array:
  leaves = jax.tree.leaves(tree)
  if not leaves:
    return jnp.zeros((), jnp.float32)
  return jnp.sqrt(sum(_sum_squares(x) for x in leaves))


def _safe_multiplier(leaves: Sequence[Any]) -> float:
  """``(1 - r)^(E/2 + 1) / (1 + r)^2`` with ``E = 2 + L (B - 1) + (K - 1)`` (module docstring)."""
  r = _UNIT_ROUNDOFF
  levels = max(_reduction_levels(math.prod(x.shape)) for x in leaves)
  e = 2 + levels * (_BLOCK - 1) + (len(leaves) - 1)
  return (1.0 - r) ** (e / 2.0 + 1.0) / (1.0 + r) ** 2


def _safe_clip(clip: float, leaves: Sequence[Any]) -> float:
  """Clip norm shrunk so the float32 clipped norm never exceeds ``clip`` (module docstring).

  ``clip (1 - r)^(E/2 + 1) / (1 + r)^2`` with ``E = 2 + L (B - 1) + (K - 1)``,
  evaluated in float64 and rounded down to float32. ``inf`` stays ``inf``.
  """
  if math.isinf(clip):
    return clip
  if not leaves:
    return clip
  return float32_at_most(clip * _safe_multiplier(leaves) * (1.0 - 1e-15))


def _safe_clip_any(clip: Any, leaves: Sequence[Any]) -> Any:
  """:func:`_safe_clip` for a Python float, or ``clip * m`` for a traced clip norm.

  ``m = _safe_multiplier (1 - r)`` rounded down to float32: the product with a
  traced float32 clip rounds up by at most ``(1 + r)``, so ``fl(clip m) <=
  clip _safe_multiplier``.
  """
  if isinstance(clip, (int, float, np.floating)):
    return _safe_clip(float(clip), leaves)
  if not leaves:
    return clip
  m = float32_at_most(_safe_multiplier(leaves) * (1.0 - _UNIT_ROUNDOFF) * (1.0 - 1e-15))
  return jnp.asarray(clip, jnp.float32) * jnp.float32(m)


def float32_at_most(target: float) -> float:
  """The float32 nearest to ``target`` that does not exceed it (round down if needed)."""
  out = np.float32(target)
  if float(out) > target:
    out = np.nextafter(out, np.float32(0.0))
  return float(out)


def _clip_factor(norm: jax.Array, safe_clip: float) -> jax.Array:
  # min(1, c' / ||g||); c' / 0 = inf gives factor 1 (a zero gradient stays zero),
  # and c' = inf gives factor 1 (no clipping). c' is the float32-safe clip norm.
  return jnp.minimum(jnp.asarray(1.0, norm.dtype), jnp.asarray(safe_clip, norm.dtype) / norm)


_NO_EXPONENT = -100000  # exponent of an all-zero group when exponents are combined


def _exponent_range(leaves: Sequence[Any]) -> tuple[int, int]:
  """Exponents e for which ``2^-e`` and ``2^e`` are normal in every leaf's dtype, and
  ``x 2^-e`` cannot overflow for the clamped e: ``[-(maxexp - 1), -minexp]``."""
  lo, hi = -10 ** 6, 10 ** 6
  for x in leaves:
    fi = jnp.finfo(_compute_dtype(x.dtype))
    lo, hi = max(lo, -(int(fi.maxexp) - 1)), min(hi, -int(fi.minexp))
  return lo, hi


def _pow2(e: jax.Array, dtype: Any = jnp.float32) -> jax.Array:
  """``2^e`` (exact for the clamped exponents of :func:`_scaled_sum_squares`)."""
  return jnp.ldexp(jnp.ones(jnp.shape(e), dtype), e)


def scaled_sum_squares(leaves: Sequence[jax.Array]) -> tuple[list, jax.Array, jax.Array, jax.Array]:
  """``(u, e, S, finite)`` with ``u = 2^-e x`` per leaf and ``S = sum ||u||^2``.

  ``2^e`` is the power of two just above ``max |x|`` (clamped so ``2^+-e``
  stay normal), so ``||x||^2 = 4^e S`` with ``S`` in ``[1/4, 16 n]`` for a
  nonzero finite group: no overflow for any finite ``x``. ``finite`` is False
  when any entry is inf or NaN (``e`` is then 0 and ``u``, ``S`` meaningless).
  The scaling is exact (module docstring). Leaves must be at least float32.
  """
  leaves = list(leaves)
  if not leaves:
    z = jnp.zeros((), jnp.float32)
    return [], jnp.zeros((), jnp.int32), z, jnp.array(True)
  maxes = [jnp.max(jnp.abs(x)).astype(jnp.float32) if x.size else jnp.zeros((), jnp.float32)
           for x in leaves]
  m = maxes[0]
  for v in maxes[1:]:
    m = jnp.maximum(m, v)  # propagates NaN
  finite = jnp.isfinite(m)
  _, e = jnp.frexp(jnp.where(finite, m, 0.0))
  lo, hi = _exponent_range(leaves)
  e = jnp.clip(e, lo, hi).astype(jnp.int32)
  u = [x * _pow2(-e, x.dtype) for x in leaves]
  total = sum(_sum_squares(v) for v in u)
  return u, e, total, jnp.logical_and(finite, jnp.isfinite(total))


def _combine_scaled(parts: Sequence[tuple[jax.Array, jax.Array]]) -> tuple[jax.Array, jax.Array]:
  """``(E, S)`` with ``sum_k 4^(e_k) S_k = 4^E S`` for the pairs ``(e_k, S_k)`` (exactly,
  but for terms below ``2^-126`` relative to the largest, which underflow)."""
  es = [jnp.where(sk > 0, ek, _NO_EXPONENT) for ek, sk in parts]
  big = es[0]
  for ek in es[1:]:
    big = jnp.maximum(big, ek)
  total = sum(jnp.ldexp(sk.astype(jnp.float32), 2 * jnp.maximum(ek - big, -1000))
              for ek, (_, sk) in zip(es, parts))
  return big, total


def _scaled_norm(e: jax.Array, s: jax.Array) -> jax.Array:
  """``2^e sqrt(S)`` (``inf`` when it overflows; 0 for an empty group)."""
  return jnp.ldexp(jnp.sqrt(s), jnp.maximum(e, -1000))


def clip_groups(leaves: Sequence[jax.Array], groups: Sequence[Sequence[int]], clips: Sequence[Any],
                unit_inverse: Any = None) -> tuple[list, jax.Array, jax.Array, jax.Array, jax.Array]:
  """Clips ONE example's gradient group-wise; the core of ``method="vmap"``.

  ``leaves`` (at least float32) are split into ``groups`` (lists of leaf
  indices); group k is clipped to ``clips[k]`` (a Python float, ``inf`` for no
  clipping, or a traced float32 scalar) with the float32-safe clip of the
  module docstring, computed from the power-of-two-scaled group (never the raw
  squares). With ``unit_inverse`` (a traced scalar ``1/D``) every clipped group
  is also multiplied by ``1/D`` WITHOUT forming ``g/D`` for an unclipped huge
  ``g``: the factor on ``u = 2^-e g`` is ``min(2^e / D, c'/sqrt(S))``, i.e. clip
  to ``D c`` in raw units, then divide by D (adaptive clipping).

  Returns ``(clipped leaves, global norm, whether any group was scaled, scaled
  per group (G,), finite)``. A non-finite gradient gives zero leaves, norm
  ``inf``, scaled everywhere, ``finite=False``.
  """
  out: list = [None] * len(leaves)
  finite = jnp.array(True)
  scaled, parts = [], []
  for idx, c in zip(groups, clips):
    sub = [leaves[i] for i in idx]
    if not sub:
      scaled.append(jnp.array(False))
      continue
    u, e, s, fin = scaled_sum_squares(sub)
    finite = jnp.logical_and(finite, fin)
    parts.append((e, s))
    f = _safe_clip_any(c, sub) / jnp.sqrt(s)  # inf for a zero group or c = inf
    pe = _pow2(e)
    if unit_inverse is None:
      sc = f < pe
      vals = [jnp.where(sc, v * f.astype(v.dtype), x) for v, x in zip(u, sub)]
    else:
      lim = pe * jnp.asarray(unit_inverse, jnp.float32)
      sc = f < lim
      fac = jnp.minimum(lim, f)
      vals = [v * fac.astype(v.dtype) for v in u]
    scaled.append(sc)
    for i, v in zip(idx, vals):
      out[i] = v
  out = [jnp.where(finite, v, jnp.zeros_like(v)) for v in out]
  if parts:
    big, total = _combine_scaled(parts) if len(parts) > 1 else parts[0]
    norm = jnp.where(finite, _scaled_norm(big, total), jnp.inf)
  else:
    norm = jnp.zeros((), jnp.float32)
  per_group = jnp.logical_or(jnp.stack(scaled), jnp.logical_not(finite)) if scaled else (
      jnp.zeros((0,), bool))
  return out, norm, jnp.any(per_group), per_group, finite


def leaf_groups(params: PyTree, per_layer: bool, clip_spec: Any,
                even_split: bool) -> tuple[list, list]:
  """``(group index per leaf, clip norm per group)`` of a clip specification.

  Flat: one group. Per-layer with a float C (``even_split``): one group per
  leaf, clip ``C / sqrt(L)``. Per-layer with a pytree prefix of params: one
  group per prefix leaf, in ``jax.tree.leaves`` order (its values may be
  traced scalars).
  """
  leaves = jax.tree.leaves(params)
  n = len(leaves)
  if not per_layer:
    return [0] * n, [clip_spec]
  if even_split:
    c = float(clip_spec) / math.sqrt(max(n, 1))
    return list(range(n)), [c] * n
  group_of: list = [None] * n
  clips: list = []
  idx_tree = jax.tree.unflatten(jax.tree.structure(params), list(range(n)))

  def assign(c, sub):
    g = len(clips)
    clips.append(c)
    for i in jax.tree.leaves(sub):
      group_of[i] = g
    return sub

  try:
    jax.tree.map(assign, clip_spec, idx_tree)
  except ValueError as err:
    raise ValueError("with per_layer=True, l2_clip_norm must be a float or a pytree "
                     "that is a prefix of the params tree (one clip norm per group); "
                     f"it does not match the gradient structure: {err}") from err
  return group_of, clips


class ClippedGradFn:
  """Callable returned by :func:`clipped_grad`; see that function.

  Attributes:
    sensitivity: L2 sensitivity of the returned gradient sum under add/remove
      neighbours: ``l2_clip_norm`` for flat clipping, ``sqrt(sum_k c_k^2)``
      for per-layer clipping (``inf`` when any clip norm is ``inf``).
    l2_clip_norm: the clip norm given (a float or a pytree of per-group norms).
    per_layer: whether group-wise clipping is used.
    microbatch_size: examples processed per vectorised chunk (None: all at once).
    batch_argnums: positional arguments that carry the batch axis.
    method: the clipping method used (``"vmap"``, ``"reweight"`` or
      ``"ghost"``; ``"auto"`` resolved), or None when not known.
  """

  def __init__(self, fn: Callable[..., Any], sensitivity: float, l2_clip_norm: Any,
               per_layer: bool, microbatch_size: int | None,
               batch_argnums: tuple[int, ...] = (1,), method: str | None = None):
    self._fn = fn
    self.method = method
    self.batch_argnums = batch_argnums
    self.sensitivity = sensitivity
    self.l2_clip_norm = l2_clip_norm
    self.per_layer = per_layer
    self.microbatch_size = microbatch_size

  def __call__(self, *args: Any, mask: jax.Array | None = None) -> tuple[PyTree, ClippedGradInfo]:
    args, mask = unpack_masked_batch(args, mask, self.batch_argnums)
    return self._fn(*args, mask=mask)

  def __repr__(self) -> str:
    return (f"ClippedGradFn(sensitivity={self.sensitivity}, per_layer={self.per_layer}, "
            f"microbatch_size={self.microbatch_size})")


def unpack_masked_batch(args: tuple, mask: Any, batch_argnums: Sequence[int]) -> tuple[tuple, Any]:
  """``(params, MaskedBatch, *others)`` -> ``(params, *positional args), mask``.

  The batch's arrays fill the ``batch_argnums`` positions (in increasing
  order), the remaining arguments fill the other positions in order. Passing
  ``mask=`` as well is an error: the batch carries its own mask.
  """
  where = [i for i, a in enumerate(args) if isinstance(a, MaskedBatch)]
  if not where:
    return tuple(args), mask
  if where != [1]:
    raise ValueError("pass at most one MaskedBatch, as the argument right after params "
                     f"(found MaskedBatch at positions {where}).")
  if mask is not None:
    raise ValueError("mask= was given together with a MaskedBatch, which carries its own mask; "
                     "pass only the MaskedBatch.")
  batch = args[1]
  positions = sorted(batch_argnums)
  if len(batch.arrays) != len(positions):
    raise ValueError(f"the MaskedBatch holds {len(batch.arrays)} arrays but the function has "
                     f"batch_argnums={tuple(batch_argnums)} ({len(positions)} batch arguments).")
  others = list(args[2:])
  total = 1 + len(positions) + len(others)
  if positions[-1] >= total:
    raise ValueError(f"batch_argnums={tuple(batch_argnums)} needs more positional arguments "
                     f"than the {len(others)} given after the MaskedBatch.")
  full: list[Any] = [args[0]] + [None] * (total - 1)
  for pos, arr in zip(positions, batch.arrays):
    full[pos] = arr
  rest = iter(others)
  for pos in range(1, total):
    if pos not in positions:
      full[pos] = next(rest)
  return tuple(full), batch.mask


def _check_clip_norms(l2_clip_norm: Any, per_layer: bool) -> tuple[Any, float]:
  """Validates clip norm(s) and returns (clip spec, sensitivity)."""
  if not per_layer:
    if jax.tree_util.treedef_is_leaf(jax.tree.structure(l2_clip_norm)) is False:
      raise ValueError("l2_clip_norm must be a positive float unless per_layer=True; "
                       "got a pytree.")
    c = _validation.check_positive(l2_clip_norm, "l2_clip_norm", allow_inf=True)
    return c, c
  leaves, treedef = jax.tree.flatten(l2_clip_norm)
  if not leaves:
    raise ValueError("l2_clip_norm must contain at least one positive clip norm.")
  checked = [_validation.check_positive(c, "l2_clip_norm (per-layer entry)", allow_inf=True)
             for c in leaves]
  sensitivity = math.sqrt(math.fsum(c * c for c in checked))
  return jax.tree.unflatten(treedef, checked), sensitivity


def per_layer_sensitivity(layer_clip_norms: Sequence[float]) -> float:
  """L2 sensitivity ``sqrt(sum_k c_k^2)`` of a per-layer clipped sum.

  Each group k of a per-example gradient has norm <= c_k after clipping, so the
  whole clipped vector has norm <= sqrt(sum_k c_k^2) (Pythagoras over disjoint
  coordinate blocks); adding or removing one example moves the sum by at most
  that much.

  >>> round(per_layer_sensitivity([3.0, 4.0]), 6)
  5.0
  """
  checked = [_validation.check_positive(c, "layer_clip_norms entry", allow_inf=True)
             for c in layer_clip_norms]
  if not checked:
    raise ValueError("layer_clip_norms must be non-empty.")
  return math.sqrt(math.fsum(c * c for c in checked))


def clipped_grad(
    loss_fn: Callable[..., Any],
    *,
    l2_clip_norm: Any,
    batch_argnums: int | Sequence[int] = 1,
    microbatch_size: int | None = None,
    per_layer: bool = False,
    has_aux: bool = False,
    method: str = "auto",
) -> ClippedGradFn:
  """Sum of per-example clipped gradients, like ``jax.grad`` over a batch.

  ``loss_fn(params, *example_args)`` computes the loss of ONE example (the
  arguments in ``batch_argnums`` hold one example each, without a batch axis).
  The returned function takes the same arguments with a leading batch axis B
  on every ``batch_argnums`` argument, plus an optional ``mask`` (B,) of 0/1
  (or bool), and returns ``(grad_sum, info)`` with

    grad_sum = sum_{n : mask_n = 1} g_n * min(1, nu / ||g_n||_2),
    g_n = d loss_fn(params, example_n) / d params,

  (paper 000 Section 3.1, Equation 4, the bracketed sum; survey 004 Section
  4.2 Algorithm 1 line 7), computed with ``jax.vmap``. Gradients are taken with
  respect to argument 0 (``params``). Masked slots contribute exactly zero (even
  if their gradient is NaN), which is how padded Poisson batches are handled.

  Padded batches: call it as ``f(params, chunk.gather(x, y))`` with a
  :class:`~jaxdp.dpsgd.sampling.MaskedBatch` (what
  ``PaddedBatch.gather`` returns) in place of the batch arguments; the mask
  travels with the batch, so it cannot be forgotten (padding slots repeat
  example 0, and summing them unmasked would break the sensitivity; the
  chunk's ``padded_indices`` therefore refuse to index an array without the
  mask). Giving ``mask=`` as well raises ``ValueError``. A plain array batch
  without ``mask`` means every row is a real example.

  Precision: per-example gradients are clipped and summed in at least float32
  (bfloat16/float16 params give a float32 ``grad_sum``), with the clip norm
  shrunk by a few float32 ulps so that every clipped vector has norm at most
  ``l2_clip_norm`` exactly (module docstring).

  Args:
    loss_fn: per-example loss ``(params, *args) -> scalar`` (or
      ``(scalar, aux)`` with ``has_aux=True``).
    l2_clip_norm: clip norm nu > 0 (``inf`` disables clipping; the sensitivity
      is then ``inf`` and no finite noise makes the sum private). With
      ``per_layer=True`` either a float C, split evenly over the L leaves of the
      gradient as ``c_k = C / sqrt(L)`` (so the sensitivity stays C), or a pytree
      that is a PREFIX of the params tree whose leaves are the per-group clip
      norms ``c_k`` (a subtree of params under one entry forms one group).
    batch_argnums: positional argument index/indices (>= 1) that carry the
      batch axis (default 1: ``loss_fn(params, x)``; ``(1, 2)`` for
      ``loss_fn(params, x, y)`` with per-example labels, as ``make_private``
      uses). A loss that cannot be evaluated on one example of the batch
      arguments raises ``ValueError`` naming the ``batch_argnums`` to pass.
    microbatch_size: if set, the batch is processed in chunks of this many
      examples with ``jax.lax.scan`` (bounded memory: one chunk's per-example
      gradients live at a time); B need not be a multiple (the tail is padded
      and masked).
    per_layer: group-wise clipping (see module docstring).
    has_aux: whether ``loss_fn`` returns ``(loss, aux)``.
    method: ``"vmap"`` (default) materialises the per-example gradients with
      ``jax.vmap(jax.grad)``, clips and sums them. ``"reweight"`` (flat clipping
      only) uses the identity
      ``sum_n min(1, nu/||g_n||) g_n = grad_theta sum_n stop_grad(c_n) loss_n(theta)``:
      a vmapped pass computes only the per-example norms (XLA can fuse the
      squared-norm reductions instead of storing every gradient), then ONE
      ordinary batched backward pass of the reweighted loss gives the clipped
      sum. Same result up to float rounding, often several times faster for
      dense layers. One batched backward pass cannot keep a non-finite
      example (or padding slot) out of the sum (``0 * NaN``), so a chunk that
      holds one is computed by the vmap method instead (``jax.lax.cond``; the
      module docstring's zero rule). ``"ghost"`` (flat or
      per-layer) computes the per-example norms WITHOUT per-example gradients
      from each supported Flax layer's input and output cotangent (Dense,
      Conv, Embed, GroupNorm/LayerNorm; ghost norms or per-layer
      materialisation, whichever is cheaper) and the clipped sum by
      book-keeping, all in one forward+backward pass; any parameter it cannot
      cover exactly falls back to vmap automatically
      (:mod:`jaxdp.dpsgd.ghost_norms`). ``"auto"`` (default) is
      ``"ghost"``, the fastest in ``benchmarks/dpsgd.py`` for every model
      measured (MLP, SmallCNN, ResNet-20); for a loss with no Flax layers it
      computes exactly what ``"vmap"`` does.

  Returns:
    A :class:`ClippedGradFn` with ``.sensitivity``. Its output ``grad_sum`` has
    the structure of ``params`` (dtype at least float32); its ``info`` is a
    :class:`ClippedGradInfo`.

  With flat clipping and nu = 2 the sensitivity is nu:

  >>> f = clipped_grad(lambda w, x: jnp.sum(w * x), l2_clip_norm=2.0)
  >>> f.sensitivity
  2.0
  >>> g, info = f(jnp.zeros(2), jnp.array([[3.0, 4.0], [0.3, 0.4]]))
  >>> [round(float(v), 4) for v in g]
  [1.5, 2.0]
  """
  if per_layer and isinstance(l2_clip_norm, (int, float)):
    even_split = True
    c_total = _validation.check_positive(l2_clip_norm, "l2_clip_norm", allow_inf=True)
    sensitivity = c_total
    clip_spec = c_total
  else:
    even_split = False
    clip_spec, sensitivity = _check_clip_norms(l2_clip_norm, per_layer)
  if isinstance(batch_argnums, int):
    batch_argnums = (batch_argnums,)
  batch_argnums = tuple(int(a) for a in batch_argnums)
  if not batch_argnums or min(batch_argnums) < 1:
    raise ValueError(f"batch_argnums must be indices >= 1 (argument 0 is params), got {batch_argnums}.")
  if microbatch_size is not None:
    microbatch_size = _validation.check_positive_int(microbatch_size, "microbatch_size")
  if method not in ("auto", "vmap", "reweight", "ghost"):
    raise ValueError(f"method must be 'auto', 'vmap', 'reweight' or 'ghost', got {method!r}.")
  if method == "auto":
    method = "ghost"
  if method == "reweight" and per_layer:
    raise ValueError("method='reweight' supports flat clipping only (per_layer=False): "
                     "per-group factors need one backward pass per group.")

  return _build_clipped_grad(
      loss_fn, clip_spec=clip_spec, even_split=even_split, per_layer=per_layer,
      sensitivity=sensitivity, l2_clip_norm=l2_clip_norm, batch_argnums=batch_argnums,
      microbatch_size=microbatch_size, has_aux=has_aux, method=method)


def _build_clipped_grad(loss_fn: Callable[..., Any], *, clip_spec: Any, even_split: bool,
                        per_layer: bool, sensitivity: float, l2_clip_norm: Any,
                        batch_argnums: tuple[int, ...], microbatch_size: int | None,
                        has_aux: bool, method: str, unit_inverse: Any = None) -> ClippedGradFn:
  """:func:`clipped_grad` after validation (also used by adaptive clipping).

  ``clip_spec`` as returned by the validation (per-layer entries may be traced
  float32 scalars here). With ``unit_inverse`` (a traced scalar ``1/D``) each
  example's clipped gradient is divided by D after clipping (never ``g/D``
  first; :func:`clip_groups`), and ``loss_sum`` and ``per_example_norms`` are
  reported divided by D as well.
  """
  uinv = None if unit_inverse is None else jnp.asarray(unit_inverse, jnp.float32)

  def value_and_grad_one(params, *args):
    out, grads = jax.value_and_grad(loss_fn, has_aux=has_aux)(params, *args)
    loss, aux = out if has_aux else (out, None)
    return loss, aux, grads

  def clip_one(grads: PyTree):
    """(clipped grads, global pre-clip norm, any scaled, scaled per group, finite)."""
    grads = _upcast(grads)
    leaves, treedef = jax.tree.flatten(grads)
    group_of, clips = leaf_groups(grads, per_layer, clip_spec, even_split)
    groups = [[i for i, g in enumerate(group_of) if g == k] for k in range(len(clips))]
    out, norm, any_scaled, per_group, finite = clip_groups(leaves, groups, clips, uinv)
    return jax.tree.unflatten(treedef, out), norm, any_scaled, per_group, finite

  def per_example(params, m, *args):
    loss, aux, grads = value_and_grad_one(params, *args)
    clipped, norm, was_scaled, per_group, _ = clip_one(grads)
    keep = m > 0
    clipped = jax.tree.map(lambda g: jnp.where(keep, g, jnp.zeros_like(g)), clipped)
    loss = jnp.where(keep, loss.astype(_compute_dtype(loss.dtype)), 0.0)
    norm = jnp.where(keep, norm, 0.0)
    was_scaled = jnp.logical_and(keep, was_scaled)
    per_group = jnp.logical_and(keep, per_group)
    return clipped, loss, norm, was_scaled, per_group, aux

  def per_example_factor(params, m, *args):
    """Raw-gradient clip factor of one example (flat): ``min(1 or 1/D, c' / ||g||)``."""
    loss, aux, grads = value_and_grad_one(params, *args)
    leaves = jax.tree.leaves(_upcast(grads))
    _, e, s, finite = scaled_sum_squares(leaves)
    ratio = jnp.ldexp(_safe_clip_any(clip_spec, leaves) / jnp.sqrt(s), -e)  # c' / ||g||
    cap = jnp.float32(1.0) if uinv is None else uinv
    factor = jnp.minimum(cap, ratio)
    # A factor in the subnormal range would round (relatively) far up: use 0 (norm 0 <= c).
    factor = jnp.where(factor < jnp.finfo(jnp.float32).tiny, 0.0, factor)
    keep = m > 0
    factor = jnp.where(jnp.logical_and(keep, finite), factor, 0.0)
    was_scaled = jnp.logical_and(keep, jnp.logical_or(ratio < cap, jnp.logical_not(finite)))
    norm = jnp.where(finite, _scaled_norm(e, s), jnp.inf)
    loss = loss.astype(_compute_dtype(loss.dtype))
    return (factor, jnp.where(keep, loss, 0.0), jnp.where(keep, norm, 0.0), was_scaled, finite,
            aux)

  def chunk_sums_vmap(params, mask, args):
    in_axes = [None, 0] + [0 if i in batch_argnums else None for i in range(1, len(args) + 1)]
    clipped, loss, norm, was_scaled, per_group, aux = jax.vmap(per_example, in_axes=in_axes)(
        params, mask, *args)
    gsum = jax.tree.map(lambda g: jnp.sum(g, axis=0), clipped)
    counts = jnp.sum(per_group.astype(jnp.int32), axis=0) if per_layer else None
    return gsum, jnp.sum(loss), norm, jnp.sum(was_scaled.astype(jnp.int32)), counts, aux

  def chunk_sums_reweight(params, mask, args):
    in_axes = [None, 0] + [0 if i in batch_argnums else None for i in range(1, len(args) + 1)]
    factor, loss, norm, was_scaled, finite, aux = jax.vmap(per_example_factor, in_axes=in_axes)(
        params, mask, *args)
    factor = jax.lax.stop_gradient(factor)

    def loss_only(p, *a):
      out = loss_fn(p, *a)
      return out[0] if has_aux else out

    def weighted_total(p):
      losses = jax.vmap(loss_only, in_axes=[None] + in_axes[2:])(p, *args)
      return jnp.sum(jnp.where(mask > 0, factor * losses, 0.0))

    def reweighted(_):
      gsum = jax.grad(weighted_total)(params)
      return gsum, jnp.sum(loss), norm, jnp.sum(was_scaled.astype(jnp.int32)), None, aux

    def materialised(_):
      return chunk_sums_vmap(params, mask, args)

    # One batched backward pass cannot keep a non-finite example out of the sum (0 * inf in
    # its own backward pass): when any slot (padding included) is non-finite, the chunk is
    # computed by the vmap method instead, which maps it to an exact zero.
    return jax.lax.cond(jnp.all(finite), reweighted, materialised, None)

  def chunk_sums(params, mask, args):
    if method == "reweight":
      return chunk_sums_reweight(params, mask, args)
    if method == "ghost":
      from jaxdp.dpsgd import ghost_norms  # pylint: disable=g-import-not-at-top
      return ghost_norms.ghost_chunk_sums(
          loss_fn, params, mask, args, batch_argnums=batch_argnums, has_aux=has_aux,
          per_layer=per_layer, clip_spec=clip_spec, even_split=even_split, unit_inverse=uinv)
    return chunk_sums_vmap(params, mask, args)

  def fn(*args, mask=None):
    if method == "reweight" and any(
        jnp.finfo(_compute_dtype(leaf.dtype)).bits > jnp.finfo(leaf.dtype).bits
        for leaf in jax.tree.leaves(args[0]) if jnp.issubdtype(leaf.dtype, jnp.floating)):
      raise ValueError("method='reweight' needs float32 (or wider) params: its clipped sum comes "
                       "from one backward pass in the params' dtype, so bfloat16/float16 params "
                       "would round the clipped gradients; use method='vmap'.")
    if len(args) < 1 + max(batch_argnums):
      raise ValueError(f"expected at least {1 + max(batch_argnums)} positional arguments "
                       f"(params and batch_argnums={batch_argnums}), got {len(args)}.")
    params, rest = args[0], args[1:]
    batch_leaves = [leaf for i in batch_argnums for leaf in jax.tree.leaves(args[i])]
    if not batch_leaves:
      raise ValueError("the batch_argnums arguments contain no arrays.")
    b = batch_leaves[0].shape[0]
    if any(leaf.shape[0] != b for leaf in batch_leaves):
      raise ValueError("all batch_argnums arrays must share the leading batch size.")
    # One abstract evaluation (shapes only) of the loss on one example: a named error for a
    # wrong feature count, a batch argument missing from batch_argnums, a non-scalar loss or
    # BatchNorm in training mode, instead of one from inside jax/optax/flax.
    _inputs.probe_loss(loss_fn, params, rest, batch_argnums=batch_argnums, has_aux=has_aux,
                       what="loss_fn")
    if per_layer:  # the group structure must match params (a named error otherwise)
      leaf_groups(params, per_layer, clip_spec, even_split)
    if mask is None:
      mask = jnp.ones((b,), jnp.float32)
    else:
      mask = jnp.asarray(mask)
      if mask.shape != (b,):
        raise ValueError(f"mask must have shape ({b},) to match the batch, got {mask.shape}.")
      mask = mask.astype(jnp.float32)
    n_groups = len(leaf_groups(params, per_layer, clip_spec, even_split)[1])
    if microbatch_size is None or b <= microbatch_size:
      gsum, loss_sum, norms, n_clipped, group_counts, aux = chunk_sums(params, mask, rest)
    else:
      mb = microbatch_size
      n_chunks = -(-b // mb)
      pad = n_chunks * mb - b

      def reshape(x, i):
        if (i + 1) not in batch_argnums:
          return x
        return jax.tree.map(
            lambda a: jnp.pad(a, [(0, pad)] + [(0, 0)] * (a.ndim - 1)).reshape(
                (n_chunks, mb) + a.shape[1:]), x)

      chunked = tuple(reshape(x, i) for i, x in enumerate(rest))
      mask_c = jnp.pad(mask, (0, pad)).reshape(n_chunks, mb)
      static_rest = {i: x for i, x in enumerate(rest) if (i + 1) not in batch_argnums}
      batched_idx = [i for i in range(len(rest)) if (i + 1) in batch_argnums]

      def body(carry, xs):
        acc, loss_acc, clip_acc, group_acc = carry
        m, *batched = xs
        full = [None] * len(rest)
        for i, v in static_rest.items():
          full[i] = v
        for i, v in zip(batched_idx, batched):
          full[i] = v
        gsum_c, loss_c, norms_c, n_c, groups_c, aux_c = chunk_sums(params, m, tuple(full))
        acc = jax.tree.map(jnp.add, acc, gsum_c)
        if groups_c is not None:
          group_acc = group_acc + groups_c
        return (acc, loss_acc + loss_c, clip_acc + n_c, group_acc), (norms_c, aux_c)

      zeros = jax.tree.map(lambda p: jnp.zeros(jnp.shape(p), _compute_dtype(jnp.result_type(p))),
                           params)
      (gsum, loss_sum, n_clipped, group_counts), (norms, aux) = jax.lax.scan(
          body, (zeros, jnp.zeros((), jnp.float32), jnp.zeros((), jnp.int32),
                 jnp.zeros((n_groups,), jnp.int32)),
          (mask_c, *[chunked[i] for i in batched_idx]))
      norms = norms.reshape(-1)[:b]
      if aux is not None:
        aux = jax.tree.map(lambda a: a.reshape((-1,) + a.shape[2:])[:b], aux)
    if not per_layer:
      group_counts = None
    if uinv is not None:  # report in units of D, like the clipped sum
      loss_sum = loss_sum * uinv
      norms = norms * uinv
    info = ClippedGradInfo(loss_sum=loss_sum, per_example_norms=norms, num_clipped=n_clipped,
                           num_examples=jnp.sum(mask), aux=aux if has_aux else None,
                           num_clipped_per_group=group_counts)
    return gsum, info

  return ClippedGradFn(fn, sensitivity, l2_clip_norm, per_layer, microbatch_size, batch_argnums,
                       method=method)
