r"""A differentially private global classifier from M local classifiers (paper 001 Sec. 4).

Paper 001 = ``../shared/papers/001_learning_privately_from_multiparty_data.md``
(Hamm, Cao & Belkin 2016). The ensemble labels ``N`` auxiliary unlabeled
samples; a global linear classifier is trained on them by regularised ERM and
released with output perturbation.

**Privacy unit: a whole party.** Neighbouring inputs ``D ~ D'`` differ in ALL
the private samples of ONE party (App. A.1: ``D' = ((S')^(1), S^(2), ...)``),
the number of parties ``M`` fixed — a replace-one relation whose unit is the
party. Every event returned here is tagged ``neighbouring="replace_one",
unit="party"``; spend it in a ``PrivacyAccountant(unit="party")``. With
``protect_auxiliary=True`` (Sec. 4.5) the guarantee additionally covers the
replacement of one auxiliary sample at the same time (the event keeps
``unit="party"``: the neighbour relation is (one party + one auxiliary row)).

**Sensitivities** (L2, of the exact minimiser, with ``lambda``-strongly
convex objective; Chaudhuri et al. 2011 Cor. 7/8:
``||w_s - w_s'|| <= max_w ||grad g(w)|| / lambda`` with ``g = R_S - R_S'``).
One party changes only its own classifier, hence at most one vote per
auxiliary sample. Features ``||x|| <= 1``, ``|l'| <= 1`` (paper Sec. 2.2):

=============================  ============================  ==========================================
method                         binary (logistic)             multiclass (softmax)
=============================  ============================  ==========================================
majority vote (Alg. 1)         ``2/lambda`` (Thm 1, Eq. 28)  ``sqrt(2)/lambda`` (App. B.2, Eq. 53)
soft labels (Alg. 2)           ``2/(M lambda)`` (Thm 3,      ``sqrt(2)/(M lambda)`` (App. B.3, Eq. 60)
                               App. A.2 Eq. 31)
vote + one aux sample (4.5)    ``2/lambda`` (unchanged)      ``sqrt(2)(N+1)/(N lambda)`` (ours, below)
soft + one aux sample (4.5)    ``2/(M lambda) (N+M-1)/N``    ``sqrt(2)/(M lambda) (N+2M-1)/N`` (ours)
=============================  ============================  ==========================================

Derivations. Binary soft labels: per sample, ``grad_w l^alpha = x [alpha l'(t)
- (1-alpha) l'(-t)]``, so ``grad g = (1/N) sum_n (alpha_n - alpha_n') x_n
[l'(t_n) + l'(-t_n)]`` with ``|alpha - alpha'| <= 1/M`` and ``|l'(t) + l'(-t)|
<= 2``: ``||grad g|| <= 2/M`` (Eq. 30-31). (For the logistic loss
``l'(t) + l'(-t) = -1`` exactly, so the bound is conservative by 2; we keep the
paper's constant, valid for any loss with ``|l'| <= 1``.) Majority vote: the
same with ``|v - v'|`` replacing ``|alpha - alpha'|``: ``2`` (Eq. 27-28).
Multiclass: ``grad g = -(1/N) sum_n (alpha_n - alpha_n') (x) x_n`` where one
changed vote moves two entries by ``-+1/M``: ``||.|| <= sqrt(2)/M`` (Eq. 59);
majority labels: two entries by ``-+1``, ``sqrt(2)`` (Eq. 52).

Section 4.5: if also one auxiliary feature changes, ``x_j -> x_j'``, the j-th
summand of ``grad g`` is the difference of two per-sample gradients, each of
norm ``<= K`` (``K = 1`` binary, ``sqrt(2)`` softmax: ``||P - alpha||_2 <=
sqrt(2)`` for two points of the simplex), i.e. ``<= 2K``. Binary soft:
``((N-1) 2/M + 2)/N = (2/M)(N+M-1)/N`` — the paper's factor. Binary vote:
every summand is ``<= 2`` anyway, so Algorithm 1 needs no change (paper).
The paper states 4.5 for binary only; for the multiclass counterparts the
changed summand is ``2 sqrt(2) = 2M * sqrt(2)/M`` (not ``M`` times the
label-only term), giving ``(sqrt(2)/M)(N-1+2M)/N`` (soft) and
``sqrt(2)(N-1+2)/N`` (vote): the binary factor ``(N+M-1)/N`` would be too
small for multiclass, and multiclass majority voting is NOT free (unlike the
binary case the paper discusses).

**Rounded soft labels.** The minimiser is computed for the float64 labels
``fl(k/M)`` of :func:`jaxdp.multiparty.soft_labels`, whose entries move by at
most ``r = 1/M + 2^-52`` (:func:`jaxdp.multiparty.aggregation.soft_label_row_change`,
proof in :mod:`jaxdp.multiparty.aggregation`), not ``1/M``: every ``1/M`` of
the soft-label rows above is replaced by ``r`` (binary ``2r/lambda``, multiclass
``sqrt(2) r/lambda``; relative excess ``2^-52 M``, 4.4e-12 at ``M = 2e4``).
In the Sec. 4.5 bounds the changed auxiliary row keeps its ``2K``: binary
``|alpha l'(t)| + |(1 - alpha) l'(-t)| <= 1`` for any ``alpha`` in ``[0, 1]``
(rounded labels stay in ``[0, 1]``), multiclass ``||P - alpha||^2 <= sum_k
|p_k - alpha_k| <= 1 + (1 + 2^-53)`` (entries in ``[0, 1]``, a row of rounded
labels sums to at most ``1 + 2^-53``), i.e. ``sqrt(2)`` to float64 precision.
Majority votes are exact one-hot targets.

**Inexact minimisers.** The released point is certified within ``r = tol /
lambda`` of the exact minimiser (:mod:`jaxdp.multiparty._soft_erm`, as
:mod:`jaxdp.training.certified_solve`), so the noise is calibrated to
``Delta = Delta_theorem + 2 tol / lambda`` (triangle inequality, as
:mod:`jaxdp.training.output_perturbation`); nothing is ever refused.

**Noise** (:func:`party_calibration`): ``delta = 0`` — the paper's density
``p(eta) ∝ exp(-eps ||eta|| / Delta)`` (Eq. 3; Theorems 1 and 3 at
``Delta = 2/lambda``, ``2/(M lambda)``), the L2-Laplace sampler of
:mod:`jaxdp.mechanisms`, ``PureDpEvent``; ``delta > 0`` — the analytic
Gaussian (Balle & Wang 2018 Thm 8) on ``Delta``, ``GaussianDpEvent``;
``rho`` — ``sigma = Delta / sqrt(2 rho)`` (Bun & Steinke 2016 Prop. 1.6),
``ZCDpEvent``. ``epsilon = inf`` releases the certified non-private minimiser.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import numpy as np

from jaxdp import _validation
from jaxdp.accounting import events
from jaxdp.accounting.analytic_gaussian import analytic_gaussian_sigma
from jaxdp.errors import ArgumentTypeError
from jaxdp.multiparty import _soft_erm, aggregation
from jaxdp.training import certified_solve, linear, output_perturbation

UNIT = "party"
NEIGHBOURING = "replace_one"
Calibration = output_perturbation.OutputPerturbationCalibration


def _check_classes(num_classes) -> int:
  c = _validation.check_positive_int(num_classes, "num_classes")
  if c < 2:
    raise ValueError(f"num_classes must be >= 2, got {c}.")
  return c


def _check_aux(protect_auxiliary: bool, num_aux) -> int | None:
  if not protect_auxiliary:
    return None
  if num_aux is None:
    raise ValueError("num_aux (N, the number of auxiliary samples) is needed with "
                     "protect_auxiliary=True (Sec. 4.5 factor).")
  return _validation.check_positive_int(num_aux, "num_aux")


def vote_sensitivity(l2_reg: float, *, num_classes: int, num_aux: int | None = None,
                     protect_auxiliary: bool = False, solver_tol: float = 0.0) -> float:
  """Party-level L2 sensitivity of the majority-vote ERM minimiser (Thm 1 / App. B.2 / Sec. 4.5).

  ``2/lambda`` (binary, Eq. 28; unchanged with ``protect_auxiliary``),
  ``sqrt(2)/lambda`` (multiclass, Eq. 53; ``* (N+1)/N`` with
  ``protect_auxiliary``, module docstring), plus ``2 solver_tol/lambda``.
  """
  lam = _validation.check_positive(l2_reg, "l2_reg")
  c = _check_classes(num_classes)
  n = _check_aux(protect_auxiliary, num_aux)
  tol = _validation.check_nonnegative(solver_tol, "solver_tol")
  if c == 2:
    base = 2.0 / lam
  else:
    base = math.sqrt(2.0) / lam
    if n is not None:
      base *= (n + 1.0) / n
  return base + 2.0 * tol / lam


def soft_label_sensitivity(l2_reg: float, *, num_parties: int, num_classes: int,
                           num_aux: int | None = None, protect_auxiliary: bool = False,
                           solver_tol: float = 0.0) -> float:
  """Party-level L2 sensitivity of the soft-label (weighted) ERM minimiser (Thm 3 / B.3 / Sec. 4.5).

  ``2/(M lambda)`` (binary, App. A.2 Eq. 31), ``sqrt(2)/(M lambda)``
  (multiclass, Eq. 60); with ``protect_auxiliary`` times ``(N+M-1)/N``
  (binary, Sec. 4.5) or ``(N+2M-1)/N`` (multiclass, module docstring); plus
  ``2 solver_tol/lambda``. Each ``1/M`` is the rounded labels' move ``r = 1/M +
  2^-52`` (module docstring, "Rounded soft labels"): binary ``2r/lambda``,
  with ``protect_auxiliary`` ``((N-1) 2r + 2)/(N lambda)``; multiclass
  ``sqrt(2) r/lambda``, ``((N-1) sqrt(2) r + 2 sqrt(2))/(N lambda)``.
  """
  lam = _validation.check_positive(l2_reg, "l2_reg")
  m = _validation.check_positive_int(num_parties, "num_parties")
  c = _check_classes(num_classes)
  n = _check_aux(protect_auxiliary, num_aux)
  tol = _validation.check_nonnegative(solver_tol, "solver_tol")
  k = 1.0 if c == 2 else math.sqrt(2.0)  # per-sample gradient bound K
  r = aggregation.soft_label_row_change(m)  # 1/M + 2^-52: one label entry's move
  label_term = 2.0 * r if c == 2 else math.sqrt(2.0) * r  # one row, label change only
  if n is None:
    base = label_term / lam
  else:  # Sec. 4.5: N - 1 rows change their label, one row changes entirely (<= 2K)
    base = ((n - 1.0) * label_term + 2.0 * k) / (n * lam)
  return base + 2.0 * tol / lam


def party_calibration(sensitivity: float, *, epsilon: float | None = None, delta: float = 0.0,
                      rho: float | None = None) -> Calibration:
  """Noise for a party-level release of L2 sensitivity ``sensitivity`` (module docstring).

  Exactly one of ``epsilon`` (with ``delta``) or ``rho``. Events are tagged
  ``neighbouring="replace_one", unit="party"``.
  """
  if (epsilon is None) == (rho is None):
    raise ValueError("give exactly one of epsilon (with delta) or rho (zCDP).")
  sens = _validation.check_positive(sensitivity, "sensitivity")
  tags = dict(neighbouring=NEIGHBOURING, unit=UNIT)
  if rho is not None:
    rho = _validation.check_positive(rho, "rho")
    return Calibration("gaussian", sens / math.sqrt(2.0 * rho), sens,
                       events.ZCDpEvent(rho, **tags))
  eps = _validation.check_epsilon(epsilon, "epsilon", allow_inf=True)
  delta = _validation.check_delta(delta, "delta")
  if math.isinf(eps):
    return Calibration("none", 0.0, sens, events.NonPrivateDpEvent())
  if delta == 0.0:
    return Calibration("l2_laplace", eps / sens, sens, events.PureDpEvent(eps, **tags))
  sigma = float(analytic_gaussian_sigma(eps, delta, sens))
  return Calibration("gaussian", sigma, sens,
                     events.GaussianDpEvent(noise_multiplier=sigma / sens, **tags))


def check_aux_features(x_aux: Any) -> np.ndarray:
  """Auxiliary features: finite ``(N, D)`` rows in the unit L2 ball (the theorems' assumption)."""
  return linear.check_features(x_aux, "x_aux")


def _targets(votes, num_classes, method):
  if method == "soft":
    return np.asarray(aggregation.soft_labels(votes, num_classes))
  return _soft_erm.one_hot(np.asarray(aggregation.majority_labels(votes, num_classes)),
                           num_classes)


def _check_erm_inputs(votes, x_aux, num_classes, l2_reg, tol, max_iter):
  """Validates what :func:`global_minimizer` needs, before any work: ``(v, x, c, lam, tol)``."""
  c = _check_classes(num_classes)
  lam = _validation.check_positive(l2_reg, "l2_reg")
  _validation.check_positive_int(max_iter, "max_iter")
  x = check_aux_features(x_aux)
  v = aggregation.check_votes(votes, c)
  if v.shape[1] != x.shape[0]:
    raise ValueError(f"votes has {v.shape[1]} columns but x_aux has {x.shape[0]} rows.")
  dim = x.shape[1] * (1 if c == 2 else c)
  tol = certified_solve.check_tol(tol, num_examples=x.shape[0], dim=dim,
                                  loss=_soft_erm.loss_name(c))
  return v, x, c, lam, tol


def global_minimizer(votes: Any, x_aux: Any, *, num_classes: int, l2_reg: float,
                     method: str = "soft", tol: float = 1e-6, max_iter: int = 500):
  """Certified **non-private** minimiser of Eq. 19/55 (``"soft"``) or Eq. 8 (``"vote"``).

  The exact (noise-free) function of every party's votes: for experiments and
  tests only, never to be released (the private releases are
  :func:`private_soft_label_erm` and :func:`private_vote_erm`).

  Returns:
    ``(CertifiedSolution, SolverInfo)``: ``weights`` float64 ``(D,)`` or ``(D, C)``
    within ``tol/l2_reg`` of the exact minimiser.
  """
  if method not in ("soft", "vote"):
    raise ValueError(f"method must be 'soft' or 'vote', got {method!r}.")
  v, x, c, lam, tol = _check_erm_inputs(votes, x_aux, num_classes, l2_reg, tol, max_iter)
  return _soft_erm.fit_certified(x, _targets(v, c, method), num_classes=c, l2_reg=lam, tol=tol,
                                 max_iter=max_iter)


def _num_releases(key: jax.Array) -> int:
  """The number of independent releases of one call: one per key (a batch of ``k`` keys: ``k``)."""
  return int(np.shape(key)[0]) if linear.is_key_batch(key) else 1


def _spend_before_release(accountant: Any, event: Any, key: jax.Array) -> None:
  """``accountant.spend(event, count=_num_releases(key))`` when an accountant is given.

  Called after every input is validated and before anything is computed from
  the data: a :class:`~jaxdp.accounting.PrivacyBudget` that cannot afford the
  call refuses with nothing computed, spent or released.
  """
  if accountant is None:
    return
  if not callable(getattr(accountant, "spend", None)):
    raise ArgumentTypeError(
        "accountant must be None, a jaxdp.accounting.PrivacyAccountant(unit=\"party\") or a "
        "jaxdp.accounting.PrivacyBudget (an object with spend(event, count)), got "
        f"{type(accountant).__name__}.")
  accountant.spend(event, count=_num_releases(key))


def release(key: jax.Array, weights64: Any, calibration: Calibration) -> jax.Array:
  """``float32(weights + noise)``; a batch of keys gives one independent release per key.

  Reuses :func:`jaxdp.training.output_perturbation.add_noise_float64` (one
  L2-Laplace radius for the whole weight array; float64 sum, post-processing cast).
  """
  _validation.check_key(key, allow_batch=True)
  return output_perturbation.add_noise_float64(key, weights64, calibration)


def _private_erm(key, votes, x_aux, *, method, num_classes, l2_reg, epsilon, delta, rho,
                 protect_auxiliary, tol, max_iter, accountant) -> linear.PrivateLinearModel:
  # Everything is validated, then spent, before anything is computed from the votes.
  _validation.check_key(key, allow_batch=True)
  votes, x, c, lam, tol = _check_erm_inputs(votes, x_aux, num_classes, l2_reg, tol, max_iter)
  m, n = votes.shape
  if method == "soft":
    sens = soft_label_sensitivity(lam, num_parties=m, num_classes=c, num_aux=n,
                                  protect_auxiliary=protect_auxiliary, solver_tol=tol)
  else:
    sens = vote_sensitivity(lam, num_classes=c, num_aux=n,
                            protect_auxiliary=protect_auxiliary, solver_tol=tol)
  cal = party_calibration(sens, epsilon=epsilon, delta=delta, rho=rho)
  _spend_before_release(accountant, cal.event, key)
  cert, _ = global_minimizer(votes, x, num_classes=c, l2_reg=lam, method=method, tol=tol,
                             max_iter=max_iter)
  # Only the noisy weights and public calibration leave: the certified minimiser, its
  # certificate and the solver diagnostics are computed from the data without noise.
  return linear.PrivateLinearModel(weights=release(key, cert.weights, cal), event=cal.event,
                                   calibration=cal)


def private_vote_erm(key: jax.Array, votes: Any, x_aux: Any, *, num_classes: int,
                     l2_reg: float, epsilon: float | None = None, delta: float = 0.0,
                     rho: float | None = None, protect_auxiliary: bool = False,
                     tol: float = 1e-6, max_iter: int = 500,
                     accountant: Any = None) -> linear.PrivateLinearModel:
  """Algorithm 1 (DP ensemble by majority-voted ERM), party-level privacy.

  Majority-votes the ``(M, N)`` ``votes`` (Eq. 6), minimises Eq. 8 (binary
  logistic / softmax, ``lambda = l2_reg``), certifies the minimiser and adds
  noise calibrated to :func:`vote_sensitivity` (Theorem 1: ``p(eta) ∝
  exp(-lambda eps ||eta|| / 2)`` for binary at ``tol -> 0``).

  Args:
    key: a key, or a batch of keys for one release per key (spend ``count=len``).
    votes: ``(M, N)`` labels ``h_i(x_n)`` in ``[0, num_classes)`` (any local classifiers).
    x_aux: ``(N, D)`` auxiliary features with ``||x_n|| <= 1``.
    num_classes: ``C`` (2: binary, weights ``(D,)``; else weights ``(D, C)``).
    l2_reg: ``lambda > 0``.
    epsilon, delta, rho: the guarantee (:func:`party_calibration`).
    protect_auxiliary: also protect one auxiliary sample (Sec. 4.5).
    tol: certified gradient norm (adds ``2 tol/lambda`` to the sensitivity).
    max_iter: float32 L-BFGS cap (certification repairs a non-converged iterate).
    accountant: optional :class:`~jaxdp.accounting.PrivacyAccountant` or
      :class:`~jaxdp.accounting.PrivacyBudget` (``unit="party"``): charged
      ``count = number of keys`` times the event after validation and before
      any computation on the votes (a budget that cannot afford it refuses
      with nothing released). Without it, spend ``model.event`` yourself.

  Returns:
    :class:`jaxdp.training.linear.PrivateLinearModel`: the noisy ``weights``,
    the ``event`` (tagged ``unit="party"``) and the public ``calibration``
    only (the solver diagnostics and the certified minimiser are non-private:
    :func:`global_minimizer` computes them explicitly, never to be released).
  """
  return _private_erm(key, votes, x_aux, method="vote", num_classes=num_classes, l2_reg=l2_reg,
                      epsilon=epsilon, delta=delta, rho=rho,
                      protect_auxiliary=protect_auxiliary, tol=tol, max_iter=max_iter,
                      accountant=accountant)


def private_soft_label_erm(key: jax.Array, votes: Any, x_aux: Any, *, num_classes: int,
                           l2_reg: float, epsilon: float | None = None, delta: float = 0.0,
                           rho: float | None = None, protect_auxiliary: bool = False,
                           tol: float = 1e-6, max_iter: int = 500,
                           accountant: Any = None) -> linear.PrivateLinearModel:
  """Algorithm 2 (DP ensemble by weighted ERM with soft labels), party-level privacy.

  Soft labels ``alpha(x)`` = vote fractions (Eq. 12 / 54), weighted ERM
  (Eq. 19 / 55), certified minimiser, noise calibrated to
  :func:`soft_label_sensitivity` (Theorem 3: ``p(eta) ∝ exp(-M lambda eps
  ||eta|| / 2)`` for binary at ``tol -> 0``, ``M`` times less noise than
  Algorithm 1). Arguments as :func:`private_vote_erm`.
  """
  return _private_erm(key, votes, x_aux, method="soft", num_classes=num_classes, l2_reg=l2_reg,
                      epsilon=epsilon, delta=delta, rho=rho,
                      protect_auxiliary=protect_auxiliary, tol=tol, max_iter=max_iter,
                      accountant=accountant)
