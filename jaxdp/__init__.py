"""jaxdp: differentially private machine learning in JAX.

Subpackages (imported on first attribute access, so ``import jaxdp`` stays cheap):
``accounting`` (events, composition, one shared accountant and budgets),
``mechanisms`` (noise mechanisms as pure functions of a key), ``data``
(offline datasets and preprocessing), ``training`` (private linear models,
DP-SGD), ``models`` (Flax models), ``prediction`` (private prediction with
enforced budgets), ``audit`` (empirical privacy auditing).
"""

import importlib

__version__ = "0.1.0"

_SUBPACKAGES = ("accounting", "audit", "data", "mechanisms", "models", "prediction", "training")


def __getattr__(name):
  if name in _SUBPACKAGES:
    return importlib.import_module(f"jaxdp.{name}")
  raise AttributeError(f"module 'jaxdp' has no attribute {name!r}")


def __dir__():
  return sorted(list(globals()) + list(_SUBPACKAGES))


__all__ = list(_SUBPACKAGES)
