"""Per-example gradient norms without per-example gradients (ghost norms, book-keeping).

DP-SGD clips every per-example gradient ``g_n`` (paper
``000_tradeoffs_of_private_prediction.md`` Section 3.1, Equation 4; survey
``004_dp_machine_learning_survey.md`` Section 4.2, Algorithm 1, line 7). The
clip factor ``min(1, c / ||g_n||)`` needs only the NORM of ``g_n``, and for the
layers that hold almost all parameters that norm follows from the layer's
input activation ``a_n`` and the cotangent ``delta_n`` of its output, which one
ordinary batched forward + backward pass provides:

* Dense ``z = a W + b`` on T tokens (``a_n`` of shape (T, d), ``delta_n`` of
  shape (T, p)): ``grad_W = a_n^T delta_n``, so (Goodfellow 2015, "Efficient
  per-example gradient computations"; Li et al. 2022, "Large language models
  can be strong differentially private learners", Section 4, "ghost clipping")

    ||grad_W||_F^2 = ||a_n||^2 ||delta_n||^2                      (T = 1)
                   = sum_{t,s} (a_n a_n^T)_{ts} (delta_n delta_n^T)_{ts}   (Gram form),

  and ``grad_b = sum_t delta_{n,t}``.
* Conv: the same identity on the unfolded input (patches of size
  ``d = k_1 ... k_r c_in`` at the T output positions).
* Embed (ids ``i_t``): ``||grad_E||^2 = sum_{t,s} [i_t = i_s] <delta_t, delta_s>``.
* GroupNorm / LayerNorm (and Dense/Conv whenever it is cheaper): the layer's
  own per-example gradient, materialised for that layer only from
  ``(a_n, delta_n)`` with a per-layer ``jax.vjp``.

For Dense/Conv the Gram form costs ``T^2 (d + p)`` per example and the
per-layer materialisation ``T d p``; each layer uses the cheaper one ("mixed
ghost clipping", Bu et al. 2022, "Scalable and efficient training of large
convolutional neural networks with differential privacy", Section 3, Eq. 3.2
and the layerwise decision rule ``2 T^2 < p d``).

Book-keeping (Bu et al. 2023, "Differentially private optimization on large
model at small cost", Algorithm 1): the clipped sum needs no second backward
pass either, because for every covered layer

    sum_n C_n grad_W(n) = vjp_W[layer](a, C * delta),

one weight-gradient contraction of the stored activations with the reweighted
output cotangents (``C_n`` the clip factor of example n, or of the clip group
the parameter belongs to under per-layer clipping).

Capture is functional: the per-example loss is run under
``flax.linen.intercept_methods``; each call of a supported layer records its
input and returns ``output + eps`` with a zero "perturbation" ``eps`` whose
gradient is ``delta`` (the Flax ``perturb`` idea). Parameters the capture does
not cover -- parameters of unsupported layers, of layers called more than
once, layers inside lifted transforms, or parameters that ``loss_fn`` also
uses outside their layer -- get exact per-example gradients from ``jax.vmap``
in the SAME pass (the vmap fallback restricted to those parameters). Coverage
is checked, not assumed: with every covered layer re-run on
``stop_gradient`` of its own parameters, the JVP of the loss with respect to
all covered parameters must be a symbolic zero, i.e. they reach the loss only
through their own layer call; every leaf that fails is demoted to the vmap
fallback.

Floating point: the clip must never be too weak because the norm was
computed a little too small. The squared norm used for the clip factor is an
upper bound of the exact squared norm of ``a_n^T delta_n`` for the computed
``a_n, delta_n``: sums of nonnegative terms (||a||^2 ||delta||^2,
materialised gradients) are inflated by ``gamma_n = n u / (1 - n u)`` for
their longest reduction n (Higham, "Accuracy and Stability of Numerical
Algorithms", 2nd ed., Section 3.1 Lemma 3.1 and Eq. 4.4), and the Gram
forms, whose terms have both signs, get the absolute bound
``gamma_n (sum_t ||a_t|| ||delta_t||)^2`` (|G^a_ts G^d_ts| <=
||a_t|| ||a_s|| ||delta_t|| ||delta_s||). Like ``method="reweight"``, the
clipped sum itself is one batched contraction, with the rounding of an
ordinary backward pass.

Huge and non-finite gradients (as in :mod:`jaxdp.dpsgd.clipping`). Every
array whose squares are summed -- ``a_n``, ``delta_n``, materialised and
fallback gradients -- is first scaled per example by the power of two
``2^-k`` just above its largest entry (exact), so the norms of finite
gradients never overflow (entries of 1e30 in float32 are clipped correctly);
each leaf's squared norm is carried as ``4^k (sq + err)``, and leaves are
combined exactly by their exponents, the clip factor being
``min(1, 2^-E c' / sqrt(S))`` (set to 0 if it falls below the smallest normal
float32). Terms that underflow after the scaling are covered by an absolute
``2^-100`` per summed term in ``err``. An example with an inf or NaN anywhere in
``a_n``, ``delta_n`` or its materialised/fallback gradients contributes EXACTLY
ZERO (its activations and cotangents are replaced by zeros with
``jnp.where`` before the book-keeping contraction), counts as clipped and has
norm ``inf`` in the non-private diagnostics.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
import jax.extend
import jax.numpy as jnp
import numpy as np

from jaxdp.dpsgd import clipping as _clipping

PyTree = Any

_U = 2.0 ** -24  # float32 unit roundoff

# Layers whose norms are computed from (input, output cotangent). Exact types: a
# subclass may change the computation.
_SUPPORTED = {nn.Dense: "dense", nn.Conv: "conv", nn.Embed: "embed",
              nn.GroupNorm: "norm", nn.LayerNorm: "norm"}


@dataclasses.dataclass
class _Call:
  """One call of a supported layer found while tracing the per-example loss."""

  index: int  # position among the supported-layer calls of one trace
  kind: str
  path: tuple
  module: Any  # unbound clone (configuration only)
  leaves: dict  # param name -> leaf index in the flattened params (None: not a leaf)
  in_shape: tuple
  in_dtype: Any
  out_shape: tuple
  out_dtype: Any
  simple_args: bool  # exactly one positional argument and no keyword arguments
  strategy: str = ""  # how its norm is computed: "outer", "gram", "materialise"
  patches: bool = False  # conv only: the input unfolds into patches (gram, or materialise as a GEMM)


@dataclasses.dataclass
class GhostPlan:
  """Which parameters get ghost norms and which fall back to ``jax.vmap``.

  Attributes:
    calls: covered layer calls (each with ``.path``, ``.kind``, ``.strategy``).
    fallback_leaves: indices (into ``jax.tree.leaves(params)``) of parameters
      whose per-example gradients are materialised with ``jax.vmap``.
    fallback_paths: ``jax.tree_util.keystr`` of those parameters.
    num_leaves: number of parameter leaves.
  """

  calls: list
  fallback_leaves: list
  fallback_paths: list
  num_leaves: int
  num_intercepted: int


def _supported_config(call: _Call) -> bool:
  m = call.module
  if not call.simple_args:
    return False
  if call.kind == "dense":
    return getattr(m, "dot_general", None) is None and getattr(m, "dot_general_cls", None) is None
  if call.kind == "conv":
    return getattr(m, "mask", None) is None
  return True


def _interceptor_factory(on_call: Callable[..., Any]):
  """Interceptor calling ``on_call(k, module, next_fun, args, kwargs)`` for supported layers."""
  counter = [0]
  bypass = [False]

  def interceptor(next_fun, args, kwargs, context):
    module = context.module
    if bypass[0] or context.method_name != "__call__" or type(module) not in _SUPPORTED:
      return next_fun(*args, **kwargs)
    k = counter[0]
    counter[0] += 1
    return on_call(k, module, next_fun, args, kwargs, bypass)

  return interceptor


def _loss_only(loss_fn, has_aux):
  def f(params, *args):
    out = loss_fn(params, *args)
    return out[0] if has_aux else out
  return f


def _one_example_specs(args: tuple, batch_argnums: Sequence[int]) -> list:
  specs = []
  for i, a in enumerate(args):
    if (i + 1) in batch_argnums:
      specs.append(jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype), a))
    else:
      specs.append(jax.tree.map(lambda x: jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x)), a))
  return specs


def _discover(loss_fn, params, example_specs, has_aux) -> list:
  leaves, treedef = jax.tree.flatten(params)
  calls: list = []

  def f(leaf_vals, *example):
    idmap = {id(v): i for i, v in enumerate(leaf_vals)}

    def on_call(k, module, next_fun, args, kwargs, bypass):
      out = next_fun(*args, **kwargs)
      own = module.variables.get("params", {})
      flat_own = jax.tree_util.tree_flatten_with_path(own)[0]
      names = {jax.tree_util.keystr(p): idmap.get(id(v)) for p, v in flat_own}
      a0 = args[0] if args else None
      calls.append(_Call(
          index=k, kind=_SUPPORTED[type(module)], path=tuple(module.path),
          module=module.clone(parent=None), leaves=names,
          in_shape=tuple(jnp.shape(a0)) if a0 is not None else (),
          in_dtype=jnp.result_type(a0) if a0 is not None else None,
          out_shape=tuple(jnp.shape(out)), out_dtype=jnp.result_type(out),
          simple_args=(len(args) == 1 and not kwargs and isinstance(out, jax.Array))))
      return out

    with nn.intercept_methods(_interceptor_factory(on_call)):
      return _loss_only(loss_fn, has_aux)(jax.tree.unflatten(treedef, list(leaf_vals)), *example)

  jax.make_jaxpr(f)([jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x)) for x in leaves],
                    *example_specs)
  return calls


def _leaks(loss_fn, params, example_specs, has_aux, covered: list, test_leaves: list) -> bool:
  """Whether the covered leaves ``test_leaves`` reach the loss other than through their layer.

  Covered layers are re-run on ``stop_gradient`` of their own parameters; the
  JVP with tangents on ``test_leaves`` must then be a symbolic zero (a literal
  in the traced program).
  """
  leaves, treedef = jax.tree.flatten(params)
  cov = {c.index: c for c in covered}

  def f(test_vals, other_vals, *example):
    full = list(other_vals)
    for i, v in zip(test_leaves, test_vals):
      full[i] = v

    def on_call(k, module, next_fun, args, kwargs, bypass):
      if k not in cov:
        return next_fun(*args, **kwargs)
      own = jax.lax.stop_gradient(module.variables["params"])
      bypass[0] = True
      try:
        return cov[k].module.apply({"params": own}, *args, **kwargs)
      finally:
        bypass[0] = False

    with nn.intercept_methods(_interceptor_factory(on_call)):
      return _loss_only(loss_fn, has_aux)(jax.tree.unflatten(treedef, full), *example)

  def tangent_out(test_vals, tangents, other_vals, *example):
    return jax.jvp(lambda tv: f(tv, other_vals, *example), (test_vals,), (tangents,))[1]

  spec = [jax.ShapeDtypeStruct(jnp.shape(leaves[i]), jnp.result_type(leaves[i])) for i in test_leaves]
  other = [jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x)) for x in leaves]
  jaxpr = jax.make_jaxpr(tangent_out)(spec, spec, other, *example_specs)
  out = jaxpr.jaxpr.outvars[0]
  return not (isinstance(out, jax.extend.core.Literal) and float(out.val) == 0.0)


def _conv_patches_ok(call: _Call, leaves: list) -> bool:
  """Whether the conv's per-example input unfolds into patches (plain dense conv, no groups)."""
  m = call.module
  kernel = leaves[call.leaves["['kernel']"]]
  nd = len(kernel.shape) - 2
  padding = m.padding
  return (getattr(m, "feature_group_count", 1) == 1
          and getattr(m, "conv_general_dilated", None) is None
          and getattr(m, "conv_general_dilated_cls", None) is None
          and not (isinstance(padding, str) and padding.upper() in ("CIRCULAR", "REFLECT", "CAUSAL"))
          and len(call.in_shape) >= nd + 1)


