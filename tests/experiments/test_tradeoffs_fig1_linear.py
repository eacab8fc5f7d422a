"""experiments/tradeoffs.py, Fig. 1 with the private linear models (paper 000 Fig. 1): resumable,
runs from any directory, dataset presets, the certified fit that model sensitivity shares.

Tiny configs on the embedded digits set (no data dir needed).
"""

import csv
import json
import os
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pytest

import _experiment_scripts

from jaxdp.training import certified_solve, output_perturbation

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "experiments" / "tradeoffs.py"

_load = _experiment_scripts.load  # experiment scripts once per process

# The whole digits training set, 1 validation and 3 test draws: the shapes of
# tests/experiments/test_tradeoffs.py's Fig. 1 run, whose certified fits and model-sensitivity
# draws compile the same programs (shared through the compilation cache).
N_TRAIN = 1438


def _tiny_config(out_dir, methods=("non_private", "model_sensitivity")):
  config = _load("configs/tradeoffs.py").get_config("fig1")
  config.methods = methods
  config.n_train = N_TRAIN
  config.axis_values = (3.0, 30.0)
  config.deltas = (1e-5,)
  config.l2_regs = (1e-2, 1e-1)
  config.num_seeds = 3
  config.val_seeds = 1
  config.out_dir = str(out_dir)
  return config


def _csv(path):
  with open(path, newline="") as f:
    return list(csv.DictReader(f))


def _timeless(rows):
  """Rows without their ``seconds`` column (a point's compute time, not a result)."""
  return [{k: v for k, v in r.items() if k != "seconds"} for r in rows]


def _check_killed_run_resumes(tmp_path, monkeypatch, methods):
  experiment = _load("experiments/tradeoffs.py")
  calls = []
  run_point = experiment.run_point
  monkeypatch.setattr(experiment, "run_point", lambda *args: calls.append(args[0]) or
                      run_point(*args))
  config = _tiny_config(tmp_path, methods)
  points = experiment.grid(experiment.resolve_config(config))
  private = len(methods) - 1
  assert len(points) == 1 + private * 2  # non-private + each private method x 2 epsilons
  killed = len(points) - 2  # the run is "killed" with 2 points left, in the first one's line

  rows = experiment.main(config)
  out = tmp_path / "tradeoffs_fig1" / f"digits_n{N_TRAIN}"  # <out_dir>/<experiment>/<dataset>/
  assert {p.name for p in out.iterdir()} >= {"points.jsonl", "results.csv", "results.json",
                                              "fig1.png"}
  assert calls == points and len(rows) == len(points)
  full_csv = _timeless(_csv(out / "results.csv"))
  full_rows = _timeless(json.loads((out / "results.json").read_text())["rows"])
  assert [r["method"] for r in full_csv] == [p[0] for p in points]
  assert all(r["num_draws"] == (1 if r["method"] == "non_private" else 3) for r in rows)

  # "Kill" the run after `killed` points, in the middle of writing the next line.
  lines = (out / "points.jsonl").read_text().splitlines(keepends=True)
  assert len(lines) == len(points)
  (out / "points.jsonl").write_text("".join(lines[:killed]) + lines[killed][:40])
  for name in ("results.csv", "results.json", "fig1.png"):
    (out / name).unlink()
  calls.clear()
  experiment.main(config)
  assert calls == points[killed:]  # only the missing points are computed
  assert _timeless(_csv(out / "results.csv")) == full_csv  # same keys per point: same numbers
  assert _timeless(json.loads((out / "results.json").read_text())["rows"]) == full_rows
  assert len((out / "points.jsonl").read_text().splitlines()) == len(points)

  # Everything done: a rerun computes nothing; a smaller grid reuses the finished points.
  calls.clear()
  experiment.main(config)
  config.axis_values = (30.0,)
  sub = experiment.main(config)
  assert calls == []
  kept = [r for r in full_rows if r["epsilon"] in ("inf", 30.0)]
  assert len(kept) == len(methods) and kept == _timeless(json.loads((out / "results.json").read_text())["rows"])
  assert [(r["method"], r["test_accuracy_mean"], r["test_accuracy_std"]) for r in sub] == [
      (r["method"], r["test_accuracy_mean"], r["test_accuracy_std"]) for r in kept]

  # Another dataset variant goes to its own folder and does not touch this one.
  config.n_train = 200
  config.methods = ("non_private",)
  experiment.main(config)
  assert (tmp_path / "tradeoffs_fig1" / "digits_n200" / "results.csv").exists()
  assert _timeless(_csv(out / "results.csv")) == [r for r in full_csv
                                                  if r["epsilon"] in ("inf", "30.0")]


def test_killed_run_resumes_without_recomputing_and_gives_identical_results(tmp_path, monkeypatch):
  # Model sensitivity only (3 points, killed with 2 left): the resume, the smaller grid and the
  # other variant as in the slow test, without loss perturbation's compiled fits (run by
  # test_tradeoffs.py's Fig. 1 test and by the slow test here).
  pytest.importorskip("ml_collections")
  _check_killed_run_resumes(tmp_path, monkeypatch, ("non_private", "model_sensitivity"))


@pytest.mark.slow
def test_killed_run_resumes_without_recomputing_and_gives_identical_results_slow(
    tmp_path, monkeypatch):
  """The three linear methods (5 points, killed with 2 left)."""
  pytest.importorskip("ml_collections")
  _check_killed_run_resumes(tmp_path, monkeypatch,
                            ("non_private", "model_sensitivity", "loss_perturbation"))


