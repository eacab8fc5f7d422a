"""Conformance entries of the private-prediction family (``jaxdp.prediction``).

Relation: replace-one (paper 000 Lemma 1 for the logits; one replaced training
example moves at most one teacher's vote for the voting methods), as the
events state. Privacy unit: one training example.

Configurations are tiny and every fit is cached per dataset (a fit is a
deterministic function of the data, so the cache changes nothing but time):

* prediction sensitivity: softmax regression on N = 24 examples in the unit
  ball, lambda = 0.5, M = 2 queries on the unit sphere per call, Gaussian
  noise by exact Gaussian composition (Dong, Roth & Su 2019 Cor. 3.3: B
  queries of sensitivity Delta = one of sensitivity Delta sqrt(B); sigma from
  Balle & Wang 2018 Thm 8), recomputed here by bisection on the exact privacy
  profile, never by the library's calibration;
* voting (subsample-and-aggregate, PATE, noisy max): T = 8 teachers, each
  trained on ONE example x = e_0 (contiguous partition), so replacing the
  label of teacher 0's example moves its vote: the adversarial histograms
  (1, T - 1) vs (0, T) of :func:`jaxdp.prediction.adversarial_votes`;
* the functions on caller-given votes / logits take the histograms / logits as
  the dataset: neighbouring vote histograms differ by one moved vote, and
  neighbouring logits by the logit sensitivity Delta per query.

Predictors draw a 128-bit OS nonce per instance; the releases below fix it
(``unsafe_fixed_nonce=0``) so that a key replays, and the ``fresh`` callables
build predictors with ONE fixed key and no fixed nonce: two instances (and two
processes) must still answer with different noise.
"""

from __future__ import annotations

import functools
import hashlib
import math

import jax
import numpy as np
from scipy import optimize, stats

import conformance_registry as reg
import conformance_checks as cc

FAMILY = "prediction"
RELATION = "replace_one"
UNIT = "example"
EPSILON = 1.0
DELTA = 1e-5

# -- exact Gaussian privacy profile (Balle & Wang 2018 Thm 8) -------------------


def _gaussian_delta(mu: float, eps: float) -> float:
  return stats.norm.cdf(mu / 2 - eps / mu) - math.exp(eps) * stats.norm.cdf(-mu / 2 - eps / mu)


def gaussian_epsilon(mu: float, delta: float) -> float:
  """Exact epsilon at ``delta`` of a Gaussian mechanism with ``Delta / sigma = mu``."""
  if _gaussian_delta(mu, 0.0) <= delta:
    return 0.0
  return float(optimize.brentq(lambda e: _gaussian_delta(mu, e) - delta, 0.0, 200.0, xtol=1e-12))


def gaussian_sigma(eps: float, delta: float, sensitivity: float) -> float:
  """Smallest sigma with ``(eps, delta)`` for sensitivity ``Delta`` (bisection on mu)."""
  mu = optimize.brentq(lambda m: _gaussian_delta(m, eps) - delta, 1e-6, 50.0, xtol=1e-14)
  return sensitivity / mu


def _jp():
  import jaxdp.prediction  # pylint: disable=import-outside-toplevel
  return jaxdp.prediction


def _acc():
  import jaxdp.accounting  # pylint: disable=import-outside-toplevel
  return jaxdp.accounting


def _digest(*arrays) -> str:
  h = hashlib.sha256()
  for a in arrays:
    a = np.ascontiguousarray(np.asarray(a))
    h.update(str(a.dtype).encode() + str(a.shape).encode() + a.tobytes())
  return h.hexdigest()


# -- prediction sensitivity ------------------------------------------------------

PS_N, PS_D, PS_C = 24, 3, 3
PS_LAMBDA = 0.5
PS_TOL = 1e-6
PS_QUERIES = 2
_K = math.sqrt(2.0)  # Lipschitz constant of the softmax cross-entropy in the logits
# from_linear_model's certified tolerance: tol + 2^-24 (K + tol) (float32 rounding of the weights).
_PS_SOLVER_TOL = PS_TOL + 2.0**-24 * (_K + PS_TOL)
# Paper 000 Lemma 1 + strong convexity: ||theta - theta'|| <= 2K/(N lambda) + 2 tol/lambda.
PS_DELTA_LOGITS = 2 * _K / (PS_N * PS_LAMBDA) + 2 * _PS_SOLVER_TOL / PS_LAMBDA
PS_SIGMA = gaussian_sigma(EPSILON, DELTA, PS_DELTA_LOGITS * math.sqrt(PS_QUERIES))


