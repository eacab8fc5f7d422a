"""Ready-made worst-case neighbouring datasets and test statistics for audits.

An audit's lower bound is only as large as the pair (D, D') and the statistic
make it: the bound of :func:`jaxdp.audit.audit_epsilon` approaches the true
epsilon only when D, D' realise (nearly) the worst-case sensitivity and the
statistic is (nearly) the likelihood ratio of M(D) vs M(D'). The cases below
follow the sensitivity proofs of the methods they target, so they push each
mechanism towards the inequality its proof uses:

* :func:`scalar_query_pair`: f(D) = 0, f(D') = Delta e_1 -- the Laplace,
  Gaussian and L2-Laplace mechanisms see a difference of exactly their
  sensitivity (Dwork & Roth 2014 Thm 3.6, Balle & Wang 2018 Thm 8, paper 000
  App. B.1 Thm 1).
* :func:`exponential_mechanism_pair`: the target candidate gains Delta while
  all others lose Delta, so both the numerator and the normaliser of
  p(i|D)/p(i|D') move by e^{beta Delta} (the two factors of Dwork & Roth
  Thm 3.10's proof); with many candidates the log-ratio tends to 2 beta Delta.
* :func:`flipped_label_pair`: replace-one neighbours for linear ERM (paper 000
  Lemma 1): every example sits on the boundary of the unit L2 ball
  (``||x|| = 1``, the largest gradient Assumption 5 allows) and the replaced
  example keeps its features but flips its label, which reverses the sign of
  its loss gradient.
* :func:`teacher_vote_pair`: subsample-and-aggregate (paper 000 App. C.2,
  Algorithm 8): every teacher but one votes for class 1; the neighbour flips
  the one dissenting teacher's vote from 0 to 1 by replacing one of its
  training examples (its partition is built so that one example decides).

Statistics: :func:`projection_statistic` (the likelihood-ratio test for
Gaussian noise, and a good 1-D test for L2-Laplace noise),
:func:`l2_distance_statistic` (the exact likelihood ratio for L2-Laplace
noise: ``||o - c_0|| - ||o - c_1||``), :func:`implied_noise_statistic` (the
likelihood ratio of objective perturbation through the noise that produced
the output), :func:`indicator_statistic` (for discrete outputs).

Sharp edge: a statistic that computes *exact* floating-point cancellations
(e.g. ``|o| - |o - 1|`` in one dimension) can detect which float grid an
output lies on and exceed the claimed epsilon: that is a real leak of naive
floating-point noise (Mironov 2012, "On significance of the least significant
bits for differential privacy"), not an audit bug. Keep statistics smooth when
auditing the idealised (real-valued) mechanism.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxdp import _validation


@dataclasses.dataclass(frozen=True)
class NeighbouringPair:
  """Two neighbouring datasets (pytrees of arrays) and how they differ.

  Attributes:
    dataset: D.
    neighbour: D'.
    relation: "replace-one" or "add/remove" (or "query" for mechanism-level
      cases where D and D' are exact query answers at sensitivity distance).
    description: a sentence saying what makes the pair worst-case.
  """

  dataset: Any
  neighbour: Any
  relation: str
  description: str


def scalar_query_pair(sensitivity: float = 1.0, dim: int | None = None) -> NeighbouringPair:
  """Exact answers f(D) = 0 and f(D') = sensitivity * e_1.

  Args:
    sensitivity: the mechanism's sensitivity Delta > 0 (L1 = L2 for one
      non-zero coordinate).
    dim: None for scalar answers, otherwise the vector length (>= 1).
  """
  s = _validation.check_positive(sensitivity, "sensitivity")
  if dim is None:
    return NeighbouringPair(jnp.float32(0.0), jnp.float32(s), "query",
                            f"scalar answers 0 and {s:g} (distance = sensitivity)")
  dim = _validation.check_positive_int(dim, "dim")
  d0 = jnp.zeros((dim,), jnp.float32)
  return NeighbouringPair(d0, d0.at[0].set(s), "query",
                          f"answers 0 and {s:g} e_1 in R^{dim} (distance = sensitivity)")


def exponential_mechanism_pair(num_candidates: int, sensitivity: float = 1.0) -> NeighbouringPair:
  """Scores ``(0, Delta, ..., Delta)`` and ``(Delta, 0, ..., 0)``; audit output 0.

  Every score moves by exactly Delta. For candidate 0,
  ``p(0|D')/p(0|D) = e^{beta Delta} (1 + (C-1) e^{beta Delta}) / (e^{beta Delta} + C - 1)``,
  which tends to ``e^{2 beta Delta}`` as C grows (Dwork & Roth Thm 3.10 is tight).
  """
  c = _validation.check_positive_int(num_candidates, "num_candidates")
  if c < 2:
    raise ValueError(f"num_candidates must be >= 2, got {c}.")
  s = _validation.check_positive(sensitivity, "sensitivity")
  d0 = jnp.full((c,), s, jnp.float32).at[0].set(0.0)
  d1 = jnp.zeros((c,), jnp.float32).at[0].set(s)
  return NeighbouringPair(d0, d1, "query",
                          "candidate 0 gains the sensitivity, all others lose it")


def exponential_mechanism_log_ratio(num_candidates: int, beta_times_sensitivity: float) -> float:
  """Exact ``ln p(0|D')/p(0|D)`` for :func:`exponential_mechanism_pair` (float64)."""
  c = _validation.check_positive_int(num_candidates, "num_candidates")
  b = _validation.check_positive(beta_times_sensitivity, "beta_times_sensitivity")
  return float(b + np.log1p((c - 1) * np.exp(b)) - np.log(np.exp(b) + c - 1))


def flipped_label_pair(
    num_examples: int,
    dim: int,
    *,
    num_classes: int = 2,
    replaced_index: int = 0,
) -> NeighbouringPair:
  """Replace-one neighbours for linear ERM: one boundary example flips its label.

  D: ``x_n = e_1`` (on the unit sphere) for all n, labels cycling over the
  classes so that the non-private minimiser is nearly symmetric; D': the same
  with example ``replaced_index`` relabelled to the next class
  (``y -> (y + 1) mod C``). Its loss gradient ``(p - e_y) x^T`` changes to
  ``(p - e_{y'}) x^T``, a change of norm ``sqrt(2) ||x|| = K`` at balanced
  predictions (paper 000 Lemma 1 bounds it by 2K).

  Returns:
    :class:`NeighbouringPair` whose datasets are ``(x (N, dim) float32,
    y (N,) int32)`` tuples.
  """
  n = _validation.check_positive_int(num_examples, "num_examples")
  d = _validation.check_positive_int(dim, "dim")
  c = _validation.check_positive_int(num_classes, "num_classes")
  if c < 2:
    raise ValueError(f"num_classes must be >= 2, got {c}.")
  if not 0 <= int(replaced_index) < n:
    raise ValueError(f"replaced_index must be in [0, {n}), got {replaced_index}.")
  x = np.zeros((n, d), np.float32)
  x[:, 0] = 1.0
  y = (np.arange(n) % c).astype(np.int32)
  y2 = y.copy()
  y2[replaced_index] = (y[replaced_index] + 1) % c
  return NeighbouringPair(
      (jnp.asarray(x), jnp.asarray(y)), (jnp.asarray(x), jnp.asarray(y2)), "replace-one",
      f"N={n} examples at x=e_1 (||x||=1); example {replaced_index} flips its label")


def teacher_vote_pair(num_teachers: int, examples_per_teacher: int = 3,
                      dim: int = 2) -> NeighbouringPair:
  """Binary subsample-and-aggregate data where one replaced example flips one vote.

  The data are ``T * k`` examples (``k = examples_per_teacher``, odd) at
  ``x = e_1``, laid out so that the contiguous partition ``t*k ... (t+1)*k - 1``
  gives teacher t its block. Teachers 1..T-1 see only label 1. Teacher 0 sees
  ``(k+1)/2`` zeros and ``(k-1)/2`` ones (majority 0); the neighbour relabels
  one of its zeros to 1, so its majority -- and, for a regularised linear
  classifier, its prediction at ``e_1`` -- flips from 0 to 1. The vote
  histograms at the query ``e_1`` are then ``(1, T-1)`` and ``(0, T)``.

  Returns:
    :class:`NeighbouringPair` of ``(x (T*k, dim), y (T*k,))`` datasets.
  """
  t = _validation.check_positive_int(num_teachers, "num_teachers")
  k = _validation.check_positive_int(examples_per_teacher, "examples_per_teacher")
  d = _validation.check_positive_int(dim, "dim")
  if t < 2:
    raise ValueError(f"num_teachers must be >= 2, got {t}.")
  if k % 2 == 0:
    raise ValueError(f"examples_per_teacher must be odd (a strict majority), got {k}.")
  x = np.zeros((t * k, d), np.float32)
  x[:, 0] = 1.0
  y = np.ones((t * k,), np.int32)
  y[: (k + 1) // 2] = 0
  y2 = y.copy()
  y2[0] = 1
  return NeighbouringPair(
      (jnp.asarray(x), jnp.asarray(y)), (jnp.asarray(x), jnp.asarray(y2)), "replace-one",
      f"{t} teachers x {k} examples at e_1; one example flips teacher 0's vote 0 -> 1")


# ---------------------------------------------------------------------------
# Statistics.
# ---------------------------------------------------------------------------


def _flat(tree: Any) -> jax.Array:
  leaves = jax.tree.leaves(tree)
  return jnp.concatenate([jnp.ravel(jnp.asarray(v, jnp.float32)) for v in leaves])


def projection_statistic(direction: Any) -> Callable[[Any], jax.Array]:
  """``s(o) = <o, u> / ||u||``: projection on the direction separating M(D), M(D').

  For Gaussian noise with mean shift ``u`` this is the likelihood-ratio
  (Neyman-Pearson optimal) statistic. ``direction`` and the outputs may be
  pytrees (flattened in leaf order).
  """
  u = np.asarray(_flat(direction), np.float64)
  norm = float(np.linalg.norm(u))
  if not np.isfinite(norm) or norm == 0.0:
    raise ValueError("direction must be finite and non-zero.")
  u = jnp.asarray(u / norm, jnp.float32)
  return lambda out: jnp.vdot(_flat(out), u)


def l2_distance_statistic(center: Any, neighbour_center: Any) -> Callable[[Any], jax.Array]:
  """``s(o) = ||o - c_0||_2 - ||o - c_1||_2``: the L2-Laplace likelihood ratio.

  For ``o = c + b`` with density ``∝ exp(-beta ||b||_2)`` the log-likelihood
  ratio of ``c_1`` vs ``c_0`` is ``beta * s(o)`` (paper 000 App. B.1 proof of
  Theorem 1), so thresholding s is the optimal test.
  """
  c0 = _flat(center)
  c1 = _flat(neighbour_center)
  if c0.shape != c1.shape:
    raise ValueError(f"center and neighbour_center must have the same size, got {c0.shape} and {c1.shape}.")
  return lambda out: jnp.linalg.norm(_flat(out) - c0) - jnp.linalg.norm(_flat(out) - c1)


def implied_noise_statistic(
    objective_gradient: Callable[[Any, Any], Any],
    dataset: Any,
    neighbour: Any,
    *,
    noise: str = "l2_laplace",
) -> Callable[[Any], jax.Array]:
  """Likelihood-ratio statistic for objective (loss) perturbation.

  Objective perturbation releases ``theta = argmin G(theta; D) + <b, theta>``
  with noise ``b``; stationarity gives the noise that produced an output,
  ``b_D(theta) = -grad G(theta; D)`` (paper 000 App. B.2, proof of Theorem 3,
  Eq. 21; Chaudhuri et al. 2011 Thm 9). The density of theta is
  ``mu(b_D(theta)) |det J_D(theta)|``, so the log-likelihood ratio of D' vs D
  is ``log mu(b_D') - log mu(b_D)`` plus a Jacobian term (Eq. 20). This
  statistic is the noise term:

  * ``"l2_laplace"`` (``mu ∝ exp(-beta ||b||)``): ``||b_D|| - ||b_D'||``;
  * ``"gaussian"``: ``(||b_D||^2 - ||b_D'||^2) / 2``.

  When the Jacobians of D and D' coincide (e.g. the flipped-label pair: the
  softmax and logistic Hessians do not depend on the label) it is the exact
  likelihood ratio, i.e. the optimal test.

  Args:
    objective_gradient: ``(theta, data) -> grad_theta G(theta; data)``, the
      gradient of the noise-free objective in the units in which the noise
      enters as ``<b, theta>`` (e.g. N times a mean-normalised objective whose
      noise term is ``<b / N, theta>``).
    dataset, neighbour: D and D' (passed as ``data``).
    noise: ``"l2_laplace"`` or ``"gaussian"``.
  """
  if noise not in ("l2_laplace", "gaussian"):
    raise ValueError(f"noise must be 'l2_laplace' or 'gaussian', got {noise!r}.")

  def statistic(theta: Any) -> jax.Array:
    b0 = _flat(objective_gradient(theta, dataset))
    b1 = _flat(objective_gradient(theta, neighbour))
    if noise == "l2_laplace":
      return jnp.linalg.norm(b0) - jnp.linalg.norm(b1)
    return 0.5 * (jnp.sum(b0 * b0) - jnp.sum(b1 * b1))

  return statistic


def indicator_statistic(value: Any) -> Callable[[Any], jax.Array]:
  """``s(o) = 1[o == value]`` (float32), for discrete outputs (labels, indices)."""
  v = jnp.asarray(value)
  return lambda out: jnp.all(jnp.asarray(out) == v).astype(jnp.float32)
