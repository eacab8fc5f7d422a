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
* Spending is committed before any answer is released. With ``state_path``
  the answered count lives in a JSON state file, and every batch *reserves*
  its queries there by a locked compare-and-increment
  (:func:`jaxdp._durable.locked_update`: ``flock`` on a hidden ``.<name>.lock`` beside ``state_path``,
  atomic fsync'd replace) before any noise is drawn: read the count ``n``,
  refuse if ``n + M > B``, spend the shared ``PrivacyBudget``, write
  ``n + M``, release the lock, then answer with query indices
  ``n, ..., n + M - 1``. Any number of predictors and processes sharing one
  state file therefore answer at most B queries *in total*, with disjoint
  query indices, and a restart resumes the count, so it cannot reset the
  budget. A state file that vanished or went backwards after this predictor
  used it is refused (``ValueError``), as is one of another model,
  calibration or budget (checked by a fingerprint). ``state_dict`` /
  ``load_state_dict`` / ``save`` do the same by hand and never lower a count.
* Every answer gets fresh noise, however predictors are created. Each
  predictor draws a 128-bit *nonce* from the operating system's entropy
  (:func:`secrets.randbits`) and derives its instance key
  ``k_inst = fold_in(fold_in(key, tag), nonce words)``; query number i
  (its index above, or the instance's own count without ``state_path``) uses
  ``fold_in(k_inst, i)``. Two predictors built with the same ``key`` (a
  restart without ``state_path``, a second instance in the process, a second
  process) thus never replay each other's noise -- replayed noise would
  reveal ``(x1 - x2) W`` exactly from the difference of two answers -- and
  the consequence is that answers are *not* bit-reproducible across
  instances. For tests and audits, ``unsafe_fixed_nonce=n`` fixes the nonce;
  it is safe only if no other predictor ever answers with the same
  ``(key, unsafe_fixed_nonce)`` outside one shared ``state_path`` (the
  disjoint indices keep predictors on one state file fresh even then).
  Freshness is computational: distinct ``(nonce, index)`` pairs give
  independent-looking threefry keys (64-bit key space; collisions among
  ``n`` answered queries have probability about ``n^2 / 2^65``).
  The ``key`` is secret: whoever knows it (and the public nonce) can subtract
  the noise. Neither the key nor the nonce is stored in the state.
* Malformed queries (non-numeric, NaN/inf, wrong rank, a feature count the
  model does not take) raise ``ValueError`` naming ``x`` before anything is
  spent.

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
import secrets
import threading
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxdp import _durable
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


_NONCE_BITS = 128
# Domain-separation tag folded in before the nonce ("jxdp"), so instance keys
# never coincide with keys a user derives from the same key by plain fold_in.
_NONCE_TAG = 0x6A786470


def _check_nonce(nonce: Any) -> int:
  """An ``unsafe_fixed_nonce``: a Python int in ``[0, 2**128)``."""
  if isinstance(nonce, bool) or not isinstance(nonce, (int, np.integer)):
    raise TypeError(f"unsafe_fixed_nonce must be an int, got {type(nonce).__name__}.")
  nonce = int(nonce)
  if not 0 <= nonce < 2**_NONCE_BITS:
    raise ValueError(f"unsafe_fixed_nonce must be in [0, 2**{_NONCE_BITS}), got {nonce}.")
  return nonce


def _instance_key(key: jax.Array, nonce: int) -> jax.Array:
  """``fold_in`` of the tag and the four 32-bit words of the nonce (low word first)."""
  out = jax.random.fold_in(key, np.uint32(_NONCE_TAG))
  for j in range(_NONCE_BITS // 32):
    out = jax.random.fold_in(out, np.uint32((nonce >> (32 * j)) & 0xFFFFFFFF))
  return out


class PrivatePredictor:
  """Base class: answers at most ``budget`` queries in total, then refuses.

  Subclasses implement ``_check_queries(x)`` (host validation, returns numpy),
  ``_static_config()`` (hashable) and the pure, jittable
  ``_answer(config, params, keys, x)`` (a staticmethod; one key per row). The
  jitted answer function is shared by all predictors of one class and config,
  so building a new predictor does not recompile.

  Noise keys (see the module docstring): query i of this predictor uses
  ``fold_in(_instance_key(key, nonce), i)`` with a fresh 128-bit OS-entropy
  ``nonce`` per instance, and with ``state_path`` the indices i come from a
  locked counter shared by every user of that file.

  Attributes:
    budget: the inference budget B (total number of queries covered).
    epsilon, delta: the guarantee of all B answers together.
    query_event: the DpEvent of one answered query.
    nonce: this instance's nonce (not secret; the key is).
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
      unsafe_fixed_nonce: int | None = None,
  ):
    self.budget = _validation.check_positive_int(budget, "budget")
    if self.budget >= 2**32:  # query indices are folded into the key as uint32
      raise ValueError(f"budget must be in [1, 2**32 - 1], got {self.budget}.")
    self.epsilon = float(epsilon)
    self.delta = float(delta)
    self.query_event = query_event
    self.nonce = (secrets.randbits(_NONCE_BITS) if unsafe_fixed_nonce is None
                  else _check_nonce(unsafe_fixed_nonce))
    # Only the derived key is kept; neither it nor `key` is ever written out.
    self._key = _instance_key(_validation.check_key(key), self.nonce)
    self._fingerprint = fingerprint
    self._params = params
    self._privacy_budget = privacy_budget
    self._state_path = None if state_path is None else os.path.abspath(os.fspath(state_path))
    self._answered = 0
    self._lock = threading.Lock()
    if self._state_path is not None:
      state = _durable.read_json(self._state_path)
      if state is not None:
        self.load_state_dict(state)

  # -- to implement ------------------------------------------------------------
  def _check_queries(self, x: Any) -> np.ndarray:
    try:
      arr = np.asarray(x)
    except (TypeError, ValueError) as e:  # ragged nested lists
      raise ValueError(f"x must be a numeric array of shape (num_queries, ...): {e}") from e
    if arr.dtype.kind not in "biuf":
      raise ValueError(f"x must hold real numbers, got dtype {arr.dtype}.")
    arr = _validation.check_finite_array(arr, "x")
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
    """Queries answered so far; with ``state_path``, by every user of that file."""
    if self._state_path is not None:
      state = _durable.read_json(self._state_path)
      if state is not None:
        count = self._count_in(state)
        with self._lock:
          self._answered = max(self._answered, count)
    return self._answered

  @property
  def remaining_queries(self) -> int:
    return self.budget - self.queries_answered

  def accountant(self) -> _accountant.PrivacyAccountant:
    """A fresh ledger with the answered queries (``query_event`` x answered)."""
    acc = _accountant.PrivacyAccountant()
    answered = self.queries_answered
    if answered:
      acc.spend(self.query_event, answered)
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
        # Query number i (its reserved index) uses fold_in(instance key, i).
        idx = first + jnp.arange(queries.shape[0], dtype=jnp.uint32)
        keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(idx)
        return answer(config, params, keys, queries)

      fn = _JIT_CACHE.setdefault(cache_key, jax.jit(answer_from))
    return fn(self._params, self._key, jnp.uint32(start), jnp.asarray(x))

  def _refuse_if_over(self, answered: int, m: int) -> None:
    if answered + m > self.budget:
      raise BudgetExceededError(
          f"a batch of {m} queries would exceed the inference budget: {answered} of "
          f"{self.budget} queries already answered ({self.budget - answered} left); nothing "
          "was answered.")

  def _reserve(self, m: int) -> int:
    """Reserves ``m`` query indices (and spends the shared budget); returns the first.

    With ``state_path`` this is a compare-and-increment under the file lock,
    written (fsync'd) before the lock is released and before any answer.
    """
    with self._lock:
      if self._state_path is None:
        start = self._answered
        self._refuse_if_over(start, m)
        if self._privacy_budget is not None:
          self._privacy_budget.spend(self.query_event, m)  # raises, spending nothing
        self._answered = start + m
        return start
      with _durable.locked_update(self._state_path) as box:
        if box.value is None:
          if self._answered:
            raise ValueError(
                f"the state file {self._state_path} has disappeared after this predictor "
                f"answered {self._answered} queries; recreating it would reset the budget. "
                "Nothing was answered.")
          start = 0
        else:
          start = self._count_in(box.value)
        self._refuse_if_over(start, m)  # raises: nothing written
        if self._privacy_budget is not None:
          self._privacy_budget.spend(self.query_event, m)  # raises, spending nothing
        box.value = self._state_with(start + m)
      self._answered = start + m
      return start

  def predict(self, x: Any) -> jax.Array:
    """Answers every row of ``x`` privately, or refuses the whole batch.

    Raises:
      BudgetExceededError: if ``queries_answered + len(x) > budget`` (over all
        users of ``state_path``) or the shared ``privacy_budget`` would be
        overspent; nothing is answered or spent then.
      ValueError: malformed queries (checked before anything is spent), or a
        ``state_path`` file that was deleted, rolled back or replaced.
    """
    x_np = self._check_queries(x)
    m = int(x_np.shape[0])
    if m == 0:
      return self._run(0, x_np)  # draws no noise, spends nothing
    start = self._reserve(m)
    return self._run(start, x_np)

  # -- persistence -------------------------------------------------------------
  def _state_with(self, answered: int) -> dict:
    return {
        "format": _STATE_FORMAT,
        "kind": type(self).__name__,
        "budget": self.budget,
        "epsilon": self.epsilon,
        "delta": self.delta,
        "queries_answered": answered,
        "query_event": _events.event_to_dict(self.query_event),
        "fingerprint": self._fingerprint,
    }

  def _count_in(self, state: Any) -> int:
    """Validates a state of this predictor; returns its count (never below ours)."""
    if not isinstance(state, dict) or state.get("format") != _STATE_FORMAT:
      got = state.get("format") if isinstance(state, dict) else type(state).__name__
      raise ValueError(f"state format must be {_STATE_FORMAT!r}, got {got!r}.")
    mine = self._state_with(0)
    for field in ("kind", "budget", "epsilon", "delta", "query_event", "fingerprint"):
      if state.get(field) != mine[field]:
        raise ValueError(
            f"state does not belong to this predictor: {field} is {state.get(field)!r}, expected "
            f"{mine[field]!r}.")
    answered = state.get("queries_answered")
    if isinstance(answered, bool) or not isinstance(answered, int):
      raise ValueError(f"state queries_answered must be an int, got {answered!r}.")
    if not 0 <= answered <= self.budget:
      raise ValueError(f"state queries_answered must be in [0, {self.budget}], got {answered}.")
    if answered < self._answered:
      raise ValueError(
          f"state has {answered} answered queries but this predictor has already answered "
          f"{self._answered}; loading it would reset the budget.")
    return answered

  def state_dict(self) -> dict:
    """JSON-compatible state: budget, answered count, event, fingerprint (no key, no nonce)."""
    return self._state_with(self.queries_answered)

  def load_state_dict(self, state: dict) -> None:
    """Restores the answered count from ``state``.

    Raises:
      ValueError: if the state belongs to another predictor kind, model,
        calibration or budget, or would lower the answered count (a reset).
    """
    with self._lock:
      self._answered = self._count_in(state)

  def save(self, path: str | os.PathLike) -> None:
    """Writes :meth:`state_dict` as JSON, under the file lock, atomically and durably.

    Raises:
      ValueError: if ``path`` holds a state of another predictor, or one with
        more answered queries (overwriting it would reset the budget).
    """
    with _durable.locked_update(path) as box:
      if box.value is not None:
        theirs = self._count_in(box.value)
        if theirs > self.queries_answered:
          raise ValueError(
              f"{os.fspath(path)} records {theirs} answered queries, more than this predictor's "
              f"{self._answered}; overwriting it would reset the budget.")
      box.value = self.state_dict()

  def load(self, path: str | os.PathLike) -> None:
    """Loads a state written by :meth:`save` (see :meth:`load_state_dict`)."""
    state = _durable.read_json(path)
    if state is None:
      raise FileNotFoundError(f"no predictor state at {os.fspath(path)}.")
    self.load_state_dict(state)

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
      unsafe_fixed_nonce: int | None = None,
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
                     state_path=state_path, unsafe_fixed_nonce=unsafe_fixed_nonce)

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
      unsafe_fixed_nonce: int | None = None,
  ) -> "PredictionSensitivityPredictor":
    """Calibrates with :func:`~jaxdp.prediction.prediction_sensitivity.calibrate_prediction_sensitivity`.

    ``solver_tol`` must be the gradient-norm tolerance the weights were fitted
    to (0 only for exact minimisers); prefer :meth:`from_linear_model`.
    ``unsafe_fixed_nonce``: see the module docstring (reproducible noise, safe
    only if no other predictor answers with the same key and nonce).
    """
    cal = _ps.calibrate_prediction_sensitivity(epsilon, delta, budget, num_examples, l2_reg,
                                               lipschitz, method, solver_tol)
    return cls(weights, cal, key=key, privacy_budget=privacy_budget, state_path=state_path,
               unsafe_fixed_nonce=unsafe_fixed_nonce)

  @classmethod
  def from_linear_model(
      cls,
      model: Any,
      *,
      x: Any,
      y: Any,
      l2_reg: float,
      epsilon: float,
      delta: float,
      budget: int,
      key: jax.Array,
      tol: float = 1e-6,
      method: str = "best",
      privacy_budget: _accountant.PrivacyBudget | None = None,
      state_path: str | os.PathLike | None = None,
  ) -> "PredictionSensitivityPredictor":
    """From a :func:`jaxdp.training.fit_linear` softmax result and its training data ``(x, y)``.

    Never refuses (a refusal that depends on whether the solver converged on
    ``D`` would leak): the weights are certified in float64 and, if needed,
    repaired by :func:`jaxdp.training.certified_solve.certify_minimizers`, so
    they lie within ``tol/lambda`` of the exact minimiser on every dataset.
    The calibration uses the FIXED ``tol`` (data-independent), plus
    ``2^-24 (K + tol)`` for rounding the certified float64 point to float32
    (``||theta|| <= K/lambda + tol/lambda``): ``solver_tol = tol + 2^-24 (K + tol)``
    in ``2K/(N lambda) + 2 solver_tol/lambda`` (paper 000 Lemma 1 plus strong convexity).
    """
    from jaxdp.training import certified_solve, linear  # pylint: disable=import-outside-toplevel
    if x is None or y is None:
      raise ValueError("x and y (the training data of the model) are needed to certify it.")
    num_classes = int(np.shape(model.weights)[-1])
    x_c = linear.check_features(x, "x")
    y_c = linear.check_labels(y, "softmax", num_classes, np.shape(x_c)[0])
    n = int(np.shape(x_c)[0])
    lam = _validation.check_positive(l2_reg, "l2_reg")
    tol = certified_solve.check_tol(tol, num_examples=n, dim=int(np.size(model.weights)),
                                    loss="softmax")
    cert = certified_solve.certify_minimizers(model.weights, x_c, y_c, loss="softmax", h=0.5,
                                              l2_total=lam, tol=tol)
    solver_tol = tol + 2.0 ** -24 * (_ps.SOFTMAX_LIPSCHITZ + tol)
    return cls.from_weights(jnp.asarray(cert.weights.astype(np.float32)), num_examples=n,
                            l2_reg=lam, epsilon=epsilon, delta=delta, budget=budget, key=key,
                            method=method, solver_tol=solver_tol,
                            privacy_budget=privacy_budget, state_path=state_path)

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
    self._fitting_shapes: set = set()
    super().__init__(fingerprint=_fingerprint(teacher_params, calibration),
                     params=(teacher_params, scale), **kwargs)

  def _check_queries(self, x: Any) -> np.ndarray:
    """Base checks, then ``x`` must fit ``vote_fn`` (abstract evaluation, no FLOPs).

    ``x`` may have any rank >= 2 ``(num_queries, ...)`` the teachers accept
    (e.g. images for a CNN); ``vote_fn`` must return ``(num_queries, C)``.
    """
    try:
      arr = np.asarray(x)
    except (TypeError, ValueError):
      arr = None
    if arr is not None and arr.ndim > 2 and arr.dtype.kind in "biuf":
      arr = _validation.check_finite_array(arr, "x")
    else:
      arr = super()._check_queries(x)
    shape_dtype = (arr.shape, jax.dtypes.canonicalize_dtype(arr.dtype))
    if shape_dtype not in self._fitting_shapes:
      try:
        out = jax.eval_shape(self._vote_fn, self.teacher_params,
                             jax.ShapeDtypeStruct(*shape_dtype))
      except Exception as e:  # pylint: disable=broad-except  # e.g. dot_general's TypeError
        raise ValueError(
            f"x of shape {arr.shape} and dtype {arr.dtype} does not fit the teachers "
            f"(wrong number of features?): vote_fn raised {type(e).__name__}: {e}") from e
      if len(getattr(out, "shape", ())) != 2 or out.shape[0] != arr.shape[0]:
        raise ValueError(
            f"for x of shape {arr.shape}, vote_fn must return votes of shape "
            f"({arr.shape[0]}, num_classes), got {getattr(out, 'shape', out)}.")
      self._fitting_shapes.add(shape_dtype)
    return arr

  def nonprivate_votes(self, x: Any) -> jax.Array:
    """The teachers' exact vote histograms on ``x``: NOT private, never release them.

    For testing and debugging only; the private answers are :meth:`predict`'s labels.
    """
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
    privacy_budget, state_path, unsafe_fixed_nonce: see :class:`PrivatePredictor`
      and the module docstring.
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
      unsafe_fixed_nonce: int | None = None,
  ):
    self.beta = _sa.exponential_aggregation_beta(epsilon, delta, budget)
    super().__init__(vote_fn, teacher_params, {"beta": self.beta}, _f32_at_most(self.beta),
                     budget=budget,
                     epsilon=epsilon, delta=delta,
                     query_event=_sa.exponential_aggregation_event(self.beta), key=key,
                     privacy_budget=privacy_budget, state_path=state_path,
                     unsafe_fixed_nonce=unsafe_fixed_nonce)

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
      unsafe_fixed_nonce: int | None = None,
  ):
    self.mechanism = mechanism
    self.scale = _pate.noisy_max_scale(mechanism, epsilon, delta, budget)
    super().__init__(vote_fn, teacher_params, {"mechanism": mechanism, "scale": self.scale},
                     _f32_at_least(self.scale),
                     budget=budget, epsilon=epsilon, delta=delta,
                     query_event=_pate.noisy_max_event(mechanism, self.scale), key=key,
                     privacy_budget=privacy_budget, state_path=state_path,
                     unsafe_fixed_nonce=unsafe_fixed_nonce)

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
