"""Paper 000 Figure 7: ResNet-20 (GroupNorm) on CIFAR-10, DP-SGD vs subsample-and-aggregate.

Paper: ``../shared/papers/000_tradeoffs_of_private_prediction.md`` Sec. 4.3.
Runs on a GPU (CPU works for the smoke test on random data). Usage::

  # CIFAR-10 from TFDS (downloads once into ~/tensorflow_datasets, or --config.tfds_data_dir)
  python experiments/cifar_tradeoffs.py --config=configs/tradeoffs_fig7.py
  # CIFAR-10 from a directory holding the python version of the dataset
  # (<data_dir>/cifar10/cifar-10-batches-py/{data_batch_1..5,test_batch}, as unpacked from
  # https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz)
  python experiments/cifar_tradeoffs.py --config=configs/tradeoffs_fig7.py --config.data_dir=/data
  # smoke test on CIFAR-shaped random data (no download; what the test suite runs)
  python experiments/cifar_tradeoffs.py --config=configs/tradeoffs_fig7.py --config.dataset=random

Both methods at ``delta = 1e-5`` (the paper's Fig. 7):

* DP-SGD (:func:`jaxdp.dpsgd.make_private`): ResNet-20 with GroupNorm
  (:class:`jaxdp.models.ResNet20`), SGD with momentum, expected batch 600
  (Poisson sampling, as the RDP accountant assumes -- not fixed-size shuffled
  batches), learning rate 0.1 divided by 10 three times at equally spaced
  epochs, 100 epochs, ONE clip norm on the whole per-example gradient (the
  accountant's sensitivity; the paper's code clips each parameter tensor
  separately). One model per epsilon; it answers any number of queries, so its
  accuracy is flat in B. With several ``clip_norms`` the clip is chosen on a
  held-out part of the training set (not accounted, as in the paper).
* Subsample-and-aggregate (App. C.2, Alg. 8): T = 16 teachers trained
  non-privately on disjoint sixteenths of the training set (500 epochs), all
  teachers in ONE jitted step (``lax.map`` over them on a GPU, see
  :func:`make_teachers`); each answer samples a label with
  ``p(y) ∝ exp(beta n_y(x))``, ``beta = max(eps/(2B), beta'')``
  (:func:`jaxdp.prediction.exponential_aggregation_beta`, Thm. 8; the paper's
  code uses twice the eps-DP ``beta``). Accuracy over ``num_seeds`` noise draws.

Data augmentation (random horizontal flip and random crop after 4-pixel
padding; the paper's "random crop resizing") is applied to each example on its
own, with fresh randomness each epoch, so it is part of the per-example
computation and does not change the neighbouring relation.

Writes ``<out_dir>/tradeoffs_fig7/<dataset>/``: ``points.jsonl`` (resumable),
``results.csv``, ``results.json`` and ``fig7.png`` (7a: accuracy vs epsilon at
B = ``budget``; 7b: accuracy vs B at epsilon = ``budget_epsilon``).
"""

from __future__ import annotations

import functools
import os
import pathlib
import pickle
import shutil
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import app
from ml_collections import config_flags
from tqdm import tqdm

from jaxdp import models, results_io
from jaxdp import prediction as jpred
from jaxdp.accounting import PrivacyAccountant
from jaxdp.accounting.dpsgd_accounting import steps_for_epochs
from jaxdp.mechanisms import noise_scale_as
from jaxdp import dpsgd

CONFIG_FILE = pathlib.Path(__file__).resolve().parents[1] / "configs" / "tradeoffs_fig7.py"
# Public per-channel constants of CIFAR-10 (not computed from the private data).
_MEAN = np.array([0.4914, 0.4822, 0.4465], np.float32)
_STD = np.array([0.2470, 0.2435, 0.2616], np.float32)
RESULT_FIELDS = ("dataset", "n_train", "n_test", "validation_fraction", "num_seeds", "seed")


def _from_directory(root: pathlib.Path):
  folder = root / "cifar10" / "cifar-10-batches-py"
  if not folder.is_dir():
    return None

  def read(name):
    with open(folder / name, "rb") as f:
      d = pickle.load(f, encoding="bytes")
    x = np.asarray(d[b"data"], np.uint8).reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    return x, np.asarray(d[b"labels"], np.int32)

  parts = [read(f"data_batch_{i}") for i in range(1, 6)]
  x_test, y_test = read("test_batch")
  return (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]),
          x_test, y_test)


