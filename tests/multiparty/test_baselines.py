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
