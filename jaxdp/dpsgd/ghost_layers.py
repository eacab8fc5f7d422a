"""Per-layer squared norms of :mod:`jaxdp.dpsgd.ghost_norms`: the rules per layer kind.

For one covered layer call with per-example input ``a`` and output cotangent
``d`` (leading axis B), each parameter leaf gets, per example, a squared norm
``sq`` and an absolute bound ``err`` of its rounding (and underflow), so that
the exact squared norm of the per-example gradient is at most ``sq + err``
(Higham, "Accuracy and Stability of Numerical Algorithms", 2nd ed., Section
3.1 Lemma 3.1 and Eq. 4.4; the ghost norms module docstring):

* :func:`layer_grads`: the per-example gradients that are materialised
  (GroupNorm/LayerNorm and Dense/Conv where it is cheaper; the bias
  ``sum_t delta_t`` of a ghost Dense/Conv), computed once and shared by the
  norm rule below and by the book-keeping sum;
* :func:`layer_sq_norms_scaled`: the power-of-two-scaled computation, each
  array scaled per example by the power of two just above its largest entry
  (exact), the squared norm carried as ``4^k (sq + err)``, so that no finite
  float32 value overflows it and a non-finite one is reported, not summed
  (``_scaled_rows_sumsq``: on XLA:CPU, rows summed as they are and only
  the arrays with a non-finite plain row sum redone scaled).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxdp.dpsgd import clip_factors as _cf
from jaxdp.dpsgd.ghost_plan import _Call

_U = 2.0 ** -24  # float32 unit roundoff


def _f32(x):
  return x.astype(jnp.promote_types(x.dtype, jnp.float32))


def _gamma(n: int) -> float:
  """Higham's gamma_n = n u / (1 - n u) for float32 (plus a few roundings of slack)."""
  nu = (n + 4) * _U
  return nu / (1.0 - nu)


def _sumsq(x, axes):
  return jnp.sum(jnp.square(x), axis=axes)


_BLOCK = 256


