"""``jaxdp.data.load``: one entry point for every dataset, plus the papers' post-processing."""

from __future__ import annotations

import os
from typing import Any, Callable

import numpy as np

from jaxdp.data import preprocessing
from jaxdp.data.adult import load_adult
from jaxdp.data.bank import load_bank
from jaxdp.data.base import Dataset
from jaxdp.data.digits import load_digits
from jaxdp.data.har import load_har
from jaxdp.data.kddcup99 import load_kddcup99
from jaxdp.data.mnist import load_mnist
from jaxdp.data.tabular import resolve_unit_ball

LOADERS: dict[str, Callable[..., Dataset]] = {
    "digits": load_digits,
    "mnist": load_mnist,
    "adult": load_adult,
    "kddcup99": load_kddcup99,
    "bank": load_bank,
    "har": load_har,
}
ALIASES = {"kdd": "kddcup99", "kddcup": "kddcup99", "kdd99": "kddcup99",
           "bank-marketing": "bank", "bank_marketing": "bank", "uci-har": "har",
           "uci_har": "har", "census": "adult", "census-income": "adult"}
# Default of ``unit_ball`` per dataset: the tabular sets of paper 003 are put in
# the unit ball (Section 7.1); images are left as pixels/255 unless asked.
DEFAULT_UNIT_BALL = {"digits": False, "mnist": False, "har": False,
                     "adult": True, "kddcup99": True, "bank": True}
_UNSET = object()


def available_datasets() -> tuple[str, ...]:
  """Names accepted by :func:`load` (``digits`` needs no files)."""
  return tuple(LOADERS)


def load(
    name: str,
    data_dir: str | os.PathLike | None = None,
    split: str = "official",
    *,
    num_classes: int | None = None,
    n_train: int | None = None,
    seed: Any = 0,
    pca_dims: int | None = None,
    unit_ball: Any = _UNSET,
    **loader_kwargs: Any,
) -> Dataset:
  """Loads dataset ``name`` and applies the papers' preprocessing.

  Files are looked for in ``data_dir``, then ``$JAXDP_DATA_DIR``, then TFDS
  (``mnist``, ``kddcup99``) and verified against embedded SHA-256 checksums;
  ``digits`` is embedded in scikit-learn and needs nothing.

  Post-processing, in this order (paper 000 Section 4.2 for MNIST):

  1. ``num_classes=C``: keep the examples of classes ``0 .. C-1`` (train and test);
  2. ``n_train=N``: a subsample of ``N`` training examples, the first ``N`` of
     a permutation drawn from ``seed`` (an int or a ``jax.random`` key), so
     subsamples for growing ``N`` are nested;
  3. ``pca_dims=D``: PCA fitted on the (subsampled) training features only,
     applied to both sets (``info["pca"]`` holds the transform);
  4. ``unit_ball``: rows put in the unit L2 ball (``True``/``"project"``,
     ``"scale"``, or ``False``), last, so the bound ``||x|| <= 1`` needed by
     the sensitivity theorems holds for the data actually returned. Default:
     True for ``adult``, ``kddcup99``, ``bank`` (paper 003 Section 7.1), False
     for image data.

  Args:
    name: one of :func:`available_datasets` (a few aliases such as ``"kdd"``
      are accepted).
    data_dir: explicit data folder (laid out like ``shared/data``).
    split: ``"official"`` or ``"random"`` (see each loader).
    num_classes, n_train, seed, pca_dims, unit_ball: see above.
    **loader_kwargs: passed to the loader (``verify``, ``use_tfds``,
      ``tfds_data_dir``, ``download``, ``test_fraction``, ``split_seed``,
      ``flatten``, ``drop_missing``, ``scale``, ``add_constant``).
  """
  if not isinstance(name, str):
    raise ValueError(f"name must be a dataset name string, got {name!r}.")
  key = ALIASES.get(name.lower(), name.lower())
  if key not in LOADERS:
    raise ValueError(f"name must be one of {available_datasets()}, got {name!r}.")
  mode = resolve_unit_ball(DEFAULT_UNIT_BALL[key] if unit_ball is _UNSET else unit_ball)
  post = num_classes is not None or n_train is not None or pca_dims is not None
  ds = LOADERS[key](data_dir, split, unit_ball=False if post else (mode or False),
                    **loader_kwargs)
  if not post:
    return ds
  x_train, y_train, x_test, y_test = ds.x_train, ds.y_train, ds.x_test, ds.y_test
  class_names, feature_names, info = ds.class_names, ds.feature_names, dict(ds.info)
  n_classes = ds.num_classes
  if num_classes is not None:
    if not isinstance(num_classes, (int, np.integer)) or not 1 <= num_classes <= ds.num_classes:
      raise ValueError(f"num_classes must be an int in [1, {ds.num_classes}], got {num_classes!r}.")
    x_train, y_train = preprocessing.keep_first_classes(x_train, y_train, num_classes)
    x_test, y_test = preprocessing.keep_first_classes(x_test, y_test, num_classes)
    n_classes = int(num_classes)
    class_names = class_names[:n_classes]
  if n_train is not None:
    x_train, y_train = preprocessing.subsample(seed, x_train, y_train, n_train)
    info["subsample"] = dict(n_train=int(n_train),
                             seed=seed if isinstance(seed, int) else "jax key")
  if pca_dims is not None:
    pca = preprocessing.fit_pca(x_train, pca_dims)
    x_train, x_test = pca(x_train), pca(x_test)
    feature_names = tuple(f"pca_{i}" for i in range(pca.dims))
    info["pca"] = pca
  if mode is not None:
    x_train, x_test = preprocessing.normalize_train_test(x_train, x_test, mode)
  info["unit_ball"] = mode
  return Dataset(x_train=x_train.astype(np.float32, copy=False), y_train=y_train,
                 x_test=x_test.astype(np.float32, copy=False), y_test=y_test,
                 num_classes=n_classes, class_names=class_names,
                 feature_names=feature_names, name=ds.name, info=info)
