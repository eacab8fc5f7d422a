"""Adaptive clipping: clip to a privately estimated quantile of the gradient norms.

Andrew, Thakkar, McMahan & Ramaswamy 2021, "Differentially private learning
with adaptive clipping" (NeurIPS), Algorithm 1 and Theorem 1. A fixed clip
norm C must be tuned: too small biases every step, too large drowns the
gradient in noise ``sigma C / (q N)``. Adaptive clipping instead tracks the
gamma-quantile of the per-example gradient norms, privately, at a negligible
privacy cost, and clips to it.

Step t, with clip norm C_t (public: a function of earlier noisy releases only):

1. Gradients in NORMALISED space. Every per-example gradient is divided by
   C_t and clipped to norm 1, ``gbar_i = (g_i / C_t) min(1, C_t / ||g_i||)``,
   so the sum ``sum_i gbar_i`` has L2 sensitivity 1 whatever C_t is (add or
   remove one example moves it by one vector of norm <= 1). The gradient of
   ``loss / C_t`` is ``g_i / C_t``, so ``clipped_grad`` of the normalised loss
   with ``l2_clip_norm=1.0`` computes it with every clipping method
   (:func:`adaptive_clipped_grad`).
2. The noise transform given as ``inner`` (``noisy_aggregate`` for DP-SGD, or
   a correlated-noise transform) adds Gaussian noise of std ``sigma_Delta``
   (sensitivity 1) to that sum and divides by the expected batch size ``q N``;
   the result is multiplied by C_t (post-processing), so the released update is
   ``C_t (sum_i gbar_i + z) / (q N)``: the usual DP-SGD update at clip norm
   C_t with noise std ``sigma_Delta C_t`` on the sum.
3. The unclipped indicator ``b_i = 1[||g_i|| <= C_t]`` is released as a noisy
   count of the CENTERED indicators, ``sum_i (b_i - 1/2) + N(0, sigma_b^2)``:
   one example adds ``+1/2`` or ``-1/2``, so the sensitivity is 1/2 (Andrew
   et al.'s centring, which halves the sensitivity of ``sum_i b_i``; it is
   where the ``2 sigma_b`` of their Theorem 1 comes from).
   ``btilde = (noisy + qN/2) / (qN)`` estimates the fraction
   of unclipped examples (``qN`` is the public expected batch size, never the
   realised one), and the clip norm moves geometrically towards the target
   quantile gamma (Andrew et al., Algorithm 1, geometric update):

     C_{t+1} = C_t exp(-eta_C (btilde - gamma)).

   If more than gamma of the examples are unclipped, C shrinks; if fewer, it
   grows; the fixed point is ``P(||g|| <= C) = gamma``.

Privacy (Andrew et al. 2021, Theorem 1): one step releases two Gaussians,
``(sum gbar + N(0, sigma_Delta^2 I), sum (b - 1/2) + N(0, sigma_b^2))``,
whose sensitivities are 1 and 1/2. Dividing the second by ``sigma_b /
sigma_Delta`` (whitening; invertible, so it changes no privacy curve) gives ONE
isotropic Gaussian of std sigma_Delta whose sensitivity is
``sqrt(1 + (sigma_Delta / (2 sigma_b))^2)``, i.e. the Gaussian mechanism
with noise multiplier

  sigma = (sigma_Delta^-2 + (2 sigma_b)^-2)^-1/2.

Every accountant for Gaussian noise (Poisson subsampling included, which only
sees the whitened shift of the one example that is added or removed) applies
unchanged with this sigma, so an accountant calibrated for sigma pays for
adaptive clipping when the gradient uses :func:`gradient_noise_multiplier`
``(sigma, sigma_b)``. Replace-one neighbours double both sensitivities (2 and
1): the same ratio, the same formula. C_t is chosen from earlier releases only,
so the steps compose adaptively, as the accountant assumes.

Defaults: the settings Andrew et al. 2021 recommend for every task (their
experiments; repeated in the documentation of TensorFlow Privacy's
``QuantileAdaptiveClipSumQuery`` and of Flower's adaptive-clipping
strategies): target quantile gamma = 0.5 (the median), learning rate
eta_C = 0.2 with the geometric update, initial clip norm C_0 = 0.1, count
noise ``sigma_b = expected_batch_size / 20``. With
``sigma_b = qN/20`` the count costs almost nothing: at ``qN = 256`` and
sigma = 1, ``sigma_Delta = 1.00076``.

Custom loop (DP-SGD with adaptive clipping; each step's mask is a Poisson
sample of rate q, and ``dpsgd_epsilon(1.0, q, T, delta)`` is its guarantee):

>>> import jax, jax.numpy as jnp, optax
>>> from jaxdp.dpsgd import adaptive_clipping as ac
>>> n, q = 512, 0.125
>>> x = jax.random.normal(jax.random.key(0), (n, 3))
>>> y = x @ jnp.array([1.0, -2.0, 0.5]) + 0.3 * jax.random.normal(jax.random.key(1), (n,))
>>> loss = lambda w, xi, yi: 0.5 * (jnp.dot(w, xi) - yi) ** 2
>>> tx = optax.chain(
...     ac.adaptive_noisy_aggregate(ac.AdaptiveClipNorm(initial=0.1), noise_multiplier=1.0,
...                                 expected_batch_size=q * n, key=jax.random.key(2)),
...     optax.sgd(0.5))
>>> @jax.jit
... def step(w, state, key):
...   mask = jax.random.bernoulli(key, q, (n,))   # Poisson sample of rate q
...   grad_fn = ac.adaptive_clipped_grad(loss, ac.current_clip_norm(state),
...                                      batch_argnums=(1, 2))
...   g, info = grad_fn(w, x, y, mask=mask)
...   count = ac.centered_unclipped_count(info.num_examples, info.num_clipped)
...   updates, state = tx.update((g, count), state, w)
...   return optax.apply_updates(w, updates), state
>>> w = jnp.zeros(3)
>>> state = tx.init(w)
>>> for key in jax.random.split(jax.random.key(3), 100):
...   w, state = step(w, state, key)
>>> int(state[0].count)
100
>>> bool(jnp.mean((x @ w - y) ** 2) < 0.15)   # the noise level 0.3^2 = 0.09
True

The clip norm has moved from 0.1 to about the median of the per-example
gradient norms ``|w.x_i - y_i| ||x_i||`` at the trained w:

>>> norms = jnp.abs(x @ w - y) * jnp.linalg.norm(x, axis=1)
>>> bool(abs(jnp.mean(norms <= ac.current_clip_norm(state)) - 0.5) < 0.15)
True
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxdp import _validation
from jaxdp import mechanisms
from jaxdp.dpsgd import clipping, transforms

PyTree = Any

# Relative margin added to sigma_Delta so that rounding in the float64 formula can
# only ADD noise (the joint multiplier is then >= the one calibrated, never below).
_NOISE_MARGIN = 1e-12
# Default count noise: sigma_b = expected_batch_size / _DEFAULT_COUNT_DIVISOR
# (Andrew et al. 2021's recommendation).
_DEFAULT_COUNT_DIVISOR = 20.0


@dataclasses.dataclass(frozen=True)
class AdaptiveClipNorm:
  """Configuration of adaptive clipping (Andrew et al. 2021, Algorithm 1).

  Attributes:
    initial: clip norm C_0 > 0 of the first step (Andrew et al. use 0.1; any
      value works, the clip norm moves by a factor up to ``exp(learning_rate)``
      per step, so start within a few e-folds of the target).
    target_quantile: gamma in (0, 1), the fraction of per-example gradients
      that should be UNCLIPPED (0.5: clip to the median norm, the paper's
      recommendation).
    learning_rate: eta_C > 0 of the geometric update
      ``C <- C exp(-eta_C (btilde - gamma))`` (0.2 recommended).
    count_noise_multiplier: sigma_b > 0, the std of the Gaussian added to the
      centered unclipped count (sensitivity 1/2), or ``None`` for Andrew et
      al.'s ``expected_batch_size / 20`` (:meth:`resolved_count_noise_multiplier`).
  """

  initial: float
  target_quantile: float = 0.5
  learning_rate: float = 0.2
  count_noise_multiplier: float | None = None

  def __post_init__(self):
    _validation.check_positive(self.initial, "AdaptiveClipNorm.initial")
    gamma = _validation._as_float(  # pylint: disable=protected-access
        self.target_quantile, "AdaptiveClipNorm.target_quantile")
    if not 0.0 < gamma < 1.0:
      raise ValueError(f"AdaptiveClipNorm.target_quantile must be in (0, 1) (the fraction of "
                       f"unclipped examples), got {gamma}.")
    _validation.check_positive(self.learning_rate, "AdaptiveClipNorm.learning_rate")
    if self.count_noise_multiplier is not None:
      _validation.check_positive(self.count_noise_multiplier,
                                 "AdaptiveClipNorm.count_noise_multiplier")

  def resolved_count_noise_multiplier(self, expected_batch_size: float) -> float:
    """sigma_b: the configured value, or ``expected_batch_size / 20`` when it is ``None``.

    >>> AdaptiveClipNorm(initial=0.1).resolved_count_noise_multiplier(256)
    12.8
    """
    qn = _validation.check_positive(expected_batch_size, "expected_batch_size")
    if self.count_noise_multiplier is not None:
      return float(self.count_noise_multiplier)
    return qn / _DEFAULT_COUNT_DIVISOR


def joint_noise_multiplier(gradient_noise_multiplier: float, count_noise_multiplier: float, *,
                           participations: int = 1) -> float:
  """The single Gaussian multiplier equivalent to gradient and count noise together.

  ``(sigma_Delta^-2 + k (2 sigma_b)^-2)^-1/2`` (Andrew et al. 2021, Theorem 1
  for k = 1; see :func:`gradient_noise_multiplier` for k > 1), float64.
  The inverse of :func:`gradient_noise_multiplier`.

  >>> round(joint_noise_multiplier(1.0, 12.8), 6)
  0.999238
  """
  s = _validation.check_nonnegative(gradient_noise_multiplier, "gradient_noise_multiplier")
  b = _validation.check_positive(count_noise_multiplier, "count_noise_multiplier")
  k = _validation.check_positive_int(participations, "participations")
  if s == 0.0:
    return 0.0
  return (s ** -2 + k / (2.0 * b) ** 2) ** -0.5


def gradient_noise_multiplier(total_noise_multiplier: float, count_noise_multiplier: float, *,
                              participations: int = 1) -> float:
  """sigma_Delta for the gradient so that gradient and count noise together cost sigma.

  Returns ``sigma_Delta = (sigma^-2 - k (2 sigma_b)^-2)^-1/2`` in float64
  (rounded up by a relative 1e-12 so rounding never removes noise), where
  sigma is ``total_noise_multiplier`` (the multiplier the accountant is
  calibrated for), sigma_b is ``count_noise_multiplier`` and k is
  ``participations``.

  Derivation. Whitening: release ``(X + Z_1, Y + Z_2)`` with ``Z_1 ~ N(0,
  s_1^2 I)``, ``Z_2 ~ N(0, s_2^2 I)`` independent; dividing each block by its
  std is invertible, so the pair has the privacy curve of ``(X/s_1, Y/s_2) +
  N(0, I)``, the Gaussian mechanism with sensitivity ``mu`` where ``mu^2 =
  Delta_X^2 / s_1^2 + Delta_Y^2 / s_2^2`` (the largest whitened shift; the
  privacy loss of a Gaussian with shift v is ``N(||v||^2/2, ||v||^2)`` and
  depends on v only through ``||v||``). A Gaussian of sensitivity mu is the
  Gaussian mechanism with noise multiplier ``1/mu``.

  * k = 1, DP-SGD (independent noise, amplified by Poisson sampling or not):
    one step, one example: ``Delta_X = 1`` (normalised clipped sum, noise std
    sigma_Delta) and ``Delta_Y = 1/2`` (centered count, std sigma_b), so
    ``sigma^-2 = sigma_Delta^-2 + (2 sigma_b)^-2`` (Andrew et al. 2021,
    Theorem 1). The subsampled accountants see only the whitened shift of the
    one added example, of norm 1/sigma, as for plain DP-SGD at sigma. Use the
    per-step multiplier the DP-SGD accountant is calibrated for. The same
    holds for any accountant whose unit is ONE participation, with sigma in
    units of that participation's sensitivity.
  * k > 1, matrix-factorisation (correlated) noise with deterministic
    participation, accounted as ONE Gaussian mechanism for the whole run
    (Denisov et al. 2022; Choquette-Choo et al. 2023): the gradient stream
    releases ``C x + z`` with ``z ~ N(0, s^2 I)``; under (k, b)-participation
    an example changes ``C x`` by at most ``sens_C`` (the strategy's
    sensitivity for unit-norm contributions: here the normalised gradients
    have norm <= 1). The counts are k independent per-step Gaussians on which
    the example moves the centered count by 1/2 each, so
    ``Delta_Y^2 / sigma_b^2 = k / (2 sigma_b)^2``. The run is the Gaussian
    mechanism with ``mu^2 = sens_C^2 / s^2 + k / (2 sigma_b)^2``, and with
    ``sigma = 1 / mu`` the multiplier the run is calibrated for (``mu =
    sens_C / s_0`` without adaptive clipping), ``s / sens_C = (sigma^-2 - k
    (2 sigma_b)^-2)^-1/2``, the value returned. So: the correlated noise of
    std ``s = sens_C * gradient_noise_multiplier(sigma, sigma_b,
    participations=k)`` per unit sensitivity, i.e. pass the returned value
    wherever the calibrated ``sigma = s_0 / sens_C`` would have gone. The
    inputs at step t depend on earlier outputs; Denisov et al. 2022 (Theorem
    2.1) show the Gaussian matrix mechanism on adaptive streams has the
    nonadaptive privacy, and the joint (gradient, count) stream is one such
    mechanism (block strategy ``diag(C, I)``).

  With :mod:`jaxdp.dpsgd.correlated` (whose ``noise_multiplier`` sigma is
  per participation: ``z`` has std ``sigma S s_1``): the amplified BandMF
  analysis accounts per participation (disjoint blocks, each with its own
  count), so ``gradient_noise_multiplier(sigma, sigma_b)``; the deterministic
  analysis accounts the run as ``Gaussian(sigma / r)`` with ``r = sens_{k,b}(C)
  / s_1`` (``accounting.run_sensitivity``), so the gradient's multiplier is
  ``r * gradient_noise_multiplier(sigma / r, sigma_b, participations=k)``
  with k the most participations.

  Args:
    total_noise_multiplier: sigma >= 0 (0: non-private, returns 0).
    count_noise_multiplier: sigma_b > 0 (std of the count noise).
    participations: k >= 1, the most steps one example takes part in under
      the accounting (1 for DP-SGD and per-participation accountants).

  Raises:
    ValueError: ``2 sigma_b / sqrt(k) <= sigma``: the count noise alone would
      reveal more than the whole budget allows (no finite sigma_Delta works).

  >>> round(gradient_noise_multiplier(1.0, 12.8), 6)
  1.000764
  >>> round(joint_noise_multiplier(gradient_noise_multiplier(1.0, 12.8), 12.8), 9)
  1.0
  """
  sigma = _validation.check_nonnegative(total_noise_multiplier, "total_noise_multiplier")
  b = _validation.check_positive(count_noise_multiplier, "count_noise_multiplier")
  k = _validation.check_positive_int(participations, "participations")
  if sigma == 0.0:
    return 0.0
  inv_sq = sigma ** -2 - k / (2.0 * b) ** 2
  if inv_sq <= 0.0:
    raise ValueError(
        f"count_noise_multiplier={b} is too small for total_noise_multiplier={sigma} with "
        f"participations={k}: the count noise must satisfy 2 * count_noise_multiplier / "
        f"sqrt(participations) > total_noise_multiplier (here {2.0 * b / math.sqrt(k):.6g} <= "
        f"{sigma:.6g}), or the noisy counts alone cost more than the whole budget. Use "
        f"count_noise_multiplier > {sigma * math.sqrt(k) / 2.0:.6g} (Andrew et al. use "
        "expected_batch_size / 20).")
  return inv_sq ** -0.5 * (1.0 + _NOISE_MARGIN)


class AdaptiveClipState(NamedTuple):
  """State of :func:`adaptive_clip_noise`.

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


