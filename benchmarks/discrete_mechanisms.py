"""Throughput of jaxdp's exact discrete Laplace / discrete Gaussian mechanisms vs OpenDP.

The strongest baseline a user would pick for EXACT discrete noise is OpenDP
(Rust core, CKS 2020 samplers on exact rationals): ``make_laplace`` and
``make_gaussian`` on ``vector_domain(atom_domain(T=i32))`` with ``l1_distance``
/ ``l2_distance``, one call per vector (its best mode: the whole vector crosses
the FFI once). It runs in a separate virtual environment (``--opendp-python``
or ``$JAXDP_OPENDP_PYTHON``, default ``/work/venvs/opendp/bin/python``; set it
up with ``python3 -m venv /work/venvs/opendp && /work/venvs/opendp/bin/pip
install opendp numpy``) as a persistent worker process, so OpenDP never enters
jaxdp's environment; skipped, with the reason printed, when unavailable.

Measured in ONE run (ratios are only meaningful within a run on a shared machine):

1. Exact integer noise, ``draws/s`` for vectors of ``d`` coordinates at noise
   scales ``b`` (discrete Laplace, pmf ``~ exp(-|z|/b)``) and ``sigma``
   (discrete Gaussian, pmf ``~ exp(-z^2/(2 sigma^2))``):

   * jaxdp ``discrete_laplace_mechanism`` / ``discrete_gaussian_mechanism`` on
     an int32 vector with ``grid_step=1``, ``max_changed_coordinates=1``,
     sensitivity 1 and ``epsilon = 1/b`` / ``rho = 1/(2 sigma^2)`` (what a user
     calls; the calibrated ``t/s`` has ``t`` near ``2^20``), jitted, after a
     warm-up call, blocking on the result, best of ``reps``;
   * jaxdp ``discrete_laplace_noise(t=b, s=1)`` / ``discrete_gaussian_noise``
     (``t = c = sigma``), the raw samplers;
   * OpenDP ``make_laplace(scale=b)`` / ``make_gaussian(scale=sigma)`` applied
     to the same integer vector (a Python list). OpenDP's cost is linear in
     ``d`` (one Rust loop), so it is timed at ``min(d, --opendp-max)``
     coordinates and its draws/s is compared with jaxdp's at ``d``.

   The printed ratio is ``jaxdp mechanism draws/s / OpenDP draws/s``.
2. Non-exact float references for context (their outputs are floats with a
   data-dependent low-order-bit pattern, not a DP release on their own):
   ``jax.random.laplace`` / ``jax.random.normal`` (jitted) and numpy's
   ``Generator.laplace`` / ``Generator.normal`` at the same ``d``.
3. The float Gaussian sampler ``jaxdp.mechanisms.gaussian_noise`` (128 random
   bits per pair, ``|N(0,1)|`` cut at 12.06) vs ``jax.random.normal`` (cut at
   5.42), jitted, at each ``d``.

The LAST printed line is one JSON object with every figure.

Usage:
  python benchmarks/discrete_mechanisms.py [--quick] [--opendp-python PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import textwrap
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxdp import mechanisms as mech
from jaxdp.mechanisms import discrete

_OPENDP_WORKER = textwrap.dedent("""
    import json, sys, time
    import opendp.prelude as dp
    dp.enable_features("contrib")
    import importlib.metadata
    print(json.dumps({"opendp": importlib.metadata.version("opendp")}), flush=True)
    for line in sys.stdin:
      req = json.loads(line)
      d = req["d"]
      space = (dp.vector_domain(dp.atom_domain(T=dp.i32), size=d),
               dp.l1_distance(T=dp.i32) if req["kind"] == "laplace" else dp.l2_distance(T=dp.i32))
      make = dp.m.make_laplace if req["kind"] == "laplace" else dp.m.make_gaussian
      meas = make(*space, scale=float(req["scale"]))
      x = [0] * d
      meas(x)  # warm-up
      best = float("inf")
      for _ in range(req["reps"]):
        t0 = time.perf_counter()
        y = meas(x)
        best = min(best, time.perf_counter() - t0)
      print(json.dumps({"seconds": best, "d": d, "spread": float(sum(v * v for v in y) / d)}),
            flush=True)
