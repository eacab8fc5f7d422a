"""Benchmark: optimised BandMF / BLT strategies for n = 2,000 steps, errors and optimisation time.

For each configuration (strategy family and size, participations k and
separation b, error "mean" = ||A C^{-1}||_F^2 / n or "max" = largest squared
row norm, both times sens(C)^2, prefix-sum workload) it prints our optimised
loss beside the loss JAX Privacy's own optimiser reaches for the same
configuration, and the optimisation wall time (first call, compile included,
and a second, warm call).

Reference losses: jax-privacy 2.0.0 (PyPI; jax 0.10.2, float64), computed with
  * BandMF, k = 1: ``toeplitz.optimize_banded_toeplitz(n, bands, reduction_fn)``
    scored by ``toeplitz.loss``;
  * BandMF, k = 4, b = 500: that single-participation optimum scored with
    ``toeplitz.minsep_sensitivity_squared`` and the mean of
    ``toeplitz.per_query_error`` (JAX Privacy has no min-separation optimiser
    for Toeplitz BandMF, so this is an upper reference, not an optimum);
  * BLT: ``buffered_toeplitz.optimize(n, min_sep, max_participations, error,
    min_buffers=max_buffers=buffers)`` scored by
    ``buffered_toeplitz.LossFn.build_min_sep(...).loss``;
  * square root (full Toeplitz, n coefficients):
    ``toeplitz.optimal_max_error_strategy_coefs`` scored by ``toeplitz.loss``.
Its optimisation times were measured once on the same 2-core machine, under
load from other jobs, compile included. The full (non ``--quick``) run also
scores JAX Privacy's pinned n = 100,000, 2-buffer max-error BLT (its test
``test_optimize_single_participation_golden``) with our loss, beside our own
optimum for that configuration.

The ``--banded`` run compares the general column-normalised banded strategy
(:func:`optimize_column_normalized_banded`) with the Toeplitz BandMF optimum
and JAX Privacy 2.0.0's ``banded.optimize(n, bands=...)`` (scored by the mean
of ``banded.per_query_error``; one participation, error "mean").

  python benchmarks/mf_strategies.py [--quick | --banded]
"""

import argparse
import json
import time

import numpy as np

from jaxdp.dpsgd.correlated import optimize
from jaxdp.dpsgd.correlated import strategies

N = 2000

# (family, size, k, b, error) -> (loss, optimisation seconds) from jax-privacy 2.0.0 (docstring).
JAX_PRIVACY_2_0_0 = {
    ("bandmf", 32, 1, 1, "mean"): (42.02465456957093, 4.9),
    ("bandmf", 32, 1, 1, "max"): (76.26741546179883, 4.0),
    ("bandmf", 64, 1, 1, "mean"): (26.267757606849354, 7.4),
    ("bandmf", 64, 1, 1, "max"): (44.826213044841744, 14.4),
    ("bandmf", 32, 4, 500, "mean"): (168.0986182782837, None),
    ("bandmf", 64, 4, 500, "mean"): (105.0710304273974, None),
    ("blt", 2, 1, 1, "max"): (12.78543175303463, 11.0),
    ("blt", 4, 1, 1, "max"): (12.156583834580582, 41.5),
    ("blt", 2, 1, 1, "mean"): (11.010996253485121, 19.0),
    ("blt", 4, 1, 1, "mean"): (10.695362539791393, 37.3),
    ("blt", 2, 4, 500, "max"): (66.80003777312459, 22.0),
    ("blt", 4, 4, 500, "max"): (65.64579431926916, 39.3),
    ("blt", 2, 4, 500, "mean"): (50.600318045220796, 27.1),
    ("blt", 4, 4, 500, "mean"): (50.33432057638882, 16.0),
    ("sqrt", N, 1, 1, "max"): (12.149954349773752, None),
    ("sqrt", N, 1, 1, "mean"): (11.042085861199393, None),
}

# jax_privacy/matrix_factorization/buffered_toeplitz_test.py,
# test_optimize_single_participation_golden: n = 100,000, 2 buffers, error "max", k = 1.
GOLDEN_N = 100_000
GOLDEN_BLT = dict(theta=[0.9999528892, 0.9857068667], omega=[0.0122853238, 0.1878393665])

# (n, bands) -> JAX Privacy 2.0.0 banded.optimize loss (mean error, k = 1), 100 L-BFGS steps.
JAX_PRIVACY_BANDED = {(32, 4): 5.924122002425778, (64, 8): 6.867109187094037,
                      (256, 16): 12.866340617038402, (500, 32): 14.126928671998241}

QUICK = [("bandmf", 32, 1, 1, "mean"), ("blt", 2, 1, 1, "max"), ("sqrt", N, 1, 1, "mean")]


