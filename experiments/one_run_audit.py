"""One-run privacy audits of DP-SGD plans (Steinke et al. 2023; Mahloujifar et al. 2024).

Usage::

  python experiments/one_run_audit.py
  python experiments/one_run_audit.py --config.num_canaries=500 --config.epsilons=2.0,8.0

For each claimed epsilon and each plan, ONE DP-SGD run of a softmax linear
model on digits with ``num_canaries`` white-box Dirac canaries
(:func:`jaxdp.audit.one_run_canaries.with_dirac_canaries`), each included with
probability 1/2, then both one-run analyses (:mod:`jaxdp.audit.one_run`) at
95% family-wise confidence over the default (k+, k-) grid:

* ``correct``: ``make_private(target_epsilon=eps, ...)`` audited against its
  ledger epsilon (:func:`jaxdp.audit.one_run_canaries.audit_dpsgd_run`); the
  bound must stay below the claim.
* ``noise_div10``: the same plan built with ``noise_multiplier = sigma / 10``
  (sigma of the correct plan), audited against the correct plan's epsilon.
* ``skip_sampling``: the correct plan, but the canaries join EVERY step outside
  the Poisson sampler (a loop that appends a fixed set of rows to each batch:
  sampling rate 1 for them while epsilon is claimed for q); the run is paid on
  the ledger as usual.

Writes ``results/one_run_audit/digits/{points.jsonl,results.csv,one_run_audit.png}``
and copies the CSV to ``config.csv_copy`` (``docs/data/one_run_audit.csv``) with
the figure beside it. Every finished point is appended to ``points.jsonl``;
re-running resumes (:class:`jaxdp.results_io.PointLog`).
"""

from __future__ import annotations

import pathlib
import shutil
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import app
from ml_collections import config_flags
from tqdm import tqdm

from jaxdp import data as jdata
from jaxdp import results_io
from jaxdp.accounting import PrivacyAccountant
from jaxdp.audit import one_run
from jaxdp.audit import one_run_canaries as oc
from jaxdp.dpsgd import make_private

CONFIG_FILE = pathlib.Path(__file__).resolve().parents[1] / "configs" / "one_run_audit.py"
RESULT_FIELDS = ("dataset", "delta", "num_canaries", "expected_batch_size", "epochs",
                 "l2_clip_norm", "learning_rate", "confidence", "seed")


def linear_loss(params, x, y):
  logits = x @ params["w"] + params["b"]
  return -jax.nn.log_softmax(logits)[y]


def _plan_args(config):
  return dict(l2_clip_norm=config.l2_clip_norm, expected_batch_size=config.expected_batch_size,
              optimizer=optax.sgd(config.learning_rate))


def _run_skip_sampling(config, x, y, key, sigma, steps):
  """The broken loop: canaries added to every step outside the sampler (rate 1 instead of q)."""
  m = config.num_canaries
  k_coins, k_plan = jax.random.split(key)
  included = oc.include_coins(k_coins, m)
  scale = 2.0 * config.l2_clip_norm
  loss = oc.with_dirac_canaries(linear_loss, scale)
  # Every canary slot is a null row for the sampler: the canaries never enter through it ...
  arrays = oc.mix_gradient_canaries(x, y, np.zeros(m, bool))
  plan = make_private(loss, num_examples=int(arrays[0].shape[0]), key=k_plan, delta=config.delta,
                      noise_multiplier=sigma, steps=steps, batch_argnums=(1, 2, 3),
                      **_plan_args(config))
  accountant = PrivacyAccountant()
  sampler = plan.sampler(accountant, data=arrays)
  params = ({"w": jnp.zeros((x.shape[1], 10)), "b": jnp.zeros(10)}, jnp.zeros(m))
  state = plan.init(params)
  # ... and the bug: each included canary's clipped gradient C e_i joins every step's sum.
  canary_sum = config.l2_clip_norm * jnp.asarray(included, jnp.float32)
  while sampler.steps_remaining:
    params, state, _ = plan.step(params, state, sampler.sample())
    params = (params[0], params[1] - config.learning_rate * canary_sum / plan.expected_batch_size)
  claimed = float(sampler.epsilon())
  scores = -np.asarray(params[1], np.float64)
  return scores, included, claimed


