"""Conformance entries of the DP-SGD plan: one release point per cell of ``make_private``.

``jaxdp.dpsgd.make_private(...)`` composes a batch selection, a clipper and a
noise; its release is :meth:`PrivateSGD.step` (the sampler pays before the
batch exists). One entry per cell, all built by :func:`plan_cell` from one
release function (:func:`run_plan`):

* noise x clip: noise in {independent (DP-SGD), ``BandMF``, ``BLT``} x clip in
  {fixed ``l2_clip_norm=C``, ``AdaptiveClipNorm``}, Poisson sampling of
  examples (cyclic Poisson over ``min_separation = 1`` group for the
  correlated noises): ``PrivateSGD.step[noise=<n>, clip=<c>]``;
* the device-resident path of the DP-SGD cell,
  ``PrivateSGD.step[noise=independent, clip=fixed, data=device]``;
* the batch selections ``PrivateSGD.step[selection=fixed_size]``
  (``FixedSizeSampler``: replace-one, ``SampledWithoutReplacement(N, B,
  Gaussian(sigma / 2))``) and ``PrivateSGD.step[selection=user]``
  (``UserPoissonSampler``: unit ``"user"``, one clipped contribution per user).

Test configuration. A LINEAR per-example loss ``<W, x e_y^T>`` whose gradient
``x e_y^T`` does not depend on W (so every step's statistic is known exactly
in float64 whatever the earlier updates were), inputs of width
``dp.D_WIDE = 64`` (192 noise coordinates per step, so the noise check needs
few calls), ``q = 1`` (the sample is every example: data-independent, and the
added example takes part in every step, the worst case), sigma = 8 (a large
multiplier keeps the charge check's PLD accounting cheap; every check is
scale-free), and
``optax.scale(q N)`` applied to ``W = 0`` at every step, so each step's
released parameters are exactly the noisy clipped sum ``x_t + w_t``. The
base rows have ``||x|| = 1``; the worst-case neighbour adds ``x = 10 e_0``
with label ``K - 1`` (its gradient norm 10 makes every clip bind).

Noise (all numbers from the theorems, never from the library's calibration):

* independent: ``T = 1`` step, ``N(0, (sigma S)^2 I)`` on the clipped sum
  (Abadi et al. 2016 Alg. 1), the strategy matrix ``C = [1]``;
* ``BandMF`` / ``BLT``: ``T = 3`` steps, the MF mechanism ``C x + z`` with
  ``z ~ N(0, (sigma_g S s_1)^2 I)``, ``s_1 = ||C[:, 0]||`` (Denisov et al.
  2022; Choquette-Choo et al. 2023 Eq. 1); the private vector is ``C`` (float64,
  here) times the stacked noisy sums. With ``b = 1`` and ``q = 1`` the run is ONE
  Gaussian mechanism (no amplification) whose L2 sensitivity is ``S ||C 1||``
  (both strategies have non-negative entries, so equal directions are worst),
  i.e. ``mu = r / sigma`` with ``r = ||C 1|| / s_1``.

Clip (S is the sensitivity of one participation):

* fixed: ``S = C = 1``; the vector is ``C (x + w)`` itself, noise scale
  ``sigma S s_1`` and sensitivity ``S ||C 1||``;
* adaptive (Andrew, Thakkar, McMahan & Ramaswamy 2021, Alg. 1): each step
  releases the NORMALISED clipped sum (gradients divided by C_t and clipped to
  1: sensitivity 1 per participation) with noise ``sigma_Delta s_1`` and the
  centered unclipped count ``sum_i (1[||g_i|| <= C_t] - 1/2)`` (sensitivity 1/2)
  with noise ``sigma_b`` (both recovered here: the sum from ``params / C_t``,
  the count from ``C_{t+1} / C_t`` inverted in float64). Whitening (Andrew et
  al. 2021 Thm 1): dividing each part by its noise std is invertible, so the
  run is the Gaussian mechanism of sensitivity ``(||C 1||^2 / (sigma_Delta
  s_1)^2 + k / (2 sigma_b)^2)^1/2`` (k = T counts the example moves by 1/2). The
  gradient share that makes this ``r / sigma``, the claim, is
  ``sigma_Delta = r (r^2 / sigma^2 - k / (2 sigma_b)^2)^-1/2`` (for ``C = [1]``:
  ``(sigma^-2 - (2 sigma_b)^-2)^-1/2``, Thm 1 itself). The private vector is
  the whitened pair, noise scale 1 in every coordinate, sensitivity
  ``r / sigma``. ``sigma_b = 8``, ``gamma = 1/2``, ``eta = 1/2`` and ``C_0 =
  2^-10``, far below every gradient norm (1 and 10), so every clip binds at
  every step (``log C_t`` drifts up by ``eta gamma = 1/4`` a step with noise
  ``eta sigma_b / (q N) <= 1/4``: after 2 steps ``C_t`` is 18 noise standard
  deviations below the smallest norm): the normalised sum is ``sum_n x_n
  e_{y_n}^T / ||x_n||`` and the count ``-N/2`` at every step, exactly.

Batch selections (independent noise, fixed clip, T = 1):

* fixed size: ``FixedSizeSampler(N, B = N)``; B = N makes the subset every row
  (a uniform B-subset of N, deterministic at B = N: the noise check sees pure
  noise; the subset's uniformity for B < N is tested in
  tests/dpsgd/test_fixed_size_sampling.py). Replace-one pairs (N public):
  the last row replaced by ``-10 x`` with the same label (its clipped gradient
  points against the replaced one's: the sum moves by exactly ``2C``). At B = N
  the step is the Gaussian mechanism of sensitivity ``2C`` and std ``sigma C``
  (Balle & Wang 2018 Thm 8, ``mu = 2 / sigma``); the library states it as
  ``SampledWithoutReplacement(N, N, Gaussian(sigma / 2, replace_one))``.
* users: ``UserPoissonSampler(user_ids, sample_rate=1, max_examples_per_user=4)``
  with 6 users of 1 to 4 examples; the release is ``sum_u clip_C(g_u) + N(0,
  (sigma C)^2 I)`` with ``g_u`` the MEAN of user u's gradients (McMahan et al.
  2018); adding one user (3 examples, mean gradient norm about 10: the clip
  binds) moves it by C: unit ``"user"``, ``PoissonSampled(1, Gaussian(sigma))``.

The claimed epsilon of each entry is the exact Gaussian epsilon at ``mu``
(Balle & Wang 2018 Thm 8), tighter than the library's accountant.

Cost: every cell is vmapped over the release key (the checks batch the keys);
each distinct dataset compiles the plan's step once. Only the worst-case pair is
given (the remaining pairs of the family are exercised by the transform entries
of entries_dpsgd.py, entries_correlated.py and entries_adaptive_clipping.py,
which run the same noise and clipping code on every pair).
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

import conformance_registry as reg
import entries_dpsgd as dp
from jaxdp.accounting import events

FAMILY = "dpsgd"
NAME = "jaxdp.dpsgd.PrivateSGD.step"
# sigma = 8: the events' multipliers (sigma, sigma / r >= 3.7) keep the charge check's PLD
# accounting cheap (0.1 s an epsilon instead of 2-3 s at sigma / r = 0.47); every check is
# scale-free (the noise check's thresholds are relative, replay is noise-free).
SIGMA = 8.0
CLIP = dp.CLIP
DELTA = dp.DELTA
WIDTH = dp.D_WIDE
K = dp.K
T_MF = 3
# Adaptive clipping (Andrew et al. 2021): C_0, target quantile gamma, geometric rate eta,
# count noise sigma_b (given explicitly, the same on D and D').
C0 = 2.0 ** -10
GAMMA = 0.5
ETA = 0.5
SIGMA_B = 8.0

NOISES = ("independent", "BandMF", "BLT")
CLIPS = ("fixed", "adaptive")


# -- strategies: the T x T matrix C of each noise (C = [1] for independent noise) -----------


def _strategy(noise: str):
  """The library strategy object of ``noise`` (None for independent noise)."""
  if noise == "independent":
    return None
  from jaxdp.dpsgd import correlated
  if noise == "BandMF":
    return correlated.BandMF(np.array([1.0, 0.6]))
  if noise == "BLT":
    return correlated.BLT(np.array([0.7]), np.array([0.5]))
  raise ValueError(noise)


def _steps(noise: str) -> int:
  return 1 if noise == "independent" else T_MF


@functools.lru_cache(maxsize=None)
def matrix(noise: str) -> np.ndarray:
  """The strategy matrix C (float64), written here from the strategy's definition.

  BandMF with coefficients ``(1, 0.6)``: lower-triangular Toeplitz, ``C[t, t] = 1``,
  ``C[t + 1, t] = 0.6`` (Choquette-Choo et al. 2023, banded Toeplitz). BLT with
  decay 0.7 and weight 0.5: ``C[t, t] = 1``, ``C[t + j, t] = 0.5 * 0.7^(j - 1)``
  for j >= 1 (Dvijotham et al. 2024, buffered linear Toeplitz: one buffer). The
  library's ``strategy.matrix(T)`` must equal it (asserted once at import).
  """
  t = _steps(noise)
  if noise == "independent":
    c = np.eye(1)
  elif noise == "BandMF":
    c = np.eye(t) + 0.6 * np.eye(t, k=-1)
  else:
    c = np.eye(t)
    for j in range(1, t):
      c += 0.5 * 0.7 ** (j - 1) * np.eye(t, k=-j)
  return c


def s1(noise: str) -> float:
  """``||C[:, 0]||``: the single-participation sensitivity factor (largest column norm)."""
  c = matrix(noise)
  return float(np.max(np.linalg.norm(c, axis=0)))


def run_ratio(noise: str) -> float:
  """``r = ||C 1|| / s_1``: the run's sensitivity in units of one participation's.

  ``C >= 0`` entrywise, so ``C^T C >= 0`` and contributions of one direction in
  every step are the worst case: ``max ||C u|| = ||C 1||`` over ``|u_t| <= 1``.
  """
  c = matrix(noise)
  return float(np.linalg.norm(c @ np.ones(c.shape[0]))) / s1(noise)


def gradient_multiplier(noise: str) -> float:
  """sigma_Delta: the gradient share of sigma with adaptive clipping (Andrew et al. Thm 1).

  ``(r / sigma)^2 = (r / sigma_Delta)^2 + k / (2 sigma_b)^2`` (whitening) solved for
  sigma_Delta, float64, k = T counts.
  """
  r, k = run_ratio(noise), _steps(noise)
  inv_sq = (r / SIGMA) ** 2 - k / (2.0 * SIGMA_B) ** 2
  assert inv_sq > 0, "the counts alone would exceed the budget"
  return r * inv_sq ** -0.5


# -- datasets ------------------------------------------------------------------------------


def _far_row() -> np.ndarray:
  x = np.zeros(WIDTH, np.float32)
  x[0] = 10.0
  return x


def add_remove_pairs() -> list:
  """The worst case: one example whose clip binds (``10 e_0``, label K - 1) added."""
  base = dp._base(WIDTH)  # pylint: disable=protected-access
  return [(base, dp._add(base, _far_row(), K - 1))]  # pylint: disable=protected-access


def replace_one_pairs() -> list:
  """The last row replaced by ``-10 x`` with its label: the clipped sum moves by exactly 2C."""
  base = dp._base(WIDTH)  # pylint: disable=protected-access
  other = {"x": base["x"].copy(), "y": base["y"].copy()}
  other["x"][-1] = -10.0 * base["x"][-1]
  return [(base, other)]


USER_IDS = np.repeat(np.arange(6), [3, 2, 4, 1, 3, 3]) * 10 + 7  # 16 rows, 6 users (1..4 each)
MAX_PER_USER = 4


def user_pairs() -> list:
  """Add/remove of one USER: 3 examples (``10 e_0 + e_1``, ...) of a new id, clip binds."""
  base = dp._base(WIDTH)  # pylint: disable=protected-access
  base = {"x": base["x"], "y": base["y"], "user": USER_IDS.astype(np.int32)}
  rows = np.zeros((3, WIDTH), np.float32)
  rows[:, 0] = 10.0
  rows[1, 1], rows[2, 2] = 1.0, -1.0
  added = {"x": np.concatenate([base["x"], rows]),
           "y": np.concatenate([base["y"], np.full(3, K - 1, np.int32)]),
           "user": np.concatenate([base["user"], np.full(3, 1000, np.int32)])}
  return [(base, added)]


# -- exact statistics (float64) --------------------------------------------------------------


def _gradients(data: dict) -> np.ndarray:
  """Per-example gradients ``x_n e_{y_n}^T`` of the linear loss, (N, D*K) float64."""
  x = np.asarray(data["x"], np.float64)
  onehot = np.eye(K)[np.asarray(data["y"])]
  return np.einsum("nd,nk->ndk", x, onehot).reshape(len(x), -1)


def _clip_rows(g: np.ndarray, bound: float) -> np.ndarray:
  norms = np.linalg.norm(g, axis=1)
  return g * np.minimum(1.0, bound / np.where(norms > 0, norms, 1.0))[:, None]


def clipped_sum(data: dict) -> np.ndarray:
  """``sum_n clip_C(g_n)`` (D*K,)."""
  return _clip_rows(_gradients(data), CLIP).sum(axis=0)


def normalised_sum(data: dict) -> np.ndarray:
  """``sum_n clip_1(g_n / C_t)`` when every clip binds: ``sum_n g_n / ||g_n||`` (D*K,)."""
  g = _gradients(data)
  assert np.all(np.linalg.norm(g, axis=1) > 10 * C0), "some clip would not bind"
  return _clip_rows(g, 1.0).sum(axis=0)


def user_clipped_sum(data: dict) -> np.ndarray:
  """``sum_u clip_C(mean_{n in u} g_n)`` (D*K,): one clipped contribution per user."""
  g = _gradients(data)
  ids = np.asarray(data["user"])
  means = np.stack([g[ids == u].mean(axis=0) for u in np.unique(ids)])
  return _clip_rows(means, CLIP).sum(axis=0)


# -- the release ---------------------------------------------------------------------------


class PlanRun(NamedTuple):
  """What a run of the plan releases, stacked over its T steps.

  ``updates``: (T, D, K) params after each step (each step starts from W = 0);
  ``clip_norms``: (T + 1,) the clip norm before each step and after the last;
  ``state``: the final ``PrivateState`` (noise keys, BandMF history, C_T);
  ``expected_batch_size``: the plan's public ``q N`` (or ``q U``, or B).
  """
  updates: Any
  clip_norms: Any
  state: Any
  expected_batch_size: Any


def _linear_loss(w, x, y):
  return jnp.sum(w * (x[:, None] * jax.nn.one_hot(y, K)[None, :]))


def _adaptive_config():
  from jaxdp import dpsgd
  return dpsgd.AdaptiveClipNorm(initial=C0, target_quantile=GAMMA, learning_rate=ETA,
                                count_noise_multiplier=SIGMA_B)


def run_plan(noise: str, clip: str, selection: str, device: bool, key, data, accountant
             ) -> PlanRun:
  """T steps of ``make_private(...)`` for the cell; every step starts from ``W = 0``."""
  from jaxdp import dpsgd
  from jaxdp.dpsgd import adaptive_clipping as ac
  n = len(data["y"])
  steps = _steps(noise)
  kwargs: dict = {}
  if selection == "poisson":
    kwargs["sample_rate"] = 1.0
    divisor = float(n)
  elif selection == "fixed_size":
    from jaxdp.dpsgd import fixed_size_sampling
    kwargs.update(batch_selection=fixed_size_sampling.FixedSizeSampler(n, n),
                  neighbouring="replace_one")
    divisor = float(n)
  else:
    from jaxdp.dpsgd import user_sampling
    sampler = user_sampling.UserPoissonSampler(
        np.asarray(data["user"]), sample_rate=1.0, max_examples_per_user=MAX_PER_USER)
    kwargs["batch_selection"] = sampler
    divisor = sampler.expected_batch_size
  if noise != "independent":
    kwargs.update(noise_strategy=_strategy(noise), min_separation=1)
  clip_norm = _adaptive_config() if clip == "adaptive" else CLIP
  private = dpsgd.make_private(
      _linear_loss, l2_clip_norm=clip_norm, num_examples=n, key=key, noise_multiplier=SIGMA,
      delta=DELTA, steps=steps, optimizer=optax.scale(divisor), clipping_method="vmap", **kwargs)
  w0 = jnp.zeros((data["x"].shape[1], K), jnp.float32)
  state = private.init(w0)
  arrays = (data["x"], data["y"])
  sampler = private.sampler(accountant, data=arrays) if device else private.sampler(accountant)

  def clip_now():  # a copy: a correlated-noise step donates (deletes) the state it consumed
    if clip == "adaptive":
      return jnp.array(ac.current_clip_norm(state.opt_state), jnp.float32, copy=True)
    return jnp.float32(CLIP)

  updates, norms = [], []
  for _ in range(steps):
    norms.append(clip_now())
    batch = sampler.sample() if device else sampler.sample().gather(*arrays)
    w, state, _ = private.step(w0, state, batch)
    updates.append(w)
  norms.append(clip_now())
  return PlanRun(jnp.stack(updates), jnp.stack(norms), state,
                 jnp.float32(private.expected_batch_size))


def _release(cell, key, data):
  from jaxdp.accounting import PrivacyAccountant
  relation = "replace_one" if cell[2] == "fixed_size" else "add_remove"
  unit = "user" if cell[2] == "user" else "example"
  return run_plan(*cell, key, data, PrivacyAccountant(neighbouring=relation, unit=unit))


def _charged(cell, data, accountant):
  out = run_plan(*cell, jax.random.key(12), data, accountant)
  releases = 1 if cell[0] != "independent" else _steps(cell[0])  # MF: one run event; else T steps
  return out, releases


# -- private vectors and references ----------------------------------------------------------


def count_from_clip_norms(c_now, c_next, qn: float) -> float:
  """The noisy centered count from ``C_{t+1} = C_t exp(-eta (btilde - gamma))``, float64.

  ``btilde = gamma - log(C_{t+1} / C_t) / eta`` and ``count = q N btilde - q N / 2``.
  """
  btilde = GAMMA - math.log(float(np.float64(c_next)) / float(np.float64(c_now))) / ETA
  return qn * btilde - qn / 2.0


def fixed_vector(noise: str, out: PlanRun) -> np.ndarray:
  """``C (x + w)``: the MF output ``C x + z`` (for C = [1]: the noisy clipped sum)."""
  u = np.asarray(out.updates, np.float64).reshape(_steps(noise), -1)
  return (matrix(noise) @ u).reshape(-1)


def fixed_reference(noise: str, statistic, data: dict) -> np.ndarray:
  """``C (1 (x) x)``: the exact statistic behind ``C x + z``."""
  return (matrix(noise) @ np.tile(statistic(data), (_steps(noise), 1))).reshape(-1)


def _gradient_std(noise: str) -> float:
  """Std of z on the normalised sums (sensitivity 1 a participation): ``sigma_Delta s_1``."""
  return gradient_multiplier(noise) * s1(noise)


def adaptive_vector(noise: str, out: PlanRun) -> np.ndarray:
  """The whitened pair ``(C (params_t / C_t) / (sigma_Delta s_1), count_t / sigma_b)``."""
  t = _steps(noise)
  norms = np.asarray(out.clip_norms, np.float64)
  sums = np.asarray(out.updates, np.float64).reshape(t, -1) / norms[:t, None]
  qn = float(out.expected_batch_size)
  counts = [count_from_clip_norms(norms[i], norms[i + 1], qn) for i in range(t)]
  return np.concatenate([(matrix(noise) @ sums).reshape(-1) / _gradient_std(noise),
                         np.asarray(counts) / SIGMA_B])


def adaptive_reference(noise: str, data: dict) -> np.ndarray:
  t = _steps(noise)
  sums = matrix(noise) @ np.tile(normalised_sum(data), (t, 1))
  count = -0.5 * len(data["y"])  # every clip binds (C_0 far below every gradient norm)
  return np.concatenate([sums.reshape(-1) / _gradient_std(noise), np.full(t, count / SIGMA_B)])


# -- the factory -----------------------------------------------------------------------------


def cell_event(noise: str, unit: str = "example") -> events.DpEvent:
  """The event the library states for the cell: one step, or the MF run's one Gaussian."""
  if noise == "independent":
    return events.PoissonSampledDpEvent(
        1.0, events.GaussianDpEvent(SIGMA, neighbouring=events.ADD_REMOVE, unit=unit))
  return events.GaussianDpEvent(SIGMA / run_ratio(noise), neighbouring=events.ADD_REMOVE,
                                unit=unit)


