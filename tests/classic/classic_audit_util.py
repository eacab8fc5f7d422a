"""Shared helpers of the classic-model audits: the exact Laplace log-likelihood ratio."""

import jax.numpy as jnp


def laplace_log_ratio(output, exact, exact_neighbour, scale):
  """``log p_D(o) - log p_D'(o)`` for ``o = exact + Lap(scale)`` entry-wise (all arrays alike).

  The most powerful statistic (Neyman-Pearson), so the audit bound is as
  tight as the trial count allows.
  """
  o, s, t = (jnp.ravel(jnp.asarray(v, jnp.float32)) for v in (output, exact, exact_neighbour))
  return jnp.sum(jnp.abs(o - t) - jnp.abs(o - s)) / scale
