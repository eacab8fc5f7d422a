"""The TFDS fallback, exercised with tfds.testing.mock_data (no download, no TensorFlow)."""

import numpy as np
import pytest

import jaxdp.data as jd

tfds = pytest.importorskip(
    "tensorflow_datasets",
    reason="tensorflow-datasets is not installed (optional extra jaxdp[tfds])")


@pytest.fixture
def no_local_data(tmp_path, monkeypatch):
  monkeypatch.delenv("JAXDP_DATA_DIR", raising=False)
  return tmp_path


def test_mnist_from_tfds_mock(no_local_data):
  with tfds.testing.mock_data(num_examples=6, policy=tfds.testing.MockPolicy.USE_CODE):
    ds = jd.load("mnist", no_local_data)
  assert ds.info["source"].startswith("TFDS: 'mnist'")
  assert ds.x_train.shape == (6, 784) and ds.x_test.shape == (6, 784)
  assert ds.x_train.dtype == np.float32 and ds.y_train.dtype == np.int32
  assert 0.0 <= ds.x_train.min() and ds.x_train.max() <= 1.0
  assert ds.x_train.max() > 0  # mock pixels are random uint8
  assert ds.y_train.min() >= 0 and ds.y_train.max() <= 9


def test_mnist_tfds_mock_is_not_used_when_local_files_exist(data_dir, monkeypatch):
  monkeypatch.setenv("JAXDP_DATA_DIR", str(data_dir))
  with tfds.testing.mock_data(num_examples=3, policy=tfds.testing.MockPolicy.USE_CODE):
    ds = jd.load_mnist(data_dir)
  assert ds.x_train.shape == (60000, 784)


def test_kddcup99_from_tfds_mock(no_local_data):
  with tfds.testing.mock_data(num_examples=8, policy=tfds.testing.MockPolicy.USE_CODE):
    ds = jd.load("kddcup99", no_local_data)
  assert ds.info["source"].startswith("TFDS: 'kddcup99'")
  assert ds.x_train.shape[0] == 8 and ds.x_test.shape[0] == 8
  assert ds.feature_names[-1] == "constant" and ds.feature_names[0] == "duration"
  norms = np.linalg.norm(ds.x_train.astype(np.float64), axis=1)
  assert norms.max() <= 1.0
  # Categorical attributes were mapped back to their TFDS class names.
  assert any(f.startswith("protocol_type=") and f.split("=")[1] in ("icmp", "tcp", "udp")
             for f in ds.feature_names)
  assert sum(ds.info["label_counts_train"].values()) == 8


def test_tfds_has_no_adult(no_local_data):
  with tfds.testing.mock_data(num_examples=2, policy=tfds.testing.MockPolicy.USE_CODE):
    with pytest.raises(jd.DatasetNotFoundError, match="no TFDS dataset for 'adult'"):
      jd.load("adult", no_local_data)
