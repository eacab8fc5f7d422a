"""Budget-enforcing private predictors.

A private-prediction guarantee (paper 000, Section 2, Eq. 1) holds for an
*inference budget* of B queries: after B answers the calibration no longer
covers further answers. A :class:`PrivatePredictor` therefore holds the
remaining budget of its training set and enforces it:

* ``predict(x)`` answers the M rows of ``x`` only if the total number of
  answered queries stays ``<= B``; otherwise it raises
  :class:`jaxdp.errors.BudgetExceededError` and answers *nothing* (a batch
  that would cross the budget is refused whole, not partly answered).
* If a shared :class:`jaxdp.accounting.PrivacyBudget` is given, each batch is
  also spent there (``count = M`` per-query events) before it is answered, and
  refused whole if that budget would be overspent. That budget's ledger is
  saved by its owner (``PrivacyBudget.save``), not by the predictor; its
  accountant runs on every ``predict`` call (a PLD composition can take
  seconds), so for high-rate serving prefer large batches or a budget with
  ``method="rdp"``.
* Spending is committed before any answer is released: with ``state_path``
  the new count is written to disk (atomically) first, and a predictor built
  on an existing ``state_path`` resumes from it, so a restart cannot reset the
  budget. ``state_dict``/``load_state_dict`` do the same by hand;
  ``load_state_dict`` refuses a state with fewer answered queries than the
  predictor has already answered, and a state of another model/calibration
  (checked by a fingerprint).
* Every query gets fresh noise: query number i (counted over the predictor's
  whole life, across restarts) uses ``jax.random.fold_in(key, i)``, so no noise
  is ever reused. The ``key`` is secret: whoever knows it can subtract the
  noise. It is not stored in the state.

Predictors:

* :class:`PredictionSensitivityPredictor` — noisy logits of a linear model
  (paper 000 Algorithms 6 and 7; :mod:`jaxdp.prediction.prediction_sensitivity`).
* :class:`SubsampleAggregatePredictor` — exponential mechanism over teacher
  votes (paper 000 Algorithm 8, corrected calibration;
  :mod:`jaxdp.prediction.subsample_aggregate`).
* :class:`NoisyMaxPredictor` — LNMax/GNMax over teacher votes (PATE;
  :mod:`jaxdp.prediction.pate`).
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxdp import _validation
from jaxdp.accounting import accountant as _accountant
from jaxdp.accounting import events as _events
from jaxdp.errors import BudgetExceededError
from jaxdp.prediction import pate as _pate
from jaxdp.prediction import prediction_sensitivity as _ps
from jaxdp.prediction import subsample_aggregate as _sa

_STATE_FORMAT = "jaxdp.PrivatePredictor/1"
_JIT_CACHE: dict = {}


def _f32_at_least(value: float) -> jax.Array:
  """float32 of a noise *scale*, rounded up (never less noise than calibrated)."""
  out = np.float32(value)
  if float(out) < value:
    out = np.nextafter(out, np.float32(np.inf))
  return jnp.float32(out)


def _f32_at_most(value: float) -> jax.Array:
  """float32 of an inverse scale (beta), rounded down (never less noise)."""
  out = np.float32(value)
  if float(out) > value:
    out = np.nextafter(out, np.float32(0.0))
  return jnp.float32(out)


def _fingerprint(params: Any, calibration: dict) -> str:
  """SHA-256 of the model parameters and the calibration (to match saved states)."""
  h = hashlib.sha256()
  h.update(json.dumps(calibration, sort_keys=True).encode())
  for leaf in jax.tree_util.tree_leaves(params):
    arr = np.ascontiguousarray(np.asarray(leaf))
    h.update(str(arr.dtype).encode())
    h.update(str(arr.shape).encode())
    h.update(arr.tobytes())
  return h.hexdigest()


class PrivatePredictor:
  """Base class: answers at most ``budget`` queries in total, then refuses.

  Subclasses implement ``_check_queries(x)`` (host validation, returns numpy),
  ``_static_config()`` (hashable) and the pure, jittable
  ``_answer(config, params, keys, x)`` (a staticmethod; one key per row). The
  jitted answer function is shared by all predictors of one class and config,
  so building a new predictor does not recompile.

  Attributes:
    budget: the inference budget B (total number of queries covered).
    epsilon, delta: the guarantee of all B answers together.
    query_event: the DpEvent of one answered query.
  """

  def __init__(
      self,
      *,
      budget: int,
      epsilon: float,
      delta: float,
      query_event: _events.DpEvent,
      key: jax.Array,
      fingerprint: str,
      params: Any,
      privacy_budget: _accountant.PrivacyBudget | None = None,
      state_path: str | os.PathLike | None = None,
  ):
    self.budget = _validation.check_positive_int(budget, "budget")
    if self.budget >= 2**32:  # query indices are folded into the key as uint32
      raise ValueError(f"budget must be in [1, 2**32 - 1], got {self.budget}.")
    self.epsilon = float(epsilon)
    self.delta = float(delta)
    self.query_event = query_event
    self._key = key
    self._fingerprint = fingerprint
    self._params = params
    self._privacy_budget = privacy_budget
    self._state_path = None if state_path is None else os.fspath(state_path)
    self._answered = 0
    self._lock = threading.Lock()
    if self._state_path is not None and os.path.exists(self._state_path):
      with open(self._state_path, encoding="utf-8") as f:
        self.load_state_dict(json.load(f))

  # -- to implement ------------------------------------------------------------
  def _check_queries(self, x: Any) -> np.ndarray:
    arr = _validation.check_finite_array(x, "x")
    if arr.ndim != 2:
      raise ValueError(f"x must have shape (num_queries, num_features), got {arr.shape}.")
    return arr

  def _static_config(self) -> tuple:
    return ()

  @staticmethod
  def _answer(config: tuple, params: Any, keys: jax.Array, x: jax.Array) -> jax.Array:
    raise NotImplementedError

  # -- budget ------------------------------------------------------------------
  @property
  def queries_answered(self) -> int:
    return self._answered

  @property
  def remaining_queries(self) -> int:
    return self.budget - self._answered

  def accountant(self) -> _accountant.PrivacyAccountant:
    """A fresh ledger with the answered queries (``query_event`` x answered)."""
    acc = _accountant.PrivacyAccountant()
    if self._answered:
      acc.spend(self.query_event, self._answered)
    return acc

  def spent_epsilon(self, delta: float | None = None, method: str = "auto") -> float:
    """Epsilon of the answers released so far (shared accountant, float64)."""
    return self.accountant().get_epsilon(self.delta if delta is None else delta, method)

  def _run(self, start: int, x: np.ndarray) -> jax.Array:
    cache_key = (type(self), self._static_config())
    fn = _JIT_CACHE.get(cache_key)
    if fn is None:
      answer, config = type(self)._answer, cache_key[1]

      def answer_from(params, key, first, queries):
        # Query number i (over the predictor's life) uses fold_in(key, i).
        idx = first + jnp.arange(queries.shape[0], dtype=jnp.uint32)
        keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(idx)
        return answer(config, params, keys, queries)

      fn = _JIT_CACHE.setdefault(cache_key, jax.jit(answer_from))
    return fn(self._params, self._key, jnp.uint32(start), jnp.asarray(x))

  def predict(self, x: Any) -> jax.Array:
    """Answers every row of ``x`` privately, or refuses the whole batch.

    Raises:
      BudgetExceededError: if ``queries_answered + len(x) > budget`` or the
        shared ``privacy_budget`` would be overspent; nothing is answered or
        spent then.
      ValueError: malformed queries (checked before anything is spent).
    """
    x_np = self._check_queries(x)
    m = int(x_np.shape[0])
    with self._lock:
      if self._answered + m > self.budget:
        raise BudgetExceededError(
            f"a batch of {m} queries would exceed the inference budget: {self._answered} of "
            f"{self.budget} queries already answered ({self.remaining_queries} left); nothing "
            "was answered.")
      if m == 0:
        return self._run(self._answered, x_np)
      if self._privacy_budget is not None:
        self._privacy_budget.spend(self.query_event, m)  # raises, spending nothing
      start = self._answered
      self._answered += m
      if self._state_path is not None:
        self.save(self._state_path)  # commit before release
    return self._run(start, x_np)

  # -- persistence -------------------------------------------------------------
  def state_dict(self) -> dict:
    """JSON-compatible state: budget, answered count, event, model fingerprint (no key)."""
    return {
        "format": _STATE_FORMAT,
        "kind": type(self).__name__,
        "budget": self.budget,
        "epsilon": self.epsilon,
        "delta": self.delta,
        "queries_answered": self._answered,
        "query_event": _events.event_to_dict(self.query_event),
        "fingerprint": self._fingerprint,
    }

  def load_state_dict(self, state: dict) -> None:
    """Restores the answered count from ``state``.

    Raises:
      ValueError: if the state belongs to another predictor kind, model,
        calibration or budget, or would lower the answered count (a reset).
    """
    if state.get("format") != _STATE_FORMAT:
      raise ValueError(f"state format must be {_STATE_FORMAT!r}, got {state.get('format')!r}.")
    mine = self.state_dict()
    for field in ("kind", "budget", "epsilon", "delta", "query_event", "fingerprint"):
      if state.get(field) != mine[field]:
        raise ValueError(
            f"state does not belong to this predictor: {field} is {state.get(field)!r}, expected "
            f"{mine[field]!r}.")
    answered = int(state["queries_answered"])
    if not 0 <= answered <= self.budget:
      raise ValueError(f"state queries_answered must be in [0, {self.budget}], got {answered}.")
    with self._lock:
      if answered < self._answered:
        raise ValueError(
            f"state has {answered} answered queries but this predictor has already answered "
            f"{self._answered}; loading it would reset the budget.")
      self._answered = answered

  def save(self, path: str | os.PathLike) -> None:
    """Writes :meth:`state_dict` as JSON, atomically (temp file + ``os.replace``)."""
    path = os.fspath(path)
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
      json.dump(self.state_dict(), f)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)

  def load(self, path: str | os.PathLike) -> None:
    """Loads a state written by :meth:`save` (see :meth:`load_state_dict`)."""
    with open(path, encoding="utf-8") as f:
      self.load_state_dict(json.load(f))

  def __repr__(self) -> str:
    return (f"{type(self).__name__}(budget={self.budget}, answered={self._answered}, "
            f"epsilon={self.epsilon}, delta={self.delta})")


class PredictionSensitivityPredictor(PrivatePredictor):
  """Noisy logits ``theta^T x + b`` of a linear model (paper 000 Algorithms 6/7).

  Queries must lie in the unit L2 ball (the sensitivity ``2K/(N lambda)``
  assumes it, paper 000 Eq. 42); others are refused with ``ValueError``.
  ``weights`` must be the (converged) minimiser of the L2-regularised ERM
  objective on N examples with regularisation ``l2_reg``.
  """

  def __init__(
      self,
      weights: Any,
      calibration: _ps.PredictionSensitivityCalibration,
      *,
      key: jax.Array,
      privacy_budget: _accountant.PrivacyBudget | None = None,
      state_path: str | os.PathLike | None = None,
  ):
    # NaN/inf weights would make the answer deterministic (NaN) whatever the noise.
    self.weights = jnp.asarray(_validation.check_finite_array(weights, "weights"))
    if self.weights.ndim != 2:
      raise ValueError(f"weights must have shape (D, C), got {self.weights.shape}.")
    self.calibration = calibration
    cal = {"noise": calibration.noise, "scale": calibration.scale,
           "sensitivity": calibration.sensitivity, "method": calibration.method}
    super().__init__(budget=calibration.budget, epsilon=calibration.epsilon,
                     delta=calibration.delta, query_event=calibration.query_event(), key=key,
                     fingerprint=_fingerprint(self.weights, cal),
                     params=(self.weights, _f32_at_most(calibration.scale)
                             if calibration.noise == "l2_laplace"
                             else _f32_at_least(calibration.scale)),
                     privacy_budget=privacy_budget,
                     state_path=state_path)

  @classmethod
  def from_weights(
      cls,
      weights: Any,
      *,
      num_examples: int,
      l2_reg: float,
      epsilon: float,
      delta: float,
      budget: int,
      key: jax.Array,
      lipschitz: float = _ps.SOFTMAX_LIPSCHITZ,
      method: str = "best",
      solver_tol: float = 0.0,
      privacy_budget: _accountant.PrivacyBudget | None = None,
      state_path: str | os.PathLike | None = None,
  ) -> "PredictionSensitivityPredictor":
    """Calibrates with :func:`~jaxdp.prediction.prediction_sensitivity.calibrate_prediction_sensitivity`.

    ``solver_tol`` must be the gradient-norm tolerance the weights were fitted
    to (0 only for exact minimisers); prefer :meth:`from_linear_model`.
    """
    cal = _ps.calibrate_prediction_sensitivity(epsilon, delta, budget, num_examples, l2_reg,
                                               lipschitz, method, solver_tol)
    return cls(weights, cal, key=key, privacy_budget=privacy_budget, state_path=state_path)

  @classmethod
  def from_linear_model(
      cls,
      model: Any,
      *,
      num_examples: int,
      l2_reg: float,
      epsilon: float,
      delta: float,
      budget: int,
      key: jax.Array,
      method: str = "best",
      privacy_budget: _accountant.PrivacyBudget | None = None,
      state_path: str | os.PathLike | None = None,
  ) -> "PredictionSensitivityPredictor":
    """From a :func:`jaxdp.training.fit_linear` softmax result (``weights``, ``info``).

    Refuses a fit that did not converge and calibrates to the sensitivity of
    approximate minimisers, using twice the achieved gradient norm as ``solver_tol``
    (paper 000 Lemma 1 plus ``2 ||grad J||/lambda``, by strong convexity).
    """
    info = model.info
    if not bool(np.all(np.asarray(info.converged))):
      raise ValueError("the linear model did not converge; its weights are not the regularised "
                       "minimiser the sensitivity bound needs. Refit with more iterations.")
    # Twice the reported float32 gradient norm covers its rounding error (it is
    # summed over N examples in float32); the term is tiny next to 2K/(N lambda).
    grad_norm = 2.0 * float(np.max(np.asarray(info.grad_norm, np.float64)))
    return cls.from_weights(model.weights, num_examples=num_examples, l2_reg=l2_reg,
                            epsilon=epsilon, delta=delta, budget=budget, key=key, method=method,
                            solver_tol=grad_norm, privacy_budget=privacy_budget,
                            state_path=state_path)

  def _check_queries(self, x: Any) -> np.ndarray:
    arr = super()._check_queries(x)
    if arr.shape[1] != self.weights.shape[0]:
      raise ValueError(f"x must have {self.weights.shape[0]} features, got {arr.shape[1]}.")
    if arr.shape[0]:
      arr = _validation.check_unit_ball(arr, "x")
    return arr

  def _static_config(self) -> tuple:
    return (self.calibration.noise,)

  @staticmethod
  def _answer(config: tuple, params: Any, keys: jax.Array, x: jax.Array) -> jax.Array:
    weights, scale = params
    logits = x.astype(weights.dtype) @ weights
    return _ps.noisy_logits_from_keys(keys, logits, config[0], scale)

  def predict_labels(self, x: Any) -> jax.Array:
    """``argmax`` of :meth:`predict` (post-processing; spends the same budget)."""
    return jnp.argmax(self.predict(x), axis=-1)


class _VotingPredictor(PrivatePredictor):
  """Shared code of predictors that aggregate teacher votes ``vote_fn(params, x) -> (M, C)``."""

  def __init__(self, vote_fn: Callable[[Any, jax.Array], jax.Array], teacher_params: Any,
               calibration: dict, scale: jax.Array, **kwargs: Any):
    self._vote_fn = vote_fn
    self.teacher_params = teacher_params
    super().__init__(fingerprint=_fingerprint(teacher_params, calibration),
                     params=(teacher_params, scale), **kwargs)

  def votes(self, x: Any) -> jax.Array:
    """The private vote histograms (never release them)."""
    return self._vote_fn(self.teacher_params, jnp.asarray(x))


class SubsampleAggregatePredictor(_VotingPredictor):
  """Labels sampled with ``p(y) ∝ exp(beta n_y(x))`` over T disjoint teachers (paper 000 Alg. 8).

  ``beta`` comes from :func:`~jaxdp.prediction.subsample_aggregate.exponential_aggregation_beta`
  (``eps/(2B)`` for pure DP, not the paper's ``eps/B``; see that module).

  Args:
    vote_fn: jittable ``(teacher_params, x (M, D)) -> votes (M, C)``, e.g.
      :func:`~jaxdp.prediction.subsample_aggregate.linear_teacher_votes` or a
      vmapped Flax apply followed by :func:`votes_from_labels`. The teachers
      must have been trained on disjoint parts of the private data.
    teacher_params: the teachers' parameters (a pytree).
    epsilon, delta, budget: the guarantee over B answers.
    key: secret ``jax.random`` key of the noise.
  """

  def __init__(
      self,
      vote_fn: Callable[[Any, jax.Array], jax.Array],
      teacher_params: Any,
      *,
      epsilon: float,
      delta: float,
      budget: int,
      key: jax.Array,
      privacy_budget: _accountant.PrivacyBudget | None = None,
      state_path: str | os.PathLike | None = None,
  ):
    self.beta = _sa.exponential_aggregation_beta(epsilon, delta, budget)
    super().__init__(vote_fn, teacher_params, {"beta": self.beta}, _f32_at_most(self.beta),
                     budget=budget,
                     epsilon=epsilon, delta=delta,
                     query_event=_sa.exponential_aggregation_event(self.beta), key=key,
                     privacy_budget=privacy_budget, state_path=state_path)

  @classmethod
  def from_linear_teachers(cls, teacher_weights: Any, **kwargs: Any) -> "SubsampleAggregatePredictor":
    """Teachers given as linear softmax weights ``(T, D, C)``."""
    return cls(_sa.linear_teacher_votes, jnp.asarray(teacher_weights), **kwargs)

  def _static_config(self) -> tuple:
    return (self._vote_fn,)

  @staticmethod
  def _answer(config: tuple, params: Any, keys: jax.Array, x: jax.Array) -> jax.Array:
    teacher_params, beta = params
    return _sa.aggregate_exponential_from_keys(keys, config[0](teacher_params, x), beta)


class NoisyMaxPredictor(_VotingPredictor):
  """LNMax / GNMax labels ``argmax_c (n_c(x) + Z_c)`` (PATE; :mod:`jaxdp.prediction.pate`).

  Answers the queries of a PATE student (one per public point) or of any
  user. The noise scale covers ``budget`` answers with ``(eps, delta)``
  (:func:`~jaxdp.prediction.pate.noisy_max_scale`; GNMax needs ``delta > 0``).
  """

  def __init__(
      self,
      vote_fn: Callable[[Any, jax.Array], jax.Array],
      teacher_params: Any,
      *,
      mechanism: str,
      epsilon: float,
      delta: float,
      budget: int,
      key: jax.Array,
      privacy_budget: _accountant.PrivacyBudget | None = None,
      state_path: str | os.PathLike | None = None,
  ):
    self.mechanism = mechanism
    self.scale = _pate.noisy_max_scale(mechanism, epsilon, delta, budget)
    super().__init__(vote_fn, teacher_params, {"mechanism": mechanism, "scale": self.scale},
                     _f32_at_least(self.scale),
                     budget=budget, epsilon=epsilon, delta=delta,
                     query_event=_pate.noisy_max_event(mechanism, self.scale), key=key,
                     privacy_budget=privacy_budget, state_path=state_path)

  @classmethod
  def from_linear_teachers(cls, teacher_weights: Any, **kwargs: Any) -> "NoisyMaxPredictor":
    """Teachers given as linear softmax weights ``(T, D, C)``."""
    return cls(_sa.linear_teacher_votes, jnp.asarray(teacher_weights), **kwargs)

  def _static_config(self) -> tuple:
    return (self._vote_fn, self.mechanism)

  @staticmethod
  def _answer(config: tuple, params: Any, keys: jax.Array, x: jax.Array) -> jax.Array:
    teacher_params, scale = params
    return _pate.noisy_max_labels_from_keys(keys, config[0](teacher_params, x), config[1], scale)


__all__ = [
    "NoisyMaxPredictor", "PredictionSensitivityPredictor", "PrivatePredictor",
    "SubsampleAggregatePredictor",
]
