"""Conformance entries of adaptive clipping (``jaxdp.dpsgd.adaptive_clipping``).

One update of adaptive clipping (Andrew, Thakkar, McMahan & Ramaswamy 2021,
Algorithm 1) releases two things computed from the batch:

* the update ``C_t (sum_i gbar_i + z) / (q N)``, where ``gbar_i`` is the
  per-example gradient divided by C_t and clipped to norm 1 (the normalised
  clipped sum has L2 sensitivity 1) and ``z ~ N(0, sigma_Delta^2 I)``;
* the next clip norm ``C_{t+1} = C_t exp(-eta (btilde - gamma))`` with
  ``btilde = (noisy + q N / 2) / (q N)`` and ``noisy = sum_i (b_i - 1/2) +
  N(0, sigma_b^2)``, ``b_i = 1[||g_i|| <= C_t]`` (the centered count: one
  example moves it by exactly 1/2).

The noisy count is recovered from the returned state's ``clip_norm`` by
inverting the geometric update in float64, ``noisy = q N (gamma - log(C_{t+1} /
C_t) / eta) - q N / 2``; the normalised noisy sum is ``update * q N / C_t``.

Whitening (Andrew et al. 2021, Theorem 1): dividing each part by its noise std
is invertible, so the pair has the privacy curve of ``(sum gbar / sigma_Delta,
count / sigma_b) + N(0, I)``, the Gaussian mechanism whose L2 sensitivity is
``sqrt(1 / sigma_Delta^2 + 1 / (4 sigma_b^2))``. With the library's rule
``sigma_Delta = (sigma^-2 - (2 sigma_b)^-2)^-1/2`` that is ``1 / sigma``: one
update is exactly as private as one DP-SGD step of noise multiplier sigma, and
its epsilon at delta is the exact Gaussian one (Balle & Wang 2018 Thm 8) with
``mu = 1 / sigma``. The private vector of the joint entry is the whitened pair
(noise scale 1 in every coordinate); sigma_Delta, the sensitivity and epsilon
are computed here from the theorem, never from the library's calibration
(``gradient_noise_multiplier``), so a wrong library formula shows as a wrong
noise scale.

Test configuration: the datasets of ``entries_dpsgd.py`` (softmax linear model
without bias at ``W_0 = 0``, per-example gradient ``x (softmax(0) - e_y)^T`` in
closed form), one update, ``q N = 16``, sigma = 1, ``C_0 = 0.75`` (13 of the 16
base rows are clipped, 3 are not: the reference count is -5, and the clip
binds for the worst-case example, whose gradient norm is 10.9 C_0), gamma = 0.5,
eta = 1 (a larger eta makes the float64 inversion of the float32 clip norm more
accurate: its error is about ``q N / eta`` float32 ulps). Pairs (add/remove):
the far example (clip binds: the sum moves by 1, the count by -1/2, the whole
whitened sensitivity), an example just inside the clip (norm 0.99 C_0: the
sum moves by 0.99, the count by +1/2), an example on the clip boundary, a
duplicated row and a removed row.

Entries:

* ``jaxdp.dpsgd.adaptive_noisy_aggregate``: the joint whitened pair
  at ``sigma_b = 2`` (count noise given explicitly); replay, noise scale and
  the audit (projection on the worst-case example's whitened direction).
* ``jaxdp.dpsgd.adaptive_clip_noise[part=count]``: the transform
  around ``noisy_aggregate`` (built by the wrapper from sigma: the factory form)
  at the default count noise ``sigma_b = q N / 20 = 0.8``, seen through the
  noisy count alone: in the joint vector the count is 1 coordinate of 13, so
  20% less count noise moves the pooled noise scale by 1.4% only; here its
  scale is tested alone (Gaussian, std sigma_b, sensitivity 1/2; the count
  alone is the Gaussian mechanism with ``mu = 1 / (2 sigma_b)``, the claim its
  audit is held to). The gradient half of the same transform is the joint
  entry's (``adaptive_noisy_aggregate`` calls ``adaptive_clip_noise``).
* ``jaxdp.dpsgd.adaptive_clipping.per_layer_adaptive_clip_noise``: per-layer
  adaptive clipping (one clip norm and one noisy count per group, G = 2 groups:
  a bias and a weight), the joint whitened pair of the G counts and the
  per-layer normalised sum (Thm 1 with G counts); replay, noise, audit.

``PrivateSGD.step`` with an adaptive clip norm (make_private(l2_clip_norm=
AdaptiveClipNorm(...))) is registered per noise of the plan in
``entries_plan_cells.py`` (``[noise=<n>, clip=adaptive]``).

The transforms spend nothing (the caller's accountant pays each step as one
DP-SGD step of multiplier sigma): their charge checks are skipped. The helpers
that release nothing are declared at the end.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax

import conformance_registry as reg
import entries_dpsgd as dp
from jaxdp.accounting import events

FAMILY = "dpsgd"
SIGMA = dp.SIGMA          # the multiplier the accountant is calibrated for
QN = 16.0                 # expected batch size q N (q = 1, the 16 base rows; a power of two)
C0 = 0.75                 # initial clip norm C_0 (exact in binary)
GAMMA = 0.5               # target quantile
ETA = 1.0                 # learning rate of the geometric update
SIGMA_B = 2.0             # count noise of the joint entry (explicit)
SIGMA_B_DEFAULT = QN / 20.0  # Andrew et al. 2021's recommendation, the library's default
DELTA = dp.DELTA


def sigma_delta(sigma: float, sigma_b: float) -> float:
  """Gradient noise std so that gradient and count together cost sigma (Andrew et al. Thm 1).

  ``sigma^-2 = sigma_Delta^-2 + (2 sigma_b)^-2`` solved for sigma_Delta, float64.
  """
  inv_sq = sigma ** -2 - (2.0 * sigma_b) ** -2
  assert inv_sq > 0, "2 sigma_b must exceed sigma"
  return inv_sq ** -0.5


def whitened_sensitivity(sigma_d: float, sigma_b: float) -> float:
  """``sqrt(Delta_sum^2 / sigma_Delta^2 + Delta_count^2 / sigma_b^2)`` with Deltas 1 and 1/2."""
  return math.sqrt(1.0 / sigma_d ** 2 + 0.25 / sigma_b ** 2)


SIGMA_DELTA = sigma_delta(SIGMA, SIGMA_B)
SENSITIVITY = whitened_sensitivity(SIGMA_DELTA, SIGMA_B)  # = 1 / sigma
EPSILON = dp.gaussian_epsilon(SENSITIVITY, DELTA)
EPSILON_COUNT = dp.gaussian_epsilon(0.5 / SIGMA_B_DEFAULT, DELTA)


# -- datasets ------------------------------------------------------------------------------


def _row(coordinate: int, norm: float, d: int = dp.D) -> np.ndarray:
  """A feature row of width ``d`` whose per-example gradient at ``W_0 = 0`` has norm ``norm``."""
  x = np.zeros(d, np.float32)
  x[coordinate] = norm / dp._residual_norm()  # pylint: disable=protected-access
  return x


def pairs(d: int = dp.D) -> list[tuple[dict, dict]]:
  """Add/remove pairs at ``C_0``, inputs of width ``d``; the worst case first.

  The worst case: the clip binds (the sum moves by 1) and the count moves by -1/2.
  """
  base = dp._base(d)  # pylint: disable=protected-access
  add = dp._add  # pylint: disable=protected-access
  return [
      (base, add(base, _row(0, 10.0 * math.sqrt((dp.K - 1) / dp.K), d), dp.K - 1)),  # norm 8.2
      (base, add(base, _row(2, 0.99 * C0, d), 0)),     # unclipped: the count moves by +1/2
      (base, add(base, _row(1, C0, d), 0)),            # on the clip boundary
      (base, add(base, base["x"][0], int(base["y"][0]))),  # duplicated row
      (base, {"x": base["x"][:-1], "y": base["y"][:-1]}),  # removed row
  ]


def _gradients(data: dict) -> np.ndarray:
  """Exact float64 per-example gradients ``x_n (softmax(0) - e_{y_n})^T``, (N, D*K)."""
  x = np.asarray(data["x"], np.float64)
  y = np.asarray(data["y"])
  r = np.full((len(y), dp.K), 1.0 / dp.K)
  r[np.arange(len(y)), y] -= 1.0
  return np.einsum("nd,nk->ndk", x, r).reshape(len(y), -1)


def normalised_sum(data: dict) -> np.ndarray:
  """Exact ``sum_n (g_n / C_0) min(1, C_0 / ||g_n||)``, flattened (D*K,)."""
  g = _gradients(data) / C0
  norms = np.linalg.norm(g, axis=1)
  return (g * np.minimum(1.0, 1.0 / np.where(norms > 0, norms, 1.0))[:, None]).sum(axis=0)


def centered_count(data: dict) -> float:
  """Exact ``sum_n (1[||g_n|| <= C_0] - 1/2)``."""
  norms = np.linalg.norm(_gradients(data), axis=1)
  return float(np.sum((norms <= C0).astype(np.float64) - 0.5))


# -- releases ------------------------------------------------------------------------------


_ROWS = 17  # the largest dataset of the pairs


def _config(sigma_b):
  from jaxdp import dpsgd
  return dpsgd.AdaptiveClipNorm(initial=C0, target_quantile=GAMMA, learning_rate=ETA,
                                count_noise_multiplier=sigma_b)


@functools.lru_cache(maxsize=None)
def _clipped_fn():
  """Jitted normalised clipped sum and the two counts of its info (clip norm traced)."""
  from jaxdp.dpsgd import adaptive_clipping as ac

  def fn(w, x, y, mask, clip):
    grad_fn = ac.adaptive_clipped_grad(dp._per_example_loss, clip,  # pylint: disable=protected-access
                                       batch_argnums=(1, 2), method="vmap")
    g, info = grad_fn(w, x, y, mask=mask)
    return g, info.num_examples, info.num_clipped
  return jax.jit(fn)


def _padded(data: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """``(x, y, mask)`` padded to ``_ROWS`` rows (one compiled shape for every dataset)."""
  n = len(data["y"])
  x = np.zeros((_ROWS, data["x"].shape[1]), np.float32)
  y = np.zeros(_ROWS, np.int32)
  x[:n], y[:n] = data["x"], data["y"]
  return x, y, np.arange(_ROWS) < n


def _one_update(tx, data):
  """``tx.update((normalised clipped sum, centered count), tx.init(W_0))`` at ``W_0 = 0``.

  The count goes through ``centered_unclipped_count`` outside the jit (looked up at call
  time, so a patched helper is used).
  """
  from jaxdp.dpsgd import adaptive_clipping as ac
  w0 = jnp.zeros((data["x"].shape[1], dp.K), jnp.float32)
  state = tx.init(w0)
  x, y, mask = _padded(data)
  g, n, c = _clipped_fn()(w0, x, y, mask, ac.current_clip_norm(state))
  updates, new_state = tx.update((g, ac.centered_unclipped_count(n, c)), state, w0)
  return updates, _key_bits(new_state)


def _key_bits(state):
  """``state`` with its key arrays as their raw bits (numeric leaves the checks slice cheaply).

  The keys depend on the release key only; the no_nonprivate check still sees them.
  """
  def bits(x):
    if isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
      return jax.random.key_data(x)
    return x
  return jax.tree.map(bits, state)


def _joint_release(key, data):
  from jaxdp import dpsgd
  tx = dpsgd.adaptive_noisy_aggregate(_config(SIGMA_B), noise_multiplier=SIGMA,
                                      expected_batch_size=QN, key=key)
  return _one_update(tx, data)


def _count_release(key, data):
  from jaxdp import dpsgd
  # The inner key is split off the release key as a user would; with key=None the inner
  # gets a fixed key so that the refusal checked is adaptive_clip_noise's own.
  k_b, k_g = (None, jax.random.key(0)) if key is None else jax.random.split(key)
  # The recommended factory form: the wrapper builds the gradient noise with its sigma_Delta
  # (a built inner without noise_multiplier= is deprecated). Only the count is checked here.
  tx = dpsgd.adaptive_clip_noise(lambda s: dpsgd.noisy_aggregate(s, 1.0, QN, k_g), _config(None),
                                 expected_batch_size=QN, key=k_b, noise_multiplier=SIGMA)
  return _one_update(tx, data)


# -- private vectors -----------------------------------------------------------------------


def count_from_clip_norm(c1, qn: float = QN) -> float:
  """The noisy centered count from ``C_1 = C_0 exp(-eta (btilde - gamma))``, inverted in float64.

  ``btilde = gamma - log(C_1 / C_0) / eta`` and ``noisy = q N btilde - q N / 2``.
  """
  btilde = GAMMA - math.log(float(np.asarray(c1, np.float64)) / C0) / ETA
  return qn * btilde - qn / 2.0


def noisy_count(out) -> float:
  """The noisy centered count of a transform update ``(updates, state)`` (float64)."""
  return count_from_clip_norm(out[1].clip_norm)


def _noisy_sum(out) -> np.ndarray:
  """``update * q N / C_0``: the normalised clipped sum plus its noise."""
  return np.asarray(out[0], np.float64).reshape(-1) * (QN / C0)


def joint_vector(out) -> np.ndarray:
  """The whitened pair ``(noisy sum / sigma_Delta, noisy count / sigma_b)``."""
  return np.concatenate([_noisy_sum(out) / SIGMA_DELTA, [noisy_count(out) / SIGMA_B]])


def joint_reference(data: dict) -> np.ndarray:
  return np.concatenate([normalised_sum(data) / SIGMA_DELTA, [centered_count(data) / SIGMA_B]])


def _worst_direction() -> np.ndarray:
  """Unit whitened shift of adding the far example: ``(u / sigma_Delta, -1 / (2 sigma_b))``."""
  data, neighbour = pairs()[0]
  shift = joint_reference(neighbour) - joint_reference(data)
  return shift / np.linalg.norm(shift)


_DIRECTION = _worst_direction()


def _joint_statistic(out) -> float:
  """Projection of the whitened pair on the worst-case example's whitened shift."""
  return float(np.dot(joint_vector(out), _DIRECTION))


