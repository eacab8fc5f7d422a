"""Benchmark: seconds per private confidence interval (paper 003 Sec. 7.8, Table 3).

Adult (n = 30,162, the first d = 10 features + a constant, paper 003 Sec. 7.1; needs
``$JAXDP_DATA_DIR``, else a synthetic set of the same shape is used and said so). For each
of the 8 variants (logistic / Huber SVM x objective / output perturbation x pure DP / zCDP;
``--quick``: logistic objective and output perturbation under pure DP):

* ``single``: one interval per call of :func:`jaxdp.inference.confidence_intervals`
  (end to end: validation, calibration, the two jitted stages), median over calls;
* ``core``: the two jitted stages alone on device-resident data (what a caller that
  validated once pays);
* ``batched``: :func:`jaxdp.inference.confidence_intervals_batched` over R bootstrap
  replicates of all ``n`` rows (R = 1,000, ``--quick``: 50), total seconds and per interval
  (median of 3 runs);
* ``single_monte_carlo``: ``single`` with the paper's Monte Carlo quantiles (``m = 10,000``)
  instead of the exact ones (the default; :mod:`jaxdp.inference.mixture_quantiles`).

Solver comparison on the same problem (logistic, the solve of one interval): the jitted
float64 Newton of :mod:`jaxdp.inference.newton` vs the library's float32 L-BFGS
(:func:`jaxdp.training.linear.fit_linear`) vs a plain numpy float64 Newton.

numpy reference (``numpy_reference`` in the JSON, :func:`numpy_reference`): at every
bootstrap size ``n`` of :data:`GRID` (``--quick``: :data:`QUICK_GRID`) and for the logistic
variants (``--quick``: objective and output perturbation under pure DP), the batched
intervals over ``R`` replicates of ``n`` rows of Adult vs a plain numpy/scipy float64
implementation of the same algorithm (``benchmarks/numpy_intervals.py``: same calibration,
Newton solve, PrivSPDMat, exact mixture quantiles), one replicate at a time on the gathered
rows; seconds per interval and the speed-up ``numpy / jaxdp``. Both get the same replicates
(row indices; passed to jaxdp as ``indices=`` where the batched call takes them, else as
row ``counts=``). Checked to be the same algorithm at the smallest ``n``
(``numpy_reference_checks``): equal intervals with the noise off, equal coverage and mean
length within Monte Carlo error with it on.

Ratios are measured in one run. Prints one JSON object of the figures as its last line.

  python benchmarks/confidence_intervals.py [--quick] [--numpy-reference-only]
  python benchmarks/confidence_intervals.py --table3-kdd-only  # Table 3, KDD Cup 99 row
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxdp.inference import confidence_intervals, confidence_intervals_batched
from jaxdp.inference import intervals as ci_mod
from jaxdp.inference import newton
from jaxdp.training import linear

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy_intervals  # noqa: E402  pylint: disable=wrong-import-position

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


def table3_kdd(reps: int) -> dict:
  """Paper 003 Table 3's second row: one interval on KDD Cup 99 at n = 450,000, d = 10 (the
  first 450,000 rows of the 10% training subset; ``$JAXDP_DATA_DIR``), the 4 logistic
  variants, median wall seconds of ``reps`` end-to-end calls. ``{}`` without the data."""
  try:
    from jaxdp import data as jdata  # pylint: disable=import-outside-toplevel
    from jaxdp.data import normalize_rows  # pylint: disable=import-outside-toplevel
    ds = jdata.load("kddcup99", add_constant=False, unit_ball=False)
  except Exception as err:  # pylint: disable=broad-except
    print(f"KDD Cup 99 not available ({err}); Table 3's KDD row skipped")
    return {}
  x = np.asarray(ds.x_train, np.float64)[:450_000, :10]
  x = np.asarray(normalize_rows(np.concatenate([x, np.ones((len(x), 1))], axis=1), "project"),
                 np.float64)
  y = np.asarray(ds.y_train)[:450_000]
  out = {}
  for pert in ("objective", "output"):
    for priv, phi in (("pure", dict(epsilon=1.0)), ("zcdp", dict(rho=0.5))):
      keys = iter(jax.random.split(jax.random.key(3), 10 * reps))
      out[f"logistic_{pert}_{priv}"] = _median_time(
          lambda: confidence_intervals(next(keys), x, y, perturbation=pert, **phi), reps)
      print(f"  KDD Cup 99, n = {len(y):,}, d = 10, logistic {pert} {priv}: "
            f"{out[f'logistic_{pert}_{priv}'] * 1e3:.1f} ms per interval")
  return out


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


GRID = (1000, 2000, 5000, 10000, 20000, 30162)
"""Bootstrap replicate sizes ``n`` of the side-by-side timing (paper 003 Figs. 9-10 vary ``n``)."""
QUICK_GRID = (1000, 5000, 30162)
REFERENCE_VARIANTS = [("logistic", pert, priv) for pert in ("objective", "output")
                      for priv in ("pure", "zcdp")]
QUICK_REFERENCE_VARIANTS = [("logistic", "objective", "pure"), ("logistic", "output", "pure")]


def _phi(priv):
  return dict(epsilon=1.0) if priv == "pure" else dict(rho=0.5)


def _no_noise(priv):
  return dict(epsilon=math.inf) if priv == "pure" else dict(rho=math.inf)


def _blas_single_thread():
  """numpy's BLAS on one thread (threadpoolctl, where installed): on a shared 2-core machine
  OpenBLAS's threads spin against the other jobs and make the reference 2-7x slower (measured),
  which would flatter jaxdp. Returns ``(context, threads)``."""
  try:
    import threadpoolctl  # pylint: disable=import-outside-toplevel
  except ImportError:
    return contextlib.nullcontext(), "default"
  return threadpoolctl.threadpool_limits(limits=1, user_api="blas"), 1


def _numpy_intervals(rng, x, ys, idx, cal, init):
  """numpy reference intervals of the replicates ``idx`` and each one's wall and CPU seconds
  (the gather ``x[rows]`` included, the index draw not: jaxdp gets the same indices)."""
  outs, secs, cpu = [], [], []
  context, _ = _blas_single_thread()
  with context:
    for rows in idx:
      t0, c0 = time.perf_counter(), time.process_time()
      outs.append(numpy_intervals.interval(rng, x[rows], ys[rows], cal, init))
      secs.append(time.perf_counter() - t0)
      cpu.append(time.process_time() - c0)
  return outs, secs, cpu


def _coverage_length(lower, upper, theta0):
  """Mean coverage of ``theta0`` and mean length, with standard errors over replicates."""
  inside = ((lower <= theta0) & (theta0 <= upper)).mean(axis=1)
  length = (upper - lower).mean(axis=1)
  r = len(inside)
  return (float(inside.mean()), float(inside.std(ddof=1) / math.sqrt(r)),
          float(length.mean()), float(length.std(ddof=1) / math.sqrt(r)))


def numpy_reference(x, y, quick, chunk_size):
  """jaxdp's batched intervals vs :mod:`numpy_intervals` on the same replicates.

  At every ``n`` of the grid and for each variant: ``R`` bootstrap replicates of ``n`` rows
  of ``x`` (``np.random.Generator.integers``), jaxdp seconds per interval (batched call over
  all ``R``; median of 3 runs, ``--quick``: 1, after a compiling run on ``2 chunk_size`` of
  them) and numpy seconds per interval (median over ``min(R, 200)`` replicates, one at a
  time, from the full-data minimiser as jaxdp starts, BLAS on one thread:
  :func:`_blas_single_thread`), wall and CPU (all threads) seconds. jaxdp runs its chunks on
  one host thread per core, so on 2 cores its wall time is about half its CPU time: the CPU
  ratio compares the work, the wall ratio what a user waits. numpy's best mode here is one
  single-threaded process per core on its own replicates: ``numpy_all_cores_s_per_interval``
  is its per-interval time divided by the number of cores (perfect scaling assumed, which
  favours numpy) and ``speedup_vs_all_cores`` the ratio against it. Same-algorithm checks at the
  smallest ``n``: with the noise off (``epsilon = rho = inf``) both intervals of each
  replicate agree up to the solver tolerance (``||theta^ - theta*|| <= tol / Lambda`` for
  each); with the noise on, coverage of the full-data minimiser and mean length over 200
  replicates agree within 4.5 standard errors. Returns ``(table, checks, blas_threads)``.
  """
  grid = QUICK_GRID if quick else GRID
  variants = QUICK_REFERENCE_VARIANTS if quick else REFERENCE_VARIANTS
  num_rep = 50 if quick else 1000
  num_np = min(num_rep, 200)
  num_check = 200
  big, dim = x.shape
  ys = np.where(y > 0, 1.0, -1.0)
  lam = 0.002
  theta_full = numpy_intervals.newton_solve(x, ys, lam, np.zeros(dim), loss="logistic", h=0.5,
                                            grad_tol=1e-12)[0]
  rng = np.random.default_rng(2)
  table, checks = {}, {}
  cores = os.cpu_count() or 1
  for n in grid:
    idx = rng.integers(0, big, size=(num_rep, n))
    rep_kw = dict(indices=idx)
    warm_kw = {k: v[:2 * chunk_size] for k, v in rep_kw.items()}
    for loss, pert, priv in variants:
      name = f"{loss}_{pert}_{priv}"
      kw = dict(loss=loss, perturbation=pert, l2_reg=lam, chunk_size=chunk_size)
      keys = jax.random.split(jax.random.key(1000 * n + variants.index((loss, pert, priv))),
                              num_rep)
      _, cal = confidence_intervals_batched(keys[:2 * chunk_size], x, y, **warm_kw, **_phi(priv),
                                            **kw)  # compiles
      runs = []
      for _ in range(1 if quick else 3):
        t0, c0 = time.perf_counter(), time.process_time()
        confidence_intervals_batched(keys, x, y, **rep_kw, **_phi(priv), **kw)
        runs.append((time.perf_counter() - t0, time.process_time() - c0))
      t_jax, c_jax = (v / num_rep for v in sorted(runs)[len(runs) // 2])
      _, secs, cpu = _numpy_intervals(rng, x, ys, idx[:num_np], cal, theta_full)
      t_np, c_np = float(np.median(secs)), float(np.median(cpu))
      # numpy's best mode on this machine: one single-threaded process per core, each on its
      # own replicates, with perfect scaling assumed (an upper bound on its throughput).
      t_np_all = t_np / cores
      table.setdefault(str(n), {})[name] = dict(
          jaxdp_s_per_interval=t_jax, numpy_s_per_interval=t_np, speedup=t_np / t_jax,
          numpy_all_cores_s_per_interval=t_np_all, speedup_vs_all_cores=t_np_all / t_jax,
          jaxdp_cpu_s_per_interval=c_jax, numpy_cpu_s_per_interval=c_np,
          cpu_speedup=c_np / c_jax)
      print(f"  n = {n:6d} {name:26s} jaxdp {t_jax * 1e3:7.2f} ms (cpu {c_jax * 1e3:7.2f})  "
            f"numpy {t_np * 1e3:7.2f} ms (cpu {c_np * 1e3:7.2f})  per interval: jaxdp "
            f"{t_np / t_jax:5.2f}x faster (cpu {c_np / c_jax:5.2f}x); against numpy on all "
            f"{cores} cores (ideal scaling) {t_np_all / t_jax:5.2f}x")
      if n != grid[0]:
        continue
      # Noise off: the same replicate gives the same interval (up to the two solvers' stops).
      sub = {k: v[:2 * chunk_size] for k, v in rep_kw.items()}
      ref, cal0 = confidence_intervals_batched(keys[:2 * chunk_size], x, y, **sub,
                                               **_no_noise(priv), **kw)
      outs, _, _ = _numpy_intervals(rng, x, ys, idx[:2 * chunk_size], cal0, theta_full)
      diff = max(float(np.max(np.abs(np.stack([o.lower for o in outs]) - ref.lower))),
                 float(np.max(np.abs(np.stack([o.upper for o in outs]) - ref.upper))))
      bound = 1.1 * cal0.tol / lam + 1e-5 * float(np.max(ref.upper - ref.lower))
      # Noise on: coverage of the full-data minimiser and mean length over num_check replicates.
      cidx = rng.integers(0, big, size=(num_check, n))
      ckw = dict(indices=cidx)
      ckeys = jax.random.split(jax.random.key(7 + variants.index((loss, pert, priv))), num_check)
      jout, _ = confidence_intervals_batched(ckeys, x, y, **ckw, **_phi(priv), **kw)
      nouts, _, _ = _numpy_intervals(rng, x, ys, cidx, cal, theta_full)
      cj = _coverage_length(jout.lower, jout.upper, theta_full)
      cn = _coverage_length(np.stack([o.lower for o in nouts]),
                            np.stack([o.upper for o in nouts]), theta_full)
      z_cov = abs(cj[0] - cn[0]) / max(math.hypot(cj[1], cn[1]), 1e-12)
      z_len = abs(cj[2] - cn[2]) / max(math.hypot(cj[3], cn[3]), 1e-12)
      ok = diff <= bound and z_cov <= 4.5 and z_len <= 4.5
      checks[name] = dict(n=n, noise_off_max_endpoint_diff=diff, noise_off_bound=bound,
                          jaxdp_coverage=cj[0], numpy_coverage=cn[0], coverage_z=z_cov,
                          jaxdp_length=cj[2], numpy_length=cn[2], length_z=z_len,
                          replicates=num_check, same_algorithm=bool(ok))
      print(f"  check {name} at n = {n}: noise off, max |endpoint difference| {diff:.2e} "
            f"(bound {bound:.2e}); noise on, {num_check} replicates: coverage jaxdp "
            f"{cj[0]:.3f} numpy {cn[0]:.3f} ({z_cov:.1f} SE), length jaxdp {cj[2]:.4f} numpy "
            f"{cn[2]:.4f} ({z_len:.1f} SE): {'same algorithm' if ok else 'MISMATCH'}")
  return table, checks, _blas_single_thread()[1]


def main():
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("--quick", action="store_true", help="fewer repeats and replicates")
  parser.add_argument("--numpy-reference-only", action="store_true",
                      help="only the side-by-side timing against the numpy reference")
  parser.add_argument("--table3-kdd-only", action="store_true",
                      help="only paper 003 Table 3's KDD Cup 99 row (n = 450,000, d = 10)")
  args = parser.parse_args()
  reps = 5 if args.quick else 100
  chunk = 25 if args.quick else 50  # one compiled chunk shape per call in --quick
  num_rep = 50 if args.quick else 1000
  x, y, source = load_adult()
  n, dim = x.shape
  lam = 0.002
  figures = dict(dataset=source, n=n, d=dim - 1, replicates=num_rep, cpu_count=os.cpu_count(),
                 load_average=os.getloadavg()[0])
  print(f"{source}: n = {n}, d = {dim - 1} (+ constant); load average "
        f"{figures['load_average']:.1f} on {os.cpu_count()} cores (timings under contention)")

  if args.table3_kdd_only:
    figures.update(table3_kdd_s=table3_kdd(3 if args.quick else 10))
    print(json.dumps(figures))
    return
  if args.numpy_reference_only:
    _numpy_reference_section(figures, x, y, n, args.quick, chunk)
    return

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
  with _blas_single_thread()[0]:  # as the numpy reference below
    t_np = _median_time(lambda: numpy_newton(x, y, lam), reps, "solve_numpy_cpu_s")
  figures.update(CPU_TIMES)
  figures.update(solve_newton_jax_s=t_newton, solve_lbfgs_f32_s=t_lbfgs, solve_newton_numpy_s=t_np,
                 lbfgs_over_newton=t_lbfgs / t_newton, numpy_over_newton=t_np / t_newton)
  print(f"solve (logistic): jitted float64 Newton {t_newton * 1e3:.1f} ms, float32 L-BFGS "
        f"{t_lbfgs * 1e3:.1f} ms ({t_lbfgs / t_newton:.1f}x), numpy Newton {t_np * 1e3:.1f} ms "
        f"({t_np / t_newton:.1f}x)")

  rng = np.random.default_rng(1)
  rep_kw = dict(indices=rng.integers(0, n, size=(num_rep, n)))  # bootstrap replicates
  warm_kw = {k: v[:2 * chunk] for k, v in rep_kw.items()}
  # --quick: the variants of the numpy comparison only (every compile costs seconds).
  for loss, pert, priv in (QUICK_REFERENCE_VARIANTS if args.quick else VARIANTS):
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
            next(keys), xj, yj, None, p, batched=False, gather=False, **static))
      t_core = _median_time(core, reps, f"{name}_core_cpu_s")
    bkeys = jax.random.split(jax.random.key(7), num_rep)
    confidence_intervals_batched(bkeys[:2 * chunk], x, y, **warm_kw, chunk_size=chunk, **kw)  # compile
    runs = []
    for _ in range(3):  # median of 3 runs of all R replicates
      t0, c0 = time.perf_counter(), time.process_time()
      confidence_intervals_batched(bkeys, x, y, **rep_kw, chunk_size=chunk, **kw)
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
  paper = {k: v for k, v in paper.items() if f"{k}_single_s" in figures}
  for k, v in paper.items():
    figures[f"{k}_paper_table3_s"] = v
    figures[f"{k}_speedup_vs_paper"] = v / figures[f"{k}_single_s"]
  print("speed-up of a single call vs paper 003 Table 3 (Adult, d = 10): " + ", ".join(
      f"{k} {figures[f'{k}_speedup_vs_paper']:.0f}x" for k in paper))
  if not args.quick:
    figures.update(table3_kdd_s=table3_kdd(10))
  _numpy_reference_section(figures, x, y, n, args.quick, chunk)


def _numpy_reference_section(figures, x, y, n, quick, chunk):
  """Runs :func:`numpy_reference`, adds it to ``figures`` and prints ``figures`` as the final
  JSON line."""
  print(f"jaxdp confidence_intervals_batched (one host thread per core) vs the numpy reference "
        f"(benchmarks/numpy_intervals.py; one replicate at a time, BLAS on one thread), wall and "
        f"CPU seconds per interval, bootstrap replicates of n of the {n} rows (load average "
        f"{os.getloadavg()[0]:.1f}):")
  table, checks, blas = numpy_reference(x, y, quick, chunk)
  figures.update(numpy_reference=table, numpy_reference_checks=checks,
                 numpy_reference_blas_threads=blas)
  print(json.dumps({k: (v if not isinstance(v, float) or math.isfinite(v) else str(v))
                    for k, v in figures.items()}))


if __name__ == "__main__":
  main()
