"""UCI HAR (Human Activity Recognition Using Smartphones): 6 activities, 561 features.

Used by ``../shared/papers/001_learning_privately_from_multiparty_data.md``
Section 6 (PCA to d = 50, ~7K train / ~3K test).

The offline copy (``uci-har/`` in ``shared/data``, see its README) is
**partial**: it has ``features.txt``, ``activity_labels.txt``, ``y_train.txt``
(7,352), ``y_test.txt`` (2,947) and the subject files, but **not**
``X_train.txt`` (7352 x 561) or ``X_test.txt`` (2947 x 561). This loader checks
the files that are there (SHA-256), then looks for the two feature matrices in
the same folder (flattened layout or the original ``train/`` / ``test/``
subfolders). If they are missing it raises :class:`DataUnavailableError`
saying so; if a user adds the original files, they are loaded (their shapes
are checked; no checksum is known for them).
"""

from __future__ import annotations

import os
import pathlib

import numpy as np

from jaxdp.data import resolve, tabular
from jaxdp.data.base import DataUnavailableError, Dataset

NAME = "har"
NUM_FEATURES = 561
NUM_TRAIN = 7352
NUM_TEST = 2947
_ZIP = "UCI HAR Dataset"
FILES = (
    resolve.FileSpec("features", "uci-har/features.txt", (f"{_ZIP}/features.txt",)),
    resolve.FileSpec("activity_labels", "uci-har/activity_labels.txt",
                     (f"{_ZIP}/activity_labels.txt",)),
    resolve.FileSpec("y_train", "uci-har/y_train.txt",
                     ("uci-har/train/y_train.txt", f"{_ZIP}/train/y_train.txt",
                      "train/y_train.txt")),
    resolve.FileSpec("y_test", "uci-har/y_test.txt",
                     ("uci-har/test/y_test.txt", f"{_ZIP}/test/y_test.txt", "test/y_test.txt")),
    resolve.FileSpec("subject_train", "uci-har/subject_train.txt",
                     ("uci-har/train/subject_train.txt", f"{_ZIP}/train/subject_train.txt",
                      "train/subject_train.txt")),
    resolve.FileSpec("subject_test", "uci-har/subject_test.txt",
                     ("uci-har/test/subject_test.txt", f"{_ZIP}/test/subject_test.txt",
                      "test/subject_test.txt")),
)
FEATURE_FILES = (
    resolve.FileSpec("x_train", "uci-har/X_train.txt",
                     ("uci-har/train/X_train.txt", f"{_ZIP}/train/X_train.txt",
                      "train/X_train.txt")),
    resolve.FileSpec("x_test", "uci-har/X_test.txt",
                     ("uci-har/test/X_test.txt", f"{_ZIP}/test/X_test.txt", "test/X_test.txt")),
)


def _read_numbers(path: pathlib.Path, dtype) -> np.ndarray:
  try:
    return np.fromstring(path.read_text(encoding="ascii"), dtype=dtype, sep=" ")
  except ValueError as err:
    raise ValueError(f"{path}: could not parse numbers ({err}).") from err


def _read_matrix(path: pathlib.Path, rows: int) -> np.ndarray:
  values = _read_numbers(path, np.float64)
  if values.size != rows * NUM_FEATURES:
    raise ValueError(f"{path}: expected {rows} x {NUM_FEATURES} values, got {values.size}.")
  x = values.reshape(rows, NUM_FEATURES)
  if not np.all(np.isfinite(x)):
    raise ValueError(f"{path}: contains NaN or inf.")
  return x.astype(np.float32)


def load_har(
    data_dir: str | os.PathLike | None = None,
    split: str = "official",
    *,
    unit_ball: bool | str = False,
    verify: bool = True,
    use_tfds: bool = True,
    tfds_data_dir: str | None = None,
    download: bool = False,
) -> Dataset:
  """Loads UCI HAR if its feature matrices are available.

  Args:
    data_dir: folder with ``uci-har/`` (else ``$JAXDP_DATA_DIR``; TFDS has no HAR).
    split: only ``"official"`` (the dataset's subject-disjoint train/test split).
    unit_ball: False, True/``"project"`` or ``"scale"`` (see
      :func:`jaxdp.data.normalize_rows`); the raw features lie in ``[-1, 1]``.
    verify: check SHA-256 checksums of the label, subject and name files.

  Returns:
    A 6-class :class:`Dataset` (label ``k`` = activity ``k + 1`` of
    ``activity_labels.txt``); ``info["subjects_train"]`` / ``["subjects_test"]``
    hold the subject id of every example.

  Raises:
    DataUnavailableError: the label files are there but ``X_train.txt`` /
      ``X_test.txt`` are not (the case for ``shared/data``).
    DatasetNotFoundError: no place has the HAR label files.
  """
  mode = tabular.check_options(NAME, split, unit_ball, splits=tabular.OFFICIAL_ONLY)
  found = tabular.locate(NAME, FILES, data_dir, verify=verify, use_tfds=use_tfds,
                         tfds_data_dir=tfds_data_dir, download=download, optional=FEATURE_FILES)
  local = found.local
  p = local.paths
  missing = [s for s in FEATURE_FILES if s.key not in p]
  if missing:
    tried = "; ".join(" or ".join(str(local.root / c) for c in s.candidates()) for s in missing)
    raise DataUnavailableError(
        f"jaxdp.data: UCI HAR is unavailable offline: the feature matrices "
        f"X_train.txt ({NUM_TRAIN} x {NUM_FEATURES}) and X_test.txt ({NUM_TEST} x "
        f"{NUM_FEATURES}) are not in {local.source} (missing "
        f"{', '.join(s.relpath for s in missing)}; tried {tried}). The folder holds only "
        "labels, subjects and feature names (checked"
        f"{' against their SHA-256' if verify else ''}); see shared/data/README.md. "
        "Add the original files from UCI dataset 240 to load HAR.")
  y_train = _read_numbers(p["y_train"], np.int64)
  y_test = _read_numbers(p["y_test"], np.int64)
  s_train = _read_numbers(p["subject_train"], np.int64)
  s_test = _read_numbers(p["subject_test"], np.int64)
  if (len(y_train), len(s_train)) != (NUM_TRAIN, NUM_TRAIN) or (
      (len(y_test), len(s_test)) != (NUM_TEST, NUM_TEST)):
    raise ValueError(f"UCI HAR label/subject files must have {NUM_TRAIN} and {NUM_TEST} rows.")
  activities = [line.split(maxsplit=1) for line in
                p["activity_labels"].read_text(encoding="ascii").splitlines() if line.strip()]
  class_names = tuple(name for _, name in sorted((int(i), n) for i, n in activities))
  features = [line.split(maxsplit=1)[1] for line in
              p["features"].read_text(encoding="ascii").splitlines() if line.strip()]
  if len(features) != NUM_FEATURES or len(class_names) != 6:
    raise ValueError("UCI HAR features.txt must list 561 features and "
                     "activity_labels.txt 6 classes.")
  return tabular.dense_dataset(
      NAME, (_read_matrix(p["x_train"], NUM_TRAIN), y_train - 1),
      (_read_matrix(p["x_test"], NUM_TEST), y_test - 1), class_names, features, mode=mode,
      info=dict(found.info, subjects_train=s_train.astype(np.int32),
                subjects_test=s_test.astype(np.int32), unit_ball=mode))
