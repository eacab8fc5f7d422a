"""Benchmark: one-run audit statistics, jaxdp vs a plain numpy/scipy implementation.

Measures, in one run and on the same canary scores (m canaries, Gaussian
scores with a mean shift mu on the included ones):

* the Steinke et al. (2023) bound over the default (k+, k-) grid:
  :func:`jaxdp.audit.one_run.one_run_audit` (vectorised p-value, closed form
  for perfect guesses, Brent root) vs the plain implementation (the authors'
  scalar loop over i for the delta term and a 30-step bisection, as in their
  published snippet), with the bounds compared;
* the Mahloujifar et al. (2024) f-DP bound over the same grid: jaxdp (one
  vectorised recursion for all choices and a grid of mu, refined) vs a plain
  scalar implementation (the recursion in Python floats for one mu at a time,
  bisection on mu), with the mu bounds compared.

Usage: python benchmarks/one_run_audit.py [--quick]. The last line is a JSON object.
"""

from __future__ import annotations

import argparse
import json
import math
import time

import numpy as np
from scipy import stats
from scipy.special import ndtr, ndtri

from jaxdp.audit import one_run


# --- the plain implementations (scalar loops, scipy) -------------------------------------------


def plain_p_value(m, r, v, eps, delta):
  q = 1.0 / (1.0 + math.exp(-eps))
  tail = stats.binom.sf(v - 1, r, q)
  alpha, acc = 0.0, 0.0
  for i in range(1, v + 1):
    acc += stats.binom.pmf(v - i, r, q)
    alpha = max(alpha, acc / i)
  return min(1.0, tail + 2 * m * delta * alpha)


def plain_steinke(m, r, v, delta, beta):
  lo, hi = 0.0, 1.0
  while plain_p_value(m, r, v, hi, delta) < beta:
    hi += 1.0
  for _ in range(30):
    mid = (lo + hi) / 2
    if plain_p_value(m, r, v, mid, delta) < beta:
      lo = mid
    else:
      hi = mid
  return lo


def plain_fdp_rejects(m, r, v, mu, tau):
  rr, hh = tau * v / m, tau * (r - v) / m
  for j in range(v - 1, -1, -1):
    h_new = max(hh, float(ndtr(ndtri(min(rr, 1.0)) - mu)))
    if h_new == hh:
      break
    rr, hh = min(rr + j / (r - j) * (h_new - hh), 1.0), h_new
  return rr + hh > r / m


def plain_fdp_mu(m, r, v, beta, iters=30):
  if v == 0 or not plain_fdp_rejects(m, r, v, 1e-9, beta):
    return 0.0
  lo, hi = 1e-9, 40.0
  for _ in range(iters):
    mid = (lo + hi) / 2
    if plain_fdp_rejects(m, r, v, mid, beta):
      lo = mid
    else:
      hi = mid
  return lo


def plain_audit(scores, included, delta, confidence, method):
  pairs = one_run.default_k_grid(scores.size)
  beta = (1 - confidence) / len(pairs)
  order = np.argsort(-scores, kind="stable")
  best = 0.0
  for kp, km in pairs:
    v = int(included[order[:kp]].sum() + (~included[order[::-1][:km]]).sum())
    r = kp + km
    if method == "steinke":
      best = max(best, plain_steinke(scores.size, r, v, delta, beta))
    else:
      best = max(best, plain_fdp_mu(scores.size, r, v, beta))
  return best


# --- timing -------------------------------------------------------------------------------------


def _best_time(fn, repeats):
  best, out = float("inf"), None
  for _ in range(repeats):
    t0 = time.perf_counter()
    out = fn()
    best = min(best, time.perf_counter() - t0)
  return best, out


def bench(m, mu, repeats):
  rng = np.random.default_rng(0)
  included = rng.random(m) < 0.5
  scores = mu * included + rng.normal(size=m)
  delta, conf = 1e-5, 0.95
  t_j, st = _best_time(lambda: one_run.one_run_audit(scores, included, delta=delta,
                                                     confidence=conf), repeats)
  t_p, st_plain = _best_time(lambda: plain_audit(scores, included, delta, conf, "steinke"), 1)
  t_jf, fd = _best_time(lambda: one_run.one_run_audit(scores, included, delta=delta,
                                                      confidence=conf, method="fdp"), repeats)
  t_pf, mu_plain = _best_time(lambda: plain_audit(scores, included, delta, conf, "fdp"), 1)
  return {
      "num_canaries": m, "mu": mu, "num_hypotheses": st.num_hypotheses,
      "steinke_jaxdp_s": t_j, "steinke_plain_s": t_p, "steinke_speedup": t_p / t_j,
      "steinke_bound_jaxdp": st.epsilon_lower_bound, "steinke_bound_plain": st_plain,
      "fdp_jaxdp_s": t_jf, "fdp_plain_s": t_pf, "fdp_speedup": t_pf / t_jf,
      "fdp_mu_jaxdp": fd.mu_lower_bound, "fdp_mu_plain": mu_plain,
      "fdp_bound_jaxdp": fd.epsilon_lower_bound,
  }


def main():
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("--quick", action="store_true")
  args = parser.parse_args()
  sizes = [(1000, 2.0)] if args.quick else [(1000, 2.0), (3000, 1.0)]
  results = [bench(m, mu, repeats=2 if args.quick else 3) for m, mu in sizes]
  for r in results:
    print(f"m = {r['num_canaries']:,} ({r['num_hypotheses']} (k+, k-) choices): "
          f"Steinke {r['steinke_jaxdp_s'] * 1e3:.1f} ms vs plain {r['steinke_plain_s'] * 1e3:.0f} ms "
          f"({r['steinke_speedup']:.1f}x; bounds {r['steinke_bound_jaxdp']:.4f} / "
          f"{r['steinke_bound_plain']:.4f}); f-DP {r['fdp_jaxdp_s'] * 1e3:.1f} ms vs plain "
          f"{r['fdp_plain_s'] * 1e3:.0f} ms ({r['fdp_speedup']:.1f}x; mu {r['fdp_mu_jaxdp']:.4f} / "
          f"{r['fdp_mu_plain']:.4f})")
  print(json.dumps({"benchmark": "one_run_audit", "quick": bool(args.quick), "results": results}))


if __name__ == "__main__":
  main()
