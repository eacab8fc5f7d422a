"""Adaptive clipping: clip to a privately estimated quantile of the gradient norms.

Andrew, Thakkar, McMahan & Ramaswamy 2021, "Differentially private learning
with adaptive clipping" (NeurIPS), Algorithm 1 and Theorem 1. A fixed clip
norm C must be tuned: too small biases every step, too large drowns the
gradient in noise ``sigma C / (q N)``. Adaptive clipping instead tracks the
gamma-quantile of the per-example gradient norms, privately, at a negligible
privacy cost, and clips to it.

Step t, with clip norm C_t (public: a function of earlier noisy releases only):

1. Gradients in NORMALISED space. Every per-example gradient is clipped to
   C_t and divided by C_t, ``gbar_i = (g_i / C_t) min(1, C_t / ||g_i||)``,
   so the sum ``sum_i gbar_i`` has L2 sensitivity 1 whatever C_t is (add or
   remove one example moves it by one vector of norm <= 1). The clip comes
   first (:func:`adaptive_clipped_grad`; ``g_i / C_t`` is never formed for an
   unclipped ``g_i``, which could overflow for a small C_t), every clipping
   method supports it, and a non-finite ``g_i`` contributes zero
   (:mod:`jaxdp.dpsgd.clipping`).
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
   grows; the fixed point is ``P(||g|| <= C) = gamma``. C is clamped to the
   config's public floor and ceiling (:class:`AdaptiveClipNorm`;
   post-processing, no privacy cost).

Closed loop (why C can run away, with DP-SGD or correlated noise). The noise
on the update is proportional to C_t, and for many models (an MLP without
normalisation) the per-example gradient norms grow with the parameter norm,
which the noise inflates: a C_t that starts below the gradient norms climbs,
adds noise, inflates the norms it tracks, and climbs further. On digits (MLP
64-64-10, q N = 64, 118 steps, eps = 2, SGD 0.1 with momentum 0.9) C went
0.1 -> 48 with BandMF-4 (accuracy 0.43; fixed C = 1: 0.875) and 0.1 -> 10.5
with DP-SGD. The matrix mechanism's cancellation itself is NOT broken by a
clip norm that drifts or jitters as adaptive clipping's does: for this run's
strategy the parameter noise ``||A D C^{-1}||`` (D = diag(C_t)) stays 0.89 of
DP-SGD's for a constant, a 400x geometric, or a 1.6%/step random-walk D
(only an i.i.d. 20% per-step jitter, far from what the geometric update
produces, raises it to 1.6x). A ceiling near the fixed clip norm one would
use removes the runaway: ``max_clip_norm=1.0`` gave 0.872 for BandMF-4 +
adaptive (C ended at 0.83, tracking the median below the ceiling).

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

Modules (this one re-exports their public names; each has one job):

* :mod:`jaxdp.dpsgd.adaptive_clip_norm` -- :class:`AdaptiveClipNorm`, its
  checks, and the geometric clip-norm update;
* :mod:`jaxdp.dpsgd.adaptive_accounting` -- the split of sigma into
  sigma_Delta and sigma_b (:func:`gradient_noise_multiplier`,
  :func:`joint_noise_multiplier`, :func:`per_layer_gradient_noise_multiplier`);
* :mod:`jaxdp.dpsgd.adaptive_grad` -- the normalised clipped sum and the
  centered count (:func:`adaptive_clipped_grad`,
  :func:`centered_unclipped_count`, :func:`per_layer_normalisation`,
  :func:`normalized_loss`);
* :mod:`jaxdp.dpsgd.adaptive_state` -- :class:`AdaptiveClipState`, the count
  noise and the update step shared by the transforms
  (:func:`current_clip_norm`, :func:`reseed_state`);
* :mod:`jaxdp.dpsgd.adaptive_noise` -- the optax transforms
  (:func:`adaptive_clip_noise`, :func:`per_layer_adaptive_clip_noise`,
  :func:`adaptive_noisy_aggregate`).
"""

from jaxdp.dpsgd.adaptive_accounting import (gradient_noise_multiplier, joint_noise_multiplier,
                                             per_layer_gradient_noise_multiplier)
from jaxdp.dpsgd.adaptive_clip_norm import AdaptiveClipNorm
from jaxdp.dpsgd.adaptive_grad import (adaptive_clipped_grad, centered_unclipped_count,
                                       normalized_loss, per_layer_normalisation)
from jaxdp.dpsgd.adaptive_noise import (adaptive_clip_noise, adaptive_noisy_aggregate,
                                        per_layer_adaptive_clip_noise)
from jaxdp.dpsgd.adaptive_state import AdaptiveClipState, current_clip_norm, reseed_state

__all__ = [
    "AdaptiveClipNorm", "AdaptiveClipState", "adaptive_clip_noise", "adaptive_clipped_grad",
    "adaptive_noisy_aggregate", "centered_unclipped_count", "current_clip_norm",
    "gradient_noise_multiplier", "joint_noise_multiplier", "normalized_loss",
    "per_layer_adaptive_clip_noise", "per_layer_gradient_noise_multiplier",
    "per_layer_normalisation", "reseed_state",
]
