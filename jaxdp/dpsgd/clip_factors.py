"""Per-example norms and clip factors of :mod:`jaxdp.dpsgd.clipping` (float32-safe).

The clip factor of one example is ``min(1, c' / ||g||)`` (``min(1/D, ...)``
under adaptive clipping), with ``c'`` the clip norm shrunk by a few float32
ulps so the computed clipped vector has exact norm ``<= c`` (the rounding
analysis of the :mod:`jaxdp.dpsgd.clipping` module docstring: Higham,
"Accuracy and Stability of Numerical Algorithms", 2nd ed., Section 4.2,
Eq. 4.4).

Two ways to compute the squared norm ``S = ||g||^2``, with the same bound:

* the plain one with its scaled twin (:func:`group_sum_squares`, used by
  ``method="vmap"`` and ``"reweight"``): the squares of the raw gradient,
  reduced in blocks of ``_BLOCK``. A square or partial sum below the
  smallest normal float32 may be flushed to zero, losing less than ``2^-126``
  each, so ``fl(S) + n 2^-125`` (``n`` terms, :func:`factor_from_sums`) is,
  after one more rounding, an upper bound of ``S (1 - r)^E`` with
  ``E = 2 + L (B - 1) + (K - 1)``, the ``E`` of :func:`_safe_multiplier`.
  It is valid exactly when ``fl(S)`` is finite (no square overflowed, no inf
  or NaN entry). The same reduction sums the squares of ``2^-k g``, ``k`` from
  :func:`low_exponent`, which cannot overflow for finite ``g``; where ``fl(S)``
  overflowed the same bound holds for ``2^-k g`` (the scaling is exact), and
  the factor is applied to ``2^-k g``;
* the power-of-two-scaled one (:func:`scaled_sum_squares`,
  :func:`clip_groups`, user-level clipping): each group is multiplied by
  ``2^-e``, ``2^e`` the power of two just above its largest entry, so the
  scaled squares cannot overflow; a finite gradient of any size is clipped
  correctly, and an example whose scaled sum is still not finite holds an inf
  or NaN and contributes exactly zero.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

PyTree = Any

_BLOCK = 256  # at most this many terms per reduction in the norm (see module docstring)
_UNIT_ROUNDOFF = 2.0 ** -24  # float32


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


_SIBLING_LIMIT = 65536  # leaves up to this size: two sibling reductions (see _sum_squares_pair)


def _add_pairs(p, q):
  return p[0] + q[0], p[1] + q[1]


def _sum_squares_pair(x: jax.Array, scale: float) -> tuple[jax.Array, jax.Array]:
  """``(sum x^2, sum (scale x)^2)`` in blocks of ``_BLOCK``, as ONE variadic reduction per level.

  The two sums of :func:`_sum_squares`'s blocking in one ``jax.lax.reduce``
  with two operands: XLA emits one loop that reads ``x`` once (two sibling
  reductions read it twice: on 2 CPU cores the vmapped pair over 256 x 670,000
  float32 took 1.62 s as siblings and 0.38 s as one variadic reduction). A leaf
  of at most ``_SIBLING_LIMIT`` entries gets the two plain reductions instead,
  which XLA:CPU runs faster there (the SmallCNN's vmap and reweight steps about
  5% faster). The blocking, hence the rounding bound, is the same either way.
  """
  dt = _compute_dtype(x.dtype)
  x = x.astype(dt).reshape(-1)
  if x.shape[0] <= _SIBLING_LIMIT:
    return _sum_squares(x), _sum_squares(x * jnp.asarray(scale, dt))
  v = (jnp.square(x), jnp.square(x * jnp.asarray(scale, dt)))
  zero = (jnp.zeros((), dt), jnp.zeros((), dt))
  while v[0].shape[0] > _BLOCK:
    m = -(-v[0].shape[0] // _BLOCK)
    v = tuple(jnp.pad(a, (0, m * _BLOCK - a.shape[0])).reshape(m, _BLOCK) for a in v)
    v = jax.lax.reduce(v, zero, _add_pairs, (1,))
  return jax.lax.reduce(v, zero, _add_pairs, (0,))


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
  """Clips ONE example's gradient group-wise; the core of user-level clipping.

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


