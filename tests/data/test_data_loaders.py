"""Real datasets load with the shapes and label counts documented in shared/data/README.md."""

import numpy as np
import pytest

import jaxdp.data as jd

pytestmark = pytest.mark.data


def _row_norms(x):
  x = np.asarray(x, np.float64).reshape(len(x), -1)
  return np.sqrt((x * x).sum(1))


def _check_unit_ball_tabular(ds):
  for x in (ds.x_train, ds.x_test):
    norms = _row_norms(x)
    assert norms.max() <= 1.0
    # Every record has the constant feature 1 before projection, so its norm
    # was >= 1 and projection puts it on the sphere.
    np.testing.assert_allclose(norms, 1.0, atol=1e-6)
    # The constant column survives as 1 / ||raw row||: strictly positive.
    assert ds.feature_names[-1] == "constant"
    assert x[:, -1].min() > 0


@pytest.fixture(scope="module")
def kdd(data_dir):
  return jd.load("kddcup99", data_dir)


def test_mnist_shapes_counts_and_range(data_dir):
  ds = jd.load("mnist", data_dir)
  assert ds.x_train.shape == (60000, 784) and ds.x_test.shape == (10000, 784)
  assert ds.x_train.dtype == np.float32 and ds.y_train.dtype == np.int32
  np.testing.assert_array_equal(
      np.bincount(ds.y_train), [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949])
  np.testing.assert_array_equal(
      np.bincount(ds.y_test), [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009])
  assert ds.x_train.min() == 0.0 and ds.x_train.max() == 1.0
  # 255 -> exactly 1, and every value is a multiple of 1/255.
  np.testing.assert_allclose(ds.x_test[:50] * 255, np.round(ds.x_test[:50] * 255), atol=1e-4)
  assert ds.num_classes == 10 and ds.class_names[3] == "3"
  assert "data_dir argument" in ds.info["source"]


def test_mnist_unflattened(data_dir):
  ds = jd.load_mnist(data_dir, flatten=False)
  assert ds.x_train.shape == (60000, 28, 28) and ds.x_test.shape == (10000, 28, 28)


def test_read_idx_rejects_a_truncated_file(tmp_path, data_dir):
  raw = (data_dir / "mnist" / "t10k-labels-idx1-ubyte.gz").read_bytes()
  import gzip
  data = gzip.decompress(raw)
  assert jd.read_idx(data_dir / "mnist" / "t10k-labels-idx1-ubyte.gz").shape == (10000,)
  bad = tmp_path / "labels.idx"
  bad.write_bytes(data[:-5])
  with pytest.raises(ValueError, match="idx header says"):
    jd.read_idx(bad)


def test_adult_matches_paper_record_count(data_dir):
  ds = jd.load("adult", data_dir)
  # Paper 003 Sec. 7.1: 30,162 records = adult.data without '?' rows.
  assert ds.x_train.shape == (30162, 105) and ds.x_test.shape == (15060, 105)
  assert ds.info["train_records"] == 32561 and ds.info["test_records"] == 16281
  np.testing.assert_array_equal(np.bincount(ds.y_train), [22654, 7508])
  np.testing.assert_array_equal(np.bincount(ds.y_test), [11360, 3700])
  # 6 numeric + 98 one-hot (paper 003 Table 1's d=37 is a different encoding).
  assert ds.info["num_features_before_constant"] == 104
  assert ds.class_names == ("<=50K", ">50K")
  assert "workclass=Private" in ds.feature_names and "workclass=?" not in ds.feature_names
  _check_unit_ball_tabular(ds)
  y_pm_train, y_pm_test = ds.signed_labels()
  assert set(np.unique(y_pm_train)) == {-1, 1} and (y_pm_test == 1).sum() == 3700


def test_adult_keep_missing_as_category(data_dir):
  ds = jd.load("adult", data_dir, drop_missing=False, unit_ball=False)
  assert ds.x_train.shape[0] == 32561 and ds.x_test.shape[0] == 16281
  np.testing.assert_array_equal(np.bincount(ds.y_train), [24720, 7841])
  np.testing.assert_array_equal(np.bincount(ds.y_test), [12435, 3846])
  assert "workclass=?" in ds.feature_names
  # Without the unit ball, scaled columns lie in [-1, 1] and the constant is 1.
  assert np.abs(ds.x_train).max() == 1.0
  np.testing.assert_array_equal(ds.x_train[:, -1], 1.0)


def test_bank_deterministic_split(data_dir):
  ds = jd.load("bank", data_dir)
  assert ds.x_train.shape == (36169, 52) and ds.x_test.shape == (9042, 52)
  assert ds.info["num_features_before_constant"] == 51
  counts = np.bincount(ds.y_train) + np.bincount(ds.y_test)
  np.testing.assert_array_equal(counts, [39922, 5289])
  _check_unit_ball_tabular(ds)
  again = jd.load("bank", data_dir)
  np.testing.assert_array_equal(again.x_test, ds.x_test)
  other = jd.load("bank", data_dir, split_seed=1)
  assert not np.array_equal(other.y_test, ds.y_test)