def adaptive_clip_noise(
    inner: optax.GradientTransformation,
    config: AdaptiveClipNorm,
    *,
    expected_batch_size: float,
    key: jax.Array,
    count_noise_multiplier: float | None = None,
) -> optax.GradientTransformation:
  """Adaptive clipping around a noise transform (Andrew et al. 2021, Algorithm 1).

  ``update((grad_sum, centered_count), state)`` with

  * ``grad_sum``: the sum of the NORMALISED clipped per-example gradients
    (each ``g_i / C_t`` clipped to norm 1; :func:`adaptive_clipped_grad` with
    ``current_clip_norm(state)``), sensitivity 1;
  * ``centered_count``: ``sum_i (b_i - 1/2)`` over the batch, ``b_i = 1`` for
    an unclipped example (:func:`centered_unclipped_count`), sensitivity 1/2;

  returns ``C_t * inner(grad_sum)`` (``inner`` adds its noise and divides by
  ``q N``; the product with the public C_t is post-processing) and the state
  with ``C_{t+1} = C_t exp(-eta_C (btilde - gamma))``,
  ``btilde = (centered_count + N(0, sigma_b^2) + qN/2) / (qN)`` (module
  docstring). The count noise is drawn with
  :func:`jaxdp.mechanisms.gaussian_noise` (full float32 tails), its std
  rounded up to float32, from the state's own key, split every step.

  The privacy of one step is that of the Gaussian mechanism with
  ``joint_noise_multiplier(sigma_Delta, sigma_b)`` where sigma_Delta is the
  inner transform's noise multiplier: build ``inner`` with
  ``l2_sensitivity=1.0`` and ``noise_multiplier=gradient_noise_multiplier(sigma,
  sigma_b)`` for the sigma the accountant is calibrated for (or use
  :func:`adaptive_noisy_aggregate`, which does it for DP-SGD).

  Args:
    inner: noise transform taking a clipped SUM of sensitivity 1 and returning
      the noisy average (``noisy_aggregate(sigma_Delta, 1.0, qN, key_g)`` or
      the correlated-noise transform), with a key independent of ``key``.
    config: :class:`AdaptiveClipNorm`.
    expected_batch_size: ``q N`` > 0, the public divisor of the count (the
      same as the inner transform's).
    key: ``jax.random`` key of the count noise; never the inner transform's.
    count_noise_multiplier: sigma_b > 0; ``None`` takes the config's value
      (``expected_batch_size / 20`` when that is ``None`` too). It must be the
      sigma_b given to :func:`gradient_noise_multiplier`.

  Raises:
    TypeError / ValueError: a bad argument (before anything runs); at
      ``init``, the inner state's key equal to ``key`` (the two noises would
      share their randomness); at ``update``, ``updates`` not a pair
      ``(pytree, scalar)``.
  """
  if not (hasattr(inner, "init") and hasattr(inner, "update")):
    raise TypeError(f"inner must be an optax GradientTransformation (the noise transform), got "
                    f"{type(inner).__name__}.")
  if not isinstance(config, AdaptiveClipNorm):
    raise TypeError(f"config must be an AdaptiveClipNorm, got {type(config).__name__}.")
  qn = _validation.check_positive(expected_batch_size, "expected_batch_size")
  if count_noise_multiplier is None:
    sigma_b = config.resolved_count_noise_multiplier(qn)
  else:
    sigma_b = _validation.check_positive(count_noise_multiplier, "count_noise_multiplier")
    if config.count_noise_multiplier is not None and config.count_noise_multiplier != sigma_b:
      raise ValueError(f"count_noise_multiplier={sigma_b} differs from the config's "
                       f"count_noise_multiplier={config.count_noise_multiplier}; give one.")
  _validation.check_key(key)
  dtype = jnp.float32
  std_b = transforms._round_up(sigma_b, dtype)  # pylint: disable=protected-access
  gamma = float(config.target_quantile)
  eta = float(config.learning_rate)
  initial = np.asarray(config.initial, np.float32)

  def init_fn(params):
    inner_state = inner.init(params)
    inner_key = getattr(inner_state, "key", None)
    if inner_key is not None:
      a, b = _key_data(inner_key), _key_data(key)
      if a is not None and b is not None and a.shape == b.shape and np.array_equal(a, b):
        raise ValueError("the inner noise transform and adaptive_clip_noise were given the same "
                         "key: the gradient and count noises would share randomness. Split the "
                         "key (jax.random.split(key)) and give each its own part.")
    return AdaptiveClipState(inner=inner_state, clip_norm=jnp.asarray(initial),
                             key=key, count=jnp.zeros((), jnp.int32))

  def update_fn(updates, state, params=None):
    if not isinstance(updates, (tuple, list)) or len(updates) != 2:
      got = type(updates).__name__
      if isinstance(updates, (tuple, list)):
        got += f" of length {len(updates)}"
      raise TypeError("adaptive_clip_noise's update takes the pair (normalised clipped gradient "
                      f"sum, centered unclipped count), got a {got}.")
    grad_sum, centered = updates
    centered = jnp.asarray(centered)
    if centered.shape != ():
      raise ValueError(f"the centered unclipped count (second entry of updates) must be a scalar, "
                       f"got shape {centered.shape}.")
    if not (jnp.issubdtype(centered.dtype, jnp.floating)
            or jnp.issubdtype(centered.dtype, jnp.integer)):
      raise TypeError(f"the centered unclipped count must be a real number, got dtype "
                      f"{centered.dtype}.")
    noisy_avg, inner_state = inner.update(grad_sum, state.inner, params)
    clip = state.clip_norm
    out = jax.tree.map(lambda u: u * clip.astype(u.dtype), noisy_avg)
    next_key, noise_key = jax.random.split(state.key)
    noisy = centered.astype(dtype) + mechanisms.gaussian_noise(noise_key, (), std_b, dtype)
    btilde = (noisy + qn / 2.0) / qn
    new_clip = (clip * jnp.exp(-eta * (btilde - gamma))).astype(dtype)
    return out, AdaptiveClipState(inner_state, new_clip, next_key, state.count + 1)

  return optax.GradientTransformation(init_fn, update_fn)


