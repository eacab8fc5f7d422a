"""scikit-learn conventions shared by the jaxdp estimators (input checks, ``classes_``).

Every jaxdp estimator (``jaxdp.training.PrivateLogisticRegression``, the
classic models of :mod:`jaxdp.classic`) is a scikit-learn estimator: its
constructor stores its parameters unchanged, and ``fit`` checks them and its
data BEFORE any work or privacy spend. This module holds the data checks they
share, with errors that name the argument (``x``, ``y``) and say where the rule
is broken (a row index, never a value: an error message is a release too, see
:func:`jaxdp._validation.first_index`):

* :func:`check_x` -- a dense, real, finite 2-D array ``(n_samples, n_features)``.
  Complex input raises :class:`~jaxdp.errors.ArgumentTypeError` (a ``TypeError``
  and a ``ValueError``) containing scikit-learn's "Complex data not supported";
  a 1-D array, sparse matrices, strings raise too; NaN/inf raise ``ValueError``.
* :func:`check_n_features` -- sets ``n_features_in_`` in ``fit`` and checks it in
  ``predict``/``decision_function``/``predict_proba``/``score`` (scikit-learn's
  message: "X has 3 features, but Est is expecting 6 features as input").
* :func:`check_y` -- labels, 1-D of length ``n_samples`` (a column vector is
  raveled with scikit-learn's ``DataConversionWarning``), no NaN.
* :func:`encode_labels` -- maps arbitrary labels to ``0..K-1`` through the
  PUBLIC label set ``classes`` (released as ``classes_``); with ``classes=None``
  the set is read off the data, which is NOT private, and a warning says so.
* :func:`check_is_fitted` -- scikit-learn's ``NotFittedError`` (a ``ValueError``).
* :func:`clone_sharing_accountant`, :func:`refuse_state_with_accountant` and the
  mixin :class:`SharedAccountantMixin` -- ``sklearn.base.clone`` builds a new
  estimator from the parameters but keeps the caller's ``accountant`` (the
  ledger is shared, so the spends of every clone are recorded); pickling or
  deep-copying an estimator that holds an accountant is refused, since the
  copy's spends would land in a copy of the ledger and be lost.
"""

from __future__ import annotations

import copy
import warnings
from typing import Any

import numpy as np
from sklearn.base import clone
from sklearn.exceptions import DataConversionWarning, NotFittedError

from jaxdp import _keys, _validation
from jaxdp.errors import ArgumentTypeError


def _is_sparse(x: Any) -> bool:
  try:
    from scipy import sparse  # pylint: disable=import-outside-toplevel
  except ImportError:  # pragma: no cover - scipy is a dependency of scikit-learn
    return False
  return sparse.issparse(x)


def check_x(x: Any, name: str = "x", *, min_samples: int = 1) -> np.ndarray:
  """``x`` as a dense, real, finite 2-D numpy array ``(n_samples, n_features)``.

  The dtype is kept (as ``np.asarray`` gives it), so that the arrays a fit
  passes on are those it passed before these checks existed.

  Raises:
    ArgumentTypeError: sparse, non-numeric or complex ``x`` (the message names
      ``name``; for complex data it contains "Complex data not supported").
    ValueError: ``x`` not 2-D, with fewer than ``min_samples`` rows or no
      column, or with a NaN/inf entry (the first one's index is named).
  """
  if _is_sparse(x):
    raise ArgumentTypeError(f"{name} is a sparse matrix; sparse input is not supported, pass a "
                            f"dense array ({name}.toarray()).")
  if x is not None and not isinstance(x, (str, bytes)):
    arr = np.asarray(x)
    if arr.dtype == object:  # numbers held as objects (e.g. a mixed-type table): as float64
      try:
        x = arr.astype(np.float64)
      except TypeError as err:  # numpy's message names the entry's type only
        raise ArgumentTypeError(f"{name} must be a numeric array; an entry of its object array "
                                f"is not a number ({err}).") from err
      except ValueError:  # numpy's message would quote the entry: a private value
        raise ArgumentTypeError(f"{name} must be a numeric array; an entry of its object array "
                                "is a string that is not a number.") from None
  arr = _validation.check_numeric_array(x, name)
  if arr.dtype.kind == "c":
    raise ArgumentTypeError(f"{name}: Complex data not supported (got dtype {arr.dtype}); pass "
                            "the real features (e.g. real and imaginary parts as columns).")
  if arr.ndim != 2:
    raise ValueError(
        f"{name} must be a 2-D array (n_samples, n_features), got shape {arr.shape}. Reshape "
        f"your data: {name}.reshape(-1, 1) if it has one feature, {name}.reshape(1, -1) if it "
        "is one sample.")
  if arr.shape[0] < min_samples:
    raise ValueError(f"{name}: found array with {arr.shape[0]} sample(s) (shape={arr.shape}) "
                     f"while a minimum of {min_samples} is required.")
  if arr.shape[1] < 1:
    raise ValueError(f"{name}: found array with 0 feature(s) (shape={arr.shape}) while a "
                     "minimum of 1 is required.")
  if arr.dtype.kind == "b":
    arr = arr.astype(np.float32)
  return _validation.check_finite_array(arr, name)


