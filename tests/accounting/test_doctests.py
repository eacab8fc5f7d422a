"""Runs the docstring examples of the accounting modules (they pin exact numbers)."""

import doctest

import pytest

from jaxdp.accounting import accountant, analytic_gaussian, composition, dpsgd_accounting, events


@pytest.mark.parametrize("module", [accountant, analytic_gaussian, composition, dpsgd_accounting, events])
def test_doctests(module):
  result = doctest.testmod(module)
  assert result.attempted > 0
  assert result.failed == 0
