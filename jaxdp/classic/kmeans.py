r"""Differentially private k-means (paper 004, Sec. 3.4, Eqs. 32-33).

Paper 004 = ``../shared/papers/004_dp_machine_learning_survey.md``. Two methods,
both needing declared per-feature bounds ``[l_j, u_j]`` (a missing bound is an
error; out-of-bound values raise unless ``clip=True``).

**DP-Lloyd** (Blum, Dwork, McSherry, Nissim 2005, "SuLQ", Sec. 5; the
per-iteration release of Su et al. 2016). Initial centroids are data-independent:
by default uniform in the central half of the box, ``[l + (u-l)/4, u - (u-l)/4]``
(``init="central"``; like the sphere-packing initialisation of Su et al. 2016,
which places the centres at least a quarter range inside the box: data on the
faces of a box of one-hot or scaled features are closer to its centre than to
random corners), uniform in the whole box (``init="uniform"``), or given
(public). Each of ``T``
iterations assigns points to their nearest current centroid and releases, for
*every* cluster ``k`` (empty ones included, so an empty cluster is not a
noiseless signal):

* the count ``n_k`` — per-record contribution ``e_k``, ``||.||_1 = 1``;
* the sum ``S_k = sum_{i in k} (x_i - m)``, ``m`` the box midpoint —
  ``||x - m||_1 <= R_1 = sum_j (u_j - l_j)/2``.

With the per-iteration budget ``epsilon_t = epsilon / T`` split as
``f epsilon_t`` (counts) and ``(1 - f) epsilon_t`` (sums), they get
``Lap(Delta_count / (f epsilon_t))`` and ``Lap(Delta_sum / ((1-f) epsilon_t))``
with ``Delta = B`` (add/remove) or ``2B`` (replace-one), ``B = 1`` and
``R_1``. Basic composition (Dwork & Roth Thm. 3.16) over the two releases and
the ``T`` iterations gives exactly ``epsilon``. The split ``f`` is any public
number in (0, 1); the default ``"auto"`` is Su et al. (2016, Sec. 4.2)'s
``epsilon_sum / epsilon_count = cbrt(4 d rho^2)``, ``rho = 0.225``, i.e.
``f = 1 / (1 + cbrt(4 d rho^2))`` (0.31 at ``d = 51``): the centroid
``S_k / n_k`` is more sensitive to the ``d`` noisy sum coordinates than to the
one noisy count, so the sums get more of the budget (diffprivlib intends the
same split but swaps the two shares). The new centroid is
``m + S~_k / n~_k`` clipped to the box, kept at its previous value when
``n~_k < 1`` (post-processing). (diffprivlib 0.6.6 spends
``eps (1 + d cbrt(4 d rho^2))``-style shares per iteration and skips empty
clusters without noise; here the per-iteration spend is ``epsilon / T``,
checked by a test.)

**Sample and aggregate** (Nissim, Raskhodnikova, Smith 2007, Sec. 4; paper 004
Eq. 33). Every record is assigned to one of ``q`` blocks independently and
uniformly (a data-independent assignment, so adding, removing or replacing a
record changes one block only). Non-private Lloyd runs on every block
(vmapped) from ``K`` distinct rows of the block chosen at random; a block with
``m < K`` rows fills its remaining ``K - m`` initial centroids with PUBLIC points
(uniform in the central half of the box, from the block's own key), never with
rows of other blocks, so a block's output is a function of its own rows and of
the data-independent randomness only. The block's centroids are clipped to the
box and sorted by their projection on a fixed random direction (a function of
the block alone), and the aggregate is the *mean* of the ``q`` block outputs.
One block changing moves the mean by at most ``Delta_1 = K sum_j (u_j - l_j) / q`` in L1 norm under
both relations, so ``mean + Lap(Delta_1 / epsilon)`` is ``epsilon``-DP. (The
survey describes a "center of the smallest ball" aggregator whose sensitivity
NRS bound through smooth sensitivity; the mean with its global sensitivity is
the simpler aggregator of Smith 2011, with a guarantee that holds for every
dataset.) ``num_blocks > n`` and ``n_clusters > n`` are refused (``ValueError``)
before anything is spent.

Noise (``noise``, :mod:`jaxdp.classic._common`). ``"discrete"`` (default): the
discrete Laplace mechanism on public grids (Canonne, Kamath & Steinke 2020,
``CKS``, Algorithm 2), each release ``eps``-DP at its share of the budget and
charged as ``PureDpEvent`` (:func:`jaxdp.mechanisms.discrete_laplace_mechanism_event`),
so both methods are ``epsilon``-DP again by the same composition:

* DP-Lloyd counts are integers on ``1 Z``: integer noise of scale
  ``t/s >= Delta_count/(f epsilon_t)`` is added exactly (rounded sensitivity
  ``Delta_count`` itself, the continuous scale);
* DP-Lloyd centred sums (``K d`` numbers, ``Delta_sum = R_1`` or ``2 R_1``) are
  rounded to ``g Z`` by :func:`jaxdp.mechanisms.discrete_laplace_mechanism`,
  where a record changes ``c = d`` coordinates (add/remove: its cluster's row) or
  ``c = 2d`` (replace-one: two rows), so ``K_1 = ceil(Delta_sum/g) + (c - 1)``
  grid steps and the noise has scale ``t/s >= K_1/((1 - f) epsilon_t)``;
  ``g`` is the largest power of two ``<= Delta_sum/(c 2^10) = R_1/(d 2^10)``
  (the mean half-width of the box over ``2^10``;
  :func:`jaxdp.classic._common.sum_grid_step`, doubled only if the noise would
  exceed ``2^19`` grid steps), a relative noise cost below ``2^-10``. The sums
  are at most ``n max_j (u_j - l_j)/2`` in absolute value, which must stay
  below ``(2^30 - 64) g`` (else ``ValueError``);
* the sample-and-aggregate mean (``K d`` numbers, all of which one block can
  move: ``c = K d``) is rounded to ``g Z`` with ``g`` the largest power of two
  ``<= Delta_1/(K d 2^10) = sum_j (u_j - l_j)/(q d 2^10)``, and gets noise of
  scale ``t/s >= K_1/epsilon`` grid steps, ``K_1 = ceil(Delta_1/g) + (K d - 1)``.
  Clipping to the box afterwards maps the grid into ``(g Z ∩ [l, u]) ∪ {l, u}``,
  still a data-independent set.

``"continuous"``: float ``Lap`` noise of the scales above (``Delta/eps``) and
``LaplaceDpEvent`` events, as in earlier releases.

Floating point. The released sums (DP-Lloyd's per-cluster counts and sums, the
mean of the block outputs) are accumulated in float64 (a scoped
``jax.enable_x64``) and the noise (grid integers, or float32 draws) is added in float64. In float32 the
rounding of a sum of ``n = 2e5`` terms made the same-key difference of two
neighbouring releases exceed the sensitivity by about 0.1%; in float64 any
summation order errs by at most ``gamma_n sum_i |f(x_i)|``,
``gamma_n = n u / (1 - n u)``, ``u = 2^-53`` (Higham 2002, Eq. 4.4 and Sec.
4.2): on both neighbours together a worst-case excess of ``2 gamma_n n B``
(``B`` the per-record bound), below ``1e-5 Delta`` for ``n <= 2e5``, and of
order ``sqrt(n) u`` in practice; the float lattice of the output itself
remains (``docs/sharp_edges.md``).
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from sklearn.base import BaseEstimator, ClusterMixin

from jaxdp import _estimator_checks as checks
from jaxdp import _keys
from jaxdp import _validation
from jaxdp.accounting import events
from jaxdp.classic import _common
from jaxdp.mechanisms import discrete
from jaxdp.mechanisms import laplace_noise

METHODS = ("lloyd", "sample_aggregate")


class LloydCalibration(NamedTuple):
  """Per-iteration calibration of DP-Lloyd (scales in output units).

  ``sum_grid_step`` and ``sum_changed`` (the coordinates of the sums one record
  changes) are those of ``noise="discrete"`` (module docstring).
  """
  iterations: int
  epsilon_per_iteration: float
  count_epsilon: float
  sum_epsilon: float
  count_sensitivity: float
  sum_sensitivity: float
  count_scale: float
  sum_scale: float
  neighbouring: str
  noise: str = "continuous"
  sum_grid_step: float = 0.0
  sum_changed: int = 0


SU_RHO = 0.225
"""Su et al. (2016)'s coordinate normalisation constant of the count/sum budget split."""


