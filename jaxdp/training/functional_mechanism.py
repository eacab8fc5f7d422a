r"""Functional mechanism (Zhang et al. 2012) for linear and logistic regression.

Paper 004 = ``../shared/papers/004_dp_machine_learning_survey.md``, Sec. 3.1,
Eqs. 18-20: write the summed loss as a polynomial in the parameters,
``sum_i L(theta; x_i, y_i) = sum_phi lambda_phi phi(theta)`` with monomials
``phi`` of degree <= Z, perturb every coefficient with ``Lap(Delta/eps)``,
``Delta = 2 max_{x,y} sum_phi |lambda_{x,y,phi}|`` (replace-one neighbours),
and minimise the noisy polynomial (post-processing: no further privacy cost).

Linear regression, ``L = (y - theta^T x)^2 = y^2 - 2 y x^T theta + theta^T x x^T theta``
(Z = 2, exact). Logistic regression with ``y in {0, 1}``,
``L = log(1 + e^{x^T theta}) - y x^T theta``, truncated to its second-order
Taylor expansion at 0 (Zhang et al. Sec. 4.2; paper 004: "taking the Taylor
expansion ... and truncating it"): ``log 2 + (1/2 - y) x^T theta + (1/8)(x^T theta)^2``.

Coefficients released (the constant term does not affect the minimiser and is
dropped): the degree-1 vector ``a = sum_i a_i`` and the degree-2 monomials
``theta_j theta_k, j <= k`` of ``theta^T M theta``, ``M = sum_i q x_i x_i^T``
(``q = 1`` linear, ``1/8`` logistic); a monomial's coefficient is ``M_jj`` on
the diagonal and ``2 M_jk`` off it.

Sensitivity. With ``||x||_2 <= 1`` (the library-wide assumption; Zhang et al.
use the same normalisation) and ``|y| <= 1``, per record
``sum_j |a_j| <= |c_y| ||x||_1 <= |c_y| sqrt(D)`` and
``sum_{j<=k} |coef_jk| = q sum_{j,k} |x_j x_k| = q ||x||_1^2 <= q D``, so

* linear regression: ``Delta = 2 (2 sqrt(D) + D)`` (``c_y = -2y``, ``q = 1``);
* logistic regression: ``Delta = 2 (sqrt(D)/2 + D/8) = sqrt(D) + D/4`` (``c_y = 1/2 - y``, ``q = 1/8``).

(Zhang et al. bound ``||x||_1`` by ``D`` coordinate-wise, giving the looser
``2(1 + 2D + D^2)`` and ``D^2/4 + 3D``; ours uses ``||x||_1 <= sqrt(D) ||x||_2``.)

Unbounded noisy objectives. The noisy ``M~`` may be indefinite, so the noisy
quadratic has no minimiser. Zhang et al. Sec. 5 (post-processing, no privacy
cost): add a regulariser and apply *spectral trimming* — eigendecompose the
symmetric ``M~ + (N lambda / 2) I`` (our mean-normalised L2 term ``(lambda/2)||theta||^2``
becomes ``(N lambda/2)||theta||^2`` on the summed objective) and drop eigenpairs
with eigenvalue ``<= trim_threshold``; the minimiser is taken in the span of the
kept eigenvectors: ``theta = -1/2 Q_+ Lambda_+^{-1} Q_+^T a~``.

Floating point. The coefficients ``a`` and ``M`` (sums over the ``N`` records)
are accumulated in float64 (a scoped ``jax.enable_x64``) and the float32
Laplace draws are added in float64; the minimiser is a post-processing of the
noisy float64 coefficients, returned in float32. In float32, rounding over
``N = 2e5`` records made the same-key difference of the noisy coefficients on
two neighbouring datasets exceed ``Delta`` by about 0.1%; in float64 any
summation order errs by at most ``gamma_N sum_i |lambda_{x_i}|``,
``gamma_N = N u / (1 - N u)``, ``u = 2^-53`` (Higham 2002, Eq. 4.4), a
worst-case relative excess below ``1e-5`` for ``N <= 2e5`` and of order
``sqrt(N) u`` in practice.
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxdp import _validation
from jaxdp.accounting import events
from jaxdp.mechanisms import noise_scale_as
from jaxdp.mechanisms.laplace import laplace_noise
from jaxdp.training import linear

TASKS = ("linear", "logistic")


class FunctionalMechanismCalibration(NamedTuple):
  """``Delta`` (L1 sensitivity of the coefficient vector), Laplace ``scale = Delta/eps`` and the event."""

  sensitivity: float
  scale: float
  event: Any


class FunctionalMechanismResult(NamedTuple):
  """Released weights ``(D,)`` (leading axis per key), number of kept eigen-directions, event, calibration."""

  weights: jax.Array
  num_kept: jax.Array
  event: Any
  calibration: FunctionalMechanismCalibration


def functional_mechanism_sensitivity(task: str, dim: int) -> float:
  """``Delta``: ``2(2 sqrt(D) + D)`` (linear) or ``sqrt(D) + D/4`` (logistic); see module docstring."""
  if task not in TASKS:
    raise ValueError(f"task must be one of {TASKS}, got {task!r}.")
  d = _validation.check_positive_int(dim, "dim")
  if task == "linear":
    return 2.0 * (2.0 * math.sqrt(d) + d)
  return math.sqrt(d) + d / 4.0


def functional_mechanism_calibration(task: str, dim: int, epsilon: float) -> FunctionalMechanismCalibration:
  """Laplace scale ``Delta / eps`` on every coefficient; ``PureDpEvent(eps)`` (``inf``: no noise)."""
  sens = functional_mechanism_sensitivity(task, dim)
  eps = _validation.check_epsilon(epsilon, "epsilon", allow_inf=True)
  if math.isinf(eps):
    return FunctionalMechanismCalibration(sens, 0.0, events.NonPrivateDpEvent())
  # Delta is the replace-one sensitivity (module docstring).
  return FunctionalMechanismCalibration(sens, sens / eps,
                                        events.PureDpEvent(eps, neighbouring="replace_one"))


def polynomial_coefficients(x: jax.Array, y: jax.Array, task: str) -> tuple[jax.Array, jax.Array]:
  """Summed degree-1 ``a`` and degree-2 ``M``: summed loss = ``a^T theta + theta^T M theta`` + const."""
  if task == "linear":
    return -2.0 * (y @ x), x.T @ x
  return (0.5 - y) @ x, (x.T @ x) / 8.0


def _noisy_coefficients(key, x, y, scale, *, task):
  """The release: ``(a~, M~)``, the coefficients in ``x.dtype`` plus float32 Laplace draws.

  Noise on the monomial coefficients ``theta_j theta_k`` (``j <= k``): diagonal
  entries get ``Lap(scale)``; an off-diagonal coefficient ``2 M_jk`` gets
  ``Lap(scale)``, i.e. ``M_jk`` gets ``Lap(scale)/2``.
  """
  d = x.shape[1]
  a, m = polynomial_coefficients(x, y, task)
  k_lin, k_quad = jax.random.split(key)
  a = a + laplace_noise(k_lin, (d,), scale).astype(a.dtype)
  z = laplace_noise(k_quad, (d, d), scale).astype(m.dtype)
  upper = jnp.triu(z, 1)
  return a, m + jnp.diag(jnp.diag(z)) + 0.5 * (upper + upper.T)


@functools.partial(jax.jit, static_argnames=("task",))
def _fm_solve(key, x, y, scale, l2_reg, trim_threshold, *, task):
  n, d = x.shape
  a, m = _noisy_coefficients(key, x, y, scale, task=task)
  m = m + 0.5 * n * l2_reg * jnp.eye(d, dtype=x.dtype)
  evals, evecs = jnp.linalg.eigh(m)
  keep = evals > trim_threshold
  inv = jnp.where(keep, 1.0 / jnp.where(keep, evals, 1.0), 0.0)
  theta = -0.5 * evecs @ (inv * (evecs.T @ a))
  return theta, jnp.sum(keep)


def functional_mechanism(
    key: jax.Array,
    x: Any,
    y: Any,
    *,
    epsilon: float,
    task: str = "linear",
    l2_reg: float = 0.0,
    trim_threshold: float = 0.0,
    normalize: bool = False,
) -> FunctionalMechanismResult:
  r"""Functional mechanism (paper 004 Sec. 3.1, Eqs. 18-20; Zhang et al. 2012), eps-DP.

  Minimises the noisy polynomial objective
  ``a~^T theta + theta^T (M~ + N lambda/2 I) theta`` after spectral trimming
  (module docstring). ``task="linear"``: ``y in [-1, 1]``; ``task="logistic"``:
  ``y in {0, 1}`` (predict with ``x @ theta >= 0``). A batch of keys returns
  one release per key. ``epsilon = inf`` gives the (trimmed) non-private
  minimiser of the same polynomial: the exact ridge solution for linear
  regression, the Taylor-approximated one for logistic regression.
  """
  _validation.check_key(key, allow_batch=True)
  if task not in TASKS:
    raise ValueError(f"task must be one of {TASKS}, got {task!r}.")
  lam = _validation.check_nonnegative(l2_reg, "l2_reg")
  thr = _validation.check_nonnegative(trim_threshold, "trim_threshold")
  x = linear.check_features(x, "x", normalize=normalize)
  y = _validation.check_finite_array(y, "y").astype(np.float32)
  if y.shape != (x.shape[0],):
    raise ValueError(f"y must have shape ({x.shape[0]},), got {y.shape}.")
  if task == "linear" and y.size and np.max(np.abs(y)) > 1.0:
    raise ValueError("y must lie in [-1, 1] for the functional mechanism's linear regression.")
  if task == "logistic" and not set(np.unique(y).tolist()) <= {0.0, 1.0}:
    raise ValueError("y must hold labels in {0, 1} for the functional mechanism's logistic regression.")
  cal = functional_mechanism_calibration(task, x.shape[1], epsilon)
  scale = noise_scale_as(cal.scale, jnp.float32, round_up=True)  # Laplace scale: round up
  with jax.enable_x64(True):  # float64 coefficients (module docstring, "Floating point")
    xj = jnp.asarray(np.asarray(x, np.float32), jnp.float64)
    yj = jnp.asarray(y, jnp.float64)
    solve = lambda k: _fm_solve(k, xj, yj, scale, lam, thr, task=task)
    theta, kept = jax.vmap(solve)(key) if linear.is_key_batch(key) else solve(key)
    theta, kept = np.asarray(theta, np.float32), np.asarray(kept)
  return FunctionalMechanismResult(jnp.asarray(theta), jnp.asarray(kept), cal.event, cal)
