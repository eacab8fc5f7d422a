"""experiments/multiparty.py (paper 001 Fig. 2 protocol on the MNIST stand-in): tiny run, resume, labels."""

import csv
import json

import pytest

import _experiment_scripts


_load = _experiment_scripts.load  # experiment scripts once per process


def _tiny(out_dir, data_dir):
  config = _load("configs/multiparty_har.py").get_config()
  config.data_dir = str(data_dir)
  config.num_parties = (40,)
  config.num_aux = 200
  config.pca_dims = 10
  config.inv_epsilons = (0.0, 1.0)
  config.num_draws = 3
  config.eval_test_size = 500
  config.out_dir = str(out_dir)
  return config


def test_standin_run_resumes_and_is_labelled(tmp_path, data_dir):
  exp = _load("experiments/multiparty.py")
  config = _tiny(tmp_path, data_dir)
  rows = exp.main(config)
  out = tmp_path / "multiparty" / "mnist_standin_pca10"
  assert {r["method"] for r in rows} == {"batch", "soft", "avg", "vote", "indiv"}
  assert all(r["dataset"] == "mnist_standin" and "stand-in" in r["label"] for r in rows)
  private = [r for r in rows if r["method"] in ("soft", "vote", "avg") and r["inv_epsilon"] == 1.0]
  assert all(r["num_draws"] == 3 and "unit='party'" in r["event"] for r in private)
  soft = next(r for r in private if r["method"] == "soft")
  assert soft["sensitivity"] == pytest.approx(2 ** 0.5 / (40 * 1e-4) + 2e-6 / 1e-4)
  with open(out / "results.csv", newline="") as f:
    assert len(list(csv.DictReader(f))) == len(rows)
  assert json.loads((out / "results.json").read_text())["standin"] is True
  assert (out / "multiparty.png").stat().st_size > 0
  # Resume: the finished point is read back, not recomputed (same rows, no new log line).
  lines = (out / "points.jsonl").read_text().splitlines()
  again = exp.main(config)
  assert again == rows
  assert (out / "points.jsonl").read_text().splitlines() == lines


def test_har_without_features_says_what_to_do(tmp_path, data_dir):
  exp = _load("experiments/multiparty.py")
  config = _tiny(tmp_path, data_dir)
  config.dataset = "har"
  with pytest.raises(SystemExit, match="mnist_standin"):
    exp.main(config)
