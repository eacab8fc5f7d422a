"""Local classifiers of M parties, trained in one batched call (paper 001 Sec. 3.1).

Paper 001 = ``../shared/papers/001_learning_privately_from_multiparty_data.md``
(Hamm, Cao & Belkin 2016). Party ``i`` holds a private set ``S^(i)`` (Eq. 5)
and trains a local classifier ``h_i`` on it. The local classifiers are never
released: only their votes on auxiliary data (Algorithms 1 and 2) or a noisy
average of their parameters (the Pathak et al. 2010 baseline) leave the
trusted aggregator, so they need no privacy mechanism themselves.

Any black-box predictor works as a local classifier (the paper's point: the
ensemble may mix decision trees, SVMs, ...): :func:`votes_from_predictors`
turns callables ``x -> labels`` into the ``(M, N)`` vote matrix. For the
paper's experiments (Sec. 6, every party trains a regularised logistic
regression) :func:`fit_local_classifiers` trains all ``M`` parties in ONE
compiled call of :func:`jaxdp.training.linear.fit_linear_batched`
(``vmap`` on accelerators, ``lax.map`` on CPU), and :func:`local_votes`
evaluates all of them on the auxiliary set with one ``vmap``.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxdp import _validation
from jaxdp.training import linear
from jaxdp.training.lbfgs import SolverInfo


class PartySplit(NamedTuple):
  """Private data of ``M`` parties and the auxiliary (unlabeled) set.

  Attributes:
    xs: ``(M, n, D)`` features of each party (paper 001 Eq. 5).
    ys: ``(M, n)`` labels of each party.
    x_aux: ``(N, D)`` auxiliary features (their labels are never used by the
      private algorithms).
    y_aux: ``(N,)`` true labels of the auxiliary samples (for the non-private
      *batch* baseline and for diagnostics only).
  """

  xs: np.ndarray
  ys: np.ndarray
  x_aux: np.ndarray
  y_aux: np.ndarray


class LocalClassifiers(NamedTuple):
  """Weights of the ``M`` local linear classifiers (leading axis ``M``) and solver diagnostics."""

  weights: jax.Array
  info: SolverInfo


def _check_split_seed(seed: Any) -> int | None:
  """``None`` or a non-negative integer (floats and bools would silently collide)."""
  if seed is None:
    return None
  if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)) or seed < 0:
    raise ValueError(f"seed must be None or a non-negative integer, got {type(seed).__name__}.")
  return int(seed)


def _check_integer_labels(labels: np.ndarray, name: str) -> None:
  """Finite, integer-valued, non-negative class labels; else ``ValueError`` naming the first row."""
  if np.iscomplexobj(labels) or labels.dtype == np.bool_:
    raise ValueError(f"{name} must hold integer class labels >= 0, got dtype {labels.dtype}.")
  with np.errstate(invalid="ignore"):
    bad = ~np.isfinite(labels) | (labels != np.round(labels)) | (labels < 0)
  if np.any(bad):
    row = ", ".join(str(int(t)) for t in np.argwhere(bad)[0])
    raise ValueError(f"{name} must hold integer class labels >= 0 (finite, no fractions); "
                     f"{name}[{row}] is not one.")


def split_parties(seed: int | None, x: Any, y: Any, *, num_parties: int, samples_per_party: int,
                  num_aux: int | None = None) -> PartySplit:
  """Randomly distributes a training set to ``M`` parties and an auxiliary set (paper 001 Sec. 6).

  Rows are permuted with ``numpy.random.default_rng(seed)``; the first
  ``M * n`` go to the parties (``n = samples_per_party`` each, without
  replacement, as Subagging, Sec. 3.1), the next ``num_aux`` (default: all the
  rest) form the auxiliary set.

  The split is a public simulation step (no noise is drawn): ``seed`` (an
  integer) makes it reproducible; ``None`` draws a fresh split from OS entropy.

  Raises:
    ValueError: too few rows for the requested split; ``y`` not integer class
      labels (NaN, inf or fractional labels are refused, naming the row).
  """
  seed = _check_split_seed(seed)
  x = _validation.check_finite_array(x, "x")
  y = _validation.check_numeric_array(y, "y")
  m = _validation.check_positive_int(num_parties, "num_parties")
  n = _validation.check_positive_int(samples_per_party, "samples_per_party")
  if x.ndim != 2 or y.shape != (x.shape[0],):
    raise ValueError(f"x must be (N, D) and y (N,), got {x.shape} and {y.shape}.")
  _check_integer_labels(y, "y")
  rest = x.shape[0] - m * n
  n_aux = rest if num_aux is None else _validation.check_positive_int(num_aux, "num_aux")
  if rest < 1 or n_aux > rest:
    raise ValueError(f"{x.shape[0]} rows cannot hold {m} parties x {n} samples plus "
                     f"{n_aux if num_aux is not None else '>= 1'} auxiliary samples.")
  perm = np.random.default_rng(seed).permutation(x.shape[0])
  priv, aux = perm[:m * n], perm[m * n:m * n + n_aux]
  return PartySplit(x[priv].reshape(m, n, -1), y[priv].reshape(m, n), x[aux], y[aux])


def fit_local_classifiers(xs: Any, ys: Any, *, l2_reg: float, loss: str = "logistic",
                          num_classes: int | None = None, max_iter: int = 500,
                          tol: float = 1e-6, batch_mode: str = "auto") -> LocalClassifiers:
  """Trains the ``M`` local classifiers in one call (:func:`~jaxdp.training.linear.fit_linear_batched`).

  Each party minimises its own regularised risk (paper 001 Eq. 4) on its own
  data only; ``xs (M, n, D)`` rows must lie in the unit L2 ball (needed only by
  the parameter-averaging baseline, whose sensitivity bounds the local
  minimisers; votes from any classifier are fine).

  Returns:
    :class:`LocalClassifiers` with weights ``(M, D)`` (binary losses) or ``(M, D, C)`` (softmax).
  """
  model = linear.fit_linear_batched(xs, ys, num_classes=num_classes, l2_reg=l2_reg, loss=loss,
                                    max_iter=max_iter, tol=tol, batch_mode=batch_mode)
  return LocalClassifiers(model.weights, model.info)


@jax.jit
def _votes(weights: jax.Array, x: jax.Array) -> jax.Array:
  return jax.vmap(lambda w: linear.predict_labels(w, x))(weights).astype(jnp.int32)


def local_votes(weights: Any, x_aux: Any, *, parties_per_chunk: int = 512) -> np.ndarray:
  """``(M, N)`` labels ``h_i(x_n)`` of ``M`` linear local classifiers on the auxiliary set.

  ``weights`` is ``(M, D)`` (binary: label 1 iff ``w^T x >= 0``) or
  ``(M, D, C)`` (argmax class); ``vmap``-ed over ``parties_per_chunk``
  classifiers at a time. Returned as host int8 (int32 for more than 127
  classes) to keep the ``M x N`` matrix small.
  """
  w = _validation.check_finite_array(weights, "weights")
  x = jnp.asarray(_validation.check_finite_array(x_aux, "x_aux"), w.dtype)
  if w.ndim not in (2, 3) or w.shape[1] != x.shape[-1]:
    raise ValueError(f"weights must be (M, D) or (M, D, C) with D = {x.shape[-1]}, got {w.shape}.")
  step = _validation.check_positive_int(parties_per_chunk, "parties_per_chunk")
  dtype = np.int8 if (w.ndim == 2 or w.shape[2] <= 127) else np.int32
  out = np.empty((w.shape[0], x.shape[0]), dtype)
  for s in range(0, w.shape[0], step):
    out[s:s + step] = np.asarray(_votes(jnp.asarray(w[s:s + step]), x))
  return out


def votes_from_predictors(predictors: Sequence[Callable[[Any], Any]], x_aux: Any) -> np.ndarray:
  """``(M, N)`` vote matrix from ``M`` black-box classifiers ``h_i: (N, D) -> (N,)`` labels.

  The local classifiers may be of any (mixed) types (paper 001 Sec. 1 and
  footnote 1): the privacy analysis only uses the fact that one party changes
  at most its own row of votes.

  Raises:
    ValueError: a predictor returns the wrong shape or labels that are not
      non-negative integers (``0.7`` is refused, not truncated to ``0``),
      naming the predictor and the auxiliary row.
  """
  if len(predictors) < 1:
    raise ValueError("predictors must hold at least one classifier.")
  x = _validation.check_finite_array(x_aux, "x_aux")
  rows = []
  for i, h in enumerate(predictors):
    name = f"predictors[{i}]"
    v = _validation.check_numeric_array(h(x), f"the labels returned by {name}")
    if v.shape != (x.shape[0],):
      raise ValueError(f"predictor {i} ({name}) returned shape {v.shape}, expected "
                       f"({x.shape[0]},).")
    _check_integer_labels(v, f"the labels returned by {name}")
    if v.size and float(v.max()) > np.iinfo(np.int32).max:
      raise ValueError(f"the labels returned by {name} must fit in int32.")
    rows.append(v.astype(np.int32))
  return np.stack(rows)


@jax.jit
def _accuracies(weights: jax.Array, x: jax.Array, y: jax.Array) -> jax.Array:
  return jnp.mean(_votes(weights, x) == y[None, :], axis=1)


def local_accuracies(weights: Any, x_test: Any, y_test: Any, *,
                     parties_per_chunk: int = 512) -> np.ndarray:
  """``(M,)`` test accuracy of each local classifier (the *indiv* baseline, paper 001 Sec. 6).

  Evaluated ``parties_per_chunk`` classifiers at a time (memory ``chunk x N_test``).
  """
  w = _validation.check_finite_array(weights, "weights")
  x = jnp.asarray(_validation.check_finite_array(x_test, "x_test"), w.dtype)
  y = jnp.asarray(y_test)
  if w.ndim not in (2, 3) or w.shape[1] != x.shape[-1]:
    raise ValueError(f"weights must be (M, D) or (M, D, C) with D = {x.shape[-1]}, got {w.shape}.")
  step = _validation.check_positive_int(parties_per_chunk, "parties_per_chunk")
  out = [np.asarray(_accuracies(jnp.asarray(w[s:s + step]), x, y))
         for s in range(0, w.shape[0], step)]
  return np.concatenate(out)