def auto_count_fraction(dim: int, rho: float = SU_RHO) -> float:
  """Su et al. (2016)'s counts' share of an iteration's budget: ``1/(1 + cbrt(4 d rho^2))``."""
  return 1.0 / (1.0 + float(np.cbrt(4.0 * dim * rho ** 2)))


def _check_public_bounds(lower: Any, upper: Any) -> tuple[np.ndarray, np.ndarray]:
  """Declared bounds (scalars or per feature) with ``lower < upper``; else ValueError."""
  lo = _validation.check_finite_array(lower, "lower") if lower is not None else None
  hi = _validation.check_finite_array(upper, "upper") if upper is not None else None
  if lo is None or hi is None:
    return _common.check_bounds(lower, upper, 1, "lower/upper")
  try:
    dim = int(np.broadcast(np.atleast_1d(lo), np.atleast_1d(hi)).size)
  except ValueError as err:
    raise ValueError(f"lower and upper must have the same number of features, got shapes "
                     f"{np.shape(lo)} and {np.shape(hi)}.") from err
  if np.atleast_1d(lo).ndim != 1 or np.atleast_1d(hi).ndim != 1:
    raise ValueError("lower and upper must be scalars or 1-D per-feature bounds.")
  return _common.check_bounds(lo, hi, dim, "lower/upper")


