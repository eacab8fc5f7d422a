"""DP-SGD for multiclass linear models, many independent runs in one compiled call.

Paper 000 (``000_tradeoffs_of_private_prediction.md``) Sec. 3.1, Eq. 4 (DP-SGD,
Abadi et al. 2016) and Sec. 4.1 (linear models trained without L2
regularisation); survey 004 Sec. 4.2, Algorithm 1. The experiments of paper
000 repeat every point 100 times with fresh noise; :func:`linear_dpsgd` runs
``M`` independent trainings (one per key) as one jitted program, the way
:func:`jaxdp.training.model_sensitivity` and :func:`jaxdp.training.loss_perturbation`
release ``M`` models.

One step of one run, with weights ``W`` (D x C), clip norm ``c``, noise
multiplier ``z``, Poisson rate ``q`` and learning rate ``eta``:

* Poisson sample: example n joins the batch iff ``u_n < floor(q 2^32)`` for
  i.i.d. 32-bit ``u_n = jax.random.bits`` -- exactly
  :func:`jaxdp.dpsgd.poisson_sample_indices` (same key, same batch),
  inclusion probability :func:`~jaxdp.dpsgd.effective_sample_rate`
  ``<= q``, which is what the accountant is given.
* Per-example gradient of the softmax cross-entropy ``l(W; x, y)``:
  ``g_n = x_n r_n^T`` with ``r_n = softmax(W^T x_n) - e_{y_n}``, whose
  Frobenius norm is ``||x_n|| ||r_n||`` in closed form (no per-example
  gradient is materialised: the clipped sum is ``X_B^T (s * R_B)``, one
  matmul, with ``s_n = min(1, c / (||x_n|| ||r_n||))``).
* ``W <- W - eta v``, ``v <- mu v + (sum_n s_n g_n + N(0, (z c)^2 I)) / (q N)``
  (heavy-ball momentum ``mu``, post-processing of the noisy sums).

Static shapes without changing the mechanism: the sampled indices are read
off the running count of included examples in chunks of ``P`` slots
(:func:`~jaxdp.dpsgd.padded_batch_size`); when a batch has more than
``P`` examples the further chunks are processed too (a data-dependent loop),
so the sum is always the sum over the whole Poisson batch and no extra delta
is paid ("split" in :mod:`jaxdp.dpsgd.sampling`).

Floating point: ``||x_n|| ||r_n||`` is computed from sums of ``D`` and ``C``
squares, whose float32 value can be below the exact norm by a relative
``((D + C)/2 + 3) 2^-24`` at most (Higham, "Accuracy and Stability of Numerical
Algorithms", 2nd ed., Sec. 4.2); the clip uses ``c`` shrunk by that factor
(rounded down), so each clipped per-example gradient has exact norm ``<= c``,
the add/remove sensitivity of the sum the accountant assumes.

Noise: ``N(0, (z c)^2 I)`` from the library's full-tail sampler
(:func:`jaxdp.mechanisms.gaussian_noise`, as :func:`jaxdp.dpsgd.noisy_aggregate`
uses), with ``z c`` rounded up to float32; ``jax.random.normal`` is not used: it stops
near 5.4 standard deviations, and a truncated Gaussian has an unbounded privacy loss
at the cut.

Privacy: ``steps = ceil(epochs / q)`` Poisson-subsampled Gaussian steps
(:func:`jaxdp.accounting.dpsgd_event`), ``z`` from
:func:`jaxdp.accounting.calibrate_noise_multiplier` for ``(epsilon, delta)``
with the RDP (default) or PLD accountant, for add/remove neighbours (default,
Abadi et al. 2016) or, with ``neighbouring="replace_one"``, for replace-one
neighbours (each clipped gradient has norm ``<= c``, so one replaced example
moves the sum by ``<= 2c``; PLD of the replace-one subsampled Gaussian, Zhu,
Dong & Wang 2022; see :mod:`jaxdp.accounting.dpsgd_accounting`). ``M`` keys
release ``M`` models.
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from jaxdp import _validation
from jaxdp import mechanisms
from jaxdp.accounting import dpsgd_accounting, events
from jaxdp.training import batching, linear
from jaxdp.dpsgd import clipping, sampling, transforms

class LinearDPSGDResult(NamedTuple):
  """Output of :func:`linear_dpsgd`.

  Attributes:
    weights: ``(D, C)`` released weights, or ``(M, D, C)`` for ``M`` keys.
    event: the DpEvent of ONE run (as for the other training methods, ``M`` keys
      release ``M`` models: spend it once per released model).
    noise_multiplier: ``z`` (noise std ``z c`` on the sum of clipped gradients).
    sample_rate: the Poisson inclusion probability the accountant used
      (:func:`~jaxdp.dpsgd.effective_sample_rate` of ``q``).
    steps: number of noisy steps of each run.
    padded_size: static chunk size ``P`` of the sampled batches.
    epsilon: the accountant's epsilon at ``delta`` for one run (``inf`` when no noise).
    delta: the delta the run was calibrated for.
  """

  weights: jax.Array
  event: Any
  noise_multiplier: float
  sample_rate: float
  steps: int
  padded_size: int
  epsilon: float
  delta: float


def safe_clip_norm(clip: float, num_features: int, num_classes: int) -> float:
  """Clip norm shrunk so ``||x|| ||r||`` computed in float32 never lets a clipped norm exceed ``clip``.

  ``clip (1 - u)^((D + C)/2 + 3) / (1 + u)^2`` (``u = 2^-24``), rounded down to float32.
  """
  u = clipping._UNIT_ROUNDOFF  # pylint: disable=protected-access
  return clipping.float32_at_most(
      clip * (1.0 - u) ** ((num_features + num_classes) / 2.0 + 3.0) / (1.0 + u) ** 2
      * (1.0 - 1e-15))


def _noise_std_f32(noise_multiplier: float, clip: float) -> jax.Array:
  """``z c`` (the noise std on the clipped sum) in float32, rounded UP from float64.

  Round-to-nearest could return up to half an ulp less noise than calibrated.
  """
  return jnp.float32(transforms._round_up(noise_multiplier * clip, jnp.float32))  # pylint: disable=protected-access


def _clipped_chunk_sum(w, x, y, csum, count, chunk, padded, safe_clip, num_classes):
  """``sum_n s_n x_n r_n^T`` over the ``chunk``-th block of ``padded`` sampled examples."""
  ranks = chunk * padded + jnp.arange(1, padded + 1, dtype=jnp.int32)
  valid = ranks <= count
  idx = jnp.where(valid, jnp.searchsorted(csum, ranks, side="left"), 0)
  xb, yb = x[idx], y[idx]
  r = jax.nn.softmax(xb @ w, axis=-1) - jax.nn.one_hot(yb, num_classes, dtype=w.dtype)
  norm = jnp.linalg.norm(xb, axis=-1) * jnp.linalg.norm(r, axis=-1)
  scale = jnp.where(valid, jnp.minimum(1.0, safe_clip / norm), 0.0)  # c/0 = inf -> 1
  return xb.T @ (scale[:, None] * r)


def _train_one(key, x, y, lr, momentum, clip, noise_std, *, steps, threshold, padded,
               expected_batch, num_classes):
  n, d = x.shape

  def step(carry, key_t):
    w, v = carry
    k_sample, k_noise = jax.random.split(key_t)
    if threshold < 0:  # q = 1: every example, every step
      mask = jnp.ones((n,), bool)
    else:
      mask = jax.random.bits(k_sample, (n,), jnp.uint32) < jnp.uint32(threshold)
    csum = jnp.cumsum(mask, dtype=jnp.int32)
    count = csum[-1]
    chunk_sum = functools.partial(_clipped_chunk_sum, w, x, y, csum, count, padded=padded,
                                  safe_clip=clip, num_classes=num_classes)
    g = chunk_sum(0)
    num_chunks = (count + padded - 1) // padded
    _, g = jax.lax.while_loop(lambda s: s[0] < num_chunks,
                              lambda s: (s[0] + 1, s[1] + chunk_sum(s[0])), (1, g))
    # The library's full-tail sampler (|z| up to 12 sigma): jax.random.normal stops near
    # 5.4 sigma, and a truncated Gaussian's privacy loss is unbounded at the cut (the
    # neighbour's output can lie beyond it), so it is not the Gaussian mechanism accounted.
    noise = mechanisms.gaussian_noise(k_noise, (d, num_classes), noise_std, w.dtype)
    v = momentum * v + (g + noise) / expected_batch
    return (w - lr * v, v), None

  w0 = jnp.zeros((d, num_classes), x.dtype)
  (w, _), _ = jax.lax.scan(step, (w0, jnp.zeros_like(w0)), jax.random.split(key, steps))
  return w


@functools.partial(jax.jit, static_argnames=("steps", "threshold", "padded", "expected_batch",
                                             "num_classes", "mode"))
def _train_many(keys, x, y, lr, momentum, clip, noise_std, *, steps, threshold, padded,
                expected_batch, num_classes, mode):
  one = functools.partial(_train_one, x=x, y=y, lr=lr, momentum=momentum, clip=clip,
                          noise_std=noise_std, steps=steps, threshold=threshold, padded=padded,
                          expected_batch=expected_batch, num_classes=num_classes)
  return jax.vmap(one)(keys) if mode == "vmap" else jax.lax.map(one, keys)


def linear_dpsgd(
    key: jax.Array,
    x: Any,
    y: Any,
    *,
    num_classes: int,
    epsilon: float | None = None,
    delta: float | None = None,
    noise_multiplier: float | None = None,
    epochs: float = 3.0,
    expected_batch_size: float = 1000.0,
    l2_clip_norm: float = 1.0,
    learning_rate: float = 1.0,
    momentum: float = 0.9,
    overflow_prob: float = 1e-6,
    accountant: str = "rdp",
    batch_mode: str = "auto",
    neighbouring: str = "add_remove",
) -> LinearDPSGDResult:
  """Trains ``M`` (one per key) private softmax linear models with DP-SGD (module docstring).

  Args:
    key: one ``jax.random`` key, or a batch of ``M`` keys (one independent run each).
    x: ``(N, D)`` finite features (no norm bound is needed: clipping bounds the sensitivity).
    y: ``(N,)`` integer labels in ``[0, num_classes)``.
    num_classes: C.
    epsilon, delta: target ``(epsilon, delta)`` (``delta > 0``: DP-SGD has no
      ``delta = 0`` analysis). ``epsilon = inf`` trains without noise (still clipped).
    noise_multiplier: instead of ``epsilon``, the noise multiplier ``z`` itself.
    epochs: ``steps = ceil(epochs / q)``.
    expected_batch_size: ``q N`` (``q = expected_batch_size / N``).
    l2_clip_norm: per-example clip norm ``c`` (paper 000 Sec. 4.1 cross-validates
      it in ``[5e-4, 5e-1]``).
    learning_rate, momentum: heavy-ball SGD on the noisy mean gradient.
    overflow_prob: per-step probability that a batch needs a second chunk of
      ``P`` slots (only speed depends on it; the mechanism is exact either way).
    accountant: ``"rdp"`` or ``"pld"`` (``"pld"`` for ``neighbouring="replace_one"``).
    batch_mode: ``"map"`` / ``"vmap"`` / ``"auto"`` over the keys
      (:func:`jaxdp.training.linear.resolve_batch_mode`).
    neighbouring: ``"add_remove"`` (default) or ``"replace_one"``: the relation
      ``epsilon`` holds for and the event is tagged with (module docstring).

  Returns:
    :class:`LinearDPSGDResult`.
  """
  relation = dpsgd_accounting.check_relation_and_accountant(neighbouring, accountant)
  _validation.check_key(key, allow_batch=True)
  x = _validation.check_finite_array(x, "x")
  if x.ndim != 2:
    raise ValueError(f"x must be a 2-D array (N, D), got shape {x.shape}.")
  num_classes = _validation.check_positive_int(num_classes, "num_classes")
  n = x.shape[0]
  y = linear.check_labels(y, "softmax", num_classes, n)
  q = sampling.resolve_sample_rate(None, expected_batch_size, n)
  q_eff = sampling.effective_sample_rate(q)
  steps = dpsgd_accounting.steps_for_epochs(epochs, q)
  clip = _validation.check_positive(l2_clip_norm, "l2_clip_norm")
  lr = _validation.check_positive(learning_rate, "learning_rate")
  mu = float(momentum)
  if not 0.0 <= mu < 1.0:
    raise ValueError(f"momentum must be in [0, 1), got {momentum}.")
  if epsilon is not None and math.isinf(float(epsilon)) and noise_multiplier is None:
    z = 0.0
    delta = 0.0 if delta is None else _validation.check_delta(delta)
  else:
    if delta is not None:
      delta = _validation.check_delta(delta, allow_zero=False)
    z = dpsgd_accounting.resolve_noise_multiplier(
        None if epsilon is None else _validation.check_epsilon(epsilon), noise_multiplier, delta,
        q_eff, steps, accountant=accountant, neighbouring=relation)
  if z > 0:
    event = dpsgd_accounting.dpsgd_event(z, q_eff, steps, neighbouring=relation)
    eps_spent = (dpsgd_accounting.dpsgd_epsilon(z, q_eff, steps, delta, accountant, relation)
                 if delta else math.inf)
  else:
    event, eps_spent = events.NonPrivateDpEvent(), math.inf
  padded = sampling.padded_batch_size(n, q, overflow_prob)
  threshold = -1 if q == 1.0 else sampling._inclusion_threshold(q)  # pylint: disable=protected-access
  batched = linear.is_key_batch(key)
  keys = key if batched else key[None]
  m = int(keys.shape[0])
  mode = linear.resolve_batch_mode(batch_mode)
  safe = safe_clip_norm(clip, x.shape[1], num_classes)
  fn = functools.partial(
      _train_many, x=jnp.asarray(x, jnp.float32), y=jnp.asarray(y, jnp.int32),
      lr=jnp.float32(lr), momentum=jnp.float32(mu), clip=jnp.float32(safe),
      noise_std=_noise_std_f32(z, clip), steps=steps, threshold=int(threshold), padded=int(padded),
      expected_batch=float(q * n), num_classes=num_classes, mode=mode)
  weights = batching.map_in_chunks(fn, keys, batching.num_chunks(m, mode))
  return LinearDPSGDResult(weights if batched else weights[0], event, float(z), float(q_eff),
                           int(steps), int(padded), float(eps_spent),
                           float(delta) if delta is not None else 0.0)


__all__ = ["LinearDPSGDResult", "linear_dpsgd", "safe_clip_norm"]