def test_kddcup99_counts_and_encoding(kdd):
  ds = kdd
  assert ds.x_train.shape == (494021, 119) and ds.x_test.shape == (311029, 119)
  assert ds.class_names == ("normal", "attack")
  # normal. 97278 of 494021 train; 60593 of 311029 test (README).
  np.testing.assert_array_equal(np.bincount(ds.y_train), [97278, 494021 - 97278])
  np.testing.assert_array_equal(np.bincount(ds.y_test), [60593, 311029 - 60593])
  assert len(ds.info["label_counts_train"]) == 23 and len(ds.info["label_counts_test"]) == 38
  assert ds.info["label_counts_train"]["smurf"] == 280790
  assert ds.info["label_counts_train"]["neptune"] == 107201
  assert ds.info["label_counts_test"]["smurf"] == 164091
  assert ds.info["num_features_before_constant"] == 118
  enc = ds.info["encoder"]
  cats = dict(zip(enc.names, enc.categories))
  assert len(cats["protocol_type"]) == 3 and len(cats["service"]) == 66 and len(cats["flag"]) == 11
  _check_unit_ball_tabular(ds)


def test_kddcup99_first_record(kdd):
  # First line of the 10% file: 0,tcp,http,SF,181,5450,... normal. -> label 0, one-hot tcp/http/SF.
  ds = kdd
  names = ds.feature_names
  x0 = ds.x_train[0]
  assert ds.y_train[0] == 0
  for on in ("protocol_type=tcp", "service=http", "flag=SF"):
    assert x0[names.index(on)] > 0
  assert x0[names.index("protocol_type=udp")] == 0
  scale = ds.info["encoder"].scale
  src, dst = names.index("src_bytes"), names.index("dst_bytes")
  # Both columns are divided by their train max, then the row by one norm.
  np.testing.assert_allclose(x0[src] / x0[dst], (181 / scale[src]) / (5450 / scale[dst]),
                             rtol=1e-5)


def test_har_is_unavailable_offline_but_checked(data_dir):
  with pytest.raises(jd.DataUnavailableError, match=r"X_train\.txt.*X_test\.txt") as err:
    jd.load("har", data_dir)
  assert isinstance(err.value, FileNotFoundError)
  assert "uci-har/X_train.txt" in str(err.value)
  assert "SHA-256" in str(err.value)


def test_har_loads_when_feature_matrices_are_added(tmp_path, data_dir):
  """A user who adds the original X files gets the full dataset (synthetic X here)."""
  folder = tmp_path / "uci-har"
  folder.mkdir()
  for f in (data_dir / "uci-har").iterdir():
    (folder / f.name).symlink_to(f)
  rng = np.random.default_rng(0)
  # 64 distinct random rows (formatted like the original, "%.7e"), then
  # 7352 / 2947 rows drawn from them: cheap to write, still checks parsing.
  pool = rng.uniform(-1, 1, size=(64, 561))
  lines = np.array([" ".join(f"{v:.7e}" for v in row) for row in pool], dtype=object)
  pool = np.array([[float(t) for t in line.split()] for line in lines])
  i_tr, i_te = rng.integers(0, 64, size=7352), rng.integers(0, 64, size=2947)
  x_tr, x_te = pool[i_tr], pool[i_te]

  def write(path, idx):
    path.write_text("\n".join(lines[idx]) + "\n")

  train_dir = folder / "train"
  train_dir.mkdir()
  write(train_dir / "X_train.txt", i_tr)  # original zip layout
  write(folder / "X_test.txt", i_te)  # flattened layout
  ds = jd.load("har", tmp_path, unit_ball="scale")
  assert ds.x_train.shape == (7352, 561) and ds.x_test.shape == (2947, 561)
  np.testing.assert_array_equal(np.bincount(ds.y_train), [1226, 1073, 986, 1286, 1374, 1407])
  np.testing.assert_array_equal(np.bincount(ds.y_test), [496, 471, 420, 491, 532, 537])
  assert ds.class_names[0] == "WALKING" and ds.class_names[5] == "LAYING"
  assert len(ds.feature_names) == 561 and ds.feature_names[0] == "tBodyAcc-mean()-X"
  assert len(np.unique(ds.info["subjects_train"])) == 21
  assert len(np.unique(ds.info["subjects_test"])) == 9
  r = _row_norms(x_tr).max()
  np.testing.assert_allclose(ds.x_train[:3], x_tr[:3] / r, rtol=1e-5)
  assert _row_norms(ds.x_test).max() <= 1.0
  (folder / "X_test.txt").write_text("1.0 2.0\n")
  with pytest.raises(ValueError, match="2947 x 561"):
    jd.load("har", tmp_path)


def test_digits_needs_no_data_dir(monkeypatch):
  monkeypatch.delenv("JAXDP_DATA_DIR", raising=False)
  ds = jd.load("digits")
  assert ds.x_train.shape == (1438, 64) and ds.x_test.shape == (359, 64)
  assert ds.x_train.min() == 0.0 and ds.x_train.max() == 1.0
  y = np.concatenate([ds.y_train, ds.y_test])
  np.testing.assert_array_equal(
      np.bincount(y), [178, 182, 177, 183, 181, 182, 181, 179, 174, 180])
  again = jd.load_digits()
  np.testing.assert_array_equal(again.x_test, ds.x_test)
  assert jd.load_digits(flatten=False).x_train.shape == (1438, 8, 8)


def test_adult_random_split_refits_on_its_own_train(data_dir):
  ds = jd.load("adult", data_dir, split="random", unit_ball=False, split_seed=3)
  total = 30162 + 15060
  assert ds.x_test.shape[0] == round(0.2 * total) and ds.num_train + ds.num_test == total
  np.testing.assert_array_equal(np.bincount(ds.y_train) + np.bincount(ds.y_test),
                                [22654 + 11360, 7508 + 3700])
  # Scales are fitted on the training rows: every train column reaches |x| = 1
  # (or is all zero), test values are clipped into [-1, 1].
  col_max = np.abs(ds.x_train).max(0)
  assert np.all((col_max == 1.0) | (col_max == 0.0))
  assert np.abs(ds.x_test).max() <= 1.0
