"""Tests of zCDP conversions (paper 003 Propositions 1-3)."""

import math

import dp_accounting
import numpy as np
import pytest

from jaxdp.accounting import zcdp


def test_propositions():
  assert zcdp.pure_dp_to_zcdp(2.0) == 2.0
  assert zcdp.zcdp_to_approx_dp(0.5, 1e-5) == pytest.approx(0.5 + 2 * math.sqrt(0.5 * math.log(1e5)))
  assert zcdp.gaussian_zcdp_sigma(0.5, 2.0) == pytest.approx(2.0)
  assert zcdp.gaussian_zcdp_rho(2.0, 2.0) == pytest.approx(0.5)
  assert zcdp.bounded_range_to_zcdp(2.0) == pytest.approx(0.5)


@pytest.mark.parametrize("rho", [1e-4, 0.01, 0.5, 5.0])
@pytest.mark.parametrize("delta", [1e-10, 1e-5, 0.01])
def test_tight_conversion(rho, delta):
  tight = zcdp.zcdp_to_approx_dp_tight(rho, delta)
  assert tight <= zcdp.zcdp_to_approx_dp(rho, delta)
  # dp_accounting's RDP accountant on a zCDP event uses the same family of conversions.
  acc = dp_accounting.rdp.RdpAccountant(orders=list(1 + np.geomspace(1e-3, 1e6, 20000)))
  acc.compose(dp_accounting.ZCDpEvent(rho))
  assert tight == pytest.approx(acc.get_epsilon(delta), rel=2e-3)


def test_budget_inverse():
  rho = zcdp.approx_dp_to_zcdp_budget(1.0, 1e-5)
  assert zcdp.zcdp_to_approx_dp(rho, 1e-5) == pytest.approx(1.0, rel=1e-12)


def test_bad_input():
  with pytest.raises(ValueError, match="delta"):
    zcdp.zcdp_to_approx_dp(0.1, 0.0)
  with pytest.raises(ValueError, match="rho"):
    zcdp.gaussian_zcdp_sigma(0.0)
  with pytest.raises(ValueError, match="epsilon"):
    zcdp.pure_dp_to_zcdp(-1.0)