def _gaussian_event(multiplier: float) -> events.DpEvent:
  return events.GaussianDpEvent(multiplier, neighbouring=events.ADD_REMOVE, unit="example")


_NO_CHARGE = ("an optax transform spends nothing: the caller's accountant pays each update as one "
              "DP-SGD step of noise multiplier sigma (Andrew et al. 2021 Thm 1)")

reg.register(reg.ReleasePoint(
    name="jaxdp.dpsgd.adaptive_noisy_aggregate",
    family=FAMILY, neighbouring="add_remove", unit="example",
    guarantee=("(eps, delta)-DP for add/remove of one example per update: the normalised clipped "
               "sum (sensitivity 1, std sigma_Delta) and the centered unclipped count "
               "(sensitivity 1/2, std sigma_b), whitened, are one Gaussian mechanism of "
               "sensitivity (sigma_Delta^-2 + (2 sigma_b)^-2)^1/2 = 1/sigma (Andrew et al. 2021 "
               "Thm 1; Balle & Wang 2018 Thm 8)"),
    epsilon=EPSILON, delta=DELTA, pairs=pairs,
    release=_joint_release, vector=joint_vector,
    event=lambda: _gaussian_event(SIGMA),
    charged=None, fresh=None,
    sensitivity=SENSITIVITY, norm="l2",
    noise=reg.NoiseSpec(
        kind="gaussian", scale=1.0, reference=joint_reference,
        theorem="whitened (noisy sum / sigma_Delta, noisy centered count / sigma_b): std 1 per "
                "coordinate (Andrew et al. 2021 Alg. 1 and Thm 1)"),
    audit=reg.AuditSpec(statistic=_joint_statistic),
    support="continuous",
    skip={"charge": _NO_CHARGE}))


