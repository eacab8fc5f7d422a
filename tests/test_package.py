"""The top-level package exposes its subpackages lazily."""

import jaxdp


def test_subpackages_are_reachable_from_the_top_level():
  assert jaxdp.__version__
  for name in ("accounting", "audit", "data", "mechanisms", "models", "prediction", "training"):
    assert getattr(jaxdp, name).__name__ == f"jaxdp.{name}"
  assert jaxdp.accounting.analytic_gaussian_sigma(1.0, 1e-5) > 0


def test_unknown_attribute_raises():
  import pytest
  with pytest.raises(AttributeError):
    jaxdp.not_a_module  # pylint: disable=pointless-statement
