"""Streaming correlated noise ``C^{-1} z`` as an optax transform (the MF mechanism's noise).

The matrix-factorization mechanism (Denisov et al. 2022, Section 3;
Choquette-Choo et al. 2023, "Multi-epoch matrix factorization mechanisms for
private machine learning", Eq. 1) releases ``C x + z`` for the stacked
clipped gradient sums ``x = (x_0, ..., x_{n-1})`` and ``z ~ N(0, s^2 I)``.
Multiplying by ``C^{-1}`` is post-processing, so training may instead use

  x_t + w_t,   w = C^{-1} z,

the gradient sum plus correlated noise. For lower-triangular Toeplitz C
(:mod:`.strategies`) ``w`` streams: row t of ``C w = z`` reads
``sum_{j=0}^{t} c_j w_{t-j} = z_t``, so

* :class:`~.strategies.BandMF` (``c_j = 0`` for ``j >= bands``):
  ``w_t = (z_t - sum_{j=1}^{bands-1} c_j w_{t-j}) / c_0``, keeping the last
  ``bands - 1`` noise vectors (state ``(bands - 1) x d``);
* :class:`~.strategies.BLT` (``c_0 = 1``, ``c_j = sum_i omega_i theta_i^(j-1)``):
  ``w_t = z_t - sum_i omega_i S_i`` then ``S_i <- theta_i S_i + w_t`` with
  ``S_i = sum_{s<t} theta_i^(t-1-s) w_s`` (state ``buffers x d``);
* :class:`~.strategies.ColumnNormalizedBanded` (general banded, time-varying):
  ``w_t = (z_t - sum_{j=1}^{bands-1} C[t, t-j] w_{t-j}) / C[t, t]``, the same
  circular buffer as BandMF with the coefficients of row t read from the
  strategy's table (state ``(bands - 1) x d``).

Scale. One participation of an example moves ``C x`` by ``C[:, t] g`` with
``||g|| <= S`` (the clip norm), so its sensitivity is ``S * s_1`` with
``s_1 = max_t ||C[:n, t]||`` (``= ||(c_0, ..., c_{n-1})||`` for Toeplitz C,
whose column 0 is the longest; 1 for a ColumnNormalizedBanded). ``z`` gets std ``sigma * S * s_1``: ``sigma`` is
the noise multiplier of ONE participation, as in DP-SGD. Multiple
participations and the sampling are accounted by
:mod:`.accounting` (``sigma`` there is the same number). With one band and
``c_0 = 1`` (``BandMF.dp_sgd()``) ``s_1 = 1``, ``w_t = z_t`` and this
transform draws exactly the noise of
:func:`jaxdp.dpsgd.noisy_aggregate` (same key splits, same sampler):
the update is bit-for-bit DP-SGD's.

The transform covers ``num_steps`` updates (the n of the sensitivity and the
accounting) and refuses more: an update with ``count >= num_steps`` raises
:class:`~jaxdp.errors.BudgetExceededError` at once when the count is concrete
(eager use), and fails at run time under ``jax.jit`` (a
``jax.debug.callback`` in the never-taken branch of a ``lax.cond``; its host
callback still costs 5-15% of a small step on a CPU).
:func:`~jaxdp.dpsgd.make_private` builds the transform with
``step_check="caller"``: its sampler refuses such steps on the host before they
are taken. Noise vectors are drawn with
:func:`jaxdp.mechanisms.gaussian_noise` (full float32 tails) and the
recursion runs in at least float32.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxdp import _validation
from jaxdp import mechanisms
from jaxdp.errors import BudgetExceededError
from jaxdp.dpsgd.correlated import strategies as _strategies
from jaxdp.dpsgd import transforms as _transforms


class CorrelatedNoiseState(NamedTuple):
  """State of :func:`correlated_noise`.

  ``key``: split every step (as in ``NoisyAggregateState``); ``count``: updates
  applied; ``history``: per leaf, the ``state_size`` vectors the recursion
  needs (BandMF: the last ``bands - 1`` noise vectors in a circular buffer,
  ``w_t`` in slot ``t mod (bands - 1)``; BLT: the buffers ``S_i``), in the
  compute dtype.
  """

  key: jax.Array
  count: jax.Array
  history: Any


def _check_strategy(strategy) -> None:
  if not isinstance(strategy, _strategies.Strategy):
    raise TypeError(f"strategy must be a jaxdp.dpsgd.correlated Strategy (BandMF, BLT or "
                    f"ColumnNormalizedBanded), got {type(strategy).__name__}.")


def single_participation_sensitivity(strategy, num_steps: int) -> float:
  """``s_1 = max_t ||C[:n, t]||_2`` (``||(c_0, ..., c_{n-1})||`` for a Toeplitz C)."""
  _check_strategy(strategy)
  n = strategy.check_num_steps(num_steps)
  return strategy.max_column_norm(n)


def noise_stddev(strategy, num_steps: int, noise_multiplier: float,
                 l2_sensitivity: float) -> float:
  """Std ``sigma * S * s_1`` of ``z`` (module docstring); ``sigma S`` for ``BandMF.dp_sgd()``."""
  base = _transforms.noise_stddev(noise_multiplier, l2_sensitivity)
  s1 = single_participation_sensitivity(strategy, num_steps)
  return base if s1 == 1.0 else base * s1


def _refuse_extra(count, num_steps: int) -> None:
  """Raises :class:`BudgetExceededError` if an update count reaches ``num_steps`` (host side)."""
  count = np.asarray(count)
  if np.any(count >= num_steps):
    raise BudgetExceededError(
        f"correlated_noise: update {int(np.max(count)) + 1} exceeds num_steps={num_steps}, the "
        "steps this strategy's noise, sensitivity and accounting cover.")


def _leaf_recursion(strategy, n: int):
  """``step_leaf(z, hist, t) -> (w_t, new history)``: one leaf's ``w = C^{-1} z`` recursion.

  The weighted sums over the history are ``tensordot`` (one pass over the
  state; an elementwise product then a reduction is several times slower on
  CPU). BandMF keeps a circular buffer: slot ``s`` holds the newest
  ``w_{t'}`` with ``t' = s mod (bands - 1)``, whose lag at step t is
  ``((t - 1 - s) mod (bands - 1)) + 1``, and ``w_t`` overwrites slot
  ``t mod (bands - 1)`` (the vector of lag ``bands``, no longer needed); with
  the state donated to the jitted step the update is in place. The general
  banded strategy reads ``C[t, t - lag]`` from its band table; BLT keeps one
  buffer per ``theta``.
  """
  size = strategy.state_size
  if isinstance(strategy, _strategies.ColumnNormalizedBanded):
    table = strategy.band_table(n)  # table[t, r] = C[t + r, t]

    def general(z, hist, t):
      diag = jnp.asarray(table[:, 0], z.dtype)[t]
      if size == 0:
        return z / diag, hist
      lag = jnp.mod(t - 1 - jnp.arange(size), size) + 1
      # C[t, t - lag] = table[t - lag, lag]; a slot not yet written (t < lag) holds zeros.
      coef = jnp.asarray(table, z.dtype)[jnp.maximum(t - lag, 0), lag]
      w = (z - jnp.tensordot(coef, hist, axes=1)) / diag
      start = (jnp.mod(t, size),) + (0,) * z.ndim
      return w, jax.lax.dynamic_update_slice(hist, w[None], start)
    return general
  if isinstance(strategy, _strategies.BandMF):
    c0 = float(strategy.coefs[0])
    lagged = np.asarray(strategy.coefs[1:], np.float64)  # c_1 .. c_{bands-1}

    def banded(z, hist, t):
      if size == 0:
        return (z if c0 == 1.0 else z / jnp.asarray(c0, z.dtype)), hist
      coef = jnp.asarray(lagged, z.dtype)[jnp.mod(t - 1 - jnp.arange(size), size)]
      w = z - jnp.tensordot(coef, hist, axes=1)
      if c0 != 1.0:
        w = w / jnp.asarray(c0, z.dtype)
      start = (jnp.mod(t, size),) + (0,) * z.ndim
      return w, jax.lax.dynamic_update_slice(hist, w[None], start)
    return banded
  theta = np.asarray(strategy.theta, np.float64)
  omega = np.asarray(strategy.omega, np.float64)

  def blt(z, hist, t):
    del t
    if size == 0:
      return z, hist
    th = jnp.asarray(theta, z.dtype).reshape((size,) + (1,) * z.ndim)
    w = z - jnp.tensordot(jnp.asarray(omega, z.dtype), hist, axes=1)
    return w, th * hist + w[None]
  return blt


def correlated_noise(
    strategy,
    num_steps: int,
    noise_multiplier: float,
    l2_sensitivity: float,
    expected_batch_size: float,
    key: jax.Array,
    *,
    step_check: str = "callback",
) -> optax.GradientTransformation:
  """Adds the t-th row of ``C^{-1} z`` to a clipped gradient SUM and divides by ``q N``.

  The correlated-noise counterpart of :func:`jaxdp.dpsgd.noisy_aggregate`
  (same arguments plus the strategy and n): ``update(grad_sum, state)``
  returns ``(grad_sum + w_t) / expected_batch_size`` with ``w = C^{-1} z``,
  ``z ~ N(0, (sigma S s_1)^2 I)`` (module docstring; Denisov et al. 2022;
  Choquette-Choo et al. 2023 Eq. 1). Chain it before any optax optimiser.
  Memory: ``strategy.state_size`` extra copies of the parameters. In a jitted
  step of your own, donate the optimiser state (``jax.jit(step,
  donate_argnums=...)``): BandMF then updates its history in place instead of
  copying it every step (``make_private`` does this).

  Args:
    strategy: a :class:`~.strategies.Strategy` (``BandMF``, ``BLT`` or
      ``ColumnNormalizedBanded``).
    num_steps: n, the number of updates the run applies (and the sensitivity
      covers); more are refused (module docstring).
    noise_multiplier: sigma >= 0 of one participation.
    l2_sensitivity: the clipped sum's sensitivity S (the clip norm).
    expected_batch_size: the data-independent divisor ``q N``.
    key: ``jax.random`` key for the noise; never reuse it elsewhere.
    step_check: how a traced update beyond ``num_steps`` is refused.
      ``"callback"`` (default): a ``jax.debug.callback`` raises
      :class:`~jaxdp.errors.BudgetExceededError` when it runs; the callback
      costs a host round trip every step (measured 5-15% of a small jitted
      step on a CPU). ``"caller"``: no in-graph check; the caller guarantees at
      most ``num_steps`` updates before any is computed, as
      :func:`~jaxdp.dpsgd.make_private`'s sampler does on the host. A concrete
      (eager) count is checked either way.
  """
  _check_strategy(strategy)
  if step_check not in ("callback", "caller"):
    raise ValueError(f"step_check must be 'callback' or 'caller', got {step_check!r}.")
  n = strategy.check_num_steps(num_steps)
  std = noise_stddev(strategy, n, noise_multiplier, l2_sensitivity)
  denom = _validation.check_positive(expected_batch_size, "expected_batch_size")
  _validation.check_key(key)
  size = strategy.state_size
  step_leaf = _leaf_recursion(strategy, n)

  def init_fn(params):
    history = jax.tree.map(
        lambda p: jnp.zeros((size,) + tuple(jnp.shape(p)),
                            _transforms._compute_dtype(jnp.result_type(p))), params)  # pylint: disable=protected-access
    return CorrelatedNoiseState(key=key, count=jnp.zeros((), jnp.int32), history=history)

  refuse_extra = functools.partial(_refuse_extra, num_steps=n)

  def update_fn(updates, state, params=None):
    del params
    if isinstance(state.count, jax.core.Tracer):
      if step_check == "callback":
        jax.lax.cond(state.count >= n, lambda c: jax.debug.callback(refuse_extra, c),
                     lambda c: None, state.count)
    else:
      refuse_extra(state.count)
    next_key, noise_key = jax.random.split(state.key)
    leaves, treedef = jax.tree.flatten(updates)
    hists = treedef.flatten_up_to(state.history)
    keys = jax.random.split(noise_key, max(len(leaves), 1))
    out, new_hist = [], []
    for g, k, h in zip(leaves, keys, hists):
      dtype = _transforms._compute_dtype(g.dtype)  # pylint: disable=protected-access
      z = mechanisms.gaussian_noise(k, g.shape, _transforms._round_up(std, dtype), dtype)  # pylint: disable=protected-access
      w, h = step_leaf(z, h, state.count)
      out.append((g.astype(dtype) + w) / denom)
      new_hist.append(h)
    return (jax.tree.unflatten(treedef, out),
            CorrelatedNoiseState(next_key, state.count + 1, jax.tree.unflatten(treedef, new_hist)))

  return optax.GradientTransformation(init_fn, update_fn)


__all__ = ["CorrelatedNoiseState", "correlated_noise", "noise_stddev",
           "single_participation_sensitivity"]
