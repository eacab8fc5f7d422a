"""experiments/multiparty.py pools the rows of several random splits (paper 001: 10 trials)."""

import importlib.util
import math
import pathlib

import numpy as np
import pytest

_PATH = pathlib.Path(__file__).resolve().parents[2] / "experiments" / "multiparty.py"


@pytest.fixture(scope="module")
def multiparty():
  spec = importlib.util.spec_from_file_location("multiparty_experiment_splits", _PATH)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _row(method, split, mean, sd):
  return dict(method=method, num_parties=10, l2_reg=1e-4, inv_epsilon=1.0, split=split,
              acc_mean=mean, acc_sd=sd)


def test_pooled_mean_and_sd_equal_those_of_all_draws(multiparty):
  rng = np.random.default_rng(0)
  draws = [rng.normal(0.8 + 0.05 * s, 0.02 + 0.01 * s, size=50) for s in range(3)]
  rows = [_row("soft", s, d.mean(), d.std()) for s, d in enumerate(draws)]
  rows += [_row("batch", s, 0.9 + 0.01 * s, 0.0) for s in range(3)]
  out = {r["method"]: r for r in multiparty.aggregate_splits(rows)}
  everything = np.concatenate(draws)
  assert out["soft"]["acc_mean"] == pytest.approx(everything.mean(), rel=1e-12)
  assert out["soft"]["acc_sd"] == pytest.approx(everything.std(), rel=1e-9)
  assert out["batch"]["acc_sd"] == pytest.approx(np.std([0.9, 0.91, 0.92]), rel=1e-9)
  assert out["soft"]["num_splits"] == out["batch"]["num_splits"] == 3


def test_one_split_is_unchanged(multiparty):
  rows = [_row("vote", 0, 0.7, 0.03)]
  (out,) = multiparty.aggregate_splits(rows)
  assert out["acc_mean"] == 0.7 and math.isclose(out["acc_sd"], 0.03, rel_tol=1e-9)
  assert out["num_splits"] == 1
