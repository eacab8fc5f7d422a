"""The noises of one private confidence interval are independent draws (paper 003).

One call of :func:`jaxdp.inference.confidence_intervals` with objective perturbation
draws four noises from its key: the objective's linear term ``b`` (Algorithm 1), the
Approximate Minima Perturbation output noise ``Z`` of the released ``theta~``, and the
PrivSPDMat noises of the Hessian and of the gradient covariance (Algorithm 2). Theorem
2 composes them as SEPARATE mechanisms, which holds only for independent noises: a
``Z`` drawn from the key of ``b`` (the same direction and radius, rescaled) is not the
mechanism that was accounted. These tests record every draw (a spy around the noise
samplers the pipeline calls, reporting through ``jax.debug.callback``) over many keys
in one call (``batch_mode="map"``: the releases run in order, so the i-th
draw of each sampler belongs to release i) and check that the sample correlation of every pair of
coordinates of two different noises is within a few standard errors (``1/sqrt(M)``)
of 0, and the same for their norms (a shared key would make them equal up to scale).

The pipeline compiles for several seconds (Newton solve, eigendecompositions, mixture
quantiles), so the tests are under ``slow``.
"""

import collections
import itertools
import math
import warnings

import jax
import numpy as np
import pytest

from jaxdp.inference import intervals as ci
from jaxdp.inference import spd_release

M = 256  # keys (releases)
N, D = 64, 2


def _data():
  rng = np.random.default_rng(3)
  x = rng.normal(size=(N, D))
  x /= np.maximum(1.0, np.linalg.norm(x, axis=1, keepdims=True))
  return x, rng.integers(0, 2, N)


def _record_draws(monkeypatch, **kwargs) -> dict:
  """``{name: (M, size) array}`` of every noise draw of ``M`` releases, in the order of the keys.

  Names are ``<sampler>#<order of the call while tracing>``: for objective perturbation
  ``l2_laplace_noise#0`` (or ``gaussian_noise#0``) is the objective's ``b`` and the next
  one the AMP release noise ``Z``; ``spd_noise#0`` / ``#1`` the Hessian / covariance.
  """
  records = collections.defaultdict(list)
  order = collections.Counter()

  def spy(name, original):
    def sampler(*args, **kw):
      z = original(*args, **kw)
      tag = f"{name}#{order[name]}"
      order[name] += 1
      # ordered: the calls of one sampler arrive in the order of the releases (lax.map)
      jax.debug.callback(lambda v, tag=tag: records[tag].append(np.asarray(v, np.float64)), z,
                         ordered=True)
      return z
    return sampler

  monkeypatch.setattr(ci, "l2_laplace_noise", spy("l2_laplace_noise", ci.l2_laplace_noise))
  monkeypatch.setattr(ci, "gaussian_noise", spy("gaussian_noise", ci.gaussian_noise))
  monkeypatch.setattr(spd_release, "spd_noise", spy("spd_noise", spd_release.spd_noise))
  jax.clear_caches()  # the jitted pipeline must be traced again, with the spies in it
  try:
    x, y = _data()
    keys = jax.random.split(jax.random.key(2024), M)
    with warnings.catch_warnings():
      warnings.simplefilter("ignore", ci.CoverageWarning)
      ci.confidence_intervals_batched(keys, x, y, batch_mode="map", chunk_size=M, **kwargs)
    jax.effects_barrier()
  finally:
    monkeypatch.undo()
    jax.clear_caches()  # no spied program stays cached for later tests
  out = {}
  for tag, chunks in records.items():  # M calls, in the order of the keys
    assert len(chunks) == M, (tag, len(chunks))
    out[tag] = np.stack([np.ravel(c) for c in chunks])
  return out


def _max_abs_correlation(a: np.ndarray, b: np.ndarray) -> float:
  """Largest |sample correlation| over all pairs of columns of a and b (M rows each)."""
  a = (a - a.mean(0)) / a.std(0)
  b = (b - b.mean(0)) / b.std(0)
  return float(np.max(np.abs(a.T @ b / a.shape[0])))


def _check_pairwise_independent(draws: dict):
  bound = 4.5 / math.sqrt(M)  # ~N(0, 1/M) each; few pairs, so 4.5 SE is never reached by chance
  for (na, a), (nb, b) in itertools.combinations(sorted(draws.items()), 2):
    r = _max_abs_correlation(a, b)
    assert r < bound, (na, nb, r, bound)
    r_norm = abs(np.corrcoef(np.linalg.norm(a, axis=1), np.linalg.norm(b, axis=1))[0, 1])
    assert r_norm < bound, (na, nb, "norms", r_norm, bound)


@pytest.mark.slow
@pytest.mark.parametrize("privacy", [dict(epsilon=20.0), dict(rho=50.0)])
def test_objective_amp_and_spd_noises_are_independent(monkeypatch, privacy):
  draws = _record_draws(monkeypatch, perturbation="objective", **privacy)
  vector_draws = {k: v for k, v in draws.items() if not k.startswith("spd_noise")}
  assert len(vector_draws) == 2, sorted(draws)  # the objective's b and the AMP noise Z
  assert sum(k.startswith("spd_noise") for k in draws) == 2, sorted(draws)
  for v in draws.values():
    assert np.all(np.std(v, axis=0) > 0)  # every draw varies with the key
  _check_pairwise_independent(draws)
