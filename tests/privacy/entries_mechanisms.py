"""Release points of ``jaxdp.mechanisms`` (the mechanisms family).

Every mechanism is a pure function of ``(key, value)``: ``D`` is the statistic
itself (a small vector ``{"v": ...}`` or a score / vote histogram), and the
worst-case neighbour moves it by exactly the claimed sensitivity in one
direction. The mechanisms take no accountant (the caller spends the companion
``*_event``), so the charge check is skipped with that reason; they require an
explicit key (``fresh=None``: ``key=None`` must raise naming ``key``).

Noise scales are written from the theorems (not by calling the library):
Laplace ``b = Delta_1/eps`` (Dwork & Roth Thm 3.6), analytic Gaussian ``sigma``
solved here with scipy from Balle & Wang 2018 Thm 8, classic ``sigma =
Delta sqrt(2 ln(1.25/delta))/eps`` (Dwork & Roth Thm A.1), zCDP ``sigma =
Delta/sqrt(2 rho)`` (Bun & Steinke 2016 Prop 1.6), L2-Laplace density
``exp(-eps ||z||/Delta_2)`` (paper 000 Thm 1), discrete Laplace ``K_1 g/eps``
and discrete Gaussian ``K_2 g/sqrt(2 rho)`` on the grid ``g Z`` with
``K = ceil(Delta/g)`` for one changed coordinate (CKS 2020 and
``jaxdp/mechanisms/discrete.py``). For zCDP entries the claimed ``epsilon`` is
``rho + 2 sqrt(rho ln(1/delta))`` (Bun & Steinke 2016 Prop 1.3).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import optimize
from scipy import stats

import conformance_registry as reg

FAMILY = "mechanisms"
TAGS = dict(family=FAMILY, neighbouring="add_remove", unit="example")
NO_CHARGE = {"charge": "a pure function of a key: spends nothing; the caller spends the "
                       "companion *_event (the families that call it are checked for the charge)"}
NOT_ADDITIVE = "not additive: the release is an argmax index"
DELTA = 1e-5
DIM = 4
FAST_TRIALS, SLOW_TRIALS = 2_000, 50_000


def _analytic_sigma(eps: float, delta: float, sens: float) -> float:
  """Smallest sigma with Phi(D/2s - eps s/D) - e^eps Phi(-D/2s - eps s/D) <= delta (Balle-Wang Thm 8)."""
  def excess(sigma):
    a, b = sens / (2 * sigma), eps * sigma / sens
    return stats.norm.cdf(a - b) - math.exp(eps) * stats.norm.cdf(-a - b) - delta
  return optimize.brentq(excess, 1e-6 * sens, 1e3 * sens, xtol=1e-14 * sens)


def _gaussian_epsilon(noise_multiplier: float, delta: float) -> float:
  """The eps at which a Gaussian of noise multiplier z has delta(eps) = delta (Balle-Wang Thm 8)."""
  def excess(eps):
    a, b = 1 / (2 * noise_multiplier), eps * noise_multiplier
    return stats.norm.cdf(a - b) - math.exp(eps) * stats.norm.cdf(-a - b) - delta
  return optimize.brentq(excess, 1e-9, 200.0, xtol=1e-12)


def _zcdp_epsilon(rho: float, delta: float) -> float:
  return rho + 2 * math.sqrt(rho * math.log(1 / delta))


def _vector(out) -> np.ndarray:
  return np.asarray(out, np.float64).ravel()


def _statistic_pairs(shift: np.ndarray):
  base = np.array([0.0, 2.0, -3.0, 5.0])

  def pairs():
    return [({"v": base}, {"v": base + shift}),  # worst case: moved by exactly the sensitivity
            ({"v": base}, {"v": base - 0.5 * shift})]
  return pairs


def _first_coordinate(out) -> float:
  return float(np.asarray(out, np.float64).ravel()[0])


def _additive(name, guarantee, eps, delta, release, event, sens, norm, kind, scale, theorem,
              shift, support="continuous"):
  from jaxdp import mechanisms as mech  # noqa: F401  (import errors surface at registration)
  reg.register(reg.ReleasePoint(
      name=name, guarantee=guarantee, epsilon=eps, delta=delta,
      pairs=_statistic_pairs(shift), release=release, vector=_vector, event=event,
      charged=None, fresh=None, sensitivity=sens, norm=norm,
      noise=reg.NoiseSpec(kind=kind, scale=scale,
                          reference=lambda data: np.asarray(data["v"], np.float64),
                          theorem=theorem),
      audit=reg.AuditSpec(statistic=_first_coordinate, trials=FAST_TRIALS,
                          slow_trials=SLOW_TRIALS),
      support=support, skip=dict(NO_CHARGE), **TAGS))


def _e0(size: float) -> np.ndarray:
  e = np.zeros(DIM)
  e[0] = size
  return e


def _register_additive():
  from jaxdp import mechanisms as mech

  sens, eps = 1.0, 1.0
  _additive("jaxdp.mechanisms.laplace_mechanism", "eps-DP, Laplace mechanism (Dwork-Roth Thm 3.6)",
            eps, 0.0, lambda key, d: mech.laplace_mechanism(key, d["v"], sens, eps),
            lambda: mech.laplace_mechanism_event(sens, eps), sens, "l1", "laplace", sens / eps,
            "Dwork-Roth Thm 3.6: b = Delta_1/eps", _e0(sens))

  eps_g = 1.0
  _additive("jaxdp.mechanisms.gaussian_mechanism",
            "(eps, delta)-DP, analytic Gaussian (Balle-Wang 2018 Thm 8)", eps_g, DELTA,
            lambda key, d: mech.gaussian_mechanism(key, d["v"], sens, eps_g, DELTA),
            lambda: mech.gaussian_mechanism_event(sens, eps_g, DELTA), sens, "l2", "gaussian",
            _analytic_sigma(eps_g, DELTA, sens), "Balle-Wang 2018 Thm 8 (solved with scipy)",
            _e0(sens))

  eps_c = 0.5
  _additive("jaxdp.mechanisms.classic_gaussian_mechanism",
            "(eps, delta)-DP for eps < 1, classic Gaussian (Dwork-Roth Thm A.1)", eps_c, DELTA,
            lambda key, d: mech.classic_gaussian_mechanism(key, d["v"], sens, eps_c, DELTA),
            lambda: mech.classic_gaussian_mechanism_event(sens, eps_c, DELTA), sens, "l2",
            "gaussian", sens * math.sqrt(2 * math.log(1.25 / DELTA)) / eps_c,
            "Dwork-Roth Thm A.1: sigma = Delta sqrt(2 ln(1.25/delta))/eps", _e0(sens))

  rho = 0.5
  _additive("jaxdp.mechanisms.zcdp_gaussian_mechanism",
            "rho-zCDP, Gaussian (Bun-Steinke 2016 Prop 1.6); eps via Prop 1.3",
            _zcdp_epsilon(rho, DELTA), DELTA,
            lambda key, d: mech.zcdp_gaussian_mechanism(key, d["v"], sens, rho),
            lambda: mech.zcdp_gaussian_mechanism_event(sens, rho), sens, "l2", "gaussian",
            sens / math.sqrt(2 * rho), "Bun-Steinke 2016 Prop 1.6: sigma = Delta/sqrt(2 rho)",
            _e0(sens))

  _additive("jaxdp.mechanisms.l2_laplace_mechanism",
            "eps-DP, L2-Laplace (paper 000 App. B.1 Thm 1; Chaudhuri et al. 2011)", eps, 0.0,
            lambda key, d: mech.l2_laplace_mechanism(key, d["v"], sens, eps),
            lambda: mech.l2_laplace_mechanism_event(sens, eps), sens, "l2", "l2_laplace",
            sens / eps, "paper 000 Thm 1: density exp(-eps ||z|| / Delta_2)",
            np.full(DIM, sens / 2.0))  # ||shift||_2 = Delta, spread over every coordinate

  grid, sens_d, eps_d = 0.5, 1.0, 1.0  # data on the grid: the rounding is exact
  k1 = math.ceil(sens_d / grid)
  _additive("jaxdp.mechanisms.discrete_laplace_mechanism",
            "eps-DP on the grid g Z, discrete Laplace (CKS 2020 Alg. 2; rounded sensitivity "
            "ceil(Delta/g) for one changed coordinate)", eps_d, 0.0,
            lambda key, d: mech.discrete_laplace_mechanism(key, d["v"], sens_d, eps_d, grid,
                                                           max_changed_coordinates=1),
            lambda: mech.discrete_laplace_mechanism_event(sens_d, eps_d, grid),
            sens_d, "l1", "discrete_laplace", k1 * grid / eps_d,
            "CKS 2020: P(z) prop. to exp(-|z|/b), b = ceil(Delta_1/g)/eps grid steps",
            _e0(sens_d), support=f"grid:{grid}")

  grid_g, rho_d = 0.25, 0.5
  k2 = math.ceil(sens_d / grid_g)
  _additive("jaxdp.mechanisms.discrete_gaussian_mechanism",
            "rho-zCDP on the grid g Z, discrete Gaussian (CKS 2020 Thm 4, Alg. 3); eps via "
            "Bun-Steinke Prop 1.3", _zcdp_epsilon(rho_d, DELTA), DELTA,
            lambda key, d: mech.discrete_gaussian_mechanism(key, d["v"], sens_d, rho_d, grid_g,
                                                            max_changed_coordinates=1),
            lambda: mech.discrete_gaussian_mechanism_event(sens_d, rho_d, grid_g),
            sens_d, "l2", "discrete_gaussian", k2 * grid_g / math.sqrt(2 * rho_d),
            "CKS 2020 Thm 4: sigma = ceil(Delta_2/g) g / sqrt(2 rho)", _e0(sens_d),
            support=f"grid:{grid_g}")


def _index_vector(out) -> np.ndarray:
  return np.asarray(out, np.float64).ravel()


def _is_first(out) -> float:
  return float(np.asarray(out).ravel()[0] == 0)


def _register_argmax():
  from jaxdp import mechanisms as mech

  beta, sens = 0.5, 1.0

  def score_pairs():
    # each score moves by Delta, in opposite directions (the 2 beta Delta worst case)
    return [({"scores": np.array([sens, 0.0, 0.0])}, {"scores": np.array([0.0, sens, 0.0])})]

  reg.register(reg.ReleasePoint(
      name="jaxdp.mechanisms.exponential_mechanism",
      guarantee="2 beta Delta-DP, exponential mechanism (McSherry-Talwar 2007; Dwork-Roth "
                "Thm 3.10)", epsilon=2 * beta * sens, delta=0.0, pairs=score_pairs,
      release=lambda key, d: mech.exponential_mechanism(key, d["scores"], beta),
      vector=_index_vector, event=lambda: mech.exponential_mechanism_event(beta, sens),
      charged=None, fresh=None, sensitivity=None, noise=None,
      audit=reg.AuditSpec(statistic=_is_first, trials=FAST_TRIALS, slow_trials=SLOW_TRIALS),
      support="discrete",
      skip={**NO_CHARGE, "replay": NOT_ADDITIVE, "noise": NOT_ADDITIVE}, **TAGS))

  def vote_pairs():
    # one vote moves from class 0 to class 1 (L1 = 2, L2 = sqrt 2)
    return [({"counts": np.array([6.0, 4.0, 0.0])}, {"counts": np.array([5.0, 5.0, 0.0])})]

  scale = 2.0
  reg.register(reg.ReleasePoint(
      name="jaxdp.mechanisms.report_noisy_max_laplace",
      guarantee="2/b-DP per answer for a moved vote, LNMax (PATE 2017)", epsilon=2.0 / scale,
      delta=0.0, pairs=vote_pairs,
      release=lambda key, d: mech.report_noisy_max_laplace(key, d["counts"], scale),
      vector=_index_vector, event=lambda: mech.report_noisy_max_laplace_event(scale),
      charged=None, fresh=None, sensitivity=None, noise=None,
      audit=reg.AuditSpec(statistic=_is_first, trials=FAST_TRIALS, slow_trials=SLOW_TRIALS),
      support="discrete",
      skip={**NO_CHARGE, "replay": NOT_ADDITIVE, "noise": NOT_ADDITIVE}, **TAGS))

  stddev = 2.0
  reg.register(reg.ReleasePoint(
      name="jaxdp.mechanisms.report_noisy_max_gaussian",
      guarantee="Gaussian mechanism on the vote histogram (Delta_2 = sqrt 2), GNMax (PATE 2018 "
                "Prop 8); eps at delta from Balle-Wang Thm 8",
      epsilon=_gaussian_epsilon(stddev / math.sqrt(2.0), DELTA), delta=DELTA, pairs=vote_pairs,
      release=lambda key, d: mech.report_noisy_max_gaussian(key, d["counts"], stddev),
      vector=_index_vector, event=lambda: mech.report_noisy_max_gaussian_event(stddev),
      charged=None, fresh=None, sensitivity=None, noise=None,
      audit=reg.AuditSpec(statistic=_is_first, trials=FAST_TRIALS, slow_trials=SLOW_TRIALS),
      support="discrete",
      skip={**NO_CHARGE, "replay": NOT_ADDITIVE, "noise": NOT_ADDITIVE}, **TAGS))


_EVENT = "builds the DpEvent from public privacy parameters; reads no data and releases nothing"
_CALIBRATION = "calibration of public privacy parameters (a noise scale or an epsilon/rho); takes no data"
_SAMPLER = ("raw noise sampler: draws noise from a key and public scale parameters; reads no data "
            "(the mechanisms that add it to data are registered)")

DECLARATIONS = {
    "jaxdp.mechanisms.laplace_mechanism_event": _EVENT,
    "jaxdp.mechanisms.gaussian_mechanism_event": _EVENT,
    "jaxdp.mechanisms.classic_gaussian_mechanism_event": _EVENT,
    "jaxdp.mechanisms.zcdp_gaussian_mechanism_event": _EVENT,
    "jaxdp.mechanisms.l2_laplace_mechanism_event": _EVENT,
    "jaxdp.mechanisms.exponential_mechanism_event": _EVENT,
    "jaxdp.mechanisms.report_noisy_max_laplace_event": _EVENT,
    "jaxdp.mechanisms.report_noisy_max_gaussian_event": _EVENT,
    "jaxdp.mechanisms.discrete_laplace_mechanism_event": _EVENT,
    "jaxdp.mechanisms.discrete_gaussian_mechanism_event": _EVENT,
    "jaxdp.mechanisms.laplace_scale": _CALIBRATION,
    "jaxdp.mechanisms.l2_laplace_beta": _CALIBRATION,
    "jaxdp.mechanisms.exponential_mechanism_beta": _CALIBRATION,
    "jaxdp.mechanisms.exponential_mechanism_epsilon": _CALIBRATION,
    "jaxdp.mechanisms.exponential_mechanism_zcdp_rho": _CALIBRATION,
    "jaxdp.mechanisms.report_noisy_max_laplace_epsilon": _CALIBRATION,
    "jaxdp.mechanisms.report_noisy_max_gaussian_rho": _CALIBRATION,
    "jaxdp.mechanisms.discrete_laplace_scale": _CALIBRATION,
    "jaxdp.mechanisms.discrete_gaussian_variance": _CALIBRATION,
    "jaxdp.mechanisms.noise_scale_as": _CALIBRATION + " (casts a scale towards more noise)",
    "jaxdp.mechanisms.discrete.rounded_l1_sensitivity": _CALIBRATION + " (sensitivity after "
                                                        "rounding to the public grid)",
    "jaxdp.mechanisms.discrete.rounded_l2_sensitivity": _CALIBRATION + " (sensitivity after "
                                                        "rounding to the public grid)",
    "jaxdp.mechanisms.exponential_mechanism_probs": (
        "the exact output law softmax(beta * scores) for analysis and tests: it adds no noise, so "
        "it is not a release (never call it on private scores and publish the result)"),
    "jaxdp.mechanisms.laplace_noise": _SAMPLER,
    "jaxdp.mechanisms.gaussian_noise": _SAMPLER,
    "jaxdp.mechanisms.l2_laplace_noise": _SAMPLER,
    "jaxdp.mechanisms.l2_laplace_radius": _SAMPLER,
    "jaxdp.mechanisms.discrete_laplace_noise": _SAMPLER,
    "jaxdp.mechanisms.discrete_gaussian_noise": _SAMPLER,
}

_register_additive()
_register_argmax()
for _name, _reason in DECLARATIONS.items():
  reg.not_a_release_point(_name, _reason)