def adaptive_noisy_aggregate(
    config: AdaptiveClipNorm,
    *,
    noise_multiplier: float,
    expected_batch_size: float,
    key: jax.Array,
) -> optax.GradientTransformation:
  """DP-SGD noise with adaptive clipping, costing ``noise_multiplier`` per step.

  ``adaptive_clip_noise(noisy_aggregate(sigma_Delta, 1.0, qN, k_g), config,
  key=k_b)`` with ``k_b, k_g = jax.random.split(key)`` and ``sigma_Delta =
  gradient_noise_multiplier(noise_multiplier, sigma_b)`` (Andrew et al. 2021,
  Theorem 1): each step is as private as DP-SGD with noise multiplier
  ``noise_multiplier``, so account it exactly like that (e.g.
  ``dpsgd_epsilon(noise_multiplier, q, steps, delta)``).
  """
  if not isinstance(config, AdaptiveClipNorm):
    raise TypeError(f"config must be an AdaptiveClipNorm, got {type(config).__name__}.")
  qn = _validation.check_positive(expected_batch_size, "expected_batch_size")
  sigma_b = config.resolved_count_noise_multiplier(qn)
  sigma_delta = gradient_noise_multiplier(noise_multiplier, sigma_b)
  _validation.check_key(key)
  count_key, grad_key = jax.random.split(key)
  inner = transforms.noisy_aggregate(sigma_delta, 1.0, qn, grad_key)
  return adaptive_clip_noise(inner, config, expected_batch_size=qn, key=count_key,
                             count_noise_multiplier=sigma_b)


