"""The pre-move paths ``jaxdp.training.dpsgd`` / ``.correlated`` are the same modules as ``jaxdp.dpsgd``."""

import importlib
import warnings


def test_old_paths_are_the_new_modules():
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    old = importlib.import_module("jaxdp.training.dpsgd.private_step")
    old_mf = importlib.import_module("jaxdp.training.correlated.strategies")
    from jaxdp import training
    from jaxdp.training.dpsgd import make_private as old_make_private
  from jaxdp import dpsgd
  from jaxdp.dpsgd import correlated
  from jaxdp.dpsgd.correlated import strategies
  from jaxdp.dpsgd import private_step
  assert old is private_step and old_mf is strategies
  assert old_make_private is dpsgd.make_private
  assert training.dpsgd is dpsgd and training.correlated is correlated