def lloyd_calibration(*, lower: Any, upper: Any, epsilon: float, iterations: int,
                      count_fraction: Any = "auto",
                      neighbouring: str = "replace_one",
                      noise: str = "discrete") -> LloydCalibration:
  """Noise scales of DP-Lloyd (module docstring); ``epsilon = inf`` gives zero noise.

  ``count_fraction``: the counts' share of each iteration's budget, in (0, 1), or ``"auto"``
  (:func:`auto_count_fraction` of the dimension of the bounds). ``noise``: as
  :func:`dp_lloyd` (``"discrete"``: the scales are ``t/s`` times the grid step).
  """
  noise = _common.check_noise(noise)
  eps = _validation.check_epsilon(epsilon, "epsilon", allow_inf=True)
  t = _validation.check_positive_int(iterations, "iterations")
  lo, hi = _check_public_bounds(lower, upper)
  if isinstance(count_fraction, str):
    if count_fraction != "auto":
      raise ValueError(f"count_fraction must be a number in (0, 1) or 'auto', got "
                       f"{count_fraction!r}.")
    count_fraction = auto_count_fraction(lo.shape[0])
  f = _validation._as_float(count_fraction, "count_fraction")
  if not 0.0 < f < 1.0:
    raise ValueError(f"count_fraction must lie in (0, 1), got {count_fraction!r}.")
  rel = _common.check_relation(neighbouring)
  r1 = float(np.sum(hi - lo) / 2.0)
  d_count = _common.sum_sensitivity(1.0, rel)
  d_sum = _common.sum_sensitivity(r1, rel)
  eps_t = eps / t
  e_c, e_s = f * eps_t, (1.0 - f) * eps_t
  changed = lo.shape[0] * (1 if rel == events.ADD_REMOVE else 2)
  if math.isinf(eps):
    return LloydCalibration(t, eps_t, e_c, e_s, d_count, d_sum, 0.0, 0.0, rel, noise, 0.0, changed)
  if noise == "continuous":
    return LloydCalibration(t, eps_t, e_c, e_s, d_count, d_sum, d_count / e_c, d_sum / e_s, rel,
                            noise, 0.0, changed)
  g = _common.sum_grid_step(d_sum, e_s, changed)
  tc, sc = _common.discrete_count_parameters(d_count, e_c)
  ts, ss = discrete.discrete_laplace_scale(d_sum, e_s, g, changed)
  return LloydCalibration(t, eps_t, e_c, e_s, d_count, d_sum, tc / sc, ts / ss * g, rel, noise,
                          g, changed)