def _count_vector(out) -> np.ndarray:
  return np.asarray([noisy_count(out)])


reg.register(reg.ReleasePoint(
    name="jaxdp.dpsgd.adaptive_clip_noise[part=count]",
    family=FAMILY, neighbouring="add_remove", unit="example",
    guarantee=("the noisy centered unclipped count alone (recovered from the next clip norm): "
               "Gaussian mechanism of sensitivity 1/2 and std sigma_b = q N / 20 (Andrew et al. "
               "2021 Alg. 1 and Thm 1; Balle & Wang 2018 Thm 8); the whole update is the "
               "adaptive_noisy_aggregate entry's claim"),
    epsilon=EPSILON_COUNT, delta=DELTA, pairs=pairs,
    release=_count_release, vector=_count_vector,
    event=lambda: _gaussian_event(2.0 * SIGMA_B_DEFAULT),
    charged=None, fresh=None,
    sensitivity=0.5, norm="l2",
    noise=reg.NoiseSpec(
        kind="gaussian", scale=SIGMA_B_DEFAULT,
        reference=lambda data: np.asarray([centered_count(data)]),
        theorem="N(0, sigma_b^2) on the centered count, sigma_b = q N / 20 (Andrew et al. 2021 "
                "Alg. 1; their recommended count noise)"),
    audit=reg.AuditSpec(statistic=lambda out: -noisy_count(out)),
    support="continuous",
    skip={"charge": _NO_CHARGE,
          "replay": "the count is recovered from the float32 clip norm through log and the "
                    "q N / eta factor (errors of a few 1e-6 count units), beyond the replay "
                    "check's float32 slack when the count moves by exactly its sensitivity "
                    "1/2; the adaptive_noisy_aggregate entry replays the whitened pair, "
                    "whose clipped-sum part keeps the float32-safe clip margin"}))