def _ps_queries() -> np.ndarray:
  q = np.zeros((PS_QUERIES, PS_D), np.float32)
  q[0, 0] = 1.0  # on the unit sphere, along the replaced record
  q[1] = np.asarray([0.6, 0.8, 0.0], np.float32)
  return q


def _ps_pairs():
  rng = np.random.default_rng(7)
  x = rng.normal(size=(PS_N, PS_D))
  x = (x / (1.25 * np.linalg.norm(x, axis=1, keepdims=True))).astype(np.float32)
  y = rng.integers(0, PS_C, size=PS_N).astype(np.int32)
  base = {"x": x, "y": y}

  def replace(row, label, i=0):
    x2, y2 = x.copy(), y.copy()
    x2[i], y2[i] = row, label
    return {"x": x2, "y": y2}

  e0 = np.zeros(PS_D, np.float32)
  e0[0] = 1.0
  return [
      (replace(e0, 0), replace(-e0, PS_C - 1)),  # boundary records, extreme labels
      (base, replace(x[1], y[1])),                # a duplicated row
  ]


@functools.lru_cache(maxsize=8)
def _ps_weights(digest: str, x_bytes: bytes, y_bytes: bytes) -> np.ndarray:
  """Certified weights of softmax regression on the dataset (deterministic; cached)."""
  from jaxdp.prediction import PredictionSensitivityPredictor
  from jaxdp.training import fit_linear
  x = np.frombuffer(x_bytes, np.float32).reshape(PS_N, PS_D)
  y = np.frombuffer(y_bytes, np.int32)
  model = fit_linear(x, y, num_classes=PS_C, l2_reg=PS_LAMBDA, tol=PS_TOL)
  pred = PredictionSensitivityPredictor.from_linear_model(
      model, x=x, y=y, l2_reg=PS_LAMBDA, epsilon=EPSILON, delta=DELTA, budget=PS_QUERIES,
      key=jax.random.key(0), tol=PS_TOL, method="exact_gaussian_composition")
  return np.asarray(pred.weights)


def _weights_of(data) -> np.ndarray:
  x = np.ascontiguousarray(data["x"], np.float32)
  y = np.ascontiguousarray(data["y"], np.int32)
  return _ps_weights(_digest(x, y), x.tobytes(), y.tobytes())


def _ps_calibration():  # not cached: a patched calibration (tests/privacy/test_power.py) must show
  from jaxdp.prediction import calibrate_prediction_sensitivity
  return calibrate_prediction_sensitivity(EPSILON, DELTA, PS_QUERIES, PS_N, PS_LAMBDA,
                                          method="exact_gaussian_composition",
                                          solver_tol=_PS_SOLVER_TOL)


def _ps_predictor(key, data, privacy_budget=None, nonce=0):
  from jaxdp.prediction import PredictionSensitivityPredictor
  return PredictionSensitivityPredictor(_weights_of(data), _ps_calibration(), key=key,
                                        privacy_budget=privacy_budget,
                                        unsafe_fixed_nonce=nonce)


def _ps_release(key, data):
  return _ps_predictor(key, data).predict(_ps_queries())


def _ps_reference(data) -> np.ndarray:
  return (_ps_queries().astype(np.float64) @ _weights_of(data).astype(np.float64)).reshape(-1)


def _ps_direction() -> np.ndarray:
  pairs = _ps_pairs()
  d = _ps_reference(pairs[0][0]) - _ps_reference(pairs[0][1])
  return d / np.linalg.norm(d)


def _flat(out) -> np.ndarray:
  return np.asarray(out, np.float64).reshape(-1)


