"""Subsample-and-aggregate: disjoint teachers + exponential mechanism over votes.

Reference: ``../shared/papers/000_tradeoffs_of_private_prediction.md``
Section 3.2 and Appendix C.2 (Algorithm 8, Eq. 54, Theorems 7 and 8), after
Dwork & Feldman (2018).

Algorithm 8: partition ``D`` into T disjoint parts of size ``floor(N/T)``,
train one teacher per part (here in ONE vmapped call), and answer a query
``x`` with label ``y`` drawn with probability ∝ ``exp(beta * n_y(x))``, where
``n_y(x)`` is the number of teachers voting ``y`` (Eq. 54).

Calibration: the paper's ``beta = eps/B`` is NOT eps-DP; use ``eps/(2B)``
---------------------------------------------------------------------------
Changing one training example changes one teacher, hence at most one vote:
``n_a`` drops by 1 and ``n_b`` rises by 1. The proof of Theorem 7 (Eqs.
56-59) writes ``p(y|D) = exp(beta n_y)`` and forgets the normaliser
``Z(D) = sum_c exp(beta n_c)``. With it,

  ``log p(a|D)/p(a|D') = beta (n_a - n'_a) + log Z(D')/Z(D)
                       = beta + log Z(D')/Z(D),``

and ``Z(D')/Z(D) -> exp(beta)`` when ``b`` dominates both normalisers
(e.g. ``n = (1, T-1)`` vs ``n' = (0, T)``), so one answer leaks up to
``2 beta`` (the exponential mechanism is ``2 beta Delta``-DP, McSherry &
Talwar 2007; Dwork & Roth 2014 Thm 3.10). B answers with the paper's
``beta = eps/B`` can therefore leak up to ``2 eps``; the correct pure-DP
calibration (basic composition of B ``2 beta``-DP answers) is

  ``beta' = eps / (2B)``.

For ``delta > 0`` (Theorem 8) the paper composes B ``beta``-DP answers with
advanced composition. Corrected: the exponential mechanism is
``2 beta``-bounded-range (Durfee & Rogers 2019), hence ``beta^2/2``-zCDP
(Cesar & Rogers 2021); B answers are ``rho = B beta^2 / 2``-zCDP,
which is ``(rho + 2 sqrt(rho ln(1/delta)), delta)``-DP (Bun & Steinke 2016,
Prop. 1.3). Setting ``rho + 2 sqrt(rho L) = eps`` (``L = ln(1/delta)``) gives
``sqrt(rho) = sqrt(L + eps) - sqrt(L)`` and so

  ``beta'' = sqrt(2/B) (sqrt(ln(1/delta) + eps) - sqrt(ln(1/delta)))``,

which is exactly the paper's formula (Eq. 61): the paper's ``beta''``
survives (through zCDP, not through its stated argument, whose Eq. 60 also
uses ``1 + x <= e^x`` in the wrong direction), while ``beta'`` must be halved.
We use ``beta = max(eps/(2B), beta'')``: each candidate alone gives
``(eps, delta)``-DP, so the larger one does.

``tests/prediction/test_subsample_aggregate.py`` shows it on the adversarial
votes: the exact (and the sampled) privacy loss of the paper's ``beta``
exceeds ``eps``, ours does not. The paper's formulas are kept only as private
functions (``_paper_theorem7_beta``, ``_paper_theorem8_beta``) for that
demonstration.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxdp import _validation
from jaxdp.accounting import events as _events
from jaxdp.mechanisms import exponential as _exponential
from jaxdp.training import linear as _linear


# ---------------------------------------------------------------------------
# Partition and teachers.
# ---------------------------------------------------------------------------


def partition_indices(num_examples: int, num_teachers: int, key: jax.Array | None = None) -> np.ndarray:
  """Indices of T disjoint parts of size ``floor(N/T)`` (paper 000 Algorithm 8).

  With a ``key`` the examples are randomly permuted first (``jax.random``);
  without one the parts are contiguous blocks. The last ``N mod T`` examples
  (of the permutation) are left out, as in Algorithm 8.

  Returns:
    int array of shape ``(T, floor(N/T))``; rows are disjoint.
  """
  if key is not None:
    _validation.check_key(key)
  n = _validation.check_positive_int(num_examples, "num_examples")
  t = _validation.check_positive_int(num_teachers, "num_teachers")
  if t > n:
    raise ValueError(f"num_teachers must be in [1, num_examples={n}], got {t}.")
  size = n // t
  order = np.arange(n) if key is None else np.asarray(jax.random.permutation(key, n))
  return order[: t * size].reshape(t, size)


def partition_dataset(
    x: Any, y: Any, num_teachers: int, key: jax.Array | None = None
) -> tuple[np.ndarray, np.ndarray]:
  """Splits ``(x, y)`` into ``xs (T, n, ...)`` and ``ys (T, n)``, ``n = floor(N/T)``."""
  x = np.asarray(x)
  y = np.asarray(y)
  if x.shape[0] != y.shape[0]:
    raise ValueError(f"x and y must have the same number of rows, got {x.shape[0]} and {y.shape[0]}.")
  idx = partition_indices(x.shape[0], num_teachers, key)
  return x[idx], y[idx]


def train_teachers(train_fn: Callable[..., Any], xs: Any, ys: Any, *extra: Any) -> Any:
  """Trains T teachers in one call: ``jax.vmap(train_fn)(xs, ys, *extra)``.

  ``train_fn(x, y, *extra)`` must be a jittable training function of one
  part (e.g. a Flax/optax training loop with a fixed number of steps); pass
  per-teacher keys in ``extra`` with a leading T axis.
  """
  return jax.vmap(train_fn)(xs, ys, *extra)


def train_linear_teachers(
    x: Any,
    y: Any,
    *,
    num_teachers: int,
    num_classes: int,
    l2_reg: float,
    key: jax.Array | None = None,
    max_iter: int = 500,
    tol: float = 1e-6,
) -> _linear.LinearModel:
  """T softmax-regression teachers on disjoint parts, one vmapped L-BFGS call.

  ``jaxdp.training.linear.fit_linear_batched`` on :func:`partition_dataset`.
  Rows of ``x`` must lie in the unit L2 ball (the solver checks). The privacy
  of the aggregate does not depend on how teachers are trained (only on the
  partition being disjoint), so ``l2_reg`` is a free accuracy knob.

  Returns:
    ``LinearModel`` with weights of shape ``(T, D, C)``.
  """
  xs, ys = partition_dataset(x, y, num_teachers, key)
  return _linear.fit_linear_batched(xs, ys, num_classes=num_classes, l2_reg=l2_reg,
                                    loss="softmax", max_iter=max_iter, tol=tol)


def votes_from_labels(teacher_labels: Any, num_classes: int) -> jax.Array:
  """Vote histogram ``n (M, C)`` from teacher labels of shape ``(T, M)``."""
  labels = jnp.asarray(teacher_labels)
  return jnp.sum(jax.nn.one_hot(labels, num_classes, dtype=jnp.int32), axis=0)


def linear_teacher_votes(teacher_weights: Any, x: Any) -> jax.Array:
  """Votes ``n (M, C)`` of T linear softmax teachers (weights ``(T, D, C)``) on ``x (M, D)``.

  Teacher t votes ``argmax_c (theta_t^T x)_c``.
  """
  w = jnp.asarray(teacher_weights)
  if w.ndim != 3:
    raise ValueError(f"teacher_weights must have shape (T, D, C), got {w.shape}.")
  logits = jnp.einsum("md,tdc->tmc", jnp.asarray(x, w.dtype), w)
  return votes_from_labels(jnp.argmax(logits, axis=-1), w.shape[-1])


# ---------------------------------------------------------------------------
# Calibration.
# ---------------------------------------------------------------------------


def exponential_aggregation_beta(epsilon: float, delta: float, budget: int) -> float:
  """Inverse temperature of the vote aggregation for ``(eps, delta)``-DP over B answers.

  ``delta == 0``: ``beta = eps/(2B)`` (basic composition of B ``2 beta``-DP
  answers; paper 000 Theorem 7 corrected, see the module docstring).
  ``delta > 0``: ``beta = max(eps/(2B), sqrt(2/B) (sqrt(ln(1/delta) + eps) -
  sqrt(ln(1/delta))))`` (Theorem 8 corrected: the second term via
  bounded range -> zCDP -> (eps, delta)).

  >>> exponential_aggregation_beta(1.0, 0.0, 100)  # the paper's Theorem 7 says 0.01
  0.005
  >>> round(exponential_aggregation_beta(1.0, 1e-5, 100), 6)
  0.020406
  """
  eps = _validation.check_epsilon(epsilon)
  dlt = _validation.check_delta(delta)
  b = _validation.check_positive_int(budget, "budget")
  beta_pure = eps / (2.0 * b)
  if dlt == 0.0:
    return beta_pure
  log_inv_delta = math.log(1.0 / dlt)
  beta_zcdp = math.sqrt(2.0 / b) * (math.sqrt(log_inv_delta + eps) - math.sqrt(log_inv_delta))
  return max(beta_pure, beta_zcdp)


def _paper_theorem7_beta(epsilon: float, budget: int) -> float:
  """UNSAFE, for demonstration only: paper 000 Theorem 7's ``beta = eps/B``.

  It is ``2 eps``-DP in the worst case, not ``eps``-DP (module docstring).
  """
  return float(epsilon) / int(budget)


def _paper_theorem8_beta(epsilon: float, delta: float, budget: int) -> float:
  """UNSAFE, for demonstration only: paper 000 Theorem 8's ``max(eps/B, beta'')``."""
  log_inv_delta = math.log(1.0 / delta)
  beta_adv = math.sqrt(2.0 / budget) * (math.sqrt(log_inv_delta + epsilon) - math.sqrt(log_inv_delta))
  return max(_paper_theorem7_beta(epsilon, budget), beta_adv)


