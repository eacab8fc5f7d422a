"""Many independent fits on a CPU: ``lax.map`` chunks run side by side, one per core.

A batch of ``M`` independent fits (keys, bootstrap replicates, parties) runs
on a CPU as ``jax.lax.map`` (one problem at a time inside one compiled call;
:func:`jaxdp.training.linear.resolve_batch_mode` says why not ``vmap``). The
operations of one small fit (``N x C`` element-wise work, skinny matmuls) are
too small for XLA:CPU's intra-op thread pool to keep several cores busy: on
2 cores, 100 loss-perturbation fits on MNIST-PCA-50 keep the machine only
about half busy. :func:`map_in_chunks` splits the batch into one equal chunk
per core and dispatches the chunks from host threads (XLA releases the GIL
while it runs), so the cores work on different problems at once.

The result is the same as one ``lax.map`` over the whole batch: every problem
is computed by the same compiled per-problem body, independently of the
others, and the chunk results are concatenated in order (tested bit for bit).
The last chunk is padded by repeating the last problem (equal chunk shapes:
one compilation), and the padding is dropped.
"""

from __future__ import annotations

import concurrent.futures
import os
from typing import Any, Callable

import jax
import jax.numpy as jnp

_ENV = "JAXDP_CPU_WORKERS"


def cpu_workers() -> int:
  """Cores available to this process (``$JAXDP_CPU_WORKERS`` overrides; at least 1)."""
  env = os.environ.get(_ENV)
  if env:
    try:
      n = int(env)
    except ValueError as e:
      raise ValueError(f"${_ENV} must be a positive integer, got {env!r}.") from e
    if n < 1:
      raise ValueError(f"${_ENV} must be a positive integer, got {env!r}.")
    return n
  try:
    return max(1, len(os.sched_getaffinity(0)))
  except AttributeError:  # not on Linux
    return max(1, os.cpu_count() or 1)


def num_chunks(num_problems: int, mode: str) -> int:
  """How many chunks :func:`map_in_chunks` uses: one per core for ``"map"`` on a CPU, else 1.

  At least 2 problems per chunk (a chunk of one problem gains nothing).
  """
  if mode != "map" or jax.default_backend() != "cpu":
    return 1
  return max(1, min(cpu_workers(), num_problems // 2))


def map_in_chunks(fn: Callable[[Any], Any], batched: Any, chunks: int,
                  max_workers: int | None = None) -> Any:
  """``fn(batched)`` computed as ``chunks`` calls on equal slices of the leading axis, in threads.

  Args:
    fn: maps a pytree of arrays with leading axis ``m`` to a pytree of arrays
      with leading axis ``m`` (problem ``i`` of the output depends only on
      problem ``i`` of the input), e.g. a jitted ``lax.map`` of one fit.
    batched: pytree of arrays sharing the leading axis ``M``.
    chunks: number of slices (1: a plain call).
    max_workers: host threads (default: one per chunk); 1 runs the chunks one after the
      other in the calling thread (chunks that bound memory, not spread work; thread-local
      settings such as ``jax.enable_x64`` stay in force).

  Returns:
    The concatenation of the chunk results (leading axis ``M``).
  """
  leaves = jax.tree_util.tree_leaves(batched)
  m = int(leaves[0].shape[0])
  chunks = max(1, min(int(chunks), m))
  if chunks == 1:
    return fn(batched)
  per = -(-m // chunks)
  pad = per * chunks - m
  if pad:
    idx = jnp.concatenate([jnp.arange(m), jnp.full((pad,), m - 1)])
    batched = jax.tree_util.tree_map(lambda a: a[idx], batched)
  parts = [jax.tree_util.tree_map(lambda a, i=i: a[i * per:(i + 1) * per], batched)
           for i in range(chunks)]
  run = lambda part: jax.block_until_ready(fn(part))
  workers = chunks if max_workers is None else max(1, min(int(max_workers), chunks))
  if workers == 1:
    outs = [run(part) for part in parts]
  else:
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
      outs = list(pool.map(run, parts))
  joined = jax.tree_util.tree_map(lambda *xs: jnp.concatenate(xs, axis=0), *outs)
  return jax.tree_util.tree_map(lambda a: a[:m], joined) if pad else joined


__all__ = ["cpu_workers", "num_chunks", "map_in_chunks"]
