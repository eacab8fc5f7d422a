"""Private hyper-parameter tuning of DP-SGD (:func:`tune_dpsgd`).

Each run of the repeat-and-select procedure (:func:`~jaxdp.tuning.repeat_and_select`)
is a full private :func:`jaxdp.dpsgd.train_dpsgd` run with a random candidate
``(learning_rate, l2_clip_norm, epochs)`` followed by a private validation
accuracy (:func:`~jaxdp.tuning.private_accuracy`, Laplace or Gaussian on the
count of correct predictions). Its event is
``Composed([T_c x PoissonSampled(q, Gaussian(sigma)), score event])``.

One per-run event for every candidate. The learning rate and the clip norm do
not change the event (the noise is ``sigma`` times the clip norm); the number
of epochs does (T_c = ceil(epochs / q) steps). All candidates share ONE noise
multiplier sigma, so the candidate with the most epochs has the largest RDP at
every order and its event dominates every other's
(:func:`~jaxdp.tuning.dominating_event` checks it on dp_accounting's orders):
every run is accounted with the dominating event, which upper-bounds its own
(a mixture over data-independent candidates of runs that are each
(λ, ε_d(λ))-RDP is (λ, ε_d(λ))-RDP). ``epochs`` must therefore be a finite list
(a continuous law of epochs has no largest event to check); the learning rate
and clip norm may be lists or callables ``(key) -> value``. A per-candidate
calibration of sigma to a common per-run epsilon is NOT used: equal epsilons at
one delta are not equal RDP curves, and none would dominate.

``target_epsilon`` is the epsilon of the WHOLE tuning at ``delta`` (RDP,
Papernot & Steinke 2022 Thms 2 and 6 through dp_accounting): sigma is the
smallest noise multiplier (bisection in float64, upper end) for which the
repeat-and-select event of the dominating run is within it. ``noise_multiplier``
fixes sigma instead.

Privacy: add/remove neighbours of one example of the training set or of the
validation set (the validation rows are private and paid for by the score).
The validation set size is treated as public (the score's normaliser), as
``train_dpsgd`` treats N; pass ``num_val_examples`` to declare it. Released:
the best run's parameters, its hyper-parameters and its private score;
nothing else of any run (no epsilon per run, no training history, and not the
number of runs K).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxdp import _validation
from jaxdp.accounting import dpsgd_accounting
from jaxdp.accounting import events
from jaxdp.accounting.accountant import PrivacyAccountant
from jaxdp.tuning.repeat_and_select import dominating_event, repeat_and_select
from jaxdp.tuning import repetitions as repetitions_lib
from jaxdp.tuning import scoring

SEARCH_KEYS = ("learning_rate", "l2_clip_norm", "epochs")
# train_dpsgd arguments that do not change the run's event (passed through).
PASSTHROUGH = ("loss", "per_layer", "microbatch_size", "clipping_method",
               "physical_batch_size", "sample_on_device")


@dataclasses.dataclass(frozen=True)
class DPSGDTuningResult:
  """Outcome of :func:`tune_dpsgd`.

  Attributes:
    params: the best run's trained parameters (None when nothing is released).
    hyperparameters: its candidate, a dict with ``learning_rate``,
      ``l2_clip_norm``, ``epochs`` (None likewise).
    score: its private validation accuracy (None likewise).
    event: the ONE event of the whole tuning (public).
    per_run_event: the dominating per-run event (public).
    noise_multiplier: sigma shared by every run (public).
    epsilon: the tuning's epsilon at ``delta`` by RDP (public).
    delta: the delta of ``epsilon``.
  """

  params: Any
  hyperparameters: dict | None
  score: float | None
  event: events.DpEvent
  per_run_event: events.DpEvent
  noise_multiplier: float
  epsilon: float
  delta: float


def _check_axis(name: str, value: Any, allow_callable: bool) -> Any:
  if callable(value):
    if not allow_callable:
      raise ValueError(f"search_space[{name!r}] must be a finite list: the number of epochs "
                       "changes the run's event, and only a finite list has a largest event.")
    return value
  if isinstance(value, (int, float)) and not isinstance(value, bool):
    value = [value]
  if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or len(value) == 0:
    raise ValueError(f"search_space[{name!r}] must be a non-empty list of values"
                     + (" or a callable (key) -> value" if allow_callable else "")
                     + f", got {value!r}.")
  return [_validation.check_positive(v, f"search_space[{name!r}]") for v in value]


def _sampler(space: dict) -> Callable[[jax.Array], dict]:
  """``key -> candidate dict``: each hyper-parameter drawn independently (uniform on a list)."""
  def draw(key):
    keys = jax.random.split(key, len(SEARCH_KEYS))
    out = {}
    for k, name in zip(keys, SEARCH_KEYS):
      axis = space[name]
      if callable(axis):
        out[name] = _validation.check_positive(axis(k), f"search_space[{name!r}](key)")
      else:
        out[name] = axis[int(jax.random.randint(k, (), 0, len(axis)))]
    return out
  return draw


def _run_event(sigma: float, q: float, steps: int, score_event: events.DpEvent) -> events.DpEvent:
  return events.ComposedDpEvent([dpsgd_accounting.dpsgd_event(sigma, q, steps), score_event])


def _calibrate_sigma(target_epsilon: float, delta: float, q: float, steps: int,
                     score_event: events.DpEvent, repetitions: Any) -> float:
  """Smallest sigma whose tuning event is (target_epsilon, delta)-DP by RDP (upper bracket end)."""
  # The integer orders of dp_accounting's default grid (closed-form Poisson-sampled Gaussian
  # RDP, ~50x faster than its fractional orders): a subset of the accountant's orders, so the
  # epsilon found here is >= the accountant's and the calibration is conservative.
  from dp_accounting.rdp import rdp_privacy_accountant as rdp  # pylint: disable=import-outside-toplevel
  from jaxdp.accounting import accountant as acc_lib  # pylint: disable=import-outside-toplevel
  orders = [o for o in rdp.DEFAULT_RDP_ORDERS if float(o).is_integer()]

  def rdp_epsilon(event):
    acc = acc_lib._RdpAccountant(orders=orders)  # pylint: disable=protected-access
    acc.compose(event)
    return acc.get_epsilon(delta)

  def eps(sigma):
    return rdp_epsilon(repetitions.event(_run_event(sigma, q, steps, score_event)))

  floor = rdp_epsilon(repetitions.event(score_event))
  if not floor < target_epsilon:
    raise ValueError(f"target_epsilon={target_epsilon}: the private score alone, repeated, "
                     f"costs {floor:.4g} at delta={delta}; lower score_epsilon or raise "
                     "target_epsilon.")
  hi = 1.0
  while eps(hi) > target_epsilon:
    hi *= 2.0
    if hi > 1e6:
      raise ValueError(f"target_epsilon={target_epsilon} cannot be met with sigma <= 1e6.")
  lo = hi / 2.0 if hi > 1.0 else 0.0
  if lo == 0.0:
    lo = 1e-3
    while lo < hi and eps(lo) <= target_epsilon:
      lo /= 2.0
  for _ in range(60):
    mid = 0.5 * (lo + hi)
    if eps(mid) > target_epsilon:
      lo = mid
    else:
      hi = mid
    if hi - lo <= 1e-4 * hi:
      break
  return hi


def tune_dpsgd(key: jax.Array, model: Any, x_train: Any, y_train: Any, x_val: Any, y_val: Any, *,
               search_space: dict, delta: float, repetitions: Any,
               score_epsilon: float, target_epsilon: float | None = None,
               noise_multiplier: float | None = None, sample_rate: float | None = None,
               expected_batch_size: float | None = None, score_mechanism: str = "laplace",
               score_delta: float | None = None, num_val_examples: int | None = None,
               accountant: Any = None, accountant_method: str = "rdp",
               **train_kwargs: Any) -> DPSGDTuningResult:
  """Private hyper-parameter tuning of :func:`jaxdp.dpsgd.train_dpsgd` (see the module docstring).

  Args:
    key: a ``jax.random`` key.
    model: a ``flax.linen.Module`` (initialised per run from the run's key).
    x_train, y_train: private training data (as for ``train_dpsgd``).
    x_val, y_val: private validation data; ``y_val`` integer labels.
    search_space: dict with ``learning_rate``, ``l2_clip_norm`` (each a list or a
      callable ``(key) -> value``) and ``epochs`` (a list); a single number fixes
      a hyper-parameter.
    delta: the delta of the training runs' accounting and of ``target_epsilon``.
    repetitions: the law of the number of runs (:mod:`jaxdp.tuning.repetitions`).
    score_epsilon: epsilon of the Laplace validation score (with
      ``score_mechanism="gaussian"``: its epsilon with ``score_delta``).
    target_epsilon: epsilon of the WHOLE tuning at ``delta`` (calibrates sigma),
      or ``noise_multiplier``: sigma (exactly one).
    sample_rate / expected_batch_size: Poisson rate q, or the expected batch q N.
    score_mechanism, score_delta: ``"laplace"`` or ``"gaussian"`` (with ``score_delta``).
    num_val_examples: the public normaliser of the score (default ``len(y_val)``).
    accountant: optional ``PrivacyAccountant`` / ``PrivacyBudget``: the one event
      is spent before any training.
    accountant_method: as for ``train_dpsgd`` (each run's own ledger).
    **train_kwargs: ``train_dpsgd`` arguments that do not change the event:
      ``loss``, ``per_layer``, ``microbatch_size``, ``clipping_method``,
      ``physical_batch_size``, ``sample_on_device``.

  Returns:
    :class:`DPSGDTuningResult`.
  """
  from jaxdp import dpsgd  # pylint: disable=import-outside-toplevel
  _validation.check_key(key)
  if not isinstance(search_space, dict):
    raise TypeError(f"search_space must be a dict, got {type(search_space).__name__}.")
  unknown = sorted(set(search_space) - set(SEARCH_KEYS))
  missing = [k for k in SEARCH_KEYS if k not in search_space]
  if unknown or missing:
    raise ValueError(f"search_space must have exactly the keys {SEARCH_KEYS}; unknown "
                     f"{unknown}, missing {missing}.")
  space = {name: _check_axis(name, search_space[name], allow_callable=name != "epochs")
           for name in SEARCH_KEYS}
  bad = sorted(set(train_kwargs) - set(PASSTHROUGH))
  if bad:
    raise ValueError(f"tune_dpsgd does not pass {bad} to train_dpsgd (they would change the "
                     f"run's event or are set here); allowed: {PASSTHROUGH}.")
  delta = _validation.check_delta(delta, allow_zero=False)
  repetitions_lib.check_repetitions(repetitions)
  n_train = len(y_train)
  if (sample_rate is None) == (expected_batch_size is None):
    raise ValueError("give exactly one of sample_rate or expected_batch_size.")
  q = (_validation.check_sample_rate(sample_rate) if sample_rate is not None
       else _validation.check_sample_rate(
           _validation.check_positive(expected_batch_size, "expected_batch_size") / n_train,
           "expected_batch_size / len(y_train)"))
  y_val_np = np.asarray(y_val)
  if y_val_np.ndim != 1 or len(y_val_np) != len(x_val) or len(y_val_np) == 0:
    raise ValueError(f"x_val and y_val must have the same non-zero length, got {len(x_val)} and "
                     f"{y_val_np.shape}.")
  _validation.check_finite_array(x_val, "x_val")
  n_val = len(y_val_np) if num_val_examples is None else _validation.check_positive_int(
      num_val_examples, "num_val_examples")
  score_kwargs = ({"epsilon": score_epsilon} if score_mechanism == "laplace"
                  else {"epsilon": score_epsilon, "delta": score_delta})
  # The score's event, from public parameters (a throwaway call on a 1-row dummy checks them).
  score_event = scoring._noise_event(  # pylint: disable=protected-access
      1.0, score_mechanism, score_kwargs.get("epsilon"), score_kwargs.get("delta"), None,
      events.ADD_REMOVE, events.DEFAULT_UNIT)[1]
  steps = {e: dpsgd_accounting.steps_for_epochs(e, q) for e in space["epochs"]}
  t_max = max(steps.values())
  sigma = dpsgd_accounting.resolve_with(
      target_epsilon, noise_multiplier, delta,
      lambda eps, d: _calibrate_sigma(_validation.check_epsilon(eps, "target_epsilon"), d, q,
                                      t_max, score_event, repetitions))
  if not sigma > 0:
    raise ValueError("noise_multiplier must be > 0 for a private tuning.")
  train_events = {e: dpsgd_accounting.dpsgd_event(sigma, q, t) for e, t in steps.items()}
  per_run_event = dominating_event(
      [events.ComposedDpEvent([train_events[e], score_event]) for e in space["epochs"]])
  total_event = repetitions.event(per_run_event)
  ledger = PrivacyAccountant(events.ADD_REMOVE)
  ledger.spend(total_event)
  epsilon = ledger.get_epsilon(delta, "rdp")
  x_val_j = jnp.asarray(x_val)

  def mechanism(run_key, candidate):
    train_key, score_key = jax.random.split(run_key)
    run_ledger = PrivacyAccountant(events.ADD_REMOVE)
    result = dpsgd.train_dpsgd(
        model, x_train, y_train, key=train_key, epochs=candidate["epochs"],
        l2_clip_norm=candidate["l2_clip_norm"], learning_rate=candidate["learning_rate"],
        delta=delta, sample_rate=q, noise_multiplier=sigma, accountant=run_ledger,
        accountant_method=accountant_method, **train_kwargs)
    planned = train_events[candidate["epochs"]]  # SelfComposed(step event, T)
    spent = [(events.event_to_dict(e), int(c)) for e, c in run_ledger.ledger]
    if spent != [(events.event_to_dict(planned.event), int(planned.count))]:
      raise RuntimeError("train_dpsgd spent an event other than the one accounted for this "
                         "candidate; refusing to release anything.")
    logits = model.apply({"params": result.params}, x_val_j)
    predictions = jnp.argmax(logits, axis=-1)
    score, _ = scoring.private_accuracy(score_key, predictions, y_val_np, neighbouring="add_remove",
                                        num_examples=n_val, mechanism=score_mechanism,
                                        **score_kwargs)
    return result.params, score, per_run_event

  out = repeat_and_select(key, mechanism, _sampler(space), repetitions=repetitions,
                              event=per_run_event, accountant=accountant)
  return DPSGDTuningResult(params=out.release, hyperparameters=out.candidate, score=out.score,
                           event=out.event, per_run_event=per_run_event,
                           noise_multiplier=float(sigma), epsilon=float(epsilon), delta=delta)


__all__ = ["DPSGDTuningResult", "tune_dpsgd"]
