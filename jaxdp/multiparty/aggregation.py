"""Labels for the auxiliary data from the local ensemble (paper 001 Sec. 4.1 and 4.3).

Paper 001 = ``../shared/papers/001_learning_privately_from_multiparty_data.md``.
Input is the ``(M, N)`` vote matrix ``V[i, n] = h_i(x_n)`` with labels in
``[0, C)`` (binary: ``{0, 1}``, label 1 = the paper's ``+1``).

* :func:`majority_labels` — the majority vote ``v(x)`` (Eq. 6; multiclass:
  the most voted class). Ties: binary ties go to class 1 (Eq. 6 uses
  ``>= M/2``), multiclass ties to the smallest class index. The tie rule is
  data-independent, so it does not affect the sensitivity analysis
  (Theorem 1 already assumes every label can flip).
* :func:`soft_labels` — the vote fractions ``alpha(x)`` (Eq. 12), one column
  per class (multiclass Eq. 54: ``alpha^k(x)``, the fraction of votes for
  ``k``). For binary problems column 1 is the paper's ``alpha``.

Replacing ONE party's data changes at most one vote per auxiliary sample, so
each row of ``alpha`` moves by ``-1/M`` in one class and ``+1/M`` in another
(L2 change ``<= sqrt(2)/M``, binary ``|alpha - alpha'| <= 1/M``): the basis of
Theorem 3 (App. A.2) and of App. B.3.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxdp import _validation


def check_votes(votes: Any, num_classes: int) -> np.ndarray:
  """Validates a concrete ``(M, N)`` vote matrix with integer labels in ``[0, num_classes)``.

  Integer input is returned without a copy (the matrix is ``M x N``: 860 MB as
  int8 for the paper's M = 20K parties and N = 43K auxiliary rows).
  """
  c = _validation.check_positive_int(num_classes, "num_classes")
  if c < 2:
    raise ValueError(f"num_classes must be >= 2, got {c}.")
  v = np.asarray(votes)
  if not np.issubdtype(v.dtype, np.integer):
    v = _validation.check_finite_array(votes, "votes")
    if v.size and np.any(v != np.round(v)):
      raise ValueError(f"votes must hold integer labels in [0, {c}).")
    v = v.astype(np.int32)
  if v.ndim != 2 or v.shape[0] < 1 or v.shape[1] < 1:
    raise ValueError(f"votes must be a non-empty (M, N) array (parties x auxiliary samples), "
                     f"got shape {v.shape}.")
  if v.min() < 0 or v.max() >= c:
    raise ValueError(f"votes must hold integer labels in [0, {c}).")
  return v


@functools.partial(jax.jit, static_argnames=("num_classes",))
def _counts(v: jax.Array, num_classes: int) -> jax.Array:
  # One fused compare-and-sum per class: no (M, N, C) one-hot tensor.
  return jnp.stack([jnp.sum(v == k, axis=0, dtype=jnp.int32) for k in range(num_classes)],
                   axis=-1)


def vote_counts(votes: Any, num_classes: int) -> jax.Array:
  """``(N, C)`` number of parties voting for each class on each auxiliary sample."""
  return _counts(jnp.asarray(check_votes(votes, num_classes)), int(num_classes))


def soft_labels(votes: Any, num_classes: int) -> jax.Array:
  r"""``(N, C)`` vote fractions :math:`\alpha^k(x_n) = \frac1M \sum_i I[h_i(x_n) = k]` (Eq. 12/54)."""
  m = np.shape(votes)[0]
  return vote_counts(votes, num_classes).astype(jnp.float32) / m


def majority_labels(votes: Any, num_classes: int) -> jax.Array:
  """``(N,)`` majority-voted labels (Eq. 6; binary ties -> 1, multiclass ties -> smallest class)."""
  counts = vote_counts(votes, num_classes)
  m = np.shape(votes)[0]
  if num_classes == 2:
    return (2 * counts[:, 1] >= m).astype(jnp.int32)
  return jnp.argmax(counts, axis=-1).astype(jnp.int32)
