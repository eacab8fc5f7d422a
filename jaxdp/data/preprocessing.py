"""Preprocessing used by the papers' experiments (pure numpy, host side).

* Tabular encoding of ``../shared/papers/003_dp_confidence_intervals_for_erm.md``
  Section 7.1 (following Chaudhuri et al. 2011 and Zhang et al. 2013): each
  categorical attribute of cardinality ``k`` becomes ``k`` binary attributes;
  each attribute is scaled so its maximum (absolute) value is 1; a constant
  feature of ones is added; every record is normalised into the unit L2 ball.
  :class:`TabularEncoder` fits categories and scales on the training rows only
  and applies them unchanged to test rows (test values are clipped to the
  training range, unseen categories encode as all zeros).
* ``../shared/papers/000_tradeoffs_of_private_prediction.md`` Section 4.2:
  PCA of the images to ``D`` dimensions (:func:`fit_pca`, fitted on the
  training set only), the first ``C`` classes (:func:`keep_first_classes`,
  digits ``0 .. C-1``), a training set of ``N`` examples (:func:`subsample`).
* Row normalisation (:func:`normalize_rows`): the sensitivity theorems of
  output/objective perturbation (paper 000 Appendix B, Theorems 2-4; paper 003
  Section 4) assume ``||x_i||_2 <= 1``; this makes it true.
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Any, Sequence

import numpy as np

from jaxdp import _validation

UNIT_BALL_MODES = ("project", "scale")


def _row_norms(x: np.ndarray) -> np.ndarray:
  # The very function _validation.check_unit_ball measures with: a row this module puts in
  # the ball then passes that check as it is (a different summation order could leave it at
  # 1 + 2^-52 there, and every later check would copy X to pull it back in).
  return _validation.row_norms_float64(x.reshape(x.shape[0], -1))


def _float_dtype(x: np.ndarray) -> np.dtype:
  return x.dtype if x.dtype.kind == "f" else np.dtype(np.float32)


def normalize_rows(x: Any, mode: str = "project", *,
                   reference_norm: float | None = None) -> np.ndarray:
  """Puts every row of ``x`` in the unit L2 ball, ``||x_i||_2 <= 1``.

  * ``mode="project"``: ``x_i <- x_i / max(1, ||x_i||_2)`` (the Euclidean
    projection onto the ball; rows already inside are unchanged). This is the
    per-record normalisation of paper 003 Section 7.1.
  * ``mode="scale"``: ``x_i <- x_i / R`` with one scalar ``R`` for all rows,
    ``R = max_i ||x_i||_2`` (or ``reference_norm``, e.g. the training set's
    ``R`` applied to the test set; rows still outside are then projected).
    Preserves the relative geometry (and a constant feature stays constant).

  Args:
    x: ``[n, ...]`` array; the norm is over all trailing dimensions.
    mode: ``"project"`` or ``"scale"``.
    reference_norm: ``R`` for ``mode="scale"``; must be > 0.

  Returns:
    A float array of ``x``'s shape (float32 unless ``x`` is float64).
  """
  if mode not in UNIT_BALL_MODES:
    raise ValueError(f"mode must be one of {UNIT_BALL_MODES}, got {mode!r}.")
  arr = _validation.check_finite_array(x, "x")
  if arr.ndim < 1:
    raise ValueError(f"x must have a leading row dimension, got shape {arr.shape}.")
  arr = arr.astype(_float_dtype(arr), copy=False)
  if arr.shape[0] == 0:
    return arr.copy()
  norms = _row_norms(arr)
  if mode == "scale":
    if reference_norm is None:
      r = float(norms.max())
    else:
      r = _validation.check_positive(reference_norm, "reference_norm")
    if r > 0:
      norms = norms / r
      arr = (arr / r).astype(arr.dtype)
  factor = np.maximum(norms, 1.0).reshape((-1,) + (1,) * (arr.ndim - 1))
  out = (arr / factor).astype(arr.dtype)
  # Guard against float32 rounding pushing a unit row just past 1.
  over = _row_norms(out) > 1.0
  if np.any(over):
    out[over] = (out[over] * (1.0 - 1e-7)).astype(arr.dtype)
  return out


def normalize_train_test(x_train: Any, x_test: Any,
                         mode: str = "project") -> tuple[np.ndarray, np.ndarray]:
  """:func:`normalize_rows` on a train/test pair, with ``R`` fitted on train only.

  ``"project"`` treats each row on its own; ``"scale"`` divides both sets by
  ``R = max_i ||x_train_i||`` and projects any test row still outside the ball.
  """
  if mode not in UNIT_BALL_MODES:
    raise ValueError(f"mode must be one of {UNIT_BALL_MODES}, got {mode!r}.")
  if mode == "project":
    return normalize_rows(x_train, "project"), normalize_rows(x_test, "project")
  x_train = np.asarray(x_train)
  r = float(_row_norms(x_train).max()) if x_train.shape[0] else 0.0
  if r <= 0:
    return normalize_rows(x_train, "project"), normalize_rows(x_test, "project")
  return (normalize_rows(x_train, "scale", reference_norm=r),
          normalize_rows(x_test, "scale", reference_norm=r))


@dataclasses.dataclass(frozen=True, eq=False)
class PCATransform:
  """``x -> (x - mean) @ components.T``: projection on the top ``d`` principal axes.

  Attributes:
    mean: ``[D]`` training mean (zeros if fitted with ``center=False``).
    components: ``[d, D]`` orthonormal rows, by decreasing explained variance;
      each row's largest-magnitude entry is positive (a deterministic sign).
    explained_variance: ``[d]`` eigenvalues of the training covariance.
  """

  mean: np.ndarray
  components: np.ndarray
  explained_variance: np.ndarray

  @property
  def dims(self) -> int:
    return int(self.components.shape[0])

  def __call__(self, x: Any) -> np.ndarray:
    return self.transform(x)

  def transform(self, x: Any) -> np.ndarray:
    """Projects ``x`` (``[n, D]`` or ``[n, ...]`` flattened to ``D``); float32 out."""
    arr = np.asarray(x)
    arr = arr.reshape(arr.shape[0], -1)
    if arr.shape[1] != self.mean.shape[0]:
      raise ValueError(f"x must have {self.mean.shape[0]} features, got {arr.shape[1]}.")
    out = (arr.astype(np.float64) - self.mean) @ self.components.T
    return out.astype(np.float32)


def fit_pca(x_train: Any, d: int, *, center: bool = True) -> PCATransform:
  """Fits PCA to ``d`` dimensions on the training features only.

  Paper 000 Section 4.2 ("Accuracy as a function of number of dimensions"):
  the digit images are reduced to ``D`` dimensions by PCA. The axes are the top
  ``d`` eigenvectors of the training covariance
  ``S = (1/n) sum_i (x_i - mu)(x_i - mu)^T`` (float64), so test data never
  influences the transform.

  Args:
    x_train: ``[n, D]`` (or ``[n, ...]``, flattened) training features.
    d: output dimension, ``1 <= d <= D``.
    center: subtract the training mean first.
  """
  arr = _validation.check_finite_array(x_train, "x_train")
  arr = arr.reshape(arr.shape[0], -1).astype(np.float64)
  n, dim = arr.shape
  if n < 1:
    raise ValueError("x_train must have at least one row.")
  d = _validation.check_positive_int(d, "d")
  if d > dim:
    raise ValueError(f"d must be in [1, {dim}] (the number of features), got {d}.")
  mean = arr.mean(axis=0) if center else np.zeros(dim)
  xc = arr - mean
  if dim <= n:
    cov = (xc.T @ xc) / n
    evals, evecs = np.linalg.eigh(cov)
    order = np.argsort(evals)[::-1][:d]
    comps = evecs[:, order].T
    var = evals[order]
  else:
    _, s, vt = np.linalg.svd(xc, full_matrices=False)
    comps = vt[:d]
    var = (s[:d] ** 2) / n
    if comps.shape[0] < d:  # rank-deficient: pad with orthonormal completion
      q, _ = np.linalg.qr(np.concatenate([comps.T, np.eye(dim)], axis=1))
      comps = q[:, :d].T
      var = np.concatenate([var, np.zeros(d - var.shape[0])])
  signs = np.sign(comps[np.arange(d), np.argmax(np.abs(comps), axis=1)])
  signs[signs == 0] = 1.0
  comps = comps * signs[:, None]
  return PCATransform(mean=mean, components=comps, explained_variance=np.maximum(var, 0.0))


def keep_first_classes(x: Any, y: Any, c: int) -> tuple[np.ndarray, np.ndarray]:
  """Keeps the examples with label in ``{0, ..., c-1}`` (paper 000 Section 4.2, Figure 5b).

  Returns ``(x[mask], y[mask])`` with labels unchanged (still ``0 .. c-1``).
  """
  x = np.asarray(x)
  y = np.asarray(y)
  c = _validation.check_positive_int(c, "c")
  if x.shape[0] != y.shape[0]:
    raise ValueError("x and y must have the same number of rows, got "
                     f"{x.shape[0]} and {y.shape[0]}.")
  if y.size and c > int(y.max()) + 1:
    raise ValueError(f"c must be in [1, {int(y.max()) + 1}] (the number of classes), got {c}.")
  mask = y < c
  return x[mask], y[mask]


def _is_seed(key_or_seed: Any) -> bool:
  return isinstance(key_or_seed, numbers.Integral) and not isinstance(key_or_seed, bool)


def subsample_indices(key_or_seed: Any, num_examples: int, n: int) -> np.ndarray:
  """The first ``n`` entries of a seed-determined permutation of ``range(num_examples)``.

  As in paper 003 Section 7.1 ("randomly permuting the dataset and then taking
  the first ``n_1`` samples"), so the subsample of size ``n`` is a prefix of the
  one of size ``n' > n`` for the same key: experiments that vary ``N`` are nested.

  Args:
    key_or_seed: a ``jax.random`` key (uses ``jax.random.permutation``) or a
      non-negative int seed (uses ``numpy.random.default_rng(seed)``).
    num_examples: size of the population.
    n: subsample size, ``1 <= n <= num_examples``.
  """
  num_examples = _validation.check_positive_int(num_examples, "num_examples")
  n = _validation.check_positive_int(n, "n")
  if n > num_examples:
    raise ValueError(f"n must be in [1, {num_examples}] (the number of examples), got {n}.")
  if _is_seed(key_or_seed):
    if key_or_seed < 0:
      raise ValueError(f"seed must be >= 0, got {key_or_seed}.")
    perm = np.random.default_rng(int(key_or_seed)).permutation(num_examples)
  else:
    import jax  # local: the rest of this module is numpy only.
    perm = np.asarray(jax.random.permutation(key_or_seed, num_examples))
  return perm[:n].astype(np.int64)


def subsample(key_or_seed: Any, x: Any, y: Any, n: int) -> tuple[np.ndarray, np.ndarray]:
  """A seed-determined subsample of ``n`` examples without replacement.

  See :func:`subsample_indices` (nested in ``n`` for a fixed key or seed).
  """
  x = np.asarray(x)
  y = np.asarray(y)
  if x.shape[0] != y.shape[0]:
    raise ValueError("x and y must have the same number of rows, got "
                     f"{x.shape[0]} and {y.shape[0]}.")
  idx = subsample_indices(key_or_seed, x.shape[0], n)
  return x[idx], y[idx]


def one_hot(y: Any, num_classes: int | None = None, dtype: Any = np.float32) -> np.ndarray:
  """``[n] -> [n, C]`` indicator matrix, ``out[i, y_i] = 1``."""
  y = np.asarray(y)
  if y.dtype.kind not in "iu":
    raise ValueError(f"y must hold integer labels, got dtype {y.dtype}.")
  if num_classes is None:
    num_classes = int(y.max()) + 1 if y.size else 1
  num_classes = _validation.check_positive_int(num_classes, "num_classes")
  if y.size and (y.min() < 0 or y.max() >= num_classes):
    raise ValueError(f"labels in y must be in [0, {num_classes - 1}], got [{y.min()}, {y.max()}].")
  out = np.zeros(y.shape + (num_classes,), dtype=dtype)
  np.put_along_axis(out, y[..., None].astype(np.int64), 1, axis=-1)
  return out


def check_split_arguments(test_fraction: Any, seed: Any) -> float:
  """Checks the arguments of :func:`train_test_split_indices`; returns ``test_fraction`` as a float."""
  try:
    f = float(test_fraction)
  except (TypeError, ValueError):
    raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction!r}.") from None
  if not 0.0 < f < 1.0:
    raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}.")
  if not _is_seed(seed) or seed < 0:
    raise ValueError(f"split_seed must be an int >= 0, got {seed!r}.")
  return f


def train_test_split_indices(num_examples: int, test_fraction: float,
                             seed: int) -> tuple[np.ndarray, np.ndarray]:
  """Deterministic split: permute with ``default_rng(seed)``, the last ``round(f n)`` are test.

  Both index arrays are returned sorted (file order), so the split only decides
  membership; shuffling is left to :func:`subsample` and the training loop.
  """
  num_examples = _validation.check_positive_int(num_examples, "num_examples")
  f = check_split_arguments(test_fraction, seed)
  n_test = int(round(f * num_examples))
  n_test = min(max(n_test, 1), num_examples - 1)
  perm = np.random.default_rng(seed).permutation(num_examples)
  return np.sort(perm[: num_examples - n_test]), np.sort(perm[num_examples - n_test:])


@dataclasses.dataclass(frozen=True, eq=False)
class TabularEncoder:
  """One-hot + max-abs scaling + constant feature, fitted on training rows (paper 003 Sec. 7.1).

  Output columns keep the attribute order of the table: a numeric attribute
  gives one column ``name``; a categorical one gives one column
  ``name=value`` per training category (sorted). Each column ``j`` is divided
  by ``scale[j] = max_i |x_ij|`` over the training rows (1 where that is 0) and
  clipped to ``[-1, 1]`` (test rows can exceed the training range). With
  ``add_constant``, a last column ``constant`` of ones is appended.

  Attributes:
    names: attribute names, in table order.
    categorical: per attribute, whether it is categorical.
    categories: per attribute, the sorted training categories (empty tuple for numeric).
    scale: ``[d]`` divisors (before the constant column).
    add_constant: append the constant feature.
    clip: clip scaled values to ``[-1, 1]`` (True when fitted with scaling).
  """

  names: tuple[str, ...]
  categorical: tuple[bool, ...]
  categories: tuple[tuple[str, ...], ...]
  scale: np.ndarray
  add_constant: bool
  clip: bool = True

  @property
  def feature_names(self) -> tuple[str, ...]:
    out: list[str] = []
    for name, is_cat, cats in zip(self.names, self.categorical, self.categories):
      out.extend(f"{name}={c}" for c in cats) if is_cat else out.append(name)
    if self.add_constant:
      out.append("constant")
    return tuple(out)

  @property
  def num_features(self) -> int:
    return len(self.feature_names)

  def encode_unscaled(self, columns: Sequence[np.ndarray]) -> np.ndarray:
    """One-hot encodes ``columns`` (float64, before scaling and the constant)."""
    if len(columns) != len(self.names):
      raise ValueError(f"columns must have {len(self.names)} attributes, got {len(columns)}.")
    n = len(columns[0]) if columns else 0
    blocks = []
    for col, is_cat, cats, name in zip(columns, self.categorical, self.categories, self.names):
      if len(col) != n:
        raise ValueError(f"attribute {name!r} has {len(col)} rows, expected {n}.")
      if is_cat:
        cats_arr = np.asarray(cats, dtype=str)
        col = np.asarray(col, dtype=str)
        pos = np.searchsorted(cats_arr, col)
        pos_c = np.minimum(pos, max(len(cats_arr) - 1, 0))
        if len(cats_arr):
          known = (pos < len(cats_arr)) & (cats_arr[pos_c] == col)
        else:
          known = np.zeros(n, bool)
        block = np.zeros((n, len(cats_arr)))
        block[np.nonzero(known)[0], pos_c[known]] = 1.0
        blocks.append(block)
      else:
        blocks.append(np.asarray(col, dtype=np.float64).reshape(n, 1))
    return np.concatenate(blocks, axis=1) if blocks else np.zeros((n, 0))

  def transform(self, columns: Sequence[np.ndarray]) -> np.ndarray:
    """Encodes, scales, clips to ``[-1, 1]`` (if fitted with ``scale``), adds the constant.

    Returns float32 ``[n, d]``.
    """
    x = self.encode_unscaled(columns)
    if not np.all(np.isfinite(x)):
      raise ValueError("numeric attributes contain NaN or inf values.")
    x = x / self.scale
    if self.clip:
      x = np.clip(x, -1.0, 1.0)
    if self.add_constant:
      x = np.concatenate([x, np.ones((x.shape[0], 1))], axis=1)
    return x.astype(np.float32)


def fit_tabular_encoder(columns: Sequence[np.ndarray], names: Sequence[str],
                        categorical: Sequence[bool], *, scale: bool = True,
                        add_constant: bool = True) -> TabularEncoder:
  """Fits a :class:`TabularEncoder` on training columns only.

  Args:
    columns: one array per attribute (strings for categorical, numbers otherwise).
    names: attribute names.
    categorical: per attribute, whether to binarise it.
    scale: divide each column by its training max absolute value (paper 003 Sec. 7.1).
    add_constant: append a column of ones (paper 003 Sec. 7.1).
  """
  if not len(columns) == len(names) == len(categorical):
    raise ValueError("columns, names and categorical must have the same length.")
  cats = tuple(tuple(np.unique(np.asarray(c, dtype=str)).tolist()) if is_cat else ()
               for c, is_cat in zip(columns, categorical))
  enc = TabularEncoder(names=tuple(names), categorical=tuple(bool(c) for c in categorical),
                       categories=cats, scale=np.ones(1), add_constant=add_constant)
  raw = enc.encode_unscaled(columns)
  if scale:
    s = np.abs(raw).max(axis=0) if raw.shape[0] else np.ones(raw.shape[1])
    s = np.where(s > 0, s, 1.0)
  else:
    s = np.ones(raw.shape[1])
  return dataclasses.replace(enc, scale=s, clip=bool(scale))