def _strategy(call: _Call, leaves: list) -> str:
  kind = call.kind
  if kind == "norm":
    return "materialise"
  if kind == "embed":
    return "gram"
  if kind == "dense":
    d, p = call.in_shape[-1], call.out_shape[-1]
    t = math.prod(call.in_shape[:-1])
    if t == 1:
      return "outer"
    return "gram" if 2 * t * t * (d + p) < t * d * p else "materialise"
  # conv: T output positions (times inner batch), patch size d, p features.
  kernel = leaves[call.leaves["['kernel']"]]
  d, p = math.prod(kernel.shape[:-1]), kernel.shape[-1]
  t = math.prod(call.out_shape[:-1])
  call.patches = _conv_patches_ok(call, leaves)
  if call.patches and 2 * t * t * (d + p) < t * d * p:
    return "gram"
  return "materialise"


_PLAN_CACHE: dict = {}


def make_plan(loss_fn: Callable[..., Any], params: PyTree, *args: Any,
              batch_argnums: int | Sequence[int] = 1, has_aux: bool = False) -> GhostPlan:
  """Traces ``loss_fn`` on one example and decides, per parameter, ghost norm or vmap.

  Args:
    loss_fn: per-example loss ``(params, *args) -> scalar`` (or ``(scalar,
      aux)``), as for :func:`~jaxdp.dpsgd.clipped_grad`.
    params: parameters (arrays or shape/dtype structs).
    *args: the batched arguments (leading batch axis on ``batch_argnums``).
    batch_argnums: positions (>= 1) of the batched arguments.
    has_aux: whether ``loss_fn`` returns ``(loss, aux)``.

  Returns:
    A :class:`GhostPlan`.
  """
  if isinstance(batch_argnums, int):
    batch_argnums = (batch_argnums,)
  specs = _one_example_specs(args, tuple(batch_argnums))
  leaves_with_path, treedef = jax.tree_util.tree_flatten_with_path(params)
  leaves = [x for _, x in leaves_with_path]
  key = (loss_fn, treedef, tuple((jnp.shape(x), str(jnp.result_type(x))) for x in leaves),
         tuple(str(s) for s in jax.tree.leaves(specs)), str(jax.tree.structure(specs)),
         tuple(batch_argnums), has_aux)
  try:
    hit = _PLAN_CACHE.get(key)
  except TypeError:  # unhashable loss_fn
    hit, key = None, None
  if hit is not None:
    return hit
  calls = _discover(loss_fn, params, specs, has_aux)
  # A leaf is covered when exactly one supported call reads it and that call's
  # parameters are all leaves of ``params`` (not copies, slices, or lifted).
  uses: dict = {}
  for c in calls:
    for i in c.leaves.values():
      if i is not None:
        uses[i] = uses.get(i, 0) + 1
  covered = [c for c in calls
             if c.leaves and all(i is not None and uses[i] == 1 for i in c.leaves.values())
             and _supported_config(c)]
  if covered:
    test = sorted(i for c in covered for i in c.leaves.values())
    if _leaks(loss_fn, params, specs, has_aux, covered, test):
      bad = {i for i in test if _leaks(loss_fn, params, specs, has_aux, covered, [i])}
      covered = [c for c in covered if not bad.intersection(c.leaves.values())]
      if covered:
        test = sorted(i for c in covered for i in c.leaves.values())
        if _leaks(loss_fn, params, specs, has_aux, covered, test):  # pragma: no cover - defensive
          covered = []
  for c in covered:
    c.strategy = _strategy(c, leaves)
  covered_leaves = {i for c in covered for i in c.leaves.values()}
  fallback = [i for i in range(len(leaves)) if i not in covered_leaves]
  plan = GhostPlan(calls=covered, fallback_leaves=fallback,
                   fallback_paths=[jax.tree_util.keystr(leaves_with_path[i][0]) for i in fallback],
                   num_leaves=len(leaves), num_intercepted=len(calls))
  if key is not None:
    if len(_PLAN_CACHE) > 256:
      _PLAN_CACHE.clear()
    _PLAN_CACHE[key] = plan
  return plan


