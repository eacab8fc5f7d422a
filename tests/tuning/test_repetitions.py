"""Laws of the number of runs K: exact pmf, sampling law (chi-square), events, argument checks."""

import math

import jax
import numpy as np
import pytest
from dp_accounting.rdp import rdp_privacy_accountant as dpa_rdp
from scipy import stats

from jaxdp import tuning
from jaxdp.accounting import events

LAWS = [tuning.GeometricRepetitions(4.0), tuning.LogarithmicRepetitions(4.0),
        tuning.TruncatedNegativeBinomial(4.0, 0.5), tuning.TruncatedNegativeBinomial(4.0, 3.0),
        tuning.PoissonRepetitions(4.0)]
IDS = ["geometric", "logarithmic", "tnb0.5", "tnb3", "poisson"]


def _chi_square_pvalue(law, num, seed):
  keys = jax.random.split(jax.random.key(seed), num)
  draws = np.array([law.sample(k) for k in keys])
  assert draws.min() >= law.min_runs
  top = int(np.searchsorted(np.cumsum(law.pmf(np.arange(0, 200))), 1 - 5.0 / num))
  ks = np.arange(law.min_runs, top + 1)
  expected = law.pmf(ks) * num
  expected = np.append(expected, num - expected.sum())  # the tail bin
  observed = np.append(np.bincount(draws, minlength=top + 1)[law.min_runs:top + 1],
                       np.sum(draws > top))
  return stats.chisquare(observed, expected).pvalue


@pytest.mark.parametrize("law", LAWS, ids=IDS)
def test_pmf_sums_to_one_with_the_stated_mean(law):
  ks = np.arange(0, 400)
  p = law.pmf(ks)
  assert p.dtype == np.float64
  assert p.sum() == pytest.approx(1.0, abs=1e-12)
  mean = float((ks * p).sum())
  assert mean <= 4.0 + 1e-9 and mean == pytest.approx(4.0, rel=1e-9)  # never above the accounted mean
  if law.min_runs == 1:
    assert law.pmf(0) == 0.0


def test_tnb_gamma_is_at_least_dp_accountings():
  for shape in (0.0, 0.5, 3.0):
    law = tuning.TruncatedNegativeBinomial(6.0, shape)
    assert law.gamma >= dpa_rdp._gamma_truncated_negative_binomial(shape, 6.0)  # pylint: disable=protected-access
  assert tuning.GeometricRepetitions(5.0).gamma == 0.2


@pytest.mark.parametrize("law", LAWS, ids=IDS)
def test_sample_law_chi_square_small(law):
  assert _chi_square_pvalue(law, 400, seed=1) > 1e-4


@pytest.mark.slow
@pytest.mark.parametrize("law", LAWS, ids=IDS)
def test_sample_law_chi_square_large(law):
  assert _chi_square_pvalue(law, 20_000, seed=2) > 1e-4


def test_same_key_same_k_and_keys_differ():
  law = tuning.PoissonRepetitions(20.0)
  key = jax.random.key(5)
  assert law.sample(key) == law.sample(key)
  draws = {law.sample(k) for k in jax.random.split(key, 30)}
  assert len(draws) > 5


def test_event_is_repeat_and_select():
  inner = events.GaussianDpEvent(2.0, neighbouring="add_remove")
  assert tuning.GeometricRepetitions(5.0).event(inner) == events.RepeatAndSelectDpEvent(inner, 5.0, 1.0)
  assert tuning.PoissonRepetitions(5.0).event(inner).shape == math.inf
  assert tuning.LogarithmicRepetitions(5.0).event(inner).shape == 0.0
  with pytest.raises(TypeError, match="per_run_event"):
    tuning.GeometricRepetitions(5.0).event("gaussian")


def test_bad_parameters_name_the_argument():
  with pytest.raises(ValueError, match="mean"):
    tuning.GeometricRepetitions(1.0)
  with pytest.raises(ValueError, match="mean"):
    tuning.PoissonRepetitions(0.5)
  with pytest.raises(ValueError, match="shape"):
    tuning.TruncatedNegativeBinomial(5.0, -0.5)
  with pytest.raises(ValueError, match="shape"):
    tuning.TruncatedNegativeBinomial(5.0, math.inf)
  with pytest.raises(TypeError, match="mean"):
    tuning.TruncatedNegativeBinomial(True, 1.0)
  with pytest.raises(ValueError, match="mean"):
    tuning.GeometricRepetitions(math.nan)
  with pytest.raises(TypeError, match="key"):
    tuning.GeometricRepetitions(5.0).sample(3)