_FLUSH_SLACK = 2.0 ** -125  # absolute, per summed term: a flushed square and partial sum


def num_terms(leaves: Sequence[Any]) -> int:
  """Number of entries of ``leaves`` (terms of their sum of squares)."""
  return int(sum(math.prod(jnp.shape(x)) for x in leaves))


def low_exponent(x: Any, n: int) -> int:
  """``k`` for which ``n`` squares of ``2^-k x`` cannot overflow, for any finite ``x``.

  With ``M = maxexp`` of ``x``'s (at least float32) dtype, ``|x| < 2^M``, so
  ``n (2^-k x)^2 < 2^(log2 n + 2M - 2k) <= 2^(M - 2)`` for ``k = ceil(M/2) +
  ceil(bits(n)/2) + 1`` (``bits(n) >= log2 n``): every partial sum, rounding
  included, stays below ``2^M``. float32: ``k = 75`` for a million terms, 81 for
  ``2^31``.
  """
  m = int(jnp.finfo(_compute_dtype(jnp.result_type(x))).maxexp)
  return (m + 1) // 2 + (max(int(n), 1).bit_length() + 1) // 2 + 1


def group_sum_squares(leaves: Sequence[jax.Array],
                      groups: Sequence[Sequence[int]]) -> tuple[jax.Array, jax.Array, list]:
  """``(S, S_low, k)``: plain and scaled sums of squares of ONE example's groups of leaves.

  ``S`` (G,) is the plain sum of squares of each group (every leaf reduced in
  blocks of ``_BLOCK``, :func:`_sum_squares`; 0 for an empty group).
  ``S_low`` (G,) is the same sum of the leaves scaled by the power of two
  ``2^-k`` of :func:`low_exponent` (exact but where it flushes to zero), which
  cannot overflow for finite leaves, ``k`` the Python int exponent of each
  group (``ldexp`` of a leaf's sum by ``2 (k_leaf - k)`` joins leaves of
  different dtypes). Both come from one variadic reduction per leaf
  (:func:`_sum_squares_pair`), which reads the leaf once. ``S_low`` is used only where ``S`` overflowed
  (:func:`factor_from_sums`), where the terms it flushes are negligible.
  """
  plain, low, ks = [], [], []
  for idx in groups:
    sub = [leaves[i] for i in idx]
    n = num_terms(sub)
    k_of = [low_exponent(x, n) for x in sub]
    k = max(k_of, default=0)
    dt = jnp.result_type(jnp.float32, *[_compute_dtype(x.dtype) for x in sub])
    pairs = [_sum_squares_pair(x, 2.0 ** -kx) for x, kx in zip(sub, k_of)]
    plain.append(sum((a for a, _ in pairs), jnp.zeros((), jnp.float32)))
    low.append(sum((b.astype(dt) * (4.0 ** (kx - k)) for (_, b), kx in zip(pairs, k_of)),
                   jnp.zeros((), jnp.float32)))
    ks.append(k)
  if not plain:
    z = jnp.zeros((0,), jnp.float32)
    return z, z, []
  return jnp.stack(plain), jnp.stack(low), ks


def plain_sum_squares(leaves: Sequence[jax.Array]) -> jax.Array:
  """``fl(sum g^2)`` of ONE example's leaves, blocked as :func:`_sum_squares` (the same bound).

  The plain sum alone (``method="reweight"``, which redoes an example whose sum
  overflowed with the vmap method instead of scaling it). A leaf of more than
  ``_SIBLING_LIMIT`` entries is reduced by the variadic reduction of
  :func:`_sum_squares_pair`, its scaled output unused: XLA:CPU runs that loop
  faster than its plain reduction of the same blocks (the MLP's reweight step
  at batch 256 on 2 cores: 0.83x with it), and the blocking, hence the
  rounding bound, is the same.
  """
  total = jnp.zeros((), jnp.float32)
  for x in leaves:
    big = math.prod(jnp.shape(x)) > _SIBLING_LIMIT
    total = total + (_sum_squares_pair(x, 1.0)[0] if big else _sum_squares(x))
  return total


