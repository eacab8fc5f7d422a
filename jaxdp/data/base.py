"""The `Dataset` container returned by every jaxdp loader, and the data errors.

A `Dataset` holds host (numpy) arrays: float32 features of shape
``[n, d]`` (or ``[n, 28, 28]`` for unflattened images) and int32 labels in
``{0, ..., C - 1}``. The binary tabular sets of
``../shared/papers/003_dp_confidence_intervals_for_erm.md`` (Section 7.1) map
their target to ``{-1, +1}``; :func:`signed_labels` gives that view.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import numpy as np


class DatasetNotFoundError(FileNotFoundError):
  """A dataset file is missing from every place the loader looked."""


class DataUnavailableError(FileNotFoundError):
  """A dataset is known but part of it cannot be had offline (e.g. UCI HAR's X)."""


class ChecksumError(ValueError):
  """A dataset file's SHA-256 differs from the published one (corrupt or wrong file)."""


@dataclasses.dataclass(frozen=True, eq=False)
class Dataset:
  """A train/test classification dataset with its metadata.

  Attributes:
    x_train: float32 features, ``[n_train, ...]``.
    y_train: int32 labels in ``{0, ..., num_classes - 1}``, ``[n_train]``.
    x_test: float32 features, ``[n_test, ...]``.
    y_test: int32 labels, ``[n_test]``.
    num_classes: number of classes ``C``.
    class_names: ``C`` names; ``class_names[k]`` is the name of label ``k``.
    feature_names: one name per feature column (after encoding), or ``()``
      where features have no names (image pixels are named ``pixel_i``).
    name: the dataset's registry name (``"mnist"``, ``"adult"``, ...).
    info: free-form provenance: files read and where from, rows dropped,
      preprocessing applied.
  """

  x_train: np.ndarray
  y_train: np.ndarray
  x_test: np.ndarray
  y_test: np.ndarray
  num_classes: int
  class_names: tuple[str, ...]
  feature_names: tuple[str, ...]
  name: str
  info: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    for field in ("x_train", "x_test"):
      arr = getattr(self, field)
      if not isinstance(arr, np.ndarray) or arr.dtype != np.float32:
        raise ValueError(f"Dataset.{field} must be a float32 numpy array, got "
                         f"{type(arr).__name__} {getattr(arr, 'dtype', None)}.")
    for field in ("y_train", "y_test"):
      arr = getattr(self, field)
      if not isinstance(arr, np.ndarray) or arr.dtype != np.int32 or arr.ndim != 1:
        raise ValueError(f"Dataset.{field} must be a 1-D int32 numpy array.")
      if arr.size and (arr.min() < 0 or arr.max() >= self.num_classes):
        raise ValueError(f"Dataset.{field} must lie in [0, {self.num_classes - 1}], got "
                         f"[{arr.min()}, {arr.max()}].")
    if self.x_train.shape[0] != self.y_train.shape[0]:
      raise ValueError("x_train and y_train must have the same number of rows.")
    if self.x_test.shape[0] != self.y_test.shape[0]:
      raise ValueError("x_test and y_test must have the same number of rows.")
    if len(self.class_names) != self.num_classes:
      raise ValueError("class_names must have num_classes entries.")

  @property
  def num_features(self) -> int:
    """Number of features per example (product of the trailing dimensions)."""
    return int(np.prod(self.x_train.shape[1:]))

  @property
  def num_train(self) -> int:
    return int(self.x_train.shape[0])

  @property
  def num_test(self) -> int:
    return int(self.x_test.shape[0])

  def replace(self, **changes: Any) -> "Dataset":
    """Returns a copy with the given fields replaced (checked again)."""
    return dataclasses.replace(self, **changes)

  def signed_labels(self) -> tuple[np.ndarray, np.ndarray]:
    """``(y_train, y_test)`` mapped ``0 -> -1, 1 -> +1`` (binary datasets only).

    Paper 003 (Section 7.1) maps the target column to ``{-1, 1}`` for logistic
    regression and Huber SVM, whose losses are written in ``z = y theta . x``.
    """
    return signed_labels(self.y_train), signed_labels(self.y_test)

  def __repr__(self) -> str:
    return (f"Dataset(name={self.name!r}, x_train={self.x_train.shape}, "
            f"x_test={self.x_test.shape}, num_classes={self.num_classes})")


def signed_labels(y: Any) -> np.ndarray:
  """Maps binary labels ``{0, 1}`` to ``{-1, +1}`` (int32): ``y -> 2 y - 1``.

  Raises:
    ValueError: if ``y`` holds a value other than 0 or 1.
  """
  arr = np.asarray(y)
  if arr.size and not np.all((arr == 0) | (arr == 1)):
    raise ValueError("y must hold binary labels in {0, 1} to map them to {-1, +1}.")
  return (2 * arr.astype(np.int32) - 1).astype(np.int32)