reg.register(reg.ReleasePoint(
    name="jaxdp.prediction.PredictionSensitivityPredictor.predict",
    family=FAMILY, neighbouring=RELATION, unit=UNIT,
    guarantee="(eps, delta)-DP over the budget's B queries, replace-one: Gaussian noise on the "
              "logits of sensitivity 2K/(N lambda) + 2 tol/lambda (paper 000 Lemma 1, Alg. 7), "
              "B queries composed exactly (Dong, Roth & Su 2019 Cor. 3.3)",
    epsilon=EPSILON, delta=DELTA, pairs=_ps_pairs, release=_ps_release, vector=_flat,
    event=lambda: _ps_calibration().query_event(),
    charged=lambda data, acc: (_ps_predictor(jax.random.key(5), data, acc, None).predict(
        _ps_queries()), PS_QUERIES),
    fresh=lambda data: _ps_predictor(jax.random.key(0), data, nonce=None).predict(_ps_queries()),
    sensitivity=PS_DELTA_LOGITS * math.sqrt(PS_QUERIES), norm="l2",
    noise=reg.NoiseSpec("gaussian", PS_SIGMA, _ps_reference,
                        "analytic Gaussian (Balle & Wang 2018 Thm 8) at sensitivity "
                        "Delta sqrt(B) (Dong, Roth & Su 2019 Cor. 3.3), paper 000 Alg. 7"),
    audit=reg.AuditSpec(statistic=lambda out: float(np.dot(_flat(out), _ps_direction())),
                        trials=300, slow_trials=5_000),
    support="continuous"))


# -- voting: T teachers on one example each ----------------------------------------

T, VOTE_D, VOTE_C = 8, 2, 2
VOTE_QUERIES = 2
TEACHER_LAMBDA = 0.1


def _vote_pairs():
  """Teacher t is trained on example t; replacing example 0's label moves teacher 0's vote."""
  x = np.zeros((T, VOTE_D), np.float32)
  x[:, 0] = 1.0
  y = np.ones(T, np.int32)
  y_low = y.copy()
  y_low[0] = 0
  return [({"x": x, "y": y_low}, {"x": x, "y": y})]  # votes (1, T-1) vs (0, T) on e_0


def _vote_queries() -> np.ndarray:
  q = np.zeros((VOTE_QUERIES, VOTE_D), np.float32)
  q[:, 0] = 1.0
  return q


@functools.lru_cache(maxsize=8)
def _teachers(digest: str, x_bytes: bytes, y_bytes: bytes) -> np.ndarray:
  from jaxdp.prediction import train_linear_teachers
  x = np.frombuffer(x_bytes, np.float32).reshape(T, VOTE_D)
  y = np.frombuffer(y_bytes, np.int32)
  model = train_linear_teachers(x, y, num_teachers=T, num_classes=VOTE_C, l2_reg=TEACHER_LAMBDA)
  return np.asarray(model.weights)


def _teachers_of(data) -> np.ndarray:
  x = np.ascontiguousarray(data["x"], np.float32)
  y = np.ascontiguousarray(data["y"], np.int32)
  return _teachers(_digest(x, y), x.tobytes(), y.tobytes())


def _fresh_queries() -> np.ndarray:
  return np.repeat(_vote_queries()[:1], FRESH_QUERIES, axis=0)


def _label_statistic(out) -> float:
  """1 if the first answer is class 0 (the class teacher 0 votes for on D only)."""
  return float(np.asarray(out).reshape(-1)[0] == 0)


SA_BETA = EPSILON / (2 * VOTE_QUERIES)  # pure DP: beta = eps / (2B) (exp. mechanism is 2 beta-DP)


FRESH_QUERIES = 64  # discrete answers: 64 of them make a chance collision of two instances negligible


def _sa_predictor(key, data, privacy_budget=None, nonce=0, budget=VOTE_QUERIES):
  from jaxdp.prediction import SubsampleAggregatePredictor
  return SubsampleAggregatePredictor.from_linear_teachers(
      _teachers_of(data), epsilon=EPSILON, delta=0.0, budget=budget, key=key,
      privacy_budget=privacy_budget, unsafe_fixed_nonce=nonce)


def _sa_event():
  from jaxdp.prediction import exponential_aggregation_beta, exponential_aggregation_event
  return exponential_aggregation_event(exponential_aggregation_beta(EPSILON, 0.0, VOTE_QUERIES))