def exponential_aggregation_event(beta: float) -> _events.ExponentialMechanismDpEvent:
  """DpEvent of ONE answer: exponential mechanism on vote counts (sensitivity 1).

  ``2 beta``-DP and ``beta^2/2``-zCDP (see :mod:`jaxdp.mechanisms.exponential`).
  Tagged ``neighbouring="replace_one"`` (replacing one training example moves
  one teacher's vote).
  """
  return _events.ExponentialMechanismDpEvent(beta=_validation.check_positive(beta, "beta"),
                                             sensitivity=1.0, neighbouring="replace_one")


# ---------------------------------------------------------------------------
# Aggregation and its exact law.
# ---------------------------------------------------------------------------


def aggregate_exponential(key: jax.Array, votes: Any, beta: Any) -> jax.Array:
  """Samples one label per row of ``votes (M, C)`` with ``p(y) ∝ exp(beta n_y)`` (Eq. 54).

  Rows are independent draws (Gumbel-max, :func:`jaxdp.mechanisms.exponential
  .exponential_mechanism`); each row is one answer for the accountant.
  """
  return _exponential.exponential_mechanism(key, votes, beta)


def aggregate_exponential_from_keys(keys: jax.Array, votes: Any, beta: Any) -> jax.Array:
  """As :func:`aggregate_exponential` with one caller-supplied key per row."""
  _validation.check_key(keys, "keys", allow_batch=True)
  return jax.vmap(lambda k, v: _exponential.exponential_mechanism(k, v, beta))(keys, jnp.asarray(votes))


