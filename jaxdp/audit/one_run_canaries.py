"""Canaries for one-run audits of jaxdp trainers (:mod:`jaxdp.audit.one_run`).

Two kinds of canaries, both mixed into the real data with an independent
fair coin per canary (``included = bernoulli(key, 1/2, (m,))``):

* **Gradient ("Dirac") canaries**, white-box, for DP-SGD plans (Steinke,
  Nasr & Jagielski 2023, Sec. 6 "white-box" / gradient-space canaries; Nasr
  et al. 2021 "Dirac" canaries). Canary ``i`` is a data row whose
  per-example loss is ``c <u_i, theta>`` with ``u_i`` a fixed random unit
  vector in parameter space (drawn from a key, ``u_i ~ N(0, I)/||.||``), so
  its gradient is ``c u_i`` at every step; with ``c >= C`` (default
  ``c = 2 C``) clipping makes it exactly ``C u_i``: a worst-case example of
  full clip norm. The score is ``<theta_0 - theta_T, u_i>``, the projection of
  the whole parameter change on the canary's direction: with an SGD
  optimiser this is ``lr * sum_t <noisy mean gradient_t, u_i>``, which grows
  by ``lr C / (q N)`` each step the canary is sampled, against noise of std
  ``lr sigma C / (q N)`` per step (paper 000 Sec. 3.1 Eq. 4); the other
  examples' gradients are nearly orthogonal to the random ``u_i`` -- but the
  model's own motion projects on ``u_i`` with std ``|Delta theta| / sqrt(d)``,
  which can dwarf the canary signal. The default ``canary="dirac"`` avoids it:
  the canaries get ``m`` coordinates of their own (``u_i = e_i`` on an extra
  parameter block the real loss never touches; :func:`with_dirac_canaries`),
  so each canary's score is one coordinate of the noisy DP-SGD state.
* **Input canaries**, black-box: mislabelled examples (an input with a wrong
  label drawn uniformly from the other classes), scored by ``-loss`` of the
  trained model on the canary (a memorised mislabelled example has a low
  loss). For DP-SGD and for the linear estimators of :mod:`jaxdp.training`.

Neighbouring relation. DP-SGD's guarantee is add/remove with ``N`` public
(the divisor is ``q N``): an excluded canary is a *null row* whose loss is 0
(zero gradient), which under Poisson sampling and a fixed divisor is the same
mechanism as the row being absent; the plan's ``num_examples`` is ``n + m``
whatever the coins say, so ``N`` does not leak the coins. The linear
estimators are replace-one DP: an excluded input canary is replaced by the
same input with its true label (a fixed public alternative), so the two
states of each slot are replace-one neighbours, as the one-run theorems need.

:func:`audit_dpsgd_run` does everything for a DP-SGD plan (any noise:
independent, BandMF, BLT -- ``noise_strategy`` is passed to
:func:`jaxdp.dpsgd.make_private` with every other plan argument), pays the
run on the caller's accountant like any run, and returns both analyses;
:func:`audit_training_run` does the same for an estimator.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax import flatten_util

from jaxdp import _validation
from jaxdp.audit import one_run

REAL_ROW = -1
NULL_ROW = -2


def include_coins(key: jax.Array, num_canaries: int) -> np.ndarray:
  """``(m,)`` booleans: canary ``i`` is included with probability 1/2, independently."""
  _validation.check_key(key)
  m = _validation.check_positive_int(num_canaries, "num_canaries")
  return np.asarray(jax.random.bernoulli(key, 0.5, (m,)))


def canary_directions(key: jax.Array, num_canaries: int, dim: int) -> jax.Array:
  """``(m, dim)`` unit vectors ``u_i``: ``normal(fold_in(key, i), (dim,))`` normalised."""
  return jax.vmap(lambda i: _direction(key, i, dim))(jnp.arange(num_canaries))


def _direction(key: jax.Array, index: jax.Array, dim: int) -> jax.Array:
  u = jax.random.normal(jax.random.fold_in(key, index), (dim,), jnp.float32)
  return u / jnp.linalg.norm(u)


def with_gradient_canaries(per_example_loss: Callable[..., jax.Array], key: jax.Array,
                           scale: float) -> Callable[..., jax.Array]:
  """``loss(params, x, y, canary_id)``: the user's loss on real rows, ``scale <u_i, theta>`` on canary i.

  ``canary_id`` is :data:`REAL_ROW` (-1) for a real example, ``i >= 0`` for
  included canary ``i`` (its ``x``, ``y`` are placeholders), :data:`NULL_ROW`
  (-2) for an excluded canary's slot (loss 0, zero gradient). ``key`` draws
  the directions (:func:`canary_directions`).
  """
  _validation.check_key(key)
  scale = _validation.check_positive(scale, "scale")

  def loss(params, x, y, canary_id):
    real = per_example_loss(params, x, y)
    flat, _ = flatten_util.ravel_pytree(params)
    u = _direction(key, jnp.maximum(canary_id, 0), flat.size)
    canary = scale * jnp.vdot(u, flat.astype(jnp.float32))
    return jnp.where(canary_id == REAL_ROW, real,
                     jnp.where(canary_id >= 0, canary, jnp.zeros_like(canary)))

  return loss


def with_dirac_canaries(per_example_loss: Callable[..., jax.Array],
                        scale: float) -> Callable[..., jax.Array]:
  """``loss((params, canary_block), x, y, canary_id)``: Dirac canaries on their own coordinates.

  The parameters are extended by a block of ``m`` coordinates that the real
  loss does not touch; canary ``i``'s loss is ``scale * canary_block[i]``, so
  its gradient is ``scale e_i`` (clipped to ``C e_i``) and the real examples'
  gradients are zero on the block: no interference between the model's own
  motion and the canaries (the "Dirac" canaries of Nasr et al. 2023; Steinke
  et al. 2023 Sec. 6). The extended run is the same DP-SGD mechanism (same
  clipping, sampling, noise on every coordinate, accounting) on a longer
  parameter vector. ``canary_id`` as in :func:`with_gradient_canaries`.
  """
  scale = _validation.check_positive(scale, "scale")

  def loss(params, x, y, canary_id):
    model_params, block = params
    real = per_example_loss(model_params, x, y)
    canary = scale * block[jnp.maximum(canary_id, 0)]
    return jnp.where(canary_id == REAL_ROW, real,
                     jnp.where(canary_id >= 0, canary, jnp.zeros_like(canary)))

  return loss


def with_row_weights(per_example_loss: Callable[..., jax.Array]) -> Callable[..., jax.Array]:
  """``loss(params, x, y, w) = w * per_example_loss(params, x, y)``, ``w`` in {0, 1} (0: null row)."""

  def loss(params, x, y, weight):
    return weight * per_example_loss(params, x, y)

  return loss


def gradient_canary_scores(key: jax.Array, num_canaries: int, params_initial: Any,
                           params_final: Any) -> np.ndarray:
  """``<theta_0 - theta_T, u_i>`` for every canary (higher: more likely included)."""
  f0, _ = flatten_util.ravel_pytree(params_initial)
  f1, _ = flatten_util.ravel_pytree(params_final)
  u = canary_directions(key, num_canaries, f0.size)
  return np.asarray(u @ (f0 - f1).astype(jnp.float32), np.float64)


def input_canary_scores(per_example_loss: Callable[..., jax.Array], params: Any, x: Any,
                        y: Any) -> np.ndarray:
  """``-loss(params, x_i, y_i)`` for every input canary (higher: more likely included)."""
  losses = jax.jit(jax.vmap(per_example_loss, in_axes=(None, 0, 0)))(params, jnp.asarray(x),
                                                                    jnp.asarray(y))
  return -np.asarray(losses, np.float64)


def mislabelled_canaries(key: jax.Array, x: Any, y: Any, num_canaries: int,
                         num_classes: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """``(x_c, y_wrong, y_true)``: ``m`` distinct rows of ``x`` with a uniformly drawn wrong label.

  ``x``, ``y`` should be a pool the trainer does not otherwise see (e.g. held-out
  examples): the canaries are added to the training data, not taken from it.
  """
  _validation.check_key(key)
  x = _validation.check_finite_array(x, "x")
  y = np.asarray(y)
  m = _validation.check_positive_int(num_canaries, "num_canaries")
  k = _validation.check_positive_int(num_classes, "num_classes")
  if k < 2:
    raise ValueError(f"num_classes must be >= 2 for mislabelled canaries, got {k}.")
  if y.shape != (x.shape[0],):
    raise ValueError(f"y must have shape ({x.shape[0]},), got {y.shape}.")
  if m > x.shape[0]:
    raise ValueError(f"num_canaries = {m} exceeds the {x.shape[0]} rows of the canary pool x.")
  k_rows, k_labels = jax.random.split(key)
  rows = np.asarray(jax.random.choice(k_rows, x.shape[0], (m,), replace=False))
  shift = np.asarray(jax.random.randint(k_labels, (m,), 1, k))
  y_true = y[rows].astype(np.int32)
  return x[rows], ((y_true + shift) % k).astype(np.int32), y_true


class OneRunRunAudit(NamedTuple):
  """What :func:`audit_dpsgd_run` / :func:`audit_training_run` return.

  Attributes:
    steinke: :class:`~jaxdp.audit.one_run.OneRunAuditResult` of Steinke et al.
    fdp: the f-DP (Gaussian) analysis of Mahloujifar et al. (None when
      ``delta = 0``: no GDP curve has a finite epsilon at delta 0).
    epsilon_claimed: the claim audited (the run's ledger epsilon by default).
    delta: its delta.
    included: the coins (``(m,)`` booleans; secret until the audit).
    scores: the canary scores.
    params: the trained parameters (DP-SGD) or the fitted estimator.
    plan: the :class:`jaxdp.dpsgd.PrivateSGD` plan (None for an estimator).
  """

  steinke: one_run.OneRunAuditResult
  fdp: Optional[one_run.OneRunAuditResult]
  epsilon_claimed: float
  delta: float
  included: np.ndarray
  scores: np.ndarray
  params: Any
  plan: Any


def _analyses(scores, included, epsilon_claimed, delta, k_plus, k_minus, confidence):
  common = dict(epsilon_claimed=epsilon_claimed, k_plus=k_plus, k_minus=k_minus,
                confidence=confidence)
  st = one_run.one_run_audit(scores, included, delta=delta, method="steinke", **common)
  fd = (one_run.one_run_audit(scores, included, delta=delta, method="fdp", **common)
        if delta > 0 else None)
  return st, fd


def mix_gradient_canaries(x: np.ndarray, y: np.ndarray, included: np.ndarray):
  """``(x_all, y_all, canary_id)``: the real rows then one slot per canary (placeholder inputs)."""
  m = included.size
  xc = np.zeros((m,) + x.shape[1:], x.dtype)
  yc = np.zeros((m,) + y.shape[1:], y.dtype)
  ids = np.where(included, np.arange(m), NULL_ROW).astype(np.int32)
  return (np.concatenate([x, xc]), np.concatenate([y, yc]),
          np.concatenate([np.full(x.shape[0], REAL_ROW, np.int32), ids]))


def mix_input_canaries(x: np.ndarray, y: np.ndarray, x_canary: np.ndarray, y_canary: np.ndarray,
                       included: np.ndarray):
  """``(x_all, y_all, weight)``: the real rows (weight 1) then the canaries (weight = included)."""
  w = np.concatenate([np.ones(x.shape[0], np.float32), included.astype(np.float32)])
  return (np.concatenate([x, x_canary.astype(x.dtype)]),
          np.concatenate([y, y_canary.astype(y.dtype)]), w)


def audit_dpsgd_run(per_example_loss: Callable[..., jax.Array], params: Any, x: Any, y: Any, *,
                    key: jax.Array, accountant: Any, delta: float, num_canaries: int = 1000,
                    canary: str = "dirac", canary_examples: Any = None,
                    canary_scale: Optional[float] = None,
                    epsilon_claimed: Optional[float] = None, k_plus: Any = None,
                    k_minus: Any = None, confidence: float = 0.95, device_data: bool = True,
                    **plan_kwargs: Any) -> OneRunRunAudit:
  """Trains ONE DP-SGD run with ``m`` canaries mixed in and audits it (module docstring).

  The plan is ``make_private(wrapped_loss, num_examples=n + m, delta=delta,
  key=..., batch_argnums=(1, 2, 3), **plan_kwargs)`` -- pass the plan's
  arguments as usual (``l2_clip_norm``, ``expected_batch_size`` or
  ``sample_rate``, ``target_epsilon`` or ``noise_multiplier``, ``epochs`` or
  ``steps``, ``optimizer``, ``noise_strategy``, ``min_separation``, ...). The
  run is paid on ``accountant`` by its sampler like any run (the canaries are
  training data: the run's epsilon covers them). The claim audited is the
  sampler's epsilon for the steps paid (``epsilon_claimed`` overrides it, e.g.
  to audit a plan against the epsilon of another noise multiplier).

  Args:
    per_example_loss: ``(params, x, y) -> scalar`` loss of one example.
    params: initial parameters.
    x, y: real training data (``n`` rows).
    key: ``jax.random`` key, split into (coins, canary directions, plan).
    accountant: a ``PrivacyAccountant`` or ``PrivacyBudget`` paid by the run.
    delta: the run's delta, in (0, 1).
    num_canaries: m (the audit's power grows with m; 1000 in the paper's
      small-scale experiments).
    canary: ``"dirac"`` (white-box gradient canaries on m extra coordinates,
      :func:`with_dirac_canaries`; the default, and the tightest),
      ``"gradient"`` (white-box canaries along random directions of the
      model's own parameters, :func:`with_gradient_canaries`: the model's
      motion interferes, so the bound is weaker) or ``"input"`` (black-box;
      needs ``canary_examples = (x_c, y_c)`` with m rows, e.g. from
      :func:`mislabelled_canaries`).
    canary_scale: ``c`` of the gradient canaries' loss ``c <u_i, theta>``
      (default twice ``l2_clip_norm``, so clipping sets the norm to C; for an
      adaptive clip norm, twice its ceiling).
    epsilon_claimed, k_plus, k_minus, confidence: see
      :func:`jaxdp.audit.one_run.one_run_audit`.
    device_data: sample inside the jitted step from device-resident data
      (``sampler(accountant, data=...)``); False: host gathering.
    **plan_kwargs: the other :func:`jaxdp.dpsgd.make_private` arguments.

  Returns:
    :class:`OneRunRunAudit`.

  Raises:
    ValueError: bad arguments (before anything is paid or trained).
  """
  from jaxdp.dpsgd import make_private  # pylint: disable=import-outside-toplevel

  _validation.check_key(key)
  if accountant is None:
    raise ValueError("accountant is required: the audited run is paid like any run.")
  delta = _validation.check_delta(delta, allow_zero=False)
  m = _validation.check_positive_int(num_canaries, "num_canaries")
  if canary not in ("dirac", "gradient", "input"):
    raise ValueError(f"canary must be 'dirac', 'gradient' or 'input', got {canary!r}.")
  for reserved in ("num_examples", "key", "batch_argnums", "delta"):
    if reserved in plan_kwargs:
      raise ValueError(f"{reserved} is set by audit_dpsgd_run; do not pass it in plan_kwargs.")
  if "l2_clip_norm" not in plan_kwargs:
    raise ValueError("l2_clip_norm is required (a make_private argument).")
  x = _validation.check_finite_array(x, "x")
  y = np.asarray(y)
  if y.shape[:1] != x.shape[:1]:
    raise ValueError(f"x and y need the same number of rows, got {x.shape[0]} and {y.shape[0]}.")
  if canary == "input":
    if canary_examples is None or len(canary_examples) != 2:
      raise ValueError("canary='input' needs canary_examples=(x_c, y_c) with num_canaries rows.")
    xc = _validation.check_finite_array(canary_examples[0], "canary_examples[0]")
    yc = np.asarray(canary_examples[1])
    if xc.shape != (m,) + x.shape[1:] or yc.shape != (m,) + y.shape[1:]:
      raise ValueError(f"canary_examples must have shapes {(m,) + x.shape[1:]} and "
                       f"{(m,) + y.shape[1:]}, got {xc.shape} and {yc.shape}.")
  elif canary_examples is not None:
    raise ValueError("canary_examples is only used with canary='input'.")
  if canary_scale is None:
    clip = plan_kwargs["l2_clip_norm"]
    if hasattr(clip, "initial"):   # AdaptiveClipNorm: above every clip norm it can reach
      clip = clip.max_clip_norm if clip.max_clip_norm is not None else 1e6 * clip.initial
    canary_scale = 2.0 * float(np.max(np.asarray(clip, np.float64)))
  canary_scale = _validation.check_positive(canary_scale, "canary_scale")
  k_coins, k_dirs, k_plan = jax.random.split(key, 3)
  included = include_coins(k_coins, m)
  start = params
  if canary == "dirac":
    loss = with_dirac_canaries(per_example_loss, canary_scale)
    arrays = mix_gradient_canaries(x, y, included)
    start = (params, jnp.zeros((m,), jnp.float32))
  elif canary == "gradient":
    loss = with_gradient_canaries(per_example_loss, k_dirs, canary_scale)
    arrays = mix_gradient_canaries(x, y, included)
  else:
    loss = with_row_weights(per_example_loss)
    arrays = mix_input_canaries(x, y, xc, yc, included)
  plan = make_private(loss, num_examples=int(arrays[0].shape[0]), key=k_plan, delta=delta,
                      batch_argnums=(1, 2, 3), **plan_kwargs)
  sampler = plan.sampler(accountant, data=arrays) if device_data else plan.sampler(accountant)
  state = plan.init(start)
  trained = start
  while sampler.steps_remaining:
    batch = sampler.sample() if device_data else sampler.sample().gather(*arrays)
    trained, state, _ = plan.step(trained, state, batch)
  if epsilon_claimed is None:
    epsilon_claimed = float(sampler.epsilon())
  if canary == "dirac":
    trained, block = trained
    scores = -np.asarray(block, np.float64)   # theta_0 = 0 on the block
  elif canary == "gradient":
    scores = gradient_canary_scores(k_dirs, m, params, trained)
  else:
    scores = input_canary_scores(per_example_loss, trained, xc, yc)
  st, fd = _analyses(scores, included, epsilon_claimed, delta, k_plus, k_minus, confidence)
  return OneRunRunAudit(st, fd, float(epsilon_claimed), delta, included, scores, trained, plan)


def audit_training_run(estimator: Any, x: Any, y: Any, canary_examples: Any, *, key: jax.Array,
                       epsilon_claimed: Optional[float] = None, delta: Optional[float] = None,
                       audit_delta: float = 1e-5, k_plus: Any = None, k_minus: Any = None,
                       confidence: float = 0.95) -> OneRunRunAudit:
  """One-run audit of a :mod:`jaxdp.training` estimator with mislabelled input canaries.

  ``canary_examples = (x_c, y_wrong, y_true)`` (:func:`mislabelled_canaries`):
  slot i holds ``(x_c[i], y_wrong[i])`` when canary i is included and
  ``(x_c[i], y_true[i])`` otherwise (replace-one neighbours, the estimators'
  relation). ``estimator.fit`` runs once on the real rows plus the m slots and
  pays ``estimator.accountant`` as usual. Score: ``log predict_proba`` of the
  wrong label. The claim is ``(estimator.epsilon, estimator.delta)`` unless
  given; with a pure-DP claim (``delta = 0``) the Steinke bound audits it at
  delta 0 and the f-DP analysis (which needs delta > 0) is run at
  ``audit_delta`` against the same epsilon (an (eps, 0) claim implies
  (eps, audit_delta)).

  Returns:
    :class:`OneRunRunAudit` (``params`` is the fitted estimator).
  """
  _validation.check_key(key)
  if len(canary_examples) != 3:
    raise ValueError("canary_examples must be (x_c, y_wrong, y_true), e.g. from "
                     "mislabelled_canaries.")
  xc = _validation.check_finite_array(canary_examples[0], "canary_examples[0]")
  y_wrong = np.asarray(canary_examples[1])
  y_true = np.asarray(canary_examples[2])
  m = xc.shape[0]
  if m < 1 or y_wrong.shape != (m,) or y_true.shape != (m,):
    raise ValueError("canary_examples must hold m >= 1 inputs and two (m,) label arrays.")
  x = _validation.check_finite_array(x, "x")
  y = np.asarray(y)
  if xc.shape[1:] != x.shape[1:]:
    raise ValueError(f"canary inputs must have shape (m,) + {x.shape[1:]}, got {xc.shape}.")
  if not hasattr(estimator, "predict_proba"):
    raise ValueError("the estimator must have predict_proba (a classifier).")
  claim = float(estimator.epsilon) if epsilon_claimed is None else float(epsilon_claimed)
  d = float(getattr(estimator, "delta", 0.0)) if delta is None else float(delta)
  d = _validation.check_delta(d)
  audit_delta = _validation.check_delta(audit_delta, "audit_delta", allow_zero=False)
  included = include_coins(key, m)
  labels = np.where(included, y_wrong, y_true).astype(y.dtype)
  estimator.fit(np.concatenate([x, xc.astype(x.dtype)]), np.concatenate([y, labels]))
  proba = np.asarray(estimator.predict_proba(xc), np.float64)
  col = np.searchsorted(np.asarray(estimator.classes_), y_wrong)
  scores = np.log(np.maximum(proba[np.arange(m), col], 1e-300))
  common = dict(epsilon_claimed=claim, k_plus=k_plus, k_minus=k_minus, confidence=confidence)
  st = one_run.one_run_audit(scores, included, delta=d, method="steinke", **common)
  fd = one_run.one_run_audit(scores, included, delta=d if d > 0 else audit_delta, method="fdp",
                             **common)
  return OneRunRunAudit(st, fd, claim, d, included, scores, estimator, None)


__all__ = ["NULL_ROW", "OneRunRunAudit", "REAL_ROW", "audit_dpsgd_run", "audit_training_run",
           "canary_directions", "gradient_canary_scores", "with_dirac_canaries", "include_coins", "input_canary_scores",
           "mislabelled_canaries", "mix_gradient_canaries", "mix_input_canaries",
           "with_gradient_canaries", "with_row_weights"]
