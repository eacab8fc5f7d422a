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

With Poisson sampling (``sample_rate = q < 1``) the canary joins each step
with probability q, so each projection is the mixture
``(1 - q) N(m, s^2) + q N(m + ||c||/b, s^2)`` under D' -- the subsampled
Gaussian whose amplification the accountant claims (Abadi et al. 2016;
Mironov, Talwar, Zhang 2019). The audit then uses the exact log-likelihood
ratio ``sum_t log(1 - q + q exp(...))`` (the optimal test for the T
independent steps), which for q = 1 is monotone in the sum of projections.

The trials run the library's own pieces: ``clipped_grad_fn`` (e.g.
:func:`jaxdp.dpsgd.clipping.clipped_grad`) computes the masked,
clipped gradient sum, and ``aggregate`` (default
:func:`jaxdp.dpsgd.transforms.noisy_aggregate`) adds the noise, T
times per trial from one trial key, vmapped over trials.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional, Sequence

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


class CanaryAudit(NamedTuple):
  """What :func:`canary_mechanism` builds.

  Attributes:
    mechanism: ``f(key, mask) -> (num_steps,)`` projections ``<u_t, c/||c||>``.
    statistic: ``projections -> scalar``, the log-likelihood ratio of D' vs D
      (module docstring), monotone in ``sum_t <u_t, c>`` when
      ``sample_rate = 1``.
    offset: ``<G, c/||c||> / b``, the mean projection without the canary.
    shift: ``||c|| / b``, the mean shift the canary adds when it is sampled.
    noise_std: ``sigma S / b``, the std of each projection.
  """

  mechanism: Callable[[jax.Array, jax.Array], jax.Array]
  statistic: Callable[[jax.Array], jax.Array]
  offset: float
  shift: float
  noise_std: float


