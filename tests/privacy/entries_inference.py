"""Conformance entries of the inference family (``jaxdp.inference``; paper 003).

Paper 003 = ../shared/papers/003_dp_confidence_intervals_for_erm.md (Wang, Kifer & Lee):
private confidence intervals for logistic regression, ``(1/n) sum f(y theta^T x) +
(Lambda/2)||theta||^2`` with ``||x|| <= 1`` and ``y in {-1, +1}``; replace-one neighbours,
privacy unit one example (a row of ``x``).

Release points:

* ``priv_spd_matrix`` (Algorithm 2, Lemma 1): here the gradient covariance ``Sigma(theta0)``
  of Eq. 4.3 at a PUBLIC ``theta0`` (``||theta0|| = 1.5``), whose L2 (Frobenius) sensitivity
  is Lemma 2's ``2 S(||theta0||)^2 / n``, released under zCDP: ``eta ~ N(0, Sens^2/(2 rho) I)``
  in ``R^{d^2}`` (Alg. 2 line 5; Bun & Steinke 2016 Prop. 3 = paper 003 Prop. 3), then
  symmetrised (floor ``-inf``: no floor). The private vector is ``(diag M~, sqrt(2) *
  upper off-diagonal of M~)``: for ``M~ = M + (eta + eta^T)/2`` its noise coordinates are
  i.i.d. ``N(0, sigma^2)`` and its L2 norm is the Frobenius norm, so the sensitivity and the
  noise scale are those of the theorem unchanged.
* ``confidence_intervals`` (Algorithm 5, Theorem 4), output perturbation under pure DP: the
  private vector is ``theta~ = theta^ + beta``, ``beta`` with density ``prop. to exp(-||b||/
  scale)`` (L2-Laplace, Alg. 4 line 3: ``gamma = n c phi_1``), ``scale = Delta / phi_1`` with
  ``Delta = 2/(n Lambda) + 2 tol/Lambda`` (Chaudhuri et al. 2011 Cor. 8: ``1/(nc)``, ``c =
  Lambda/2``; plus the certified solve's ``2 tol/Lambda``: each released minimiser is within
  ``tol/Lambda`` of the exact one). The claimed epsilon of one call is ``phi_1 + phi_2 +
  phi_3`` (Theorem 4).
* ``confidence_intervals_batched``: ``M = 2`` keys, output perturbation under zCDP: ``M``
  independent releases of ``theta~ = theta^ + N(0, sigma^2 I)``, ``sigma = Delta /
  sqrt(2 rho_1)`` (Alg. 4 line 6); the private vector is both ``theta~`` (L2 sensitivity
  ``sqrt(M) Delta``), the charge ``M`` events of ``rho_1 + rho_2 + rho_3`` (Theorem 4),
  the claim ``(M rho) + 2 sqrt(M rho log(1/delta))`` (paper 003 Prop. 2).

Pairs (replace-one, worst cases first): a record on the unit sphere with the extreme label
replaced by the opposite label; the same record replaced by an orthogonal boundary record
with the opposite label; a row replaced by a duplicate of another row.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from scipy import optimize

import conformance_registry as reg
import conformance_checks as cc
from jaxdp.accounting import events

FAMILY = "inference"
N, D = 30, 3
L2_REG = 0.1       # Lambda = 2c
TOL = 1e-8         # certified gradient tolerance passed to the intervals
EPSILON = 1.0      # total epsilon= (pure DP) of one confidence_intervals call
FRACTIONS = (0.8, 0.1, 0.1)  # (phi_1, phi_2, phi_3) / phi, passed explicitly
RHO = 0.25         # total rho= (zCDP) of one interval of the batched call
NUM_KEYS = 2       # M intervals per batched call
RHO_SPD = 0.5      # phi (rho, zCDP) of the priv_spd_matrix entry
DELTA = 1e-6       # delta at which the zCDP claims are stated
THETA0 = np.array([1.5, 0.0, 0.0])  # public evaluation point of the priv_spd_matrix entry
_SEED = 2603


def _sigmoid(z):
  return 1.0 / (1.0 + np.exp(-z))


def zcdp_epsilon(rho: float, delta: float) -> float:
  """``rho + 2 sqrt(rho log(1/delta))`` (Bun & Steinke 2016 Prop. 1.3; paper 003 Prop. 2)."""
  return rho + 2.0 * math.sqrt(rho * math.log(1.0 / delta))


# -- datasets -------------------------------------------------------------------------


def _base() -> dict:
  """``N`` rows in the unit ball (row 0 on the sphere, along theta0), labels +-1."""
  rng = np.random.default_rng(_SEED)
  x = rng.normal(size=(N, D))
  x *= (rng.uniform(0.3, 1.0, size=N) / np.linalg.norm(x, axis=1))[:, None]
  x[0] = THETA0 / np.linalg.norm(THETA0)                # boundary record
  y = np.where(rng.random(N) < 0.5, 1.0, -1.0)
  y[0] = -1.0                                           # extreme: margin -||theta0|| at theta0
  return {"x": x, "y": y}


def _replace(data: dict, row: int, x_row, y_row) -> dict:
  x, y = data["x"].copy(), data["y"].copy()
  x[row], y[row] = x_row, y_row
  return {"x": x, "y": y}


def pairs() -> list[tuple[dict, dict]]:
  base = _base()
  orth = np.zeros(D)
  orth[1] = 1.0
  return [
      (base, _replace(base, 0, base["x"][0], -base["y"][0])),    # extreme label flipped
      (base, _replace(base, 0, orth, -base["y"][0])),            # boundary, orthogonal, flipped
      (base, _replace(base, 1, base["x"][2], base["y"][2])),     # row 1 := duplicate of row 2
  ]


# -- priv_spd_matrix (Algorithm 2, Lemma 1; Sigma of Eq. 4.3, Lemma 2) -------------------


def covariance_at_theta0(data: dict) -> np.ndarray:
  """Eq. 4.3 at the public ``theta0``: ``(1/n) sum S(-y theta0^T x)^2 x x^T - Lambda^2 theta0
  theta0^T`` (numpy float64; ``f'(z)^2 = S(-z)^2`` for the logistic loss)."""
  x, y = data["x"], data["y"]
  w = _sigmoid(-y * (x @ THETA0)) ** 2
  return (x * w[:, None]).T @ x / len(y) - L2_REG ** 2 * np.outer(THETA0, THETA0)


SPD_SENSITIVITY = 2.0 * _sigmoid(np.linalg.norm(THETA0)) ** 2 / N   # Lemma 2
SPD_SIGMA = SPD_SENSITIVITY / math.sqrt(2.0 * RHO_SPD)              # Alg. 2 line 5


def sym_vector(matrix) -> np.ndarray:
  """``(diag, sqrt(2) * upper off-diagonal)`` of a symmetric matrix (L2 norm = Frobenius)."""
  m = np.asarray(matrix, np.float64)
  iu = np.triu_indices(m.shape[0], 1)
  return np.concatenate([np.diag(m), math.sqrt(2.0) * m[iu]])


def _spd_release(key, data):
  from jaxdp.inference import priv_spd_matrix  # pylint: disable=import-outside-toplevel
  return priv_spd_matrix(key, jnp.asarray(covariance_at_theta0(data)), SPD_SENSITIVITY, RHO_SPD,
                         privacy="zcdp", floor=-math.inf)


@functools.lru_cache(maxsize=None)
def _spd_direction() -> np.ndarray:
  d0, d1 = pairs()[0]
  u = sym_vector(covariance_at_theta0(d1)) - sym_vector(covariance_at_theta0(d0))
  return u / np.linalg.norm(u)


reg.register(reg.ReleasePoint(
    name="jaxdp.inference.priv_spd_matrix",
    family=FAMILY, neighbouring="replace_one", unit="example",
    guarantee="rho-zCDP (PrivSPDMat, paper 003 Alg. 2 / Lemma 1: Gaussian mechanism, Bun & "
              "Steinke 2016 Prop. 3) for a matrix of Frobenius sensitivity Sens (here Lemma 2)",
    epsilon=zcdp_epsilon(RHO_SPD, DELTA), delta=DELTA,
    pairs=pairs,
    release=_spd_release,
    vector=sym_vector,
    event=lambda: events.ZCDpEvent(RHO_SPD, neighbouring="replace_one", unit="example"),
    charged=None,
    fresh=None,
    sensitivity=SPD_SENSITIVITY, norm="l2",
    noise=reg.NoiseSpec(
        kind="gaussian", scale=SPD_SIGMA,
        reference=lambda data: sym_vector(covariance_at_theta0(data)),
        theorem="paper 003 Alg. 2 line 5: eta ~ N(0, Sens^2/(2 rho) I), Sens = 2 S(||theta||)^2/n "
                "(Lemma 2); symmetrised, diag and sqrt(2) off-diagonal are N(0, sigma^2)"),
    audit=reg.AuditSpec(statistic=lambda out: float(sym_vector(out) @ _spd_direction()),
                        trials=2_000, slow_trials=50_000),
    support="continuous",
    skip={"charge": "priv_spd_matrix takes no accountant: the caller spends "
                    "priv_spd_matrix_event(rho) (checked in tests/inference/test_spd_release.py)"},
))


# -- confidence_intervals / confidence_intervals_batched (Alg. 5, Theorem 4) -----------------


THETA_SENSITIVITY = 2.0 / (N * L2_REG) + 2.0 * TOL / L2_REG   # Chaudhuri et al. 2011 + certificate
PHI = tuple(EPSILON * f for f in FRACTIONS)
RHOS = tuple(RHO * f for f in FRACTIONS)
THETA_SCALE_PURE = THETA_SENSITIVITY / PHI[0]                     # Alg. 4 line 3: 1/gamma
THETA_SIGMA_ZCDP = THETA_SENSITIVITY / math.sqrt(2.0 * RHOS[0])   # Alg. 4 line 6


def exact_minimiser(data: dict) -> np.ndarray:
  """The exact minimiser of Eq. 3.1 (logistic), scipy L-BFGS-B in float64 to ||grad|| ~ 1e-12."""
  x, y = data["x"], data["y"]

  def fun(t):
    z = y * (x @ t)
    val = np.mean(np.logaddexp(0.0, -z)) + 0.5 * L2_REG * t @ t
    grad = x.T @ (-y * _sigmoid(-z)) / len(y) + L2_REG * t
    return val, grad

  return optimize.minimize(fun, np.zeros(D), jac=True, method="L-BFGS-B",
                           options=dict(gtol=1e-13, ftol=0, maxiter=2000)).x


_CI_KW = dict(perturbation="output", l2_reg=L2_REG, tol=TOL, fractions=FRACTIONS)


def _intervals(key, data, accountant=None):
  from jaxdp.inference import confidence_intervals  # pylint: disable=import-outside-toplevel
  return confidence_intervals(key, data["x"], data["y"], epsilon=EPSILON,
                              accountant=accountant, **_CI_KW)


@functools.lru_cache(maxsize=None)
def _theta_direction() -> np.ndarray:
  d0, d1 = pairs()[0]
  u = exact_minimiser(d1) - exact_minimiser(d0)
  return u / np.linalg.norm(u)


def _theta(out) -> np.ndarray:
  return np.asarray(out[0].theta, np.float64).ravel()


def _composed(leaf, phis):
  return events.ComposedDpEvent([leaf(b, neighbouring="replace_one", unit="example")
                                 for b in phis])


# Public fields of the returned Calibration: functions of (n, d) and the arguments only.
_CALIBRATION_FIELDS = ("split", "objective_gamma", "release_scale", "tol", "hessian_sensitivity",
                       "hessian_floor", "covariance_floor", "alpha", "num_samples", "rounding",
                       "num_examples", "dim", "l2_reg", "h", "event", "group_size")

reg.register(reg.ReleasePoint(
    name="jaxdp.inference.confidence_intervals",
    family=FAMILY, neighbouring="replace_one", unit="example",
    guarantee="(phi_1 + phi_2 + phi_3)-DP, paper 003 Theorem 4 (Alg. 5: output perturbation, "
              "Chaudhuri et al. 2011, and two PrivSPDMat releases, Lemma 1)",
    epsilon=sum(PHI), delta=0.0,
    pairs=pairs,
    release=lambda key, data: _intervals(key, data),
    vector=_theta,
    event=lambda: _composed(events.PureDpEvent, PHI),
    charged=lambda data, acc: (_intervals(jax.random.key(3), data, acc), 1),
    fresh=None,
    sensitivity=THETA_SENSITIVITY, norm="l2",
    noise=reg.NoiseSpec(
        kind="l2_laplace", scale=THETA_SCALE_PURE, reference=exact_minimiser,
        theorem="paper 003 Alg. 4 line 3 (gamma = n c phi_1; Chaudhuri et al. 2011 Cor. 8) with "
                "the certified solve's 2 tol/Lambda: scale (2/(n Lambda) + 2 tol/Lambda)/phi_1"),
    audit=reg.AuditSpec(statistic=lambda out: float(_theta(out) @ _theta_direction()),
                        trials=200, slow_trials=2_000),
    support="continuous",
    public_outputs=_CALIBRATION_FIELDS,
))


def _batched(key, data, accountant=None):
  from jaxdp.inference import confidence_intervals_batched  # pylint: disable=import-outside-toplevel
  keys = None if key is None else jax.random.split(key, NUM_KEYS)  # None: the API must refuse
  return confidence_intervals_batched(keys, data["x"], data["y"], rho=RHO,
                                      accountant=accountant, **_CI_KW)


reg.register(reg.ReleasePoint(
    name="jaxdp.inference.confidence_intervals_batched",
    family=FAMILY, neighbouring="replace_one", unit="example",
    guarantee="M intervals, each (rho_1 + rho_2 + rho_3)-zCDP (paper 003 Theorem 4), composed "
              "(Bun & Steinke 2016 Lemma 2.3) and converted by paper 003 Prop. 2",
    epsilon=zcdp_epsilon(NUM_KEYS * RHO, DELTA), delta=DELTA,
    pairs=pairs,
    release=lambda key, data: _batched(key, data),
    vector=_theta,
    event=lambda: _composed(events.ZCDpEvent, RHOS),
    charged=lambda data, acc: (_batched(jax.random.key(4), data, acc), NUM_KEYS),
    fresh=None,
    sensitivity=math.sqrt(NUM_KEYS) * THETA_SENSITIVITY, norm="l2",
    noise=reg.NoiseSpec(
        kind="gaussian", scale=THETA_SIGMA_ZCDP,
        reference=lambda data: np.tile(exact_minimiser(data), NUM_KEYS),
        theorem="paper 003 Alg. 4 line 6: N(0, I/(2 rho_1 (nc)^2)) with the certified solve's "
                "2 tol/Lambda: sigma = (2/(n Lambda) + 2 tol/Lambda)/sqrt(2 rho_1)"),
    audit=reg.AuditSpec(statistic=lambda out: float(_theta(out)[:D] @ _theta_direction()),
                        trials=200, slow_trials=2_000),
    support="continuous",
    public_outputs=_CALIBRATION_FIELDS,
))


# -- public calibrations: no private data ------------------------------------------------

reg.not_a_release_point(
    "jaxdp.inference.budget_split",
    "splits a public epsilon or rho into (phi_1, phi_2, phi_3) by public fractions; reads no "
    "data")
reg.not_a_release_point(
    "jaxdp.inference.calibrate",
    "calibrates the noises from public parameters (n, d, epsilon or rho, Lambda, ...); reads no data")
reg.not_a_release_point(
    "jaxdp.inference.coverage_warning",
    "states from public parameters (loss, perturbation, n, epsilon) whether the intervals are "
    "known to under-cover; reads no data, releases nothing")
reg.not_a_release_point(
    "jaxdp.inference.priv_spd_matrix_event",
    "returns the DpEvent of one priv_spd_matrix call from its public phi; reads no data")
reg.not_a_release_point(
    "jaxdp.inference.spd_noise",
    "draws the noise matrix of Algorithm 2 from public (sensitivity, phi) and a key; adds it "
    "to nothing (priv_spd_matrix, registered, adds it to the private matrix)")

# The intervals certify the minimiser on the host (numpy repair of the Newton iterate): not
# vmappable over the key, so the checks loop from the start (priv_spd_matrix is vmapped).
cc.host_side("jaxdp.inference.confidence_intervals", "jaxdp.inference.confidence_intervals_batched")