def cell_name(noise: str, clip: str, device: bool = False) -> str:
  return f"{NAME}[noise={noise}, clip={clip}{', data=device' if device else ''}]"


_THEOREMS = {
    "independent": "Gaussian mechanism on the clipped sum (Abadi et al. 2016 Alg. 1)",
    "BandMF": "MF mechanism C x + z, BandMF (Choquette-Choo et al. 2023; Denisov et al. 2022 "
              "Thm 2.1)",
    "BLT": "MF mechanism C x + z, BLT (Dvijotham et al. 2024; Denisov et al. 2022 Thm 2.1)",
}


def plan_cell(noise: str, clip: str, device: bool = False) -> reg.ReleasePoint:
  """The entry of one noise x clip cell of ``make_private`` (Poisson sampling of examples)."""
  mu = run_ratio(noise) / SIGMA
  steps = _steps(noise)
  what = ("one step (q = 1)" if noise == "independent" else
          f"a run of T = {steps} steps (q = 1, b = 1), paid as ONE event before batch 0")
  if clip == "fixed":
    vector = functools.partial(fixed_vector, noise)
    noise_spec = reg.NoiseSpec(
        kind="gaussian", scale=SIGMA * CLIP * s1(noise),
        reference=functools.partial(fixed_reference, noise, clipped_sum),
        theorem=f"{_THEOREMS[noise]}: std sigma S ||C[:,0]|| on C x (C = [1] for DP-SGD)")
    sensitivity = CLIP * run_ratio(noise) * s1(noise)  # S ||C 1||
    guarantee = (f"(eps, delta)-DP for add/remove of one example: {what}; {_THEOREMS[noise]} "
                 "of sensitivity S ||C 1|| and std sigma S ||C[:,0]||: the Gaussian mechanism "
                 "with mu = ||C 1|| / (sigma ||C[:,0]||) (Balle & Wang 2018 Thm 8)")
  else:
    vector = functools.partial(adaptive_vector, noise)
    noise_spec = reg.NoiseSpec(
        kind="gaussian", scale=1.0, reference=functools.partial(adaptive_reference, noise),
        theorem=(f"{_THEOREMS[noise]} on the normalised clipped sums with std sigma_Delta "
                 "||C[:,0]||, sigma_Delta = r (r^2/sigma^2 - T/(2 sigma_b)^2)^-1/2, and T "
                 "centered counts with std sigma_b, whitened: std 1 per coordinate (Andrew et "
                 "al. 2021 Alg. 1 and Thm 1)"))
    sensitivity = mu
    guarantee = (f"(eps, delta)-DP for add/remove of one example: {what}, adaptive clipping "
                 "(Andrew et al. 2021 Alg. 1): the normalised clipped sums (sensitivity 1 a "
                 "participation) under the noise of the cell and the centered unclipped counts "
                 "(sensitivity 1/2, std sigma_b), whitened, are one Gaussian mechanism of "
                 f"sensitivity r / sigma (Thm 1; Balle & Wang 2018 Thm 8)")
  cell = (noise, clip, "poisson", device)
  skip = {"audit": ("the plan is audited through its noise paths: noisy_aggregate, "
                    "correlated_noise[BandMF|BLT] and adaptive_noisy_aggregate are audited "
                    "(vmapped) in entries_dpsgd.py / entries_correlated.py / "
                    "entries_adaptive_clipping.py, DP-SGD end to end by "
                    "jaxdp.audit.dpsgd_canary_audit in tests/audit")}
  return reg.ReleasePoint(
      name=cell_name(noise, clip, device), family=FAMILY, neighbouring="add_remove",
      unit="example", guarantee=guarantee, epsilon=dp.gaussian_epsilon(mu, DELTA), delta=DELTA,
      pairs=add_remove_pairs, release=functools.partial(_release, cell), vector=vector,
      event=functools.partial(cell_event, noise), charged=functools.partial(_charged, cell),
      fresh=None, sensitivity=sensitivity, norm="l2", noise=noise_spec, audit=None,
      support="continuous", public_outputs=("expected_batch_size",), skip=skip)


