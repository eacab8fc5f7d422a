"""The exponential mechanism over discrete scores, sampled by Gumbel-max.

Given scores ``u(D, i)``, ``i = 1..C``, and ``beta > 0``, the mechanism outputs
``i`` with probability ``p(i | D) = exp(beta u(D, i)) / Z(D)``,
``Z(D) = sum_j exp(beta u(D, j))`` (McSherry & Talwar 2007; Dwork & Roth 2014,
Definition 3.4 with ``beta = epsilon / (2 Delta u)``).

Sampling (Gumbel-max trick): with ``G_i`` i.i.d. standard Gumbel,
``argmax_i (beta u_i + G_i)`` has exactly the law ``softmax(beta u)``
(Gumbel 1954; Maddison, Tarlow & Minka 2014). ``jax.random.categorical``
uses the same trick; we keep it explicit because ``argmax(beta u + G)`` *is*
report-noisy-max with Gumbel noise, which makes the link to
:mod:`jaxdp.mechanisms.noisy_max` visible.

Privacy: the correct epsilon is ``2 beta Delta``, not ``beta Delta``
------------------------------------------------------------------
Let ``Delta = max_{D~D', i} |u(D, i) - u(D', i)|``. Then

  ``p(i|D) / p(i|D') = exp(beta (u(D,i) - u(D',i))) * Z(D') / Z(D)``

and *both* factors can be as large as ``exp(beta Delta)``, so the mechanism is
``2 beta Delta``-DP (Dwork & Roth Theorem 3.10), and in general no better:
in subsample-and-aggregate (``../shared/papers/000_tradeoffs_of_private_prediction.md``
Appendix C.2, Algorithm 8, Eq. 54) the score of class ``y`` is the number of
the ``T`` teachers voting ``y``; changing one training example changes one
teacher's vote, so one count drops by 1 and another rises by 1 (``Delta = 1``).
Already for two classes with balanced votes ``[T/2, T/2] -> [T/2+1, T/2-1]``
the loss is ``2 beta - log 2 + log(1 + e^{-2 beta}) = beta + beta^2/2 + O(beta^4)
> beta``; if the vote moves *from* class ``a`` *to* a class ``b`` that
dominates ``Z`` (e.g. ``[1, T-1] -> [0, T]``), ``p(a|D)/p(a|D') -> exp(2 beta)``. The proof of paper 000's Theorem 7 (Eqs.
56-59) drops the normaliser ``Z`` (it writes ``p(y) = exp(beta u_y)``), so
its claim ``beta = epsilon/B`` gives ``epsilon``-DP is off by a factor of 2;
following the correct proof, ``B`` answers with parameter ``beta`` are
``2 B beta``-DP. (``tests/mechanisms/test_exponential_mechanism.py`` computes the exact
worst-case log-ratio on all vote histograms of a small ensemble: it exceeds
``beta`` and stays below ``2 beta``.) Only for *monotone* scores (all scores
move in the same direction between neighbours, e.g. counts under add/remove of
a record) does ``beta Delta`` suffice (Dwork & Roth 2014, Section 3.4,
discussion of monotone utilities).

The exponential mechanism is moreover ``2 beta Delta``-bounded-range (the
log-ratio ``log p(i|D)/p(i|D')`` ranges over an interval of width at most
``2 beta Delta`` as ``i`` varies; Durfee & Rogers 2019, "Practical
differentially private top-k selection with pay-what-you-get composition"),
and ``eps``-bounded-range implies ``eps^2/8``-zCDP (Cesar & Rogers 2021,
"Bounding, concentrating, and truncating: unifying privacy loss composition
for data analytics"), so it is
``(beta Delta)^2 / 2``-zCDP -- the same as pure ``beta Delta``-DP would give
under Bun & Steinke's conversion, which makes zCDP/RDP composition of many
exponential-mechanism answers much cheaper than ``2 beta Delta`` per answer.
The accountant's ``ExponentialMechanismDpEvent(beta, sensitivity)`` carries
both facts.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from jaxdp import _validation
from jaxdp.accounting import events as _events
from jaxdp.mechanisms import _common


def gumbel_max(key: jax.Array, logits: Any, axis: int = -1) -> jax.Array:
  """Samples ``i`` with probability ``softmax(logits)_i`` along ``axis`` (Gumbel-max).

  ``argmax_i (logits_i + G_i)``, ``G_i`` i.i.d. standard Gumbel. Batched over
  every other axis (independent draws); ``-inf`` logits are never chosen.
  Returns int32 indices with ``axis`` removed. Concrete logits with NaN or
  ``+inf`` raise ``ValueError``; traced ones give ``-1`` for such rows.
  """
  _common.check_key(key)
  _common.check_data(logits, "logits", allow_neg_inf=True)
  traced = _common.is_traced(logits)
  logits = jnp.asarray(logits)
  dtype = _common.float_dtype_of(logits)
  # mode="highest" draws from 64 random bits, so the Gumbel tails (which decide
  # how unlikely a low-score class can be) are not cut short by float32.
  noise = jax.random.gumbel(key, logits.shape, dtype=dtype, mode="highest")
  index = jnp.argmax(logits.astype(dtype) + noise, axis=axis).astype(jnp.int32)
  if traced:
    index = _common.invalid_rows_to_minus_one(jnp.moveaxis(logits, axis, -1), index)
  return index


def _check_beta(beta: Any) -> None:
  _common.check_scale(beta, "beta", allow_zero=False)


def _scaled_scores(scores: Any, beta: Any) -> jax.Array:
  # -inf marks an excluded candidate (never chosen); NaN/+inf are refused.
  _common.check_data(scores, "scores", allow_neg_inf=True)
  scores = jnp.asarray(scores)
  dtype = _common.float_dtype_of(scores)
  beta = _common.noise_scale_as(beta, dtype, round_up=False)  # never a larger beta than given
  # beta is a scalar or broadcastable to the batch shape scores.shape[:-1].
  # The law softmax(beta * s) is invariant under s -> s - max(s): shifting by the largest
  # finite score first keeps beta * s <= 0, so a huge but finite score cannot overflow to
  # +inf (an output impossible on the neighbour). -inf (excluded) and NaN/+inf (refused, or
  # -1 when traced) stay as they are.
  x = scores.astype(dtype)
  finite = jnp.isfinite(x)
  top = jnp.max(jnp.where(finite, x, -jnp.inf), axis=-1, keepdims=True)
  top = jnp.where(jnp.isfinite(top), top, 0.0).astype(dtype)
  return beta[..., None] * jnp.where(finite, x - top, x)


def exponential_mechanism(key: jax.Array, scores: Any, beta: Any) -> jax.Array:
  """Samples ``i`` with probability ``∝ exp(beta * scores_i)`` (last axis).

  ``2 beta Delta``-DP and ``(beta Delta)^2/2``-zCDP for scores of sensitivity
  ``Delta`` (see the module docstring: the normaliser doubles the naive
  ``beta Delta``). Batched over leading axes: ``scores`` of shape ``(..., C)``
  gives int32 indices of shape ``(...)``, each row drawn independently (and
  each row is a separate release for the accountant).

  Args:
    key: a ``jax.random`` key, used once.
    scores: utility scores, shape ``(..., C)``; ``-inf`` excludes a candidate
      (that exclusion must not depend on the data). Concrete scores with NaN or
      ``+inf`` raise ``ValueError``; traced ones give ``-1`` for such rows.
    beta: ``beta > 0`` (scalar or broadcastable to ``scores.shape[:-1]``); may
      be traced (vmap over it); concrete values are checked.
  """
  _common.check_key(key)
  _check_beta(beta)
  traced = _common.is_traced(scores)
  index = gumbel_max(key, _scaled_scores(scores, beta), axis=-1)
  if traced:
    index = _common.invalid_rows_to_minus_one(jnp.asarray(scores), index)
  return index


def exponential_mechanism_probs(scores: Any, beta: Any) -> jax.Array:
  """The exact output law ``softmax(beta * scores)`` along the last axis."""
  _check_beta(beta)
  return jax.nn.softmax(_scaled_scores(scores, beta), axis=-1)


def _static_beta_sensitivity(beta: Any, sensitivity: Any) -> tuple[float, float]:
  _common.require_static(beta, "beta")
  _common.require_static(sensitivity, "sensitivity")
  b = _validation.check_positive(beta, "beta")
  s = _validation.check_positive(sensitivity, "sensitivity")
  return b, s


def exponential_mechanism_epsilon(beta: float, sensitivity: float = 1.0) -> float:
  """Pure-DP ``epsilon = 2 beta Delta`` of one exponential-mechanism draw (Dwork & Roth Thm 3.10)."""
  b, s = _static_beta_sensitivity(beta, sensitivity)
  return 2.0 * b * s


def exponential_mechanism_zcdp_rho(beta: float, sensitivity: float = 1.0) -> float:
  """zCDP ``rho = (beta Delta)^2 / 2`` via bounded range (Cesar & Rogers 2021)."""
  b, s = _static_beta_sensitivity(beta, sensitivity)
  return 0.5 * (b * s) ** 2


def exponential_mechanism_beta(epsilon: float, sensitivity: float = 1.0) -> float:
  """The ``beta = epsilon / (2 Delta)`` that makes one draw ``epsilon``-DP."""
  _common.require_static(epsilon, "epsilon")
  _common.require_static(sensitivity, "sensitivity")
  eps = _validation.check_epsilon(epsilon, "epsilon")
  s = _validation.check_positive(sensitivity, "sensitivity")
  return eps / (2.0 * s)


def exponential_mechanism_event(
    beta: float, sensitivity: float = 1.0,
    *, neighbouring: str = "add_remove", unit: str = "example"
) -> _events.ExponentialMechanismDpEvent:
  """DpEvent of one :func:`exponential_mechanism` draw (per row when batched).

  ``neighbouring`` (default ``"add_remove"``, dp_accounting's default) is the
  relation the sensitivity was computed for, and ``unit`` the privacy unit;
  both are carried into the event, so an accountant refuses to compose it
  with events of another relation.
  """
  b, s = _static_beta_sensitivity(beta, sensitivity)
  return _events.ExponentialMechanismDpEvent(beta=b, sensitivity=s, neighbouring=neighbouring, unit=unit)