_NOT_ADDITIVE_EM = ("not additive noise: the exponential mechanism samples a label with "
                    "p(y) prop. to exp(beta n_y); its guarantee is checked by the audit")

reg.register(reg.ReleasePoint(
    name="jaxdp.prediction.SubsampleAggregatePredictor.predict",
    family=FAMILY, neighbouring=RELATION, unit=UNIT,
    guarantee="eps-DP over B answers, replace-one: exponential mechanism on teacher votes, "
              "2 beta-DP per answer (McSherry & Talwar 2007), beta = eps/(2B) (paper 000 Alg. 8, "
              "Thm 7 corrected)",
    epsilon=EPSILON, delta=0.0, pairs=_vote_pairs,
    release=lambda key, data: _sa_predictor(key, data).predict(_vote_queries()),
    vector=_flat, event=_sa_event,
    charged=lambda data, acc: (_sa_predictor(jax.random.key(5), data, acc, None).predict(
        _vote_queries()), VOTE_QUERIES),
    fresh=lambda data: _sa_predictor(jax.random.key(0), data, nonce=None,
                                     budget=FRESH_QUERIES).predict(_fresh_queries()),
    audit=reg.AuditSpec(statistic=_label_statistic, trials=600, slow_trials=20_000),
    support="discrete",
    skip={"replay": _NOT_ADDITIVE_EM, "noise": _NOT_ADDITIVE_EM}))


def _nm_predictor(key, data, privacy_budget=None, nonce=0, budget=VOTE_QUERIES):
  from jaxdp.prediction import NoisyMaxPredictor
  return NoisyMaxPredictor.from_linear_teachers(
      _teachers_of(data), mechanism="gnmax", epsilon=EPSILON, delta=DELTA, budget=budget,
      key=key, privacy_budget=privacy_budget, unsafe_fixed_nonce=nonce)


def _nm_event():
  from jaxdp.prediction import noisy_max_event, noisy_max_scale
  return noisy_max_event("gnmax", noisy_max_scale("gnmax", EPSILON, DELTA, VOTE_QUERIES))


_NOT_ADDITIVE_NM = ("not additive noise: the release is argmax_c (n_c + Z_c), a label; its "
                    "guarantee is checked by the audit")

reg.register(reg.ReleasePoint(
    name="jaxdp.prediction.NoisyMaxPredictor.predict",
    family=FAMILY, neighbouring=RELATION, unit=UNIT,
    guarantee="(eps, delta)-DP over B labels, replace-one: GNMax, Gaussian noise on vote counts "
              "of L2 sensitivity sqrt(2) (PATE 2018 Prop. 8), B labels composed exactly (Dong, "
              "Roth & Su 2019 Cor. 3.3; Balle & Wang 2018 Thm 8)",
    epsilon=EPSILON, delta=DELTA, pairs=_vote_pairs,
    release=lambda key, data: _nm_predictor(key, data).predict(_vote_queries()),
    vector=_flat, event=_nm_event,
    charged=lambda data, acc: (_nm_predictor(jax.random.key(5), data, acc, None).predict(
        _vote_queries()), VOTE_QUERIES),
    fresh=lambda data: _nm_predictor(jax.random.key(0), data, nonce=None,
                                     budget=FRESH_QUERIES).predict(_fresh_queries()),
    audit=reg.AuditSpec(statistic=_label_statistic, trials=600, slow_trials=20_000),
    support="discrete",
    skip={"replay": _NOT_ADDITIVE_NM, "noise": _NOT_ADDITIVE_NM}))


# -- PATE end to end -----------------------------------------------------------------

PATE_PUBLIC = 4
PATE_SCALE = 8.0  # LNMax Laplace scale b: each label is (2/b)-DP (L1 sensitivity 2)


def _pate_public() -> np.ndarray:
  q = np.zeros((PATE_PUBLIC, VOTE_D), np.float32)
  q[:, 0] = 1.0
  q[1::2, 1] = 0.1
  return q / np.linalg.norm(q, axis=1, keepdims=True)


