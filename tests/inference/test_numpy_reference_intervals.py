"""The numpy reference of benchmarks/numpy_intervals.py is jaxdp's interval algorithm.

``benchmarks/confidence_intervals.py`` times :func:`jaxdp.inference.confidence_intervals_batched`
against it, so it must compute the same thing: with the noise off the same bootstrap
replicate gives the same interval (up to where the two Newton solves stop: each is within
``tol / Lambda`` of the exact minimiser), and with the noise on coverage and mean length
agree within Monte Carlo error.
"""

import math

import jax
import numpy as np
import pytest

import _repo_modules
from jaxdp.inference import confidence_intervals_batched

npi = _repo_modules.load("benchmarks/numpy_intervals.py")

# The two implementations must agree whatever the coverage; small n under-covers and warns.
pytestmark = pytest.mark.filterwarnings("ignore:confidence intervals below nominal coverage")

LAM = 0.002
CHUNK = 4  # one compiled chunk shape for every call of a variant


def _pool(seed=0, num=1500, d=3):
  """Simulated logistic data with an intercept, rows in the unit ball."""
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(num, d)) / math.sqrt(d)
  x[:, -1] = 0.5
  x = x / np.maximum(1.0, np.linalg.norm(x, axis=1, keepdims=True))
  y = np.where(rng.random(num) < 1 / (1 + np.exp(-x @ np.array([1.5, -2.0, 0.8])[:d])), 1.0, -1.0)
  return x, y


def _both(x, y, idx, key, loss, pert, phi):
  """jaxdp's and the numpy reference's intervals of the replicates ``idx`` ``(M, n)``."""
  kw = dict(loss=loss, perturbation=pert, l2_reg=LAM, chunk_size=CHUNK)
  keys = jax.random.split(jax.random.key(key), idx.shape[0])
  out, cal = confidence_intervals_batched(keys, x, y, indices=idx, **phi, **kw)
  init = npi.newton_solve(x, y, LAM, np.zeros(x.shape[1]), loss=loss, h=cal.h,
                          grad_tol=1e-12)[0]
  rng = np.random.default_rng(key)
  ref = [npi.interval(rng, x[r], y[r], cal, init) for r in idx]
  return out, cal, np.stack([r.lower for r in ref]), np.stack([r.upper for r in ref]), init


def _check_noise_off(loss, pert, priv, num=8, n=400):
  x, y = _pool()
  idx = np.random.default_rng(1).integers(0, len(y), size=(num, n))
  phi = dict(epsilon=math.inf) if priv == "pure" else dict(rho=math.inf)
  out, cal, lower, upper, _ = _both(x, y, idx, 3, loss, pert, phi)
  half = 0.5 * (out.upper - out.lower)
  # Each minimiser is within tol/Lambda of the exact one; the half-widths (float32 root search
  # in jaxdp) to 1e-5 relative.
  bound = 1.1 * cal.tol / LAM + 1e-5 * half
  assert np.all(np.abs(lower - out.lower) <= bound)
  assert np.all(np.abs(upper - out.upper) <= bound)
  assert np.all(half > 0)


def _check_agreement(loss, pert, priv, num, n=400):
  """Coverage of the full-data minimiser and mean length agree within 4.5 standard errors."""
  x, y = _pool()
  idx = np.random.default_rng(2).integers(0, len(y), size=(num, n))
  phi = dict(epsilon=1.0) if priv == "pure" else dict(rho=0.5)
  out, _, lower, upper, theta0 = _both(x, y, idx, 5, loss, pert, phi)
  stats = []
  for lo, hi in ((out.lower, out.upper), (lower, upper)):
    cover = ((lo <= theta0) & (theta0 <= hi)).mean(axis=1)
    length = (hi - lo).mean(axis=1)
    stats.append((cover.mean(), cover.std(ddof=1) / math.sqrt(num), length.mean(),
                  length.std(ddof=1) / math.sqrt(num)))
  (cj, sj, lj, slj), (cn, sn, ln, sln) = stats
  assert abs(cj - cn) <= 4.5 * max(math.hypot(sj, sn), 1.0 / num)
  assert abs(lj - ln) <= 4.5 * math.hypot(slj, sln)
  assert 0.0 < lj and 0.0 < ln


def test_noise_off_same_interval_as_jaxdp():
  _check_noise_off("logistic", "objective", "pure")


@pytest.mark.slow
@pytest.mark.parametrize("loss", ["logistic", "huber"])
@pytest.mark.parametrize("pert,priv", [("objective", "pure"), ("objective", "zcdp"),
                                       ("output", "pure"), ("output", "zcdp")])
def test_noise_off_same_interval_as_jaxdp_every_variant(loss, pert, priv):
  _check_noise_off(loss, pert, priv)


def test_noise_on_same_coverage_and_length_as_jaxdp():
  _check_agreement("logistic", "objective", "pure", num=40)


@pytest.mark.slow
@pytest.mark.parametrize("pert,priv", [("objective", "pure"), ("objective", "zcdp"),
                                       ("output", "pure"), ("output", "zcdp")])
def test_noise_on_same_coverage_and_length_as_jaxdp_every_variant(pert, priv):
  _check_agreement("logistic", pert, priv, num=200)
