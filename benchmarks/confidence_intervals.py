"""Benchmark: seconds per private confidence interval (paper 003 Sec. 7.8, Table 3).

Adult (n = 30,162, the first d = 10 features + a constant, paper 003 Sec. 7.1; needs
``$JAXDP_DATA_DIR``, else a synthetic set of the same shape is used and said so). For each
of the 8 variants (logistic / Huber SVM x objective / output perturbation x pure DP / zCDP):

* ``single``: one interval per call of :func:`jaxdp.inference.confidence_intervals`
  (end to end: validation, calibration, the two jitted stages), median over calls;
* ``core``: the two jitted stages alone on device-resident data (what a caller that
  validated once pays);
* ``batched``: :func:`jaxdp.inference.confidence_intervals_batched` over R bootstrap
  replicates (multinomial counts; R = 1,000, ``--quick``: 50), total seconds and per interval
  (median of 3 runs);
* ``single_monte_carlo``: ``single`` with the paper's Monte Carlo quantiles (``m = 10,000``)
  instead of the exact ones (the default; :mod:`jaxdp.inference.mixture_quantiles`).

Solver comparison on the same problem (logistic, the solve of one interval): the jitted
float64 Newton of :mod:`jaxdp.inference.newton` vs the library's float32 L-BFGS
(:func:`jaxdp.training.linear.fit_linear`) vs a plain numpy float64 Newton. Ratios are
measured in one run. Prints one JSON object of the figures as its last line.

  python benchmarks/confidence_intervals.py [--quick]
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

from jaxdp.inference import confidence_intervals, confidence_intervals_batched
from jaxdp.inference import intervals as ci_mod
from jaxdp.inference import newton
from jaxdp.training import linear

VARIANTS = [(loss, pert, priv) for loss in ("logistic", "huber")
            for pert in ("objective", "output") for priv in ("pure", "zcdp")]


def load_adult(d=10):
  try:
    from jaxdp import data as jdata
    from jaxdp.data import normalize_rows
    ds = jdata.load("adult", add_constant=False, unit_ball=False)
    x = np.asarray(ds.x_train, np.float64)[:, :d]
    y = np.asarray(ds.y_train)
    source = "adult"
  except Exception as err:  # pylint: disable=broad-except
    print(f"Adult not available ({err}); using synthetic data of the same shape")
    rng = np.random.default_rng(0)
    x = rng.random((30162, d))
    y = (rng.random(30162) < 0.25).astype(int)
    source = "synthetic"
    from jaxdp.data import normalize_rows
  x = np.concatenate([x, np.ones((len(x), 1))], axis=1)
  return np.asarray(normalize_rows(x, "project"), np.float64), y, source


CPU_TIMES = {}


def _median_time(fn, repeats, name=None):
  """Median wall seconds; the median process CPU seconds go to ``CPU_TIMES[name]``.

  On a machine shared with other jobs, wall time includes waiting for a core; CPU time (all
  threads of this process) is the work done, an upper bound on the wall time on an idle
  machine with as many cores as threads used.
  """
  fn()
  times, cpu = [], []
  for _ in range(repeats):
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    times.append(time.perf_counter() - t0)
    cpu.append(time.process_time() - c0)
  if name:
    CPU_TIMES[name] = float(np.median(cpu))
  return float(np.median(times))


def numpy_newton(x, y, lam, tol=1e-10, max_iter=50):
  """Plain float64 Newton with backtracking on the logistic objective (the baseline)."""
  ys = np.where(y > 0, 1.0, -1.0)
  n, d = x.shape
  theta = np.zeros(d)
  f = lambda t: np.mean(np.logaddexp(0, -ys * (x @ t))) + 0.5 * lam * t @ t
  for _ in range(max_iter):
    z = ys * (x @ theta)
    s = 0.5 * (1 - np.tanh(0.5 * z))  # sigmoid(-z)
    g = x.T @ (-ys * s) / n + lam * theta
    if np.linalg.norm(g) <= tol:
      break
    hess = (x * (s * (1 - s))[:, None]).T @ x / n + lam * np.eye(d)
    step = -np.linalg.solve(hess, g)
    t, f0 = 1.0, f(theta)
    while f(theta + t * step) > f0 + 1e-4 * t * g @ step and t > 1e-10:
      t *= 0.5
    theta = theta + t * step
  return theta


def main():
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("--quick", action="store_true", help="fewer repeats and replicates")
  args = parser.parse_args()
  reps = 20 if args.quick else 100
  num_rep = 50 if args.quick else 1000
  x, y, source = load_adult()
  n, dim = x.shape
  lam = 0.002
  figures = dict(dataset=source, n=n, d=dim - 1, replicates=num_rep, cpu_count=os.cpu_count(),
                 load_average=os.getloadavg()[0])
  print(f"{source}: n = {n}, d = {dim - 1} (+ constant); load average "
        f"{figures['load_average']:.1f} on {os.cpu_count()} cores (timings under contention)")

  # Solver comparison (logistic, non-private objective of one interval).
  with jax.enable_x64(True):
    xj, yj = jnp.asarray(x), jnp.asarray(np.where(y > 0, 1.0, -1.0))
    x32 = xj.astype(jnp.float32)
    w = jnp.ones(n)
    solve = jax.jit(lambda: newton.newton_minimize(xj, yj, w, lam, jnp.zeros(dim),
                                                   loss="logistic", grad_tol=1e-10,
                                                   x_hessian=x32).theta)
    t_newton = _median_time(lambda: jax.block_until_ready(solve()), reps, "solve_newton_cpu_s")
  x32np, y01 = x.astype(np.float32), (y > 0).astype(np.int32)
  lb = lambda: jax.block_until_ready(linear.fit_linear(x32np, y01, l2_reg=lam, loss="logistic",
                                                       tol=1e-6).weights)
  t_lbfgs = _median_time(lb, reps, "solve_lbfgs_cpu_s")
  t_np = _median_time(lambda: numpy_newton(x, y, lam), reps, "solve_numpy_cpu_s")
  figures.update(CPU_TIMES)
  figures.update(solve_newton_jax_s=t_newton, solve_lbfgs_f32_s=t_lbfgs, solve_newton_numpy_s=t_np,
                 lbfgs_over_newton=t_lbfgs / t_newton, numpy_over_newton=t_np / t_newton)
  print(f"solve (logistic): jitted float64 Newton {t_newton * 1e3:.1f} ms, float32 L-BFGS "
        f"{t_lbfgs * 1e3:.1f} ms ({t_lbfgs / t_newton:.1f}x), numpy Newton {t_np * 1e3:.1f} ms "
        f"({t_np / t_newton:.1f}x)")

  rng = np.random.default_rng(1)
  counts = rng.multinomial(n, np.full(n, 1.0 / n), size=num_rep)
  for loss, pert, priv in VARIANTS:
    name = f"{loss}_{pert}_{priv}"
    phi = dict(epsilon=1.0) if priv == "pure" else dict(rho=0.5)
    kw = dict(**phi, loss=loss, perturbation=pert, l2_reg=lam)
    keys = iter(jax.random.split(jax.random.key(hash(name) % 2 ** 31), 10 * reps))
    t_single = _median_time(lambda: confidence_intervals(next(keys), x, y, **kw), reps,
                            f"{name}_single_cpu_s")
    if (pert, priv) != ("output", "zcdp"):  # the paper's Monte Carlo quantiles (m = 10,000)
      figures[f"{name}_single_monte_carlo_s"] = _median_time(
          lambda: confidence_intervals(next(keys), x, y, quantiles="monte_carlo", **kw), reps)
    # The jitted core alone (device-resident data, calibration done once).
    cal = ci_mod.calibrate(num_examples=n, dim=dim, **kw)
    static = dict(loss=loss, perturbation=pert, privacy=priv, release_noise=cal.release_noise,
                  quantiles=cal.quantiles, num_samples=cal.num_samples)
    with jax.enable_x64(True):
      p = jnp.asarray(ci_mod._params(cal))  # pylint: disable=protected-access

      def core():
        return jax.block_until_ready(ci_mod._pipeline_jit(  # pylint: disable=protected-access
            next(keys), xj, yj, w, p, batched=False, **static))
      t_core = _median_time(core, reps, f"{name}_core_cpu_s")
    bkeys = jax.random.split(jax.random.key(7), num_rep)
    confidence_intervals_batched(bkeys[:50], x, y, counts=counts[:50], chunk_size=50, **kw)  # compile
    runs = []
    for _ in range(3):  # median of 3 runs of all R replicates
      t0, c0 = time.perf_counter(), time.process_time()
      confidence_intervals_batched(bkeys, x, y, counts=counts, chunk_size=50, **kw)
      runs.append((time.perf_counter() - t0, time.process_time() - c0))
    t_batch, figures[f"{name}_batched_cpu_s"] = sorted(runs)[1]
    figures[f"{name}_single_s"] = t_single
    figures[f"{name}_core_s"] = t_core
    figures[f"{name}_batched_total_s"] = t_batch
    figures[f"{name}_batched_per_interval_s"] = t_batch / num_rep
    figures.update(CPU_TIMES)
    mc = figures.get(f"{name}_single_monte_carlo_s")
    print(f"{name:28s} single {t_single * 1e3:7.1f} ms (cpu "
          f"{CPU_TIMES[name + '_single_cpu_s'] * 1e3:.1f})  core {t_core * 1e3:7.1f} ms (cpu "
          f"{CPU_TIMES[name + '_core_cpu_s'] * 1e3:.1f})  "
          f"batched {num_rep} replicates {t_batch:6.2f} s ({t_batch / num_rep * 1e3:.1f} ms each,"
          f" cpu {figures[name + '_batched_cpu_s']:.2f} s; {t_single * num_rep / t_batch:.1f}x vs single"
          " calls)" + ("" if mc is None else f"; Monte Carlo quantiles (m = 10,000): single "
                       f"{mc * 1e3:.1f} ms, {mc / t_single:.1f}x the exact ones"))
  paper = {"logistic_objective_pure": 0.68, "huber_objective_pure": 3.03,
           "logistic_output_pure": 0.72, "huber_output_pure": 2.77,
           "logistic_objective_zcdp": 0.72, "huber_objective_zcdp": 3.26,
           "logistic_output_zcdp": 0.45, "huber_output_zcdp": 2.89}
  for k, v in paper.items():
    figures[f"{k}_paper_table3_s"] = v
    figures[f"{k}_speedup_vs_paper"] = v / figures[f"{k}_single_s"]
  print("speed-up of a single call vs paper 003 Table 3 (Adult, d = 10): " + ", ".join(
      f"{k} {figures[f'{k}_speedup_vs_paper']:.0f}x" for k in paper))
  print(json.dumps({k: (v if not isinstance(v, float) or math.isfinite(v) else str(v))
                    for k, v in figures.items()}))


if __name__ == "__main__":
  main()
