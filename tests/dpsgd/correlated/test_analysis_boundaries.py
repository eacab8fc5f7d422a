"""The amplified / deterministic boundary of MF accounting and its participation count.

Choquette-Choo et al. 2023, "(Amplified) banded matrix factorization", Theorem 4
amplifies a banded strategy only when its ``bands <= b`` (columns of two
participations, at least b apart, have disjoint supports) and ``p < 1``; the run is
then ``k = ceil(n / b)`` compositions of ``PoissonSampled(p, Gaussian(sigma))``. One
band past the limit the participations overlap and only the deterministic analysis
(one Gaussian of the (k, b)-participation sensitivity) is sound. These tests pin
both edges exactly, through :func:`mf_event` and through a plan's ``run_event()``.
"""

import math

import dp_accounting
import jax
import numpy as np
import pytest

from jaxdp.accounting import events
from jaxdp.dpsgd import make_private
from jaxdp.dpsgd.correlated import BandMF, mf_epsilon, mf_event
from jaxdp.dpsgd.correlated import accounting
from jaxdp.dpsgd.correlated.sensitivity import sensitivity

DELTA = 1e-5
SIGMA, P = 1.3, 0.2


def _bandmf(bands: int) -> BandMF:
  """Nonnegative, decreasing, stable: ``c_j = 0.5^j`` for ``j < bands``."""
  return BandMF(0.5 ** np.arange(bands))


def _rdp_epsilon(event) -> float:
  acc = dp_accounting.rdp.RdpAccountant()
  acc.compose(event)
  return acc.get_epsilon(DELTA)


def _plan_event(strategy, n, b, p=P):
  private = make_private(lambda w, x: (w * x).sum(), l2_clip_norm=1.0, num_examples=100,
                         sample_rate=p, noise_multiplier=SIGMA, delta=DELTA, steps=n,
                         key=jax.random.key(0), noise_strategy=strategy, min_separation=b)
  return private.run_event()


def _is_amplified_event(ev, p, k) -> bool:
  return (isinstance(ev, dp_accounting.SelfComposedDpEvent) and ev.count == k
          and isinstance(ev.event, dp_accounting.PoissonSampledDpEvent)
          and ev.event.sampling_probability == p
          and ev.event.event.noise_multiplier == SIGMA)


@pytest.mark.parametrize("b", [2, 3])
def test_bands_equal_to_b_is_amplified_one_more_band_is_not(b):
  n = 4 * b
  k = math.ceil(n / b)
  at_limit, past = _bandmf(b), _bandmf(b + 1)
  assert accounting.analysis(at_limit, b, P) == accounting.AMPLIFIED
  assert accounting.analysis(past, b, P) == accounting.DETERMINISTIC
  for get in (lambda s: mf_event(s, noise_multiplier=SIGMA, num_steps=n, min_separation=b,
                                 sample_rate=P),
              lambda s: _plan_event(s, n, b)):
    amplified, deterministic = get(at_limit), get(past)
    assert _is_amplified_event(amplified, P, k), amplified
    # One band past the limit: the Gaussian of the run's (k, b)-sensitivity, not amplified.
    assert isinstance(deterministic, dp_accounting.GaussianDpEvent), deterministic
    s1 = np.linalg.norm(past.coefficients(n))
    sens = sensitivity(past, n, max_participations=k, min_separation=b)
    assert sens > math.sqrt(k) * s1  # the overlapping columns add cross terms
    assert deterministic.noise_multiplier == pytest.approx(SIGMA * s1 / sens, rel=1e-12)
    # The unamplified event costs more than the amplified analysis would have claimed.
    amplified_claim = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(P, dp_accounting.GaussianDpEvent(SIGMA)), k)
    assert _rdp_epsilon(deterministic) > 1.5 * _rdp_epsilon(amplified_claim)


def test_mf_epsilon_jumps_at_the_band_limit():
  b, n = 3, 12
  eps = [mf_epsilon(_bandmf(bands), noise_multiplier=SIGMA, num_steps=n, min_separation=b,
                    sample_rate=P, delta=DELTA) for bands in (b, b + 1)]
  assert eps[1] > 1.5 * eps[0]


def test_full_batch_at_the_band_limit_is_not_amplified():
  b, n = 3, 9
  ev = _plan_event(_bandmf(b), n, b, p=1.0)
  assert isinstance(ev, dp_accounting.GaussianDpEvent)


@pytest.mark.parametrize("n,b", [(10, 3), (11, 3), (12, 3), (7, 2), (6, 5)])
def test_amplified_run_charges_ceil_n_over_b_participations(n, b):
  k = math.ceil(n / b)
  strategy = _bandmf(b)
  for ev in (mf_event(strategy, noise_multiplier=SIGMA, num_steps=n, min_separation=b,
                      sample_rate=P),
             _plan_event(strategy, n, b)):
    assert _is_amplified_event(ev, P, k), (n, b, ev)
  got = mf_epsilon(strategy, noise_multiplier=SIGMA, num_steps=n, min_separation=b,
                   sample_rate=P, delta=DELTA)
  want = _rdp_epsilon(dp_accounting.SelfComposedDpEvent(
      dp_accounting.PoissonSampledDpEvent(P, dp_accounting.GaussianDpEvent(SIGMA)), k))
  assert got == pytest.approx(want, rel=1e-9)
  if n % b:  # the last, partial cycle is a participation too: floor(n / b) undercharges
    fewer = _rdp_epsilon(dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(P, dp_accounting.GaussianDpEvent(SIGMA)), n // b))
    assert got > fewer * (1 + 1e-3)


def test_replace_one_amplified_run_charges_ceil_n_over_b():
  n, b = 11, 3
  ev = mf_event(_bandmf(b), noise_multiplier=SIGMA, num_steps=n, min_separation=b,
                sample_rate=P, neighbouring=events.REPLACE_ONE)
  assert ev.count == math.ceil(n / b) == 4
