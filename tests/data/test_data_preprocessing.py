"""Invariants of the preprocessing helpers (row norms, train-only fitting, determinism)."""

import jax
import numpy as np
import pytest

import jaxdp.data as jd


def _norms(x):
  x = np.asarray(x, np.float64).reshape(len(x), -1)
  return np.sqrt((x * x).sum(1))


@pytest.fixture
def x():
  rng = np.random.default_rng(0)
  return (rng.normal(size=(200, 7)) * rng.uniform(0.1, 3.0, size=(200, 1))).astype(np.float32)


def test_normalize_rows_project(x):
  out = jd.normalize_rows(x, "project")
  n_in, n_out = _norms(x), _norms(out)
  assert out.dtype == np.float32 and out.shape == x.shape
  assert n_out.max() <= 1.0
  inside = n_in <= 1
  assert inside.any() and (~inside).any()
  np.testing.assert_array_equal(out[inside], x[inside])  # rows inside are unchanged
  np.testing.assert_allclose(n_out[~inside], 1.0, rtol=1e-6)
  # Projection keeps directions.
  np.testing.assert_allclose(out[~inside] * n_in[~inside, None], x[~inside], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_normalize_rows_output_passes_the_unit_ball_check_unchanged(dtype):
  """Rows projected here are inside the ball as the estimators' check measures them, so the
  check returns the array itself (no pull-in copy on every later call)."""
  from jaxdp import _validation
  rng = np.random.default_rng(3)
  raw = rng.normal(size=(5000, 11)).astype(dtype)
  raw[:, -1] = 1.0  # an intercept, as the confidence-interval data has
  out = jd.normalize_rows(raw, "project")
  assert _validation.row_norms_float64(out).max() <= 1.0
  assert _validation.check_unit_ball(out) is out


def test_normalize_rows_scale(x):
  out = jd.normalize_rows(x, "scale")
  r = _norms(x).max()
  np.testing.assert_allclose(out, x / r, rtol=1e-6)
  assert _norms(out).max() <= 1.0
  # With the train R applied to other data, rows still outside are projected.
  big = 2 * x
  out_big = jd.normalize_rows(big, "scale", reference_norm=r)
  assert _norms(out_big).max() <= 1.0
  small = _norms(big) <= r
  np.testing.assert_allclose(out_big[small], big[small] / r, rtol=1e-6)


def test_normalize_rows_keeps_image_shape_and_rejects_bad_input():
  imgs = np.full((3, 4, 4), 0.5, np.float32)
  out = jd.normalize_rows(imgs)
  assert out.shape == (3, 4, 4)
  np.testing.assert_allclose(_norms(out), 1.0, rtol=1e-6)
  with pytest.raises(ValueError, match="mode must be one of"):
    jd.normalize_rows(imgs, "clip")
  with pytest.raises(ValueError, match="NaN or inf"):
    jd.normalize_rows(np.array([[np.nan, 1.0]]))
  with pytest.raises(ValueError, match="reference_norm must be > 0"):
    jd.normalize_rows(imgs, "scale", reference_norm=0.0)


def test_normalize_train_test_fits_r_on_train(x):
  tr, te = x[:100], 3 * x[100:]
  a, b = jd.normalize_train_test(tr, te, "scale")
  r = _norms(tr).max()
  np.testing.assert_allclose(a, tr / r, rtol=1e-6)
  assert _norms(b).max() <= 1.0 and np.isclose(_norms(a).max(), 1.0)


def test_fit_pca_is_fitted_on_train_only(x):
  rng = np.random.default_rng(1)
  x_train = x @ rng.normal(size=(7, 7)).astype(np.float32)
  pca = jd.fit_pca(x_train, 3)
  z = pca(x_train)
  assert z.shape == (200, 3) and z.dtype == np.float32
  np.testing.assert_allclose(z.mean(0), 0.0, atol=1e-4)
  np.testing.assert_allclose(pca.components @ pca.components.T, np.eye(3), atol=1e-10)
  # Variances of the projections are the top eigenvalues, in decreasing order.
  np.testing.assert_allclose(z.var(0), pca.explained_variance, rtol=1e-4)
  evals = np.linalg.eigvalsh(np.cov(x_train.T, bias=True))[::-1]
  np.testing.assert_allclose(pca.explained_variance, evals[:3], rtol=1e-8)
  assert np.all(np.diff(pca.explained_variance) <= 0)
  # Test data does not enter the fit: transforming other data changes nothing.
  _ = pca(rng.normal(size=(50, 7)) * 100)
  np.testing.assert_array_equal(pca(x_train), z)
  np.testing.assert_allclose(pca.mean, x_train.astype(np.float64).mean(0), rtol=1e-12)
  # Same result as scikit-learn up to the sign convention.
  from sklearn.decomposition import PCA
  sk = PCA(3).fit(x_train.astype(np.float64))
  np.testing.assert_allclose(np.abs(sk.components_ @ pca.components.T), np.eye(3), atol=1e-6)


def test_fit_pca_wide_data_and_bad_d():
  rng = np.random.default_rng(2)
  xw = rng.normal(size=(5, 12))
  pca = jd.fit_pca(xw, 7)  # d > rank (4 after centring): completed orthonormally
  np.testing.assert_allclose(pca.components @ pca.components.T, np.eye(7), atol=1e-10)
  np.testing.assert_allclose(pca.explained_variance[4:], 0.0, atol=1e-12)
  with pytest.raises(ValueError, match=r"d must be in \[1, 12\]"):
    jd.fit_pca(xw, 13)
  with pytest.raises(ValueError, match="d must be an integer >= 1"):
    jd.fit_pca(xw, 0)


def test_keep_first_classes():
  y = np.array([0, 3, 1, 2, 1, 0, 3], np.int32)
  xs = np.arange(7, dtype=np.float32)[:, None]
  xk, yk = jd.keep_first_classes(xs, y, 2)
  np.testing.assert_array_equal(yk, [0, 1, 1, 0])
  np.testing.assert_array_equal(xk[:, 0], [0, 2, 4, 5])
  with pytest.raises(ValueError, match="c must be an integer >= 1"):
    jd.keep_first_classes(xs, y, 0)
  with pytest.raises(ValueError, match=r"c must be in \[1, 4\]"):
    jd.keep_first_classes(xs, y, 5)


def test_subsample_is_deterministic_nested_and_without_replacement():
  xs = np.arange(1000, dtype=np.float32)[:, None]
  ys = np.arange(1000) % 10
  a = jd.subsample(7, xs, ys, 100)
  b = jd.subsample(7, xs, ys, 100)
  np.testing.assert_array_equal(a[0], b[0])
  assert len(np.unique(a[0])) == 100
  np.testing.assert_array_equal(a[1], ys[a[0][:, 0].astype(int)])  # pairs stay aligned
  c = jd.subsample(8, xs, ys, 100)
  assert not np.array_equal(a[0], c[0])
  big = jd.subsample(7, xs, ys, 300)
  np.testing.assert_array_equal(big[0][:100], a[0])  # nested in N
  k1 = jd.subsample(jax.random.key(0), xs, ys, 50)
  k2 = jd.subsample(jax.random.key(0), xs, ys, 50)
  k3 = jd.subsample(jax.random.key(1), xs, ys, 50)
  np.testing.assert_array_equal(k1[0], k2[0])
  assert not np.array_equal(k1[0], k3[0])
  with pytest.raises(ValueError, match=r"n must be in \[1, 1000\]"):
    jd.subsample(0, xs, ys, 1001)
  with pytest.raises(ValueError, match="seed must be >= 0"):
    jd.subsample(-1, xs, ys, 10)


def test_one_hot():
  out = jd.one_hot(np.array([2, 0, 1]), 4)
  np.testing.assert_array_equal(out, [[0, 0, 1, 0], [1, 0, 0, 0], [0, 1, 0, 0]])
  assert out.dtype == np.float32
  assert jd.one_hot(np.array([1, 1])).shape == (2, 2)
  with pytest.raises(ValueError, match=r"labels in y must be in \[0, 2\]"):
    jd.one_hot(np.array([3]), 3)


def test_train_test_split_indices():
  tr, te = jd.train_test_split_indices(10, 0.2, 0)
  assert len(tr) == 8 and len(te) == 2
  assert sorted(np.concatenate([tr, te]).tolist()) == list(range(10))
  tr2, te2 = jd.train_test_split_indices(10, 0.2, 0)
  np.testing.assert_array_equal(te, te2)
  with pytest.raises(ValueError, match="split_seed must be an int >= 0"):
    jd.train_test_split_indices(10, 0.2, -3)


def test_tabular_encoder_fits_on_train_only():
  train_cols = [np.array([1.0, -4.0, 2.0]), np.array(["b", "a", "b"])]
  test_cols = [np.array([8.0, -1.0]), np.array(["c", "a"])]
  enc = jd.fit_tabular_encoder(train_cols, ["num", "cat"], [False, True])
  assert enc.feature_names == ("num", "cat=a", "cat=b", "constant")
  np.testing.assert_array_equal(enc.scale, [4.0, 1.0, 1.0])  # max |x| on train
  tr = enc.transform(train_cols)
  np.testing.assert_allclose(tr, [[0.25, 0, 1, 1], [-1, 1, 0, 1], [0.5, 0, 1, 1]])
  te = enc.transform(test_cols)
  # 8 / 4 = 2 clipped to 1; unseen category "c" encodes as all zeros.
  np.testing.assert_allclose(te, [[1.0, 0, 0, 1], [-0.25, 1, 0, 1]])
  raw = jd.fit_tabular_encoder(train_cols, ["num", "cat"], [False, True], scale=False,
                               add_constant=False)
  np.testing.assert_allclose(raw.transform(test_cols), [[8.0, 0, 0], [-1.0, 1, 0]])


def test_signed_labels():
  np.testing.assert_array_equal(jd.signed_labels(np.array([0, 1, 1])), [-1, 1, 1])
  with pytest.raises(ValueError, match="binary labels"):
    jd.signed_labels(np.array([0, 2]))


def test_load_post_processing_on_digits(monkeypatch):
  """num_classes -> n_train -> PCA (train-only) -> unit ball, as paper 000 Sec. 4.2."""
  monkeypatch.delenv("JAXDP_DATA_DIR", raising=False)
  full = jd.load("digits")
  ds = jd.load("digits", num_classes=3, n_train=200, seed=5, pca_dims=10, unit_ball=True)
  assert ds.num_classes == 3 and ds.class_names == ("0", "1", "2")
  assert ds.x_train.shape == (200, 10) and set(np.unique(ds.y_train)) == {0, 1, 2}
  assert ds.x_test.shape == ((full.y_test < 3).sum(), 10)
  assert _norms(ds.x_train).max() <= 1.0 and _norms(ds.x_test).max() <= 1.0
  # The PCA was fitted on exactly the 200 subsampled training rows.
  x3, y3 = jd.keep_first_classes(full.x_train, full.y_train, 3)
  xs, _ = jd.subsample(5, x3, y3, 200)
  np.testing.assert_allclose(ds.info["pca"].mean, xs.astype(np.float64).mean(0), atol=1e-7)
  ref = jd.normalize_rows(jd.fit_pca(xs, 10)(xs))
  np.testing.assert_allclose(ds.x_train, ref, atol=1e-6)
  assert ds.feature_names[0] == "pca_0"
  # Scale mode: one R (the train max norm) for both sets.
  sc = jd.load("digits", pca_dims=5, unit_ball="scale")
  assert np.isclose(_norms(sc.x_train).max(), 1.0, atol=1e-6)
  assert _norms(sc.x_test).max() <= 1.0


def test_dataset_validates_its_fields():
  x = np.zeros((2, 3), np.float32)
  y = np.array([0, 1], np.int32)
  ds = jd.Dataset(x, y, x, y, 2, ("a", "b"), ("f0", "f1", "f2"), "toy")
  assert ds.num_features == 3 and ds.num_train == 2
  with pytest.raises(ValueError, match="float32"):
    jd.Dataset(x.astype(np.float64), y, x, y, 2, ("a", "b"), (), "toy")
  with pytest.raises(ValueError, match=r"y_train must lie in \[0, 1\]"):
    jd.Dataset(x, np.array([0, 2], np.int32), x, y, 2, ("a", "b"), (), "toy")
  with pytest.raises(ValueError, match="int32"):
    ds.replace(y_test=y.astype(np.int64))
