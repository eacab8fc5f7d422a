"""Every mechanism's DpEvent is understood by the shared PrivacyAccountant with the documented cost."""

import math

import pytest

from jaxdp import mechanisms as mech
from jaxdp.accounting import PrivacyAccountant


def _spent(event, count=1):
  acc = PrivacyAccountant()
  acc.spend(event, count=count)
  return acc


def test_pure_dp_events():
  assert _spent(mech.laplace_mechanism_event(2.0, 0.5), 3).pure_epsilon() == pytest.approx(1.5)
  assert _spent(mech.l2_laplace_mechanism_event(0.1, 0.7)).pure_epsilon() == pytest.approx(0.7)
  # exponential mechanism: 2 beta Delta per draw, (beta Delta)^2/2 zCDP
  acc = _spent(mech.exponential_mechanism_event(0.3), 10)
  assert acc.pure_epsilon() == pytest.approx(6.0)
  assert acc.zcdp_rho() == pytest.approx(10 * 0.045)
  # LNMax with Laplace scale b on a vote histogram: 2/b per answer
  assert _spent(mech.report_noisy_max_laplace_event(4.0), 5).pure_epsilon() == pytest.approx(2.5)


def test_gaussian_events():
  rho = 0.2
  assert _spent(mech.zcdp_gaussian_mechanism_event(3.0, rho), 2).zcdp_rho() == pytest.approx(2 * rho)
  # GNMax: rho = 1/sigma^2 per answer (PATE 2018 Prop. 8)
  assert _spent(mech.report_noisy_max_gaussian_event(2.0), 4).zcdp_rho() == pytest.approx(1.0)
  # the analytic Gaussian is exactly (eps, delta)-DP; PLD recovers eps up to discretisation
  eps, delta = 0.8, 1e-6
  got = _spent(mech.gaussian_mechanism_event(1.5, eps, delta)).get_epsilon(delta, method="pld")
  assert eps - 1e-3 <= got <= eps + 2e-2
  assert math.isinf(_spent(mech.gaussian_mechanism_event(1.5, eps, delta)).pure_epsilon())
