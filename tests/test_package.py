"""The top-level package exposes its subpackages lazily."""

import jaxdp


def test_subpackages_are_reachable_from_the_top_level():
  assert jaxdp.__version__
  for name in ("accounting", "audit", "classic", "data", "inference", "mechanisms", "models",
               "multiparty", "prediction", "training"):
    assert getattr(jaxdp, name).__name__ == f"jaxdp.{name}"
  assert jaxdp.accounting.analytic_gaussian_sigma(1.0, 1e-5) > 0


def test_unknown_attribute_raises():
  import pytest
  with pytest.raises(AttributeError):
    jaxdp.not_a_module  # pylint: disable=pointless-statement


def test_sources_compile_without_warnings():
  """No invalid escape sequence (a SyntaxWarning from Python 3.12 on) in any script or module.

  ``"\\frac"`` in a non-raw docstring is a form feed plus ``rac``: the math is silently mangled.
  """
  import pathlib
  import warnings
  root = pathlib.Path(__file__).resolve().parents[1]
  files = [p for d in ("jaxdp", "experiments", "benchmarks", "configs", "colabs")
           for p in sorted((root / d).rglob("*.py"))]
  assert len(files) > 50
  for path in files:
    with warnings.catch_warnings():
      warnings.simplefilter("error")
      compile(path.read_text(), str(path), "exec")