def canary_mechanism(
    clipped_grad_fn: Callable[..., Any],
    params: Any,
    examples: Sequence[Any],
    *,
    noise_multiplier: float,
    expected_batch_size: float,
    num_steps: int = 1,
    sample_rate: float = 1.0,
    l2_sensitivity: Optional[float] = None,
    aggregate: Optional[Callable[..., Any]] = None,
) -> CanaryAudit:
  """Builds the canary trial ``f(key, mask)`` and its likelihood-ratio statistic.

  ``examples`` holds the batch *including* the canary as its last row; the
  dataset is the 0/1 ``mask`` over rows (mask[-1] = 0: D, = 1: D'). Each
  trial runs ``num_steps`` DP-SGD aggregation steps at fixed ``params`` with
  a noise transform initialised from one half of ``key``; with
  ``sample_rate = q < 1`` the canary joins each step independently with
  probability q (Poisson sampling of the canary, drawn from the other half of
  ``key``; the other examples are fixed, the white-box worst case).

  Per step the projection is ``N(offset, s^2)`` without the canary and
  ``N(offset + shift, s^2)`` with it, so the statistic is the exact
  log-likelihood ratio of the T steps,
  ``sum_t log(1 - q + q exp((shift (p_t - offset) - shift^2 / 2) / s^2))``.
  """
  if aggregate is None:
    from jaxdp.dpsgd.transforms import noisy_aggregate as aggregate  # pylint: disable=g-import-not-at-top
  sens = getattr(clipped_grad_fn, "sensitivity", None) if l2_sensitivity is None else l2_sensitivity
  if sens is None:
    raise ValueError("l2_sensitivity is required when clipped_grad_fn has no .sensitivity attribute.")
  steps = _validation.check_positive_int(num_steps, "num_steps")
  q = _validation.check_sample_rate(sample_rate)
  b = _validation.check_positive(expected_batch_size, "expected_batch_size")
  sigma = _validation.check_nonnegative(noise_multiplier, "noise_multiplier")
  examples = tuple(jnp.asarray(e) for e in examples)
  canary = tuple(e[-1:] for e in examples)
  canary_grad, _ = clipped_grad_fn(params, *canary)
  norm = _tree_norm(canary_grad)
  if not np.isfinite(norm) or norm == 0.0:
    raise ValueError("the canary's clipped gradient at params is zero or not finite; "
                     "choose a canary with a non-zero loss gradient.")
  direction = jax.tree.map(lambda g: (g / norm).astype(jnp.float32), canary_grad)
  num_rows = int(examples[0].shape[0])
  others = jnp.ones((num_rows,), jnp.float32).at[-1].set(0.0)
  base_sum, _ = clipped_grad_fn(params, *examples, mask=others)
  offset = float(_tree_vdot(base_sum, direction)) / b
  shift = norm / b
  noise_std = sigma * float(sens) / b

  def mechanism(key: jax.Array, mask: jax.Array) -> jax.Array:
    noise_key, sample_key = jax.random.split(key)
    tx = aggregate(noise_multiplier, sens, expected_batch_size, noise_key)
    state = tx.init(params)

    def step(state, t):
      included = jax.random.bernoulli(jax.random.fold_in(sample_key, t), q).astype(jnp.float32)
      step_mask = mask.at[-1].multiply(included)
      grad_sum, _ = clipped_grad_fn(params, *examples, mask=step_mask)
      update, state = tx.update(grad_sum, state)
      return state, _tree_vdot(update, direction)

    _, projections = jax.lax.scan(step, state, jnp.arange(steps))
    return projections

  if noise_std == 0.0:
    statistic = jnp.sum  # no noise: any separating statistic is optimal
  else:
    log_keep = float(np.log1p(-q)) if q < 1.0 else -np.inf
    log_q = float(np.log(q))

    def statistic(projections: jax.Array) -> jax.Array:
      a = (shift * (projections - offset) - 0.5 * shift**2) / noise_std**2
      return jnp.sum(jnp.logaddexp(log_keep, log_q + a))

  return CanaryAudit(mechanism, statistic, offset, shift, noise_std)


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
    sample_rate: float = 1.0,
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
    sample_rate: probability q that the canary joins each step (Poisson
      sampling of the canary; compare with the accountant at the same q).
    expected_batch_size: ``b`` of the noise transform (default B + 1).
    l2_sensitivity: override ``clipped_grad_fn.sensitivity`` (to audit a
      deliberately wrong calibration).
    aggregate: noise-transform factory ``(noise_multiplier, l2_sensitivity,
      expected_batch_size, key) -> optax.GradientTransformation``; default
      :func:`jaxdp.dpsgd.transforms.noisy_aggregate`.
    claimed_epsilon: epsilon the accountant claims for these T steps (e.g.
      ``jaxdp.accounting.dpsgd_accounting.dpsgd_epsilon(sigma, 1.0, T, delta)``).
    delta: the accountant's delta.
    confidence, batch_size, thresholds, progress: as in
      :func:`jaxdp.audit.audit_epsilon`.

  Returns:
    :class:`jaxdp.audit.AuditReport` for the likelihood-ratio statistic of
    :func:`canary_mechanism`.
  """
  _validation.check_key(key)
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
  setup = canary_mechanism(
      clipped_grad_fn, params, examples, noise_multiplier=noise_multiplier,
      expected_batch_size=expected_batch_size, num_steps=num_steps, sample_rate=sample_rate,
      l2_sensitivity=l2_sensitivity, aggregate=aggregate)
  mask_without = jnp.ones((b_size + 1,), jnp.float32).at[-1].set(0.0)
  mask_with = jnp.ones((b_size + 1,), jnp.float32)
  return core.audit_epsilon(
      setup.mechanism, mask_without, mask_with, setup.statistic, key=key, num_trials=num_trials,
      batch_size=batch_size, claimed_epsilon=claimed_epsilon, delta=delta,
      confidence=confidence, thresholds=thresholds, progress=progress)