def _pate_release(key, data):
  from jaxdp.prediction import pate_label_and_train
  return pate_label_and_train(key, data["x"], data["y"], _pate_public(), num_teachers=T,
                              num_classes=VOTE_C, mechanism="lnmax", scale=PATE_SCALE,
                              delta=0.0, teacher_l2_reg=TEACHER_LAMBDA, max_iter=100)


reg.register(reg.ReleasePoint(
    name="jaxdp.prediction.pate_label_and_train",
    family=FAMILY, neighbouring=RELATION, unit=UNIT,
    guarantee="eps-DP, replace-one, for the labels and the student (post-processing): M LNMax "
              "labels, each (2/b)-DP (Laplace mechanism on votes of L1 sensitivity 2; survey 004 "
              "Eq. 39), basic composition",
    epsilon=PATE_PUBLIC * 2.0 / PATE_SCALE, delta=0.0, pairs=_vote_pairs,
    release=_pate_release, vector=lambda out: _flat(out.labels),
    event=lambda: _jp().noisy_max_event(
        "lnmax", PATE_SCALE),
    charged=None, fresh=None, audit=None, support="discrete",
    public_outputs=("event", "epsilon", "delta"),
    skip={"replay": _NOT_ADDITIVE_NM, "noise": _NOT_ADDITIVE_NM,
          "charge": "spends on no accountant: it returns the composed event of its M labels "
                    "(result.event) and their epsilon, checked in tests/prediction/test_pate.py",
          "audit": "each call fits T teachers and a student with L-BFGS (host loop); the "
                   "labelling mechanism itself is audited by the noisy_max_labels entry"}))


# -- functions on caller-given votes ---------------------------------------------------

FN_ROWS = 4


def _votes_pairs():
  from jaxdp.prediction import adversarial_votes
  d, d_prime = adversarial_votes(T, 3)
  return [(np.tile(d, (FN_ROWS, 1)).astype(np.int32),
           np.tile(d_prime, (FN_ROWS, 1)).astype(np.int32))]


FN_BETA = 0.25  # each row (2 beta)-DP


def _extreme_votes_pairs():
  """Vote histograms extreme for the arithmetic (tests/privacy/extreme_records.py).

  One vote moved in each pair, the extreme histogram second: every vote on one
  class; the largest int32 count; float counts at float32's overflow threshold
  (the functions accept float histograms).
  """
  import extreme_records as er  # pylint: disable=import-outside-toplevel
  top = np.iinfo(np.int32).max

  def rows(counts, dtype):
    return np.tile(np.asarray(counts, dtype), (FN_ROWS, 1))
  return [(rows([T - 1, 1, 0], np.int32), rows([T, 0, 0], np.int32)),
          (rows([top - 1, 1, 0], np.int32), rows([top, 0, 0], np.int32)),
          (rows([er.F32_MAX, 1, 0], np.float32), rows([er.F32_MAX, 0, 1], np.float32))]


def _first_is_zero(out) -> float:
  """1 if the first label is class 0 (the class the moved vote leaves on D'); host numpy."""
  return float(np.asarray(out).reshape(-1)[0] == 0)


reg.register(reg.ReleasePoint(
    name="jaxdp.prediction.aggregate_exponential",
    family=FAMILY, neighbouring=RELATION, unit=UNIT,
    guarantee="(2 beta)-DP per row for vote histograms that differ by one moved vote "
              "(exponential mechanism, McSherry & Talwar 2007; Dwork & Roth Thm 3.10), basic "
              "composition over the rows",
    epsilon=FN_ROWS * 2 * FN_BETA, delta=0.0, pairs=_votes_pairs,
    extreme_pairs=_extreme_votes_pairs,
    release=lambda key, votes: _jp().aggregate_exponential(
        key, votes, FN_BETA),
    vector=_flat,
    event=lambda: _jp().exponential_aggregation_event(
        FN_BETA),
    charged=None, fresh=None, support="discrete",
    audit=reg.AuditSpec(statistic=_first_is_zero, trials=2_000, slow_trials=100_000),
    skip={"replay": _NOT_ADDITIVE_EM, "noise": _NOT_ADDITIVE_EM,
          "charge": "a mechanism on caller-given votes spends nothing; the predictors that "
                    "call it pay per answer (SubsampleAggregatePredictor.predict entry)"}))


