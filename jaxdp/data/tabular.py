"""Shared machinery of the tabular loaders (Adult, KDD Cup 99, Bank Marketing).

A loader parses its files into one :class:`RawTable` (rows of all files, or the
distinct rows when there are many duplicates, as in KDD) plus the row indices
of the train and test records. :func:`build_tabular_dataset` then applies
paper 003 Section 7.1's preprocessing with everything fitted on the training
records only:

1. binarise categorical attributes (categories seen in training);
2. scale each column to maximum absolute value 1, clip test values to [-1, 1];
3. append the constant feature 1;
4. put every record in the unit L2 ball (``unit_ball``, see
   :func:`jaxdp.data.normalize_rows`).

Note on step 4 with the constant feature: every encoded record has the
constant 1, so ``||x_i|| >= 1`` and ``unit_ball="project"`` (the paper's
per-record normalisation, the default) maps every record onto the unit sphere;
the constant column then holds ``1 / ||x_i||`` (positive, no longer equal
across rows). ``unit_ball="scale"`` divides all records by the one training
maximum norm instead, so the constant column stays constant (``1 / R``).

Because the encoding, the column maxima and the per-row normalisation do not
depend on how often a row repeats, encoding the distinct rows and gathering
gives exactly the same arrays as encoding every record.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import numpy as np

from jaxdp.data import preprocessing
from jaxdp.data.base import Dataset

SPLITS = ("official", "random")


@dataclasses.dataclass(frozen=True, eq=False)
class RawTable:
  """Parsed attributes: ``columns[j]`` holds attribute ``names[j]`` for every row."""

  columns: tuple[np.ndarray, ...]
  names: tuple[str, ...]
  categorical: tuple[bool, ...]
  labels: np.ndarray

  @property
  def num_rows(self) -> int:
    return int(self.labels.shape[0])


def resolve_unit_ball(unit_ball: Any) -> str | None:
  """``True -> "project"``, ``False/None -> None``, ``"project"/"scale"`` unchanged."""
  if unit_ball is True:
    return "project"
  if unit_ball is False or unit_ball is None:
    return None
  if unit_ball in preprocessing.UNIT_BALL_MODES:
    return unit_ball
  raise ValueError(f"unit_ball must be True, False, 'project' or 'scale', got {unit_ball!r}.")


def apply_unit_ball(x: np.ndarray, train_rows: np.ndarray, mode: str | None) -> np.ndarray:
  """Normalises the rows of ``x``; in ``"scale"`` mode ``R`` is the max norm over ``train_rows``."""
  if mode is None:
    return x
  if mode == "project":
    return preprocessing.normalize_rows(x, "project")
  flat = x[train_rows].reshape(len(train_rows), -1).astype(np.float64)
  r = float(np.sqrt((flat * flat).sum(axis=1)).max()) if len(train_rows) else 0.0
  if r <= 0:
    return preprocessing.normalize_rows(x, "project")
  return preprocessing.normalize_rows(x, "scale", reference_norm=r)


def choose_split(train_idx: np.ndarray, test_idx: np.ndarray | None, split: str,
                 test_fraction: float, split_seed: int) -> tuple[np.ndarray, np.ndarray]:
  """Train/test record indices.

  ``split="official"``: the dataset's own test file; where there is none
  (``test_idx is None``) a deterministic split of the records (the last
  ``round(test_fraction * n)`` of a ``default_rng(split_seed)`` permutation).
  ``split="random"``: all records pooled, then that deterministic split.
  """
  if split not in SPLITS:
    raise ValueError(f"split must be one of {SPLITS}, got {split!r}.")
  if split == "official" and test_idx is not None:
    return train_idx, test_idx
  pool = train_idx if test_idx is None else np.concatenate([train_idx, test_idx])
  tr, te = preprocessing.train_test_split_indices(len(pool), test_fraction, split_seed)
  return pool[tr], pool[te]


def build_tabular_dataset(
    name: str,
    table: RawTable,
    train_idx: np.ndarray,
    test_idx: np.ndarray,
    class_names: Sequence[str],
    *,
    scale: bool,
    add_constant: bool,
    unit_ball: Any,
    info: Mapping[str, Any],
) -> Dataset:
  """Encodes ``table`` (fitted on ``train_idx`` rows) into a binary :class:`Dataset`.

  Args:
    name: dataset name.
    table: parsed attributes of every row that any index refers to.
    train_idx, test_idx: table rows of the train / test records (may repeat).
    class_names: names of labels 0 and 1.
    scale: divide each column by its training max absolute value and clip
      test values to ``[-1, 1]`` (paper 003 Sec. 7.1 "maximum attribute value
      becomes 1").
    add_constant: append the constant feature 1 (paper 003 Sec. 7.1).
    unit_ball: ``True``/``"project"``, ``"scale"`` or ``False`` (see above).
    info: provenance merged into ``Dataset.info``.
  """
  mode = resolve_unit_ball(unit_ball)
  train_rows = np.unique(train_idx)
  encoder = preprocessing.fit_tabular_encoder(
      [c[train_rows] for c in table.columns], table.names, table.categorical,
      scale=scale, add_constant=add_constant)
  x_rows = encoder.transform(table.columns)
  x_rows = apply_unit_ball(x_rows, train_rows, mode)
  labels = table.labels.astype(np.int32)
  full_info = dict(info)
  full_info.update(
      preprocessing=("paper 003 Sec. 7.1: one-hot categoricals (train categories), "
                     f"max-abs scaling={scale} (train fit, test clipped), "
                     f"constant feature={add_constant}, unit_ball={mode}"),
      num_features_before_constant=encoder.num_features - int(add_constant),
      encoder=encoder,
  )
  return Dataset(
      x_train=x_rows[train_idx], y_train=labels[train_idx],
      x_test=x_rows[test_idx], y_test=labels[test_idx],
      num_classes=len(class_names), class_names=tuple(class_names),
      feature_names=encoder.feature_names, name=name, info=full_info)