def check_n_features(estimator: Any, x: np.ndarray, *, reset: bool, name: str = "x") -> None:
  """Sets ``estimator.n_features_in_`` (``reset=True``, in ``fit``) or checks ``x`` against it.

  ``n_features_in_`` is the number of columns: public (a shape, not a value).
  """
  n = int(x.shape[1])
  if reset:
    estimator.n_features_in_ = n
    return
  expected = int(estimator.n_features_in_)
  if n != expected:
    raise ValueError(
        f"X has {n} features, but {type(estimator).__name__} is expecting {expected} features "
        f"as input (argument {name}: got shape {x.shape}, fitted with n_features_in_="
        f"{expected}).")


def check_y(y: Any, n_samples: int, name: str = "y") -> np.ndarray:
  """Labels as a 1-D numpy array of length ``n_samples``.

  A column vector ``(n, 1)`` is raveled with scikit-learn's
  ``DataConversionWarning``; float labels must be finite; complex labels raise
  (:class:`~jaxdp.errors.ArgumentTypeError`).
  """
  if y is None:
    raise ValueError(f"this estimator requires y to be passed, but the target y is None "
                     f"(argument {name}: fit(x, y) needs the labels).")
  if _is_sparse(y):
    raise ArgumentTypeError(f"{name} is a sparse matrix; pass a dense 1-D array of labels.")
  arr = np.asarray(y)
  if arr.ndim == 2 and arr.shape[1] == 1:
    warnings.warn("A column-vector y was passed when a 1d array was expected. Please change the "
                  f"shape of {name} to (n_samples,), for example using ravel().",
                  DataConversionWarning, stacklevel=3)
    arr = arr.ravel()
  if arr.ndim != 1 or arr.shape[0] != n_samples:
    raise ValueError(f"{name} must have shape ({n_samples},) (one label per row of x), got "
                     f"{arr.shape}.")
  if arr.dtype.kind == "c":
    raise ArgumentTypeError(f"{name}: Complex data not supported (got dtype {arr.dtype}).")
  if arr.dtype.kind == "f" and not np.all(np.isfinite(arr)):
    raise ValueError(f"{name} contains NaN or inf labels (the first at row "
                     f"{_validation.first_index(~np.isfinite(arr))}).")
  if arr.dtype.kind == "O" and any(v is None or v != v for v in arr):  # None or NaN labels
    bad = np.array([v is None or v != v for v in arr])
    raise ValueError(f"{name} contains missing labels (None/NaN; the first at row "
                     f"{_validation.first_index(bad)}).")
  return arr


def check_classes(classes: Any, name: str = "classes") -> np.ndarray | None:
  """``None`` or the public label set as a sorted 1-D array of >= 2 distinct labels."""
  if classes is None:
    return None
  if isinstance(classes, (str, bytes)):
    raise ArgumentTypeError(f"{name} must be a sequence of labels (e.g. range(10)), got the "
                            f"string {classes!r}.")
  arr = np.asarray(classes)
  if arr.ndim != 1 or arr.size < 2 or np.unique(arr).size != arr.size:
    raise ValueError(f"{name} must be a 1-D sequence of at least two distinct labels, got shape "
                     f"{arr.shape} with {np.unique(arr).size} distinct.")
  return np.sort(arr)


