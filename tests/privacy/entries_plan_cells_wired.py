"""Conformance entries of the plan cells wired last: selection x {adaptive, correlated}, per-layer adaptive.

Same test configuration and release as ``entries_plan_cells.py`` (a LINEAR
per-example loss whose gradient ``x e_y^T`` does not depend on the parameters,
``q = 1`` (B = N, users at rate 1), sigma = 8, ``optax.scale(divisor)`` from
``W = 0`` so each step's released parameters are the noisy clipped sum), one
entry per new working cell of ``make_private``:

* ``PrivateSGD.step[selection=fixed_size, clip=adaptive]``: replace-one. The
  replaced row ``-10 x`` (label kept) turns its normalised gradient around: the
  normalised sum moves by 2 and no count moves (every clip binds: ``C_0 =
  2^-10``), the worst case of the gradient block; whitened (Andrew et al. 2021
  Thm 1 with both sensitivities doubled, ``fixed_size_sampling.adaptive_dpsgd_event``)
  the step is the Gaussian mechanism with ``mu = 2 / sigma``, the claim; the
  library states ``SampledWithoutReplacement(N, N, Gaussian(sigma / 2))``.
* ``PrivateSGD.step[selection=user, clip=adaptive]``: add/remove of one user
  (3 examples, mean gradient norm about 10, clipped): the normalised sum of the
  clipped user means moves by 1 and the centred count of users by 1/2, whitened
  shift exactly ``1 / sigma`` (Andrew et al. 2021 Alg. 1 is stated for users);
  ``PoissonSampled(1, Gaussian(sigma))``, unit ``"user"``.
* ``PrivateSGD.step[selection=fixed_size, noise=BandMF]`` and
  ``[selection=user, noise=BandMF]``: T = 3 steps, the matrix mechanism WITHOUT
  amplification (no separation guarantee; Denisov et al. 2022 Thm 2.1), every
  unit in all T steps: sensitivity ``S ||C 1||`` (add/remove of a user) or
  ``2 S ||C 1||`` (replace-one: the ``-10 x`` row moves every step's sum by 2S
  in one direction, the worst case since ``C >= 0``); one
  ``Gaussian(sigma s_1 / sens)`` per run.
* ``PrivateSGD.step[clip=adaptive, per_layer=True]``: Poisson sampling (q = 1),
  params ``{"v": W, "w": W}`` (G = 2 clip groups, the same linear gradient in
  each), one clip norm and one noisy count per group (Andrew et al. 2021 per
  group; McMahan et al. 2018 Sec. 3): group l clipped to ``C_l``, the whole
  divided by ``D = sqrt(sum_l C_l^2)`` (recovered from the public clip norms
  by ``per_layer_normalisation``), counts of std ``sigma_b`` each. Whitened,
  one added example (clip binds in both groups) moves the gradient block by 1
  and each count by 1/2: ``mu^2 = sigma_Delta^-2 + G (2 sigma_b)^-2 = sigma^-2``
  with ``sigma_Delta = (sigma^-2 - G (2 sigma_b)^-2)^-1/2`` written here.

Power: ``test_power.py`` (region "wired plan cells") injects 20% less gradient
noise into each entry.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

import conformance_registry as reg
import entries_dpsgd as dp
import entries_plan_cells as pcells
from jaxdp.accounting import events

SIGMA, CLIP, DELTA, K = pcells.SIGMA, pcells.CLIP, pcells.DELTA, pcells.K
GROUPS = ("v", "w")  # the per-layer cell's params leaves, in jax.tree.leaves order


_entry = functools.partial(
    pcells.plan_entry,
    audit_skip=("the plan is audited through its noise paths (noisy_aggregate, "
                "correlated_noise, adaptive_noisy_aggregate; entries_dpsgd.py, "
                "entries_correlated.py, entries_adaptive_clipping.py); the selection "
                "changes which rows are summed, tested in tests/dpsgd"))


# -- selection x adaptive clip (independent noise, T = 1) --------------------------------------


def user_normalised_sum(data: dict) -> np.ndarray:
  """``sum_u g_u / ||g_u||`` (every user's clip binds at C_0), g_u the mean gradient of user u."""
  g = pcells._gradients(data)  # pylint: disable=protected-access
  ids = np.asarray(data["user"])
  means = np.stack([g[ids == u].mean(axis=0) for u in np.unique(ids)])
  assert np.all(np.linalg.norm(means, axis=1) > 10 * pcells.C0), "some clip would not bind"
  return (means / np.linalg.norm(means, axis=1, keepdims=True)).sum(axis=0)


def _user_adaptive_reference(data: dict) -> np.ndarray:
  count = -0.5 * len(np.unique(np.asarray(data["user"])))  # every user clipped
  return np.concatenate([user_normalised_sum(data) / pcells.gradient_multiplier("independent"),
                         [count / pcells.SIGMA_B]])


def adaptive_selection_entry(selection: str) -> reg.ReleasePoint:
  cell = ("independent", "adaptive", selection, False)
  theorem = ("normalised clipped sum with std sigma_Delta = (sigma^-2 - (2 sigma_b)^-2)^-1/2 "
             "and the centred count with std sigma_b, whitened: std 1 per coordinate (Andrew "
             "et al. 2021 Alg. 1 and Thm 1)")
  if selection == "fixed_size":
    fields = dict(
        neighbouring="replace_one", unit="example", pairs=pcells.replace_one_pairs,
        mu=2.0 / SIGMA, sensitivity=2.0 / SIGMA,
        reference=functools.partial(pcells.adaptive_reference, "independent"),
        event=lambda: events.SampledWithoutReplacementDpEvent(
            dp.N, dp.N, events.GaussianDpEvent(SIGMA / 2, neighbouring=events.REPLACE_ONE,
                                               unit="example")),
        guarantee=("(eps, delta)-DP for replacing one example (N public): fixed-size batches "
                   "(FixedSizeSampler, here B = N) with adaptive clipping; replace-one doubles "
                   "both sensitivities (2 and 1), so the whitened step is the Gaussian "
                   "mechanism with mu = 2 / sigma (Andrew et al. 2021 Thm 1; "
                   "SampledWithoutReplacement(N, B, Gaussian(sigma / 2)), Wang, Balle & "
                   "Kasiviswanathan 2019; at B = N Balle & Wang 2018 Thm 8)"))
  else:
    fields = dict(
        neighbouring="add_remove", unit="user", pairs=pcells.user_pairs, mu=1.0 / SIGMA,
        sensitivity=1.0 / SIGMA, reference=_user_adaptive_reference,
        event=functools.partial(pcells.cell_event, "independent", "user"),
        guarantee=("(eps, delta)-DP for add/remove of one USER: Poisson sampling of users (here "
                   "q = 1), each user's mean gradient clipped to C_t and divided by it "
                   "(sensitivity 1) and one centred unclipped bit per user (1/2), whitened: the "
                   "Gaussian mechanism with mu = 1 / sigma (Andrew et al. 2021 Alg. 1 and "
                   "Thm 1, stated for users; Balle & Wang 2018 Thm 8)"))
  reference = fields.pop("reference")
  return _entry(
      f"{pcells.NAME}[selection={selection}, clip=adaptive]", cell,
      vector=functools.partial(pcells.adaptive_vector, "independent"),
      noise=reg.NoiseSpec(kind="gaussian", scale=1.0, reference=reference, theorem=theorem),
      **fields)


# -- selection x correlated noise (fixed clip, T = 3) -------------------------------------------


def correlated_selection_entry(selection: str, noise: str = "BandMF") -> reg.ReleasePoint:
  cell = (noise, "fixed", selection, False)
  r = pcells.run_ratio(noise)
  scale = 2.0 if selection == "fixed_size" else 1.0  # replace-one doubles the sensitivity
  relation = "replace_one" if selection == "fixed_size" else "add_remove"
  unit = "user" if selection == "user" else "example"
  statistic = pcells.user_clipped_sum if selection == "user" else pcells.clipped_sum
  return _entry(
      f"{pcells.NAME}[selection={selection}, noise={noise}]", cell, neighbouring=relation,
      unit=unit, pairs=pcells.user_pairs if selection == "user" else pcells.replace_one_pairs,
      mu=scale * r / SIGMA, sensitivity=scale * CLIP * r * pcells.s1(noise),
      vector=functools.partial(pcells.fixed_vector, noise),
      noise=reg.NoiseSpec(
          kind="gaussian", scale=SIGMA * CLIP * pcells.s1(noise),
          reference=functools.partial(pcells.fixed_reference, noise, statistic),
          theorem="MF mechanism C x + z with std sigma S ||C[:,0]|| (Denisov et al. 2022 Thm "
                  "2.1; Choquette-Choo et al. 2023 Eq. 1)"),
      event=lambda: events.GaussianDpEvent(SIGMA / (scale * r), neighbouring=relation, unit=unit),
      guarantee=(f"(eps, delta)-DP for {'replacing one example' if scale == 2 else 'add/remove of one user'}: "
                 f"T = {pcells.T_MF} steps of {noise} on "
                 f"{'fixed-size batches' if scale == 2 else 'Poisson-sampled users'}, paid as ONE "
                 "event; no separation guarantee, so the matrix mechanism without amplification "
                 "with every unit in all T steps: sensitivity S ||C 1|| (doubled for replace-one), "
                 "std sigma S ||C[:,0]|| (Denisov et al. 2022 Thm 2.1; Balle & Wang 2018 Thm 8)"))


# -- per-layer adaptive clipping (Poisson, independent noise, T = 1) ----------------------------


def per_layer_gradient_multiplier() -> float:
  """sigma_Delta with G = 2 counts: ``(sigma^-2 - G (2 sigma_b)^-2)^-1/2`` (Andrew et al. Thm 1)."""
  inv_sq = SIGMA ** -2 - len(GROUPS) / (2.0 * pcells.SIGMA_B) ** 2
  assert inv_sq > 0
  return inv_sq ** -0.5


def _two_group_loss(params, x, y):
  xe = x[:, None] * jax.nn.one_hot(y, K)[None, :]
  return jnp.sum(params["v"] * xe) + jnp.sum(params["w"] * xe)


def run_per_layer(key, data, accountant) -> pcells.PlanRun:
  """One step of ``make_private(per_layer=True, l2_clip_norm=AdaptiveClipNorm)`` from zeros.

  ``updates``: (1, G, D*K) the released params per group; ``clip_norms``: (2, G) the
  clip norms before and after the step (float32, ``jax.tree.leaves`` order).
  """
  from jaxdp import dpsgd
  from jaxdp.dpsgd import adaptive_clipping as ac
  n = len(data["y"])
  private = dpsgd.make_private(
      _two_group_loss, l2_clip_norm=pcells._adaptive_config(), per_layer=True,  # pylint: disable=protected-access
      num_examples=n, key=key, noise_multiplier=SIGMA, delta=DELTA, steps=1, sample_rate=1.0,
      optimizer=optax.scale(float(n)), clipping_method="vmap")
  zeros = jnp.zeros((data["x"].shape[1], K), jnp.float32)
  w0 = {"v": zeros, "w": zeros}
  state = private.init(w0)
  sampler = private.sampler(accountant)

  def clips():
    return jnp.stack([jnp.array(c, jnp.float32, copy=True)
                      for c in jax.tree.leaves(ac.current_clip_norm(state.opt_state))])

  before = clips()
  w, state, _ = private.step(w0, state, sampler.sample().gather(data["x"], data["y"]))
  updates = jnp.stack([w[g].reshape(-1) for g in GROUPS])[None]
  return pcells.PlanRun(updates, jnp.stack([before, clips()]), state,
                        jnp.float32(private.expected_batch_size))


def per_layer_vector(out: pcells.PlanRun) -> np.ndarray:
  """The whitened release ``(params / D / sigma_Delta, counts / sigma_b)``, float64."""
  from jaxdp.dpsgd import adaptive_clipping as ac
  norms = np.asarray(out.clip_norms, np.float64)
  unit, _ = ac.per_layer_normalisation(list(np.asarray(out.clip_norms[0], np.float32)))
  sums = np.asarray(out.updates, np.float64)[0] / float(unit)
  qn = float(out.expected_batch_size)
  counts = [pcells.count_from_clip_norms(norms[0, g], norms[1, g], qn)
            for g in range(len(GROUPS))]
  return np.concatenate([sums.reshape(-1) / per_layer_gradient_multiplier(),
                         np.asarray(counts) / pcells.SIGMA_B])


def per_layer_reference(data: dict) -> np.ndarray:
  """Every clip binds at C_0 in both groups: each group sums ``u_n / sqrt(G)``; counts ``-N/2``."""
  part = pcells.normalised_sum(data) / np.sqrt(len(GROUPS))
  count = -0.5 * len(data["y"])
  return np.concatenate([np.tile(part, len(GROUPS)) / per_layer_gradient_multiplier(),
                         np.full(len(GROUPS), count / pcells.SIGMA_B)])


def per_layer_entry() -> reg.ReleasePoint:
  from jaxdp.accounting import PrivacyAccountant
  mu = 1.0 / SIGMA
  entry = _entry(
      f"{pcells.NAME}[noise=independent, clip=adaptive, per_layer=True]",
      ("independent", "adaptive", "poisson", False), neighbouring="add_remove", unit="example",
      pairs=pcells.add_remove_pairs, mu=mu, sensitivity=mu, vector=per_layer_vector,
      noise=reg.NoiseSpec(
          kind="gaussian", scale=1.0, reference=per_layer_reference,
          theorem="per-layer normalised clipped sum with std sigma_Delta = (sigma^-2 - G (2 "
                  "sigma_b)^-2)^-1/2 and G centred counts with std sigma_b, whitened: std 1 per "
                  "coordinate (Andrew et al. 2021 Alg. 1 and Thm 1 per group; McMahan et al. "
                  "2018 Sec. 3)"),
      event=functools.partial(pcells.cell_event, "independent"),
      guarantee=("(eps, delta)-DP for add/remove of one example: one step (q = 1) of per-layer "
                 "adaptive clipping, G = 2 groups each with its own clip norm and noisy count; "
                 "the normalised sum (sensitivity 1) and the G counts (1/2 each), whitened, are "
                 "one Gaussian mechanism with mu = 1 / sigma (Andrew et al. 2021 Thm 1 with G "
                 "counts; Balle & Wang 2018 Thm 8)"))
  import dataclasses  # pylint: disable=g-import-not-at-top
  return dataclasses.replace(
      entry, release=lambda key, data: run_per_layer(key, data, PrivacyAccountant()),
      charged=lambda data, acc: (run_per_layer(jax.random.key(12), data, acc), 1))


for _selection in ("fixed_size", "user"):
  reg.register(adaptive_selection_entry(_selection))
  reg.register(correlated_selection_entry(_selection))
reg.register(per_layer_entry())


# Every check of these cells compiles a whole plan step; the default run covers the same
# clipper and noise code through the Poisson cells of entries_plan_cells.py, and the product
# test trains and pays each of these cells. Their checks and power rows run under slow.
import conformance_checks as _cc  # pylint: disable=wrong-import-position

for _name in ("jaxdp.dpsgd.PrivateSGD.step[selection=fixed_size, clip=adaptive]",
              "jaxdp.dpsgd.PrivateSGD.step[selection=fixed_size, noise=BandMF]",
              "jaxdp.dpsgd.PrivateSGD.step[selection=user, clip=adaptive]",
              "jaxdp.dpsgd.PrivateSGD.step[selection=user, noise=BandMF]",
              "jaxdp.dpsgd.PrivateSGD.step[noise=independent, clip=adaptive, per_layer=True]"):
  _cc.slow_checks(_name)