def _check_matrices() -> None:
  """The matrices written here are the library strategies' (a mismatch fails at import)."""
  for noise in NOISES[1:]:
    got = np.asarray(_strategy(noise).matrix(T_MF), np.float64)
    if not np.allclose(got, matrix(noise), rtol=0, atol=1e-12):
      raise AssertionError(f"{noise}.matrix({T_MF}) = {got} differs from the entry's "
                           f"{matrix(noise)}.")


_check_matrices()

for _noise in NOISES:
  for _clip in CLIPS:
    reg.register(plan_cell(_noise, _clip))
reg.register(plan_cell("independent", "fixed", device=True))


# -- batch selections ---------------------------------------------------------------------


def _selection_entry(selection: str) -> reg.ReleasePoint:
  cell = ("independent", "fixed", selection, False)
  if selection == "fixed_size":
    mu = 2.0 * CLIP / (SIGMA * CLIP)
    fields = dict(
        neighbouring="replace_one", unit="example", pairs=replace_one_pairs,
        sensitivity=2.0 * CLIP, reference=clipped_sum,
        event=lambda: events.SampledWithoutReplacementDpEvent(
            dp.N, dp.N,
            events.GaussianDpEvent(SIGMA / 2, neighbouring=events.REPLACE_ONE, unit="example")),
        guarantee=("(eps, delta)-DP for replacing one example (N public): a uniform B-subset of "
                   "the N examples (FixedSizeSampler), the Gaussian mechanism on its clipped "
                   "sum, accounted as SampledWithoutReplacement(N, B, Gaussian(sigma / 2)) by "
                   "RDP (Wang, Balle & Kasiviswanathan 2019 Thm 9, 27); here B = N: the "
                   "Gaussian mechanism of sensitivity 2C (Balle & Wang 2018 Thm 8)"))
  else:
    mu = CLIP / (SIGMA * CLIP)
    fields = dict(
        neighbouring="add_remove", unit="user", pairs=user_pairs, sensitivity=CLIP,
        reference=user_clipped_sum,
        event=functools.partial(cell_event, "independent", "user"),
        guarantee=("(eps, delta)-DP for add/remove of one USER (all its examples): Poisson "
                   "sampling of users, one clipped contribution (the clipped mean gradient) per "
                   "user, the Gaussian mechanism on their sum (McMahan et al. 2018; Abadi et "
                   "al. 2016), here one step at q = 1: the Gaussian mechanism of sensitivity C "
                   "(Balle & Wang 2018 Thm 8)"))
  reference = fields.pop("reference")
  return plan_entry(
      f"{NAME}[selection={selection}]", cell, mu=mu,
      vector=functools.partial(fixed_vector, "independent"),
      noise=reg.NoiseSpec(
          kind="gaussian", scale=SIGMA * CLIP,
          reference=functools.partial(fixed_reference, "independent", reference),
          theorem="Gaussian mechanism on the clipped sum, std sigma*C (Abadi et al. 2016 Alg. "
                  "1; per user: McMahan et al. 2018)"),
      audit_skip=("the selection changes which rows are summed, not the noise path: "
                  "noisy_aggregate is audited (vmapped) in entries_dpsgd.py; the sampler's "
                  "law is tested in tests/dpsgd/test_fixed_size_sampling.py and "
                  "tests/dpsgd/test_user_sampling.py"),
      **fields)


