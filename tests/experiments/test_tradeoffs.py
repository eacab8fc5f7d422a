"""Tests of experiments/tradeoffs.py (paper 000 Figs. 1-6) and experiments/cifar_tradeoffs.py (Fig. 7).

Tiny grids on the embedded digits set and on CIFAR-shaped random data (no data dir needed).
"""

import csv
import functools
import json
import math
import types

import jax
import numpy as np
import pytest

import _experiment_scripts

from jaxdp import models as jaxdp_models

_load = _experiment_scripts.load  # experiment scripts once per process


def _tiny(tmp_path, figure="fig1", **over):
  config = _load("configs/tradeoffs.py").get_config(figure)
  config.n_train = 0
  config.l2_regs = (1e-3, 1e-2)
  config.num_teachers = 0
  config.num_seeds = 3
  config.val_seeds = 1
  config.dpsgd.clip_norms = (0.5,)
  config.dpsgd.epochs = 2.0
  config.out_dir = str(tmp_path)
  for k, v in over.items():
    config[k] = v
  return config


def _check_fig1_all_five_methods_resumable(tmp_path, config):
  experiment = _load("experiments/tradeoffs.py")
  rows = experiment.main(config)
  methods = {r["method"] for r in rows}
  assert methods == {"non_private", "model_sensitivity", "loss_perturbation", "dpsgd",
                     "prediction_sensitivity", "subsample_aggregate"}
  # DP-SGD only where delta > 0; every private method at both deltas otherwise.
  assert [r["delta"] for r in rows if r["method"] == "dpsgd"] == [1e-5]
  assert sorted(r["delta"] for r in rows if r["method"] == "loss_perturbation") == [0.0, 1e-5]
  for r in rows:
    assert 0.0 <= r["test_accuracy_mean"] <= 1.0
    assert r["num_draws"] == (1 if r["method"] == "non_private" else config.num_seeds)
    if r["method"] in ("prediction_sensitivity", "subsample_aggregate"):
      assert r["budget"] == 100
    if r["method"] == "subsample_aggregate":
      assert r["num_teachers"] == 16  # the digits preset
  nonpriv = [r for r in rows if r["method"] == "non_private"][0]
  assert nonpriv["test_accuracy_mean"] > 0.9
  out = tmp_path / "tradeoffs_fig1" / "digits"
  assert (out / "fig1.png").stat().st_size > 10_000
  with open(out / "results.csv") as f:
    assert len(list(csv.DictReader(f))) == len(rows)
  meta = json.loads((out / "results.json").read_text())
  assert meta["points_computed_this_run"] == len(rows)
  # Re-running resumes: nothing is recomputed and the rows are identical.
  again = experiment.main(config)
  assert json.loads((out / "results.json").read_text())["points_computed_this_run"] == 0
  assert [r["test_accuracy_mean"] for r in again] == [r["test_accuracy_mean"] for r in rows]


@pytest.mark.slow
def test_fig1_all_five_methods_resumable(tmp_path):
  # One lambda and one DP-SGD learning rate (one candidate each: fewer fits, teacher sets and
  # noise calibrations); every method, both deltas, 3 draws and the resume as in the slow test.
  config = _tiny(tmp_path, axis_values=(10.0,), l2_regs=(1e-2,))
  config.dpsgd.learning_rates = (1.0,)
  assert config.num_seeds == 3
  _check_fig1_all_five_methods_resumable(tmp_path, config)


@pytest.mark.slow
def test_fig1_all_five_methods_resumable_slow(tmp_path):
  """Two lambdas and the config's two DP-SGD learning rates (hyper-parameter selection)."""
  _check_fig1_all_five_methods_resumable(tmp_path, _tiny(tmp_path, axis_values=(10.0,)))


def test_grid_shares_training_points_across_budgets(tmp_path):
  experiment = _load("experiments/tradeoffs.py")
  config = experiment.resolve_config(_tiny(tmp_path, figure="fig2", axis_values=(1, 10, 100)))
  points = experiment.grid(config)
  by_method = {}
  for p in points:
    by_method.setdefault(p[0], []).append(p)
  assert len(by_method["non_private"]) == 1
  assert len(by_method["loss_perturbation"]) == 2          # one per delta, flat in B
  assert len(by_method["dpsgd"]) == 1                      # delta > 0 only
  assert len(by_method["subsample_aggregate"]) == 2 * 3    # per delta and B
  config.methods = ("subsample_aggregate_paper_beta",)
  assert {p[2] for p in experiment.grid(config)} == {0.0}  # the paper's delta = 0 beta only