# -- per_layer_adaptive_clip_noise: one clip norm and one noisy count per clip group ----------
# Per-layer adaptive clipping (Andrew et al. 2021 Alg. 1 per group; McMahan et al. 2018 Sec. 3)
# on a softmax linear model WITH a bias at 0: groups b (K,) and w (D, K), initial clip norms
# C_b = 1/2 and C_w = C_0. Per-example gradients at 0: ``g^w = x r^T`` and ``g^b = r`` with
# ``r = softmax(0) - e_y`` (``||r|| = sqrt(2/3) > C_b``: every bias gradient is clipped). Each
# group is clipped to C_l and the whole vector divided by ``U = sqrt(C_b^2 + C_w^2)`` (the
# normalised sum has sensitivity 1: an example clipped in both groups moves it by exactly 1);
# the G = 2 centered counts move by 1/2 each. Whitening (Thm 1 with G counts): the pair is the
# Gaussian mechanism of sensitivity ``(sigma_Delta^-2 + G (2 sigma_b)^-2)^1/2``, which is 1/sigma
# with ``sigma_Delta = (sigma^-2 - G (2 sigma_b)^-2)^-1/2`` (computed here, not by the library).

C_B = 0.5
GROUPS = 2
UNIT_LAYER = math.sqrt(C_B ** 2 + C0 ** 2)  # U = sqrt(sum_l C_l^2), float64
SIGMA_DELTA_LAYER = (SIGMA ** -2 - GROUPS * (2.0 * SIGMA_B) ** -2) ** -0.5
SENSITIVITY_LAYER = math.sqrt(SIGMA_DELTA_LAYER ** -2 + GROUPS * 0.25 / SIGMA_B ** 2)  # 1/sigma
EPSILON_LAYER = dp.gaussian_epsilon(SENSITIVITY_LAYER, DELTA)


