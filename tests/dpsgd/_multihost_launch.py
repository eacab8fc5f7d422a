"""Starts k copies of a worker script as one ``jax.distributed`` job on 127.0.0.1.

For the multi-host tests and ``benchmarks/dpsgd_multihost.py``.

Each worker runs ``python SCRIPT --coordinator 127.0.0.1:PORT --num-processes k
--process-id i --out DIR/out_i.npz [args...]`` with ``JAX_PLATFORMS=cpu`` and
``XLA_FLAGS=--xla_force_host_platform_device_count=D`` (D simulated CPU devices
per process). The launch never hangs: all workers are killed when one fails or
when the time limit passes, and the error names each worker's exit status with
the tail of its stderr. Workers' stdout/stderr go to files (no pipe can fill).
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Sequence

import numpy as np


@dataclasses.dataclass
class WorkerResult:
  """One worker's outputs: its ``.npz`` (loaded), stdout and stderr."""

  process_id: int
  out: dict[str, np.ndarray]
  stdout: str
  stderr: str


class LaunchError(RuntimeError):
  """A worker failed, or the job ran past its time limit (every worker was killed)."""


def free_port() -> int:
  """A TCP port that was free on 127.0.0.1 a moment ago."""
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _tail(path: pathlib.Path, chars: int = 2500) -> str:
  text = path.read_text(errors="replace") if path.exists() else ""
  # Drop the coordination service's info lines (timestamps of a healthy start).
  lines = [l for l in text.splitlines() if not l.startswith(("I0", "[Gloo]"))]
  return "\n".join(lines)[-chars:]


def _kill(procs: Sequence[subprocess.Popen]) -> None:
  for p in procs:
    if p.poll() is None:
      try:
        os.killpg(p.pid, signal.SIGKILL)  # each worker leads its own session (start_new_session)
      except ProcessLookupError:
        pass
  for p in procs:
    p.wait()


def launch(script: str | os.PathLike, num_processes: int, devices_per_process: int = 4,
           args: Sequence[str] = (), timeout: float = 120.0,
           env: dict[str, str] | None = None) -> list[WorkerResult]:
  """Runs ``num_processes`` copies of ``script`` as one job; returns their results by process id.

  Args:
    script: the worker; it must write its results with ``np.savez(out, ...)``.
    num_processes: k, the number of processes.
    devices_per_process: simulated CPU devices per process.
    args: extra command-line arguments for every worker.
    timeout: seconds for the whole job; then every worker is killed.
    env: extra environment variables.

  Raises:
    LaunchError: a worker exited non-zero or wrote no output, or the job timed out.
  """
  flags = " ".join(
      f for f in os.environ.get("XLA_FLAGS", "").split()
      if not f.startswith("--xla_force_host_platform_device_count"))
  base_env = dict(os.environ, JAX_PLATFORMS="cpu", **(env or {}))
  count = f"--xla_force_host_platform_device_count={devices_per_process}"
  base_env["XLA_FLAGS"] = (flags + " " + count).strip()
  with tempfile.TemporaryDirectory(prefix="jaxdp_multihost_") as tmp:
    tmp = pathlib.Path(tmp)
    address = f"127.0.0.1:{free_port()}"
    procs, logs = [], []
    try:
      for i in range(num_processes):
        out_path, err_path = tmp / f"stdout_{i}.txt", tmp / f"stderr_{i}.txt"
        logs.append((out_path, err_path))
        with open(out_path, "w") as out_f, open(err_path, "w") as err_f:
          procs.append(subprocess.Popen(
              [sys.executable, str(script), "--coordinator", address, "--num-processes",
               str(num_processes), "--process-id", str(i), "--out", str(tmp / f"out_{i}.npz"),
               *args], env=base_env, stdout=out_f, stderr=err_f, start_new_session=True))
      deadline = time.monotonic() + timeout
      failure = None
      while failure is None:
        codes = [p.poll() for p in procs]  # every worker, each time
        if any(c not in (None, 0) for c in codes):
          failure = "a worker failed"
        elif None not in codes:
          break
        elif time.monotonic() > deadline:
          failure = f"the job ran past its {timeout:.0f} s limit"
        else:
          time.sleep(0.05)
    finally:
      _kill(procs)
    missing = [i for i in range(num_processes) if not (tmp / f"out_{i}.npz").exists()]
    if failure is None and missing:
      failure = f"worker(s) {missing} wrote no output"
    if failure is not None:
      report = "\n".join(
          f"--- worker {i} (exit status {p.returncode}), stderr tail:\n{_tail(logs[i][1])}"
          for i, p in enumerate(procs))
      raise LaunchError(f"multi-process launch of {pathlib.Path(script).name} "
                        f"({num_processes} x {devices_per_process} devices): {failure}; every "
                        f"worker was stopped.\n{report}")
    results = []
    for i in range(num_processes):
      with np.load(tmp / f"out_{i}.npz") as data:
        out = {k: data[k] for k in data.files}
      results.append(WorkerResult(i, out, logs[i][0].read_text(), logs[i][1].read_text()))
    return results
