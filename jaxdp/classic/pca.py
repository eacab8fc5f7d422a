r"""Differentially private PCA by a noisy second-moment matrix (paper 004, Sec. 3.5).

Paper 004 = ``../shared/papers/004_dp_machine_learning_survey.md``. PCA takes
the top eigenvectors of ``A = X^T X = sum_i x_i x_i^T`` (the survey's
``Sigma = A / n``; the data are centred beforehand with a PUBLIC centre, or the
uncentred second moment is used, as the survey writes it). Rows must satisfy
``||x_i||_2 <= 1`` (checked; ``clip=True`` projects rows onto the unit ball).

SuLQ (Blum et al. 2005) perturbs every entry independently and loses symmetry
(the survey's objection). Here only the upper triangle ``U(A)`` (diagonal
included) is perturbed and mirrored, so the noisy matrix is symmetric and its
eigen-decomposition real:

* **Analyze-Gauss** (Dwork, Talwar, Thakurta, Zhang 2014, "Analyze Gauss",
  Alg. 1): ``U(A) + N(0, sigma^2)`` entry-wise. Per record
  ``||U(x x^T)||_2 <= ||x x^T||_F = ||x||_2^2 <= 1``, so ``Delta_2 = 1`` under
  add/remove; under replace-one
  ``||x x^T - y y^T||_F^2 = ||x||^4 + ||y||^4 - 2 (x^T y)^2 <= 2``, so
  ``Delta_2 = sqrt(2)`` (tighter than the generic ``2 B``). ``sigma`` is the
  analytic Gaussian of Balle & Wang 2018 (Thm. 8) for ``(epsilon, delta)``
  (:func:`jaxdp.mechanisms.analytic_gaussian_sigma`); event
  ``GaussianDpEvent(sigma / Delta_2)``.
* **Pure DP (Laplace)**: ``U(A) + Lap(Delta_1 / epsilon)``. Per record
  ``||U(x x^T)||_1 = sum_{j<=k} |x_j x_k| = (||x||_1^2 + ||x||_2^2)/2 <= (d + 1)/2``
  (``||x||_1 <= sqrt(d)``), so ``Delta_1 = (d+1)/2`` (add/remove) or ``d + 1``
  (replace-one). Event ``LaplaceDpEvent(1/epsilon)``.

The top-``k`` eigenvectors of the noisy matrix (``jnp.linalg.eigh``) are a
post-processing. ``epsilon = inf`` gives the exact PCA of the (centred) data.

Floating point. ``X^T X`` is accumulated in float64 (a scoped
``jax.enable_x64``), the float32 noise is added in float64 and the released
matrix is float64. In float32, rounding over ``n = 2e5`` rows made the same-key
difference of two neighbouring releases exceed ``Delta`` by about 0.1%; in
float64 any summation order errs by at most ``gamma_n sum_i |x_ij x_ik|``,
``gamma_n = n u / (1 - n u)``, ``u = 2^-53`` (Higham 2002, Eq. 4.4), a
worst-case relative excess below ``1e-5`` for ``n <= 2e5`` and of order
``sqrt(n) u`` in practice.
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from sklearn.base import BaseEstimator, TransformerMixin

from jaxdp import _estimator_checks as checks
from jaxdp import _keys
from jaxdp import _validation
from jaxdp.accounting import events
from jaxdp.classic import _common
from jaxdp.mechanisms import analytic_gaussian_sigma
from jaxdp.mechanisms import gaussian_noise
from jaxdp.mechanisms import laplace_noise

MECHANISMS = ("gaussian", "laplace")


class PCACalibration(NamedTuple):
  mechanism: str
  sensitivity: float       # L2 (gaussian) or L1 (laplace) of U(x x^T)
  scale: float             # sigma or Laplace b
  neighbouring: str


class PCAResult(NamedTuple):
  components: np.ndarray           # (k, d), rows are unit eigenvectors, largest first
  eigenvalues: np.ndarray          # (k,) of the noisy second-moment matrix
  noisy_matrix: np.ndarray         # (d, d) symmetric release


def pca_calibration(*, dim: int, epsilon: float, delta: float = 0.0, mechanism: str = "gaussian",
                    neighbouring: str = "replace_one") -> PCACalibration:
  """Sensitivity and noise scale (module docstring)."""
  d = _validation.check_positive_int(dim, "dim")
  if mechanism not in MECHANISMS:
    raise ValueError(f"mechanism must be one of {MECHANISMS}, got {mechanism!r}.")
  rel = _common.check_relation(neighbouring)
  eps = _validation.check_epsilon(epsilon, "epsilon", allow_inf=True)
  if mechanism == "gaussian":
    dl = _validation.check_delta(delta)
    if dl == 0.0 and math.isfinite(eps):
      raise ValueError("delta must be > 0 for mechanism='gaussian'; use mechanism='laplace' for pure DP.")
    sens = 1.0 if rel == events.ADD_REMOVE else math.sqrt(2.0)
    scale = 0.0 if math.isinf(eps) else float(analytic_gaussian_sigma(eps, dl, sens))
  else:
    if _validation.check_delta(delta) != 0.0:
      raise ValueError("mechanism='laplace' is pure DP: pass delta=0.")
    sens = _common.sum_sensitivity((d + 1) / 2.0, rel)
    scale = 0.0 if math.isinf(eps) else sens / eps
  return PCACalibration(mechanism, sens, scale, rel)


def pca_event(cal: PCACalibration) -> events.DpEvent:
  if cal.scale == 0.0:
    return events.NonPrivateDpEvent()
  if cal.mechanism == "gaussian":
    return events.GaussianDpEvent(noise_multiplier=cal.scale / cal.sensitivity, neighbouring=cal.neighbouring)
  return events.LaplaceDpEvent(noise_multiplier=cal.scale / cal.sensitivity, neighbouring=cal.neighbouring)


def symmetric_noise(key: jax.Array, dim: int, scale: float, mechanism: str) -> jax.Array:
  """Symmetric ``(d, d)`` float32 noise: i.i.d. on the upper triangle (diagonal included), mirrored."""
  draw = gaussian_noise if mechanism == "gaussian" else laplace_noise
  e = draw(key, (dim, dim), scale)
  upper = jnp.triu(e)
  return upper + jnp.triu(e, 1).T


@functools.partial(jax.jit, static_argnames=("num_components", "scale", "mechanism"))
def _pca_core(key, x, *, num_components, scale, mechanism):
  a = x.T @ x                                                      # in x.dtype (float64 released)
  noisy = a + symmetric_noise(key, x.shape[1], scale, mechanism).astype(a.dtype)
  w, v = jnp.linalg.eigh(noisy)
  order = jnp.argsort(-w)[:num_components]
  comps = v[:, order].T
  # Deterministic sign (largest |entry| positive), as scikit-learn's svd_flip.
  sign = jnp.sign(comps[jnp.arange(num_components), jnp.argmax(jnp.abs(comps), axis=1)])
  return comps * sign[:, None], w[order], noisy


def private_pca(key: jax.Array, x: Any, *, num_components: int, epsilon: float, delta: float = 0.0,
                mechanism: str = "gaussian", center: Any = None, clip: bool = False,
                neighbouring: str = "replace_one", accountant: Any = None
                ) -> tuple[PCAResult, events.DpEvent]:
  """Top-``k`` principal components of a noisy second-moment matrix.

  Args:
    key: a ``jax.random`` key, used once.
    x: ``(n, d)`` data; after subtracting ``center`` every row needs ``||x||_2 <= 1``.
    num_components: ``k <= d``.
    epsilon, delta: privacy parameters (``delta > 0`` for ``"gaussian"``, 0 for ``"laplace"``).
    mechanism: ``"gaussian"`` (Analyze-Gauss) or ``"laplace"`` (pure DP).
    center: a PUBLIC centre ``(d,)`` subtracted first (None: uncentred second moment).
    clip: project rows outside the unit ball onto it instead of raising.
    neighbouring: ``"replace_one"`` or ``"add_remove"``.
    accountant: optional accountant/budget, spent before release.

  Returns:
    ``(PCAResult, event)``.
  """
  _validation.check_key(key)
  arr = _validation.check_finite_array(x, "x").astype(np.float64)
  if arr.ndim != 2 or arr.shape[0] == 0:
    raise ValueError(f"x must be a non-empty 2-D array, got shape {arr.shape}.")
  d = arr.shape[1]
  k = _validation.check_positive_int(num_components, "num_components")
  if k > d:
    raise ValueError(f"num_components must be <= the dimension {d}, got {k}.")
  if center is not None:
    c = _validation.check_finite_array(center, "center").astype(np.float64)
    arr = arr - np.broadcast_to(c, (d,))
  if clip:
    arr = arr / np.maximum(np.linalg.norm(arr, axis=1, keepdims=True), 1.0)
  arr = _validation.check_unit_ball(arr, "x")
  cal = pca_calibration(dim=d, epsilon=epsilon, delta=delta, mechanism=mechanism,
                        neighbouring=neighbouring)
  event = pca_event(cal)
  _common.spend(accountant, event)
  with jax.enable_x64(True):  # float64 X^T X (module docstring, "Floating point")
    comps, w, noisy = _pca_core(key, jnp.asarray(arr, jnp.float64), num_components=k,
                                scale=float(cal.scale), mechanism=cal.mechanism)
    out = PCAResult(np.asarray(comps, np.float64), np.asarray(w, np.float64),
                    np.asarray(noisy, np.float64))
  return out, event


def explained_variance_ratio(x: Any, components: Any, center: Any = None) -> float:
  """``||X V^T||_F^2 / ||X||_F^2`` of (centred) ``x`` captured by the rows ``V`` of ``components``."""
  x = np.asarray(x, np.float64)
  if center is not None:
    x = x - np.asarray(center, np.float64)
  v = np.asarray(components, np.float64)
  return float(np.sum((x @ v.T) ** 2) / np.sum(x * x))


class PrivatePCA(checks.SharedAccountantMixin, TransformerMixin, BaseEstimator):
  """Private PCA, a scikit-learn transformer: ``fit``, ``transform``, ``components_``.

  ``center`` must be public (e.g. the midpoint of declared bounds); each fit
  spends its event before releasing.

  scikit-learn conventions, a shared ``accountant`` and the noise-key rule
  (``seed=None``: fresh OS entropy per fit):
  :class:`jaxdp._estimator_checks.SharedAccountantMixin`.
  """

  def __init__(self, *, n_components: int, epsilon: float, delta: float = 0.0,
               mechanism: str = "gaussian", center: Any = None, clip: bool = False,
               neighbouring: str = "replace_one", accountant: Any = None, seed: Any = None):
    self.n_components = n_components
    self.epsilon = epsilon
    self.delta, self.mechanism, self.center, self.clip = delta, mechanism, center, clip
    self.neighbouring = neighbouring
    self.accountant, self.seed = accountant, seed
    self._fits = 0

  def _check_params(self) -> dict[str, Any]:
    """The parameters checked (before any work); the attributes are left unchanged."""
    n_components = _validation.check_positive_int(self.n_components, "n_components")
    epsilon = _validation.check_epsilon(self.epsilon, "epsilon", allow_inf=True)
    neighbouring = _common.check_relation(self.neighbouring)
    _common.check_accountant(self.accountant)
    _keys.check_seed(self.seed, "seed")
    return dict(n_components=n_components, epsilon=epsilon, neighbouring=neighbouring)

  def fit(self, x: Any, y: Any = None) -> "PrivatePCA":
    del y
    p = self._check_params()
    key = _keys.fit_key(self.seed, self._fits)
    self._fits += 1
    res, ev = private_pca(key, x, num_components=p["n_components"], epsilon=p["epsilon"],
                          delta=self.delta, mechanism=self.mechanism, center=self.center,
                          clip=self.clip, neighbouring=p["neighbouring"],
                          accountant=self.accountant)
    self.components_, self.eigenvalues_, self.event_ = res.components, res.eigenvalues, ev
    self.n_features_in_ = int(np.shape(res.components)[1])
    self._center = self.center
    return self

  def transform(self, x: Any) -> np.ndarray:
    checks.check_is_fitted(self, "components_")  # NotFittedError (a ValueError)
    x = _common.check_query_x(x, self.n_features_in_, self).astype(np.float64)
    if self._center is not None:
      x = x - np.asarray(self._center, np.float64)
    return x @ self.components_.T

  def score(self, x: Any, y: Any = None) -> float:
    """Explained-variance ratio on ``x``."""
    return explained_variance_ratio(x, self.components_, self._center)
