"""Lower-triangular Toeplitz strategy matrices C for the matrix mechanism.

The matrix-factorization (MF) mechanism (Denisov et al. 2022, "Improved
differential privacy for SGD via optimal private linear operators on
adaptive streams"; Choquette-Choo et al. 2023, "Multi-epoch matrix
factorization mechanisms for private machine learning") writes the workload
``A`` (the n x n prefix-sum operator of SGD, with learning rates and momentum
folded in) as ``A = B C`` and releases ``C x + z`` with ``z ~ N(0, s^2 I)``;
training then sees the gradients ``x_t + (C^{-1} z)_t``. Independent noise
(DP-SGD) is ``C = I``.

Both strategy families here are lower-triangular Toeplitz,
``C[t, s] = c_{t-s}`` for ``t >= s``, with ``c_0 > 0``:

* :class:`BandMF` -- banded Toeplitz, ``c_j = 0`` for ``j >= bands``
  (Choquette-Choo et al. 2023, "(Amplified) banded matrix factorization: a
  unified approach to private training"; Kalinin & Lampert 2024, "Banded
  square root matrix factorization"). One band with ``c_0 = 1`` is DP-SGD.
* :class:`BLT` -- buffered linear Toeplitz (Dvijotham, McMahan, Pillutla,
  Steinke & Thakurta 2024, "Efficient and near-optimal noise generation for
  streaming differential privacy"; McMahan, Pillutla, Steinke et al. 2024),
  ``c_0 = 1`` and ``c_j = sum_i omega_i theta_i^(j-1)`` for ``j >= 1`` with
  ``theta_i`` in (0, 1), ``omega_i >= 0``: ``C^{-1} z`` streams with one
  buffer per ``theta_i``.

Coefficients are float64 numpy arrays (strategies are public: they depend on
no data); the streaming noise is in :mod:`.noise`.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxdp import _validation


def _as_float64_vector(values, name: str) -> np.ndarray:
  try:
    arr = np.asarray(values, dtype=np.float64)
  except (TypeError, ValueError) as err:
    raise TypeError(f"{name} must be a 1-D array of real numbers.") from err
  if arr.ndim != 1 or arr.size == 0:
    raise ValueError(f"{name} must be a non-empty 1-D array, got shape {arr.shape}.")
  if not np.all(np.isfinite(arr)):
    raise ValueError(f"{name} must be finite.")
  return arr


def toeplitz_matrix(coefs: np.ndarray, n: int) -> np.ndarray:
  """The dense n x n lower-triangular Toeplitz matrix ``C[t, s] = coefs[t - s]`` (float64)."""
  n = _validation.check_positive_int(n, "n")
  c = np.zeros(n, np.float64)
  m = min(n, len(coefs))
  c[:m] = np.asarray(coefs, np.float64)[:m]
  idx = np.arange(n)[:, None] - np.arange(n)[None, :]
  return np.where(idx >= 0, c[np.clip(idx, 0, n - 1)], 0.0)


def toeplitz_inverse_coefs(coefs: np.ndarray, n: int) -> np.ndarray:
  """First n coefficients of ``C^{-1}`` (lower-triangular Toeplitz too), float64.

  ``d_0 = 1 / c_0``; ``d_t = -(sum_{j=1}^{t} c_j d_{t-j}) / c_0`` (power-series
  inversion).
  """
  n = _validation.check_positive_int(n, "n")
  c = np.zeros(n, np.float64)
  m = min(n, len(coefs))
  c[:m] = np.asarray(coefs, np.float64)[:m]
  if c[0] <= 0:
    raise ValueError("the strategy's diagonal coefficient c_0 must be > 0.")
  d = np.zeros(n, np.float64)
  d[0] = 1.0 / c[0]
  for t in range(1, n):
    d[t] = -np.dot(c[1:t + 1], d[t - 1::-1][:t]) / c[0]
  return d


@dataclasses.dataclass(frozen=True, eq=False)
class BandMF:
  """Banded lower-triangular Toeplitz strategy: ``C[t, s] = coefs[t - s]`` for ``0 <= t - s < bands``.

  ``coefs[0] > 0``; ``bands = len(coefs)``. ``BandMF.dp_sgd()`` (one band,
  ``c_0 = 1``) is DP-SGD's ``C = I``. Optimised coefficients come from
  :func:`jaxdp.dpsgd.correlated.optimize_bandmf`.
  """

  coefs: np.ndarray

  def __post_init__(self):
    c = _as_float64_vector(self.coefs, "coefs")
    if c[0] <= 0:
      raise ValueError(f"coefs[0] (the diagonal of C) must be > 0, got {c[0]}.")
    c = c.copy()
    c.setflags(write=False)
    object.__setattr__(self, "coefs", c)

  @classmethod
  def dp_sgd(cls) -> "BandMF":
    """One band, ``C = I``: independent noise (DP-SGD)."""
    return cls(np.ones(1))

  @property
  def bands(self) -> int:
    return int(self.coefs.shape[0])

  @property
  def state_size(self) -> int:
    """Noise vectors the streaming generator keeps (``bands - 1``)."""
    return self.bands - 1

  def coefficients(self, n: int) -> np.ndarray:
    """``c_0, ..., c_{n-1}`` (zeros past the last band), float64."""
    n = _validation.check_positive_int(n, "n")
    out = np.zeros(n, np.float64)
    m = min(n, self.bands)
    out[:m] = self.coefs[:m]
    return out

  def matrix(self, n: int) -> np.ndarray:
    """Dense n x n C (float64)."""
    return toeplitz_matrix(self.coefs, n)

  def __repr__(self) -> str:
    return f"BandMF(bands={self.bands})"


@dataclasses.dataclass(frozen=True, eq=False)
class BLT:
  """Buffered linear Toeplitz strategy (Dvijotham et al. 2024, Definition 1 form).

  ``c_0 = 1``, ``c_j = sum_i omega_i theta_i^(j - 1)`` for ``j >= 1``, with
  buffer decays ``theta_i`` in (0, 1) and weights ``omega_i >= 0``. The
  inverse noise ``w = C^{-1} z`` streams with one d-vector buffer per
  ``theta_i``: ``w_t = z_t - sum_i omega_i S_i``, then ``S_i <- theta_i S_i + w_t``
  (``S_i`` starts at 0), derived from ``C w = z`` row by row.
  """

  theta: np.ndarray
  omega: np.ndarray

  def __post_init__(self):
    theta = _as_float64_vector(self.theta, "theta")
    omega = _as_float64_vector(self.omega, "omega")
    if theta.shape != omega.shape:
      raise ValueError(f"theta and omega must have the same length, got {theta.shape} and "
                       f"{omega.shape}.")
    if np.any(theta <= 0) or np.any(theta >= 1):
      raise ValueError("theta (buffer decays) must lie in (0, 1).")
    if np.any(omega < 0):
      raise ValueError("omega (buffer weights) must be >= 0.")
    for name, arr in (("theta", theta), ("omega", omega)):
      arr = arr.copy()
      arr.setflags(write=False)
      object.__setattr__(self, name, arr)

  @property
  def buffers(self) -> int:
    return int(self.theta.shape[0])

  @property
  def state_size(self) -> int:
    """Noise vectors the streaming generator keeps (one per buffer)."""
    return self.buffers

  bands = None  # not banded

  def coefficients(self, n: int) -> np.ndarray:
    """``c_0 = 1, c_j = sum_i omega_i theta_i^(j-1)``, float64."""
    n = _validation.check_positive_int(n, "n")
    j = np.arange(n - 1, dtype=np.float64)
    out = np.ones(n, np.float64)
    if n > 1:
      out[1:] = (self.omega[None, :] * self.theta[None, :] ** j[:, None]).sum(axis=1)
    return out

  def matrix(self, n: int) -> np.ndarray:
    """Dense n x n C (float64)."""
    return toeplitz_matrix(self.coefficients(n), n)

  def __repr__(self) -> str:
    return f"BLT(buffers={self.buffers})"


__all__ = ["BLT", "BandMF", "toeplitz_inverse_coefs", "toeplitz_matrix"]