def run_point(config, x, y, plan_name, eps, sigma_steps):
  key = jax.random.key(results_io.point_seed([config.seed, plan_name, eps]))
  t0 = time.time()
  m = config.num_canaries
  params0 = {"w": jnp.zeros((x.shape[1], 10)), "b": jnp.zeros(10)}
  if plan_name == "correct":
    res = oc.audit_dpsgd_run(linear_loss, params0, x, y, key=key, accountant=PrivacyAccountant(),
                             delta=config.delta, num_canaries=m, canary="dirac",
                             target_epsilon=eps, epochs=config.epochs, confidence=config.confidence,
                             **_plan_args(config))
    sigma, steps = res.plan.noise_multiplier, res.plan.steps
    st, fd, claimed = res.steinke, res.fdp, res.epsilon_claimed
  else:
    sigma, steps, claimed = sigma_steps
    if plan_name == "noise_div10":
      res = oc.audit_dpsgd_run(linear_loss, params0, x, y, key=key,
                               accountant=PrivacyAccountant(), delta=config.delta,
                               num_canaries=m, canary="dirac", noise_multiplier=sigma / 10,
                               steps=steps, epsilon_claimed=claimed,
                               confidence=config.confidence, **_plan_args(config))
      st, fd = res.steinke, res.fdp
    else:
      scores, included, claimed = _run_skip_sampling(config, x, y, key, sigma, steps)
      common = dict(epsilon_claimed=claimed, delta=config.delta, confidence=config.confidence)
      st = one_run.one_run_audit(scores, included, method="steinke", **common)
      fd = one_run.one_run_audit(scores, included, method="fdp", **common)
  return [{
      "plan": plan_name, "broken": plan_name != "correct", "epsilon_target": eps,
      "epsilon_claimed": claimed, "noise_multiplier_trained": sigma / 10 if plan_name ==
      "noise_div10" else sigma, "steps": steps, "num_canaries": m,
      "bound_steinke": st.epsilon_lower_bound, "bound_fdp": fd.epsilon_lower_bound,
      "mu_fdp": fd.mu_lower_bound, "ratio_steinke": st.epsilon_lower_bound / claimed,
      "ratio_fdp": fd.epsilon_lower_bound / claimed,
      "exceeds_claim_steinke": st.violates_claim, "exceeds_claim_fdp": fd.violates_claim,
      "k_plus": st.k_plus, "k_minus": st.k_minus, "correct_guesses": st.num_correct,
      "guesses": st.num_guesses, "k_plus_fdp": fd.k_plus, "k_minus_fdp": fd.k_minus,
      "correct_guesses_fdp": fd.num_correct, "guesses_fdp": fd.num_guesses,
      "confidence": st.confidence, "num_hypotheses": st.num_hypotheses,
      "seconds": time.time() - t0}]


def main(config) -> list[dict]:
  ds = jdata.load(config.dataset, data_dir=config.data_dir or None)
  x = np.asarray(ds.x_train, np.float32)
  y = np.asarray(ds.y_train, np.int32)
  log, out = results_io.open_point_log(config, RESULT_FIELDS)
  rows = []
  todo = [(p, float(e)) for e in config.epsilons for p in ("correct",) + tuple(
      q for q in config.plans if q != "correct")]
  correct = {}
  for plan_name, eps in tqdm(todo, desc="one-run audits"):
    key = [plan_name, eps]
    got = log.get(key)
    if got is None:
      if plan_name != "correct" and eps not in correct:
        got_c = log.get(["correct", eps]) or run_point(config, x, y, "correct", eps, None)
        correct[eps] = got_c[0]
      sigma_steps = None
      if plan_name != "correct":
        c = correct[eps]
        sigma_steps = (c["noise_multiplier_trained"], int(c["steps"]), c["epsilon_claimed"])
      got = log.append(key, run_point(config, x, y, plan_name, eps, sigma_steps))
    if plan_name == "correct":
      correct[eps] = got[0]
    if plan_name in config.plans:
      rows += got
  results_io.write_csv_atomic(out / "results.csv", rows)
  fig_path = out / "one_run_audit.png"
  plot(rows, fig_path, config)
  if config.csv_copy:
    dst = pathlib.Path(config.csv_copy)
    dst.parent.mkdir(parents=True, exist_ok=True)
    results_io.write_csv_atomic(dst, rows)
    shutil.copyfile(fig_path, dst.with_suffix(".png"))
  for r in rows:
    print(f"{r['plan']:>13} eps={r['epsilon_claimed']:.3f}  steinke={r['bound_steinke']:.3f}  "
          f"fdp={r['bound_fdp']:.3f}  ratio={r['ratio_steinke']:.2f}/{r['ratio_fdp']:.2f}")
  return rows


def plot(rows, path, config):
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  fig, ax = plt.subplots(figsize=(6.5, 4.5))
  colors = {"correct": "tab:green", "noise_div10": "tab:red", "skip_sampling": "tab:purple"}
  for plan_name in dict.fromkeys(r["plan"] for r in rows):
    sel = sorted((r for r in rows if r["plan"] == plan_name), key=lambda r: r["epsilon_claimed"])
    e = [r["epsilon_claimed"] for r in sel]
    ax.plot(e, [r["bound_steinke"] for r in sel], "o--", color=colors.get(plan_name),
            label=f"{plan_name}: Steinke et al.")
    ax.plot(e, [r["bound_fdp"] for r in sel], "s-", color=colors.get(plan_name),
            label=f"{plan_name}: f-DP (Gaussian)")
  lim = max(max(r["epsilon_claimed"] for r in rows), 1.0) * 1.1
  ax.plot([0, lim], [0, lim], "k:", label="bound = claimed epsilon")
  ax.set_xlabel("claimed epsilon (ledger, delta = %g)" % config.delta)
  ax.set_ylabel("one-run lower bound on epsilon (95%)")
  ax.set_title(f"One-run audits, {config.dataset}, m = {config.num_canaries} Dirac canaries")
  ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


if __name__ == "__main__":
  _CONFIG = config_flags.DEFINE_config_file("config", str(CONFIG_FILE), "experiment config")
  app.run(lambda argv: main(_CONFIG.value) and None)