""")


class OpenDPWorker:
  """OpenDP timing process in its own venv; ``time(kind, scale, d, reps)`` -> best seconds."""

  def __init__(self, python: str):
    self.proc = subprocess.Popen([python, "-c", _OPENDP_WORKER], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = self.proc.stdout.readline()
    if not line:
      err = self.proc.stderr.read().strip().splitlines()
      raise RuntimeError(err[-1][:300] if err else "worker exited")
    self.info = json.loads(line)

  def time(self, kind: str, scale: float, d: int, reps: int) -> dict:
    self.proc.stdin.write(json.dumps({"kind": kind, "scale": scale, "d": d, "reps": reps}) + "\n")
    self.proc.stdin.flush()
    line = self.proc.stdout.readline()
    if not line:
      raise RuntimeError(self.proc.stderr.read().strip()[-300:])
    return json.loads(line)

  def close(self):
    self.proc.stdin.close()
    self.proc.wait(timeout=60)


def _time(fn: Callable[[int], object], reps: int) -> float:
  """Best-of-``reps`` wall time of ``fn(rep)`` (seconds), blocking on the result."""
  best = float("inf")
  for rep in range(reps):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(rep))
    best = min(best, time.perf_counter() - t0)
  return best


def _jax_rate(f, d: int, reps: int) -> float:
  """draws/s of ``f(key)`` (d draws per call) after one warm-up call; a fresh key per call."""
  keys = jax.random.split(jax.random.key(12345), reps + 1)
  jax.block_until_ready(f(keys[reps]))
  return d / _time(lambda i: f(keys[i]), reps)


def main(argv: list[str] | None = None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true", help="d in (10^3, 10^5), fewer scales")
  parser.add_argument("--opendp-python",
                      default=os.environ.get("JAXDP_OPENDP_PYTHON", "/work/venvs/opendp/bin/python"))
  parser.add_argument("--opendp-max", type=int, default=None,
                      help="largest vector OpenDP is timed on (default 10^4 quick, 10^5 full)")
  args = parser.parse_args(argv)
  sizes = (10**3, 10**5) if args.quick else (10**3, 10**5, 10**6)
  scales = (1, 10) if args.quick else (1, 10, 100)
  reps = 2 if args.quick else 3
  opendp_max = args.opendp_max or (10**4 if args.quick else 10**5)

  worker, note = None, ""
  if not pathlib.Path(args.opendp_python).exists():
    note = f"OpenDP comparison skipped: interpreter {args.opendp_python} not found."
  else:
    try:
      worker = OpenDPWorker(args.opendp_python)
    except Exception as e:  # noqa: BLE001 - report any failure to start the baseline
      note = f"OpenDP comparison skipped: {e}"
  print(f"backend={jax.default_backend()} device={jax.devices()[0].device_kind} "
        f"opendp={worker.info['opendp'] if worker else None} sizes={sizes} scales={scales}")
  if note:
    print(note)

  rng = np.random.default_rng(0)
  exact = {}
  header = (f"{'sampler':10s} {'scale':>5s} {'d':>8s} {'jaxdp mech/s':>13s} {'jaxdp noise/s':>13s} "
            f"{'OpenDP/s':>11s} {'mech/OpenDP':>11s} {'jax float/s':>12s} {'numpy/s':>11s}")
  print(header)
  for kind in ("laplace", "gaussian"):
    for scale in scales:
      if kind == "laplace":
        t, s = discrete.discrete_laplace_scale(1.0, 1.0 / scale, 1.0)
        mech_f = jax.jit(lambda k, x: discrete.discrete_laplace_mechanism(
            k, x, 1.0, 1.0 / scale, 1.0, max_changed_coordinates=1))
        noise_f = lambda k, d: discrete.discrete_laplace_noise(k, (d,), scale, 1)
        float_f = lambda d: jax.jit(lambda k: scale * jax.random.laplace(k, (d,)))
        numpy_f = lambda d: rng.laplace(0.0, scale, d)
        params = {"t": t, "s": s}
      else:
        rho = 1.0 / (2.0 * scale**2)
        t, c = discrete.discrete_gaussian_variance(1.0, rho, 1.0)
        mech_f = jax.jit(lambda k, x: discrete.discrete_gaussian_mechanism(
            k, x, 1.0, rho, 1.0, max_changed_coordinates=1))
        noise_f = lambda k, d: discrete.discrete_gaussian_noise(k, (d,), scale, scale)
        float_f = lambda d: jax.jit(lambda k: scale * jax.random.normal(k, (d,)))
        numpy_f = lambda d: rng.normal(0.0, scale, d)
        params = {"t": t, "c": c}
      for d in sizes:
        x = jnp.zeros((d,), jnp.int32)
        row = {"kind": kind, "scale": scale, "d": d, "calibrated": params}
        row["jaxdp_mechanism_draws_per_s"] = _jax_rate(lambda k: mech_f(k, x), d, reps)
        row["jaxdp_noise_draws_per_s"] = _jax_rate(lambda k: noise_f(k, d), d, reps)
        row["jax_float_draws_per_s"] = _jax_rate(float_f(d), d, reps)
        numpy_f(d)
        row["numpy_float_draws_per_s"] = d / _time(lambda _: numpy_f(d), reps)
        if worker is not None:
          od = min(d, opendp_max)
          res = worker.time(kind, float(scale), od, reps if od <= 10**4 else 1)
          row["opendp_timed_d"] = od
          row["opendp_draws_per_s"] = od / res["seconds"]
          row["mechanism_over_opendp"] = row["jaxdp_mechanism_draws_per_s"] / row["opendp_draws_per_s"]
          row["noise_over_opendp"] = row["jaxdp_noise_draws_per_s"] / row["opendp_draws_per_s"]
        exact[f"{kind}[b={scale},d={d}]" if kind == "laplace" else f"{kind}[sigma={scale},d={d}]"] = row
        od_rate = row.get("opendp_draws_per_s", float("nan"))
        ratio = row.get("mechanism_over_opendp", float("nan"))
        print(f"{kind:10s} {scale:5d} {d:8d} {row['jaxdp_mechanism_draws_per_s']:13.4g} "
              f"{row['jaxdp_noise_draws_per_s']:13.4g} {od_rate:11.4g} {ratio:10.2f}x "
              f"{row['jax_float_draws_per_s']:12.4g} {row['numpy_float_draws_per_s']:11.4g}",
              flush=True)
  if worker is not None:
    worker.close()

  print(f"\n{'float Gaussian':10s} {'d':>8s} {'gaussian_noise/s':>17s} {'jax.random.normal/s':>20s} "
        f"{'normal/ours':>11s}")
  float_gaussian = {}
  for d in sizes:
    ours = _jax_rate(jax.jit(lambda k: mech.gaussian_noise(k, (d,), 1.0)), d, reps)
    theirs = _jax_rate(jax.jit(lambda k: jax.random.normal(k, (d,))), d, reps)
    float_gaussian[f"d={d}"] = {"jaxdp_gaussian_noise_draws_per_s": ours,
                                "jax_random_normal_draws_per_s": theirs,
                                "jax_over_jaxdp": theirs / ours}
    print(f"{'':10s} {d:8d} {ours:17.4g} {theirs:20.4g} {theirs / ours:10.2f}x", flush=True)

  summary = {
      "benchmark": "discrete_mechanisms",
      "quick": args.quick,
      "backend": jax.default_backend(),
      "device": jax.devices()[0].device_kind,
      "opendp_version": worker.info["opendp"] if worker else None,
      "opendp_note": note,
      "opendp_max_d": opendp_max,
      "exact": exact,
      "float_gaussian": float_gaussian,
  }
  print(json.dumps(summary))
  return summary


if __name__ == "__main__":
  main()
