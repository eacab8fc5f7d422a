"""A clipped-gradient function called through one ``jax.jit``, for the audit tests.

The audits call the clipped-gradient function eagerly (the canary's gradient, the fixed
batch's sum); through one ``jax.jit`` each call is one compiled program instead of one per
primitive. The function's ``sensitivity`` attribute, which the audits read, is kept.
"""

import jax


class Jitted:
  """``fn`` under ``jax.jit``, with ``fn.sensitivity``."""

  def __init__(self, fn):
    self._jitted = jax.jit(fn)
    self.sensitivity = fn.sensitivity

  def __call__(self, *args, **kwargs):
    return self._jitted(*args, **kwargs)
