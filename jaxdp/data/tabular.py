"""The path shared by the file loaders (MNIST, Adult, Bank Marketing, KDD Cup 99, UCI HAR).

Every loader checks its options, finds and verifies its files, reads them and
ends in a :class:`Dataset`; only the reading is specific to a dataset. So a
loader declares its file names, attribute names and types, label mapping and
public options, and leaves the rest to this module:

1. :func:`check_options`: ``split``, ``unit_ball`` and (where a split will be
   drawn) ``test_fraction`` / ``split_seed`` are checked before any file is read;
2. :func:`locate`: the files are looked for in ``data_dir``, ``$JAXDP_DATA_DIR``,
   then TFDS, their SHA-256 checked, and the provenance for ``Dataset.info``
   recorded; the not-found error lists every place looked;
3. text records become a :class:`RawTable` (:func:`split_fields`,
   :func:`binary_labels`, :meth:`RawTable.from_fields`): rows of all files, or
   the distinct rows when there are many duplicates, as in KDD;
4. :func:`build_tabular_dataset` (Adult, Bank, KDD) chooses the train/test rows
   and applies paper 003 Section 7.1's preprocessing, fitted on the training
   records only; :func:`dense_dataset` (MNIST, HAR) puts already numeric
   features in the unit ball with ``R`` fitted on the training set.

The tabular preprocessing of step 4:

1. binarise categorical attributes (categories seen in training);
2. scale each column to maximum absolute value 1, clip test values to [-1, 1];
3. append the constant feature 1;
4. put every record in the unit L2 ball (``unit_ball``, see
   :func:`jaxdp.data.normalize_rows`).

Note on its last step with the constant feature: every encoded record has the
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
import os
import pathlib
from typing import Any, Mapping, Sequence

import numpy as np

from jaxdp.data import preprocessing, resolve, tfds_source
from jaxdp.data.base import Dataset

SPLITS = ("official", "random")
OFFICIAL_ONLY = ("official",)


def check_options(name: str, split: str, unit_ball: Any, *, splits: Sequence[str] = SPLITS,
                  has_test_set: bool = True, test_fraction: float = 0.2,
                  split_seed: int = 0) -> str | None:
  """Checks a loader's ``split`` and ``unit_ball`` before any file is read.

  Args:
    name: dataset name (for the message when ``splits`` is ``("official",)``).
    split: must be one of ``splits``.
    unit_ball: see :func:`resolve_unit_ball`.
    splits: the splits the dataset has.
    has_test_set: whether the dataset has its own test file; if not, or if
      ``split="random"``, ``test_fraction`` and ``split_seed`` will be used
      (:func:`choose_split`) and are checked too.
    test_fraction, split_seed: see :func:`jaxdp.data.train_test_split_indices`.

  Returns:
    The unit-ball mode: ``"project"``, ``"scale"`` or ``None``.
  """
  if split not in splits:
    if tuple(splits) == OFFICIAL_ONLY:
      raise ValueError(f"split must be 'official' for {name}, got {split!r}.")
    raise ValueError(f"split must be one of {tuple(splits)}, got {split!r}.")
  mode = resolve_unit_ball(unit_ball)
  if split == "random" or not has_test_set:
    preprocessing.check_split_arguments(test_fraction, split_seed)
  return mode


@dataclasses.dataclass(frozen=True, eq=False)
class Located:
  """Where a dataset was found: local files, or TFDS splits.

  Attributes:
    local: the files found on disk (``local.paths[key]``), or None.
    tfds: ``{"train": (columns, features), "test": ...}`` from TFDS when no
      folder had the files (see :func:`jaxdp.data.tfds_source.load_split`), else None.
    info: provenance for ``Dataset.info``: ``source`` (the folder or the TFDS
      note) and, for local files, ``files`` (key -> path).
  """

  local: resolve.LocalFiles | None
  tfds: dict[str, tuple[dict[str, np.ndarray], Any]] | None
  info: dict[str, Any]

  @property
  def paths(self) -> dict[str, pathlib.Path]:
    if self.local is None:
      raise ValueError("the dataset was read from TFDS, not from local files.")
    return self.local.paths


def locate(name: str, files: Sequence[resolve.FileSpec], data_dir: str | os.PathLike | None,
           *, verify: bool, use_tfds: bool, tfds_data_dir: str | None, download: bool,
           optional: Sequence[resolve.FileSpec] = ()) -> Located:
  """Finds dataset ``name``: a local folder first (:func:`jaxdp.data.resolve.find_local`), then TFDS.

  Args:
    name: dataset name (also the TFDS key, see :mod:`jaxdp.data.tfds_source`).
    files: the required files.
    data_dir: explicit folder, searched before ``$JAXDP_DATA_DIR``.
    verify: check every local file found against its embedded SHA-256.
    use_tfds, tfds_data_dir, download: the TFDS fallback; for a dataset TFDS
      does not have they only shape the not-found message.
    optional: files picked up from the same folder when present.

  Raises:
    ChecksumError: a local file has the wrong SHA-256.
    DatasetNotFoundError: no folder has every file and TFDS cannot provide it.
  """
  local, looked = resolve.find_local(files, data_dir, verify=verify, optional=optional)
  if local is not None:
    return Located(local=local, tfds=None, info=dict(
        source=local.source, files={k: str(v) for k, v in local.paths.items()}))
  splits, note = tfds_source.try_load(name, use_tfds=use_tfds, tfds_data_dir=tfds_data_dir,
                                      download=download)
  if splits is None:
    raise resolve.not_found_error(name, files, looked, note)
  return Located(local=None, tfds=splits, info=dict(source=note))


def split_fields(rows: Sequence[Sequence[str]], num_fields: int,
                 path: str | os.PathLike) -> np.ndarray:
  """Text records as an ``[n, num_fields]`` str array; names the first malformed record."""
  bad = [i for i, r in enumerate(rows) if len(r) != num_fields]
  if bad:
    raise ValueError(f"{path}: record {bad[0]} has {len(rows[bad[0]])} fields, "
                     f"expected {num_fields}.")
  return np.array(rows, dtype=str)


def binary_labels(target: np.ndarray, class_names: Sequence[str],
                  path: str | os.PathLike) -> np.ndarray:
  """``target == class_names[1]`` as int32, once every value is checked to be a class name."""
  unknown = set(np.unique(target).tolist()) - set(class_names)
  if unknown:
    raise ValueError(f"{path}: unexpected labels {sorted(unknown)}.")
  return (target == class_names[1]).astype(np.int32)


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

  @classmethod
  def from_fields(cls, fields: np.ndarray, names: Sequence[str], categorical: Sequence[bool],
                  labels: np.ndarray) -> "RawTable":
    """A table from ``[n, len(names)]`` str fields: numeric attributes parsed as float64."""
    columns = tuple(fields[:, j] if cat else fields[:, j].astype(np.float64)
                    for j, cat in enumerate(categorical))
    return cls(columns=columns, names=tuple(names), categorical=tuple(categorical),
               labels=labels)


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
    test_idx: np.ndarray | None,
    class_names: Sequence[str],
    *,
    split: str,
    test_fraction: float,
    split_seed: int,
    scale: bool,
    add_constant: bool,
    unit_ball: Any,
    info: Mapping[str, Any],
) -> Dataset:
  """Splits ``table`` and encodes it (fitted on the training rows) into a binary :class:`Dataset`.

  Args:
    name: dataset name.
    table: parsed attributes of every row that any index refers to.
    train_idx, test_idx: table rows of the dataset's own train / test records
      (may repeat); ``test_idx=None`` where it has no test file.
    class_names: names of labels 0 and 1.
    split, test_fraction, split_seed: which records are train and test, see
      :func:`choose_split`.
    scale: divide each column by its training max absolute value and clip
      test values to ``[-1, 1]`` (paper 003 Sec. 7.1 "maximum attribute value
      becomes 1").
    add_constant: append the constant feature 1 (paper 003 Sec. 7.1).
    unit_ball: ``True``/``"project"``, ``"scale"`` or ``False`` (see above).
    info: provenance merged into ``Dataset.info``.
  """
  mode = resolve_unit_ball(unit_ball)
  train_idx, test_idx = choose_split(train_idx, test_idx, split, test_fraction, split_seed)
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


def dense_dataset(name: str, train: tuple[np.ndarray, np.ndarray],
                  test: tuple[np.ndarray, np.ndarray], class_names: Sequence[str],
                  feature_names: Sequence[str], *, mode: str | None,
                  info: Mapping[str, Any]) -> Dataset:
  """A :class:`Dataset` from numeric features, put in the unit ball if ``mode`` says so.

  Args:
    name: dataset name.
    train, test: ``(float32 features, integer labels in 0 .. C-1)``.
    class_names: the ``C`` class names.
    feature_names: one name per feature.
    mode: ``"project"``, ``"scale"`` (``R`` fitted on the training features,
      :func:`jaxdp.data.normalize_train_test`) or None (features unchanged).
    info: ``Dataset.info``.
  """
  (x_train, y_train), (x_test, y_test) = train, test
  if mode is not None:
    x_train, x_test = preprocessing.normalize_train_test(x_train, x_test, mode)
  return Dataset(
      x_train=x_train, y_train=y_train.astype(np.int32), x_test=x_test,
      y_test=y_test.astype(np.int32), num_classes=len(class_names),
      class_names=tuple(class_names), feature_names=tuple(feature_names), name=name,
      info=dict(info))