def load_cifar10(config):
  """``(x_train, y_train, x_test, y_test)``, images float32 NHWC normalised per channel."""
  if config.dataset == "random":  # CIFAR-shaped random data (tests, smoke runs)
    rng = np.random.default_rng(config.seed)
    n, m = config.n_train or 256, config.n_test or 64
    xs = rng.integers(0, 256, size=(n + m, 32, 32, 3), dtype=np.uint8)
    ys = rng.integers(0, 10, size=n + m).astype(np.int32)
    raw = (xs[:n], ys[:n], xs[n:], ys[n:])
  elif config.dataset == "cifar10":
    root = config.data_dir or os.environ.get("JAXDP_DATA_DIR", "")
    raw = _from_directory(pathlib.Path(root)) if root else None
    if raw is None:
      import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel
      splits = tfds.as_numpy(tfds.load("cifar10", split=["train", "test"], batch_size=-1,
                                       data_dir=config.tfds_data_dir or None))
      raw = (splits[0]["image"], splits[0]["label"].astype(np.int32),
             splits[1]["image"], splits[1]["label"].astype(np.int32))
  else:
    raise ValueError(f"config.dataset must be 'cifar10' or 'random', got {config.dataset!r}.")
  x_train, y_train, x_test, y_test = raw
  if config.n_train and config.dataset != "random":
    x_train, y_train = x_train[:config.n_train], y_train[:config.n_train]
  if config.n_test and config.dataset != "random":
    x_test, y_test = x_test[:config.n_test], y_test[:config.n_test]
  norm = lambda x: ((np.asarray(x, np.float32) / 255.0) - _MEAN) / _STD
  return norm(x_train), np.asarray(y_train), norm(x_test), np.asarray(y_test)


@jax.jit
def augment(key, x):
  """Random horizontal flip and random 32x32 crop of the 4-pixel zero-padded image, per example."""
  n = x.shape[0]
  k_flip, k_crop = jax.random.split(key)
  flip = jax.random.bernoulli(k_flip, 0.5, (n,))
  x = jnp.where(flip[:, None, None, None], x[:, :, ::-1, :], x)
  padded = jnp.pad(x, ((0, 0), (4, 4), (4, 4), (0, 0)))
  offsets = jax.random.randint(k_crop, (n, 2), 0, 9)
  crop = lambda img, o: jax.lax.dynamic_slice(img, (o[0], o[1], 0), (32, 32, img.shape[-1]))
  return jax.vmap(crop)(padded, offsets)


def _schedule(lr, total_steps):
  """``lr`` divided by 10 three times at equally spaced steps (paper 000 Sec. 4.3)."""
  bounds = {int(total_steps * i / 4): 0.1 for i in (1, 2, 3) if int(total_steps * i / 4) > 0}
  return optax.piecewise_constant_schedule(lr, bounds)


