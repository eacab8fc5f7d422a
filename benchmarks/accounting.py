"""Benchmark: time to compute and to calibrate DP-SGD epsilon (RDP and PLD).

Prints timings measured in one run, the PLD/RDP time ratio and epsilon ratio,
and, as its last line, one JSON object with the figures.

  python benchmarks/accounting.py [--quick]
"""

import argparse
import json
import time

from jaxdp import accounting


def _timed(fn, repeats):
  best = float("inf")
  out = None
  for _ in range(repeats):
    start = time.perf_counter()
    out = fn()
    best = min(best, time.perf_counter() - start)
  return out, best


def main():
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("--quick", action="store_true", help="fewer settings and repeats")
  args = parser.parse_args()
  repeats = 2 if args.quick else 5
  # MNIST-like DP-SGD: N = 60,000, batch 256, 15 (quick) or 60 epochs, delta = 1e-5.
  q = 256 / 60_000
  epochs = 15 if args.quick else 60
  steps = accounting.steps_for_epochs(epochs, q)
  delta = 1e-5
  figures = {"sample_rate": q, "steps": steps, "delta": delta}
  for acc in ("rdp", "pld"):
    eps, t_eps = _timed(lambda: accounting.dpsgd_epsilon(1.1, q, steps, delta, acc), repeats)
    z, t_cal = _timed(lambda: accounting.calibrate_noise_multiplier(1.0, delta, q, steps, acc), 1)
    print(f"{acc}: epsilon(z=1.1) = {eps:.4f} in {t_eps * 1e3:.1f} ms; "
          f"calibrate z for eps=1: z = {z:.4f} in {t_cal * 1e3:.1f} ms")
    figures[f"{acc}_epsilon"] = eps
    figures[f"{acc}_epsilon_seconds"] = t_eps
    figures[f"{acc}_calibrated_noise_multiplier"] = z
    figures[f"{acc}_calibrate_seconds"] = t_cal
  figures["pld_over_rdp_epsilon"] = figures["pld_epsilon"] / figures["rdp_epsilon"]
  figures["pld_over_rdp_epsilon_time"] = figures["pld_epsilon_seconds"] / figures["rdp_epsilon_seconds"]
  _, t_sigma = _timed(lambda: accounting.analytic_gaussian_sigma(1.0, 1e-5), repeats)
  _, t_alg7 = _timed(lambda: accounting.per_query_gaussian_sigma(1.0, 1e-5, 1000), 1)
  figures["analytic_gaussian_sigma_seconds"] = t_sigma
  figures["algorithm7_sigma_seconds"] = t_alg7
  print(f"ratios: PLD/RDP epsilon = {figures['pld_over_rdp_epsilon']:.4f}, "
        f"PLD/RDP time = {figures['pld_over_rdp_epsilon_time']:.1f}x; analytic Gaussian sigma "
        f"{t_sigma * 1e3:.2f} ms; Algorithm 7 sigma (B=1000) {t_alg7 * 1e3:.1f} ms")
  print(json.dumps(figures))


if __name__ == "__main__":
  main()