def test_paper_beta_variant_uses_twice_the_corrected_beta(tmp_path):
  experiment = _load("experiments/tradeoffs.py")
  config = _tiny(tmp_path, axis_values=(30.0,), deltas=(0.0,),
                 methods=("subsample_aggregate", "subsample_aggregate_paper_beta"))
  config.l2_regs = (1e-2,)
  rows = experiment.main(config)
  assert rows[1]["release_epsilon"] == rows[0]["release_epsilon"] == 30.0
  # Same teachers, beta doubled: the (2 eps)-DP answers are at least as accurate on average.
  assert rows[1]["test_accuracy_mean"] >= rows[0]["test_accuracy_mean"] - 0.02


def test_fig6a_fixed_lambda_axis_and_fig5b_classes(tmp_path):
  experiment = _load("experiments/tradeoffs.py")
  rows = experiment.main(_tiny(tmp_path, figure="fig6a", axis_values=(1e-4, 1e-1),
                               epsilons=(30.0,)))
  assert [r["l2_reg"] for r in rows] == [1e-4, 1e-1]   # the axis value is used, not tuned
  rows = experiment.main(_tiny(tmp_path, figure="fig5b", axis_values=(2,),
                               methods=("non_private", "model_sensitivity")))
  assert {r["num_classes"] for r in rows} == {2}
  assert rows[0]["test_accuracy_mean"] > 0.95  # 0 vs 1 is easy


def test_account_selection_divides_the_budget(tmp_path):
  experiment = _load("experiments/tradeoffs.py")
  config = _tiny(tmp_path, axis_values=(10.0,), methods=("model_sensitivity",), deltas=(0.0,),
                 selection="composition", val_seeds=2)
  rows = experiment.main(config)
  # 2 lambdas x 2 validation draws + 1 final release + 1 private selection: eps / 6 each.
  assert rows[0]["release_epsilon"] == pytest.approx(10.0 / 6)  # C V + 2 shares (selection too)


def test_bad_axis_and_method_raise(tmp_path):
  experiment = _load("experiments/tradeoffs.py")
  with pytest.raises(ValueError, match="methods"):
    experiment.grid(experiment.resolve_config(_tiny(tmp_path, methods=("magic",))))
  config = _tiny(tmp_path)
  config.axis = "momentum"
  with pytest.raises(ValueError, match="axis"):
    experiment.grid(experiment.resolve_config(config))
  with pytest.raises(ValueError, match="figure"):
    _load("configs/tradeoffs.py").get_config("fig9")


def _tiny_resnet(experiment, monkeypatch):
  """Swap the experiment's ResNet-20 for a one-stage, one-block, narrow one (the same module:
  stem convolution, GroupNorm, a basic block, pooling, dense layer; 3 convolutions instead of 19,
  far less compilation of DP-SGD's per-example gradients on a CPU). The type-A shortcuts of the
  other stages are checked in tests/models/test_flax_models.py; the ``_slow`` tests run the real
  ResNet-20 through the experiment."""
  small = functools.partial(jaxdp_models.ResNet20, blocks_per_stage=1, widths=(4,),
                            max_groups=4)
  monkeypatch.setattr(experiment, "models", types.SimpleNamespace(ResNet20=small))