def _optimise(family, size, k, b, error):
  kw = dict(max_participations=k, min_separation=b, error=error)
  if family == "bandmf":
    return optimize.optimize_bandmf(N, size, **kw)
  if family == "blt":
    return optimize.optimize_blt(N, size, **kw)
  return strategies.BandMF(optimize.square_root_coefs(size))


def _row(config):
  family, size, k, b, error = config
  start = time.perf_counter()
  strategy = _optimise(*config)
  first = time.perf_counter() - start
  start = time.perf_counter()
  _optimise(*config)
  warm = time.perf_counter() - start
  loss = optimize.expected_error(strategy, N, max_participations=k, min_separation=b, error=error)
  ref, ref_time = JAX_PRIVACY_2_0_0[config]
  timed = family != "sqrt"
  return {"family": family, "size": size, "k": k, "b": b, "error": error, "loss": loss,
          "reference_loss": ref, "ratio": loss / ref,
          "time_first_s": first if timed else None, "time_warm_s": warm if timed else None,
          "reference_time_s": ref_time}


def _golden():
  golden = strategies.BLT(np.array(GOLDEN_BLT["theta"]), np.array(GOLDEN_BLT["omega"]))
  ref = optimize.expected_error(golden, GOLDEN_N, error="max")
  start = time.perf_counter()
  ours = optimize.optimize_blt(GOLDEN_N, 2, error="max")
  seconds = time.perf_counter() - start
  loss = optimize.expected_error(ours, GOLDEN_N, error="max")
  return {"family": "blt", "size": 2, "n": GOLDEN_N, "k": 1, "b": 1, "error": "max",
          "loss": loss, "reference_loss": ref, "ratio": loss / ref, "time_first_s": seconds,
          "theta": ours.theta.tolist(), "omega": ours.omega.tolist()}


def _banded_rows():
  rows = []
  for (n, bands), ref in JAX_PRIVACY_BANDED.items():
    start = time.perf_counter()
    cnb = optimize.optimize_column_normalized_banded(n, bands, error="mean")
    seconds = time.perf_counter() - start
    ours = optimize.expected_error(cnb, n, error="mean")
    toeplitz = optimize.expected_error(optimize.optimize_bandmf(n, bands, error="mean"), n,
                                       error="mean")
    rows.append({"n": n, "bands": bands, "column_normalized": ours, "toeplitz": toeplitz,
                 "jax_privacy": ref, "ratio_to_jax_privacy": ours / ref,
                 "ratio_to_toeplitz": ours / toeplitz, "time_s": seconds})
    print(f"n={n:5d} bands={bands:3d} column-normalised {ours:.9f} toeplitz {toeplitz:.9f} "
          f"JAX Privacy {ref:.9f} ratio {ours / ref:.7f} ({seconds:.1f} s)", flush=True)
  return rows


def main():
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("--quick", action="store_true", help="three configurations, no n = 100,000")
  parser.add_argument("--banded", action="store_true",
                      help="only the column-normalised banded strategy against JAX Privacy")
  args = parser.parse_args()
  if args.banded:
    print(json.dumps({"banded": _banded_rows()}))
    return
  configs = QUICK if args.quick else list(JAX_PRIVACY_2_0_0)
  rows = [_row(c) for c in configs]
  print(f"n = {N}; loss = sens^2 * error (prefix-sum workload); reference: jax-privacy 2.0.0")
  print(f"{'strategy':>12} {'k':>2} {'b':>4} {'error':>5} {'ours':>12} {'reference':>12} "
        f"{'ratio':>8} {'t first':>8} {'t warm':>7} {'t ref':>6}")
  fmt = lambda t: "-" if t is None else f"{t:.2f}"
  for r in rows:
    print(f"{r['family'] + ' ' + str(r['size']):>12} {r['k']:>2} {r['b']:>4} {r['error']:>5} "
          f"{r['loss']:>12.6f} {r['reference_loss']:>12.6f} {r['ratio']:>8.5f} "
          f"{fmt(r['time_first_s']):>8} {fmt(r['time_warm_s']):>7} {fmt(r['reference_time_s']):>6}")
  figures = {"n": N, "rows": rows}
  if not args.quick:
    g = _golden()
    print(f"n = {GOLDEN_N}, BLT 2 buffers, max error: ours {g['loss']:.6f}, JAX Privacy's pinned "
          f"BLT {g['reference_loss']:.6f} (ratio {g['ratio']:.5f}), {g['time_first_s']:.2f} s")
    figures["golden_n100000"] = g
  print(json.dumps(figures))


if __name__ == "__main__":
  main()
