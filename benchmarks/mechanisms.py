"""Throughput of the jaxdp noise samplers: one jitted, vmapped call vs. a Python loop.

For each sampler, ``draws/s`` is measured (i) for one ``jax.jit(jax.vmap(f))``
call over ``K`` keys and (ii) for a Python loop calling the jitted single-key
``f`` once per key (already compiled, so the loop pays dispatch, not
compilation). The ratio (ii)->(i) is printed. It also times jaxdp's long-tailed
Laplace/Gaussian samplers against the truncated ``jax.random.laplace`` /
``jax.random.normal`` one-liners (same shape, vmapped and jitted), i.e. the cost
of not cutting the float32 tails. The LAST line is one JSON object with every
figure.

Usage: python benchmarks/mechanisms.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Callable

import jax
import jax.numpy as jnp

from jaxdp import mechanisms as mech


def _block(x):
  return jax.block_until_ready(x)


def _time(fn: Callable[[], object], reps: int) -> float:
  """Best-of-``reps`` wall time of ``fn`` (seconds)."""
  best = float("inf")
  for _ in range(reps):
    t0 = time.perf_counter()
    _block(fn())
    best = min(best, time.perf_counter() - t0)
  return best


def _samplers():
  scores = jnp.linspace(0.0, 9.0, 10)
  counts = jnp.array([5, 40, 31, 2, 0, 7, 9, 3, 1, 2], jnp.float32)
  return {
      # name: (per-key function, numbers drawn per key)
      "laplace_noise[1000]": (lambda k: mech.laplace_noise(k, (1000,), 1.0), 1000),
      "gaussian_noise[1000]": (lambda k: mech.gaussian_noise(k, (1000,), 1.0), 1000),
      "l2_laplace_noise[784x10]": (lambda k: mech.l2_laplace_noise(k, (784, 10), 2.0), 7840),
      "exponential_mechanism[C=10]": (lambda k: mech.exponential_mechanism(k, scores, 0.5), 1),
      "report_noisy_max_laplace[C=10]": (lambda k: mech.report_noisy_max_laplace(k, counts, 2.0), 1),
      "report_noisy_max_gaussian[C=10]": (lambda k: mech.report_noisy_max_gaussian(k, counts, 2.0), 1),
  }


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("--quick", action="store_true", help="small sizes (a minute or less)")
  args = parser.parse_args()
  n_batch = 1024 if args.quick else 16384
  n_loop = 50 if args.quick else 300
  reps = 3 if args.quick else 5

  results = {}
  print(f"backend={jax.default_backend()} device={jax.devices()[0].device_kind} "
        f"vmap_keys={n_batch} loop_keys={n_loop}")
  print(f"{'sampler':34s} {'vmap draws/s':>14s} {'loop draws/s':>14s} {'ratio':>8s}")
  for name, (f, numbers_per_draw) in _samplers().items():
    # cap the batch at ~16M numbers so the vmapped call fits in memory
    n = max(1, min(n_batch, (1 << 24) // numbers_per_draw))
    keys = jax.random.split(jax.random.key(0), n)
    batched = jax.jit(jax.vmap(f))
    single = jax.jit(f)
    _block(batched(keys))  # compile
    _block(single(keys[0]))
    t_vmap = _time(lambda: batched(keys), reps)
    loop_keys = list(keys[:n_loop])
    t_loop = _time(lambda: [single(k) for k in loop_keys][-1], reps)
    vmap_rate = n / t_vmap
    loop_rate = n_loop / t_loop
    ratio = vmap_rate / loop_rate
    results[name] = {
        "vmap_keys": n,
        "vmap_draws_per_s": vmap_rate,
        "loop_draws_per_s": loop_rate,
        "vmap_numbers_per_s": vmap_rate * numbers_per_draw,
        "vmap_over_loop": ratio,
    }
    print(f"{name:34s} {vmap_rate:14.4g} {loop_rate:14.4g} {ratio:8.1f}x")

  print(f"\n{'long-tailed sampler vs jax.random':34s} {'jaxdp num/s':>14s} {'jax num/s':>14s} {'jax/jaxdp':>9s}")
  tails = {}
  shape = (1000,)
  pairs = {
      "laplace": (lambda k: mech.laplace_noise(k, shape, 1.0), lambda k: jax.random.laplace(k, shape)),
      "gaussian": (lambda k: mech.gaussian_noise(k, shape, 1.0), lambda k: jax.random.normal(k, shape)),
  }
  keys = jax.random.split(jax.random.key(1), n_batch)
  for name, (ours, theirs) in pairs.items():
    rates = []
    for f in (ours, theirs):
      g = jax.jit(jax.vmap(f))
      _block(g(keys))
      rates.append(n_batch * shape[0] / _time(lambda: g(keys), reps))
    tails[name] = {"jaxdp_numbers_per_s": rates[0], "jax_numbers_per_s": rates[1],
                   "jax_over_jaxdp": rates[1] / rates[0]}
    print(f"{name:34s} {rates[0]:14.4g} {rates[1]:14.4g} {rates[1] / rates[0]:8.2f}x")

  summary = {
      "benchmark": "mechanisms",
      "quick": args.quick,
      "backend": jax.default_backend(),
      "device": jax.devices()[0].device_kind,
      "vmap_keys": n_batch,
      "loop_keys": n_loop,
      "results": results,
      "long_tail_cost": tails,
  }
  print(json.dumps(summary))


if __name__ == "__main__":
  main()