def factor_from_sums(s: jax.Array, s_low: jax.Array, k: int, leaves: Sequence[Any], clip: Any,
                     cap: Any = None) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
  """``(p, f, below cap, finite)``: clip ``g`` as ``(g p) f``, from :func:`group_sum_squares`.

  ``s = fl(sum g^2)`` and ``s_low = fl(sum (2^-k g)^2)`` over the ``leaves``
  (shapes only are read). Where ``s`` is finite, ``p = 1`` and ``f = min(cap,
  c' / sqrt(s + n 2^-125))``: ``sqrt(s + n 2^-125)`` bounds ``||g||`` up to the
  roundings that ``c'`` absorbs (module docstring). Where ``s`` overflowed,
  ``p = 2^-k`` and ``f = min(2^k cap, c' / sqrt(s_low + n 2^-125))``: the
  scaling by a power of two is exact (an entry of ``g p`` flushed to zero only
  shrinks the clipped vector), and a scaled term or partial sum lost to
  flushing is below ``2^-126`` as in the plain sum, so the same analysis holds
  for ``g p``; ``f`` stays normal for a gradient of any finite size (the factor
  ``c'/||g||`` itself would be subnormal above ``||g|| = c' 2^126``). ``cap`` is 1
  (None) or ``1/D`` (adaptive clipping). A factor below the smallest normal
  float32 is 0 (a zero contribution always satisfies the bound). ``finite`` is
  False exactly when ``g`` holds an inf or NaN (both sums non-finite; for finite
  ``g`` ``s_low`` cannot overflow, :func:`low_exponent`); ``f`` is then
  meaningless and the caller must zero the contribution with a ``where``.
  """
  cap = jnp.float32(1.0) if cap is None else jnp.asarray(cap, jnp.float32)
  one = jnp.ones(jnp.shape(s), jnp.float32)
  if not leaves:
    return one, jnp.broadcast_to(cap, jnp.shape(s)), jnp.zeros(jnp.shape(s), bool), one > 0
  c = _safe_clip_any(clip, leaves)
  slack = jnp.float32(num_terms(leaves) * _FLUSH_SLACK)
  plain = jnp.isfinite(s)
  dt = jnp.result_type(jnp.float32, s_low)  # k of a float64 group is ~530: 2^-k is 0 in float32
  up = jnp.asarray(2.0 ** k, dt)
  ratio = c / jnp.sqrt(jnp.where(plain, s, s_low) + slack)
  limit = jnp.where(plain, cap, cap * up)
  f = jnp.minimum(limit, ratio)
  f = jnp.where(f < jnp.finfo(dt).tiny, 0.0, f)
  pre = jnp.where(plain, one, jnp.asarray(2.0 ** -k, dt))
  return pre, f, ratio < limit, jnp.logical_or(plain, jnp.isfinite(s_low))


def norm_from_sums(s: jax.Array, s_low: jax.Array, k: Sequence[int],
                   finite: jax.Array) -> jax.Array:
  """One example's global norm from the (G,) sums of :func:`group_sum_squares` (diagnostics).

  ``sqrt(sum_k s_k)`` where that is finite; else the scaled sums brought to the
  largest exponent ``K``, ``2^K sqrt(sum_k 4^(k_k - K) s_low_k)`` (a group's
  flushed terms are negligible next to the one that overflowed), ``inf`` when
  that overflows; ``inf`` for a non-finite example.
  """
  if not k:
    return jnp.zeros((), jnp.float32)
  total = jnp.sum(s)
  big = max(k)
  low = sum(s_low[i] * (4.0 ** (ki - big)) for i, ki in enumerate(k))
  huge = jnp.sqrt(low) * jnp.asarray(2.0 ** big, jnp.result_type(low))
  return jnp.where(finite, jnp.where(jnp.isfinite(total), jnp.sqrt(total), huge), jnp.inf)

