"""Tests of jaxdp.multiparty.baselines (paper 001 Sec. 6 and App. B.4)."""

import math

import jax
import numpy as np
import pytest

from jaxdp.accounting import events
from jaxdp.multiparty import baselines, local


def _parties(m=6, n=10, d=3, seed=0):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(m * n + 20, d))
  x = (x / np.linalg.norm(x, axis=1, keepdims=True) * 0.9).astype(np.float32)
  y = (x @ np.array([1.0, -1.0, 0.5]) > 0).astype(np.int32)
  return local.split_parties(0, x, y, num_parties=m, samples_per_party=n)


def test_averaging_sensitivity_formula():
  # App. B.4: 2 sqrt(2)/(M lambda) multiclass; binary 2/(M lambda); + 2 tol/(M lambda).
  assert baselines.parameter_averaging_sensitivity(1e-4, num_parties=1000, num_classes=6) == \
      pytest.approx(2 * math.sqrt(2) / (1000 * 1e-4), rel=1e-14)
  assert baselines.parameter_averaging_sensitivity(0.1, num_parties=20, num_classes=2,
                                                   solver_tol=1e-6) == \
      pytest.approx((2 + 2e-6) / (20 * 0.1), rel=1e-14)
  with pytest.raises(ValueError, match="l2_reg"):
    baselines.parameter_averaging_sensitivity(0.0, num_parties=3, num_classes=2)


def test_averaging_one_party_change_within_bound():
  """Replacing ALL of party 0's samples moves the average by <= 2/(M lambda) (brute force)."""
  sp = _parties()
  lam, m = 0.5, sp.xs.shape[0]
  rng = np.random.default_rng(3)
  ref = local.fit_local_classifiers(sp.xs, sp.ys, l2_reg=lam).weights
  avg0 = baselines.certify_local_classifiers(ref, sp.xs, sp.ys, num_classes=2, l2_reg=lam,
                                             tol=1e-7).mean(0)
  worst = 0.0
  for trial in range(6):
    xs, ys = sp.xs.copy(), sp.ys.copy()
    u = rng.normal(size=3)
    u /= np.linalg.norm(u)
    xs[0] = (u * 0.999)[None].repeat(xs.shape[1], 0) if trial % 2 else -xs[0]
    ys[0] = trial % 2
    w = local.fit_local_classifiers(xs, ys, l2_reg=lam).weights
    avg = baselines.certify_local_classifiers(w, xs, ys, num_classes=2, l2_reg=lam,
                                              tol=1e-7).mean(0)
    worst = max(worst, np.linalg.norm(avg - avg0))
  bound = baselines.parameter_averaging_sensitivity(lam, num_parties=m, num_classes=2,
                                                    solver_tol=1e-7)
  assert 0.1 * bound < worst <= bound


def test_private_averaging_release_and_inf():
  sp = _parties()
  loc = local.fit_local_classifiers(sp.xs, sp.ys, l2_reg=0.1)
  r = baselines.private_parameter_averaging(jax.random.key(0), loc.weights, sp.xs, sp.ys,
                                            num_classes=2, l2_reg=0.1, epsilon=math.inf)
  np.testing.assert_allclose(r.weights, np.asarray(loc.weights).mean(0), atol=1e-5)
  r = baselines.private_parameter_averaging(jax.random.key(0), loc.weights, sp.xs, sp.ys,
                                            num_classes=2, l2_reg=0.1, epsilon=1.0)
  assert r.event == events.PureDpEvent(1.0, neighbouring="replace_one", unit="party")
  assert r.calibration.scale == pytest.approx(1.0 / ((2 + 2e-6) / (6 * 0.1)))
  with pytest.raises(ValueError, match="xs"):
    baselines.private_parameter_averaging(jax.random.key(0), loc.weights, 2 * sp.xs, sp.ys,
                                          num_classes=2, l2_reg=0.1, epsilon=1.0)


def test_indiv_and_batch():
  sp = _parties()
  loc = local.fit_local_classifiers(sp.xs, sp.ys, l2_reg=0.1)
  ind = baselines.indiv_accuracy(loc.weights, sp.x_aux, sp.y_aux)
  per = [np.mean(np.asarray(loc.weights[i] @ sp.x_aux.T >= 0) == sp.y_aux) for i in range(6)]
  assert ind.mean == pytest.approx(np.mean(per))
  b = baselines.batch_classifier(sp.xs.reshape(-1, 3), sp.ys.reshape(-1), num_classes=2,
                                 l2_reg=0.1)
  assert b.weights.shape == (3,)


# ------------------------------------------------ input validation (issue 26 items 5, proof gaps)


def _tiny(m=4, n=5, d=2, c=2, seed=1):
  """Tiny party data (rows in the unit ball, labels in [0, c)) and zero local weights."""
  rng = np.random.default_rng(seed)
  xs = rng.normal(size=(m, n, d))
  xs = (0.9 * xs / np.linalg.norm(xs, axis=-1, keepdims=True)).astype(np.float32)
  ys = rng.integers(0, c, size=(m, n)).astype(np.int32)
  w = np.zeros((m, d) if c == 2 else (m, d, c), np.float32)
  return w, xs, ys


@pytest.fixture
def no_work(monkeypatch):
  """Fails the test if averaging reaches calibration or certification (work before validation)."""
  def boom(*args, **kwargs):
    raise AssertionError("validation must happen before any calibration or certification")
  monkeypatch.setattr(baselines, "_certify", boom)
  monkeypatch.setattr(baselines.private_global, "party_calibration", boom)
  monkeypatch.setattr(baselines.certified_solve, "certify_minimizers", boom)