def _from_keys_em(key, votes):
  from jaxdp.prediction import subsample_aggregate
  return subsample_aggregate.aggregate_exponential_from_keys(
      jax.random.split(key, FN_ROWS), votes, FN_BETA)


reg.register(reg.ReleasePoint(
    name="jaxdp.prediction.subsample_aggregate.aggregate_exponential_from_keys",
    family=FAMILY, neighbouring=RELATION, unit=UNIT,
    guarantee="(2 beta)-DP per row (one key per row), exponential mechanism on votes "
              "(McSherry & Talwar 2007), basic composition over the rows",
    epsilon=FN_ROWS * 2 * FN_BETA, delta=0.0, pairs=_votes_pairs,
    extreme_pairs=_extreme_votes_pairs, release=_from_keys_em,
    vector=_flat,
    event=lambda: _jp().exponential_aggregation_event(
        FN_BETA),
    charged=None, fresh=None, support="discrete",
    audit=reg.AuditSpec(statistic=_first_is_zero, trials=2_000, slow_trials=100_000),
    skip={"replay": _NOT_ADDITIVE_EM, "noise": _NOT_ADDITIVE_EM,
          "charge": "a mechanism on caller-given votes spends nothing; the predictors that "
                    "call it pay per answer (SubsampleAggregatePredictor.predict entry)"}))


LN_SCALE = 4.0  # LNMax: each label (2/b)-DP (vote-swap L1 sensitivity 2)

reg.register(reg.ReleasePoint(
    name="jaxdp.prediction.noisy_max_labels",
    family=FAMILY, neighbouring=RELATION, unit=UNIT,
    guarantee="(2/b)-DP per label (report noisy max with Laplace(b) on counts of L1 "
              "sensitivity 2; survey 004 Eq. 39; Dwork & Roth Claim 3.9), basic composition",
    epsilon=FN_ROWS * 2.0 / LN_SCALE, delta=0.0, pairs=_votes_pairs,
    extreme_pairs=_extreme_votes_pairs,
    release=lambda key, votes: _jp().noisy_max_labels(
        key, votes, "lnmax", LN_SCALE),
    vector=_flat,
    event=lambda: _jp().noisy_max_event(
        "lnmax", LN_SCALE),
    charged=None, fresh=None, support="discrete",
    audit=reg.AuditSpec(statistic=_first_is_zero, trials=2_000, slow_trials=100_000),
    skip={"replay": _NOT_ADDITIVE_NM, "noise": _NOT_ADDITIVE_NM,
          "charge": "a mechanism on caller-given votes spends nothing; NoisyMaxPredictor.predict "
                    "and pate_label_and_train account for its labels"}))


GN_SCALE = 3.0


def _from_keys_gn(key, votes):
  from jaxdp.prediction import pate
  return pate.noisy_max_labels_from_keys(jax.random.split(key, FN_ROWS), votes, "gnmax",
                                         GN_SCALE)


reg.register(reg.ReleasePoint(
    name="jaxdp.prediction.pate.noisy_max_labels_from_keys",
    family=FAMILY, neighbouring=RELATION, unit=UNIT,
    guarantee="GNMax: Gaussian mechanism of L2 sensitivity sqrt(2) per label (PATE 2018 "
              "Prop. 8); rows composed exactly (Dong, Roth & Su 2019 Cor. 3.3; Balle & Wang "
              "2018 Thm 8)",
    epsilon=gaussian_epsilon(math.sqrt(2.0 * FN_ROWS) / GN_SCALE, DELTA), delta=DELTA,
    pairs=_votes_pairs, extreme_pairs=_extreme_votes_pairs, release=_from_keys_gn,
    vector=_flat,
    event=lambda: _jp().noisy_max_event(
        "gnmax", GN_SCALE),
    charged=None, fresh=None, support="discrete",
    audit=reg.AuditSpec(statistic=_first_is_zero, trials=2_000, slow_trials=100_000),
    skip={"replay": _NOT_ADDITIVE_NM, "noise": _NOT_ADDITIVE_NM,
          "charge": "a mechanism on caller-given votes spends nothing; NoisyMaxPredictor.predict "
                    "accounts for its labels"}))


