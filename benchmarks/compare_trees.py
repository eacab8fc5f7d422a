"""Benchmark: the DP-SGD steps of this checkout against an older jaxdp tree, in ONE process.

A speed regression of a few percent is below the noise of two separate runs
on a shared machine, so both trees are imported into one process (one after
the other, each tree's functions built and compiled while its modules are the
imported ones) and their steps are timed in interleaved rounds. ``--old`` is
the root of another checkout (e.g. ``git worktree add /tmp/old 176db21``);
its ``benchmarks/dpsgd.py`` must have ``jax_steps`` (and ``loop_steps`` for the
loop cells). Cells, from ``benchmarks/dpsgd.py``:

* ``<model>/<method>``: the direct jitted private step (``jax_steps``: clipped
  gradient, Gaussian noise, SGD) with ``method`` vmap, reweight or ghost;
* ``<model>/loop``: one full ``make_private`` step with device-resident data
  (``loop_steps``' ``loop_device``) and ``<model>/bare`` the bare jitted step
  it wraps, at the plan's static size P (``bare_padded``).

Defaults: ResNet-20 (GroupNorm) at batch 600 on 50,000 rows with ghost
clipping and the loop on a GPU (paper 000 Fig. 7's setting), the MLP and the
SmallCNN at batch 256 on a CPU. ``--variants`` adds, for this checkout's ghost
and vmap steps, the step traced with every ``jax.lax.cond`` replaced by its
false branch (``nocond``: the plain rule alone, the cost of the conditional)
and by its true branch (``always``: the robust rule alone). ``--quick``: fewer
rounds. Prints ``new/old`` ratios (min over rounds, and medians); the last
line is one JSON object.

Usage::

  python benchmarks/compare_trees.py --old /tmp/old --quick
  python benchmarks/compare_trees.py --old /tmp/old --cells resnet20/ghost,resnet20/loop \\
      --batch 600 --num-examples 50000
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import statistics
import sys
import time

import jax

_REAL_COND = jax.lax.cond


@contextlib.contextmanager
def _cond_as(branch: str | None):
  """Traces every ``jax.lax.cond`` as its false or true branch (timing variants only)."""
  if branch is None:
    yield
    return
  pick = (lambda p, t, f, *ops, **kw: f(*ops)) if branch == "nocond" else (
      lambda p, t, f, *ops, **kw: t(*ops))
  jax.lax.cond = pick
  try:
    yield
  finally:
    jax.lax.cond = _REAL_COND


def _purge() -> None:
  for m in [m for m in list(sys.modules)
            if m == "jaxdp" or m.startswith("jaxdp.") or m == "dpsgd"]:
    del sys.modules[m]


def build(tree: str, tag: str, cells: list[str], batch: int, num_examples: int, steps: int,
          variants: bool, log) -> dict:
  """``{key: (fn, args)}`` of ``tree``'s cells, each compiled and run once."""
  _purge()
  sys.path[:0] = [tree, os.path.join(tree, "benchmarks")]
  try:
    import jaxdp  # pylint: disable=import-outside-toplevel
    if not os.path.abspath(jaxdp.__file__).startswith(tree):
      raise SystemExit(f"--old: {tree} did not provide jaxdp (got {jaxdp.__file__}).")
    bench = importlib.import_module("dpsgd")
    fns: dict = {}

    def add(key, fn, args, branch=None):
      t = time.perf_counter()
      with _cond_as(branch):
        jax.block_until_ready(fn(*args))
      jax.block_until_ready(fn(*args))
      fns[key] = (fn, args)
      log(f"compiled {key} in {time.perf_counter() - t:.1f} s")

    for cell in cells:
      model, what = cell.split("/")
      if what == "loop":
        fns_, _ = bench.loop_steps(model, batch, num_examples, total_steps=steps, method="ghost")
        add(f"{model}/loop/{tag}", *fns_["loop_device"])
        add(f"{model}/bare/{tag}", *fns_["bare_padded"])
        continue
      branches = [None] + (["nocond", "always"] if variants and tag == "new" else [])
      for branch in branches:
        fn, args = bench.jax_steps(model, batch, methods=(what,))[what]
        add(f"{cell}/{tag}" + (f"_{branch}" if branch else ""), fn, args, branch)
    return fns
  finally:
    del sys.path[:2]


def main(argv: list[str] | None = None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--old", required=True, help="root of the older checkout")
  parser.add_argument("--cells", default=None,
                      help="comma-separated model/method or model/loop (models mlp, cnn, "
                           "resnet20; methods vmap, reweight, ghost)")
  parser.add_argument("--batch", type=int, default=None, help="default 600 on a GPU, else 256")
  parser.add_argument("--num-examples", type=int, default=None,
                      help="rows for the loop cells; default 50,000 on a GPU, else 60,000")
  parser.add_argument("--variants", action="store_true",
                      help="also time this checkout's steps with every cond as one branch")
  parser.add_argument("--quick", action="store_true")
  args = parser.parse_args(argv)
  gpu = jax.default_backend() == "gpu"
  old = os.path.abspath(args.old)
  if not os.path.isfile(os.path.join(old, "benchmarks", "dpsgd.py")):
    parser.error(f"--old must be a jaxdp checkout with benchmarks/dpsgd.py, got {args.old!r}.")
  cells = (args.cells.split(",") if args.cells else
           ["resnet20/ghost", "resnet20/loop"] if gpu else
           ["mlp/ghost", "cnn/ghost", "cnn/loop"])
  for cell in cells:
    model, _, what = cell.partition("/")
    if model not in ("mlp", "cnn", "resnet20") or what not in ("vmap", "reweight", "ghost",
                                                                 "loop"):
      parser.error(f"--cells: {cell!r} is not model/method or model/loop.")
  batch = args.batch or (600 if gpu else 256)
  num_examples = args.num_examples or (50_000 if gpu else 60_000)
  rounds, reps = (5, 2) if args.quick else (20, 5)
  here = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
  log = lambda s: print(s, flush=True)
  steps = rounds * reps + 10  # the loop cells' plans: warm-up calls and every timed step
  fns = build(old, "old", cells, batch, num_examples, steps, False, log)
  fns.update(build(here, "new", cells, batch, num_examples, steps, args.variants, log))
  times: dict = {k: [] for k in fns}
  for _ in range(rounds):
    for key, (fn, fargs) in fns.items():
      t0 = time.perf_counter()
      for _ in range(reps):
        out = fn(*fargs)
      jax.block_until_ready(out)
      times[key].append((time.perf_counter() - t0) / reps)
  ms = {k: {"min": 1e3 * min(v), "median": 1e3 * statistics.median(v)} for k, v in times.items()}
  ratios = {}
  for key in ms:
    base, _, tag = key.rpartition("/")
    if tag.startswith("new") and f"{base}/old" in ms:
      ratios[f"{base}/{tag}_over_old"] = {s: ms[key][s] / ms[f"{base}/old"][s]
                                          for s in ("min", "median")}
  for key, r in ratios.items():
    print(f"{key}: {r['min']:.3f} (min), {r['median']:.3f} (median)")
  result = {"backend": jax.default_backend(), "device": str(jax.devices()[0].device_kind),
            "jax": jax.__version__, "batch": batch, "rounds": rounds, "reps": reps,
            "ms": ms, "ratios": ratios}
  print(json.dumps(result))
  return result


if __name__ == "__main__":
  main()