def lloyd_iteration_event(cal: LloydCalibration) -> events.DpEvent:
  """The event of ONE DP-Lloyd iteration: ``epsilon / T`` (count and sum releases).

  ``PureDpEvent`` s (``noise="discrete"``, :func:`jaxdp.mechanisms.discrete_laplace_mechanism_event`)
  or ``LaplaceDpEvent`` s (``"continuous"``).
  """
  if math.isinf(cal.epsilon_per_iteration):
    return events.NonPrivateDpEvent()
  if cal.noise == "discrete":
    return events.ComposedDpEvent([
        # counts: integers on 1 Z, no rounding (changed=1 in the rounded sensitivity)
        discrete.discrete_laplace_mechanism_event(
            cal.count_sensitivity, cal.count_epsilon, 1.0, max_changed_coordinates=1,
            neighbouring=cal.neighbouring),
        discrete.discrete_laplace_mechanism_event(
            cal.sum_sensitivity, cal.sum_epsilon, cal.sum_grid_step,
            max_changed_coordinates=cal.sum_changed, neighbouring=cal.neighbouring)])
  return events.ComposedDpEvent([
      events.LaplaceDpEvent(noise_multiplier=cal.count_scale / cal.count_sensitivity,
                            neighbouring=cal.neighbouring),
      events.LaplaceDpEvent(noise_multiplier=cal.sum_scale / cal.sum_sensitivity,
                            neighbouring=cal.neighbouring)])


def lloyd_event(cal: LloydCalibration) -> events.DpEvent:
  """``T`` self-composed iterations."""
  ev = lloyd_iteration_event(cal)
  return ev if cal.iterations == 1 else events.SelfComposedDpEvent(ev, cal.iterations)


def _assign(x, centroids):
  d2 = jnp.sum(x * x, 1, keepdims=True) - 2 * x @ centroids.T + jnp.sum(centroids ** 2, 1)[None]
  return jnp.argmin(d2, axis=1)


def kmeans_cost(x: Any, centroids: Any) -> jax.Array:
  """Eq. 32: ``sum_i min_k ||x_i - c_k||^2``."""
  x = jnp.asarray(x, jnp.float32)
  c = jnp.asarray(centroids, jnp.float32)
  d2 = jnp.sum(x * x, 1, keepdims=True) - 2 * x @ c.T + jnp.sum(c * c, 1)[None]
  return jnp.sum(jnp.maximum(jnp.min(d2, axis=1), 0.0))


def lloyd_statistics(x, centroids, mid):
  """Exact counts ``(K,)`` and centred sums ``(K, d)`` of one Lloyd step, in ``x.dtype``."""
  k = centroids.shape[0]
  onehot = jax.nn.one_hot(_assign(x, centroids), k, dtype=x.dtype)
  return onehot.sum(0), onehot.T @ (x - mid)


def lloyd_discrete_parameters(cal: LloydCalibration) -> tuple | None:
  """The static parameters of the discrete release of one iteration (None: continuous).

  ``((t, s) of the counts, Delta_sum, sum epsilon, g, c)`` (module docstring).
  """
  if cal.noise != "discrete" or math.isinf(cal.epsilon_per_iteration):
    return None
  return (_common.discrete_count_parameters(cal.count_sensitivity, cal.count_epsilon),
          float(cal.sum_sensitivity), float(cal.sum_epsilon), float(cal.sum_grid_step),
          int(cal.sum_changed))


def noisy_lloyd_step(key, x, centroids, mid, count_scale, sum_scale, discrete_params=None):
  """One DP-Lloyd release: ``(n~ (K,), S~ (K, d))`` (traced; scales are static floats).

  ``discrete_params`` (:func:`lloyd_discrete_parameters`, static): integer counts plus
  discrete Laplace integers and the sums by :func:`jaxdp.mechanisms.discrete_laplace_mechanism`
  on their grid; None: float Laplace noise of ``count_scale`` and ``sum_scale``.
  """
  counts, sums = lloyd_statistics(x, centroids, mid)
  k1, k2 = jax.random.split(key)
  if discrete_params is not None:
    (t, s), sens, eps, grid, changed = discrete_params
    z = discrete.discrete_laplace_noise(k1, counts.shape, t, s).astype(counts.dtype)
    return (counts + z, discrete.discrete_laplace_mechanism(
        k2, sums, sens, eps, grid, max_changed_coordinates=changed))
  # Noise drawn by the float32 samplers, added in the statistics' dtype (float64 when released).
  return (counts + laplace_noise(k1, counts.shape, count_scale).astype(counts.dtype),
          sums + laplace_noise(k2, sums.shape, sum_scale).astype(sums.dtype))


@functools.partial(jax.jit, static_argnames=("iterations", "count_scale", "sum_scale",
                                             "discrete_params"))
