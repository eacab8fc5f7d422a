"""Private prediction on MNIST: vmapped teachers vs a Python loop, and predictor throughput.

1. Train T linear softmax teachers on disjoint parts of MNIST (paper 000
   Section 4.1 uses T = 256) in ONE vmapped L-BFGS call
   (``jaxdp.prediction.train_linear_teachers``), and with a Python loop of
   single (jitted, already compiled) ``fit_linear`` calls. In ``--quick`` mode
   the loop fits only ``--loop-teachers`` teachers and its time for T teachers
   is EXTRAPOLATED linearly (labelled so in the output).
2. Queries per second of each budget-enforcing predictor (prediction
   sensitivity with L2-Laplace and Gaussian noise, subsample-and-aggregate,
   LNMax and GNMax), for batches of queries and for single queries (the
   latter includes per-call host work: validation, budget bookkeeping).
   Test accuracy at (eps, delta) = (1, 0) or (1, 1e-5) with B = 100 is
   printed for information (paper 000 Figure 1 setting).

Inputs are PCA-reduced (``--pca``, default 50 in ``--quick``) and projected
into the unit L2 ball. Usage::

  JAXDP_DATA_DIR=/path/to/shared/data python benchmarks/prediction.py [--quick]

The LAST line printed is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import numpy as np

from jaxdp import data as jdata
from jaxdp.prediction import predictor as pr
from jaxdp.prediction import subsample_aggregate as sa
from jaxdp.training import linear


def _block(x):
  return jax.block_until_ready(x)


def _timed(fn):
  t0 = time.perf_counter()
  out = _block(fn())
  return out, time.perf_counter() - t0


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true")
  parser.add_argument("--teachers", type=int, default=256)
  parser.add_argument("--loop-teachers", type=int, default=None,
                      help="teachers fitted in the Python loop (default: 16 quick, all otherwise)")
  parser.add_argument("--pca", type=int, default=None, help="PCA dimension (0 = raw 784)")
  parser.add_argument("--train", type=int, default=None, help="training examples (default 60000)")
  parser.add_argument("--l2-reg", type=float, default=1e-3)
  parser.add_argument("--max-iter", type=int, default=None)
  parser.add_argument("--query-batch", type=int, default=1000)
  parser.add_argument("--data-dir", type=str, default=None)
  args = parser.parse_args()
  pca_dim = args.pca if args.pca is not None else (50 if args.quick else 0)
  loop_teachers = args.loop_teachers or (16 if args.quick else args.teachers)
  loop_teachers = min(loop_teachers, args.teachers)
  max_iter = args.max_iter or (100 if args.quick else 500)
  num_train = args.train or 60000

  ds = jdata.load_mnist(args.data_dir)
  x_train, y_train = ds.x_train[:num_train], ds.y_train[:num_train]
  x_test, y_test = ds.x_test, ds.y_test
  if pca_dim:
    pca = jdata.fit_pca(x_train, pca_dim)
    x_train, x_test = pca.transform(x_train), pca.transform(x_test)
  x_train, x_test = jdata.normalize_train_test(x_train, x_test, "project")
  x_train, x_test = np.asarray(x_train, np.float32), np.asarray(x_test, np.float32)
  dim, num_classes, t = x_train.shape[1], 10, args.teachers
  print(f"device={jax.devices()[0].platform} N={len(x_train)} D={dim} T={t} "
        f"part={len(x_train) // t} max_iter={max_iter}")

  # -- 1. teachers: one vmapped call vs a loop --------------------------------
  key = jax.random.key(0)
  xs, ys = sa.partition_dataset(x_train, y_train, t, key)
  fit_kw = dict(num_classes=num_classes, l2_reg=args.l2_reg, max_iter=max_iter, tol=1e-5)
  teachers, vmap_first = _timed(lambda: linear.fit_linear_batched(xs, ys, **fit_kw))
  teachers, vmap_time = _timed(lambda: linear.fit_linear_batched(xs, ys, **fit_kw))
  _, loop_compile = _timed(lambda: linear.fit_linear(xs[0], ys[0], **fit_kw))
  t0 = time.perf_counter()
  loop_weights = []
  for i in range(loop_teachers):
    loop_weights.append(_block(linear.fit_linear(xs[i], ys[i], **fit_kw).weights))
  loop_time_measured = time.perf_counter() - t0
  loop_time_t = loop_time_measured * t / loop_teachers
  max_diff = float(max(np.max(np.abs(np.asarray(teachers.weights[i]) - np.asarray(w)))
                       for i, w in enumerate(loop_weights)))
  speedup = loop_time_t / vmap_time
  label = "extrapolated" if loop_teachers < t else "measured"
  print(f"teachers: vmapped {vmap_time:.3f}s (first call incl. compile {vmap_first:.3f}s); "
        f"loop {loop_time_measured:.3f}s for {loop_teachers} -> {loop_time_t:.3f}s for {t} "
        f"({label}); loop/vmapped = {speedup:.1f}x; max |w_vmap - w_loop| = {max_diff:.2e}")
  iters = np.asarray(teachers.info.num_iter)
  print(f"L-BFGS iterations per teacher: mean {iters.mean():.1f}, max {iters.max()} (a vmapped "
        "while_loop runs until the slowest teacher converges; on CPU a batched step costs about T "
        "single steps, so the loop can win there, while accelerators batch the T steps)")
  votes_test = np.asarray(sa.linear_teacher_votes(teachers.weights, x_test))
  plurality_acc = float(np.mean(np.argmax(votes_test, axis=1) == y_test))
  single_teacher_acc = float(np.mean(
      np.argmax(x_test @ np.asarray(teachers.weights[0]), axis=1) == y_test))
  print(f"teacher ensemble plurality test accuracy {plurality_acc:.4f} "
        f"(one teacher {single_teacher_acc:.4f})")

  # -- 2. predictors ---------------------------------------------------------
  full = linear.fit_linear(x_train, y_train, num_classes=num_classes, l2_reg=args.l2_reg,
                           max_iter=max_iter, tol=1e-6)
  eps, delta, budget = 1.0, 1e-5, 100
  big_budget = 10**7  # for throughput only (calibration covers it)

  def make(kind, b, dlt):
    k = jax.random.key(1)
    if kind == "ps_l2_laplace":
      return pr.PredictionSensitivityPredictor.from_weights(
          full.weights, num_examples=len(x_train), l2_reg=args.l2_reg, epsilon=eps, delta=0.0,
          budget=b, key=k)
    if kind == "ps_gaussian":
      return pr.PredictionSensitivityPredictor.from_weights(
          full.weights, num_examples=len(x_train), l2_reg=args.l2_reg, epsilon=eps, delta=dlt,
          budget=b, key=k, method="exact_gaussian_composition")
    if kind == "subsample_aggregate":
      return pr.SubsampleAggregatePredictor.from_linear_teachers(
          teachers.weights, epsilon=eps, delta=0.0, budget=b, key=k)
    mech = kind
    return pr.NoisyMaxPredictor.from_linear_teachers(
        teachers.weights, mechanism=mech, epsilon=eps, delta=dlt if mech == "gnmax" else 0.0,
        budget=b, key=k)

  results = {}
  q = args.query_batch
  xq = np.tile(x_test, (max(1, q // len(x_test) + 1), 1))[:q]
  for kind in ["ps_l2_laplace", "ps_gaussian", "subsample_aggregate", "lnmax", "gnmax"]:
    p = make(kind, big_budget, delta)
    _block(p.predict(xq))  # compile
    batch_time = min(_timed(lambda: p.predict(xq))[1] for _ in range(3))
    _block(p.predict(xq[:1]))
    singles = 50 if args.quick else 200
    t0 = time.perf_counter()
    for i in range(singles):
      _block(p.predict(xq[i:i + 1]))
    single_qps = singles / (time.perf_counter() - t0)
    # Accuracy at the paper's setting: B = 100 queries (of the test set).
    acc_p = make(kind, budget, delta)
    ans = np.asarray(acc_p.predict(x_test[:budget]))
    labels = ans if ans.ndim == 1 else np.argmax(ans, axis=1)
    acc = float(np.mean(labels == y_test[:budget]))
    results[kind] = dict(batch_qps=q / batch_time, single_qps=single_qps,
                         accuracy_b100=acc, epsilon=eps, delta=acc_p.delta)
    print(f"{kind:>20}: {q / batch_time:12.0f} queries/s (batches of {q}), "
          f"{single_qps:8.1f} queries/s (single), accuracy@B=100 {acc:.2f} "
          f"(eps={eps}, delta={acc_p.delta})")
  base = results["ps_l2_laplace"]["batch_qps"]
  for kind, r in results.items():
    print(f"batch throughput relative to ps_l2_laplace: {kind} {r['batch_qps'] / base:.2f}x")

  print(json.dumps(dict(
      benchmark="prediction", quick=args.quick, device=jax.devices()[0].platform,
      num_train=len(x_train), dim=dim, teachers=t, max_iter=max_iter,
      vmapped_seconds=vmap_time, vmapped_first_call_seconds=vmap_first,
      loop_teachers_fitted=loop_teachers, loop_seconds_measured=loop_time_measured,
      loop_seconds_for_all_teachers=loop_time_t, loop_time_is=label,
      loop_single_compile_seconds=loop_compile, loop_over_vmapped=speedup,
      max_weight_diff=max_diff, teacher_iters_mean=float(iters.mean()),
      teacher_iters_max=int(iters.max()), plurality_test_accuracy=plurality_acc,
      single_teacher_test_accuracy=single_teacher_acc, predictors=results)))


if __name__ == "__main__":
  main()
