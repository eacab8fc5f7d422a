"""PATE: noisy-max labelling of public data by private teachers, and a student.

References: ``../shared/papers/004_dp_machine_learning_survey.md`` Section 4.3
(Eq. 39); Papernot, Abadi, Erlingsson, Goodfellow & Talwar, "Semi-supervised
knowledge transfer for deep learning from private training data", ICLR 2017
(LNMax); Papernot, Song, Mironov, Raghunathan, Talwar & Erlingsson,
"Scalable private learning with PATE", ICLR 2018 (GNMax, Proposition 7,
Proposition 8, Theorem 6, Proposition 10).

Pipeline: teachers on disjoint parts of the private data (as in
:mod:`jaxdp.prediction.subsample_aggregate`) vote on each unlabeled public
point; the label released is ``argmax_c (n_c + Z_c)``; a student is fit on
the public points with these labels, and may then be queried without limit
(post-processing).

Data-independent privacy (a DP guarantee). One moved training example moves
one vote: the histogram has L1 sensitivity 2 and L2 sensitivity ``sqrt(2)``.

* LNMax, ``Z_c ~ Lap(b)``: the noisy histogram is a Laplace mechanism with
  ``Delta_1 = 2``, hence ``(2/b)``-DP per label (paper 004 Eq. 39 uses
  ``b = 2/eps``); ``LaplaceDpEvent(noise_multiplier = b/2)``.
* GNMax, ``Z_c ~ N(0, sigma^2)``: Gaussian mechanism with ``Delta_2 = sqrt(2)``,
  ``(lambda, lambda/sigma^2)``-RDP (PATE 2018 Prop. 8);
  ``GaussianDpEvent(noise_multiplier = sigma/sqrt(2))``.

The events of all labels are composed by the shared accountant
(:class:`jaxdp.accounting.accountant.PrivacyAccountant`).

Data-DEPENDENT RDP of GNMax (PATE 2018 Theorem 6 with Propositions 7 and 10),
:func:`gnmax_data_dependent_rdp` and :func:`gnmax_data_dependent_epsilon`.
When the teachers agree strongly, the probability ``q`` of answering
anything but the plurality is tiny and the per-answer RDP is far below
``lambda/sigma^2``. **This epsilon depends on the private votes; it is NOT a
differential-privacy guarantee of the released number** (releasing it
leaks; PATE 2018 releases it through smooth sensitivity, not implemented
here). Use it for analysis only; the guarantee of record is the
data-independent one.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from scipy import special, stats

from jaxdp import _validation
from jaxdp.accounting import events as _events
from jaxdp.mechanisms import noisy_max as _noisy_max
from jaxdp.prediction import subsample_aggregate as _sa
from jaxdp.training import linear as _linear

MECHANISMS = ("lnmax", "gnmax")
DEFAULT_ORDERS = np.concatenate([np.linspace(1.25, 10.0, 36), np.arange(11.0, 101.0), np.array(
    [128.0, 192.0, 256.0, 384.0, 512.0, 1024.0])])


# ---------------------------------------------------------------------------
# Aggregation and its data-independent accounting.
# ---------------------------------------------------------------------------


def _check_mechanism(mechanism: str) -> None:
  if mechanism not in MECHANISMS:
    raise ValueError(f"mechanism must be one of {MECHANISMS}, got {mechanism!r}.")


def noisy_max_labels(key: jax.Array, votes: Any, mechanism: str, scale: Any) -> jax.Array:
  """``argmax_c (n_c + Z_c)`` per row of ``votes (M, C)``; Laplace scale or Gaussian std ``scale``."""
  _check_mechanism(mechanism)
  if mechanism == "lnmax":
    return _noisy_max.report_noisy_max_laplace(key, votes, scale)
  return _noisy_max.report_noisy_max_gaussian(key, votes, scale)


def noisy_max_labels_from_keys(keys: jax.Array, votes: Any, mechanism: str, scale: Any) -> jax.Array:
  """As :func:`noisy_max_labels` with one caller-supplied key per row."""
  _check_mechanism(mechanism)
  fn = (_noisy_max.report_noisy_max_laplace if mechanism == "lnmax"
        else _noisy_max.report_noisy_max_gaussian)
  return jax.vmap(lambda k, v: fn(k, v, scale))(keys, jnp.asarray(votes))


def noisy_max_event(mechanism: str, scale: float) -> _events.DpEvent:
  """DpEvent of ONE label (vote-swap neighbours: ``Delta_1 = 2``, ``Delta_2 = sqrt(2)``).

  Tagged ``neighbouring="replace_one"``: replacing one training example moves at
  most one teacher's vote (disjoint partition), the relation of the library's
  prediction methods.
  """
  _check_mechanism(mechanism)
  if mechanism == "lnmax":
    return _noisy_max.report_noisy_max_laplace_event(scale, neighbouring="replace_one")
  return _noisy_max.report_noisy_max_gaussian_event(scale, neighbouring="replace_one")


def noisy_max_scale(mechanism: str, epsilon: float, delta: float, budget: int) -> float:
  """Noise scale so that ``budget`` labels are ``(eps, delta)``-DP (data-independent).

  LNMax (``delta`` may be 0): basic composition of B ``(2/b)``-DP labels,
  ``b = 2B/eps``. GNMax (``delta > 0``): B Gaussian mechanisms of sensitivity
  ``sqrt(2)`` compose exactly to one of sensitivity ``sqrt(2B)`` (Dong, Roth &
  Su 2019, GDP Cor. 3.3), so ``sigma = analytic_gaussian_sigma(eps, delta,
  sqrt(2B))`` (Balle & Wang 2018 Thm 8).
  """
  _check_mechanism(mechanism)
  eps = _validation.check_epsilon(epsilon)
  b = _validation.check_positive_int(budget, "budget")
  if mechanism == "lnmax":
    _validation.check_delta(delta)
    return _noisy_max.VOTE_SWAP_L1_SENSITIVITY * b / eps
  from jaxdp.accounting import analytic_gaussian  # pylint: disable=import-outside-toplevel
  dlt = _validation.check_delta(delta, allow_zero=False)
  return float(analytic_gaussian.analytic_gaussian_sigma(
      eps, dlt, _noisy_max.VOTE_SWAP_L2_SENSITIVITY * math.sqrt(b)))


@dataclasses.dataclass(frozen=True)
class PateResult:
  """Output of :func:`pate_label_and_train`.

  Attributes:
    labels: noisy labels of the public points, int ``(M,)``.
    nonprivate_votes: the teacher vote histograms ``(M, C)``, computed from the
      private data WITHOUT noise (not covered by the guarantee; never release
      them).
    student: the student ``LinearModel`` fit on the public points.
    event: the DpEvent of all labels (``SelfComposedDpEvent`` of M answers).
    epsilon: data-independent epsilon of the labels at ``delta`` (via the
      shared accountant), a DP guarantee.
    delta: the delta of ``epsilon``.
  """

  labels: jax.Array
  nonprivate_votes: jax.Array
  student: _linear.LinearModel
  event: _events.DpEvent
  epsilon: float
  delta: float


def pate_label_and_train(
    key: jax.Array,
    x_private: Any,
    y_private: Any,
    x_public: Any,
    *,
    num_teachers: int,
    num_classes: int,
    mechanism: str,
    scale: float,
    delta: float,
    teacher_l2_reg: float = 1e-3,
    student_l2_reg: float = 1e-3,
    max_iter: int = 500,
    accountant_method: str = "auto",
) -> PateResult:
  """End-to-end PATE with linear teachers and a linear student.

  1. Partition the private data into ``num_teachers`` disjoint parts and fit
     one softmax-regression teacher per part (one vmapped L-BFGS call).
  2. Label every public point with LNMax/GNMax of noise ``scale``.
  3. Fit the student on ``(x_public, labels)``.
  4. Account: ``M`` self-composed per-label events through
     :class:`jaxdp.accounting.accountant.PrivacyAccountant`
     (``get_epsilon(delta, method=accountant_method)``).
  """
  _validation.check_key(key)
  from jaxdp.accounting import accountant as _accountant  # pylint: disable=import-outside-toplevel
  _check_mechanism(mechanism)
  _validation.check_delta(delta)  # before any (costly) training
  _noisy_max._static_positive(scale, "scale")  # pylint: disable=protected-access
  partition_key, label_key = jax.random.split(key)
  teachers = _sa.train_linear_teachers(x_private, y_private, num_teachers=num_teachers,
                                       num_classes=num_classes, l2_reg=teacher_l2_reg,
                                       key=partition_key, max_iter=max_iter)
  x_pub = _validation.check_finite_array(x_public, "x_public")
  votes = _sa.linear_teacher_votes(teachers.weights, x_pub)
  labels = noisy_max_labels(label_key, votes, mechanism, scale)
  student = _linear.fit_linear(x_pub, np.asarray(labels), num_classes=num_classes,
                               l2_reg=student_l2_reg, max_iter=max_iter)
  event = _events.SelfComposedDpEvent(noisy_max_event(mechanism, scale), int(x_pub.shape[0]))
  acc = _accountant.PrivacyAccountant()
  acc.spend(noisy_max_event(mechanism, scale), count=int(x_pub.shape[0]))
  eps = float(acc.get_epsilon(delta, method=accountant_method))
  return PateResult(labels, votes, student, event, eps, float(delta))


# ---------------------------------------------------------------------------
# Data-dependent RDP of GNMax (PATE 2018).  NOT a DP guarantee of its output.
# ---------------------------------------------------------------------------


def _log1mexp(x: float) -> float:
  """``log(1 - exp(x))`` for ``x <= 0``, numerically stable."""
  if x > 0:
    raise ValueError(f"log1mexp needs x <= 0, got {x}.")
  if x == 0:
    return -math.inf
  return math.log(-math.expm1(x)) if x > -math.log(2.0) else math.log1p(-math.exp(x))


def gnmax_log_q(votes: Any, sigma: float) -> float:
  """Upper bound on ``log Pr[GNMax(votes) != argmax votes]`` (PATE 2018 Prop. 7).

  The union bound, with ``Z_i - Z_{i*} ~ N(0, 2 sigma^2)``::

    q <= sum_{i != i*} Pr[Z_i - Z_{i*} >= n_{i*} - n_i]
       = sum_{i != i*} (1/2) erfc((n_{i*} - n_i) / (2 sigma))

  Capped at ``log(1 - 1/C)``
  (PATE 2018 reference code; ``q > 1 - 1/C`` cannot improve on the
  data-independent bound, which is used then anyway). Float64, one histogram.
  """
  n = np.asarray(votes, dtype=np.float64)
  if n.ndim != 1 or n.size < 2:
    raise ValueError(f"votes must be one histogram of >= 2 classes, got shape {n.shape}.")
  sig = _validation.check_positive(sigma, "sigma")
  top = int(np.argmax(n))
  gaps = np.delete(n[top] - n, top)
  log_terms = stats.norm.logsf(gaps, scale=math.sqrt(2.0) * sig)
  log_q = float(special.logsumexp(log_terms))
  return min(log_q, math.log(1.0 - 1.0 / n.size))


def gnmax_data_dependent_rdp(log_q: float, sigma: float, orders: Sequence[float] | np.ndarray) -> np.ndarray:
  """Data-dependent RDP of ONE GNMax answer at the given orders (PATE 2018 Thm 6).

  Theorem 6: if M is ``(mu_1, eps_1)``- and ``(mu_2, eps_2)``-RDP and
  ``Pr[M(D) != i*] <= q`` with ``q < 1``, ``q e^{eps_2} < 1`` and
  ``q <= e^{(mu_2 - 1) eps_2} / (mu_1/(mu_1 - 1) * mu_2/(mu_2 - 1))^{mu_2}``,
  then for every order ``lambda <= mu_1`` and every neighbour ``D'``::

    D_lambda(M(D) || M(D')) <= 1/(lambda-1) log((1-q) A^{lambda-1} + q B^{lambda-1}),
    A = (1-q) / (1 - (q e^{eps_2})^{(mu_2-1)/mu_2}),  B = e^{eps_1} / q^{1/(mu_1-1)}.

  For GNMax ``eps_mu = mu/sigma^2`` (Prop. 8) and the orders ``mu_2 =
  sigma sqrt(log(1/q))``, ``mu_1 = mu_2 + 1`` (Prop. 10). The result is the
  minimum with the data-independent ``lambda/sigma^2`` (both are valid
  bounds for this D). Orders where the conditions fail keep the
  data-independent value.

  DATA-DEPENDENT: ``q`` is computed from private votes, so the bound is a
  property of this dataset, not a DP guarantee of anything derived from it.
  """
  sig = _validation.check_positive(sigma, "sigma")
  lam = np.atleast_1d(np.asarray(orders, dtype=np.float64))
  if np.any(lam <= 1):
    raise ValueError("orders must all be > 1.")
  if log_q > 0 or math.isnan(log_q):
    raise ValueError(f"log_q must be <= 0, got {log_q}.")
  variance = sig * sig
  independent = lam / variance
  if math.isinf(log_q):  # the answer is deterministic: nothing leaks
    return np.zeros_like(lam)
  mu2 = sig * math.sqrt(-log_q)
  mu1 = mu2 + 1.0
  if mu2 <= 1.0:
    return independent
  eps1, eps2 = mu1 / variance, mu2 / variance
  cond_q = log_q <= (mu2 - 1.0) * eps2 - mu2 * (math.log(mu1 / (mu1 - 1.0)) + math.log(mu2 / (mu2 - 1.0)))
  cond_a = log_q + eps2 < 0.0  # q e^{eps2} < 1 (A positive and finite)
  if not (cond_q and cond_a):
    return independent
  log_1mq = _log1mexp(log_q)
  log_a = log_1mq - _log1mexp((log_q + eps2) * (mu2 - 1.0) / mu2)
  log_b = eps1 - log_q / (mu1 - 1.0)
  dependent = np.logaddexp(log_1mq + (lam - 1.0) * log_a, log_q + (lam - 1.0) * log_b) / (lam - 1.0)
  applies = lam <= mu1
  return np.where(applies, np.minimum(independent, dependent), independent)


def rdp_to_epsilon(orders: Sequence[float] | np.ndarray, rdp: Sequence[float] | np.ndarray,
                   delta: float) -> tuple[float, float]:
  """``eps = min_lambda rdp(lambda) + log(1/delta)/(lambda - 1)`` (Mironov 2017, Prop. 3).

  Returns ``(epsilon, optimal_order)``.
  """
  dlt = _validation.check_delta(delta, allow_zero=False)
  lam = np.asarray(orders, dtype=np.float64)
  values = np.asarray(rdp, dtype=np.float64) + math.log(1.0 / dlt) / (lam - 1.0)
  i = int(np.argmin(values))
  return float(values[i]), float(lam[i])


@dataclasses.dataclass(frozen=True)
class DataDependentEpsilon:
  """Result of :func:`gnmax_data_dependent_epsilon` (NOT a DP guarantee).

  Attributes:
    epsilon: data-dependent epsilon of all answers at ``delta``.
    order: the Renyi order that attains it.
    data_independent_epsilon: the DP guarantee (same orders, RDP of
      ``M lambda/sigma^2``), for comparison.
    delta: the delta used.
    is_dp_guarantee: always False; a reminder that ``epsilon`` depends on the
      private votes.
  """

  epsilon: float
  order: float
  data_independent_epsilon: float
  delta: float
  is_dp_guarantee: bool = False


def gnmax_data_dependent_epsilon(
    votes: Any, sigma: float, delta: float, orders: Sequence[float] | np.ndarray | None = None
) -> DataDependentEpsilon:
  """Data-dependent (eps, delta) of answering every row of ``votes (M, C)`` with GNMax.

  Sums :func:`gnmax_data_dependent_rdp` over the M answers (RDP composes
  additively) and converts with :func:`rdp_to_epsilon`. DATA-DEPENDENT and
  NOT a DP guarantee of the released epsilon (see the module docstring).
  """
  lam = DEFAULT_ORDERS if orders is None else np.asarray(orders, dtype=np.float64)
  v = np.asarray(votes)
  if v.ndim != 2:
    raise ValueError(f"votes must have shape (M, C), got {v.shape}.")
  total = np.zeros_like(lam)
  for row in v:
    total = total + gnmax_data_dependent_rdp(gnmax_log_q(row, sigma), sigma, lam)
  eps, order = rdp_to_epsilon(lam, total, delta)
  eps_ind, _ = rdp_to_epsilon(lam, v.shape[0] * lam / float(sigma) ** 2, delta)
  return DataDependentEpsilon(eps, order, eps_ind, float(delta))


__all__ = [
    "DEFAULT_ORDERS", "DataDependentEpsilon", "MECHANISMS", "PateResult",
    "gnmax_data_dependent_epsilon", "gnmax_data_dependent_rdp", "gnmax_log_q",
    "noisy_max_event", "noisy_max_labels", "noisy_max_labels_from_keys", "noisy_max_scale",
    "pate_label_and_train", "rdp_to_epsilon",
]
