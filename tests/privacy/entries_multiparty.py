"""Conformance entries of multiparty learning (``jaxdp.multiparty``, paper 001).

Paper 001 = Hamm, Cao & Belkin 2016
(``../shared/papers/001_learning_privately_from_multiparty_data.md``).

**Privacy unit: a party; relation: replace-one** (App. A.1: ALL the samples of
ONE party are replaced, the number of parties ``M`` fixed). In the APIs below a
party enters as one row of the ``(M, N)`` vote matrix (its local classifier's
labels on the auxiliary set; any classifier) or as its ``(n, D)`` samples and
local weights, so a neighbour changes that whole row / those samples. Every
ledger here is ``PrivacyAccountant(neighbouring="replace_one", unit="party")``.

Release points:

* ``private_soft_label_erm`` (Algorithm 2, Theorem 3; binary, ``D = 5``):
  certified minimiser of the soft-label ERM (Eq. 19) plus L2-Laplace noise
  (Eq. 3 density ``exp(-eps ||z|| / Delta)``) with ``Delta = 2 r / lambda + 2 tol /
  lambda``, ``r = 1/M + 2^-52`` (the float64 soft labels' move, proved in
  :mod:`jaxdp.multiparty.aggregation`; Eq. 31 at ``r = 1/M``) and the solver
  slack of two certified minimisers.
* the same with ``protect_auxiliary=True`` (Sec. 4.5: one party AND one
  auxiliary row): ``Delta = ((N - 1) 2r + 2)/(N lambda) + 2 tol/lambda``
  (the paper's ``(2/(M lambda)) (N + M - 1)/N`` at ``r = 1/M``). Registered
  under the defining module's path ``jaxdp.multiparty.private_global.
  private_soft_label_erm`` (the same function; the registry is keyed by name).
* ``private_vote_erm`` (Algorithm 1 for ``C = 3`` classes, App. B.2 Eq. 53):
  ``Delta = sqrt(2)/lambda + 2 tol/lambda``.
* ``private_parameter_averaging`` (the *avg* baseline, Pathak et al. 2010 with
  the party-level App. B.4 bound; binary logistic ``K = 1``): ``Delta = (2K +
  2 tol)/(M lambda)``.
* ``release`` (the noise step the three share, with a calibration made by
  ``party_calibration``): a vector moved by exactly ``Delta``.

Worst cases in the pairs: a party whose predictions ALL flip (its vote row
from class 0 to class 1) while the other parties tie, so that it decides every
majority label; extreme labels (unanimous others, the party votes the other
class everywhere); auxiliary rows aligned so that the per-row gradient
changes add up (the brute-force worst case of tests/multiparty); auxiliary rows
on the unit sphere (the boundary of the assumption ``||x|| <= 1``); duplicated
rows; for averaging, a party whose samples all sit on one boundary point and
whose labels all flip, and a party whose rows are all duplicates of one row.
An *under-full* party cannot be expressed: the APIs take ``(M, N)`` votes and
``(M, n, D)`` samples (every party has the same count, as in paper 001 Sec. 6).

Every number (sensitivity, noise scale, event) is written here from the
theorems. The noise reference (the exact non-private minimiser) is a float64
scipy minimisation of the objective written here, independent of the
library's solver and certificate.

The releases run on the host (numpy certification), so the checks loop over
keys (about 20-40 ms per ERM call on 2 busy cores): the always-on audits use 300
(ERM) or 600 (averaging, noise step) trials per dataset, the slow ones 4,000
(ERM) or 20,000.
"""

from __future__ import annotations

import functools
import math

import jax
import numpy as np
from scipy import optimize, special

import conformance_registry as reg
import conformance_checks as cc
from jaxdp.accounting import events

FAMILY = "multiparty"
EPS = 1.0
LAM = 1.0
TOL = 1e-6  # the library default: certified gradient norm of every minimiser
M = 5  # parties
N_AUX = 8  # auxiliary rows
D_SOFT = 5  # features (binary weights: 5 noise coordinates per draw)
D_VOTE = 2  # features of the 3-class vote entry (6 noise coordinates per draw)
C_VOTE = 3
N_LOCAL = 4  # samples per party (averaging)
R = 1.0 / M + 2.0**-52  # one soft-label entry's move after float64 rounding (aggregation.py)
TAGS = dict(neighbouring="replace_one", unit="party")
_SEED = 1