def _dp_lloyd_core(key, x, init, lo, hi, *, iterations, count_scale, sum_scale,
                   discrete_params=None):
  mid = (lo + hi) / 2.0

  def step(c, k):
    n_t, s_t = noisy_lloyd_step(k, x, c, mid, count_scale, sum_scale, discrete_params)
    new = jnp.clip(mid + s_t / jnp.maximum(n_t, 1.0)[:, None], lo, hi)
    return jnp.where((n_t >= 1.0)[:, None], new, c), None

  c, _ = jax.lax.scan(step, init, jax.random.split(key, iterations))
  return c


INITS = ("central", "uniform")


def _uniform_init(key, k, lo, hi, inset=0.0):
  """``k`` points uniform in ``[lo + inset (hi - lo), hi - inset (hi - lo)]`` (data-independent)."""
  u = jax.random.uniform(key, (k, lo.shape[0]), jnp.float32)
  width = jnp.asarray(hi - lo, jnp.float32)
  return jnp.asarray(lo, jnp.float32) + width * (inset + u * (1.0 - 2.0 * inset))


def dp_lloyd(key: jax.Array, x: Any, *, n_clusters: int, epsilon: float, lower: Any,
             upper: Any, iterations: int = 5, count_fraction: Any = "auto", init: Any = "central",
             clip: bool = False, neighbouring: str = "replace_one",
             accountant: Any = None, noise: str = "discrete") -> tuple[np.ndarray, events.DpEvent]:
  """``epsilon``-DP Lloyd's algorithm (module docstring).

  Args:
    key: a ``jax.random`` key, used once (split per iteration and for the init).
    x: ``(n, d)`` data inside ``[lower, upper]``.
    n_clusters: ``K``.
    epsilon: total privacy parameter, ``epsilon / iterations`` per iteration.
    lower, upper: declared bounds (required).
    iterations: ``T``.
    count_fraction: share of each iteration's budget spent on the counts, or ``"auto"``
      (Su et al. 2016; :func:`auto_count_fraction`).
    init: ``"central"`` (uniform in the central half of the box), ``"uniform"`` (in the
      whole box), or PUBLIC initial centroids ``(K, d)``.
    clip: clip out-of-bound values instead of raising.
    neighbouring: ``"replace_one"`` or ``"add_remove"``.
    accountant: optional accountant/budget, spent before release.
    noise: ``"discrete"`` (default: counts and sums on public grids, module docstring) or
      ``"continuous"`` (float Laplace).

  Returns:
    ``(centroids (K, d), event)``.
  """
  _validation.check_key(key)
  noise = _common.check_noise(noise)
  arr, lo, hi = _common.check_bounded_data(x, lower, upper, clip=clip)
  k = _validation.check_positive_int(n_clusters, "n_clusters")
  cal = lloyd_calibration(lower=lo, upper=hi, epsilon=epsilon, iterations=iterations,
                          count_fraction=count_fraction, neighbouring=neighbouring, noise=noise)
  discrete_params = lloyd_discrete_parameters(cal)
  if discrete_params is not None:
    _common.check_grid_range(arr.shape[0] * float(np.max(hi - lo)) / 2.0, cal.sum_grid_step,
                             "a cluster's centred sum (n max_j (u_j - l_j)/2)")
  event = lloyd_event(cal)
  _common.spend(accountant, event)
  k_init, k_run = jax.random.split(key)
  if init is None or isinstance(init, str):
    if init is not None and init not in INITS:
      raise ValueError(f"init must be one of {INITS} or a (K, d) array, got {init!r}.")
    c0 = _uniform_init(k_init, k, lo, hi, inset=0.0 if init == "uniform" else 0.25)
  else:
    c0 = _validation.check_finite_array(init, "init")
    if c0.shape != (k, arr.shape[1]):
      raise ValueError(f"init must have shape ({k}, {arr.shape[1]}), got {c0.shape}.")
    c0 = jnp.asarray(np.clip(c0, lo, hi), jnp.float32)
  with jax.enable_x64(True):  # float64 sums (module docstring, "Floating point")
    out = _dp_lloyd_core(k_run, jnp.asarray(arr, jnp.float64), jnp.asarray(c0, jnp.float64),
                         jnp.asarray(lo, jnp.float64), jnp.asarray(hi, jnp.float64),
                         iterations=cal.iterations, count_scale=float(cal.count_scale),
                         sum_scale=float(cal.sum_scale), discrete_params=discrete_params)
    return np.asarray(out, np.float64), event


