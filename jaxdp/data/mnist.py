"""MNIST handwritten digits (LeCun, Cortes, Burges), from the original idx files.

Files (``mnist/`` in ``shared/data``): ``train-images-idx3-ubyte.gz`` (magic
2051, 60000 x 28 x 28 uint8), ``train-labels-idx1-ubyte.gz`` (magic 2049,
60000), ``t10k-images-idx3-ubyte.gz`` (10000 x 28 x 28) and
``t10k-labels-idx1-ubyte.gz``. Parsed with ``numpy.frombuffer`` (no Python
loop), pixels scaled to ``[0, 1]`` as float32.

``../shared/papers/000_tradeoffs_of_private_prediction.md`` Section 4.2 uses
MNIST with linear models, PCA to ``D`` dimensions, the first ``C`` classes and
``N`` training examples: see :func:`jaxdp.data.load`'s ``pca_dims``,
``num_classes`` and ``n_train``, and ``unit_ball`` for the ``||x|| <= 1``
their sensitivity theorems need.
"""

from __future__ import annotations

import gzip
import os
import pathlib

import numpy as np

from jaxdp.data import resolve, tabular
from jaxdp.data.base import Dataset

NAME = "mnist"
CLASS_NAMES = tuple(str(i) for i in range(10))
FILES = (
    resolve.FileSpec("train_images", "mnist/train-images-idx3-ubyte.gz"),
    resolve.FileSpec("train_labels", "mnist/train-labels-idx1-ubyte.gz"),
    resolve.FileSpec("test_images", "mnist/t10k-images-idx3-ubyte.gz"),
    resolve.FileSpec("test_labels", "mnist/t10k-labels-idx1-ubyte.gz"),
)
_IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path: str | os.PathLike) -> np.ndarray:
  """Reads a (gzipped) idx file: magic ``0 0 <dtype> <ndim>``, big-endian dims, data."""
  raw = pathlib.Path(path).read_bytes()
  if raw[:2] == b"\x1f\x8b":
    raw = gzip.decompress(raw)
  if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
    raise ValueError(f"{path}: not an idx file (bad magic {raw[:4]!r}).")
  ndim = raw[3]
  dims = tuple(int(v) for v in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
  dtype = np.dtype(_IDX_DTYPES[raw[2]])
  offset = 4 + 4 * ndim
  expected = int(np.prod(dims)) * dtype.itemsize
  if len(raw) - offset != expected:
    raise ValueError(f"{path}: idx header says {dims} ({expected} bytes) but the file has "
                     f"{len(raw) - offset} data bytes.")
  return np.frombuffer(raw, dtype=dtype, offset=offset).reshape(dims)


def _check(images: np.ndarray, labels: np.ndarray, n: int, what: str) -> None:
  if images.shape != (n, 28, 28) or labels.shape != (n,):
    raise ValueError(f"MNIST {what}: expected {n} x 28 x 28 images and {n} labels, got "
                     f"{images.shape} and {labels.shape}.")
  if labels.size and (labels.min() < 0 or labels.max() > 9):
    raise ValueError(f"MNIST {what}: labels outside 0..9.")


def load_mnist(
    data_dir: str | os.PathLike | None = None,
    split: str = "official",
    *,
    flatten: bool = True,
    unit_ball: bool | str = False,
    verify: bool = True,
    use_tfds: bool = True,
    tfds_data_dir: str | None = None,
    download: bool = False,
) -> Dataset:
  """Loads MNIST: 60,000 train / 10,000 test, pixels in ``[0, 1]``.

  Args:
    data_dir: folder with the four ``mnist/*.gz`` files (else
      ``$JAXDP_DATA_DIR``, else TFDS ``mnist``).
    split: only ``"official"`` (MNIST's own train/test).
    flatten: ``[n, 784]`` features (else ``[n, 28, 28]``).
    unit_ball: False (default), True/``"project"`` or ``"scale"``: see
      :func:`jaxdp.data.normalize_rows` (raw images have norms up to ~16).
    verify: check SHA-256 checksums.
    use_tfds, tfds_data_dir, download: the TFDS fallback.
  """
  mode = tabular.check_options(NAME, split, unit_ball, splits=tabular.OFFICIAL_ONLY)
  found = tabular.locate(NAME, FILES, data_dir, verify=verify, use_tfds=use_tfds,
                         tfds_data_dir=tfds_data_dir, download=download)
  if found.tfds is None:
    arrays = {k: read_idx(p) for k, p in found.paths.items()}
    tr_x, tr_y = arrays["train_images"], arrays["train_labels"]
    te_x, te_y = arrays["test_images"], arrays["test_labels"]
    _check(tr_x, tr_y, 60000, "train")
    _check(te_x, te_y, 10000, "test")
  else:
    (tr_cols, _), (te_cols, _) = found.tfds["train"], found.tfds["test"]
    tr_x, tr_y = tr_cols["image"].reshape(-1, 28, 28), tr_cols["label"]
    te_x, te_y = te_cols["image"].reshape(-1, 28, 28), te_cols["label"]
    _check(tr_x, tr_y, len(tr_y), "train")
    _check(te_x, te_y, len(te_y), "test")

  def features(images: np.ndarray) -> np.ndarray:
    x = images.astype(np.float32) / np.float32(255.0)
    return x.reshape(len(x), -1) if flatten else x

  return tabular.dense_dataset(
      NAME, (features(tr_x), tr_y), (features(te_x), te_y), CLASS_NAMES,
      [f"pixel_{i}" for i in range(784)], mode=mode,
      info=dict(found.info, unit_ball=mode, pixel_scale="x = pixel / 255"))
