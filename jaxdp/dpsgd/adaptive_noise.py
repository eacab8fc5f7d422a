"""Adaptive clipping's noise transforms: flat and per-layer (Andrew et al. 2021, Alg. 1).

The optax transforms a training loop chains before its optimiser. Each takes
``(normalised clipped gradient sum, centered unclipped count(s))`` (from
:mod:`jaxdp.dpsgd.adaptive_grad`) and releases the noisy update at the
current clip norm, moving the clip norm with the noisy count
(:mod:`jaxdp.dpsgd.adaptive_state`):

* :func:`adaptive_clip_noise` -- one clip norm, around any noise transform of
  a sensitivity-1 sum (``noisy_aggregate`` for DP-SGD, ``correlated_noise``
  for the matrix mechanism);
* :func:`per_layer_adaptive_clip_noise` -- one clip norm and one noisy count
  per clip group, with the number of groups G fixed at construction or read
  from params at ``init`` (``num_groups="params"``);
* :func:`adaptive_noisy_aggregate` -- DP-SGD's Gaussian noise wrapped by
  either.

Why the wrappers build the gradient noise themselves: the accountant is
calibrated for ONE multiplier sigma, which must pay for the gradient AND the
counts (Andrew et al. 2021 Theorem 1). The gradient's share sigma_Delta
(:mod:`jaxdp.dpsgd.adaptive_accounting`) depends on sigma, sigma_b, the
number of counts G and the accounting (k, r), so the wrapper computes it and
builds the inner noise from a factory ``sigma_Delta -> transform`` (or checks
a built transform against it), and the counts can never go unpaid.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import jax
import numpy as np
import optax

from jaxdp import _validation
from jaxdp.dpsgd import adaptive_accounting, transforms
from jaxdp.dpsgd.adaptive_clip_norm import AdaptiveClipNorm, _check_normal_float32
from jaxdp.dpsgd.adaptive_state import AdaptiveClipState, _adaptive_wrapper


def _is_transformation(x: Any) -> bool:
  return isinstance(x, optax.GradientTransformation) or (
      hasattr(x, "init") and hasattr(x, "update"))


def _resolve_inner(inner: Any, *, noise_multiplier: float | None, sigma_b: float,
                   participations: int, sensitivity_ratio: float, num_counts: int) -> Any:
  """The inner noise transform, BUILT (factory) or CHECKED against sigma_Delta.

  ``sigma_Delta = r gradient_noise_multiplier(sigma / r, sigma_b,
  participations=k G)`` (Andrew et al. 2021 Thm 1 with k participations of G
  counts each;
  :func:`~jaxdp.dpsgd.adaptive_accounting.per_layer_gradient_noise_multiplier`).
  """
  sigma_delta = None
  inner_arg = inner
  if noise_multiplier is not None:
    sigma = _validation.check_nonnegative(noise_multiplier, "noise_multiplier")
    r = _validation.check_positive(sensitivity_ratio, "sensitivity_ratio")
    k = _validation.check_positive_int(participations, "participations")
    sigma_delta = adaptive_accounting.per_layer_gradient_noise_multiplier(
        sigma, sigma_b, num_counts, participations=k, sensitivity_ratio=r)
  if not _is_transformation(inner):
    if not callable(inner):
      raise TypeError(f"inner must be a factory gradient_noise_multiplier -> noise transform (or "
                      f"a transform built by transforms.noisy_aggregate), got "
                      f"{type(inner).__name__}.")
    if sigma_delta is None:
      raise TypeError("an inner factory needs noise_multiplier= (the sigma the accountant is "
                      "calibrated for): the wrapper builds the inner noise with sigma_Delta.")
    built = inner(sigma_delta)
    if not _is_transformation(built):
      raise TypeError(f"the inner factory must return an optax GradientTransformation, got "
                      f"{type(built).__name__}.")
    inner = built
  from_factory = sigma_delta is not None and not _is_transformation(inner_arg)
  meta_sigma = getattr(inner, "noise_multiplier", None)
  meta_sens = getattr(inner, "l2_sensitivity", None)
  if meta_sens is not None and float(meta_sens) != 1.0:
    raise ValueError(f"the inner noise transform is calibrated for l2_sensitivity={meta_sens}; "
                     "adaptive clipping feeds it the NORMALISED clipped sum, of sensitivity 1: "
                     "build it with l2_sensitivity=1.0.")
  if sigma_delta is not None:
    if from_factory and meta_sigma is None:
      return inner  # built here with sigma_Delta
    if meta_sigma is None:
      raise TypeError("the inner noise transform does not state its noise multiplier, so it "
                      "cannot be checked against the gradient's sigma_Delta: pass a factory "
                      "(lambda s: correlated_noise(strategy, n, s, 1.0, qN, key)) instead.")
    margin = 1.0 - 4 * adaptive_accounting._NOISE_MARGIN  # pylint: disable=protected-access
    if float(meta_sigma) < sigma_delta * margin:  # sigma_delta is rounded up
      raise ValueError(
          f"the inner noise transform adds noise_multiplier={float(meta_sigma):.6g}, but with "
          f"the counts' share the gradient needs sigma_Delta={sigma_delta:.6g} for a total "
          f"noise_multiplier={noise_multiplier} (joint multiplier "
          f"{_joint(float(meta_sigma), sigma_b, participations * num_counts):.4g} "
          f"< {noise_multiplier}): build it with gradient_noise_multiplier(...) -- or pass a "
          "factory and let the wrapper build it.")
    return inner
  warnings.warn(
      "adaptive_clip_noise was given a built inner transform without noise_multiplier=: its "
      "noise cannot be checked against the count noise's share (an inner built with the "
      "TOTAL sigma leaves the counts unpaid). Pass noise_multiplier= (and a factory for the "
      "correlated noise); this will become an error.", FutureWarning, stacklevel=3)
  return inner


def _joint(sigma_delta: float, sigma_b: float, counts: int) -> float:
  return adaptive_accounting.joint_noise_multiplier(sigma_delta, sigma_b, participations=counts)


def _common_args(config, expected_batch_size, count_noise_multiplier, num_groups):
  if not isinstance(config, AdaptiveClipNorm):
    raise TypeError(f"config must be an AdaptiveClipNorm, got {type(config).__name__}.")
  qn = _validation.check_positive(expected_batch_size, "expected_batch_size")
  if count_noise_multiplier is None:
    sigma_b = config.resolved_count_noise_multiplier(qn, num_groups)
  else:
    sigma_b = _validation.check_positive(count_noise_multiplier, "count_noise_multiplier")
    if config.count_noise_multiplier is not None and config.count_noise_multiplier != sigma_b:
      raise ValueError(f"count_noise_multiplier={sigma_b} differs from the config's "
                       f"count_noise_multiplier={config.count_noise_multiplier}; give one.")
  return qn, sigma_b


def adaptive_clip_noise(
    inner: Any,
    config: AdaptiveClipNorm,
    *,
    expected_batch_size: float,
    key: jax.Array,
    noise_multiplier: float | None = None,
    count_noise_multiplier: float | None = None,
    participations: int = 1,
    sensitivity_ratio: float = 1.0,
) -> optax.GradientTransformation:
  """Adaptive clipping around a noise transform (Andrew et al. 2021, Algorithm 1).

  ``update((grad_sum, centered_count), state)`` with

  * ``grad_sum``: the sum of the NORMALISED clipped per-example gradients
    (each ``g_i`` clipped to norm C_t, then divided by C_t;
    :func:`~jaxdp.dpsgd.adaptive_grad.adaptive_clipped_grad` with
    ``current_clip_norm(state)``), sensitivity 1;
  * ``centered_count``: ``sum_i (b_i - 1/2)`` over the batch, ``b_i = 1`` for
    an unclipped example (``centered_unclipped_count``), sensitivity 1/2;

  returns ``C_t * inner(grad_sum)`` (``inner`` adds its noise and divides by
  ``q N``; the product with the public C_t is post-processing) and the state
  with ``C_{t+1} = clip(C_t exp(-eta_C (btilde - gamma)), floor, ceiling)``,
  ``btilde = (centered_count + N(0, sigma_b^2) + qN/2) / (qN)``
  (:mod:`jaxdp.dpsgd.adaptive_state`; floor and ceiling from
  :meth:`AdaptiveClipNorm.clip_norm_bounds`, public constants, so the clamp
  is post-processing). The count noise is
  drawn with :func:`jaxdp.mechanisms.gaussian_noise` (full float32 tails), its
  std rounded up to float32, from the state's own key, split every step.

  The inner noise must be that of the GRADIENT's share, ``sigma_Delta =
  r gradient_noise_multiplier(sigma / r, sigma_b, participations=k)`` for the
  sigma the accountant is calibrated for (Andrew et al. 2021 Thm 1; k and r
  for the unamplified matrix mechanism,
  :func:`~jaxdp.dpsgd.adaptive_accounting.gradient_noise_multiplier`),
  never sigma itself (the counts would then go unpaid: at sigma_b = qN/20 and
  qN = 4, sigma = 1, the joint multiplier would be 0.894, not 1). So the
  wrapper builds or checks it:

  * ``inner`` a FACTORY ``sigma_Delta -> transform`` (recommended; e.g.
    ``lambda s: noisy_aggregate(s, 1.0, qN, k_g)`` or ``lambda s:
    correlated_noise(strategy, n, s, 1.0, qN, k_g)``) with
    ``noise_multiplier=sigma``: the wrapper computes sigma_Delta and builds it;
  * ``inner`` a built :class:`~jaxdp.dpsgd.transforms.NoiseTransformation`
    (``noisy_aggregate``'s result) with ``noise_multiplier=sigma``: its stated
    multiplier must be at least sigma_Delta and its sensitivity 1
    (``ValueError`` otherwise); a built transform that does not state its
    noise is refused (``TypeError``);
  * legacy: a built transform without ``noise_multiplier`` is accepted with a
    ``FutureWarning`` (unchecked; only its sensitivity, when stated, is checked).

  Args:
    inner: factory or noise transform (above) taking a clipped SUM of
      sensitivity 1 and returning the noisy average, with a key independent
      of ``key``.
    config: :class:`AdaptiveClipNorm`.
    expected_batch_size: ``q N`` > 0, the public divisor of the count (the
      same as the inner transform's).
    key: ``jax.random`` key of the count noise; never the inner transform's.
    noise_multiplier: sigma >= 0, the multiplier the accountant is calibrated
      for (gradient and counts together).
    count_noise_multiplier: sigma_b > 0; ``None`` takes the config's value
      (``expected_batch_size / 20`` when that is ``None`` too).
    participations: k >= 1: the counts one example moves under the
      accounting (the unamplified matrix mechanism's most participations; 1
      for DP-SGD and per-participation accountants).
    sensitivity_ratio: r > 0 (``accounting.run_sensitivity`` for the
      unamplified matrix mechanism; 1 otherwise).

  Raises:
    TypeError / ValueError: a bad argument or an inner noise below
      sigma_Delta (before anything runs); at ``init``, the inner state's key
      equal to ``key`` (the two noises would share their randomness); at
      ``update``, ``updates`` not a pair ``(pytree, scalar)``.
  """
  qn, sigma_b = _common_args(config, expected_batch_size, count_noise_multiplier, 1)
  _validation.check_key(key)
  inner = _resolve_inner(inner, noise_multiplier=noise_multiplier, sigma_b=sigma_b,
                         participations=participations, sensitivity_ratio=sensitivity_ratio,
                         num_counts=1)
  return _adaptive_wrapper(inner, config, qn=qn, key=key, sigma_b=sigma_b, groups=None,
                           per_layer=False)


_PARAMS = "params"  # num_groups="params": G = the number of params leaves, read at init


def per_layer_adaptive_clip_noise(
    inner: Any,
    config: AdaptiveClipNorm,
    *,
    noise_multiplier: float,
    expected_batch_size: float,
    key: jax.Array,
    groups: Any = None,
    num_groups: int | str | None = None,
    count_noise_multiplier: float | None = None,
    participations: int = 1,
    sensitivity_ratio: float = 1.0,
) -> optax.GradientTransformation:
  """Per-layer adaptive clipping: one clip norm ``C_t^l`` and one noisy count per group.

  Andrew et al. 2021 Algorithm 1 run for every clip group l (a layer, or any
  group of parameter leaves; per-layer clipping as in McMahan et al. 2018,
  Sec. 3). The state's clip norm is a pytree of float32 scalars
  (``current_clip_norm(state)``): the structure of ``groups``, or of params
  (one group per leaf) when ``groups`` is None. One step:

  1. Gradient: group l of each per-example gradient is clipped to ``C_l`` and
     the whole vector is divided by ``D = sqrt(sum_l C_l^2)``
     (``per_layer_normalisation``; ``adaptive_clipped_grad`` with
     ``per_layer=True``), so the normalised sum has sensitivity 1; the inner
     transform adds noise of std sigma_Delta and the output is multiplied by
     D (post-processing): the update of per-layer clipping at ``C_t^l`` with
     noise std ``sigma_Delta D`` on the sum, as for fixed per-layer clip norms.
  2. Counts: ``sum_i (b_i^l - 1/2)`` with ``b_i^l = 1[||g_i^l|| <= C_l]``, one
     per group (``info.num_clipped_per_group``), each with Gaussian noise of
     std sigma_b; ``C_l`` follows the geometric update with its own count,
     clamped to the config's floor and ceiling.

  Budget (Andrew et al. 2021 Thm 1, whitening, with G counts): one example
  moves each of the G counts by 1/2, so the count vector has L2 sensitivity
  ``sqrt(G)/2`` and the pair costs ``sigma^-2 = sigma_Delta^-2 + G (2
  sigma_b)^-2``: ``sigma_Delta = per_layer_gradient_noise_multiplier(sigma,
  sigma_b, G)`` (with k and r for the unamplified matrix mechanism; feasible
  iff ``G < (2 r sigma_b / sigma)^2 / k``,
  :func:`~jaxdp.dpsgd.adaptive_accounting.per_layer_gradient_noise_multiplier`).
  The default ``sigma_b = sqrt(G) qN / 20`` keeps the counts' share equal to
  that of one flat count (so sigma_Delta is the flat one and every G is
  feasible when one is). The wrapper builds or checks the inner noise as
  :func:`adaptive_clip_noise` does.

  G from params (``num_groups="params"``, ``groups`` None): G is the number of
  params leaves, known only at ``init(params)``. The event does not depend on
  G (one Gaussian of multiplier sigma per step); only the split does, so
  sigma_b (from the config when ``count_noise_multiplier`` is None) and
  sigma_Delta are resolved, and the inner factory called with sigma_Delta, at
  ``init``; ``update`` reads G from the state's clip norms and uses the same
  inner transform (built once per G). The transform is then identical to the
  one built with ``num_groups=G``. Arguments are checked at construction
  (including the split for one group); a G whose split is infeasible raises a
  ``ValueError`` at ``init``, before any noise is drawn.

  Args:
    inner: factory ``sigma_Delta -> transform`` or a checked built transform
      (see :func:`adaptive_clip_noise`), noise for a sum of sensitivity 1.
    config: :class:`AdaptiveClipNorm` (its ``initial`` starts every group
      unless ``groups`` gives per-group values; one floor and ceiling).
    noise_multiplier: sigma >= 0 the accountant is calibrated for.
    expected_batch_size: ``q N`` > 0.
    key: the count noise's key (never the inner transform's).
    groups: ``None`` (one group per params leaf; then give ``num_groups``)
      or a pytree PREFIX of params whose leaves are the groups' initial clip
      norms (positive normal float32 within the config's bounds), e.g.
      ``{"Dense_0": 0.1, "Dense_1": 0.1}``.
    num_groups: with ``groups`` None, G (the number of params leaves, checked
      at ``init``) or ``"params"`` (G read from params at ``init``, above).
    count_noise_multiplier: sigma_b of EACH count; ``None`` for the config's
      or ``sqrt(G) qN / 20``.
    participations, sensitivity_ratio: as for :func:`adaptive_clip_noise`.

  The loop feeds ``(grad_sum, centered_unclipped_count(info.num_examples,
  info.num_clipped_per_group))`` from
  ``adaptive_clipped_grad(loss, current_clip_norm(state), per_layer=True)``.
  """
  args = dict(noise_multiplier=noise_multiplier, expected_batch_size=expected_batch_size, key=key,
              count_noise_multiplier=count_noise_multiplier, participations=participations,
              sensitivity_ratio=sensitivity_ratio)
  if isinstance(num_groups, str):
    if num_groups != _PARAMS:
      raise ValueError(f"num_groups must be a positive int or {_PARAMS!r}, got {num_groups!r}.")
    if groups is not None:
      raise ValueError("num_groups='params' takes one group per params leaf: leave groups=None "
                       "(groups fixes G itself).")
    return _per_layer_from_params(inner, config, **args)
  g = _num_groups(config, groups, num_groups)
  tx = _per_layer_transform(inner, config, g, groups=groups, **args)

  def init_fn(params):
    state = tx.init(params)
    got = len(jax.tree.leaves(state.clip_norm))
    if got != g:
      raise ValueError(f"num_groups={g} but params has {got} leaves (one group each).")
    return state

  return optax.GradientTransformation(init_fn, tx.update)


def _num_groups(config: Any, groups: Any, num_groups: Any) -> int:
  """G from ``groups`` (checked against the config's bounds) or ``num_groups``."""
  if groups is None:
    if num_groups is None:
      raise ValueError("give groups (a pytree prefix of params), num_groups (the number of "
                       "params leaves, one group each) or num_groups='params' (G read from "
                       "params at init).")
    return _validation.check_positive_int(num_groups, "num_groups")
  values = jax.tree.leaves(groups)
  if not values:
    raise ValueError("groups must hold at least one initial clip norm.")
  lo, hi = config.clip_norm_bounds() if isinstance(config, AdaptiveClipNorm) else (0.0, math.inf)
  for v in values:
    c = _check_normal_float32(v, "groups entry (initial clip norm)")
    if not lo <= float(np.float32(c)) <= hi:
      raise ValueError(f"groups entry {c} is outside the config's clip norm bounds "
                       f"[{lo:.4g}, {hi:.4g}].")
  g = len(values)
  if num_groups is not None and _validation.check_positive_int(num_groups, "num_groups") != g:
    raise ValueError(f"num_groups={num_groups} but groups holds {g} clip norms.")
  return g


def _per_layer_transform(inner: Any, config: Any, g: int, *, noise_multiplier: Any,
                         expected_batch_size: Any, key: Any, count_noise_multiplier: Any,
                         participations: Any, sensitivity_ratio: Any,
                         groups: Any) -> optax.GradientTransformation:
  """The per-layer wrapper for G = ``g`` counts: sigma_b, then the inner noise of sigma_Delta."""
  qn, sigma_b = _common_args(config, expected_batch_size, count_noise_multiplier, g)
  _validation.check_key(key)
  if noise_multiplier is None:
    raise TypeError("noise_multiplier is required (the sigma the accountant is calibrated for).")
  inner = _resolve_inner(inner, noise_multiplier=noise_multiplier, sigma_b=sigma_b,
                         participations=participations, sensitivity_ratio=sensitivity_ratio,
                         num_counts=g)
  return _adaptive_wrapper(inner, config, qn=qn, key=key, sigma_b=sigma_b, groups=groups,
                           per_layer=True)


def _per_layer_from_params(inner: Any, config: Any,
                           **args: Any) -> optax.GradientTransformation:
  """:func:`per_layer_adaptive_clip_noise` with G = the number of params leaves, read at init.

  Checked now: the arguments, and the split for one group (the smallest G:
  with the default count noise the condition does not depend on G). At
  ``init``: the split for the actual G. The transform of each G is built once
  (:func:`_per_layer_transform`, the one ``num_groups=G`` builds).
  """
  _, sigma_b = _common_args(config, args["expected_batch_size"], args["count_noise_multiplier"], 1)
  _validation.check_key(args["key"])
  if args["noise_multiplier"] is None:
    raise TypeError("noise_multiplier is required (the sigma the accountant is calibrated for).")
  sigma = _validation.check_nonnegative(args["noise_multiplier"], "noise_multiplier")
  k = _validation.check_positive_int(args["participations"], "participations")
  r = _validation.check_positive(args["sensitivity_ratio"], "sensitivity_ratio")
  if not (_is_transformation(inner) or callable(inner)):
    raise TypeError(f"inner must be a factory gradient_noise_multiplier -> noise transform (or a "
                    f"transform built by transforms.noisy_aggregate), got {type(inner).__name__}.")
  adaptive_accounting.per_layer_gradient_noise_multiplier(sigma, sigma_b, 1, participations=k,
                                                          sensitivity_ratio=r)
  built: dict[int, optax.GradientTransformation] = {}

  def transform_for(g: int) -> optax.GradientTransformation:
    if g not in built:
      try:
        built[g] = _per_layer_transform(inner, config, g, groups=None, **args)
      except ValueError as err:
        raise ValueError(f"params has {g} leaves, one clip group each (num_groups='params'): "
                         f"{err}") from None
    return built[g]

  def init_fn(params):
    g = len(jax.tree.leaves(params))
    if g == 0:
      raise ValueError("params has no leaves: per-layer adaptive clipping needs at least one "
                       "clip group (num_groups='params').")
    return transform_for(g).init(params)

  def update_fn(updates, state, params=None):
    if not isinstance(state, AdaptiveClipState):
      raise TypeError(f"state must be the AdaptiveClipState of this transform's init, got "
                      f"{type(state).__name__}.")
    return transform_for(len(jax.tree.leaves(state.clip_norm))).update(updates, state, params)

  return optax.GradientTransformation(init_fn, update_fn)

def adaptive_noisy_aggregate(
    config: AdaptiveClipNorm,
    *,
    noise_multiplier: float,
    expected_batch_size: float,
    key: jax.Array,
    per_layer: bool = False,
    groups: Any = None,
    num_groups: int | str | None = None,
) -> optax.GradientTransformation:
  """DP-SGD noise with adaptive clipping, costing ``noise_multiplier`` per step.

  ``adaptive_clip_noise(lambda s: noisy_aggregate(s, 1.0, qN, k_g), config,
  noise_multiplier=sigma, key=k_b)`` with ``k_b, k_g = jax.random.split(key)``:
  the gradient gets ``sigma_Delta = gradient_noise_multiplier(sigma,
  sigma_b)`` -- NOT sigma, which is the joint multiplier of gradient and count
  (Andrew et al. 2021, Theorem 1). Each step is as private as DP-SGD with
  noise multiplier ``noise_multiplier``, so account it exactly like that
  (e.g. ``dpsgd_epsilon(noise_multiplier, q, steps, delta)``). With
  ``per_layer=True``: :func:`per_layer_adaptive_clip_noise` (``groups`` /
  ``num_groups`` as there; sigma_Delta then covers the G counts).
  """
  if not isinstance(config, AdaptiveClipNorm):
    raise TypeError(f"config must be an AdaptiveClipNorm, got {type(config).__name__}.")
  qn = _validation.check_positive(expected_batch_size, "expected_batch_size")
  _validation.check_nonnegative(noise_multiplier, "noise_multiplier")
  _validation.check_key(key)
  count_key, grad_key = jax.random.split(key)

  def factory(sigma_delta):
    return transforms.noisy_aggregate(sigma_delta, 1.0, qn, grad_key)

  if per_layer:
    return per_layer_adaptive_clip_noise(
        factory, config, noise_multiplier=noise_multiplier, expected_batch_size=qn,
        key=count_key, groups=groups, num_groups=num_groups)
  if groups is not None or num_groups is not None:
    raise ValueError("groups / num_groups need per_layer=True.")
  return adaptive_clip_noise(factory, config, noise_multiplier=noise_multiplier,
                             expected_batch_size=qn, key=count_key)


__all__ = ["adaptive_clip_noise", "adaptive_noisy_aggregate", "per_layer_adaptive_clip_noise"]