def plan_entry(name, cell, *, neighbouring, unit, pairs, mu, sensitivity, vector, noise, event,
               guarantee, audit_skip, releases=1) -> reg.ReleasePoint:
  """The ``ReleasePoint`` of one plan cell released through :func:`run_plan` (T = 1).

  Shared by the selection entries here and the wired cells of
  ``entries_plan_cells_wired.py``: a ``releases``-step run of ``cell`` from a fixed key,
  its output compared with the entry's ``vector``/``noise``; the audit is skipped with
  ``audit_skip`` (the noise paths are audited as their own entries).
  """
  return reg.ReleasePoint(
      name=name, family=FAMILY, neighbouring=neighbouring, unit=unit, guarantee=guarantee,
      epsilon=dp.gaussian_epsilon(mu, DELTA), delta=DELTA, pairs=pairs,
      release=functools.partial(_release, cell), vector=vector, event=event,
      charged=lambda data, acc: (run_plan(*cell, jax.random.key(12), data, acc), releases),
      fresh=None, sensitivity=sensitivity, norm="l2", noise=noise, audit=None,
      support="continuous", public_outputs=("expected_batch_size",),
      skip={"audit": audit_skip})


reg.register(_selection_entry("fixed_size"))
reg.register(_selection_entry("user"))


# Correlated noise with an adaptive clip norm compiles the largest plan step of the suite
# (noise history, clip-norm state and quantile counts). The default run covers its code
# through its two halves, the BandMF/BLT cells with a fixed clip norm (the correlated noise)
# and the independent cell with an adaptive one (the clip-norm update and the counts' share
# of sigma); test_plan_cells trains and pays the combined cells. Their checks run under slow.
import conformance_checks as _cc  # pylint: disable=wrong-import-position

for _noise in ("BandMF", "BLT"):
  _cc.slow_checks(cell_name(_noise, "adaptive", False))