def _check_cifar_fig7(tmp_path, experiment):
  config = _load("configs/tradeoffs_fig7.py").get_config()
  config.dataset = "random"
  # Teachers of 16 examples in batches of 8, as in _check_cifar_teachers_map_equals_vmap: the
  # same compiled teacher step (shared through the compilation cache).
  config.n_train, config.n_test = 32, 16
  # q = 4/32 for a quarter epoch: the same 2 steps as one epoch at q = 1/2, with a cheaper
  # noise calibration (the RDP of Poisson subsampling at a large q) and a smaller padded batch.
  config.dpsgd.epochs = 0.25
  config.dpsgd.expected_batch_size = 4
  config.teachers.num_teachers = 2
  config.teachers.epochs = 1.0
  config.teachers.batch_size = 8
  config.epsilons = (2.0,)
  config.budget_epsilon = 2.0
  config.budgets = (1, 10)
  config.num_seeds = 5
  config.out_dir = str(tmp_path)
  rows = experiment.main(config)
  assert [r["method"] for r in rows] == ["dpsgd", "subsample_aggregate", "subsample_aggregate"]
  dp = rows[0]
  assert dp["steps"] == 2 and dp["noise_multiplier"] > 0
  for r in rows:
    assert 0.0 <= r["test_accuracy_mean"] <= 1.0
  assert {r["budget"] for r in rows[1:]} == {1, 10}
  out = tmp_path / "tradeoffs_fig7" / "random_n32"
  assert (out / "fig7.png").exists() and (out / "results.csv").exists()


def test_cifar_fig7_runs_on_random_cifar_shaped_data(tmp_path, monkeypatch):
  experiment = _load("experiments/cifar_tradeoffs.py")
  _tiny_resnet(experiment, monkeypatch)
  _check_cifar_fig7(tmp_path, experiment)


class _Preempted(Exception):
  pass


