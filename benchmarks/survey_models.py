"""Classic DP models (jaxdp.classic) vs diffprivlib: fit time ratios and accuracy at equal epsilon.

Paper 004 (``../shared/papers/004_dp_machine_learning_survey.md``) Sec. 3. Two
measurements from one run:

1. **Fit time** of each model on Adult (naive Bayes, random trees, k-means)
   and MNIST (PCA, rows scaled by 1/28): jaxdp (warm: the jit compile is timed
   separately as ``compile_s``) vs diffprivlib 0.6.6, median of ``reps`` fits,
   jaxdp's asynchronous dispatch included (``block_until_ready``). The ratio is
   ``diffprivlib / jaxdp`` (> 1: jaxdp faster).
2. **Metric at epsilon in {0.1, 1, 10}** for both libraries with the same
   declared bounds (``configs/survey_models.py``): test accuracy, k-means test
   cost over scikit-learn's, PCA captured test second moment (jaxdp PCA with
   the pure-DP Laplace variant, the same guarantee as diffprivlib's).

``--quick`` (1-2 min on two cores): 10,000 Adult rows, 10,000 MNIST rows, 2
seeds, 3 timing reps. Needs ``$JAXDP_DATA_DIR`` and diffprivlib (``pip install
-e .[compare]``; ``--jaxdp-only`` times and scores jaxdp alone). The LAST printed
line is one JSON object with every figure.

``--noise discrete|continuous|both`` (default ``discrete``, the library's
default): the noise of the low-dimensional classic releases (naive Bayes,
random trees, k-means; PCA is always continuous), passed to the estimators as
their ``noise`` argument. ``both`` measures the two in one run: the figures are
keyed ``<model>/<dataset>[noise=<kind>]`` and ``discrete_cost`` gives the fit-time
ratio discrete / continuous of each model (the speed cost of the discrete default).

Usage: python benchmarks/survey_models.py [--quick] [--jaxdp-only] [--noise both]
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import multiprocessing
import pathlib
import time
import types

import numpy as np

from jaxdp.results_io import strict_json

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _load_module(name, path):
  spec = importlib.util.spec_from_file_location(name, path)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


def _diffprivlib_child(conn, model, eps, seed, d, config):
  """Runs one diffprivlib fit in a child process (see :func:`_fit_with_timeout`)."""
  sm = _load_module("survey_models_experiment", ROOT / "experiments" / "survey_models.py")
  conn.send(sm.fit_and_score(model, "diffprivlib", eps, seed, d, config, sm.import_diffprivlib()))
  conn.close()


def _fit_with_timeout(model, eps, seed, d, config, timeout_s):
  """``fit_and_score`` for diffprivlib in a child process; None when it exceeds ``timeout_s``.

  diffprivlib's PCA samples eigenvectors with a Gibbs sampler (Hoff 2009) whose
  cost grows steeply with the dimension: at d = 784 (MNIST pixels) one fit did
  not finish in 8 minutes on this machine, so the benchmark reports a timeout
  instead of hanging.
  """
  ctx = multiprocessing.get_context("spawn")
  parent, child = ctx.Pipe(duplex=False)
  proc = ctx.Process(target=_diffprivlib_child, args=(child, model, eps, seed, d, config))
  proc.start()
  if parent.poll(timeout_s):
    out = parent.recv()
    proc.join()
    return out
  proc.kill()
  proc.join()
  return None


NOISE_MODELS = {"naive_bayes": "PrivateNaiveBayes", "random_trees": "PrivateRandomTrees",
                "kmeans": "PrivateKMeans"}


def _with_noise(sm, noise):
  """The experiment module with its ``classic`` estimators built with ``noise=noise``."""
  classic = sm.classic
  patched = {name: functools.partial(getattr(classic, name), noise=noise)
             for name in NOISE_MODELS.values()}
  view = types.SimpleNamespace(**{k: getattr(classic, k) for k in dir(classic)
                                  if not k.startswith("__")})
  vars(view).update(patched)
  sm_view = types.SimpleNamespace(**vars(sm))
  # fit_and_score looks ``classic`` up in its module globals: run it with the patched view.
  fn = sm.fit_and_score
  glb = dict(fn.__globals__, classic=view)
  sm_view.fit_and_score = types.FunctionType(fn.__code__, glb, fn.__name__, fn.__defaults__,
                                             fn.__closure__)
  return sm_view


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--quick", action="store_true")
  parser.add_argument("--diffprivlib-timeout", type=float, default=120.0,
                      help="seconds one diffprivlib fit may take before it is reported as a timeout")
  parser.add_argument("--jaxdp-only", action="store_true",
                      help="time and score jaxdp only (no diffprivlib needed)")
  parser.add_argument("--noise", choices=("discrete", "continuous", "both"), default="discrete",
                      help="noise of the naive Bayes, random trees and k-means releases")
  args = parser.parse_args()
  base = _load_module("survey_models_experiment", ROOT / "experiments" / "survey_models.py")
  config = _load_module("survey_models_config", ROOT / "configs" / "survey_models.py").get_config()
  dpl = None if args.jaxdp_only else base.import_diffprivlib()
  if dpl is None and not args.jaxdp_only:
    raise SystemExit("diffprivlib is needed for this benchmark: pip install -e .[compare] "
                     "(or pass --jaxdp-only)")
  noises = ("discrete", "continuous") if args.noise == "both" else (args.noise,)
  n = 10_000 if args.quick else 0
  seeds = 2 if args.quick else 5
  reps = 3 if args.quick else 5
  epsilons = (0.1, 1.0, 10.0)
  config.n_train = n
  data = {"adult": base.load(config)}
  config.dataset = "mnist"
  data["mnist"] = base.load(config)
  config.dataset = "adult"
  plan = [("naive_bayes", "adult"), ("random_trees", "adult"), ("kmeans", "adult"),
          ("pca_laplace", "mnist")]
  figures = {"quick": args.quick, "n_train_adult": int(len(data["adult"]["y"])),
             "n_train_mnist": int(len(data["mnist"]["y"])), "timing": {}, "metric": {}}
  print("machine: 2 CPU cores shared with other jobs; timings are noisy, ratios are from one run.")
  figures["noise"] = args.noise
  runs = [(model, ds, noise) for model, ds in plan
          for noise in (noises if model in NOISE_MODELS else ("continuous",))]
  for model, ds, noise in runs:
    d = data[ds]
    config.dataset = ds
    sm = _with_noise(base, noise) if model in NOISE_MODELS else base
    tag = f"{model}/{ds}" + (f"[noise={noise}]" if model in NOISE_MODELS else "")
    t0 = time.perf_counter()
    sm.fit_and_score(model, "jaxdp", 1.0, 10_000, d, config, dpl)   # compile
    compile_s = time.perf_counter() - t0
    dpl_model = "pca" if model == "pca_laplace" else model
    ours = [sm.fit_and_score(model, "jaxdp", 1.0, 20_000 + r, d, config, dpl)[1] for r in range(reps)]
    o = float(np.median(ours))
    first = (None if dpl is None
             else _fit_with_timeout(dpl_model, 1.0, 0, d, config, args.diffprivlib_timeout))
    if dpl is None:
      figures["timing"][tag] = dict(jaxdp_s=o, jaxdp_compile_s=compile_s)
      print(f"{tag:>40s}: jaxdp {o * 1e3:8.1f} ms (compile {compile_s:5.1f} s)")
    elif first is None:  # diffprivlib did not finish: report it, time and score jaxdp only
      figures["timing"][tag] = dict(
          jaxdp_s=o, diffprivlib_s=f"> {args.diffprivlib_timeout:g} s (timeout)",
          jaxdp_compile_s=compile_s)
      print(f"{tag:>40s}: jaxdp {o * 1e3:8.1f} ms (compile {compile_s:5.1f} s), "
            f"diffprivlib did not finish one fit in {args.diffprivlib_timeout:g} s")
    else:
      theirs = [first[1]] + [sm.fit_and_score(dpl_model, "diffprivlib", 1.0, r, d, config, dpl)[1]
                             for r in range(1, reps)]
      t = float(np.median(theirs))
      figures["timing"][tag] = dict(jaxdp_s=o, diffprivlib_s=t, ratio=t / o,
                                                jaxdp_compile_s=compile_s)
      print(f"{tag:>40s}: jaxdp {o * 1e3:8.1f} ms (compile {compile_s:5.1f} s), "
            f"diffprivlib {t * 1e3:8.1f} ms -> diffprivlib/jaxdp = {t / o:5.2f}x")
    for eps in epsilons:
      mo = [sm.fit_and_score(model, "jaxdp", eps, 30_000 + s, d, config, dpl)[0] for s in range(seeds)]
      mt = ([sm.fit_and_score(dpl_model, "diffprivlib", eps, 40_000 + s, d, config, dpl)[0]
             for s in range(seeds)] if first is not None else [float("nan")])
      figures["metric"][f"{tag}/eps={eps:g}"] = dict(
          jaxdp=float(np.mean(mo)), diffprivlib=float(np.mean(mt)), seeds=seeds)
      print(f"{'':>40s} ε={eps:<4g} {sm.METRIC_LABEL[model]}: jaxdp {np.mean(mo):.4f} "
            f"diffprivlib {np.mean(mt):.4f} (mean of {seeds})")
  if args.noise == "both":
    figures["discrete_cost"] = {
        f"{model}/{ds}": figures["timing"][f"{model}/{ds}[noise=discrete]"]["jaxdp_s"]
        / figures["timing"][f"{model}/{ds}[noise=continuous]"]["jaxdp_s"]
        for model, ds in plan if model in NOISE_MODELS}
    for key, ratio in figures["discrete_cost"].items():
      print(f"{key:>40s}: fit time discrete / continuous = {ratio:5.2f}x")
  print(json.dumps(strict_json(figures)))


if __name__ == "__main__":
  main()