def test_runs_from_another_directory_without_backend_noise(tmp_path):
  pytest.importorskip("ml_collections")
  env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}  # let JAX probe the TPU
  env.pop("JAXDP_SHOW_ALL_LOGS", None)
  cmd = [sys.executable, str(SCRIPT), "--config.n_train=200", "--config.axis_values=(10.0,)",
         "--config.deltas=(0.0,)", "--config.l2_regs=(0.1,)", "--config.num_seeds=2",
         "--config.methods=('non_private','model_sensitivity')"]
  proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  out = tmp_path / "results" / "tradeoffs_fig1" / "digits_n200"  # under the caller's cwd
  assert [r["method"] for r in _csv(out / "results.csv")] == ["non_private", "model_sensitivity"]
  assert (out / "fig1.png").stat().st_size > 10_000
  assert "Unable to initialize backend 'tpu'" not in proc.stderr + proc.stdout


def test_dataset_presets_fill_only_empty_fields():
  pytest.importorskip("ml_collections")
  experiment = _load("experiments/tradeoffs.py")
  config = _load("configs/tradeoffs.py").get_config("fig1")
  config.dataset = "mnist"
  resolved = experiment.resolve_config(config)
  mnist = config.presets.mnist
  assert resolved.axis_values == tuple(mnist.axis_values)  # Fig. 1's epsilons
  assert resolved.l2_regs == tuple(mnist.l2_regs) and resolved.num_teachers == mnist.num_teachers
  assert resolved.num_seeds == mnist.num_seeds >= 10 and resolved.val_seeds == mnist.val_seeds
  assert resolved.objective_tol == mnist.objective_tol > 0
  assert resolved.dpsgd.epochs == mnist.dpsgd_epochs
  assert config.axis_values == () and config.num_seeds == 0  # the caller's config is untouched
  config.num_seeds, config.l2_regs = 100, (0.1,)  # given values win over the preset
  resolved = experiment.resolve_config(config)
  assert resolved.num_seeds == 100 and resolved.l2_regs == (0.1,)
  config.dataset = "digits"
  resolved = experiment.resolve_config(config)
  assert resolved.axis_values == tuple(config.presets.digits.axis_values)
  assert resolved.objective_tol < 0  # the AMP default tol
  config.dataset = "bank"  # no preset of its own: the digits one
  assert experiment.resolve_config(config).axis_values == tuple(config.presets.digits.axis_values)
  config.val_seeds = -2
  with pytest.raises(ValueError, match="val_seeds"):
    experiment.resolve_config(config)


def test_shared_model_sensitivity_fit_is_certified_even_when_capped():
  """The non-private fit shared by model sensitivity across points is certified within tol/lambda
  (float64 gradient recomputed here) even at max_iter=1 (never refused), and model sensitivity
  adds noise calibrated to 2K/(N lambda) + 2 tol/lambda around exactly that point."""
  pytest.importorskip("ml_collections")
  experiment = _load("experiments/tradeoffs.py")
  config = experiment.resolve_config(_tiny_config("unused"))
  config.max_iter = 1
  prob = experiment._Problem(config, 300, 0, 0)  # pylint: disable=protected-access
  x, y = prob.splits["full"]
  assert len(y) == 300
  lam = 1e-2
  w = prob.fits.certified("full", lam)
  _, g = certified_solve.objective_and_grad(w, x.astype(np.float64), y, loss="softmax", h=0.5,
                                            l2_total=lam)
  assert np.linalg.norm(g) <= config.tol
  keys = jax.random.split(jax.random.key(0), 2)
  got = experiment.private_models("model_sensitivity", keys, "full", lam, 3.0, 0.0,
                                  splits=prob.splits, fits=prob.fits,
                                  num_classes=prob.num_classes, config=config)
  cal = output_perturbation.output_perturbation_calibration(
      num_examples=len(y), l2_reg=lam, epsilon=3.0, solver_tol=config.tol)
  assert cal.sensitivity == pytest.approx(2 * np.sqrt(2) / (len(y) * lam) + 2 * config.tol / lam)
  np.testing.assert_array_equal(np.asarray(got),
                                np.asarray(output_perturbation.add_noise_float64(keys, w, cal)))
  summary = prob.summary()
  assert summary["n_train"] == 300 and summary["n_fit"] + summary["n_val"] == 300
  assert summary["seconds_nonprivate_fits"] > 0.0


def test_private_linear_models_gain_accuracy_with_epsilon(tmp_path):
  pytest.importorskip("ml_collections")
  config = _tiny_config(tmp_path, ("non_private", "model_sensitivity", "loss_perturbation"))
  config.axis_values = (1.0, 100.0)
  config.deltas = (0.0,)
  config.l2_regs = (1e-2,)
  rows = _load("experiments/tradeoffs.py").main(config)
  out = tmp_path / config.name / f"digits_n{N_TRAIN}"
  meta = json.loads((out / "results.json").read_text())
  assert meta["rows"][0]["epsilon"] == "inf"
  assert len(meta["rows"]) == len(rows) == 1 + 2 * 2
  assert meta["datasets"][0]["n_train"] == N_TRAIN
  by = {(r["method"], r["epsilon"]): r["test_accuracy_mean"] for r in rows}
  assert by[("non_private", float("inf"))] > 0.85
  for method in ("model_sensitivity", "loss_perturbation"):
    assert by[(method, 100.0)] > by[(method, 1.0)]