# ---------------------------------------------------------------- sample and aggregate


def sample_aggregate_sensitivity(*, lower: Any, upper: Any, n_clusters: int,
                                 num_blocks: int) -> float:
  """``Delta_1 = K sum_j (u_j - l_j) / q`` of the mean of ``q`` block outputs (both relations)."""
  lo, hi = _check_public_bounds(lower, upper)
  k = _validation.check_positive_int(n_clusters, "n_clusters")
  q = _validation.check_positive_int(num_blocks, "num_blocks")
  return float(k * np.sum(hi - lo) / q)


def _block_init(key, x, w, k, lo, hi):
  """``k`` initial centroids of one block from its own rows (``w > 0``) and public points.

  ``min(k, m)`` distinct rows of the block (``m`` rows) chosen uniformly at
  random (Gumbel top-k), and for the remaining ``k - m`` slots of an under-full
  block PUBLIC points uniform in the central half of the box (never rows of
  another block, which would let one record move several block outputs).
  """
  k_rows, k_public = jax.random.split(key)
  g = jax.random.gumbel(k_rows, x.shape[:1], x.dtype)
  vals, idx = jax.lax.top_k(jnp.where(w > 0, g, -jnp.inf), k)
  public = _uniform_init(k_public, k, lo, hi, inset=0.25).astype(x.dtype)
  return jnp.where(jnp.isfinite(vals)[:, None], x[idx], public)


def _weighted_lloyd(key, x, w, k, iterations, lo, hi):
  """Non-private Lloyd on the rows with weight ``w > 0`` from :func:`_block_init`."""
  c0 = _block_init(key, x, w, k, lo, hi)

  def step(c, _):
    onehot = jax.nn.one_hot(_assign(x, c), k, dtype=x.dtype) * w[:, None]
    n = onehot.sum(0)
    new = (onehot.T @ x) / jnp.maximum(n, 1e-12)[:, None]
    return jnp.where((n > 0)[:, None], new, c), None

  c, _ = jax.lax.scan(step, c0, None, length=iterations)
  return c


def _block_outputs(key, x, lo, hi, *, k, num_blocks, iterations):
  """The ``(q, K, d)`` block outputs (non-private; each a function of its block only)."""
  k_assign, k_dir, k_blocks, _ = jax.random.split(key, 4)
  block = jax.random.randint(k_assign, (x.shape[0],), 0, num_blocks)
  masks = jax.nn.one_hot(block, num_blocks, dtype=x.dtype).T                  # (q, n)
  direction = jax.random.normal(k_dir, (x.shape[1],), x.dtype)

  def one_block(bkey, w):
    c = jnp.clip(_weighted_lloyd(bkey, x, w, k, iterations, lo, hi), lo, hi)
    return c[jnp.argsort(c @ direction)]

  return jax.vmap(one_block)(jax.random.split(k_blocks, num_blocks), masks)


@functools.partial(jax.jit, static_argnames=("k", "num_blocks", "iterations", "scale",
                                             "discrete_params"))
def _sample_aggregate_core(key, x, lo, hi, *, k, num_blocks, iterations, scale,
                           discrete_params=None):
  """Mean of the block outputs in float64 when x64 is on (the release), Laplace noise, clip.

  ``discrete_params = (Delta_1, epsilon, g, c)`` (static): the mean released by
  :func:`jaxdp.mechanisms.discrete_laplace_mechanism` on ``g Z`` instead.
  """
  outs = _block_outputs(key, x, lo, hi, k=k, num_blocks=num_blocks, iterations=iterations)
  acc = jax.dtypes.canonicalize_dtype(jnp.float64)  # float64 under jax.enable_x64, else float32
  mean = outs.astype(acc).mean(0)
  k_noise = jax.random.split(key, 4)[3]
  if discrete_params is not None:
    sens, eps, grid, changed = discrete_params
    noisy = discrete.discrete_laplace_mechanism(k_noise, mean, sens, eps, grid,
                                                max_changed_coordinates=changed)
    return jnp.clip(noisy, lo.astype(acc), hi.astype(acc))
  noise = laplace_noise(k_noise, mean.shape, scale).astype(acc)
  return jnp.clip(mean + noise, lo.astype(acc), hi.astype(acc))


