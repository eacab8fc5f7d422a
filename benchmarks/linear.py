"""Private linear models on MNIST: jitted L-BFGS vs scipy, batched private fits, accuracy table.

Three measurements, all from one run (paper 000 = ``../shared/papers/000_tradeoffs_of_private_prediction.md``,
Sec. 4.1-4.2):

1. **Solver.** One regularised softmax fit (``(1/N) sum l + (lambda/2)||W||^2``,
   rows in the unit ball) with jaxdp's jitted ``optax.lbfgs`` + zoom line search
   vs ``scipy.optimize.minimize(method="L-BFGS-B")`` on the *same* objective
   (float64 numpy value and gradient) and the *same* stopping rule
   (``||grad||_2 <= tol``, checked in a callback). Wall time ratio and the final
   objective of each (both evaluated in float64).
2. **100 loss-perturbation fits** (paper 000 Alg. 4, eps = 1): one batched jaxdp
   call (``batch_mode="vmap"`` and ``"map"``) vs 100 sequential jaxdp calls vs
   100 scipy fits of the same perturbed objectives (same noise draws).
3. **Accuracy table** on the MNIST test set: non-private, model sensitivity
   (Alg. 1/3) and loss perturbation (Alg. 4/5) at eps in {0.1, 1, 10},
   delta in {0, 1e-5}; lambda chosen on a held-out 10% of the training set.

``--quick`` (about two minutes on two CPU cores): N = 10,000 training images,
PCA to D = 50 for parts 2-3, scipy timed on 10 of the 100 perturbed objectives
(total extrapolated x10, labelled), 3 noise draws and 3 lambdas in the table. Needs ``$JAXDP_DATA_DIR``
(``shared/data``); without it the sklearn ``digits`` set is used and the JSON
says so. The LAST printed line is one JSON object with every figure.

Usage: python benchmarks/linear.py [--quick] [--dataset mnist|digits]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import scipy.optimize
from scipy.special import logsumexp

from jaxdp.results_io import strict_json
from jaxdp import data as jdata
from jaxdp.mechanisms import l2_laplace_noise
from jaxdp.training import linear, objective_perturbation, output_perturbation


def _np_objective(w_flat, x, y_onehot, lam, b_over_n=None, extra=0.0):
  """float64 value and gradient of mean softmax CE + (lam+extra)/2 ||W||^2 + <b/N, W>."""
  d, c = x.shape[1], y_onehot.shape[1]
  w = w_flat.reshape(d, c)
  logits = x @ w
  lse = logsumexp(logits, axis=1)
  value = np.mean(lse - np.sum(y_onehot * logits, axis=1)) + 0.5 * (lam + extra) * np.sum(w * w)
  p = np.exp(logits - lse[:, None])
  grad = x.T @ (p - y_onehot) / x.shape[0] + (lam + extra) * w
  if b_over_n is not None:
    value += np.sum(b_over_n * w)
    grad = grad + b_over_n
  return value, grad.reshape(-1)


def scipy_fit(x, y_onehot, lam, tol, b_over_n=None, extra=0.0, max_iter=500):
  """scipy L-BFGS-B stopped at ||grad||_2 <= tol (the jaxdp rule). Returns (w, value, gnorm, iters)."""
  cache = {}

  def fun(w):
    v, g = _np_objective(w, x, y_onehot, lam, b_over_n, extra)
    cache["x"], cache["g"] = w.copy(), g
    return v, g

  def callback(intermediate_result):
    xk = intermediate_result.x
    g = cache["g"] if np.array_equal(cache.get("x"), xk) else fun(xk)[1]
    if np.linalg.norm(g) <= tol:
      raise StopIteration

  w0 = np.zeros(x.shape[1] * y_onehot.shape[1])
  res = scipy.optimize.minimize(fun, w0, jac=True, method="L-BFGS-B", callback=callback,
                                options=dict(maxiter=max_iter, gtol=0.0, ftol=0.0, maxcor=10))
  v, g = _np_objective(res.x, x, y_onehot, lam, b_over_n, extra)
  return res.x, v, float(np.linalg.norm(g)), int(res.nit)


def _load(name, quick, data_dir):
  n_train = 10_000 if quick and name == "mnist" else None  # digits has only 1,797 examples
  return jdata.load(name, data_dir=data_dir, n_train=n_train, seed=0, unit_ball="project")


def _pca(ds, dims):
  pca = jdata.fit_pca(ds.x_train, dims)
  xt, xs = jdata.normalize_train_test(pca(ds.x_train), pca(ds.x_test))
  return xt.astype(np.float32), xs.astype(np.float32)


def bench_solver(x, y, c, lam, tol):
  onehot = np.eye(c)[y]
  x64 = x.astype(np.float64)
  fit = lambda: linear.fit_linear(x, y, num_classes=c, l2_reg=lam, tol=tol)
  t0 = time.perf_counter()
  jax.block_until_ready(fit().weights)
  compile_s = time.perf_counter() - t0
  t0 = time.perf_counter()
  model = fit()
  jax.block_until_ready(model.weights)
  jax_s = time.perf_counter() - t0
  t0 = time.perf_counter()
  _, sp_value, sp_gnorm, sp_iters = scipy_fit(x64, onehot, lam, tol)
  scipy_s = time.perf_counter() - t0
  jax_value, jax_g = _np_objective(np.asarray(model.weights, np.float64).reshape(-1), x64, onehot, lam)
  return dict(n=int(x.shape[0]), d=int(x.shape[1]), c=int(c), l2_reg=lam, tol=tol,
              jaxdp_seconds=jax_s, jaxdp_compile_seconds=compile_s, scipy_seconds=scipy_s,
              scipy_over_jaxdp_time=scipy_s / jax_s, jaxdp_objective=float(jax_value),
              scipy_objective=float(sp_value),
              objective_rel_diff=float(abs(jax_value - sp_value) / abs(sp_value)),
              jaxdp_iters=int(model.info.num_iter), scipy_iters=sp_iters,
              jaxdp_grad_norm_f64=float(np.linalg.norm(jax_g)), scipy_grad_norm=sp_gnorm,
              jaxdp_converged=bool(model.info.converged))


def bench_batched(x, y, c, lam, tol, num_fits, num_scipy_fits, eps=1.0):
  n = x.shape[0]
  keys = jax.random.split(jax.random.key(0), num_fits)
  out = {"num_fits": num_fits, "n": int(n), "d": int(x.shape[1]), "epsilon": eps}
  for mode in ("vmap", "map"):
    run = lambda: objective_perturbation.loss_perturbation(
        keys, x, y, num_classes=c, epsilon=eps, l2_reg=lam, tol=tol, batch_mode=mode)
    t0 = time.perf_counter()
    jax.block_until_ready(run().weights)
    out[f"batched_{mode}_compile_seconds"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    res = run()
    jax.block_until_ready(res.weights)
    out[f"batched_{mode}_seconds"] = time.perf_counter() - t0
  single = lambda k: objective_perturbation.loss_perturbation(
      k, x, y, num_classes=c, epsilon=eps, l2_reg=lam, tol=tol)
  jax.block_until_ready(single(keys[0]).weights)  # compile
  t0 = time.perf_counter()
  seq = [single(k).weights for k in keys]
  jax.block_until_ready(seq)
  out["sequential_jaxdp_seconds"] = time.perf_counter() - t0
  # scipy on the same perturbed objectives: regenerate the same noise draws.
  cal = res.calibration
  d = x.shape[1]
  noise = jax.vmap(lambda k: l2_laplace_noise(k, (d, c), cal.scale))(keys)
  onehot, x64 = np.eye(c)[y], x.astype(np.float64)
  t0 = time.perf_counter()
  sp_w, sp_iters, sp_gn = [], [], []
  for i in range(num_scipy_fits):
    w, _, gn, it = scipy_fit(x64, onehot, lam, tol, np.asarray(noise[i], np.float64) / n,
                             cal.extra_l2)
    sp_w.append(w.reshape(d, c))
    sp_iters.append(it)
    sp_gn.append(gn)
  measured = time.perf_counter() - t0
  out["scipy_fits_measured"] = num_scipy_fits
  out["scipy_mean_iters"] = float(np.mean(sp_iters))
  out["scipy_max_grad_norm"] = float(np.max(sp_gn))
  out["jaxdp_mean_iters"] = float(np.mean(np.asarray(res.info.num_iter)))
  out["jaxdp_max_grad_norm"] = float(np.max(np.asarray(res.info.grad_norm)))
  out["scipy_measured_seconds"] = measured
  # Total for num_fits scipy fits (measured directly when num_scipy_fits == num_fits).
  out["scipy_seconds"] = measured * num_fits / num_scipy_fits
  diff = np.max(np.abs(np.stack(sp_w) - np.asarray(res.weights[:num_scipy_fits], np.float64)))
  out["max_abs_weight_diff_vs_scipy"] = float(diff)
  out["sequential_over_vmap"] = out["sequential_jaxdp_seconds"] / out["batched_vmap_seconds"]
  out["sequential_over_map"] = out["sequential_jaxdp_seconds"] / out["batched_map_seconds"]
  out["scipy_over_best_batched"] = out["scipy_seconds"] / min(out["batched_vmap_seconds"],
                                                             out["batched_map_seconds"])
  return out


def accuracy_table(x, y, x_test, y_test, c, lambdas, num_seeds, tol):
  rng = np.random.default_rng(0)
  perm = rng.permutation(len(y))
  n_val = len(y) // 10
  xv, yv, xf, yf = x[perm[:n_val]], y[perm[:n_val]], x[perm[n_val:]], y[perm[n_val:]]
  acc = jax.jit(jax.vmap(lambda w, xs, ys: jnp.mean(jnp.argmax(xs @ w, -1) == ys),
                         in_axes=(0, None, None)))

  def models(method, keys, xs, ys, lam, eps, delta):
    if method == "non_private":
      return linear.fit_linear(xs, ys, num_classes=c, l2_reg=lam, tol=tol).weights[None]
    if method == "model_sensitivity":
      return output_perturbation.model_sensitivity(keys, xs, ys, num_classes=c, l2_reg=lam,
                                                   epsilon=eps, delta=delta, tol=tol).weights
    return objective_perturbation.loss_perturbation(keys, xs, ys, num_classes=c, l2_reg=lam,
                                                    epsilon=eps, delta=delta, tol=tol).weights

  rows = []
  settings = [("non_private", math.inf, 0.0)] + [
      (m, e, d) for m in ("model_sensitivity", "loss_perturbation") for d in (0.0, 1e-5)
      for e in (0.1, 1.0, 10.0)]
  root = jax.random.key(1)
  for j, (method, eps, delta) in enumerate(settings):
    k_sel, k_test = jax.random.split(jax.random.fold_in(root, j))
    scores = []
    for i, lam in enumerate(lambdas):
      w = models(method, jax.random.split(jax.random.fold_in(k_sel, i), num_seeds), xf, yf, lam, eps,
                 delta)
      scores.append(float(jnp.mean(acc(w, xv, yv))))
    lam = lambdas[int(np.argmax(scores))]
    a = np.asarray(acc(models(method, jax.random.split(k_test, num_seeds), x, y, lam, eps, delta),
                       x_test, y_test))
    rows.append(dict(method=method, epsilon=eps, delta=delta, l2_reg=lam,
                     accuracy_mean=float(a.mean()), accuracy_std=float(a.std())))
  return rows


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--quick", action="store_true")
  parser.add_argument("--dataset", default=None, help="mnist (default if $JAXDP_DATA_DIR) or digits")
  args = parser.parse_args()
  data_dir = os.environ.get("JAXDP_DATA_DIR")
  name = args.dataset or ("mnist" if data_dir else "digits")
  ds = _load(name, args.quick, data_dir)
  x, y, c = ds.x_train, ds.y_train, ds.num_classes
  tol = 1e-6
  print(f"backend={jax.default_backend()} dataset={name} x_train={x.shape} x_test={ds.x_test.shape}")

  solver = bench_solver(x, y, c, lam=1e-4, tol=tol)
  print(f"[solver] N={solver['n']} D={solver['d']}: jaxdp {solver['jaxdp_seconds']:.2f}s "
        f"({solver['jaxdp_iters']} it, compile {solver['jaxdp_compile_seconds']:.1f}s) vs scipy "
        f"{solver['scipy_seconds']:.2f}s ({solver['scipy_iters']} it): scipy/jaxdp time ratio "
        f"{solver['scipy_over_jaxdp_time']:.2f}; objective jaxdp {solver['jaxdp_objective']:.8f} "
        f"scipy {solver['scipy_objective']:.8f} (rel diff {solver['objective_rel_diff']:.1e})")

  dims = 50 if args.quick else None
  if dims and x.shape[1] > dims:
    xr, xr_test = _pca(ds, dims)
  else:
    xr, xr_test = x, ds.x_test
  num_fits = 100
  batched = bench_batched(xr, y, c, lam=1e-4, tol=tol, num_fits=num_fits,
                          num_scipy_fits=10 if args.quick else num_fits)
  print(f"[{num_fits} loss-perturbation fits, N={batched['n']} D={batched['d']}] vmap "
        f"{batched['batched_vmap_seconds']:.2f}s, map {batched['batched_map_seconds']:.2f}s, "
        f"sequential jaxdp {batched['sequential_jaxdp_seconds']:.2f}s, scipy "
        f"{batched['scipy_seconds']:.2f}s (from {batched['scipy_fits_measured']} timed fits); "
        f"sequential/vmap {batched['sequential_over_vmap']:.2f}, "
        f"sequential/map {batched['sequential_over_map']:.2f}, scipy/best-batched "
        f"{batched['scipy_over_best_batched']:.2f}; max |W_jaxdp - W_scipy| "
        f"{batched['max_abs_weight_diff_vs_scipy']:.1e}; mean iterations jaxdp "
        f"{batched['jaxdp_mean_iters']:.0f} scipy {batched['scipy_mean_iters']:.0f}")

  lambdas = (1e-4, 1e-3, 1e-2) if args.quick else (1e-5, 1e-4, 1e-3, 1e-2, 1e-1)
  seeds = 3 if args.quick else 20
  t0 = time.perf_counter()
  table = accuracy_table(xr, y, xr_test, ds.y_test, c, lambdas, seeds, tol)
  table_s = time.perf_counter() - t0
  print(f"[accuracy, N={xr.shape[0]} D={xr.shape[1]}, {seeds} draws, {table_s:.0f}s]")
  print("| method | epsilon | delta | lambda | test accuracy |")
  print("| --- | --- | --- | --- | --- |")
  for r in table:
    print(f"| {r['method']} | {r['epsilon']:g} | {r['delta']:g} | {r['l2_reg']:g} | "
          f"{r['accuracy_mean']:.4f} +- {r['accuracy_std']:.4f} |")
  print(json.dumps(strict_json(dict(benchmark="linear", quick=args.quick, dataset=name,
                        backend=jax.default_backend(), solver=solver, batched_fits=batched,
                        accuracy_table=dict(n_train=int(xr.shape[0]), dims=int(xr.shape[1]),
                                            num_seeds=seeds, seconds=table_s, rows=table)))))


if __name__ == "__main__":
  main()
