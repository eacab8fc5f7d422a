"""DP-SGD on MNIST: test accuracy vs epsilon at delta = 1e-5 (paper 000 Section 4.2, Fig. 1b).

Usage::

  JAXDP_DATA_DIR=../shared/data python experiments/dpsgd_mnist.py \
      --config=configs/dpsgd_mnist.py --config.model=cnn --config.epsilons='(1.0,)'

Writes ``<out_dir>/mnist/results.csv`` (one row per epsilon), ``results.json`` (with
the training histories) and ``accuracy_vs_epsilon.png``; each finished epsilon is
appended to ``points.jsonl`` and skipped when the command is re-run (resume).
"""

from __future__ import annotations

import json
import pathlib

import jax
import optax
from absl import app
from ml_collections import config_flags

from jaxdp import data as jdata
from jaxdp import results_io
from jaxdp import models
from jaxdp import dpsgd

CONFIG_FILE = pathlib.Path(__file__).resolve().parents[1] / "configs" / "dpsgd_mnist.py"
_CONFIG = config_flags.DEFINE_config_file("config", str(CONFIG_FILE), "experiment config")


def make_model(config):
  if config.model == "linear":
    return models.LinearClassifier()
  if config.model == "mlp":
    return models.MLP(hidden_sizes=tuple(config.mlp_hidden))
  if config.model == "cnn":
    return models.SmallCNN()
  raise ValueError(f"config.model must be 'linear', 'mlp' or 'cnn', got {config.model!r}.")


def main(config) -> list[dict]:
  ds = jdata.load("mnist", data_dir=config.data_dir or None)
  x, y = ds.x_train, ds.y_train
  if config.n_train:
    x, y = x[:config.n_train], y[:config.n_train]
  model = make_model(config)
  apply = lambda p, xb: model.apply({"params": p}, xb)
  steps_per_epoch = max(1, round(len(y) / config.expected_batch_size))
  out = pathlib.Path(config.out_dir).absolute() / "mnist"
  settings = {k: v for k, v in config.to_dict().items() if k not in ("epsilons", "out_dir")}
  log = results_io.PointLog(out / "points.jsonl", settings)  # one point per target epsilon
  rows = []
  for i, eps in enumerate(config.epsilons):
    if (config.model, float(eps)) in log:
      rows.append(log.get((config.model, float(eps)))[0])
      continue
    res = dpsgd.train_dpsgd(
        model, x, y, key=jax.random.fold_in(jax.random.key(config.seed),
                                            results_io.point_seed((config.model, float(eps)))),
        epochs=config.epochs,
        l2_clip_norm=config.l2_clip_norm, delta=config.delta,
        expected_batch_size=config.expected_batch_size, target_epsilon=eps,
        optimizer=optax.sgd(config.learning_rate, momentum=config.momentum or None),
        clipping_method=config.clipping_method,
        physical_batch_size=config.physical_batch_size or None, accountant_method=config.accountant,
        eval_fn=lambda p: {"test_accuracy": dpsgd.accuracy(apply, p, ds.x_test, ds.y_test)},
        eval_every=steps_per_epoch if config.eval_every_epoch else None, progress=True)
    row = {"model": config.model, "target_epsilon": eps, "epsilon": res.epsilon, "delta": res.delta,
           "accountant_method": res.accountant_method,
           "noise_multiplier": res.noise_multiplier, "sample_rate": res.sample_rate,
           "steps": res.steps, "l2_clip_norm": config.l2_clip_norm,
           "test_accuracy": res.history[-1]["test_accuracy"], "seconds": res.seconds}
    print(json.dumps(row))
    rows.append(log.append((config.model, float(eps)), [dict(row, history=res.history)])[0])
  fields = [k for k in rows[0] if k != "history"]
  results_io.write_csv_atomic(out / "results.csv", [{k: r[k] for k in fields} for r in rows])
  results_io.write_json_atomic(out / "results.json", {"config": config.to_dict(), "results": rows})
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(4.5, 3.2))
  ax.plot([r["epsilon"] for r in rows], [r["test_accuracy"] for r in rows], "o-", label=config.model)
  ax.set_xlabel(f"privacy loss ε (δ = {config.delta:g})")
  ax.set_ylabel("test accuracy")
  ax.set_title("DP-SGD on MNIST (one training run per ε, no error bars)", fontsize=9)
  ax.legend()
  fig.tight_layout()
  fig.savefig(out / "accuracy_vs_epsilon.png", dpi=120)
  print(f"wrote {out}/results.csv, results.json, accuracy_vs_epsilon.png")
  return rows


def _run(argv) -> None:
  del argv
  main(_CONFIG.value)


if __name__ == "__main__":
  app.run(_run)
