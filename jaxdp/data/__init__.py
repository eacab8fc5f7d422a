"""Datasets and preprocessing for jaxdp (host-side numpy).

``jaxdp.data.load(name, data_dir=None, split="official", **options)`` returns a
:class:`Dataset` of float32 features and int32 labels for ``digits`` (embedded
in scikit-learn, the offline default), ``mnist``, ``adult``, ``kddcup99``,
``bank`` and ``har``. Files are looked for in ``data_dir``, then
``$JAXDP_DATA_DIR``, then TensorFlow Datasets, and checked against embedded
SHA-256 checksums. The tabular sets are preprocessed as in
``../shared/papers/003_dp_confidence_intervals_for_erm.md`` Section 7.1.
"""

from jaxdp.data.adult import load_adult
from jaxdp.data.bank import load_bank
from jaxdp.data.base import ChecksumError
from jaxdp.data.base import DataUnavailableError
from jaxdp.data.base import Dataset
from jaxdp.data.base import DatasetNotFoundError
from jaxdp.data.base import signed_labels
from jaxdp.data.checksums import SHA256
from jaxdp.data.checksums import clear_checksum_cache
from jaxdp.data.checksums import file_sha256
from jaxdp.data.checksums import verify_file
from jaxdp.data.digits import load_digits
from jaxdp.data.har import load_har
from jaxdp.data.kddcup99 import load_kddcup99
from jaxdp.data.mnist import load_mnist
from jaxdp.data.mnist import read_idx
from jaxdp.data.preprocessing import PCATransform
from jaxdp.data.preprocessing import TabularEncoder
from jaxdp.data.preprocessing import fit_pca
from jaxdp.data.preprocessing import fit_tabular_encoder
from jaxdp.data.preprocessing import keep_first_classes
from jaxdp.data.preprocessing import normalize_rows
from jaxdp.data.preprocessing import normalize_train_test
from jaxdp.data.preprocessing import one_hot
from jaxdp.data.preprocessing import subsample
from jaxdp.data.preprocessing import subsample_indices
from jaxdp.data.preprocessing import train_test_split_indices
from jaxdp.data.registry import available_datasets
from jaxdp.data.registry import load
from jaxdp.data.resolve import ENV_VAR
from jaxdp.data.resolve import env_data_dir

__all__ = [
    "ChecksumError",
    "DataUnavailableError",
    "Dataset",
    "DatasetNotFoundError",
    "ENV_VAR",
    "PCATransform",
    "SHA256",
    "TabularEncoder",
    "available_datasets",
    "clear_checksum_cache",
    "env_data_dir",
    "file_sha256",
    "fit_pca",
    "fit_tabular_encoder",
    "keep_first_classes",
    "load",
    "load_adult",
    "load_bank",
    "load_digits",
    "load_har",
    "load_kddcup99",
    "load_mnist",
    "normalize_rows",
    "normalize_train_test",
    "one_hot",
    "read_idx",
    "signed_labels",
    "subsample",
    "subsample_indices",
    "train_test_split_indices",
    "verify_file",
]