# -- functions on caller-given logits ---------------------------------------------------

LOGIT_DELTA = 1.0  # the caller's logit sensitivity in the test configuration
LOGIT_SIGMA = 2.0
LOGIT_ROWS, LOGIT_C = 2, 3


def _logit_pairs(rows: int = LOGIT_ROWS):
  rng = np.random.default_rng(3)
  base = rng.normal(size=(rows, LOGIT_C)).astype(np.float32)
  shifted = base.copy()
  shifted[:, 0] += LOGIT_DELTA  # every row moves by Delta (the worst case)
  half = base.copy()
  half[:, 1] -= LOGIT_DELTA / 2
  return [(base, shifted), (base, half)]


def _logit_direction(out) -> float:
  v = _flat(out)
  return float(v.reshape(-1, LOGIT_C)[:, 0].sum())


reg.register(reg.ReleasePoint(
    name="jaxdp.prediction.noisy_logits",
    family=FAMILY, neighbouring=RELATION, unit=UNIT,
    guarantee="Gaussian mechanism on logits of L2 sensitivity Delta per row (paper 000 Alg. 7), "
              "rows composed exactly (Dong, Roth & Su 2019 Cor. 3.3; Balle & Wang 2018 Thm 8)",
    epsilon=gaussian_epsilon(LOGIT_DELTA * math.sqrt(LOGIT_ROWS) / LOGIT_SIGMA, DELTA),
    delta=DELTA, pairs=_logit_pairs,
    release=lambda key, logits: _jp().noisy_logits(
        key, logits, "gaussian", LOGIT_SIGMA),
    vector=_flat,
    event=lambda: _acc().GaussianDpEvent(
        LOGIT_SIGMA / LOGIT_DELTA, neighbouring=RELATION),
    charged=None, fresh=None,
    sensitivity=LOGIT_DELTA * math.sqrt(LOGIT_ROWS), norm="l2",
    noise=reg.NoiseSpec("gaussian", LOGIT_SIGMA, lambda logits: _flat(logits),
                        "Gaussian mechanism, std sigma per logit (paper 000 Alg. 7)"),
    audit=reg.AuditSpec(statistic=_logit_direction, trials=2_000, slow_trials=100_000),
    skip={"charge": "a mechanism on caller-given logits spends nothing; "
                    "PredictionSensitivityPredictor.predict pays per query"}))


L2_BETA = 1.5  # density prop. to exp(-beta ||z||): (beta Delta)-DP per row (paper 000 Alg. 6)


def _from_keys_l2(key, logits):
  from jaxdp.prediction import prediction_sensitivity
  return prediction_sensitivity.noisy_logits_from_keys(
      jax.random.split(key, np.shape(logits)[0]), logits, "l2_laplace", L2_BETA)


reg.register(reg.ReleasePoint(
    name="jaxdp.prediction.prediction_sensitivity.noisy_logits_from_keys",
    family=FAMILY, neighbouring=RELATION, unit=UNIT,
    guarantee="(beta Delta)-DP: L2-Laplace noise (density prop. to exp(-beta ||b||)) on logits "
              "of L2 sensitivity Delta (paper 000 Alg. 6, Thm 5)",
    epsilon=L2_BETA * LOGIT_DELTA, delta=0.0, pairs=lambda: _logit_pairs(1),
    release=_from_keys_l2, vector=_flat,
    event=lambda: _acc().PureDpEvent(
        L2_BETA * LOGIT_DELTA, neighbouring=RELATION),
    charged=None, fresh=None, sensitivity=LOGIT_DELTA, norm="l2",
    noise=reg.NoiseSpec("l2_laplace", 1.0 / L2_BETA, lambda logits: _flat(logits),
                        "L2-Laplace, density prop. to exp(-beta ||b||_2), scale 1/beta "
                        "(paper 000 Alg. 6)"),
    audit=reg.AuditSpec(statistic=_logit_direction, trials=2_000, slow_trials=100_000),
    skip={"charge": "a mechanism on caller-given logits spends nothing; "
                    "PredictionSensitivityPredictor.predict pays per query"}))


# -- declared: prediction callables that release nothing themselves ---------------------

