"""Canary audit of DP-SGD: insert a worst-case example, test for its presence.

Threat model (white-box, every noisy update observed; Nasr, Song, Thakurta,
Papernot, Carlini 2021, "Adversary instantiation: lower bounds for
differentially private machine learning", Sec. 4; Nasr et al. 2023 "Tight
auditing of differentially private machine learning"): the adversary picks a
canary example whose clipped gradient ``c`` has the full clip norm, and
observes the noisy aggregated updates ``u_t`` of T steps. D is the batch
without the canary, D' the batch with it (add/remove neighbours, the relation
of DP-SGD's accounting). With the other gradients held fixed,

  u_t = (G + 1[D'] c + z_t) / b,   z_t ~ N(0, sigma^2 S^2 I),

(paper 000 Sec. 3.1 Eq. 4; S the clip norm, b the expected batch size), so
the statistic ``s = sum_t <u_t, c/||c||>`` is Gaussian with a mean shift of
``T ||c|| / b`` and standard deviation ``sqrt(T) sigma S / b``: the
Neyman-Pearson optimal test for the T-fold composition, whose privacy is
exactly that of one Gaussian mechanism with ``mu = sqrt(T) ||c|| / (sigma S)``
(Dong, Roth, Su 2019, Cor. 3.3). With ``||c|| = S`` (a canary whose gradient
is clipped) the audit is tight against the accountant's epsilon for full-batch
steps (``sample_rate = 1``), and it exposes the classic bugs: clipping that
does not bound the canary's gradient, noise calibrated to a smaller
sensitivity, or noise added after averaging.

The trials run the library's own pieces: ``clipped_grad_fn`` (e.g.
:func:`jaxdp.training.dpsgd.clipping.clipped_grad`) computes the masked,
clipped gradient sum, and ``aggregate`` (default
:func:`jaxdp.training.dpsgd.transforms.noisy_aggregate`) adds the noise, T
times per trial from one trial key, vmapped over trials.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxdp import _validation
from jaxdp.audit import core


def _tree_vdot(a: Any, b: Any) -> jax.Array:
  return sum(jnp.vdot(x.astype(jnp.float32), y.astype(jnp.float32))
             for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def _tree_norm(a: Any) -> float:
  return float(np.sqrt(sum(np.sum(np.square(np.asarray(x, np.float64))) for x in jax.tree.leaves(a))))


def canary_mechanism(
    clipped_grad_fn: Callable[..., Any],
    params: Any,
    examples: Sequence[Any],
    *,
    noise_multiplier: float,
    expected_batch_size: float,
    num_steps: int = 1,
    l2_sensitivity: Optional[float] = None,
    aggregate: Optional[Callable[..., Any]] = None,
) -> Callable[[jax.Array, jax.Array], jax.Array]:
  """``f(key, mask) -> (num_steps,)`` projections of the noisy updates on the canary.

  ``examples`` holds the batch *including* the canary as its last row; the
  dataset is the 0/1 ``mask`` over rows (mask[-1] = 0: D, = 1: D'). Each call
  runs ``num_steps`` DP-SGD aggregation steps at fixed ``params`` with a noise
  transform initialised from ``key`` and returns ``<u_t, c/||c||>``.
  """
  if aggregate is None:
    from jaxdp.training.dpsgd.transforms import noisy_aggregate as aggregate  # pylint: disable=g-import-not-at-top
  sens = getattr(clipped_grad_fn, "sensitivity", None) if l2_sensitivity is None else l2_sensitivity
  if sens is None:
    raise ValueError("l2_sensitivity is required when clipped_grad_fn has no .sensitivity attribute.")
  steps = _validation.check_positive_int(num_steps, "num_steps")
  examples = tuple(jnp.asarray(e) for e in examples)
  canary = tuple(e[-1:] for e in examples)
  canary_grad, _ = clipped_grad_fn(params, *canary)
  norm = _tree_norm(canary_grad)
  if not np.isfinite(norm) or norm == 0.0:
    raise ValueError("the canary's clipped gradient at params is zero or not finite; "
                     "choose a canary with a non-zero loss gradient.")
  direction = jax.tree.map(lambda g: (g / norm).astype(jnp.float32), canary_grad)

  def mechanism(key: jax.Array, mask: jax.Array) -> jax.Array:
    grad_sum, _ = clipped_grad_fn(params, *examples, mask=mask)
    tx = aggregate(noise_multiplier, sens, expected_batch_size, key)
    state = tx.init(params)

    def step(state, _):
      update, state = tx.update(grad_sum, state)
      return state, _tree_vdot(update, direction)

    _, projections = jax.lax.scan(step, state, None, length=steps)
    return projections

  return mechanism


def dpsgd_canary_audit(
    clipped_grad_fn: Callable[..., Any],
    params: Any,
    batch: Sequence[Any],
    canary: Sequence[Any],
    *,
    noise_multiplier: float,
    key: jax.Array,
    num_trials: int,
    num_steps: int = 1,
    expected_batch_size: Optional[float] = None,
    l2_sensitivity: Optional[float] = None,
    aggregate: Optional[Callable[..., Any]] = None,
    claimed_epsilon: Optional[float] = None,
    delta: float = 0.0,
    confidence: float = 0.95,
    batch_size: int = 10_000,
    thresholds: Optional[Sequence[float]] = None,
    progress: bool = True,
) -> core.AuditReport:
  """Audits DP-SGD aggregation with a canary example (module docstring).

  Args:
    clipped_grad_fn: ``(params, *batch_args, mask=None) -> (clipped grad sum,
      info)`` with a ``.sensitivity`` (as returned by ``clipped_grad``).
    params: parameters at which the gradients are taken (held fixed).
    batch: the other examples, a tuple of arrays with leading axis B.
    canary: the canary example, a tuple of arrays without the batch axis.
    noise_multiplier: sigma of the noise transform.
    key: ``jax.random`` key for the trials.
    num_trials: trials per dataset (with and without the canary).
    num_steps: T noisy steps observed per trial.
    expected_batch_size: ``b`` of the noise transform (default B + 1).
    l2_sensitivity: override ``clipped_grad_fn.sensitivity`` (to audit a
      deliberately wrong calibration).
    aggregate: noise-transform factory ``(noise_multiplier, l2_sensitivity,
      expected_batch_size, key) -> optax.GradientTransformation``; default
      :func:`jaxdp.training.dpsgd.transforms.noisy_aggregate`.
    claimed_epsilon: epsilon the accountant claims for these T steps (e.g.
      ``jaxdp.accounting.dpsgd.dpsgd_epsilon(sigma, 1.0, T, delta)``).
    delta: the accountant's delta.
    confidence, batch_size, thresholds, progress: as in
      :func:`jaxdp.audit.audit_epsilon`.

  Returns:
    :class:`jaxdp.audit.AuditReport` for the statistic ``sum_t <u_t, c/||c||>``.
  """
  batch = tuple(jnp.asarray(b) for b in batch)
  canary = tuple(jnp.asarray(c) for c in canary)
  if len(batch) != len(canary) or not batch:
    raise ValueError("batch and canary must be non-empty tuples with the same number of arrays.")
  sizes = {int(b.shape[0]) for b in batch}
  if len(sizes) != 1:
    raise ValueError(f"all batch arrays need the same leading size, got {sorted(sizes)}.")
  for i, (b, c) in enumerate(zip(batch, canary)):
    if tuple(b.shape[1:]) != tuple(c.shape):
      raise ValueError(f"canary[{i}] must have shape {tuple(b.shape[1:])} (one example), got {tuple(c.shape)}.")
  b_size = sizes.pop()
  if expected_batch_size is None:
    expected_batch_size = float(b_size + 1)
  examples = tuple(jnp.concatenate([b, c[None].astype(b.dtype)]) for b, c in zip(batch, canary))
  mechanism = canary_mechanism(
      clipped_grad_fn, params, examples, noise_multiplier=noise_multiplier,
      expected_batch_size=expected_batch_size, num_steps=num_steps,
      l2_sensitivity=l2_sensitivity, aggregate=aggregate)
  mask_without = jnp.ones((b_size + 1,), jnp.float32).at[-1].set(0.0)
  mask_with = jnp.ones((b_size + 1,), jnp.float32)
  return core.audit_epsilon(
      mechanism, mask_without, mask_with, jnp.sum, key=key, num_trials=num_trials,
      batch_size=batch_size, claimed_epsilon=claimed_epsilon, delta=delta,
      confidence=confidence, thresholds=thresholds, progress=progress)
