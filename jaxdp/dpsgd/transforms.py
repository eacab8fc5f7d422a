"""Optax transforms that privatise a SUM of clipped per-example gradients.

DP-SGD update (paper ``000_tradeoffs_of_private_prediction.md`` Section 3.1,
Equation 4; survey ``004_dp_machine_learning_survey.md`` Section 4.2,
Algorithm 1 line 8):

  g_tilde = ( sum_{n in B} clip(g_n) + N(0, sigma^2 S^2 I) ) / b,

where S is the L2 sensitivity of the clipped sum (``S = nu``, the clip norm, for
flat clipping; ``sqrt(sum_k c_k^2)`` for per-layer clipping) and sigma is the
noise multiplier. The Gaussian mechanism is applied to the SUM, whose
sensitivity is S; dividing by ``b`` afterwards is post-processing and costs no
privacy only if ``b`` is a data-independent constant.

Which ``b``: we divide by the EXPECTED batch size ``b = q * N`` of Poisson
sampling (the accountant's sampling model), never by the realised batch size
``|B|``. ``|B|`` depends on the data set (under add/remove neighbours it
differs by one) and dividing the noise by it would both leak it and change the
noise-to-signal ratio step by step. With ``q * N`` the estimator is unbiased:
``E[sum_{n in B} g_n] = q * sum_n g_n``.

Never calibrate the noise to the sum and add it to the mean (that would divide
the effective noise multiplier by ``|B|``): :func:`noisy_aggregate` takes the
sum (what :func:`jaxdp.dpsgd.clipping.clipped_grad` returns) and adds
noise BEFORE the division.

Randomness: the transform's state holds a ``jax.random`` key that is split on
every update (the used half is never reused); the same initial key gives the
same noise sequence.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxdp import _validation
from jaxdp import mechanisms


class NoiseTransformation(optax.GradientTransformation):
  """An optax ``GradientTransformation`` that also states the noise it adds.

  Attributes (set by the constructor that built it):
    noise_multiplier: sigma of the Gaussian added to the SUM, in units of
      ``l2_sensitivity`` (std ``sigma S``).
    l2_sensitivity: S, the sensitivity of the sum the noise is calibrated for.

  A plain tuple ``(init, update)`` otherwise: ``optax.chain`` and every optax
  API treat it as any GradientTransformation. Wrappers that must know the
  noise (``adaptive_clipping.adaptive_clip_noise``) check these attributes
  instead of trusting the caller.
  """

  noise_multiplier: float
  l2_sensitivity: float


def noise_transformation(init_fn, update_fn, *, noise_multiplier: float,
                         l2_sensitivity: float) -> NoiseTransformation:
  """``NoiseTransformation(init_fn, update_fn)`` carrying its ``noise_multiplier``, ``l2_sensitivity``."""
  out = NoiseTransformation(init_fn, update_fn)
  out.noise_multiplier = float(noise_multiplier)
  out.l2_sensitivity = float(l2_sensitivity)
  return out


class NoisyAggregateState(NamedTuple):
  """State of :func:`noisy_aggregate`: the PRNG key for the next step's noise."""

  key: jax.Array
  count: jax.Array


def noise_stddev(noise_multiplier: float, l2_sensitivity: float) -> float:
  """Standard deviation ``sigma * S`` of the Gaussian added to the clipped SUM.

  Paper 000 Section 3.1 Equation 4 (noise ``N(0, sigma^2 nu^2 I)`` on the sum of
  gradients clipped to ``nu``).

  >>> noise_stddev(1.1, 2.0)
  2.2
  """
  sigma = _validation.check_nonnegative(noise_multiplier, "noise_multiplier")
  s = _validation.check_positive(l2_sensitivity, "l2_sensitivity", allow_inf=True)
  if sigma == 0.0:
    return 0.0
  if s == float("inf"):
    raise ValueError("l2_sensitivity is inf (clip norm inf): no finite noise makes the sum "
                     "private; use a finite l2_clip_norm or noise_multiplier=0 (non-private).")
  return sigma * s


def _compute_dtype(dtype) -> np.dtype:
  """At least float32 (bfloat16/float16 sums are noised in float32)."""
  return jnp.promote_types(dtype, jnp.float32)


def _round_up(value: float, dtype) -> np.ndarray:
  # The float64 noise scale cast to the gradient dtype, rounded UP (never less
  # noise than calibrated; round-to-nearest could shave half an ulp).
  dtype = np.dtype(dtype)
  out = np.asarray(value, dtype=dtype)
  if float(out) < value:
    out = np.nextafter(out, np.asarray(np.inf, dtype=dtype))
  return out