_PREDICT = "releases nothing until predict (registered per predictor class)"
_SPENT = ("epsilon of the answered queries: the accountant of public query events times the "
          "answered count; no data")
for _name, _reason in {
    "jaxdp.prediction.PrivatePredictor":
        "abstract base of the predictors (its _answer is not implemented); " + _PREDICT,
    "jaxdp.prediction.PrivatePredictor.predict":
        "the base class's predict cannot answer (abstract _answer); the concrete predict of "
        "every predictor class is registered (PredictionSensitivityPredictor.predict, "
        "SubsampleAggregatePredictor.predict, NoisyMaxPredictor.predict)",
    "jaxdp.prediction.PrivatePredictor.spent_epsilon": _SPENT,
    "jaxdp.prediction.PredictionSensitivityPredictor":
        "stores a model server-side and calibrates from public parameters; " + _PREDICT,
    "jaxdp.prediction.PredictionSensitivityPredictor.from_weights":
        "constructor from weights and public calibration parameters; " + _PREDICT,
    "jaxdp.prediction.PredictionSensitivityPredictor.from_linear_model":
        "constructor: certifies the weights in float64 (the exact minimiser within tol/lambda) "
        "and calibrates to the FIXED tol; it never refuses and " + _PREDICT,
    "jaxdp.prediction.PredictionSensitivityPredictor.spent_epsilon": _SPENT,
    "jaxdp.prediction.SubsampleAggregatePredictor":
        "stores the teachers server-side, beta from public (eps, delta, B); " + _PREDICT,
    "jaxdp.prediction.SubsampleAggregatePredictor.spent_epsilon": _SPENT,
    "jaxdp.prediction.NoisyMaxPredictor":
        "stores the teachers server-side, noise scale from public (eps, delta, B); " + _PREDICT,
    "jaxdp.prediction.NoisyMaxPredictor.spent_epsilon": _SPENT,
    "jaxdp.prediction.PredictionSensitivityCalibration":
        "the noise calibration record (public numbers) of calibrate_prediction_sensitivity",
    "jaxdp.prediction.PredictionSensitivityCalibration.query_event":
        "the DpEvent of one query from the public calibration; spends nothing",
    "jaxdp.prediction.calibrate_prediction_sensitivity":
        "calibration from public (eps, delta, B, N, lambda, K, tol): L2-Laplace beta or Gaussian "
        "sigma (paper 000 Algs. 6 and 7); reads no data",
    "jaxdp.prediction.gaussian_prediction_sigma":
        "Gaussian sigma for B queries from public parameters (paper 000 Alg. 7)",
    "jaxdp.prediction.l2_laplace_prediction_beta":
        "L2-Laplace beta = N lambda eps / (2 K B) from public parameters (paper 000 Alg. 6)",
    "jaxdp.prediction.exponential_aggregation_beta":
        "beta = max(eps/(2B), zCDP term) from public (eps, delta, B)",
    "jaxdp.prediction.exponential_aggregation_event":
        "the DpEvent of one exponential-mechanism answer from a public beta",
    "jaxdp.prediction.noisy_max_event":
        "the DpEvent of one LNMax/GNMax label from a public scale",
    "jaxdp.prediction.noisy_max_scale":
        "noise scale for B labels from public (eps, delta, B)",
    "jaxdp.prediction.rdp_to_epsilon":
        "RDP curve to (eps, delta) conversion (Mironov 2017 Prop. 3): arithmetic",
    "jaxdp.prediction.gnmax_data_dependent_epsilon":
        "ANALYSIS ONLY, documented as not a DP guarantee and not to be released (PATE 2018 "
        "Thm 6 on given vote histograms); no noise is drawn and nothing is spent",
    "jaxdp.prediction.DataDependentEpsilon":
        "the record of gnmax_data_dependent_epsilon (is_dp_guarantee=False); see there",
    "jaxdp.prediction.PateResult":
        "the result record of pate_label_and_train (registered); its fields are checked there "
        "(the un-noised histograms are nonprivate_votes)",
}.items():
  reg.not_a_release_point(_name, _reason)

# Host loop: T teachers and a student fitted with L-BFGS per call (not vmappable).
cc.host_side("jaxdp.prediction.pate_label_and_train")
