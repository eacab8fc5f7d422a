"""Private selection among candidates scored on private held-out data.

Hyper-parameter tuning scores ``C`` candidates (models trained on one part of
the private training set, or predictors answering queries from it) on held-out
rows of the SAME private training set and keeps the best. The argmax of those
scores is a function of the held-out rows: releasing it (or anything trained
with the winning hyper-parameters) without noise is a release outside every
charged event. :func:`private_argmax` replaces ``np.argmax`` by the
exponential mechanism (McSherry & Talwar 2007), ``eps``-DP with respect to the
held-out rows for the score sensitivity stated below.

Sensitivity of held-out accuracy scores
---------------------------------------
Neighbouring relation: replace-one on the training set (one row ``(x_j, y_j)``
at a fixed position is replaced by any other row; the number of rows ``n_val``
held out, and which positions are held out, are public: a permutation drawn
from a public seed).

Score of candidate ``c``: the mean accuracy over the ``n_val`` held-out rows,
averaged over ``V`` independent draws ``s`` of the candidate's randomness,

  ``u_c(D) = (1/V) sum_s (1/n_val) sum_i 1[h_{c,s}(x_i) = y_i]``.

Fix the data outside the held-out rows and the candidates' randomness (the
noise of their releases, drawn from keys whose law does not depend on the
data). The prediction ``h_{c,s}(x_i)`` then depends on the held-out rows only
through ``x_i`` itself (a trained model is a function of the OTHER rows; a
private-prediction answer to query ``i`` uses query ``i`` and its own noise),
so replacing row ``j`` changes only the ``j``-th indicator of every draw: each
draw's accuracy moves by at most ``1/n_val`` and so does their average over
``V`` draws (averaging does not increase the per-row sensitivity):

  ``Delta u = max_{D ~ D', c} |u_c(D) - u_c(D')| <= 1/n_val``.

The scores are NOT monotone: one held-out row can be classified correctly by
candidate ``a`` only in ``D`` and by every other candidate only in ``D'``, so
``u_a`` drops by ``1/n_val`` while all the others rise by ``1/n_val``. The
``beta Delta`` bound of report-noisy-max for monotone scores (Dwork & Roth
2014, Claim 3.9 and Section 3.4) therefore does not apply, and we use the
exponential mechanism with the general bound: output ``c`` with probability
``∝ exp(beta u_c)``, ``beta = epsilon / (2 Delta u)``, is ``epsilon``-DP
(McSherry & Talwar 2007, Theorem 6; Dwork & Roth 2014, Theorem 3.10; the
factor 2 is needed, :mod:`jaxdp.mechanisms.exponential` shows it is tight as
``C`` grows). It is sampled by Gumbel-max, i.e. report-noisy-max with Gumbel
noise of scale ``1/beta`` (:func:`jaxdp.mechanisms.exponential_mechanism`);
nothing is sampled here.

Equivalently (and without rounding the means in floating point) pass the
integer numbers of correct answers summed over the ``V`` draws,
``k_c = n_val V u_c``, with ``sensitivity = V``: ``beta k_c`` is the same for
both, so the law of the output is identical.

Composition with the candidates' releases (basic composition, Dwork & Roth
2014 Theorem 3.16)
----------------------------------------------------------------------------
A tuning protocol that trains ``C`` candidates ``V`` times each at
``(eps_r, delta_r)`` on the rows that are not held out, selects with
:func:`private_argmax` at ``eps_s``, and releases one final model trained on
ALL rows at ``(eps_r, delta_r)`` is ``(eps_s + (C V + 1) eps_r, (C V + 1)
delta_r)``-DP under replace-one (the selection is pure DP: it takes no share
of ``delta``). For a total ``(eps, delta)`` it suffices to take ``eps_s =
eps_r = eps / (C V + 2)`` and ``delta_r = delta / (C V + 1)`` (``experiments/
tradeoffs.py`` with ``account_selection=True``). This is conservative: a row is
either held out or not, so the candidates and the selection could be composed
in parallel (McSherry 2009, PINQ, Theorem 4); we do not rely on it.
The candidates' intermediate releases are never published; only the selected
index and the final release are.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from jaxdp import _validation
from jaxdp.accounting import events as _events
from jaxdp.mechanisms import _common
from jaxdp.mechanisms import exponential as _exponential


def _beta(epsilon: float, sensitivity: float) -> float:
  """``beta = epsilon / (2 Delta)``: one exponential-mechanism draw is ``epsilon``-DP.

  Dwork & Roth 2014, Theorem 3.10 (non-monotone scores: the factor 2 is kept).
  """
  return _exponential.exponential_mechanism_beta(epsilon, sensitivity)


def _check_privacy(epsilon: Any, sensitivity: Any) -> tuple[float, float]:
  _common.require_static(epsilon, "epsilon")
  _common.require_static(sensitivity, "sensitivity")
  eps = _validation.check_epsilon(epsilon, "epsilon")
  sens = _validation.check_positive(sensitivity, "sensitivity")
  return eps, sens


def private_argmax(key: jax.Array, scores: Any, *, sensitivity: float,
                   epsilon: float) -> jax.Array:
  """An ``epsilon``-DP index of a high score: the exponential mechanism.

  Returns ``c`` with probability ``exp(beta scores_c) / sum_j exp(beta
  scores_j)``, ``beta = epsilon / (2 sensitivity)`` (McSherry & Talwar 2007;
  Dwork & Roth 2014, Theorem 3.10), sampled by
  :func:`jaxdp.mechanisms.exponential_mechanism` (Gumbel-max). For the mean
  held-out accuracy of each candidate over ``n_val`` private rows, replace-one
  neighbours, ``sensitivity = 1/n_val`` (see the module docstring: averaging
  over independent draws keeps it, and the scores are not monotone).

  Args:
    key: a ``jax.random`` key, used once.
    scores: the candidates' scores, shape ``(C,)``, ``C >= 1``, finite (NaN
      and ``±inf`` are refused when concrete; traced scores with such entries
      give ``-1``).
    sensitivity: ``Delta > 0``: the largest change of any one score between
      neighbouring datasets (concrete scalar).
    epsilon: ``0 < epsilon < inf`` (concrete scalar).

  Returns:
    An int32 scalar: the selected index. Spend :func:`private_argmax_event`
    for it.

  Raises:
    ValueError / TypeError naming the argument, before any noise is drawn.
  """
  _common.check_key(key)
  eps, sens = _check_privacy(epsilon, sensitivity)
  if not hasattr(scores, "shape"):
    scores = jnp.asarray(scores)
  if len(scores.shape) != 1 or scores.shape[0] < 1:
    raise ValueError(f"scores must be a 1-D array with at least one candidate, got shape "
                     f"{tuple(scores.shape)}.")
  _common.check_data(scores, "scores")
  return _exponential.exponential_mechanism(key, scores, _beta(eps, sens))


def private_argmax_event(*, sensitivity: float, epsilon: float,
                         neighbouring: str = "replace_one",
                         unit: str = "example") -> _events.ExponentialMechanismDpEvent:
  """DpEvent of one :func:`private_argmax` draw (``epsilon``-DP).

  ``ExponentialMechanismDpEvent(beta = epsilon/(2 Delta), Delta)``: pure
  ``2 beta Delta = epsilon`` and ``(beta Delta)^2/2 = epsilon^2/8``-zCDP by
  bounded range (Cesar & Rogers 2021). ``neighbouring`` defaults to
  ``"replace_one"``, the relation of the held-out accuracy derivation in the
  module docstring; pass the relation your ``sensitivity`` was derived for.
  """
  eps, sens = _check_privacy(epsilon, sensitivity)
  return _exponential.exponential_mechanism_event(_beta(eps, sens), sens,
                                                  neighbouring=neighbouring, unit=unit)