AUDIT_TRIALS = 300  # per dataset, looped host-side ERM releases (~20-40 ms each on 2 busy cores)
AUDIT_FAST_TRIALS = 600  # averaging and the bare noise step (~4-8 ms each)
AUDIT_SLOW_TRIALS_ERM = 4_000  # slow: 8,000 looped ERM releases, a few minutes each entry
AUDIT_SLOW_TRIALS = 20_000


# -- independent float64 references ----------------------------------------------------


def _solve(fun_grad, dim: int) -> np.ndarray:
  """float64 L-BFGS to a gradient norm ~1e-11 (strongly convex: a unique minimiser)."""
  res = optimize.minimize(fun_grad, np.zeros(dim), jac=True, method="L-BFGS-B",
                          options=dict(maxiter=10_000, maxcor=30, ftol=0.0, gtol=1e-13))
  return res.x


def soft_targets(votes: np.ndarray, c: int) -> np.ndarray:
  """``(N, C)`` exact vote fractions (paper 001 Eq. 12 / 54)."""
  votes = np.asarray(votes)
  return np.stack([(votes == k).sum(0) for k in range(c)], axis=-1) / votes.shape[0]


def majority_targets(votes: np.ndarray, c: int) -> np.ndarray:
  """One-hot majority labels (Eq. 6: binary ties -> 1; multiclass ties -> smallest class)."""
  counts = soft_targets(votes, c) * np.asarray(votes).shape[0]
  if c == 2:
    label = (2 * counts[:, 1] >= votes.shape[0]).astype(int)
  else:
    label = np.argmax(counts, axis=-1)
  return np.eye(c)[label]


def erm_minimizer(x: np.ndarray, targets: np.ndarray, lam: float) -> np.ndarray:
  """Exact minimiser of Eq. 19 (binary, weights (D,)) or Eq. 55 (softmax, (D, C)), float64."""
  x = np.asarray(x, np.float64)
  n, d = x.shape
  c = targets.shape[1]
  if c == 2:
    a = targets[:, 1]

    def fg(w):
      s = x @ w
      f = np.mean(a * np.logaddexp(0, -s) + (1 - a) * np.logaddexp(0, s)) + 0.5 * lam * w @ w
      return f, x.T @ (special.expit(s) - a) / n + lam * w
    return _solve(fg, d)

  def fg(flat):
    w = flat.reshape(d, c)
    s = x @ w
    f = np.mean(special.logsumexp(s, axis=1) - np.sum(targets * s, axis=1)) + 0.5 * lam * np.sum(
        w * w)
    g = x.T @ (special.softmax(s, axis=1) - targets) / n + lam * w
    return f, g.ravel()
  return _solve(fg, d * c).reshape(d, c)


def logistic_minimizer(x: np.ndarray, y: np.ndarray, lam: float) -> np.ndarray:
  """One party's exact regularised logistic minimiser (labels {0, 1})."""
  return erm_minimizer(x, np.eye(2)[np.asarray(y, int)], lam)


# -- datasets --------------------------------------------------------------------------


def _unit(v) -> np.ndarray:
  v = np.asarray(v, np.float64)
  return v / np.linalg.norm(v)