def noisy_aggregate(
    noise_multiplier: float,
    l2_sensitivity: float,
    expected_batch_size: float,
    key: jax.Array,
) -> optax.GradientTransformation:
  """Adds ``N(0, (sigma S)^2 I)`` to a clipped gradient SUM and divides by ``q N``.

  ``update(grad_sum, state)`` returns ``(grad_sum + z) / expected_batch_size``
  with ``z ~ N(0, (noise_multiplier * l2_sensitivity)^2 I)`` drawn fresh per
  step from the state key, computed and returned in at least float32 (a
  bfloat16/float16 sum is cast up first; ``optax.apply_updates`` casts the
  update back to the params' dtype, which is post-processing) (paper 000 Section 3.1 Equation 4 with the
  normaliser ``|B|`` replaced by the constant expected batch size ``q N``; see
  the module docstring for why). Chain it before any optax optimiser: the
  optimiser only post-processes the private average.

  Args:
    noise_multiplier: sigma >= 0 (0 = no noise, not private).
    l2_sensitivity: sensitivity S of the sum, normally ``clipped_fn.sensitivity``.
    expected_batch_size: ``q * N`` > 0, a data-independent constant.
    key: ``jax.random`` key for the noise; never reuse it elsewhere.

  Returns:
    A :class:`NoiseTransformation` (a GradientTransformation whose
    ``noise_multiplier`` and ``l2_sensitivity`` attributes are the arguments).
  """
  std = noise_stddev(noise_multiplier, l2_sensitivity)
  denom = _validation.check_positive(expected_batch_size, "expected_batch_size")
  _validation.check_key(key)

  def init_fn(params):
    del params
    return NoisyAggregateState(key=key, count=jnp.zeros((), jnp.int32))

  def update_fn(updates, state, params=None):
    del params
    next_key, noise_key = jax.random.split(state.key)
    leaves, treedef = jax.tree.flatten(updates)
    keys = jax.random.split(noise_key, max(len(leaves), 1))
    noised = [
        # jaxdp.mechanisms.gaussian_noise has full float32 tails (jax.random.normal
        # stops near 5.4 sigma, which breaks the density-ratio argument at the edge).
        # At least float32: a bfloat16 sum is cast up exactly, and the noise is never
        # drawn or added on the bfloat16 grid (8 bits of mantissa would quantise it).
        (g.astype(_compute_dtype(g.dtype)) + mechanisms.gaussian_noise(
            k, g.shape, _round_up(std, _compute_dtype(g.dtype)), _compute_dtype(g.dtype))) / denom
        for g, k in zip(leaves, keys)
    ]
    return jax.tree.unflatten(treedef, noised), NoisyAggregateState(next_key, state.count + 1)

  return noise_transformation(init_fn, update_fn, noise_multiplier=noise_multiplier,
                              l2_sensitivity=l2_sensitivity)


def dp_optimizer(
    optimizer: optax.GradientTransformation,
    *,
    noise_multiplier: float,
    l2_sensitivity: float,
    expected_batch_size: float,
    key: jax.Array,
) -> optax.GradientTransformation:
  """``optax.chain(noisy_aggregate(...), optimizer)``: any optax optimiser made DP.

  Feed it the clipped gradient SUM from :func:`clipped_grad`; see
  :func:`noisy_aggregate`.
  """
  return optax.chain(
      noisy_aggregate(noise_multiplier, l2_sensitivity, expected_batch_size, key), optimizer)


def private_sgd(
    learning_rate: optax.ScalarOrSchedule,
    *,
    noise_multiplier: float,
    l2_sensitivity: float,
    expected_batch_size: float,
    key: jax.Array,
    momentum: float | None = None,
    nesterov: bool = False,
) -> optax.GradientTransformation:
  """DP-SGD (survey 004 Section 4.2 Algorithm 1; paper 000 Equation 4).

  ``theta <- theta - eta * (sum clip(g_n) + N(0, sigma^2 S^2 I)) / (q N)``,
  optionally with (Nesterov) momentum applied to the private average.
  """
  return dp_optimizer(
      optax.sgd(learning_rate, momentum=momentum, nesterov=nesterov),
      noise_multiplier=noise_multiplier, l2_sensitivity=l2_sensitivity,
      expected_batch_size=expected_batch_size, key=key)