def _capture(loss_fn, plan: GhostPlan, params, mask, args, batch_argnums, has_aux):
  """One batched forward + backward pass: activations, output cotangents, fallback grads."""
  leaves, treedef = jax.tree.flatten(params)
  cov = {c.index: j for j, c in enumerate(plan.calls)}
  fb = plan.fallback_leaves
  b = mask.shape[0]

  def aug(eps, fb_vals, leaf_vals, *example):
    full = list(leaf_vals)
    for i, v in zip(fb, fb_vals):
      full[i] = v
    acts = [None] * len(plan.calls)

    def on_call(k, module, next_fun, a, kw, bypass):
      out = next_fun(*a, **kw)
      if k in cov:
        j = cov[k]
        acts[j] = a[0]
        out = out + eps[j]
      return out

    with nn.intercept_methods(_interceptor_factory(on_call)):
      out = loss_fn(jax.tree.unflatten(treedef, full), *example)
    loss, aux = out if has_aux else (out, None)
    return loss, (acts, aux)

  eps = [jnp.zeros((b,) + c.out_shape, c.out_dtype) for c in plan.calls]
  fb_vals = [leaves[i] for i in fb]
  in_axes = (0, None, None) + tuple(0 if (i + 1) in batch_argnums else None for i in range(len(args)))
  (loss, (acts, aux)), (deltas, fb_grads) = jax.vmap(
      jax.value_and_grad(aug, argnums=(0, 1), has_aux=True), in_axes=in_axes)(
          eps, fb_vals, leaves, *args)
  return loss, acts, deltas, fb_grads, aux


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
  roundings = 1  # the squaring
  while v.shape[1] > _BLOCK:
    m = -(-v.shape[1] // _BLOCK)
    v = jnp.pad(v, ((0, 0), (0, m * _BLOCK - v.shape[1]))).reshape(b, m, _BLOCK).sum(axis=2)
    roundings += _BLOCK - 1
  roundings += max(v.shape[1] - 1, 0)
  return jnp.sum(v, axis=1), _gamma(roundings)


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
  lo, hi = _clipping._exponent_range([x])  # pylint: disable=protected-access
  k = jnp.clip(k, lo, hi).astype(jnp.int32)
  scale = jnp.ldexp(jnp.ones((b,), x.dtype), -k).reshape((b,) + (1,) * (x.ndim - 1))
  return x * scale, k, finite


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


def _layer_sq_norms(call: _Call, leaves, a, d) -> tuple[dict, jax.Array]:
  """``({leaf: (sq (B,), err (B,), k (B,), grads or None)}, finite (B,))``.

  The leaf's squared per-example norm is at most ``4^k (sq + err)`` (module
  docstring: ``sq`` from power-of-two-scaled inputs, ``err`` its rounding and
  underflow bound). Materialised leaves return their (unscaled) per-example
  gradients (B, ...): their clipped sum is then ``sum_n C_n g_n`` of exactly
  the vectors whose norms were computed (as in the vmap method). Ghost leaves
  return None and are summed by book-keeping. ``finite`` is False for an
  example with an inf or NaN in ``a_n``, ``delta_n`` or a materialised gradient.
  """
  out = {}
  b = d.shape[0]
  finite = jnp.ones((b,), bool)
  grads = None
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
  if call.strategy == "materialise":
    # a and delta are checked too: a non-finite input can give a finite (0 * inf = NaN is
    # not finite, but e.g. a zero cotangent) gradient here and a NaN elsewhere.
    for x in (a, d):
      if jnp.issubdtype(x.dtype, jnp.floating):
        finite = jnp.logical_and(finite, _row_scale(x)[2])
    for path, g in jax.tree_util.tree_flatten_with_path(grads)[0]:
      i = call.leaves[jax.tree_util.keystr(path)]
      g = _f32(g)
      gs, k, fin = _row_scale(g)
      sq, gam = _rows_sumsq(gs)
      finite = jnp.logical_and(finite, fin)
      out[i] = (sq, sq * gam + _UNDERFLOW_SLACK * _row_terms(g), k, g)
    return out, finite
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
  if call.kind == "dense":
    at = _tokens(as_, 1)
  else:  # conv, gram via patches (patches of the scaled input: pure data movement, exact)
    at = _conv_patches(call, as_)
  dt = _tokens(ds, 1)
  slack = _UNDERFLOW_SLACK * (at.shape[1] * (at.shape[2] + dt.shape[2]) + at.shape[1] ** 2)
  if call.strategy == "outer":
    (a2, gam_a), (d2, gam_d) = _rows_sumsq(at), _rows_sumsq(dt)
    sq = a2 * d2
    err = sq * (gam_a + gam_d + gam_a * gam_d + 4 * _U) + slack * (1.0 + a2 + d2)
  else:
    sq, err = _gram_sq(at, dt, at.shape[2], dt.shape[2])
    err = err + slack
  out[call.leaves["['kernel']"]] = (sq, err, ka + kd, None)
  if "['bias']" in call.leaves:
    # grad_b = sum_t delta_t, materialised (p numbers per example), from the raw delta.
    bias = leaves[call.leaves["['bias']"]]
    gb = jnp.sum(_tokens(_f32(d), 1), axis=1).reshape((b,) + tuple(jnp.shape(bias)))
    gbs, kb, fb = _row_scale(gb)
    sqb, gam_b = _rows_sumsq(gbs)
    finite = jnp.logical_and(finite, fb)
    out[call.leaves["['bias']"]] = (sqb, sqb * gam_b + _UNDERFLOW_SLACK * _row_terms(gb), kb, gb)
  return out, finite


def _leaf_groups(params, per_layer: bool, clip_spec: Any, even_split: bool) -> tuple[list, list]:
  """(group index per leaf, clip norm per group); :func:`jaxdp.dpsgd.clipping.leaf_groups`."""
  return _clipping.leaf_groups(params, per_layer, clip_spec, even_split)


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
  m = _clipping.float32_at_most((1.0 - _U) ** 4 / (1.0 + _U) ** 3 * (1.0 - 1e-15))
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
  return _clipping._combine_scaled(parts)  # pylint: disable=protected-access


def per_example_sq_norms(loss_fn: Callable[..., Any], params: PyTree, *args: Any,
                         batch_argnums: int | Sequence[int] = 1, has_aux: bool = False,
                         plan: GhostPlan | None = None) -> PyTree:
  """Per-example squared gradient norm of every parameter leaf, without per-example gradients.

  Returns a pytree like ``params`` whose leaves are (B,) float32 arrays
  ``||d loss_fn(params, example_n) / d leaf||^2`` (ghost norms for covered
  layers, vmap for the rest; module docstring).
  """
  if isinstance(batch_argnums, int):
    batch_argnums = (batch_argnums,)
  batch_argnums = tuple(batch_argnums)
  if plan is None:
    plan = make_plan(loss_fn, params, *args, batch_argnums=batch_argnums, has_aux=has_aux)
  b = jax.tree.leaves(args[batch_argnums[0] - 1])[0].shape[0]
  mask = jnp.ones((b,), jnp.float32)
  leaves, treedef = jax.tree.flatten(params)
  _, acts, deltas, fb_grads, _ = _capture(loss_fn, plan, params, mask, args, batch_argnums, has_aux)
  sq = [None] * len(leaves)
  for c, a, d in zip(plan.calls, acts, deltas):
    for i, (s, _, k, _) in _layer_sq_norms(c, leaves, a, d)[0].items():
      sq[i] = jnp.ldexp(s, 2 * k)
  for i, g in zip(plan.fallback_leaves, fb_grads):
    gs, k, _ = _row_scale(g)
    sq[i] = jnp.ldexp(_rows_sumsq(gs)[0], 2 * k)
  return jax.tree.unflatten(treedef, sq)


def ghost_chunk_sums(loss_fn: Callable[..., Any], params: PyTree, mask: jax.Array, args: tuple, *,
                     batch_argnums: Sequence[int], has_aux: bool, per_layer: bool, clip_spec: Any,
                     even_split: bool, unit_inverse: Any = None):
  """Clipped gradient sum of one chunk by ghost norms + book-keeping.

  Returns ``(grad_sum, loss_sum, norms, num_clipped, num_clipped_per_group, aux)``
  with the meaning of ``clipping.clipped_grad``'s chunk sums: ``grad_sum = sum_n
  mask_n sum_k C_{n,k} g_{n,k}`` with ``C_{n,k} = min(1, c_k / ||g_{n,k}||)`` for
  clip group k (one group for flat clipping; ``min(1/D, ...)`` with
  ``unit_inverse = 1/D``), ``norms`` the global pre-clip norms (0 for masked
  slots, ``inf`` for non-finite examples, which contribute zero),
  ``num_clipped_per_group`` a (G,) count under per-layer clipping (else None).
  """
  batch_argnums = tuple(batch_argnums)
  plan = make_plan(loss_fn, params, *args, batch_argnums=batch_argnums, has_aux=has_aux)
  leaves, treedef = jax.tree.flatten(params)
  b = mask.shape[0]
  keep = mask > 0
  loss, acts, deltas, fb_grads, aux = _capture(loss_fn, plan, params, mask, args, batch_argnums,
                                               has_aux)
  group_of, clips = _leaf_groups(params, per_layer, clip_spec, even_split)
  n_groups = len(clips)
  parts_g: list = [[] for _ in range(n_groups)]
  diag_parts: list = []  # (k, sq) without the error bounds: the reported norms
  finite = jnp.ones((b,), bool)
  materialised: dict = {}
  for c, a, d in zip(plan.calls, acts, deltas):
    terms, fin = _layer_sq_norms(c, leaves, a, d)
    finite = jnp.logical_and(finite, fin)
    for i, (s, e, k, gi) in terms.items():
      if gi is not None:
        materialised[i] = gi
      parts_g[group_of[i]].append((k, s + e))
      diag_parts.append((k, s))
  for i, gr in zip(plan.fallback_leaves, fb_grads):
    gs, k, fin = _row_scale(gr)
    s, gam = _rows_sumsq(gs)
    finite = jnp.logical_and(finite, fin)
    parts_g[group_of[i]].append((k, s + s * gam + _UNDERFLOW_SLACK * _row_terms(gr)))
    diag_parts.append((k, s))
  # Non-finite sums (e.g. a gram of non-finite inputs) are caught here too.
  for parts in parts_g:
    for _, v in parts:
      finite = jnp.logical_and(finite, jnp.isfinite(v))
  use = jnp.logical_and(keep, finite)
  factors, scaled_g = [], []
  for g in range(n_groups):
    if not parts_g[g]:
      factors.append(jnp.zeros((b,), jnp.float32))
      scaled_g.append(jnp.zeros((b,), bool))
      continue
    big, total = _combine(parts_g[g])
    # Summing the K nonnegative leaf terms adds at most gamma_K (relative); the terms
    # lost to underflow in the combination add at most 2^-100 each.
    bound = (total + _UNDERFLOW_SLACK * len(parts_g[g])) * (1.0 + _gamma(len(leaves) + 2))
    f, sc = _safe_factor(big, bound, clips[g], unit_inverse)
    factors.append(jnp.where(use, f, 0.0))
    scaled_g.append(jnp.logical_and(keep, jnp.logical_or(sc, jnp.logical_not(finite))))
  per_group = jnp.stack(scaled_g) if scaled_g else jnp.zeros((0, b), bool)
  was_scaled = jnp.any(per_group, axis=0) if n_groups else jnp.zeros((b,), bool)

  out = [None] * len(leaves)
  # Book-keeping: grad = vjp_W(layer)(a, C * delta) per layer and clip group; a and delta
  # of unused (masked or non-finite) examples are replaced by zeros, never multiplied.
  for c, a, d in zip(plan.calls, acts, deltas):
    own = _own_params(c, leaves)
    own_f32 = jax.tree.map(_f32, own)
    a_safe = jnp.where(use.reshape((b,) + (1,) * (a.ndim - 1)), a, jnp.zeros_like(a))
    kd = use.reshape((b,) + (1,) * (d.ndim - 1))
    groups = sorted({group_of[i] for i in c.leaves.values() if i not in materialised})
    names_by_group = {g: [n for n, i in c.leaves.items()
                          if group_of[i] == g and i not in materialised] for g in groups}
    for g in groups:
      f = factors[g].reshape((b,) + (1,) * (d.ndim - 1))
      wd = jnp.where(kd, _f32(d) * f, 0.0)

      def batched(p, module=c.module, a_safe=a_safe):
        return jax.vmap(lambda ai: module.apply({"params": p}, ai))(a_safe)

      _, vjp = jax.vjp(batched, own_f32)
      grads = vjp(wd.astype(jax.eval_shape(batched, own_f32).dtype))[0]
      for path, gv in jax.tree_util.tree_flatten_with_path(grads)[0]:
        name = jax.tree_util.keystr(path)
        if name in names_by_group[g]:
          out[c.leaves[name]] = gv
  for i, gr in list(zip(plan.fallback_leaves, fb_grads)) + list(materialised.items()):
    f = factors[group_of[i]].reshape((b,) + (1,) * (gr.ndim - 1))
    kg = use.reshape((b,) + (1,) * (gr.ndim - 1))
    out[i] = jnp.sum(jnp.where(kg, _f32(gr) * f, 0.0), axis=0)
  gsum = jax.tree.unflatten(treedef, out)
  loss = jnp.where(keep, _f32(loss), 0.0)
  if diag_parts:
    big, total = _combine(diag_parts)
    norm = jnp.where(finite, _clipping._scaled_norm(big, total), jnp.inf)  # pylint: disable=protected-access
  else:
    norm = jnp.zeros((b,), jnp.float32)
  norms = jnp.where(keep, norm, 0.0)
  counts = jnp.sum(per_group.astype(jnp.int32), axis=1) if per_layer else None
  return (gsum, jnp.sum(loss), norms, jnp.sum(was_scaled.astype(jnp.int32)), counts, aux)


__all__ = ["GhostPlan", "ghost_chunk_sums", "make_plan", "per_example_sq_norms"]
