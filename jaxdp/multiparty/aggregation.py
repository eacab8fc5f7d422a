r"""Labels for the auxiliary data from the local ensemble (paper 001 Sec. 4.1 and 4.3).

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

**Rounding.** The exact fractions ``k/M`` are not floats. :func:`soft_labels`
returns ``fl(k/M)``, the float64 quotient of the exact integer count ``k`` and
``M`` (IEEE division is correctly rounded: ``fl(a) = a (1 + e)``, ``|e| <= u =
2^-53``). For one changed vote ``k -> k -+ 1`` (both fractions in ``[0, 1]``)

.. math:: |fl(a) - fl(a')| \le |a - a'| + u (a + a') \le 1/M + 2u = 1/M + 2^{-52},

and the entries of the other classes are unchanged bit for bit (same count,
same division). :func:`soft_label_row_change` is this bound; the soft-label
sensitivities of :mod:`jaxdp.multiparty.private_global` use it in place of
``1/M``. (float32 labels, as returned before, moved by up to ``1/M + 2^-23``,
e.g. ``1/3 + 1e-8`` at ``M = 3``: the bound ``1/M`` did not hold after
rounding.)

These labels are the trusted aggregator's **non-private** intermediates
(functions of every party's votes, no noise): they must not be released; the
private releases are :func:`jaxdp.multiparty.private_soft_label_erm` and
:func:`jaxdp.multiparty.private_vote_erm`.
"""

from __future__ import annotations

import fractions
import functools
import math
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
  v = _validation.check_numeric_array(votes, "votes")
  if v.ndim != 2 or v.shape[0] < 1 or v.shape[1] < 1:
    raise ValueError(f"votes must be a non-empty (M, N) array (parties x auxiliary samples), "
                     f"got shape {v.shape}.")
  if np.iscomplexobj(v) or v.dtype == np.bool_:
    raise ValueError(f"votes must hold integer labels in [0, {c}), got dtype {v.dtype}.")
  integer = np.issubdtype(v.dtype, np.integer)
  if integer and int(v.min()) >= 0 and int(v.max()) < c:
    return v  # the common case: two reductions, no (M, N) temporary
  with np.errstate(invalid="ignore"):
    bad = (v < 0) | (v >= c) if integer else ~np.isfinite(v) | (v != np.round(v)) | (v < 0) | (
        v >= c)
  if np.any(bad):
    i, n = (int(t) for t in np.argwhere(bad)[0])
    raise ValueError(f"votes must hold integer labels in [0, {c}); votes[{i}, {n}] (party {i}, "
                     f"auxiliary sample {n}) is not one.")
  if not np.issubdtype(v.dtype, np.integer):
    v = v.astype(np.int32)
  return v


@functools.partial(jax.jit, static_argnames=("num_classes",))
def _counts(v: jax.Array, num_classes: int) -> jax.Array:
  # One fused compare-and-sum per class: no (M, N, C) one-hot tensor.
  return jnp.stack([jnp.sum(v == k, axis=0, dtype=jnp.int32) for k in range(num_classes)],
                   axis=-1)


def vote_counts(votes: Any, num_classes: int) -> jax.Array:
  """``(N, C)`` number of parties voting for each class on each auxiliary sample."""
  return _counts(jnp.asarray(check_votes(votes, num_classes)), int(num_classes))


def soft_labels(votes: Any, num_classes: int) -> np.ndarray:
  r"""``(N, C)`` float64 vote fractions :math:`\alpha^k(x_n) = \frac1M \sum_i I[h_i(x_n) = k]`.

  Paper 001 Eq. 12 (binary) / Eq. 54 (multiclass).

  Exact integer counts divided by ``M`` in float64 (host numpy): each entry
  moves by at most :func:`soft_label_row_change` when one party's votes
  change (module docstring). Non-private: never release these.
  """
  v = check_votes(votes, num_classes)
  counts = np.asarray(_counts(jnp.asarray(v), int(num_classes)), np.int64)
  return counts.astype(np.float64) / v.shape[0]


# Unit roundoff of float64 (round to nearest): fl(a) = a (1 + e), |e| <= 2^-53.
FLOAT64_UNIT_ROUNDOFF = 2.0 ** -53


def soft_label_row_change(num_parties: int) -> float:
  """``1/M + 2^-52``: the most one entry of :func:`soft_labels` moves when one party changes.

  The exact fractions move by ``1/M``; the float64 rounding of the two
  quotients adds at most ``2u = 2^-52`` (module docstring). Two entries of a
  row move (one class loses the vote, another gains it), the others not at
  all, so a row moves by at most ``sqrt(2)`` times this in L2. The float
  returned is the exact rational bound rounded up.
  """
  m = _validation.check_positive_int(num_parties, "num_parties")
  exact = fractions.Fraction(1, m) + 2 * fractions.Fraction(FLOAT64_UNIT_ROUNDOFF)
  bound = float(exact)  # round to nearest, then up: the float returned is >= the exact bound
  return bound if fractions.Fraction(bound) >= exact else math.nextafter(bound, math.inf)


def majority_labels(votes: Any, num_classes: int) -> jax.Array:
  """``(N,)`` majority-voted labels (Eq. 6; binary ties -> 1, multiclass ties -> smallest class)."""
  v = check_votes(votes, num_classes)
  counts = _counts(jnp.asarray(v), int(num_classes))
  m = v.shape[0]
  if num_classes == 2:
    return (2 * counts[:, 1] >= m).astype(jnp.int32)
  return jnp.argmax(counts, axis=-1).astype(jnp.int32)
