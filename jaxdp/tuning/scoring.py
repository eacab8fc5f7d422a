"""Private validation scores for hyper-parameter tuning.

The validation rows are private data: a score computed on them and used to
select (or released with) a model must carry noise and be paid for; its event
is part of each run's event in :func:`~jaxdp.tuning.repeat_and_select`.

Both scores add noise to a SUM of per-row terms, each term in a public range,
then divide by a public normaliser ``n``:

* :func:`private_accuracy`: the number of correct predictions. One row added,
  removed or replaced changes the count by at most 1 (the row's prediction
  depends on that row only), so the L1 and L2 sensitivities are 1.
* :func:`private_loss`: the sum of per-row losses clipped to ``[0, B]``
  (non-finite losses count as ``B``). One row changes it by at most ``B``.

Noise (``mechanism``): ``"laplace"`` with ``epsilon`` (Dwork & Roth 2014 Thm
3.6: ``Lap(Delta/epsilon)`` is epsilon-DP); ``"gaussian"`` with ``rho``
(``N(0, Delta^2/(2 rho))`` is rho-zCDP, Bun & Steinke 2016 Prop 1.6) or with
``epsilon`` and ``delta`` (the analytic Gaussian mechanism, Balle & Wang 2018
Thm 8).

The normaliser ``n``: ``num_examples`` if given, else ``len(labels)``. The
validation set SIZE is treated as public (its rows are private): under
replace-one neighbours (the default) ``len(labels)`` is the same on both
datasets, so this costs nothing; under add/remove neighbours dividing by the
actual size is the convention of :func:`jaxdp.dpsgd.train_dpsgd` (N public);
pass a declared ``num_examples`` to avoid relying on it.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxdp import _validation
from jaxdp import mechanisms
from jaxdp.accounting import events

MECHANISMS = ("laplace", "gaussian")


def _check_labels(x: Any, name: str) -> jax.Array:
  if isinstance(x, jax.core.Tracer):
    arr = x
  else:
    arr = np.asarray(x)
    if arr.dtype.kind not in "iub":
      if arr.dtype.kind != "f" or not np.all(np.isfinite(arr)) or not np.all(arr == np.round(arr)):
        raise ValueError(f"{name} must hold integer class labels, got dtype {arr.dtype}.")
  if arr.ndim != 1 or arr.shape[0] < 1:
    raise ValueError(f"{name} must be a non-empty 1-D array, got shape {tuple(arr.shape)}.")
  return jnp.asarray(arr)


def _normaliser(num_examples: Any, n_rows: int) -> float:
  if num_examples is None:
    return float(n_rows)
  return float(_validation.check_positive_int(num_examples, "num_examples"))


def _noise_event(sensitivity: float, mechanism: str, epsilon: Any, delta: Any, rho: Any,
                 neighbouring: str, unit: str) -> tuple[str, events.DpEvent]:
  """Checks the privacy arguments; returns (which Gaussian/Laplace call, the event)."""
  if mechanism not in MECHANISMS:
    raise ValueError(f"mechanism must be one of {MECHANISMS}, got {mechanism!r}.")
  relation = events.check_neighbouring(neighbouring)
  unit = events.check_unit(unit)
  if mechanism == "laplace":
    if epsilon is None or rho is not None or delta is not None:
      raise ValueError("mechanism='laplace' takes epsilon (and neither rho nor delta).")
    _validation.check_epsilon(epsilon)
    return "laplace", mechanisms.laplace_mechanism_event(sensitivity, epsilon,
                                                         neighbouring=relation, unit=unit)
  if rho is not None:
    if epsilon is not None or delta is not None:
      raise ValueError("mechanism='gaussian' takes rho, or epsilon with delta; not both.")
    _validation.check_positive(rho, "rho")
    return "zcdp", mechanisms.zcdp_gaussian_mechanism_event(sensitivity, rho,
                                                            neighbouring=relation, unit=unit)
  if epsilon is None or delta is None:
    raise ValueError("mechanism='gaussian' takes rho, or epsilon with delta.")
  _validation.check_epsilon(epsilon)
  _validation.check_delta(delta, allow_zero=False)
  return "analytic", mechanisms.gaussian_mechanism_event(sensitivity, epsilon, delta,
                                                         neighbouring=relation, unit=unit)


def _noisy_sum(key: jax.Array, total: jax.Array, sensitivity: float, which: str, epsilon: Any,
               delta: Any, rho: Any) -> jax.Array:
  if which == "laplace":
    return mechanisms.laplace_mechanism(key, total, sensitivity, epsilon)
  if which == "zcdp":
    return mechanisms.zcdp_gaussian_mechanism(key, total, sensitivity, rho)
  return mechanisms.gaussian_mechanism(key, total, sensitivity, epsilon, delta)


def private_accuracy(key: jax.Array, predictions: Any, labels: Any, *, epsilon: float | None = None,
                     rho: float | None = None, delta: float | None = None,
                     mechanism: str = "laplace", neighbouring: str = "replace_one",
                     num_examples: int | None = None,
                     unit: str = events.DEFAULT_UNIT) -> tuple[jax.Array, events.DpEvent]:
  """A private validation accuracy: ``(#{i: predictions_i = labels_i} + noise) / n``.

  The validation rows are private and this score is paid for: its event (one
  Laplace or Gaussian mechanism of sensitivity 1 on the count) is returned and
  belongs in the run's event. Sensitivity: adding, removing or replacing one
  validation row changes the count of correct predictions by at most 1,
  provided ``predictions[i]`` depends only on row i (and on data already paid
  for, e.g. a privately trained model); dividing by the public ``n`` is
  post-processing (see the module docstring for ``n``).

  Args:
    key: a ``jax.random`` key, used once.
    predictions, labels: 1-D integer arrays of the same length (labels private).
    epsilon: Laplace epsilon, or Gaussian epsilon with ``delta``.
    rho: Gaussian zCDP rho (``mechanism="gaussian"``).
    delta: Gaussian delta (with ``epsilon``).
    mechanism: ``"laplace"`` (epsilon-DP, Dwork & Roth Thm 3.6) or ``"gaussian"``
      (rho-zCDP, Bun & Steinke 2016 Prop 1.6; or (epsilon, delta), Balle & Wang 2018).
    neighbouring: the relation of the event (``"replace_one"`` or ``"add_remove"``).
    num_examples: the public normaliser n (default ``len(labels)``, treated as public).
    unit: the privacy unit of the event.

  Returns:
    ``(score, event)``: the noisy accuracy (a float32 scalar; it may fall outside
    [0, 1]) and its DpEvent.
  """
  _validation.check_key(key)
  which, event = _noise_event(1.0, mechanism, epsilon, delta, rho, neighbouring, unit)
  predictions = _check_labels(predictions, "predictions")
  labels = _check_labels(labels, "labels")
  if predictions.shape != labels.shape:
    raise ValueError(f"predictions and labels must have the same shape, got "
                     f"{tuple(predictions.shape)} and {tuple(labels.shape)}.")
  n = _normaliser(num_examples, labels.shape[0])
  correct = jnp.sum(predictions == labels).astype(jnp.float32)
  score = _noisy_sum(key, correct, 1.0, which, epsilon, delta, rho) / jnp.float32(n)
  return score, event


def private_loss(key: jax.Array, losses: Any, *, bound: float, epsilon: float | None = None,
                 rho: float | None = None, delta: float | None = None,
                 mechanism: str = "laplace", neighbouring: str = "replace_one",
                 num_examples: int | None = None,
                 unit: str = events.DEFAULT_UNIT) -> tuple[jax.Array, events.DpEvent]:
  """A private mean validation loss: ``(Σ_i min(max(loss_i, 0), B) + noise) / n``.

  Per-row losses are clipped to ``[0, B]`` (B = ``bound``, public); a
  non-finite loss counts as ``B``. One validation row added, removed or
  replaced moves the clipped sum by at most ``B``: the sensitivity is ``B``
  (each ``loss_i`` must depend on row i only). Higher is worse: use
  ``-score`` as the selection score of :func:`~jaxdp.tuning.repeat_and_select`.

  Args:
    key: a ``jax.random`` key, used once.
    losses: 1-D array of per-row losses on the private validation rows.
    bound: B > 0, finite.
    epsilon, rho, delta, mechanism, neighbouring, num_examples, unit: as for
      :func:`private_accuracy` (sensitivity B instead of 1).

  Returns:
    ``(noisy mean loss (float32 scalar), event)``.
  """
  _validation.check_key(key)
  bound = _validation.check_positive(bound, "bound")
  which, event = _noise_event(bound, mechanism, epsilon, delta, rho, neighbouring, unit)
  if isinstance(losses, jax.core.Tracer):
    arr = losses
  else:
    arr = _validation.check_numeric_array(losses, "losses")
  if arr.ndim != 1 or arr.shape[0] < 1:
    raise ValueError(f"losses must be a non-empty 1-D array, got shape {tuple(arr.shape)}.")
  n = _normaliser(num_examples, arr.shape[0])
  arr = jnp.asarray(arr, jnp.float32)
  clipped = jnp.where(jnp.isnan(arr), bound, jnp.clip(arr, 0.0, bound))
  total = jnp.sum(clipped)
  score = _noisy_sum(key, total, bound, which, epsilon, delta, rho) / jnp.float32(n)
  return score, event


__all__ = ["private_accuracy", "private_loss"]
