"""Which parameters get ghost norms (:func:`make_plan`) and the capture pass (:func:`_capture`).

The plan of :mod:`jaxdp.dpsgd.ghost_norms`: the per-example loss is traced on
one example under ``flax.linen.intercept_methods``; every call of a supported
layer (Dense, Conv, Embed, GroupNorm, LayerNorm) whose parameters are leaves of
``params`` read by that call alone is covered, after checking that the covered
parameters reach the loss only through their own layer (the JVP of the loss
with every covered layer re-run on ``stop_gradient`` of its parameters must be
a symbolic zero); everything else falls back to ``jax.vmap``. The capture is
one batched forward + backward pass that returns each covered layer's input and
output cotangent and the fallback parameters' per-example gradients (module
docstring of :mod:`jaxdp.dpsgd.ghost_norms`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
import jax.extend
import jax.numpy as jnp

PyTree = Any

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