def exponential_vote_distribution(votes: Any, beta: float) -> np.ndarray:
  """The exact law ``softmax(beta n)`` of Eq. 54, in float64 (last axis)."""
  v = np.asarray(votes, dtype=np.float64) * float(beta)
  v = v - v.max(axis=-1, keepdims=True)
  p = np.exp(v)
  return p / p.sum(axis=-1, keepdims=True)


def exponential_privacy_loss(votes: Any, neighbour_votes: Any, beta: float) -> float:
  """Exact ``max_y |log p(y|D) / p(y|D')|`` of one answer, in float64."""
  p = exponential_vote_distribution(votes, beta)
  q = exponential_vote_distribution(neighbour_votes, beta)
  return float(np.max(np.abs(np.log(p) - np.log(q))))


def adversarial_votes(num_teachers: int, num_classes: int = 2) -> tuple[np.ndarray, np.ndarray]:
  """The neighbouring vote histograms that make the normaliser matter most.

  ``D``: one teacher votes class 0, ``T-1`` vote class 1; ``D'``: that teacher
  moved to class 1 (``(0, T)``). The loss at output 0 is ``beta + log
  Z(D')/Z(D)``, which tends to ``2 beta`` as ``beta T`` grows.
  """
  t = _validation.check_positive_int(num_teachers, "num_teachers")
  c = _validation.check_positive_int(num_classes, "num_classes")
  if c < 2:
    raise ValueError(f"num_classes must be >= 2, got {c}.")
  d = np.zeros(c, np.int64)
  d[0], d[1] = 1, t - 1
  d_prime = np.zeros(c, np.int64)
  d_prime[1] = t
  return d, d_prime


__all__ = [
    "adversarial_votes", "aggregate_exponential", "aggregate_exponential_from_keys",
    "exponential_aggregation_beta", "exponential_aggregation_event",
    "exponential_privacy_loss", "exponential_vote_distribution", "linear_teacher_votes",
    "partition_dataset", "partition_indices", "train_linear_teachers", "train_teachers",
    "votes_from_labels",
]