def _layer_loss(p, x, y):
  return optax.softmax_cross_entropy_with_integer_labels(x @ p["w"] + p["b"], y)


def _layer_params(d: int) -> dict:
  return {"b": jnp.zeros((dp.K,), jnp.float32), "w": jnp.zeros((d, dp.K), jnp.float32)}


@functools.lru_cache(maxsize=None)
def _layer_clipped_fn():
  """Jitted per-layer normalised clipped sum and the per-group clipped counts (clips traced)."""
  from jaxdp.dpsgd import adaptive_clipping as ac

  def fn(params, x, y, mask, clips):
    grad_fn = ac.adaptive_clipped_grad(_layer_loss, clips, batch_argnums=(1, 2), method="vmap",
                                       per_layer=True)
    g, info = grad_fn(params, x, y, mask=mask)
    return g, info.num_examples, info.num_clipped_per_group
  return jax.jit(fn)


def _layer_release(key, data):
  from jaxdp import dpsgd
  from jaxdp.dpsgd import adaptive_clipping as ac
  k_b, k_g = (None, jax.random.key(0)) if key is None else jax.random.split(key)
  tx = ac.per_layer_adaptive_clip_noise(
      lambda s: dpsgd.noisy_aggregate(s, 1.0, QN, k_g), _config(SIGMA_B), noise_multiplier=SIGMA,
      expected_batch_size=QN, key=k_b, groups={"b": C_B, "w": C0})
  params = _layer_params(data["x"].shape[1])
  state = tx.init(params)
  x, y, mask = _padded(data)
  g, n, c = _layer_clipped_fn()(params, x, y, mask, ac.current_clip_norm(state))
  updates, new_state = tx.update((g, ac.centered_unclipped_count(n, c)), state, params)
  return updates, _key_bits(new_state)


