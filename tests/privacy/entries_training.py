"""Conformance entries of private linear training (``jaxdp.training``, papers 000 and 003).

Release points (names are the defining modules; the package re-exports them as
``jaxdp.training.model_sensitivity``, ``loss_perturbation``,
``output_perturbation_fit``, ``objective_perturbation_fit``,
``PrivateLinearClassifier``, ``PrivateLogisticRegression``):

* ``output_perturbation`` (paper 003 Alg. 4, binary logistic, ``K = 1``) and
  ``model_sensitivity`` (paper 000 Alg. 1, softmax, ``K = sqrt 2``): the
  certified minimiser plus L2-Laplace noise. Replace-one sensitivity of the
  minimiser (paper 000 App. A, Lemma 1) plus the solver slack of the two
  certified solves: ``Delta = 2K/(N lambda) + 2 tol/lambda``; the noise has
  density ``exp(-||z|| / b)`` with ``b = Delta / eps`` (paper 000 Alg. 1:
  ``beta = 1/b = N lambda eps/(2K)`` at ``tol = 0``). Additive: replay and
  noise-scale checks apply.
* ``loss_perturbation`` (paper 000 Alg. 4, replace-one default; and
  ``neighbouring="add_remove"``, the paper's own relation, with ``l2_reg = 0``)
  and ``objective_perturbation`` (paper 003 Alg. 1): noise in the objective,
  plus the Approximate Minima Perturbation output noise (Iyengar et al. 2019)
  at 1% of epsilon. Not additive output noise: no replay / noise-scale check
  (the noise law of ``B`` is tested by recovering it from stationarity in
  tests/training/test_objective_perturbation.py); audited.
* ``PrivateLinearClassifier.fit`` (output perturbation) and
  ``PrivateLogisticRegression.fit`` (default: loss perturbation): the
  estimators' seeding (fresh OS entropy by default), charging and fitted
  attributes.

Test configuration: ``N = 30`` rows on the unit sphere in ``D = 3``
dimensions, ``lambda = 0.1``, ``eps = 1``, ``tol = 1e-6``; softmax entries use
``C = 3`` classes (9 weights), binary entries labels in ``{0, 1}``. Worst-case
pairs (replace-one): a record moved to the antipode of the unit sphere with
its label changed, a record replaced by a copy of another row with a different
label (duplicated row), and a record moved to a coordinate axis. Add/remove: a
record on the unit sphere added.

Every number (sensitivity, noise scale, event) is written here from the
theorems, not taken from the library's calibration; the noise reference (the
exact non-private minimiser) is a float64 scipy minimisation of the objective
written here.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import optimize, special

import conformance_registry as reg
import conformance_checks as cc
from jaxdp.accounting import events

N, D, C = 30, 3, 3
LAM = 0.1
EPS = 1.0
TOL = 1e-6
AMP_FRACTION = 0.01
FAMILY = "training"
_SEED = 26
K_SOFTMAX = math.sqrt(2.0)  # paper 000 Thm 9
K_LOGISTIC = 1.0  # paper 003 Sec. 6


# -- datasets -------------------------------------------------------------------


def _base(num_classes: int, n: int = N) -> dict:
  rng = np.random.default_rng(_SEED)
  x = rng.normal(size=(n, D))
  x /= np.linalg.norm(x, axis=1, keepdims=True)
  y = rng.integers(0, num_classes, size=n)
  return {"x": x.astype(np.float32), "y": y.astype(np.int32)}


def _replace(data: dict, i: int, x_row, y_row) -> dict:
  x, y = data["x"].copy(), data["y"].copy()
  x[i], y[i] = np.asarray(x_row, np.float32), y_row
  return {"x": x, "y": y}


def replace_one_pairs(num_classes: int) -> list[tuple[dict, dict]]:
  """Replace-one neighbours; the worst case (antipode, label changed) first."""
  base = _base(num_classes)
  x, y = base["x"], base["y"]
  other = lambda label: (int(label) + 1) % num_classes
  axis = np.zeros(D, np.float32)
  axis[0] = 1.0
  dup = int(np.flatnonzero(y != y[1])[0])  # row 1 becomes a copy of a row with another label
  return [
      (base, _replace(base, 0, -x[0], other(y[0]))),
      (base, _replace(base, 1, x[dup], int(y[dup]))),
      (base, _replace(base, 2, axis, other(y[2]))),
  ]


def add_remove_pairs(num_classes: int) -> list[tuple[dict, dict]]:
  """Add/remove neighbours: a record on the unit sphere (the antipode of row 0, another label) added."""
  base = _base(num_classes)
  far = -base["x"][0]
  added = {"x": np.concatenate([base["x"], far[None]]),
           "y": np.concatenate([base["y"], np.asarray([(int(base["y"][0]) + 1) % num_classes],
                                                      np.int32)])}
  return [(base, added)]  # (removal, the mirror case, would compile one more shape per fit)


# -- exact non-private minimisers (noise references), written here -----------------


def _softmax_objective(w_flat, x, y, lam):
  w = w_flat.reshape(x.shape[1], C)
  s = x @ w
  p = special.softmax(s, axis=1)
  value = np.mean(special.logsumexp(s, axis=1) - s[np.arange(len(y)), y]) + 0.5 * lam * np.sum(w * w)
  p[np.arange(len(y)), y] -= 1.0
  return value, (x.T @ p / len(y) + lam * w).reshape(-1)


def _logistic_objective(w, x, y, lam):
  z = np.where(y > 0, 1.0, -1.0) * (x @ w)
  value = np.mean(np.logaddexp(0.0, -z)) + 0.5 * lam * np.dot(w, w)
  dz = -special.expit(-z) * np.where(y > 0, 1.0, -1.0)
  return value, x.T @ dz / len(y) + lam * w


def _minimiser(fun, size, data):
  x = np.asarray(data["x"], np.float64)
  y = np.asarray(data["y"])
  res = optimize.minimize(fun, np.zeros(size), args=(x, y, LAM), jac=True, method="L-BFGS-B",
                          options=dict(maxiter=10_000, gtol=1e-12, ftol=0.0))
  return res.x


def softmax_minimiser(data: dict) -> np.ndarray:
  """``argmin (1/N) sum softmax-CE + (lambda/2)||W||_F^2``, flattened ``(D C,)`` float64."""
  return _minimiser(_softmax_objective, D * C, data)


def logistic_minimiser(data: dict) -> np.ndarray:
  """``argmin (1/N) sum log(1 + e^{-s w.x}) + (lambda/2)||w||^2``, ``(D,)`` float64."""
  return _minimiser(_logistic_objective, D, data)


# -- shared pieces ---------------------------------------------------------------


def _flat(w) -> np.ndarray:
  return np.asarray(w, np.float64).reshape(-1)


def _first_coordinate(vector_fn):
  return lambda out: float(vector_fn(out)[0])


def _sensitivity(k: float) -> float:
  """Paper 000 Lemma 1 (replace-one, ``2K/(N lambda)``) + ``2 tol/lambda`` (two certified solves)."""
  return 2.0 * k / (N * LAM) + 2.0 * TOL / LAM


def _pure(eps: float, relation: str = "replace_one") -> events.DpEvent:
  return events.PureDpEvent(eps, neighbouring=relation)


def _amp_event(relation: str = "replace_one") -> events.DpEvent:
  """AMP: objective part at (1 - f) eps, output part at f eps, both pure, one relation."""
  return events.ComposedDpEvent([_pure((1.0 - AMP_FRACTION) * EPS, relation),
                                 _pure(AMP_FRACTION * EPS, relation)])


_PUBLIC_RESULT = ("event", "calibration")
_NOT_ADDITIVE = ("not additive output noise: B enters the objective and the guarantee is the "
                 "change-of-variables argument of paper 000 Thm 3 / paper 003 Thm 1 (the same "
                 "key on D and D' moves the minimiser by more than any output sensitivity)")
_NOISE_IN_OBJECTIVE = ("the objective noise B is not added to a statistic of the data; its law "
                       "(Gamma norm / Gaussian) is tested by recovering B from the stationarity "
                       "condition in tests/training/test_objective_perturbation.py")
_FUNCTIONAL_CHARGE = ("a pure function: spends on no accountant and returns the event of one "
                      "release (count = number of keys); the estimator entries "
                      "(PrivateLinearClassifier.fit, PrivateLogisticRegression.fit) check the "
                      "spend")
_ADDITIVE_AUDIT = ("host-side fit (~10-50 ms a call, not vmappable): 2 x trials calls do not "
                   "fit the always-on suite; the release is pinned by the replay check (same "
                   "noise: difference <= Delta) and the L2-Laplace noise-scale check (b = "
                   "Delta/eps), which together are the mechanism's proof; audited end to end "
                   "in tests/training/test_output_perturbation.py")
_HOST_AUDIT = dict(trials=150, slow_trials=3_000)


# -- output_perturbation (paper 003 Alg. 4) / model_sensitivity (paper 000 Alg. 1) --


def _output_perturbation(key, data):
  from jaxdp.training import output_perturbation as op  # pylint: disable=import-outside-toplevel
  return op.output_perturbation(key, data["x"], data["y"], l2_reg=LAM, loss="logistic",
                                epsilon=EPS, tol=TOL)


reg.register(reg.ReleasePoint(
    name="jaxdp.training.output_perturbation.output_perturbation",
    family=FAMILY, neighbouring="replace_one", unit="example",
    guarantee=("eps-DP (replace-one): certified minimiser + L2-Laplace noise, beta = eps/Delta, "
               "Delta = 2K/(N lambda) + 2 tol/lambda (paper 003 Alg. 4; paper 000 Lemma 1)"),
    epsilon=EPS, delta=0.0, pairs=lambda: replace_one_pairs(2),
    release=_output_perturbation, vector=lambda out: _flat(out.weights),
    event=lambda: _pure(EPS), charged=None, fresh=None,
    sensitivity=_sensitivity(K_LOGISTIC), norm="l2",
    noise=reg.NoiseSpec(
        kind="l2_laplace", scale=_sensitivity(K_LOGISTIC) / EPS, reference=logistic_minimiser,
        theorem="paper 003 Alg. 4 / paper 000 Alg. 1: p(z) ~ exp(-eps ||z|| / Delta), "
                "Delta = 2K/(N lambda) + 2 tol/lambda, K = 1"),
    audit=None, support="continuous", public_outputs=_PUBLIC_RESULT,
    skip={"charge": _FUNCTIONAL_CHARGE, "audit": _ADDITIVE_AUDIT}))


def _model_sensitivity(key, data):
  from jaxdp.training import output_perturbation as op  # pylint: disable=import-outside-toplevel
  return op.model_sensitivity(key, data["x"], data["y"], num_classes=C, l2_reg=LAM, epsilon=EPS,
                              tol=TOL)


reg.register(reg.ReleasePoint(
    name="jaxdp.training.output_perturbation.model_sensitivity",
    family=FAMILY, neighbouring="replace_one", unit="example",
    guarantee=("eps-DP (replace-one): certified softmax minimiser + L2-Laplace noise with "
               "beta = N lambda eps / (2K) at tol 0, K = sqrt 2 (paper 000 Alg. 1, Thm 1, Lemma 1)"),
    epsilon=EPS, delta=0.0, pairs=lambda: replace_one_pairs(C),
    release=_model_sensitivity, vector=lambda out: _flat(out.weights),
    event=lambda: _pure(EPS), charged=None, fresh=None,
    sensitivity=_sensitivity(K_SOFTMAX), norm="l2",
    noise=reg.NoiseSpec(
        kind="l2_laplace", scale=_sensitivity(K_SOFTMAX) / EPS, reference=softmax_minimiser,
        theorem="paper 000 Alg. 1: beta = N lambda eps/(2K), K = sqrt 2 (Thm 9), plus the "
                "2 tol/lambda solver slack in Delta"),
    audit=None, support="continuous", public_outputs=_PUBLIC_RESULT,
    skip={"charge": _FUNCTIONAL_CHARGE, "audit": _ADDITIVE_AUDIT}))


# -- loss_perturbation (paper 000 Alg. 4) / objective_perturbation (paper 003 Alg. 1) --


def _loss_perturbation(key, data, neighbouring="replace_one"):
  from jaxdp.training import objective_perturbation as obp  # pylint: disable=import-outside-toplevel
  l2 = LAM if neighbouring == "replace_one" else 0.0  # add/remove requires l2_reg = 0
  return obp.loss_perturbation(key, data["x"], data["y"], num_classes=C, epsilon=EPS, l2_reg=l2,
                               neighbouring=neighbouring, amp_fraction=AMP_FRACTION)


_LOSS_GUARANTEE = ("eps-DP ({}): loss perturbation, ||B|| ~ Gamma(DC, 2K/eps1 x {}) with rho = "
                   "2LC/eps1 (paper 000 Alg. 4, Thm 3), composed with the AMP output noise at "
                   "eps2 = 0.01 eps (Iyengar et al. 2019)")

for _relation, _pairs, _factor in (("replace_one", lambda: replace_one_pairs(C), "2"),
                                   ("add_remove", lambda: add_remove_pairs(C), "1")):
  reg.register(reg.ReleasePoint(
      name="jaxdp.training.objective_perturbation.loss_perturbation" + (
          "" if _relation == "replace_one" else "[neighbouring=add_remove]"),
      family=FAMILY, neighbouring=_relation, unit="example",
      guarantee=_LOSS_GUARANTEE.format(_relation, _factor),
      epsilon=EPS, delta=0.0, pairs=_pairs,
      release=(lambda rel: lambda key, data: _loss_perturbation(key, data, rel))(_relation),
      vector=lambda out: _flat(out.weights),
      event=(lambda rel: lambda: _amp_event(rel))(_relation), charged=None, fresh=None,
      sensitivity=None, noise=None,
      audit=reg.AuditSpec(statistic=_first_coordinate(lambda out: _flat(out.weights)),
                          **_HOST_AUDIT),
      support="continuous", public_outputs=_PUBLIC_RESULT,
      skip={"replay": _NOT_ADDITIVE, "noise": _NOISE_IN_OBJECTIVE,
            "charge": _FUNCTIONAL_CHARGE}))


def _objective_perturbation(key, data):
  from jaxdp.training import objective_perturbation as obp  # pylint: disable=import-outside-toplevel
  return obp.objective_perturbation(key, data["x"], data["y"], epsilon=EPS, l2_reg=LAM,
                                    loss="logistic", amp_fraction=AMP_FRACTION)


reg.register(reg.ReleasePoint(
    name="jaxdp.training.objective_perturbation.objective_perturbation",
    family=FAMILY, neighbouring="replace_one", unit="example",
    guarantee=("eps-DP (replace-one): binary objective perturbation, gamma = eps'/2 with eps' = "
               "eps1 - log(1 + t/(N lambda)) (paper 003 Alg. 1, Thm 1), composed with the AMP "
               "output noise at eps2 = 0.01 eps (Iyengar et al. 2019)"),
    epsilon=EPS, delta=0.0, pairs=lambda: replace_one_pairs(2),
    release=_objective_perturbation, vector=lambda out: _flat(out.weights),
    event=_amp_event, charged=None, fresh=None, sensitivity=None, noise=None,
    audit=reg.AuditSpec(statistic=_first_coordinate(lambda out: _flat(out.weights)),
                        **_HOST_AUDIT),
    support="continuous", public_outputs=_PUBLIC_RESULT,
    skip={"replay": _NOT_ADDITIVE, "noise": _NOISE_IN_OBJECTIVE, "charge": _FUNCTIONAL_CHARGE}))


# -- estimators --------------------------------------------------------------------


def _classifier(seed=None, accountant=None):
  from jaxdp.training.estimators import PrivateLinearClassifier  # pylint: disable=import-outside-toplevel
  return PrivateLinearClassifier(epsilon=EPS, method="output_perturbation", loss="logistic",
                                 l2_reg=LAM, tol=TOL, classes=[0, 1], seed=seed,
                                 accountant=accountant)


def _logistic_regression(seed=None, accountant=None):
  from jaxdp.training.estimators import PrivateLogisticRegression  # pylint: disable=import-outside-toplevel
  return PrivateLogisticRegression(epsilon=EPS, l2_reg=LAM, classes=list(range(C)), seed=seed,
                                   accountant=accountant, amp_fraction=AMP_FRACTION)


def _fit(make):
  return lambda key, data: make(seed=key).fit(data["x"], data["y"])


def _fit_fresh(make):
  return lambda data: make().fit(data["x"], data["y"])


def _fit_charged(make):
  return lambda data, accountant: (make(accountant=accountant).fit(data["x"], data["y"]), 1)


# Public fitted / constructor attributes: the parameters, the public label set, the event.
_ESTIMATOR_PUBLIC = ("epsilon", "delta", "l2_reg", "h", "max_iter", "tol", "amp_fraction",
                     "classes", "classes_", "event_", "_num_fits", "accountant")

reg.register(reg.ReleasePoint(
    name="jaxdp.training.estimators.PrivateLinearClassifier.fit",
    family=FAMILY, neighbouring="replace_one", unit="example",
    guarantee=("eps-DP (replace-one) per fit: output perturbation (paper 003 Alg. 4), "
               "Delta = 2K/(N lambda) + 2 tol/lambda, K = 1"),
    epsilon=EPS, delta=0.0, pairs=lambda: replace_one_pairs(2),
    release=_fit(_classifier), vector=lambda clf: _flat(clf.coef_),
    event=lambda: _pure(EPS), charged=_fit_charged(_classifier), fresh=_fit_fresh(_classifier),
    sensitivity=_sensitivity(K_LOGISTIC), norm="l2",
    noise=reg.NoiseSpec(
        kind="l2_laplace", scale=_sensitivity(K_LOGISTIC) / EPS, reference=logistic_minimiser,
        theorem="paper 003 Alg. 4: p(z) ~ exp(-eps ||z|| / Delta), Delta = 2K/(N lambda) + "
                "2 tol/lambda, K = 1"),
    audit=None, support="continuous", public_outputs=_ESTIMATOR_PUBLIC,
    skip={"audit": _ADDITIVE_AUDIT}))

reg.register(reg.ReleasePoint(
    name="jaxdp.training.estimators.PrivateLogisticRegression.fit",
    family=FAMILY, neighbouring="replace_one", unit="example",
    guarantee=_LOSS_GUARANTEE.format("replace_one", "2") + " (the estimator's default method)",
    epsilon=EPS, delta=0.0, pairs=lambda: replace_one_pairs(C),
    release=_fit(_logistic_regression), vector=lambda clf: _flat(clf.coef_),
    event=_amp_event, charged=_fit_charged(_logistic_regression),
    fresh=_fit_fresh(_logistic_regression), sensitivity=None, noise=None,
    audit=reg.AuditSpec(statistic=lambda clf: float(_flat(clf.coef_)[0]), **_HOST_AUDIT),
    support="continuous", public_outputs=_ESTIMATOR_PUBLIC,
    skip={"replay": _NOT_ADDITIVE, "noise": _NOISE_IN_OBJECTIVE}))


# -- calibrations: privacy parameters in, public numbers out -------------------------

_CALIBRATION = "a calibration of public parameters (N, lambda, eps, delta, ...); reads no data"
for _name in (
    "jaxdp.training.output_perturbation.output_perturbation_calibration",
    "jaxdp.training.output_perturbation.minimizer_sensitivity",
    "jaxdp.training.objective_perturbation.loss_perturbation_calibration",
    "jaxdp.training.objective_perturbation.loss_perturbation_rho",
    "jaxdp.training.objective_perturbation.gaussian_loss_perturbation_sigma",
    "jaxdp.training.objective_perturbation.objective_perturbation_calibration",
    "jaxdp.training.objective_perturbation.amp_calibration",
    "jaxdp.training.objective_perturbation.amp_default_tol",
    "jaxdp.training.objective_perturbation.loss_perturbation_amp_calibration",
    "jaxdp.training.objective_perturbation.objective_perturbation_amp_calibration",
):
  reg.not_a_release_point(_name, _CALIBRATION)
reg.not_a_release_point(
    "jaxdp.training.estimators.PrivateLinearClassifier",
    "the constructor stores parameters and reads no data; its fit is registered")
reg.not_a_release_point(
    "jaxdp.training.estimators.PrivateLogisticRegression",
    "the constructor stores parameters and reads no data; its fit is registered")
reg.not_a_release_point(
    "jaxdp.training.linear.linear_objective_diff",
    "a solver building block (the exact objective difference J(w + d) - J(w) the caller asks "
    "for on the data the caller passes); its `delta` is a step in weight space, not a privacy "
    "parameter, and no jaxdp release returns its value")
reg.not_a_release_point(
    "jaxdp.training.objective_perturbation.ObjectivePerturbationCalibration",
    "a record of a calibration of public parameters (noise kind, scale, event); reads no data")
reg.not_a_release_point(
    "jaxdp.training.output_perturbation.OutputPerturbationCalibration",
    "a record of a calibration of public parameters (noise kind, scale, event); reads no data")
for _cls in ("PrivateLinearClassifier", "PrivateLogisticRegression"):
  for _method in ("predict", "predict_proba"):
    reg.not_a_release_point(
        f"jaxdp.training.estimators.{_cls}.{_method}",
        "post-processing of the fitted private coef_ (the fit is the registered release) on "
        "the caller's query rows; spends nothing")

# Every release above is a host-side certified fit (numpy certificate, L-BFGS): a vmapped
# attempt would fail after tracing most of the fit, so the checks loop from the start.
cc.host_side(*[_n for _n in reg.REGISTRY if _n.startswith((
    "jaxdp.training.output_perturbation.", "jaxdp.training.objective_perturbation.",
    "jaxdp.training.estimators."))])