def encode_labels(y: np.ndarray, classes: np.ndarray | None, name: str = "y",
                  classes_name: str = "classes", stacklevel: int = 3
                  ) -> tuple[np.ndarray, np.ndarray]:
  """``(classes_, y_idx)``: the label set and ``y`` as indices ``0..K-1`` into it.

  Args:
    y: labels (any comparable values: ints, strings...), from :func:`check_y`.
    classes: the PUBLIC label set from :func:`check_classes`, fixed before
      seeing the data, or ``None``: then it is ``np.unique(y)`` -- read off the
      private data, so NOT differentially private (replacing one example can
      remove a class, changing the released shape and ``classes_``); a
      ``UserWarning`` says so.

  Raises:
    ValueError: a label outside ``classes`` (the first row is named, not the
      label), or fewer than two classes.
  """
  if classes is None:
    if y.dtype.kind == "f" and np.any(y != np.round(y)):
      raise ValueError(
          f"Unknown label type: continuous. {name} holds non-integer float labels (the first at "
          f"row {_validation.first_index(y != np.round(y))}): a classifier needs class labels; "
          f"pass {classes_name}=<public label set> if these floats are the labels.")
    warnings.warn(
        f"{classes_name} was not given: the label set is inferred from the training labels and "
        "is NOT differentially private (it fixes the output shape and is released as classes_). "
        f"Pass {classes_name}=<public label set>.", UserWarning, stacklevel=stacklevel)
    try:
      classes, y_idx = np.unique(y, return_inverse=True)
    except TypeError as err:
      raise ArgumentTypeError(f"{name} mixes label types that cannot be sorted ({err}).") from err
    if classes.size < 2:
      raise ValueError(f"{name} must contain at least two classes; it has 1 class (pass the "
                       f"public label set as {classes_name}=...).")
    return classes, y_idx.reshape(-1)
  try:
    y_idx = np.clip(np.searchsorted(classes, y), 0, classes.size - 1)
    outside = classes[y_idx] != y
  except TypeError as err:
    raise ArgumentTypeError(f"the labels of {name} cannot be compared with {classes_name} "
                            f"({err}).") from err
  if np.any(outside):
    raise ValueError(f"{name} contains labels outside {classes_name} (the public label set); "
                     f"row {_validation.first_index(outside)} is one.")
  return classes, y_idx


def check_is_fitted(estimator: Any, attribute: str = "coef_") -> None:
  """Raises scikit-learn's ``NotFittedError`` (a ``ValueError``) before ``fit``."""
  if not hasattr(estimator, attribute):
    raise NotFittedError(f"this {type(estimator).__name__} instance is not fitted yet; call "
                         "fit(x, y) first.")


def clone_sharing_accountant(estimator: Any) -> Any:
  """``sklearn.base.clone`` of ``estimator`` whose ``accountant`` is the SAME object.

  Every other parameter is cloned as scikit-learn does (``clone(value,
  safe=False)``); the metadata-routing requests are copied as in
  ``sklearn.base.clone``. The new instance is unfitted (its fit counter, hence
  its noise key rule of :mod:`jaxdp._keys`, starts afresh).
  """
  params = {name: value if name == "accountant" else clone(value, safe=False)
            for name, value in estimator.get_params(deep=False).items()}
  new = type(estimator)(**params)
  if hasattr(estimator, "_metadata_request"):
    new._metadata_request = copy.deepcopy(estimator._metadata_request)  # pylint: disable=protected-access
  return new


def refuse_state_with_accountant(estimator: Any) -> None:
  """Raises ``TypeError`` when ``estimator`` holds an accountant (pickle / deepcopy refused)."""
  if getattr(estimator, "accountant", None) is not None:
    raise TypeError(
        f"this {type(estimator).__name__} holds an accountant: a pickled or deep-copied "
        "estimator (e.g. sent to a worker by n_jobs > 1) would record its spends in a copy of "
        "the ledger, and they would be lost. Use n_jobs=1, or set_params(accountant=None) first "
        "(e.g. to save a fitted model).")


class SharedAccountantMixin:
  """Mixin (listed before ``BaseEstimator``): clones share the accountant, copies are refused.

  The conventions of every jaxdp estimator: the constructor stores its
  parameters unchanged (``get_params``/``set_params``, ``sklearn.base.clone``,
  ``Pipeline``); ``fit`` checks them first, before any key draw or spend. A
  clone shares the caller's ``accountant`` (its spends are recorded there); an
  estimator holding an accountant refuses to be pickled or deep-copied. Noise
  keys follow the library rule of :mod:`jaxdp._keys`: ``seed=None`` (the
  default) draws fresh OS entropy at every ``fit``; an explicit ``seed`` is the
  user's promise not to reuse it on overlapping data. Also tags the estimator
  ``non_deterministic`` (fresh noise at every fit).
  """

  def __sklearn_clone__(self):
    _keys.refuse_worker_processes(self)  # n_jobs > 1 with processes: say why, before joblib does
    return clone_sharing_accountant(self)

  def __getstate__(self):
    refuse_state_with_accountant(self)
    return super().__getstate__()

  def __sklearn_tags__(self):
    tags = super().__sklearn_tags__()
    tags.non_deterministic = True
    return tags