def sample_aggregate_kmeans(key: jax.Array, x: Any, *, n_clusters: int, epsilon: float,
                            lower: Any, upper: Any, num_blocks: int = 50, iterations: int = 20,
                            clip: bool = False, neighbouring: str = "replace_one",
                            accountant: Any = None,
                            noise: str = "discrete") -> tuple[np.ndarray, events.DpEvent]:
  """``epsilon``-DP k-means by sample and aggregate (module docstring).

  Every block should hold at least ``n_clusters`` points (``n >= K q``
  comfortably); an under-full block starts from public points for its missing
  centroids (module docstring). ``num_blocks > n`` or ``n_clusters > n``
  raises ``ValueError`` before anything is spent.

  ``noise``: ``"discrete"`` (default: the noisy mean on the public grid ``g Z``, module
  docstring) or ``"continuous"`` (float Laplace).

  Returns:
    ``(centroids (K, d), event)``; the event is ``PureDpEvent(epsilon)`` (discrete) or
    ``LaplaceDpEvent(1/epsilon)`` (continuous).
  """
  _validation.check_key(key)
  noise = _common.check_noise(noise)
  arr, lo, hi = _common.check_bounded_data(x, lower, upper, clip=clip)
  k = _validation.check_positive_int(n_clusters, "n_clusters")
  q = _validation.check_positive_int(num_blocks, "num_blocks")
  it = _validation.check_positive_int(iterations, "iterations")
  n = arr.shape[0]
  if q > n:
    raise ValueError(f"num_blocks must be <= the number of rows of x (every block needs a "
                     f"row), got num_blocks={q}.")
  if k > n:
    raise ValueError(f"n_clusters must be <= the number of rows of x, got n_clusters={k}.")
  eps = _validation.check_epsilon(epsilon, "epsilon", allow_inf=True)
  rel = _common.check_relation(neighbouring)
  sens = sample_aggregate_sensitivity(lower=lo, upper=hi, n_clusters=k, num_blocks=q)
  discrete_params = None
  if math.isinf(eps):
    event, scale = events.NonPrivateDpEvent(), 0.0
  elif noise == "discrete":
    changed = k * arr.shape[1]  # one block moves every coordinate of the mean
    grid = _common.sum_grid_step(sens, eps, changed)
    _common.check_grid_range(float(np.max(np.maximum(np.abs(lo), np.abs(hi)))), grid,
                             "the mean of the block outputs (inside the bounds)")
    event = discrete.discrete_laplace_mechanism_event(sens, eps, grid,
                                                      max_changed_coordinates=changed,
                                                      neighbouring=rel)
    discrete_params, scale = (float(sens), float(eps), grid, changed), 0.0
  else:
    scale = sens / eps
    event = events.LaplaceDpEvent(noise_multiplier=1.0 / eps, neighbouring=rel)
  _common.spend(accountant, event)
  with jax.enable_x64(True):  # float64 mean (module docstring, "Floating point")
    out = _sample_aggregate_core(key, jnp.asarray(arr, jnp.float32), jnp.asarray(lo, jnp.float32),
                                 jnp.asarray(hi, jnp.float32), k=k, num_blocks=q, iterations=it,
                                 scale=float(scale), discrete_params=discrete_params)
    return np.asarray(out, np.float64), event