def _check_cifar_resume(tmp_path, experiment, epochs, batch, every, crash_after):
  """A DP-SGD model killed mid-run resumes to the uninterrupted parameters (Fig. 7's trainer)."""
  config = _load("configs/tradeoffs_fig7.py").get_config()
  config.dpsgd.epochs = epochs
  config.dpsgd.expected_batch_size = batch
  config.dpsgd.checkpoint_every = every
  rng = np.random.default_rng(0)
  x = rng.normal(size=(32, 32, 32, 3)).astype(np.float32)
  y = rng.integers(0, 10, 32).astype(np.int32)
  args = (jax.random.key(3), x, y, 2.0, 1.0, config)
  ref, _, private = experiment.train_dpsgd_resnet(*args, progress=False)
  steps = private.steps

  class Bar:  # the progress bar "crashes" the run after `crash_after` steps
    def __init__(self, *a, initial=0, **k):
      self.n = initial
    def update(self):
      self.n += 1
      if self.n == crash_after:
        raise _Preempted
    def close(self):
      pass

  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(experiment, "tqdm", Bar)
    with pytest.raises(_Preempted):
      experiment.train_dpsgd_resnet(*args, progress=False, checkpoint_dir=str(tmp_path))
  paid = json.loads((tmp_path / "ledger.json").read_text())["steps_paid"]
  assert paid == crash_after
  out, _, private = experiment.train_dpsgd_resnet(*args, progress=False,
                                                  checkpoint_dir=str(tmp_path))
  ledger = json.loads((tmp_path / "ledger.json").read_text())
  assert ledger["steps_paid"] == steps and ledger["checkpointed_through"] == steps
  for a, b in zip(jax.tree.leaves(ref), jax.tree.leaves(out)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.slow
def test_cifar_dpsgd_resumes_from_its_checkpoint(tmp_path, monkeypatch):
  # Fig. 7 test's plan (32 examples, q = 4/32, 2 steps: one compiled step for both tests);
  # the crash comes after the checkpoint of step 1. Always on: the same resume of a
  # make_private run in tests/dpsgd/test_private_step_checkpoints.py.
  experiment = _load("experiments/cifar_tradeoffs.py")
  _tiny_resnet(experiment, monkeypatch)
  _check_cifar_resume(tmp_path, experiment, epochs=0.25, batch=4, every=1, crash_after=1)


@pytest.mark.slow
def test_cifar_dpsgd_resumes_from_its_checkpoint_slow(tmp_path, monkeypatch):
  # 8 steps, checkpoints every 2: the crash after step 5 loses a paid step, which is replayed.
  experiment = _load("experiments/cifar_tradeoffs.py")
  _tiny_resnet(experiment, monkeypatch)
  _check_cifar_resume(tmp_path, experiment, epochs=2.0, batch=8, every=2, crash_after=5)


@pytest.mark.slow
def test_cifar_fig7_runs_on_random_cifar_shaped_data_slow(tmp_path):
  """The same run with the experiment's real ResNet-20 (paper 000 Fig. 7's model)."""
  _check_cifar_fig7(tmp_path, _load("experiments/cifar_tradeoffs.py"))


def test_cifar_augmentation_is_per_example_flip_and_crop():
  experiment = _load("experiments/cifar_tradeoffs.py")
  x = np.arange(2 * 32 * 32 * 3, dtype=np.float32).reshape(2, 32, 32, 3)
  out = np.asarray(experiment.augment(jax.random.key(0), x))
  assert out.shape == x.shape
  # Each output is a (possibly flipped) 32x32 window of the zero-padded input: every
  # non-zero value of an output image comes from the same input image.
  for i in range(2):
    vals = set(out[i][out[i] != 0].tolist())
    assert vals <= set(x[i].ravel().tolist())
  # Changing one image does not change the augmentation of the other.
  x2 = x.copy()
  x2[1] += 1.0
  out2 = np.asarray(experiment.augment(jax.random.key(0), x2))
  np.testing.assert_array_equal(out[0], out2[0])
  assert math.isfinite(float(out.sum()))


def test_shifted_copies_extend_the_training_set_with_translations():
  experiment = _load("experiments/tradeoffs.py")
  rng = np.random.default_rng(0)
  x = rng.random((10, 28 * 28)).astype(np.float32)
  x /= np.linalg.norm(x, axis=1, keepdims=True)
  y = np.arange(10, dtype=np.int32)
  xa, ya = experiment.shifted_copies(x, y, 35, seed=1)
  assert xa.shape == (35, 784) and ya.shape == (35,)
  np.testing.assert_array_equal(xa[:10], x)
  assert np.all(np.linalg.norm(xa, axis=1) <= 1 + 1e-6)   # the unit-ball bound still holds
  for i in range(10, 35):  # each copy is a shifted original with the same label
    src = x[ya[i]].reshape(28, 28)
    img = xa[i].reshape(28, 28)
    found = any(np.allclose(img[max(0, dy):28 + min(0, dy), max(0, dx):28 + min(0, dx)],
                            src[max(0, -dy):28 + min(0, -dy), max(0, -dx):28 + min(0, -dx)])
                for dy in range(-2, 3) for dx in range(-2, 3) if (dy, dx) != (0, 0))
    assert found and not np.allclose(img, src)
  with pytest.raises(ValueError, match="raw"):
    experiment.shifted_copies(x[:, :50], y, 20, seed=0)


def _check_cifar_teachers_map_equals_vmap(experiment):
  config = _load("configs/tradeoffs_fig7.py").get_config()
  config.teachers.num_teachers = 2
  config.teachers.batch_size = 8
  config.teachers.epochs = 1.0
  rng = np.random.default_rng(0)
  x = rng.normal(size=(32, 32, 32, 3)).astype(np.float32)
  y = rng.integers(0, 10, 32).astype(np.int32)
  after = {}
  for mode in ("map", "vmap"):
    config.teachers.batch_mode = mode
    step, params, opt_state, total, _ = experiment.make_teachers(jax.random.key(0), x, y, config)
    assert total == 2  # one epoch of 16 examples per teacher in batches of 8
    params, _ = step(params, opt_state, jax.random.key(1))
    after[mode] = params
  for a, b in zip(jax.tree.leaves(after["map"]), jax.tree.leaves(after["vmap"])):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-4, atol=2e-5)
  config.teachers.batch_mode = "pmap"
  with pytest.raises(ValueError, match="batch_mode"):
    experiment.make_teachers(jax.random.key(0), x, y, config)


def test_cifar_teachers_map_equals_vmap_and_bad_mode_raises(monkeypatch):
  experiment = _load("experiments/cifar_tradeoffs.py")
  _tiny_resnet(experiment, monkeypatch)
  _check_cifar_teachers_map_equals_vmap(experiment)


@pytest.mark.slow
def test_cifar_teachers_map_equals_vmap_and_bad_mode_raises_slow():
  """The same comparison with the experiment's real ResNet-20."""
  _check_cifar_teachers_map_equals_vmap(_load("experiments/cifar_tradeoffs.py"))