def centered_unclipped_count(num_examples: Any, num_clipped: Any) -> jax.Array:
  """``sum_i (b_i - 1/2) = num_examples / 2 - num_clipped`` (float32), NOT private.

  From the :class:`~jaxdp.dpsgd.clipping.ClippedGradInfo` of the
  normalised clipped gradient: ``centered_unclipped_count(info.num_examples,
  info.num_clipped)`` (``num_examples`` counts the unmasked examples,
  ``num_clipped`` those among them whose gradient was scaled down). Summed over
  several chunks of one batch it is the batch's value (it is additive). One
  example moves it by exactly 1/2, the sensitivity :func:`adaptive_clip_noise`
  noises it for. An example counts as unclipped when its normalised gradient
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


def adaptive_clipped_grad(
    loss_fn: Callable[..., Any],
    clip_norm: Any,
    *,
    batch_argnums: int | Sequence[int] = 1,
    microbatch_size: int | None = None,
    has_aux: bool = False,
    method: str = "auto",
) -> clipping.ClippedGradFn:
  """Sum of per-example gradients divided by C and clipped to norm 1 (sensitivity 1).

  ``clipped_grad(normalized_loss(loss_fn, clip_norm), l2_clip_norm=1.0, ...)``:
  ``sum_i (g_i / C) min(1, C / ||g_i||)``, what :func:`adaptive_clip_noise`
  takes. Build it inside the jitted step with ``current_clip_norm(state)``
  (construction is cheap and traces once); every ``method`` (``"auto"``,
  ``"vmap"``, ``"reweight"``, ``"ghost"``) and ``microbatch_size`` work with
  a traced C. ``info.loss_sum`` is the sum of the NORMALISED losses (multiply
  by C for the loss). Flat clipping only: the quantile tracked is that of the
  global gradient norm.
  """
  return clipping.clipped_grad(normalized_loss(loss_fn, clip_norm, has_aux=has_aux),
                               l2_clip_norm=1.0, batch_argnums=batch_argnums,
                               microbatch_size=microbatch_size, has_aux=has_aux, method=method)


__all__ = [
    "AdaptiveClipNorm", "AdaptiveClipState", "adaptive_clip_noise", "adaptive_clipped_grad",
    "adaptive_noisy_aggregate", "centered_unclipped_count", "current_clip_norm",
    "gradient_noise_multiplier", "joint_noise_multiplier", "normalized_loss", "reseed_state",
]
