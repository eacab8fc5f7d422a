"""Private linear models on MNIST: jitted L-BFGS vs scipy, batched private fits, accuracy table.

Four measurements, all from one run (paper 000 = ``../shared/papers/000_tradeoffs_of_private_prediction.md``,
Sec. 4.1-4.2):

1. **Solver.** One regularised softmax fit (``(1/N) sum l + (lambda/2)||W||^2``,
   rows in the unit ball) with jaxdp's default solver (``glm_solver.minimize_glm``,
   float32) and the previous ``optax.lbfgs`` path (``solver="lbfgs"``, full run
   only) vs ``scipy.optimize.minimize(method="L-BFGS-B")`` (float64) on the *same*
   objective with ``X`` stored as CSR (the strongest scipy baseline: MNIST is ~19%
   non-zero) and dense, *same* stopping rule (``||grad||_2 <= tol``, checked in a
   callback). Wall-time ratios and the final objectives (all evaluated in float64).
2. **First call vs warm call** of ``fit_linear`` in fresh subprocesses: no
   persistent cache, cache cold (being filled) and cache warm
   (:func:`jaxdp.enable_compilation_cache`).
3. **100 loss-perturbation fits** (paper 000 Alg. 4, eps = 1; including the
   float64 certificate and AMP output noise): one batched jaxdp call
   (``batch_mode="vmap"`` and ``"map"``; ``--quick`` on a CPU: ``"map"`` only, what
   ``"auto"`` picks there) vs 100 sequential jaxdp calls vs
   100 sequential scipy fits (CSR and dense ``X``) of the same perturbed objectives
   (same noise draws).
4. **Accuracy table** on the MNIST test set: non-private, model sensitivity
   (Alg. 1/3) and loss perturbation (Alg. 4/5) at eps in {0.1, 1, 10},
   delta in {0, 1e-5}; lambda chosen on a held-out 10% of the training set.

Part 3 always uses MNIST-PCA-50 on N = 10,000 training images.
``--quick`` (about two minutes on two idle CPU cores): N = 10,000 training images
for every part, PCA to D = 50 for parts 3-4, scipy timed on 10 of the 100 perturbed objectives
(total extrapolated x10, labelled), 3 noise draws and 3 lambdas in the table. Needs ``$JAXDP_DATA_DIR``
(``shared/data``); without it the sklearn ``digits`` set is used and the JSON
says so. The LAST printed line is one JSON object with every figure.

Usage: python benchmarks/linear.py [--quick] [--dataset mnist|digits] [--no-accuracy]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import subprocess
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import scipy.optimize
import scipy.sparse
from scipy.special import logsumexp

import jaxdp
from jaxdp.results_io import strict_json
from jaxdp import data as jdata
from jaxdp.mechanisms import l2_laplace_noise, noise_scale_as
from jaxdp.training import certified_solve, linear, objective_perturbation, output_perturbation


def _np_objective(w_flat, x, y_onehot, lam, b_over_n=None, extra=0.0):
  """float64 value and gradient of mean softmax CE + (lam+extra)/2 ||W||^2 + <b/N, W>."""
  d, c = x.shape[1], y_onehot.shape[1]
  w = w_flat.reshape(d, c)
  logits = np.asarray(x @ w)  # x dense or scipy.sparse CSR
  lse = logsumexp(logits, axis=1)
  value = np.mean(lse - np.sum(y_onehot * logits, axis=1)) + 0.5 * (lam + extra) * np.sum(w * w)
  p = np.exp(logits - lse[:, None])
  grad = np.asarray(x.T @ (p - y_onehot)) / x.shape[0] + (lam + extra) * w
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


def bench_solver(x, y, c, lam, tol, with_optax):
  onehot = np.eye(c)[y]
  x64 = x.astype(np.float64)
  x_csr = scipy.sparse.csr_matrix(x64)
  out = dict(n=int(x.shape[0]), d=int(x.shape[1]), c=int(c), l2_reg=lam, tol=tol,
             density=float(x_csr.nnz / x64.size))
  solvers = ("glm", "lbfgs") if with_optax else ("glm",)
  for solver in solvers:
    fit = lambda: linear.fit_linear(x, y, num_classes=c, l2_reg=lam, tol=tol, solver=solver)
    t0 = time.perf_counter()
    jax.block_until_ready(fit().weights)
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    model = fit()
    jax.block_until_ready(model.weights)
    warm = time.perf_counter() - t0
    value, g = _np_objective(np.asarray(model.weights, np.float64).reshape(-1), x64, onehot, lam)
    tag = "jaxdp" if solver == "glm" else "jaxdp_optax_lbfgs"
    out.update({f"{tag}_seconds": warm, f"{tag}_first_call_seconds": first,
                f"{tag}_iters": int(model.info.num_iter), f"{tag}_objective": float(value),
                f"{tag}_grad_norm_f64": float(np.linalg.norm(g)),
                f"{tag}_converged": bool(model.info.converged)})
  for name, xs in (("scipy_csr", x_csr), ("scipy_dense", x64)):
    t0 = time.perf_counter()
    _, sp_value, sp_gnorm, sp_iters = scipy_fit(xs, onehot, lam, tol)
    out[f"{name}_seconds"] = time.perf_counter() - t0
    out.update({f"{name}_objective": float(sp_value), f"{name}_grad_norm": sp_gnorm,
                f"{name}_iters": sp_iters})
  out["scipy_csr_over_jaxdp_time"] = out["scipy_csr_seconds"] / out["jaxdp_seconds"]
  out["scipy_dense_over_jaxdp_time"] = out["scipy_dense_seconds"] / out["jaxdp_seconds"]
  if with_optax:
    out["optax_lbfgs_over_jaxdp_time"] = out["jaxdp_optax_lbfgs_seconds"] / out["jaxdp_seconds"]
  out["objective_jaxdp_minus_scipy_csr"] = out["jaxdp_objective"] - out["scipy_csr_objective"]
  return out


def _first_call_child(args):
  """Subprocess body: time the first and the second ``fit_linear`` call (fresh process)."""
  if args.first_call_child != "none":
    jaxdp.enable_compilation_cache(args.first_call_child)
  ds = _load(args.dataset, args.quick, os.environ.get("JAXDP_DATA_DIR"))
  fit = lambda: linear.fit_linear(ds.x_train, ds.y_train, num_classes=ds.num_classes, l2_reg=1e-4,
                                  tol=1e-6)
  t0 = time.perf_counter()
  jax.block_until_ready(fit().weights)
  first = time.perf_counter() - t0
  t0 = time.perf_counter()
  jax.block_until_ready(fit().weights)
  print(json.dumps(dict(first=first, warm=time.perf_counter() - t0)))


def bench_first_call(name, quick):
  """First vs warm call in fresh processes: no cache, cache being filled, cache warm."""
  out = {}
  with tempfile.TemporaryDirectory() as cache:
    for tag, arg in (("no_cache", "none"), ("cache_cold", cache), ("cache_warm", cache)):
      cmd = [sys.executable, os.path.abspath(__file__), "--dataset", name,
             "--first-call-child", arg] + (["--quick"] if quick else [])
      res = subprocess.run(cmd, capture_output=True, text=True, check=True)
      r = json.loads(res.stdout.strip().splitlines()[-1])
      out[f"{tag}_first_seconds"], out[f"{tag}_warm_seconds"] = r["first"], r["warm"]
      out[f"{tag}_first_minus_warm"] = r["first"] - r["warm"]
  return out


def bench_batched(x, y, c, lam, tol, num_fits, num_scipy_fits, eps=1.0, modes=("vmap", "map")):
  n = x.shape[0]
  keys = jax.random.split(jax.random.key(0), num_fits)
  out = {"num_fits": num_fits, "n": int(n), "d": int(x.shape[1]), "epsilon": eps}
  for mode in modes:
    run = lambda: objective_perturbation.loss_perturbation(
        keys, x, y, num_classes=c, epsilon=eps, l2_reg=lam, tol=tol, batch_mode=mode,
        return_nonprivate_diagnostics=True)  # benchmark on public data: solver diagnostics
    t0 = time.perf_counter()
    jax.block_until_ready(run().weights)
    out[f"batched_{mode}_compile_seconds"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    res = run()
    jax.block_until_ready(res.weights)
    out[f"batched_{mode}_seconds"] = time.perf_counter() - t0
    out[f"batched_{mode}_certify_route_counts"] = np.bincount(
        np.asarray(res.nonprivate_info.certificate.route), minlength=3).tolist()
  single = lambda k: objective_perturbation.loss_perturbation(
      k, x, y, num_classes=c, epsilon=eps, l2_reg=lam, tol=tol)
  jax.block_until_ready(single(keys[0]).weights)  # compile
  t0 = time.perf_counter()
  seq = [single(k).weights for k in keys[:num_scipy_fits]]
  jax.block_until_ready(seq)
  out["sequential_jaxdp_seconds"] = (time.perf_counter() - t0) * num_fits / num_scipy_fits
  # scipy on the same perturbed objectives: regenerate the same noise draws (delta = 0: L2-Laplace).
  cal = res.calibration.objective
  d = x.shape[1]
  obj_keys = jax.vmap(jax.random.split)(keys)[:, 0]  # loss_perturbation's objective keys
  beta = noise_scale_as(cal.scale, jnp.float32, round_up=False)
  noise = np.asarray(jax.vmap(lambda k: l2_laplace_noise(k, (d, c), beta, jnp.float32))(obj_keys),
                     np.float64)
  # Host-side float64 certificate of the 100 fits alone (part of the batched times above).
  cert_w = np.asarray(res.nonprivate_info.certificate.weights)
  t0 = time.perf_counter()
  cert = certified_solve.certify_minimizers(
      cert_w, x, y, loss="softmax", h=0.5, l2_total=res.calibration.strong_convexity,
      tol=res.calibration.tol, linear_term=noise / n, batched=True, polish=False)
  out["certificate_seconds_100_fits"] = time.perf_counter() - t0
  out["certificate_all_route0"] = bool(np.all(np.asarray(cert.route) == 0))
  onehot, x64 = np.eye(c)[y], x.astype(np.float64)
  out["scipy_fits_measured"] = num_scipy_fits
  for name, xs in (("scipy_csr", scipy.sparse.csr_matrix(x64)), ("scipy_dense", x64)):
    t0 = time.perf_counter()
    sp_w, sp_iters, sp_gn = [], [], []
    for i in range(num_scipy_fits):
      w, _, gn, it = scipy_fit(xs, onehot, lam, tol, noise[i] / n, cal.extra_l2)
      sp_w.append(w.reshape(d, c))
      sp_iters.append(it)
      sp_gn.append(gn)
    measured = time.perf_counter() - t0
    out[f"{name}_mean_iters"] = float(np.mean(sp_iters))
    out[f"{name}_max_grad_norm"] = float(np.max(sp_gn))
    out[f"{name}_measured_seconds"] = measured
    # Total for num_fits scipy fits (measured directly when num_scipy_fits == num_fits).
    out[f"{name}_seconds"] = measured * num_fits / num_scipy_fits
  out["jaxdp_mean_iters"] = float(np.mean(np.asarray(res.nonprivate_info.solver.num_iter)))
  out["jaxdp_max_grad_norm"] = float(np.max(np.asarray(res.nonprivate_info.solver.grad_norm)))
  # The certified (pre-output-noise) minimisers vs scipy's float64 minimisers.
  diff = np.max(np.abs(np.stack(sp_w) - cert_w[:num_scipy_fits]))
  out["max_abs_weight_diff_vs_scipy"] = float(diff)
  best = min(out[f"batched_{mode}_seconds"] for mode in modes)
  for mode in modes:
    out[f"sequential_over_{mode}"] = (out["sequential_jaxdp_seconds"]
                                      / out[f"batched_{mode}_seconds"])
  out["scipy_csr_over_best_batched"] = out["scipy_csr_seconds"] / best
  out["scipy_dense_over_best_batched"] = out["scipy_dense_seconds"] / best
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
  parser.add_argument("--no-accuracy", action="store_true", help="skip the accuracy table")
  parser.add_argument("--first-call-child", default=None, help=argparse.SUPPRESS)
  args = parser.parse_args()
  data_dir = os.environ.get("JAXDP_DATA_DIR")
  name = args.dataset = args.dataset or ("mnist" if data_dir else "digits")
  if args.first_call_child is not None:
    return _first_call_child(args)
  ds = _load(name, args.quick, data_dir)
  x, y, c = ds.x_train, ds.y_train, ds.num_classes
  tol = 1e-6
  print(f"backend={jax.default_backend()} dataset={name} x_train={x.shape} x_test={ds.x_test.shape}"
        f" load_average={os.getloadavg()[0]:.1f} cpus={os.cpu_count()}")

  solver = bench_solver(x, y, c, lam=1e-4, tol=tol, with_optax=not args.quick)
  print(f"[solver] N={solver['n']} D={solver['d']} (density {solver['density']:.2f}): jaxdp "
        f"{solver['jaxdp_seconds']:.2f}s ({solver['jaxdp_iters']} it, first call "
        f"{solver['jaxdp_first_call_seconds']:.1f}s) vs scipy CSR "
        f"{solver['scipy_csr_seconds']:.2f}s "
        f"({solver['scipy_csr_iters']} it), scipy dense {solver['scipy_dense_seconds']:.2f}s: "
        f"scipy-CSR/jaxdp {solver['scipy_csr_over_jaxdp_time']:.2f}, scipy-dense/jaxdp "
        f"{solver['scipy_dense_over_jaxdp_time']:.2f}"
        + (f", optax-lbfgs/jaxdp {solver['optax_lbfgs_over_jaxdp_time']:.2f}"
           if "optax_lbfgs_over_jaxdp_time" in solver else "")
        + f"; objective jaxdp {solver['jaxdp_objective']:.10f} scipy-CSR "
        f"{solver['scipy_csr_objective']:.10f} "
        f"(diff {solver['objective_jaxdp_minus_scipy_csr']:.1e})")

  first = bench_first_call(name, args.quick)
  print(f"[first call, fresh process] no cache: first {first['no_cache_first_seconds']:.2f}s warm "
        f"{first['no_cache_warm_seconds']:.2f}s; cache warm: first "
        f"{first['cache_warm_first_seconds']:.2f}s warm {first['cache_warm_warm_seconds']:.2f}s "
        f"(first - warm: {first['no_cache_first_minus_warm']:.2f}s -> "
        f"{first['cache_warm_first_minus_warm']:.2f}s)")

  # Batched private fits: MNIST-PCA-50 on N = 10,000 (quick and full alike).
  n_b = min(10_000, x.shape[0])
  dsb = ds if x.shape[0] == n_b else dataclasses.replace(ds, x_train=x[:n_b], y_train=y[:n_b])
  xr, xr_test = _pca(dsb, 50) if x.shape[1] > 50 else (dsb.x_train, dsb.x_test)
  yr = dsb.y_train
  num_fits = 100
  # --quick on a CPU times only batch_mode="map" (what "auto" picks there; vmap is slower on CPU).
  modes = ("map",) if args.quick and jax.default_backend() == "cpu" else ("vmap", "map")
  batched = bench_batched(xr, yr, c, lam=1e-4, tol=tol, num_fits=num_fits,
                          num_scipy_fits=10 if args.quick else num_fits, modes=modes)
  print(f"[{num_fits} loss-perturbation fits, N={batched['n']} D={batched['d']}] "
        + ", ".join(f"{m} {batched[f'batched_{m}_seconds']:.2f}s" for m in modes) + " "
        f"(certificate {batched['certificate_seconds_100_fits']:.2f}s), sequential jaxdp "
        f"{batched['sequential_jaxdp_seconds']:.2f}s, scipy CSR "
        f"{batched['scipy_csr_seconds']:.2f}s, "
        f"dense {batched['scipy_dense_seconds']:.2f}s (from {batched['scipy_fits_measured']} timed "
        f"fits each); scipy-CSR/best-batched {batched['scipy_csr_over_best_batched']:.2f}, "
        f"scipy-dense/best-batched {batched['scipy_dense_over_best_batched']:.2f}; "
        f"max |W_jaxdp - W_scipy| {batched['max_abs_weight_diff_vs_scipy']:.1e}; mean iterations "
        f"jaxdp {batched['jaxdp_mean_iters']:.0f} scipy {batched['scipy_csr_mean_iters']:.0f}")

  table, table_s, seeds, xt_ = [], 0.0, 0, xr
  if not args.no_accuracy:
    lambdas = (1e-4, 1e-3, 1e-2) if args.quick else (1e-5, 1e-4, 1e-3, 1e-2, 1e-1)
    seeds = 3 if args.quick else 20
    t0 = time.perf_counter()
    # Quick: MNIST-PCA-50 on N = 10,000 (as before); full: every training image, raw pixels.
    xt_, yt_, xs_ = (xr, yr, xr_test) if args.quick else (x, y, ds.x_test)
    table = accuracy_table(xt_, yt_, xs_, ds.y_test, c, lambdas, seeds, tol)
    table_s = time.perf_counter() - t0
    print(f"[accuracy, N={xt_.shape[0]} D={xt_.shape[1]}, {seeds} draws, {table_s:.0f}s]")
    print("| method | epsilon | delta | lambda | test accuracy |")
    print("| --- | --- | --- | --- | --- |")
    for r in table:
      print(f"| {r['method']} | {r['epsilon']:g} | {r['delta']:g} | {r['l2_reg']:g} | "
            f"{r['accuracy_mean']:.4f} +- {r['accuracy_std']:.4f} |")
  print(json.dumps(strict_json(dict(
      benchmark="linear", quick=args.quick, dataset=name, backend=jax.default_backend(),
      load_average=os.getloadavg()[0], solver=solver, first_call=first, batched_fits=batched,
      accuracy_table=dict(n_train=int(xt_.shape[0]), dims=int(xt_.shape[1]), num_seeds=seeds,
                          seconds=table_s, rows=table)))))


if __name__ == "__main__":
  main()