class PrivateKMeans(checks.SharedAccountantMixin, ClusterMixin, BaseEstimator):
  """Private k-means (``method="lloyd"`` or ``"sample_aggregate"``), a scikit-learn clusterer.

  ``fit`` spends the event on ``accountant`` before releasing;
  ``cluster_centers_``, ``predict`` and ``score`` (the negative cost
  :func:`kmeans_cost` of the rows given, as scikit-learn) are available.
  ``count_fraction``, ``init`` and
  ``neighbouring`` are those of :func:`dp_lloyd`; ``noise`` (``"discrete"``, the
  default, or ``"continuous"``) is passed to either method. ``iterations=None``
  means 5 for ``"lloyd"`` and 20 for ``"sample_aggregate"`` (resolved at ``fit``).

  scikit-learn conventions, a shared ``accountant`` and the noise-key rule
  (``seed=None``: fresh OS entropy per fit):
  :class:`jaxdp._estimator_checks.SharedAccountantMixin`.

  There is no ``inertia_`` nor ``labels_``: scikit-learn's are the cost and the
  cluster assignments of the training rows, functions of the private data that
  no noise covers. Measure the released centres on held-out rows with
  ``score(x_held_out)`` (``-kmeans_cost``), and get the training rows' labels
  with ``fit_predict(x)`` (``fit(x).predict(x)``, returned to the caller, never
  stored).
  """

  def __init__(self, *, n_clusters: int, epsilon: float, lower: Any = None, upper: Any = None,
               method: str = "lloyd", iterations: int | None = None, num_blocks: int = 50,
               count_fraction: Any = "auto", init: Any = "central", clip: bool = False,
               neighbouring: str = "replace_one", accountant: Any = None, seed: Any = None,
               noise: str = "discrete"):
    self.noise = noise
    self.n_clusters = n_clusters
    self.epsilon = epsilon
    self.lower, self.upper, self.method = lower, upper, method
    self.iterations = iterations
    self.num_blocks, self.count_fraction, self.clip = num_blocks, count_fraction, clip
    self.init = init
    self.neighbouring = neighbouring
    self.accountant, self.seed = accountant, seed
    self._fits = 0

  def _check_params(self) -> dict[str, Any]:
    """The parameters checked (before any work); the attributes are left unchanged."""
    if not isinstance(self.method, str) or self.method not in METHODS:
      raise ValueError(f"method must be one of {METHODS}, got {self.method!r}.")
    noise = _common.check_noise(self.noise)
    n_clusters = _validation.check_positive_int(self.n_clusters, "n_clusters")
    epsilon = _validation.check_epsilon(self.epsilon, "epsilon", allow_inf=True)
    if self.iterations is None:
      iterations = 5 if self.method == "lloyd" else 20
    else:
      iterations = _validation.check_positive_int(self.iterations, "iterations")
    neighbouring = _common.check_relation(self.neighbouring)
    _common.check_accountant(self.accountant)
    _keys.check_seed(self.seed, "seed")
    return dict(noise=noise, n_clusters=n_clusters, epsilon=epsilon, iterations=iterations,
                neighbouring=neighbouring)

  def fit(self, x: Any, y: Any = None) -> "PrivateKMeans":
    del y
    p = self._check_params()
    key = _keys.fit_key(self.seed, self._fits)
    self._fits += 1
    if self.method == "lloyd":
      c, ev = dp_lloyd(key, x, n_clusters=p["n_clusters"], epsilon=p["epsilon"],
                       lower=self.lower, upper=self.upper, iterations=p["iterations"],
                       count_fraction=self.count_fraction, init=self.init, clip=self.clip,
                       neighbouring=p["neighbouring"], accountant=self.accountant,
                       noise=p["noise"])
    else:
      c, ev = sample_aggregate_kmeans(key, x, n_clusters=p["n_clusters"], epsilon=p["epsilon"],
                                      lower=self.lower, upper=self.upper,
                                      num_blocks=self.num_blocks, iterations=p["iterations"],
                                      clip=self.clip, neighbouring=p["neighbouring"],
                                      accountant=self.accountant, noise=p["noise"])
    self.cluster_centers_, self.event_ = c, ev
    self.n_features_in_ = int(np.shape(c)[1])
    return self

  def fit_predict(self, x: Any, y: Any = None) -> np.ndarray:
    """``fit(x)`` then the released centres' labels of ``x`` (post-processing, not stored)."""
    return self.fit(x, y).predict(x)

  def predict(self, x: Any) -> np.ndarray:
    checks.check_is_fitted(self, "cluster_centers_")  # NotFittedError (a ValueError)
    x = _common.check_query_x(x, self.n_features_in_, self)
    return np.asarray(_assign(jnp.asarray(x, jnp.float32), jnp.asarray(self.cluster_centers_)))

  def score(self, x: Any, y: Any = None) -> float:
    """``-kmeans_cost(x, cluster_centers_)`` (higher is better, as scikit-learn)."""
    del y
    checks.check_is_fitted(self, "cluster_centers_")
    x = _common.check_query_x(x, self.n_features_in_, self)
    return -float(kmeans_cost(x, self.cluster_centers_))
