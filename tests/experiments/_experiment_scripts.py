"""The experiment scripts (``experiments/*.py``) loaded once per test process.

``_repo_modules.load`` executes a file afresh on every call, so every test that loaded
``experiments/tradeoffs.py`` traced and lowered the script's module-level jitted functions
(``_accuracies``, the aggregation and noisy-logit scorers, CIFAR's ``augment`` and
``_predict``) again. The scripts hold no mutable module state and the tests change their
attributes only through ``monkeypatch`` (undone after each test), so one module per script
serves every test of the process. Configs (``configs/*.py``) are still executed afresh: each
``get_config()`` builds a new ConfigDict anyway.
"""

import functools

import _repo_modules


@functools.cache
def _script(rel: str):
  return _repo_modules.load(rel)


def load(rel: str):
  """The module at ``ROOT / rel``: an experiment script once per process, anything else afresh."""
  return _script(rel) if rel.startswith("experiments/") else _repo_modules.load(rel)