def _group_count(c1, c_initial: float) -> float:
  """A group's noisy centered count from its next clip norm (float64 inversion)."""
  btilde = GAMMA - math.log(float(np.asarray(c1, np.float64)) / c_initial) / ETA
  return QN * btilde - QN / 2.0


def layer_vector(out) -> np.ndarray:
  """Whitened ``(update * q N / U / sigma_Delta [b, then w], counts / sigma_b [b, w])``."""
  updates, state = out
  noisy = np.concatenate([np.asarray(updates["b"], np.float64).reshape(-1),
                          np.asarray(updates["w"], np.float64).reshape(-1)]) * (QN / UNIT_LAYER)
  counts = [_group_count(state.clip_norm["b"], C_B), _group_count(state.clip_norm["w"], C0)]
  return np.concatenate([noisy / SIGMA_DELTA_LAYER, np.asarray(counts) / SIGMA_B])


def layer_reference(data: dict) -> np.ndarray:
  """Exact float64 whitened ``(sum_n (clip_{C_b}(g^b_n), clip_{C_w}(g^w_n)) / U, counts)``."""
  x = np.asarray(data["x"], np.float64)
  y = np.asarray(data["y"])
  r = np.full((len(y), dp.K), 1.0 / dp.K)
  r[np.arange(len(y)), y] -= 1.0
  parts, counts = [], []
  for g, c in ((r, C_B), (np.einsum("nd,nk->ndk", x, r).reshape(len(y), -1), C0)):
    norms = np.linalg.norm(g, axis=1)
    parts.append((g * np.minimum(1.0, c / np.where(norms > 0, norms, 1.0))[:, None]).sum(0))
    counts.append(np.sum((norms <= c).astype(np.float64) - 0.5))
  return np.concatenate([np.concatenate(parts) / UNIT_LAYER / SIGMA_DELTA_LAYER,
                         np.asarray(counts) / SIGMA_B])