def _rows_sumsq(x) -> tuple[jax.Array, float]:
  """Per-row sum of squares of (B, ...) reduced in blocks of <= 256, and its relative bound.

  Every term suffers at most ``E = 1 + sum_l (n_l - 1)`` roundings (n_l <= 256
  the block length of level l) in any summation order, so the computed sum is within
  ``gamma_E`` (relative) of the exact one (Higham Eq. 4.4; the sum of
  nonnegative terms), as in ``clipping._sum_squares``.
  """
  b = x.shape[0]
  v = jnp.square(_f32(x)).reshape((b, -1))
  while v.shape[1] > _BLOCK:
    m = -(-v.shape[1] // _BLOCK)
    v = jnp.pad(v, ((0, 0), (0, m * _BLOCK - v.shape[1]))).reshape(b, m, _BLOCK).sum(axis=2)
  return jnp.sum(v, axis=1), _rows_sumsq_gamma(x.shape)


def _rows_sumsq_gamma(shape) -> float:
  """The relative bound of :func:`_rows_sumsq` for an array of ``shape``."""
  n = int(math.prod(shape[1:]))
  roundings = 1  # the squaring
  while n > _BLOCK:
    n = -(-n // _BLOCK)
    roundings += _BLOCK - 1
  roundings += max(n - 1, 0)
  return _gamma(roundings)


_UNDERFLOW_SLACK = 2.0 ** -100  # absolute, per summed term, in scaled units (module docstring)


def _row_scale(x) -> tuple[jax.Array, jax.Array, jax.Array]:
  """``(x 2^-k, k, finite)`` per example (row) of (B, ...): ``2^k`` just above the row's max |x|.

  Exact (a change of exponent; ``k`` clamped so ``2^+-k`` stay normal). ``finite`` is
  False for a row with an inf or NaN (its scaled row is then meaningless).
  """
  x = _f32(x)
  b = x.shape[0]
  if x.size == 0:
    return x, jnp.zeros((b,), jnp.int32), jnp.ones((b,), bool)
  m = jnp.max(jnp.abs(x.reshape((b, -1))), axis=1).astype(jnp.float32)
  finite = jnp.isfinite(m)
  _, k = jnp.frexp(jnp.where(finite, m, 0.0))
  lo, hi = _cf._exponent_range([x])  # pylint: disable=protected-access
  k = jnp.clip(k, lo, hi).astype(jnp.int32)
  scale = jnp.ldexp(jnp.ones((b,), x.dtype), -k).reshape((b,) + (1,) * (x.ndim - 1))
  return x * scale, k, finite


# Which form :func:`_scaled_rows_sumsq` lowers to: "auto" (by platform), or, for the tests,
# "scaled" (every platform's form elsewhere than XLA:CPU) or "plain_first" (XLA:CPU's).
_SUMSQ_FORM = "auto"

# The smallest exponent k of a plain row sum's 4^k: the slack of 2^-100 per summed term in
# units of 4^k then covers the <= 2^-126 absolute that each square can lose to underflow.
_PLAIN_MIN_EXPONENT = -13


def _scaled_rows_sumsq(x) -> tuple[jax.Array, float, jax.Array, jax.Array]:
  """``(sq (B,), gamma, k (B,), finite (B,))``: the sum of squares of row ``n`` is at most
  ``4^k_n (sq_n (1 + gamma) + 2^-100 terms)`` (``terms`` the entries per row), and ``finite``
  is False for a row with an inf or NaN.

  Two forms of the same bound, chosen by platform at lowering
  (``jax.lax.platform_dependent``):

  * elsewhere than XLA:CPU, every row is first scaled by the power of two just above its
    largest entry (:func:`_row_scale`, exact), then summed (:func:`_rows_sumsq`): one
    more pass over the array, no ``cond`` (a ``cond`` reads its predicate on the host of
    an accelerator, a stall in every step; ghost norms module docstring);
  * on XLA:CPU the rows are summed as they are, and the sum ``s`` is written ``4^k
    (s 4^-k)`` with ``k = max(floor(e / 2), -13)`` for ``s = m 2^e`` (``frexp``; exact,
    a change of exponent); each square loses at most 2^-126 to underflow, within the
    slack at ``k >= -13``. The rows whose plain sum is not finite (an inf or NaN entry,
    or a finite row above ~1.8e19 in norm) are redone in the scaled form inside a
    ``jax.lax.cond`` taken only when there is such a row. Measured on the MLP of
    ``benchmarks/dpsgd.py`` (2 CPU cores, 357 rows): the plan's ghost clipped gradient
    in 8.8 ms against 9.6 ms with every row scaled first.
  """
  x = _f32(x)
  b = x.shape[0]
  gam = _rows_sumsq_gamma(x.shape)
  if x.size == 0:
    return jnp.zeros((b,), x.dtype), gam, jnp.zeros((b,), jnp.int32), jnp.ones((b,), bool)
  if _SUMSQ_FORM == "scaled":
    sq, k, finite = _all_rows_scaled(x)
  elif _SUMSQ_FORM == "plain_first":
    sq, k, finite = _plain_first(x)
  else:
    sq, k, finite = jax.lax.platform_dependent(x, cpu=_plain_first, default=_all_rows_scaled)
  return sq, gam, k, finite


def _all_rows_scaled(x):
  xs, k, finite = _row_scale(x)
  return _rows_sumsq(xs)[0], k, finite


def _plain_first(x):
  plain = _rows_sumsq(x)[0]
  ok = jnp.isfinite(plain)
  _, e = jnp.frexp(jnp.where(ok, plain, 0.0))
  k = jnp.maximum(jnp.floor_divide(e, 2), _PLAIN_MIN_EXPONENT).astype(jnp.int32)
  sq = jnp.ldexp(plain, -2 * k)

  def redo(v):
    s_scaled, k_scaled, fin = _all_rows_scaled(v)
    return jnp.where(ok, sq, s_scaled), jnp.where(ok, k, k_scaled), jnp.logical_or(ok, fin)

  return jax.lax.cond(jnp.all(ok), lambda v: (sq, k, ok), redo, x)


def _row_terms(x) -> int:
  return int(math.prod(x.shape[1:])) if x.ndim > 1 else 1


def _tokens(x, keep_last: int):
  """(B, ...) -> (B, T, rest) with the last ``keep_last`` axes flattened into ``rest``."""
  b = x.shape[0]
  rest = math.prod(x.shape[x.ndim - keep_last:]) if keep_last else 1
  return x.reshape((b, -1, rest))


def _materialise(call: _Call, leaves, a, d):
  """Per-example gradients of one layer's own parameters, from (a_n, delta_n)."""
  own = _own_params(call, leaves)

  def one(ai, di):
    _, vjp = jax.vjp(lambda p: call.module.apply({"params": p}, ai), own)
    return vjp(di.astype(call.out_dtype))[0]

  return jax.vmap(one)(a, d)


def _own_params(call: _Call, leaves):
  """The layer's parameter dict rebuilt from the flat leaves."""
  out: dict = {}
  for name, i in call.leaves.items():
    keys = [k for k in name.replace("']", "").split("['") if k]
    node = out
    for k in keys[:-1]:
      node = node.setdefault(k, {})
    node[keys[-1]] = leaves[i]
  return out


def _conv_patches(call: _Call, a):
  """Unfolded per-example conv input: (B, T, d) patches, features ordered (k_1, ..., k_r, c_in).

  Built from ``k_1 ... k_r`` strided slices of the padded input (pure data
  movement, exact); ``lax.conv_general_dilated_patches`` computes the same
  numbers as a convolution with an identity kernel, ``d`` times more work,
  and is used only for input (lhs) dilation. The feature order matches the
  kernel layout ``(k_1, ..., k_r, c_in, c_out)``.
  """
  from flax.linen.linear import canonicalize_padding  # pylint: disable=g-import-not-at-top
  import itertools  # pylint: disable=g-import-not-at-top
  m = call.module
  nd = len(m.kernel_size)
  b = a.shape[0]
  x = _f32(a.reshape((-1,) + a.shape[a.ndim - nd - 1:]))

  def tup(v):
    if v is None:
      return (1,) * nd
    return tuple(v) if isinstance(v, (tuple, list)) else (v,) * nd

  ksize, strides = tuple(m.kernel_size), tup(m.strides)
  kdil, ldil = tup(m.kernel_dilation), tup(m.input_dilation)
  padding = canonicalize_padding(m.padding, nd)
  if isinstance(padding, str):
    eff = tuple((k - 1) * dl + 1 for k, dl in zip(ksize, kdil))
    padding = jax.lax.padtype_to_pads(x.shape[1:1 + nd], eff, strides, padding)
  if any(v != 1 for v in ldil):
    spatial = "".join("HWDXYZ"[i] for i in range(nd))
    dn = ("N" + spatial + "C", spatial + "IO", "N" + spatial + "C")
    patches = jax.lax.conv_general_dilated_patches(
        x, ksize, strides, padding, lhs_dilation=ldil, rhs_dilation=kdil,
        dimension_numbers=dn, precision=jax.lax.Precision.HIGHEST)
    # (c_in, k_1, ..., k_r) -> (k_1, ..., k_r, c_in)
    c_in = x.shape[-1]
    patches = patches.reshape(patches.shape[:-1] + (c_in,) + ksize)
    patches = jnp.moveaxis(patches, nd + 1, -1)
    return patches.reshape((b, -1, c_in * math.prod(ksize)))
  xp = jnp.pad(x, [(0, 0)] + [tuple(p) for p in padding] + [(0, 0)])
  out_sp = tuple(call.out_shape[len(call.out_shape) - nd - 1:-1])
  slices = []
  for offs in itertools.product(*[range(k) for k in ksize]):
    start = (0,) + tuple(o * dl for o, dl in zip(offs, kdil)) + (0,)
    limit = ((xp.shape[0],) + tuple(st + s * (n - 1) + 1 for st, s, n in zip(start[1:], strides, out_sp))
             + (xp.shape[-1],))
    slices.append(jax.lax.slice(xp, start, limit, (1,) + strides + (1,)))
  patches = jnp.stack(slices, axis=-2)  # (N, *out_sp, prod(k), c_in)
  return patches.reshape((b, -1, patches.shape[-2] * patches.shape[-1]))


def _gram_sq(a, d, n_a: int, n_d: int):
  """sum_{t,s} (a a^T)_{ts} (d d^T)_{ts} and its absolute error bound, per example."""
  hi = jax.lax.Precision.HIGHEST
  ga = jnp.einsum("btk,bsk->bts", a, a, precision=hi)
  gd = jnp.einsum("btk,bsk->bts", d, d, precision=hi)
  sq = jnp.sum(ga * gd, axis=(1, 2))
  s = jnp.sum(jnp.sqrt(_sumsq(a, 2)) * jnp.sqrt(_sumsq(d, 2)), axis=1)
  t = a.shape[1]
  err = _gamma(max(n_a, n_d) + t * t + 2) * 2.0 * jnp.square(s)
  return sq, err



def layer_grads(call: _Call, leaves, a, d) -> dict:
  """``{leaf index: per-example gradient (B, ...) in float32}`` of the materialised leaves.

  All parameters of a ``"materialise"`` call, and the bias ``grad_b = sum_t
  delta_t`` (p numbers per example, from the raw delta) of a ghost Dense/Conv.
  Their clipped sum is ``sum_n C_n g_n`` of exactly these vectors, whose norms
  the rules below compute (as in the vmap method).
  """
  if call.strategy == "materialise" and call.kind == "conv" and call.patches:
    # grad_W(n) = P_n^T delta_n from the unfolded input P_n (T, c_in k_1..k_r): one
    # batched GEMM, where the vmapped conv vjp is a grouped convolution (slow on XLA:CPU).
    kernel = leaves[call.leaves["['kernel']"]]
    pt = _conv_patches(call, a)  # features ordered (k_1, ..., k_r, c_in), as the kernel
    dt = _tokens(_f32(d), 1)
    gk = jnp.einsum("btk,btp->bkp", pt, dt, precision=jax.lax.Precision.HIGHEST)
    gk = gk.reshape((gk.shape[0],) + tuple(kernel.shape))
    grads = {"kernel": gk}
    if "['bias']" in call.leaves:
      bias = leaves[call.leaves["['bias']"]]
      grads["bias"] = jnp.sum(dt, axis=1).reshape((dt.shape[0],) + tuple(jnp.shape(bias)))
  elif call.strategy == "materialise":
    grads = _materialise(call, leaves, a, d)
  elif call.kind != "embed" and "['bias']" in call.leaves:
    bias = leaves[call.leaves["['bias']"]]
    gb = jnp.sum(_tokens(_f32(d), 1), axis=1).reshape((d.shape[0],) + tuple(jnp.shape(bias)))
    return {call.leaves["['bias']"]: gb}
  else:
    return {}
  return {call.leaves[jax.tree_util.keystr(path)]: _f32(g)
          for path, g in jax.tree_util.tree_flatten_with_path(grads)[0]}


def layer_sq_norms_scaled(call: _Call, leaves, a, d, grads: dict) -> tuple[dict, jax.Array]:
  """``({leaf: (sq (B,), err (B,), k (B,), grads or None)}, finite (B,))``, scaled.

  The leaf's squared per-example norm is at most ``4^k (sq + err)`` (``sq``
  from power-of-two-scaled inputs, ``err`` its rounding and underflow bound).
  Materialised leaves (``grads`` of :func:`layer_grads`) return their
  gradients, ghost leaves None. ``finite`` is False for an example with an inf
  or NaN in a ghost layer's ``a_n`` or ``delta_n`` or in a materialised gradient.
  """
  out = {}
  b = d.shape[0]
  finite = jnp.ones((b,), bool)
  if call.strategy == "materialise":
    # Only the gradients: the book-keeping of a materialised layer reads its gradients, never
    # a or delta, and an inf or NaN in a or delta that a window reads reaches the gradient
    # (x * 0 is NaN for x = inf or NaN); one no window reads changes nothing released.
    return _with_materialised(out, grads, finite)
  if call.strategy == "outer":  # a one-token dense layer (embeddings always take "gram")
    # ||a||^2 ||delta||^2: two row sums of squares (both forms of _scaled_rows_sumsq).
    (d2, gam_d, kd, fd), (a2, gam_a, ka, fa) = _scaled_rows_sumsq(d), _scaled_rows_sumsq(a)
    finite = jnp.logical_and(finite, jnp.logical_and(fd, fa))
    t = int(math.prod(a.shape[1:-1]))
    slack = _UNDERFLOW_SLACK * (t * (a.shape[-1] + d.shape[-1]) + t ** 2)
    sq = a2 * d2
    err = sq * (gam_a + gam_d + gam_a * gam_d + 4 * _U) + slack * (1.0 + a2 + d2)
    out[call.leaves["['kernel']"]] = (sq, err, ka + kd, None)
    return _with_materialised(out, grads, finite)
  ds, kd, fd = _row_scale(d)
  finite = jnp.logical_and(finite, fd)
  if call.kind == "embed":
    ids = a.reshape((a.shape[0], -1))
    dt = _tokens(ds, 1)
    eq = (ids[:, :, None] == ids[:, None, :]).astype(jnp.float32)
    gd = jnp.einsum("btk,bsk->bts", dt, dt, precision=jax.lax.Precision.HIGHEST)
    sq = jnp.sum(eq * gd, axis=(1, 2))
    s = jnp.sum(jnp.sqrt(_sumsq(dt, 2)), axis=1)
    t = dt.shape[1]
    err = (_gamma(dt.shape[2] + t * t + 2) * 2.0 * jnp.square(s)
           + _UNDERFLOW_SLACK * (dt.shape[2] * t + t * t))
    out[call.leaves["['embedding']"]] = (sq, err, kd, None)
    return out, finite
  as_, ka, fa = _row_scale(a)
  finite = jnp.logical_and(finite, fa)
  at = _tokens(as_, 1) if call.kind == "dense" else _conv_patches(call, as_)
  dt = _tokens(ds, 1)
  slack = _UNDERFLOW_SLACK * (at.shape[1] * (at.shape[2] + dt.shape[2]) + at.shape[1] ** 2)
  sq, err = _gram_sq(at, dt, at.shape[2], dt.shape[2])
  out[call.leaves["['kernel']"]] = (sq, err + slack, ka + kd, None)
  return _with_materialised(out, grads, finite)


def _with_materialised(out: dict, grads: dict, finite):
  """``out`` and ``finite`` with the entries of the materialised gradients ``grads`` added
  (a materialised layer's leaves, or a ghost layer's bias)."""
  for i, g in grads.items():
    sq, gam, k, fin = _scaled_rows_sumsq(g)
    finite = jnp.logical_and(finite, fin)
    out[i] = (sq, sq * gam + _UNDERFLOW_SLACK * _row_terms(g), k, g)
  return out, finite


def _layer_sq_norms(call: _Call, leaves, a, d) -> tuple[dict, jax.Array]:
  """:func:`layer_sq_norms_scaled` with the gradients of :func:`layer_grads`."""
  return layer_sq_norms_scaled(call, leaves, a, d, layer_grads(call, leaves, a, d))


def _leaf_groups(params, per_layer: bool, clip_spec: Any, even_split: bool) -> tuple[list, list]:
  """(group index per leaf, clip norm per group); :func:`jaxdp.dpsgd.clipping.leaf_groups`."""
  return _cf.leaf_groups(params, per_layer, clip_spec, even_split)


def _safe_clip(clip: Any) -> Any:
  """c' with ``fl(c' / sqrt(bound))``, its exact power-of-two scaling and the product
  with the cotangent never above ``c / ||g||`` (three roundings, rounded down to float32;
  one more for a traced clip, whose product with the constant rounds too)."""
  if isinstance(clip, (int, float, np.floating)):
    clip = float(clip)
    if math.isinf(clip):
      return clip
    target = clip * (1.0 - _U) ** 3 / (1.0 + _U) ** 3 * (1.0 - 1e-15)
    c = np.float32(target)
    if float(c) > target:
      c = np.nextafter(c, np.float32(0.0))
    return float(c)
  m = _cf.float32_at_most((1.0 - _U) ** 4 / (1.0 + _U) ** 3 * (1.0 - 1e-15))
  return jnp.asarray(clip, jnp.float32) * jnp.float32(m)


def _safe_factor(exponent, bound_sq, clip: Any, cap: Any = None):
  """``min(cap, c' / (2^E sqrt(bound)))``: the clip factor of ``||g||^2 <= 4^E bound``.

  ``cap`` is 1 (fixed clipping) or ``1/D`` (adaptive clipping: clip to ``D c``, then
  divide by D). A factor below the smallest normal float32 is set to 0 (its rounding
  could be relatively large; a zero contribution always satisfies the bound).
  """
  cap = jnp.float32(1.0) if cap is None else jnp.asarray(cap, jnp.float32)
  c = _safe_clip(clip)
  if isinstance(c, float) and math.isinf(c):
    return jnp.broadcast_to(cap, jnp.shape(bound_sq)), jnp.zeros(jnp.shape(bound_sq), bool)
  ratio = jnp.ldexp(c / jnp.sqrt(bound_sq), -jnp.maximum(exponent, -1000))
  f = jnp.minimum(cap, ratio)
  f = jnp.where(f < jnp.finfo(jnp.float32).tiny, 0.0, f)
  return f, ratio < cap


def _combine(parts):
  """``(E, S)`` with ``sum_i 4^(k_i) v_i <= 4^E S`` for (B,) pairs ``(k_i, v_i)``."""
  if not parts:
    return None, None
  return _cf._combine_scaled(parts)  # pylint: disable=protected-access

