"""scikit-learn's embedded 8x8 digits (UCI optdigits test set): the offline default.

``sklearn.datasets.load_digits`` ships 1,797 images of 8 x 8 pixels with
integer intensities 0..16 and 10 classes inside the scikit-learn wheel, so this
loader needs no file and no network. Features are scaled to ``[0, 1]`` by
``x = pixel / 16``. There is no official test set: the split is deterministic
(the last ``round(0.2 * 1797) = 359`` examples of a ``default_rng(0)``
permutation are the test set, 1,438 train), see
:func:`jaxdp.data.train_test_split_indices`.
"""

from __future__ import annotations

import numpy as np

from jaxdp.data import preprocessing
from jaxdp.data.base import Dataset
from jaxdp.data.tabular import check_options

NAME = "digits"
CLASS_NAMES = tuple(str(i) for i in range(10))


def load_digits(
    data_dir: object = None,
    split: str = "official",
    *,
    flatten: bool = True,
    unit_ball: bool | str = False,
    test_fraction: float = 0.2,
    split_seed: int = 0,
    **unused_source_kwargs: object,
) -> Dataset:
  """Loads the scikit-learn digits: ``[1438, 64]`` train, ``[359, 64]`` test by default.

  Args:
    data_dir: ignored (the data is embedded in scikit-learn).
    split: ``"official"`` or ``"random"``: both are the deterministic
      ``test_fraction`` / ``split_seed`` split (digits has no official split).
    flatten: ``[n, 64]`` features (else ``[n, 8, 8]``).
    unit_ball: False (default), True/``"project"`` or ``"scale"`` (see
      :func:`jaxdp.data.normalize_rows`).
    test_fraction, split_seed: the split.
    **unused_source_kwargs: ``verify``, ``use_tfds``, ... accepted and ignored,
      so ``jaxdp.data.load`` can pass the same options to every loader.
  """
  del data_dir, unused_source_kwargs
  mode = check_options(NAME, split, unit_ball, has_test_set=False, test_fraction=test_fraction,
                       split_seed=split_seed)
  from sklearn import datasets as sk_datasets  # local: sklearn import is slow

  bunch = sk_datasets.load_digits()
  x = (np.asarray(bunch.data, dtype=np.float32) / np.float32(16.0))
  y = np.asarray(bunch.target, dtype=np.int32)
  tr, te = preprocessing.train_test_split_indices(len(y), test_fraction, split_seed)
  x_train, x_test = x[tr], x[te]
  if mode is not None:
    x_train, x_test = preprocessing.normalize_train_test(x_train, x_test, mode)
  if not flatten:
    x_train, x_test = x_train.reshape(-1, 8, 8), x_test.reshape(-1, 8, 8)
  return Dataset(
      x_train=x_train, y_train=y[tr], x_test=x_test, y_test=y[te], num_classes=10,
      class_names=CLASS_NAMES, feature_names=tuple(f"pixel_{i}" for i in range(64)),
      name=NAME, info=dict(source="sklearn.datasets.load_digits (embedded)", split=split,
                           test_fraction=test_fraction, split_seed=split_seed,
                           unit_ball=mode, pixel_scale="x = pixel / 16"))