@functools.partial(jax.jit, static_argnames=("model", "batch"))
def _predict(model, params, x, batch=1000):
  """Predicted labels, ``batch`` rows at a time (one compiled ``lax.map``; last batch padded)."""
  n = x.shape[0]
  num = -(-n // batch)
  rows = jnp.pad(jnp.asarray(x), [(0, num * batch - n)] + [(0, 0)] * (x.ndim - 1))
  out = jax.lax.map(lambda xb: jnp.argmax(model.apply({"params": params}, xb), -1),
                    rows.reshape(num, batch, *x.shape[1:]))
  return out.reshape(-1)[:n]


def make_dpsgd_resnet(key, x, y, eps, clip, config, checkpoint_dir=None):
  """ResNet-20 parameters, the wired :class:`~jaxdp.dpsgd.PrivateSGD` and its plan.

  With ``checkpoint_dir`` the plan checkpoints every ``config.dpsgd.checkpoint_every``
  steps (0: once per epoch) and resumes from the directory.
  Returns ``(params, model, private, total_steps, steps_per_epoch, augment_key)``.
  """
  d = config.dpsgd
  model = models.ResNet20()
  k_init, k_run, k_aug = jax.random.split(key, 3)
  params = jax.jit(model.init)(k_init, x[:1])["params"]  # one compile, not one per layer
  loss = dpsgd.make_per_example_loss(lambda p, xb: model.apply({"params": p}, xb))
  batch = min(float(d.expected_batch_size), float(len(y)))
  total = steps_for_epochs(d.epochs, batch / len(y))  # the schedule needs T before make_private
  per_epoch = max(1, round(total / d.epochs))
  every = int(d.get("checkpoint_every", 0)) or per_epoch
  private = dpsgd.make_private(
      loss, l2_clip_norm=clip, num_examples=len(y), key=k_run,
      expected_batch_size=batch, target_epsilon=eps,
      delta=config.delta, epochs=d.epochs, physical_batch_size=d.physical_batch_size or None,
      optimizer=optax.sgd(_schedule(d.learning_rate, total), momentum=d.momentum or None),
      checkpoint_dir=checkpoint_dir, checkpoint_every=every if checkpoint_dir else None)
  return params, model, private, total, per_epoch, k_aug


def train_dpsgd_resnet(key, x, y, eps, clip, config, progress=True, checkpoint_dir=None):
  """One DP-SGD ResNet-20 at ``(eps, config.delta)``; returns ``(params, model, private)``.

  With ``checkpoint_dir`` a killed run started again with the same arguments resumes
  from its newest checkpoint (same batches, same noise; each step paid once).
  Augmentation is drawn per epoch from ``fold_in(augment_key, epoch)``, so a resumed
  epoch sees the same augmented images.
  """
  params, model, private, total, per_epoch, k_aug = make_dpsgd_resnet(
      key, x, y, eps, clip, config, checkpoint_dir)
  accountant = PrivacyAccountant()
  if checkpoint_dir:
    params, state = private.restore(params)
  else:
    state = private.init(params)
  sampler = private.sampler(accountant)
  t = sampler.steps_sampled
  bar = tqdm(total=total, initial=t, desc=f"DP-SGD ε={eps:g} ν={clip:g}", disable=not progress)
  try:
    while t < total:
      epoch = t // per_epoch
      x_epoch = augment(jax.random.fold_in(k_aug, epoch), x) if config.dpsgd.augment else x
      for _ in range(min(per_epoch - t % per_epoch, total - t)):
        batch = sampler.sample().gather(x_epoch, y)
        params, state, _ = private.step(params, state, batch)
        t += 1
        bar.update()
  finally:
    bar.close()
    private.close()  # wait for a pending checkpoint save (also when the loop raised)
  assert private.steps == total and sampler.epsilon() <= eps * (1 + 1e-9)
  return params, model, private


def make_teachers(key, x, y, config):
  """The T teachers' initial state and ONE jitted step that advances all of them.

  Returns ``(step, params, opt_state, total_steps, model)``; ``step(params, opt_state, key)``
  takes one SGD step of every teacher on a batch drawn from its own disjoint part.
  ``config.teachers.batch_mode``: ``"map"`` (``jax.lax.map`` over the teachers inside the
  one jitted step), ``"vmap"``, or ``"auto"`` (default: ``"map"`` on an accelerator,
  ``"vmap"`` on a CPU). Measured with ``benchmarks/cifar_resnet.py``: on an H100, vmapping
  over the teachers' weights turns every convolution into a grouped one and ran 1.87x
  slower than ``lax.map`` (223 vs 119 ms per step of 16 teachers at batch 600); on
  XLA:CPU the convolutions inside ``lax.map``'s loop ran 4.4x slower than the vmapped ones.
  """
  tc = config.teachers
  mode = tc.get("batch_mode", "auto")
  if mode not in ("auto", "map", "vmap"):
    raise ValueError(f"teachers.batch_mode must be 'auto', 'map' or 'vmap', got {mode!r}.")
  if mode == "auto":
    mode = "vmap" if jax.default_backend() == "cpu" else "map"
  t = tc.num_teachers
  n_per = len(y) // t
  perm = np.asarray(jax.random.permutation(jax.random.fold_in(key, 0), len(y)))[:n_per * t]
  xs = jnp.asarray(x[perm].reshape(t, n_per, *x.shape[1:]))
  ys = jnp.asarray(y[perm].reshape(t, n_per))
  model = models.ResNet20()
  params = jax.jit(jax.vmap(lambda k: model.init(k, x[:1])["params"]))(
      jax.random.split(jax.random.fold_in(key, 1), t))
  batch = min(tc.batch_size, n_per)
  steps_per_epoch = max(1, n_per // batch)
  total = int(tc.epochs * steps_per_epoch)
  opt = optax.sgd(_schedule(tc.learning_rate, total), momentum=tc.momentum or None)
  opt_state = jax.jit(jax.vmap(opt.init))(params)

  def loss_fn(p, xb, yb):
    logits = model.apply({"params": p}, xb)
    return optax.softmax_cross_entropy_with_integer_labels(logits, yb).mean()

  @jax.jit
  def step(params, opt_state, k):
    def one(p, s, xt, yt, kt):
      k_idx, k_aug = jax.random.split(kt)
      idx = jax.random.choice(k_idx, n_per, (batch,), replace=False)
      xb = augment(k_aug, xt[idx]) if tc.augment else xt[idx]
      g = jax.grad(loss_fn)(p, xb, yt[idx])
      u, s = opt.update(g, s, p)
      return optax.apply_updates(p, u), s
    keys = jax.random.split(k, t)
    if mode == "vmap":
      return jax.vmap(one)(params, opt_state, xs, ys, keys)
    return jax.lax.map(lambda a: one(*a), (params, opt_state, xs, ys, keys))

  return step, params, opt_state, total, model


def train_teachers(key, x, y, config, progress=True):
  """T non-private ResNet-20 teachers on disjoint parts (one jitted step); returns a vote fn."""
  t = config.teachers.num_teachers
  step, params, opt_state, total, model = make_teachers(key, x, y, config)
  k_steps = jax.random.fold_in(key, 2)
  for i in tqdm(range(total), desc=f"{t} teachers", disable=not progress):
    params, opt_state = step(params, opt_state, jax.random.fold_in(k_steps, i))

  def votes(x_eval):
    preds = jax.vmap(functools.partial(_predict, model), in_axes=(0, None))(params, x_eval)  # (T, M)
    return jax.nn.one_hot(preds, 10, dtype=jnp.int32).sum(0)      # (M, C)
  return votes


@jax.jit
def _aggregation_accuracies(keys, votes, y, beta):
  return jax.vmap(lambda k: jnp.mean(jpred.aggregate_exponential(k, votes, beta) == y))(keys)


def main(config) -> list[dict]:
  start = time.time()
  log, out = results_io.open_point_log(
      config, RESULT_FIELDS, extra_settings=dict(delta=config.delta, dpsgd=config.dpsgd.to_dict(),
                                                 teachers=config.teachers.to_dict()))
  x, y, x_test, y_test = load_cifar10(config)
  root = jax.random.key(config.seed)
  key_for = lambda *tag: jax.random.fold_in(root, results_io.point_seed(tag))
  # A killed run restarted with the same command resumes each DP-SGD model mid-training from
  # here (checkpoints every config.dpsgd.checkpoint_every steps; they hold noise keys: private).
  ckpt = lambda name: str(out / "checkpoints" / name)
  y_test_j = jnp.asarray(y_test)

  # DP-SGD: one model per epsilon (clip chosen on a held-out split when several are given).
  epsilons = sorted(set(float(e) for e in config.epsilons) | {float(config.budget_epsilon)})
  for eps in epsilons:
    point = ("dpsgd", eps)
    if point in log:
      continue
    clips = [float(c) for c in config.dpsgd.clip_norms]
    t0 = time.time()
    val_acc = float("nan")
    if len(clips) > 1:
      n_val = int(round(config.validation_fraction * len(y)))
      perm = np.random.default_rng(config.seed).permutation(len(y))
      vi, fi = perm[:n_val], perm[n_val:]
      scores = []
      for c in clips:
        p, model, _ = train_dpsgd_resnet(key_for("dpsgd", eps, "val", c), x[fi], y[fi], eps, c,
                                         config, checkpoint_dir=ckpt(f"dpsgd_eps{eps:g}_val{c:g}"))
        scores.append(float(jnp.mean(_predict(model, p, x[vi]) == y[vi])))
      val_acc = max(scores)
      clip = clips[int(np.argmax(scores))]
    else:
      clip = clips[0]
    p, model, private = train_dpsgd_resnet(key_for("dpsgd", eps, "test"), x, y, eps, clip, config,
                                           checkpoint_dir=ckpt(f"dpsgd_eps{eps:g}"))
    acc = float(jnp.mean(_predict(model, p, x_test) == y_test_j))
    log.append(point, [dict(method="dpsgd", epsilon=eps, delta=config.delta, clip_norm=clip,
                            noise_multiplier=private.noise_multiplier, steps=private.steps,
                            val_accuracy=val_acc, test_accuracy_mean=acc, test_accuracy_std=0.0,
                            num_draws=1, seconds=time.time() - t0)])
    # The point is logged: its checkpoints (which hold noise keys) are not kept.
    shutil.rmtree(out / "checkpoints", ignore_errors=True)

  # Subsample-and-aggregate: teachers once, then every (eps, B) point from the same votes.
  sa_points = ([("subsample_aggregate", float(e), int(config.budget)) for e in config.epsilons]
               + [("subsample_aggregate", float(config.budget_epsilon), int(b))
                  for b in config.budgets])
  sa_points = list(dict.fromkeys(sa_points))
  if any(p not in log for p in sa_points):
    t0 = time.time()
    votes = train_teachers(key_for("teachers"), x, y, config)(jnp.asarray(x_test))
    teacher_seconds = time.time() - t0
    for p in sa_points:
      if p in log:
        continue
      _, eps, b = p
      beta = noise_scale_as(jpred.exponential_aggregation_beta(eps, config.delta, b), jnp.float32,
                            round_up=False)
      accs = np.asarray(_aggregation_accuracies(
          jax.random.split(key_for(*p), config.num_seeds), votes, y_test_j, beta), np.float64)
      log.append(p, [dict(method="subsample_aggregate", epsilon=eps, delta=config.delta, budget=b,
                          beta=float(beta), num_teachers=config.teachers.num_teachers,
                          test_accuracy_mean=float(accs.mean()),
                          test_accuracy_std=float(accs.std()), num_draws=int(accs.size),
                          teacher_seconds=teacher_seconds)])
  rows = [log.get(("dpsgd", e))[0] for e in epsilons] + [log.get(p)[0] for p in sa_points]
  fields = list(dict.fromkeys(k for r in rows for k in r))
  results_io.write_csv_atomic(out / "results.csv", [{k: r.get(k, "") for k in fields} for r in rows])
  results_io.write_json_atomic(out / "results.json", dict(
      config=config.to_dict(), seconds_this_run=time.time() - start,
      backend=jax.default_backend(), rows=rows))
  plot(rows, config, out / "fig7.png")
  print(f"wrote {out}/results.csv, results.json, fig7.png")
  for r in rows:
    print({k: r[k] for k in ("method", "epsilon", "test_accuracy_mean") if k in r},
          "B=" + str(r.get("budget", "any")))
  return rows


def plot(rows, config, path):
  """Fig. 7a (accuracy vs epsilon at B = budget) and 7b (vs B at epsilon = budget_epsilon)."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

  fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
  dp = sorted((r for r in rows if r["method"] == "dpsgd"), key=lambda r: r["epsilon"])
  eps_set = {float(e) for e in config.epsilons}
  dp_a = [r for r in dp if r["epsilon"] in eps_set]
  a.plot([r["epsilon"] for r in dp_a], [r["test_accuracy_mean"] for r in dp_a], "o-", color="C2",
         label="DP-SGD")
  sa = [r for r in rows if r["method"] == "subsample_aggregate"]
  sa_a = sorted((r for r in sa if r["budget"] == int(config.budget)), key=lambda r: r["epsilon"])
  sa_a = [r for r in sa_a if r["epsilon"] in eps_set]
  for ax, rs, xk in ((a, sa_a, "epsilon"),
                     (b, sorted((r for r in sa if r["epsilon"] == float(config.budget_epsilon)),
                                key=lambda r: r["budget"]), "budget")):
    xs = np.array([r[xk] for r in rs], float)
    m = np.array([r["test_accuracy_mean"] for r in rs])
    s = np.array([r["test_accuracy_std"] for r in rs])
    ax.plot(xs, m, "o-", color="C4", label=f"subsample-and-aggregate (T = "
            f"{config.teachers.num_teachers})")
    ax.fill_between(xs, m - s, m + s, color="C4", alpha=0.15)
  flat = [r for r in dp if r["epsilon"] == float(config.budget_epsilon)]
  if flat:
    b.axhline(flat[0]["test_accuracy_mean"], color="C2", ls="--", label="DP-SGD (any B)")
  a.set_xlabel("privacy loss ε")
  a.set_title(f"{config.dataset} ResNet-20 (GN): δ = {config.delta:g}, B = {config.budget}",
              fontsize=10)
  b.set_xlabel("inference budget B")
  b.set_title(f"ε = {config.budget_epsilon:g}, δ = {config.delta:g}", fontsize=10)
  for ax in (a, b):
    ax.set_xscale("log")
    ax.set_ylabel("test accuracy")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
  fig.text(0.5, 0.005, "Paper 000 Fig. 7. DP-SGD: one model per ε. Subsample-and-aggregate: "
           f"mean ± 1 s.d. over {config.num_seeds} noise draws from the same teachers.",
           ha="center", va="bottom", fontsize=7)
  fig.tight_layout(rect=(0, 0.04, 1, 1))
  fig.savefig(path, dpi=120)
  plt.close(fig)


if __name__ == "__main__":
  _CONFIG = config_flags.DEFINE_config_file("config", str(CONFIG_FILE), "experiment config")
  app.run(lambda argv: main(_CONFIG.value) and None)