def _average(w, xs, ys, c=2, **kw):
  return baselines.private_parameter_averaging(jax.random.key(0), w, xs, ys, num_classes=c,
                                               l2_reg=0.5, epsilon=1.0, **kw)


def test_averaging_refuses_weights_of_one_party_for_m_parties(no_work):
  """Regression (issue 26 item 5): (1, D) weights used to broadcast against M = 4 parties and
  release party 0's own model with noise sized for a 4-party average."""
  w, xs, ys = _tiny()
  with pytest.raises(ValueError, match=r"local_weights must be \(M, D\) logistic weights of shape "
                                       r"\(4, 2\).*got \(1, 2\)"):
    _average(w[:1], xs, ys)
  for bad in (w[:, :1], w[:3], w[None], w.reshape(-1)):  # wrong D, M, rank
    with pytest.raises(ValueError, match="local_weights must be"):
      _average(bad, xs, ys)
  w3, xs3, ys3 = _tiny(c=3)
  for bad in (w3[..., :2], w3[:, :, 0], w3[:2]):  # C mismatch, binary weights for C = 3, M
    with pytest.raises(ValueError, match="local_weights must be"):
      _average(bad, xs3, ys3, c=3)


def test_averaging_refuses_two_class_softmax_weights(no_work):
  """(M, D, 2) softmax weights with num_classes=2 are refused: the proven K is sqrt(2), not 1."""
  w, xs, ys = _tiny()
  with pytest.raises(ValueError, match=r"local_weights has shape \(4, 2, 2\).*softmax.*"
                                       r"K = sqrt\(2\)"):
    _average(np.zeros((4, 2, 2), np.float32), xs, ys)
  with pytest.raises(ValueError, match=r"weights has shape \(4, 2, 2\)"):
    baselines.certify_local_classifiers(np.zeros((4, 2, 2)), xs, ys, num_classes=2, l2_reg=0.5,
                                        tol=1e-6)


def test_two_class_softmax_per_sample_gradient_reaches_sqrt2():
  """Why K = 1 is not a bound for (D, 2) softmax weights: ||x (P - e_y)^T||_F -> sqrt(2)."""
  x = np.array([1.0, 0.0])
  w = np.array([[30.0, -30.0], [0.0, 0.0]])  # p_0 ~ 1, label y = 1 (p_y ~ 0)
  p = np.exp(x @ w - np.max(x @ w))
  p /= p.sum()
  grad = np.outer(x, p - np.array([0.0, 1.0]))
  assert np.linalg.norm(grad) == pytest.approx(math.sqrt(2), rel=1e-12)
  assert np.linalg.norm(grad) > 1.0  # the logistic K = 1 does not bound it


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_averaging_refuses_non_finite_local_weights(no_work, bad):
  """Regression (issue 26): a NaN weight skipped the certificate (NaN > tol is False)."""
  w, xs, ys = _tiny()
  w[2, 1] = bad
  with pytest.raises(ValueError, match=r"local_weights must be finite: party 2's weights"):
    _average(w, xs, ys)


def test_nan_weights_used_to_skip_the_certificate():
  """The defect the refusal closes: the vectorised certificate of a NaN row is NaN, never > tol."""
  w, xs, ys = _tiny()
  w[1, 0] = np.nan
  g = _soft_erm_certificate(w, xs, ys)
  assert np.isnan(g[1]) and not g[1] > 1e-6


def _soft_erm_certificate(w, xs, ys):
  from jaxdp.multiparty import _soft_erm
  return _soft_erm.certificate(w.astype(np.float64), xs.astype(np.float64),
                               np.eye(2)[ys], 0.5, 2)


@pytest.mark.parametrize("case,match", [
    ("pm1", r"ys must hold integer labels in \[0, 2\) \(binary labels are \{0, 1\}, not "
            r"\{-1, \+1\}\); ys\[0, 1\] \(party, sample\)"),
    ("big", r"ys must hold integer labels in \[0, 2\).*ys\[3, 4\]"),
    ("frac", r"ys must hold integer labels.*ys\[1, 2\]"),
    ("nan", r"ys must hold integer labels.*ys\[2, 0\]"),
    ("shape", r"ys must have shape \(M, n\) = \(4, 5\)"),
    ("xs_shape", r"xs must be a non-empty \(M, n, D\)"),
    ("xs_nan", r"xs contains NaN"),
])
def test_averaging_bad_labels_and_shapes_name_the_argument(no_work, case, match):
  w, xs, ys = _tiny()
  ys = ys.astype(np.float64)
  if case == "pm1":
    ys = 2 * ys - 1
    ys[0, 0], ys[0, 1] = 1, -1
  elif case == "big":
    ys[3, 4] = 2
  elif case == "frac":
    ys[1, 2] = 0.5
  elif case == "nan":
    ys[2, 0] = np.nan
  elif case == "shape":
    ys = ys[:, :4]
  elif case == "xs_shape":
    xs = xs[0]
  elif case == "xs_nan":
    xs = xs.copy()
    xs[1, 1, 1] = np.nan
  with pytest.raises(ValueError, match=match) as err:
    _average(w, xs, ys)
  assert "0.5" not in str(err.value) and "nan" not in str(err.value).lower().replace(
      "contains nan", "")  # the rule and the row, never the value
