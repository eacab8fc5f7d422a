"""Loads the repository's scripts (``experiments/``, ``configs/``, ``benchmarks/``) as modules in tests.

They are not packages, so tests import them by path. ``tests/`` is on ``sys.path``
because it holds the root ``conftest.py`` (pytest's default ``prepend`` import mode).
"""

import importlib.util
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def load(rel: str):
  """The module at ``ROOT / rel`` (e.g. ``"experiments/multiparty.py"``), freshly executed."""
  spec = importlib.util.spec_from_file_location(rel.replace("/", "_")[:-3], ROOT / rel)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module