def _aligned_aux(n: int, d: int, seed: int = _SEED) -> np.ndarray:
  """Rows close to e_1 (norm 0.999): the per-row gradient changes add up (worst case)."""
  rng = np.random.default_rng(seed)
  x = np.zeros((n, d))
  x[:, 0] = 1.0
  x += 0.05 * rng.normal(size=(n, d))
  return (0.999 * x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def _sphere_aux(n: int, d: int, seed: int = _SEED + 1) -> np.ndarray:
  """Rows ON the unit sphere (the boundary of ||x|| <= 1, within float32 rounding)."""
  x = np.random.default_rng(seed).normal(size=(n, d))
  return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def _votes_pair(others: np.ndarray, row: np.ndarray, row_prime: np.ndarray, x: np.ndarray):
  v = np.vstack([np.asarray(row, np.int32)[None], others]).astype(np.int32)
  v2 = np.vstack([np.asarray(row_prime, np.int32)[None], others]).astype(np.int32)
  return {"votes": v, "x_aux": x}, {"votes": v2, "x_aux": x}


def _tied_others(n: int, a: int, b: int) -> np.ndarray:
  """Parties 1..4: two vote ``a``, two vote ``b`` on every row (party 0 breaks every tie)."""
  return np.stack([np.full(n, a), np.full(n, a), np.full(n, b), np.full(n, b)]).astype(np.int32)


@functools.lru_cache(maxsize=None)
def soft_pairs() -> list:
  """Binary soft-label pairs: party 0's votes change; worst case (all flip, aligned) first."""
  n, d = N_AUX, D_SOFT
  x_al, x_sp = _aligned_aux(n, d), _sphere_aux(n, d)
  ones, zeros = np.ones(n, int), np.zeros(n, int)
  half = np.arange(n) % 2
  return [
      _votes_pair(_tied_others(n, 0, 1), zeros, ones, x_al),  # every prediction flips
      _votes_pair(np.ones((M - 1, n), np.int32), ones, zeros, x_sp),  # extreme, boundary rows
      _votes_pair(_tied_others(n, 0, 1), half, 1 - half, np.repeat(x_al[:1], n, 0)),  # dup rows
  ]


@functools.lru_cache(maxsize=None)
def vote_pairs() -> list:
  """3-class majority-vote pairs: party 0 decides every majority label."""
  n, d = N_AUX, D_VOTE
  x_al, x_sp = _aligned_aux(n, d), _sphere_aux(n, d)
  zeros, ones, twos = (np.full(n, k) for k in range(3))
  return [
      _votes_pair(_tied_others(n, 0, 1), zeros, ones, x_al),  # majority 0 -> 1 on every row
      _votes_pair(_tied_others(n, 1, 2), twos, ones, x_sp),  # 2 -> 1, boundary rows
      _votes_pair(np.zeros((M - 1, n), np.int32), zeros, twos, x_al),  # extreme: unanimous others
  ]


@functools.lru_cache(maxsize=None)
def aux_pairs() -> list:
  """Sec. 4.5 pairs: party 0's votes flip AND auxiliary row 0 moves to its antipode."""
  out = []
  for d0, d1 in soft_pairs()[:2]:
    x2 = d1["x_aux"].copy()
    x2[0] = -x2[0]
    v2 = d1["votes"].copy()
    v2[:, 0] = 1 - v2[:, 0]  # every party relabels the moved row
    out.append((d0, {"votes": v2, "x_aux": x2}))
  return out


def _averaging_data(xs: np.ndarray, ys: np.ndarray) -> dict:
  w = np.stack([logistic_minimizer(xs[i], ys[i], LAM) for i in range(xs.shape[0])])
  return {"local_weights": w.astype(np.float32), "xs": xs.astype(np.float32),
          "ys": ys.astype(np.int32)}


@functools.lru_cache(maxsize=None)
def averaging_pairs() -> list:
  """Party 0's samples AND its local fit replaced (the local weights are the user's input)."""
  rng = np.random.default_rng(_SEED)
  xs = rng.normal(size=(M, N_LOCAL, D_SOFT))
  xs = 0.95 * xs / np.linalg.norm(xs, axis=-1, keepdims=True)
  ys = (xs @ np.linspace(1.0, -1.0, D_SOFT) > 0).astype(np.int32)
  base = _averaging_data(xs, ys)
  u = _unit(np.arange(1, D_SOFT + 1))

  def with_party0(x0, y0):
    xs2, ys2 = xs.copy(), ys.copy()
    xs2[0], ys2[0] = x0, y0
    return _averaging_data(xs2, ys2)
  corner_pos = with_party0(np.repeat(u[None], N_LOCAL, 0), np.ones(N_LOCAL))
  corner_neg = with_party0(np.repeat(u[None], N_LOCAL, 0), np.zeros(N_LOCAL))
  return [
      (corner_pos, corner_neg),  # one boundary point, every label flips (extreme labels)
      (base, with_party0(-xs[0], 1 - ys[0])),  # antipodes with flipped labels
      (base, with_party0(np.repeat(xs[0][:1], N_LOCAL, 0), ys[0])),  # duplicated rows
  ]


# -- entries ---------------------------------------------------------------------------


def _vector(out) -> np.ndarray:
  return np.asarray(out.weights, np.float64).ravel()


def _pure_event() -> events.DpEvent:
  return events.PureDpEvent(EPS, **TAGS)


def _projection(pairs_fn, reference):
  """Audit statistic: the output projected on the direction w(D') - w(D) of the first pair."""
  @functools.lru_cache(maxsize=None)
  def direction():
    d0, d1 = pairs_fn()[0]
    diff = np.ravel(reference(d1)) - np.ravel(reference(d0))
    return diff / np.linalg.norm(diff)
  return lambda out: float(_vector(out) @ direction())


def extreme_party_pairs(n: int, d: int, c: int):
  """Pairs extreme for the arithmetic (tests/privacy/extreme_records.py): votes are labels.

  Party 0 votes the largest class on every row while the others are unanimous on
  class 0 (the party against all others), with auxiliary rows on the unit sphere,
  exactly zero (zero gradients for every row), and at float32's overflow threshold
  (outside ``||x|| <= 1``: must be refused, or stay finite).
  """
  import extreme_records as er  # pylint: disable=import-outside-toplevel

  def pairs():
    unanimous = np.zeros((M, n), np.int32)
    flipped = unanimous.copy()
    flipped[0] = c - 1
    x = _sphere_aux(n, d)
    return [({"votes": unanimous, "x_aux": aux}, {"votes": flipped, "x_aux": aux})
            for aux in (x, np.zeros_like(x), np.full_like(x, er.F32_MAX))]
  return pairs


def _erm_entry(name, fn, *, pairs, targets, c, sensitivity, guarantee, theorem,
               extreme_pairs=None, **extra):
  def release(key, data, **kw):
    return fn(key, data["votes"], data["x_aux"], num_classes=c, l2_reg=LAM, epsilon=EPS,
              tol=TOL, **extra, **kw)

  def charged(data, accountant):
    keys = jax.random.split(jax.random.key(7), 3)
    return release(keys, data, accountant=accountant), 3

  def reference(data):
    return erm_minimizer(data["x_aux"], targets(data["votes"], c), LAM).ravel()

  return reg.ReleasePoint(
      name=name, family=FAMILY, guarantee=guarantee, epsilon=EPS, delta=0.0,
      pairs=pairs, release=release, vector=_vector, event=_pure_event, charged=charged,
      fresh=None, sensitivity=sensitivity, norm="l2",
      noise=reg.NoiseSpec(kind="l2_laplace", scale=sensitivity / EPS, reference=reference,
                          theorem=theorem),
      audit=reg.AuditSpec(statistic=_projection(pairs, reference), trials=AUDIT_TRIALS,
                          slow_trials=AUDIT_SLOW_TRIALS_ERM),
      support="continuous", public_outputs=("event", "calibration"),
      extreme_pairs=extreme_pairs, **TAGS)


def _register_erm():
  from jaxdp import multiparty
  from jaxdp.multiparty import private_global

  soft_sens = 2.0 * R / LAM + 2.0 * TOL / LAM
  reg.register(_erm_entry(
      "jaxdp.multiparty.private_soft_label_erm", multiparty.private_soft_label_erm,
      pairs=soft_pairs, targets=soft_targets, c=2, sensitivity=soft_sens,
      extreme_pairs=extreme_party_pairs(N_AUX, D_SOFT, 2),
      guarantee="eps-DP for replacing one party's data (M fixed): soft-label ERM + L2-Laplace "
                "output perturbation, paper 001 Algorithm 2 / Theorem 3 (Eq. 31), plus the "
                "float64 label rounding and solver slack",
      theorem="paper 001 Thm 3: p(eta) ~ exp(-eps ||eta|| / Delta), Delta = 2r/lambda + "
              "2 tol/lambda, r = 1/M + 2^-52"))
  aux_sens = ((N_AUX - 1) * 2.0 * R + 2.0) / (N_AUX * LAM) + 2.0 * TOL / LAM
  reg.register(_erm_entry(
      "jaxdp.multiparty.private_global.private_soft_label_erm",
      private_global.private_soft_label_erm, pairs=aux_pairs, targets=soft_targets, c=2,
      sensitivity=aux_sens, protect_auxiliary=True,
      guarantee="eps-DP for replacing one party's data AND one auxiliary row (M, N fixed): "
                "paper 001 Sec. 4.5 (protect_auxiliary=True), factor (N + M - 1)/N",
      theorem="paper 001 Sec. 4.5: Delta = ((N-1) 2r + 2)/(N lambda) + 2 tol/lambda"))
  vote_sens = math.sqrt(2.0) / LAM + 2.0 * TOL / LAM
  reg.register(_erm_entry(
      "jaxdp.multiparty.private_vote_erm", multiparty.private_vote_erm,
      pairs=vote_pairs, targets=majority_targets, c=C_VOTE, sensitivity=vote_sens,
      extreme_pairs=extreme_party_pairs(N_AUX, D_VOTE, C_VOTE),
      guarantee="eps-DP for replacing one party's data (M fixed): majority-vote ERM + "
                "L2-Laplace output perturbation, paper 001 Algorithm 1, multiclass App. B.2 "
                "(Eq. 53)",
      theorem="paper 001 App. B.2: Delta = sqrt(2)/lambda + 2 tol/lambda, density "
              "exp(-eps ||eta|| / Delta)"))


def _register_averaging():
  from jaxdp import multiparty
  sens = (2.0 * 1.0 + 2.0 * TOL) / (M * LAM)  # K = 1: binary logistic (baselines docstring)

  def release(key, data, **kw):
    return multiparty.private_parameter_averaging(
        key, data["local_weights"], data["xs"], data["ys"], num_classes=2, l2_reg=LAM,
        epsilon=EPS, tol=TOL, **kw)

  def charged(data, accountant):
    return release(jax.random.split(jax.random.key(8), 3), data, accountant=accountant), 3

  def reference(data):
    xs, ys = data["xs"], data["ys"]
    return np.mean([logistic_minimizer(xs[i], ys[i], LAM) for i in range(xs.shape[0])], axis=0)

  reg.register(reg.ReleasePoint(
      name="jaxdp.multiparty.private_parameter_averaging", family=FAMILY,
      guarantee="eps-DP for replacing one party's data (M fixed): average of the certified "
                "local minimisers + L2-Laplace noise (Pathak et al. 2010 with the party-level "
                "bound of paper 001 App. B.4)",
      epsilon=EPS, delta=0.0, pairs=averaging_pairs, release=release, vector=_vector,
      event=_pure_event, charged=charged, fresh=None, sensitivity=sens, norm="l2",
      noise=reg.NoiseSpec(kind="l2_laplace", scale=sens / EPS, reference=reference,
                          theorem="paper 001 App. B.4: Delta = (2K + 2 tol)/(M lambda), K = 1"),
      audit=reg.AuditSpec(statistic=_projection(averaging_pairs, reference),
                          trials=AUDIT_FAST_TRIALS, slow_trials=AUDIT_SLOW_TRIALS),
      support="continuous", public_outputs=("event", "calibration"), **TAGS))


RELEASE_SENS = 0.5


@functools.lru_cache(maxsize=None)
def release_pairs() -> list:
  w = np.linspace(-0.4, 0.3, D_SOFT)
  u = _unit(np.arange(D_SOFT) - 1.5)
  return [({"w": w}, {"w": w + RELEASE_SENS * u}),  # moved by exactly the sensitivity
          ({"w": w}, {"w": w - 0.5 * RELEASE_SENS * u})]


def _register_release():
  from jaxdp import multiparty

  def release(key, data):  # calibrated at every call: a patched party_calibration is seen
    return multiparty.release(key, data["w"],
                              multiparty.party_calibration(RELEASE_SENS, epsilon=EPS))

  reg.register(reg.ReleasePoint(
      name="jaxdp.multiparty.release", family=FAMILY,
      guarantee="eps-DP for inputs within L2 distance Delta: the L2-Laplace noise step of the "
                "multiparty releases (paper 001 Eq. 3), with party_calibration(Delta, eps)",
      epsilon=EPS, delta=0.0, pairs=release_pairs, release=release,
      vector=lambda out: np.asarray(out, np.float64).ravel(), event=_pure_event,
      charged=None, fresh=None, sensitivity=RELEASE_SENS, norm="l2",
      noise=reg.NoiseSpec(kind="l2_laplace", scale=RELEASE_SENS / EPS,
                          reference=lambda data: np.asarray(data["w"], np.float64),
                          theorem="paper 001 Eq. 3: p(eta) ~ exp(-eps ||eta|| / Delta)"),
      audit=reg.AuditSpec(statistic=lambda out: float(np.asarray(out, np.float64) @ _unit(
          np.arange(D_SOFT) - 1.5)), trials=AUDIT_FAST_TRIALS,
          slow_trials=AUDIT_SLOW_TRIALS),
      support="continuous",
      skip={"charge": "release takes a finished calibration and spends nothing; its callers "
                      "(private_vote_erm, private_soft_label_erm, private_parameter_averaging) "
                      "spend calibration.event before calling it, checked in their entries"},
      **TAGS))


_register_erm()
_register_averaging()
_register_release()
reg.not_a_release_point(
    "jaxdp.multiparty.party_calibration",
    "a calibration of public parameters (sensitivity, epsilon, delta, rho -> noise scale and "
    "DpEvent); it reads no data and releases nothing")

# The releases run on the host (numpy certification; see the module docstring): the
# checks loop over keys from the start instead of attempting a vmap first.
cc.host_side(*[_n for _n in reg.REGISTRY if _n.startswith("jaxdp.multiparty.")])