def _layer_direction() -> np.ndarray:
  data, neighbour = pairs()[0]
  shift = layer_reference(neighbour) - layer_reference(data)
  return shift / np.linalg.norm(shift)


_LAYER_DIRECTION = _layer_direction()


reg.register(reg.ReleasePoint(
    name="jaxdp.dpsgd.adaptive_clipping.per_layer_adaptive_clip_noise",
    family=FAMILY, neighbouring="add_remove", unit="example",
    guarantee=("(eps, delta)-DP for add/remove of one example per update: the per-layer "
               "normalised clipped sum (groups clipped to C_l, divided by sqrt(sum C_l^2): "
               "sensitivity 1, std sigma_Delta) and G centered unclipped counts (sensitivity 1/2 "
               "each, std sigma_b), whitened, are one Gaussian mechanism of sensitivity "
               "(sigma_Delta^-2 + G (2 sigma_b)^-2)^1/2 = 1/sigma (Andrew et al. 2021 Thm 1; "
               "McMahan et al. 2018 Sec. 3; Balle & Wang 2018 Thm 8)"),
    epsilon=EPSILON_LAYER, delta=DELTA, pairs=pairs,
    release=_layer_release, vector=layer_vector,
    event=lambda: _gaussian_event(SIGMA),
    charged=None, fresh=None,
    sensitivity=SENSITIVITY_LAYER, norm="l2",
    noise=reg.NoiseSpec(
        kind="gaussian", scale=1.0, reference=layer_reference,
        theorem="whitened (noisy per-layer normalised sum / sigma_Delta, G noisy counts / "
                "sigma_b): std 1 per coordinate, sigma_Delta = (sigma^-2 - G (2 sigma_b)^-2)^-1/2 "
                "(Andrew et al. 2021 Alg. 1 and Thm 1)"),
    audit=reg.AuditSpec(statistic=lambda out: float(np.dot(layer_vector(out), _LAYER_DIRECTION))),
    support="continuous",
    skip={"charge": _NO_CHARGE}))


# -- declared: public adaptive-clipping callables that release nothing themselves ----------

_AC = "jaxdp.dpsgd.adaptive_clipping."
for _name, _reason in {
    "jaxdp.dpsgd.AdaptiveClipNorm":
        "the public configuration (C_0, gamma, eta, sigma_b); reads no data",
    "jaxdp.dpsgd.AdaptiveClipState":
        "the transform's state record; its clip_norm is a function of the noisy counts only "
        "(checked by the no_nonprivate check of the adaptive_noisy_aggregate entry, which "
        "returns it)",
    _AC + "gradient_noise_multiplier":
        "sigma_Delta from public (sigma, sigma_b, k): a calibration (the entries compute it "
        "from Andrew et al. 2021 Thm 1 themselves)",
    _AC + "joint_noise_multiplier":
        "the inverse calibration of public (sigma_Delta, sigma_b, k)",
    _AC + "centered_unclipped_count":
        "the centered count from a ClippedGradInfo: the statistic before any noise "
        "(documented NOT private, like ClippedGradFn's sum), never released by the library; "
        "adaptive_clip_noise (registered) adds its noise",
    _AC + "normalized_loss":
        "wraps a loss as loss / C; computes nothing from data itself",
    _AC + "adaptive_clipped_grad":
        "builds the clipped_grad of the normalised loss: the non-private statistic before "
        "noise (like ClippedGradFn); adaptive_clip_noise (registered) adds the noise",
    _AC + "current_clip_norm":
        "reads C_t from the state: a function of earlier noisy releases only",
    _AC + "reseed_state":
        "replaces the state's keys and step counter; reads no data",
}.items():
  reg.not_a_release_point(_name, _reason)
