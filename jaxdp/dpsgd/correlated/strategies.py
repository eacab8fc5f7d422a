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

A third, non-Toeplitz family:

* :class:`ColumnNormalizedBanded` -- a general lower-triangular b-banded C for
  a fixed horizon n, every column scaled to unit norm (JAX Privacy's
  ``banded.ColumnNormalizedBanded``; McKenna 2024, "Scaling up the banded
  matrix factorization mechanism for differentially private ML", Sec. 4).
  With ``bands <= b`` its (k, b) sensitivity is exactly ``sqrt(k)``.

All three subclass :class:`Strategy`, the interface the noise generator, the
sensitivity, the accounting and ``make_private`` consume.

Every strategy is checked when it is built: finite real (not boolean) inputs,
a positive diagonal that stays a normal float32 after normalisation (the
streamed recursion divides by it in float32), and a STABLE inverse recursion
(otherwise the noise ``C^{-1} z`` grows geometrically with t and training
diverges):

* BandMF: ``w_t = (z_t - sum_{j>=1} c_j w_{t-j}) / c_0`` is a linear recurrence
  whose characteristic roots are ``1 / z`` for the roots z of
  ``c(z) = sum_j c_j z^j``; it is stable iff c has no root in the closed unit
  disk. Decided exactly by the Schur--Cohn test (Schur 1917; Cohn 1922; e.g.
  Henrici, "Applied and computational complex analysis" vol. 1, Sec. 6.8), after
  the Enestrom--Kakeya fast path (positive, strictly decreasing coefficients
  have every root in ``|z| >= min_j c_j / c_{j+1} > 1``).
* BLT: the buffers follow ``S <- (diag(theta) - 1 omega^T) S + 1 z_t``
  (:mod:`.noise`); stable iff that matrix has spectral radius < 1
  (its eigenvalues are the ``1 / z`` for the zeros z of the generating
  function ``1 + z sum_i omega_i / (1 - theta_i z)``). Fast path:
  ``sum_i omega_i / (1 + theta_i) < 1`` gives ``Re c(z) > 0`` on the closed
  disk (``Re z / (1 - theta z) >= -1 / (1 + theta)`` for ``|z| <= 1``), which
  covers every BLT of :func:`~.optimize.optimize_blt` (``sum omega < 1``).
* ColumnNormalizedBanded (finite n, time-varying): the largest row norm of
  ``C^{-1}`` (the noise amplification of step t) must be below ``2^23``
  (``1 / eps`` of float32; beyond it the streamed float32 recursion keeps no
  correct digit).

Arrays are float64 numpy (strategies are public: they depend on no data); the
streaming noise is in :mod:`.noise`.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from jaxdp import _validation


_F32_TINY = float(np.finfo(np.float32).tiny)  # smallest positive normal float32
_F32_MAX = float(np.finfo(np.float32).max)
# Largest noise amplification max_t ||row_t(C^{-1})|| a ColumnNormalizedBanded may have: 1 / eps
# of float32 (beyond it the streamed float32 recursion keeps no correct digit).
MAX_INVERSE_ROW_NORM = 2.0 ** 23


def _refuse_bool(values, name: str) -> None:
  if isinstance(values, (bool, np.bool_)):
    raise TypeError(f"{name} must be real numbers, got a boolean.")
  if isinstance(values, np.ndarray) and values.dtype != object:
    if values.dtype == np.bool_:
      raise TypeError(f"{name} must be real numbers, got a boolean array.")
    return
  try:
    arr = np.asarray(values)
  except (TypeError, ValueError):
    return
  if arr.dtype == np.bool_:
    raise TypeError(f"{name} must be real numbers, got booleans.")
  if isinstance(values, (list, tuple)) or arr.dtype == object:
    flat = np.asarray(values, dtype=object).ravel()
    if any(isinstance(v, (bool, np.bool_)) for v in flat):
      raise TypeError(f"{name} must be real numbers, got booleans.")


def _as_float64_array(values, name: str, ndim: int) -> np.ndarray:
  _refuse_bool(values, name)
  try:
    arr = np.asarray(values, dtype=np.float64)
  except (TypeError, ValueError) as err:
    raise TypeError(f"{name} must be a {ndim}-D array of real numbers.") from err
  if arr.ndim != ndim or arr.size == 0:
    raise ValueError(f"{name} must be a non-empty {ndim}-D array, got shape {arr.shape}.")
  if not np.all(np.isfinite(arr)):
    raise ValueError(f"{name} must be finite.")
  return arr


def _as_float64_vector(values, name: str) -> np.ndarray:
  return _as_float64_array(values, name, 1)


def _frozen(arr: np.ndarray) -> np.ndarray:
  arr = np.array(arr, dtype=np.float64, copy=True)
  arr.setflags(write=False)
  return arr


def toeplitz_polynomial_is_stable(coefs) -> bool:
  """True iff ``c(z) = sum_j coefs[j] z^j`` has no root in the closed unit disk ``|z| <= 1``.

  That is exactly when the recursion ``w_t = (z_t - sum_{j>=1} c_j w_{t-j}) / c_0``
  (the streamed ``C^{-1} z`` of a banded Toeplitz C) is stable: its
  characteristic roots are the ``1 / z``. Enestrom--Kakeya fast path (positive,
  strictly decreasing coefficients: every root has ``|z| >= min_j c_j / c_{j+1}
  > 1``), else the Schur--Cohn test on the reversed polynomial
  ``p(x) = sum_j c_j x^(m-j)`` (roots ``1 / z``): with ``k = c_m / c_0``,
  ``|k| < 1`` is necessary and, by Rouche's theorem, ``p`` and
  ``(p(x) - k x^m p(1/x)) / x`` (degree m - 1) have the same roots in the open
  disk; p is stable iff every such ``|k| < 1``. O(m^2) for m + 1 coefficients.
  """
  a = np.trim_zeros(np.asarray(coefs, np.float64), "b")
  if a.size == 0 or a[0] == 0:
    return False
  if a.size == 1:
    return True
  if (a[0] > 0 and np.all(a > 0) and np.all(np.diff(a) < 0)) or (
      a[0] < 0 and np.all(a < 0) and np.all(np.diff(a) > 0)):
    return True
  a = a / a[0]
  while a.size > 1:
    k = a[-1]
    if not abs(k) < 1.0:
      return False
    a = a[:-1] - k * a[:0:-1]
    a = a / a[0]
  return True


def _smallest_root_modulus(coefs: np.ndarray) -> float | None:
  """min |z| over the roots of sum_j c_j z^j (None for long polynomials: too slow to report)."""
  a = np.trim_zeros(np.asarray(coefs, np.float64), "b")
  if a.size <= 1 or a.size > 257:
    return None
  return float(np.min(np.abs(np.roots(a[::-1]))))


def blt_inverse_spectral_radius(theta, omega) -> float:
  """Spectral radius of ``diag(theta) - 1 omega^T``, the BLT inverse recursion's state matrix.

  ``C^{-1} z`` streams as ``w_t = z_t - omega^T S``, ``S <- theta * S + w_t`` (:mod:`.noise`),
  i.e. ``S <- (diag(theta) - 1 omega^T) S + 1 z_t``: bounded iff this radius is < 1.
  """
  theta = np.asarray(theta, np.float64)
  omega = np.asarray(omega, np.float64)
  a = np.diag(theta) - np.ones((theta.size, 1)) * omega[None, :]
  return float(np.max(np.abs(np.linalg.eigvals(a))))


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


class Strategy:
  """Base class of the strategy matrices C that :func:`~.noise.correlated_noise` streams.

  The interface (what the noise, the sensitivity, the accounting and
  ``make_private`` use):

  * ``bands`` -- number of bands (``C[t, s] = 0`` for ``t - s >= bands``) or
    None when C is not banded (BLT);
  * ``state_size`` -- noise vectors (copies of the parameters) the streamed
    ``C^{-1} z`` keeps;
  * ``is_toeplitz`` -- whether ``C[t, s]`` depends only on ``t - s``; then
    ``coefficients(n)`` gives ``c_0 .. c_{n-1}``;
  * ``max_steps`` -- the largest n the strategy is defined for (None: any);
    :meth:`check_num_steps` refuses more;
  * :meth:`matrix` (dense n x n C), :meth:`column_norms_squared`
    (``||C[:n, t]||^2``), :meth:`max_column_norm` (``s_1``, the sensitivity of
    one participation), :meth:`fingerprint` (a float64 array that determines
    C on n steps, e.g. for checking that every process runs the same C).

  Subclasses validate their inputs and the stability of their inverse when
  built (module docstring).
  """

  is_toeplitz: bool = True
  max_steps: int | None = None

  @property
  def bands(self) -> int | None:
    raise NotImplementedError

  @property
  def state_size(self) -> int:
    raise NotImplementedError

  def check_num_steps(self, num_steps) -> int:
    """``num_steps`` as an int, refused if the strategy is not defined that far."""
    n = _validation.check_positive_int(num_steps, "num_steps")
    if self.max_steps is not None and n > self.max_steps:
      raise ValueError(f"num_steps ({n}) must be <= {self.max_steps}, the number of steps this "
                       f"{type(self).__name__} was built for.")
    return n

  def coefficients(self, n: int) -> np.ndarray:
    """``c_0, ..., c_{n-1}`` of a Toeplitz strategy (float64)."""
    raise TypeError(f"{type(self).__name__} is not Toeplitz: it has no coefficients(n); use "
                    "matrix(n) or fingerprint(n).")

  def matrix(self, n: int) -> np.ndarray:
    """Dense n x n C (float64)."""
    n = self.check_num_steps(n)
    return toeplitz_matrix(self.coefficients(n), n)

  def column_norms_squared(self, n: int) -> np.ndarray:
    """``||C[:n, t]||^2`` for t < n (float64)."""
    n = self.check_num_steps(n)
    c = self.coefficients(n)
    return np.cumsum(c * c)[::-1].copy()

  def max_column_norm(self, n: int) -> float:
    """``s_1 = max_t ||C[:n, t]||``: the L2 sensitivity of one participation (clip norm 1)."""
    n = self.check_num_steps(n)
    if self.is_toeplitz:  # column 0 is the longest
      return float(np.linalg.norm(self.coefficients(n)))
    return float(np.sqrt(np.max(self.column_norms_squared(n))))

  def fingerprint(self, n: int) -> np.ndarray:
    """A float64 array that determines C on n steps (Toeplitz: ``coefficients(n)``)."""
    return np.asarray(self.coefficients(self.check_num_steps(n)), np.float64)


@dataclasses.dataclass(frozen=True, eq=False)
class BandMF(Strategy):
  """Banded lower-triangular Toeplitz strategy: ``C[t, s] = coefs[t - s]`` for ``0 <= t - s < bands``.

  ``coefs[0] > 0``; ``bands = len(coefs)``. The coefficients are stored divided
  by ``coefs[0]`` (so ``coefs[0] = 1``): the mechanism is invariant to the scale
  of C (the noise std ``sigma S s_1`` scales with it). Refused (ValueError,
  before any work): non-finite or boolean coefficients, ``coefs[0] <= 0``, a
  ``coefs[0] / max_j |coefs[j]|`` that is not a positive normal float32, and
  an unstable inverse (``sum_j c_j z^j`` with a root in ``|z| <= 1``, module
  docstring). ``BandMF.dp_sgd()`` (one band, ``c_0 = 1``) is DP-SGD's ``C = I``.
  Optimised coefficients come from
  :func:`jaxdp.dpsgd.correlated.optimize_bandmf`.
  """

  coefs: np.ndarray

  def __post_init__(self):
    c = _as_float64_vector(self.coefs, "coefs")
    if c[0] <= 0:
      raise ValueError(f"coefs[0] (the diagonal of C) must be > 0, got {c[0]}.")
    if not c[0] / np.max(np.abs(c)) >= _F32_TINY:
      raise ValueError(f"coefs[0] / max|coefs| = {c[0] / np.max(np.abs(c)):.3g} is not a positive "
                       "normal float32: the streamed noise divides by c_0 in float32.")
    c = c / c[0]
    if not np.isfinite(np.linalg.norm(c)) or np.linalg.norm(c) > _F32_MAX:
      raise ValueError("coefs / coefs[0] has a norm that overflows float32.")
    if not toeplitz_polynomial_is_stable(c):
      root = _smallest_root_modulus(c)
      where = "" if root is None else f" (smallest root modulus {root:.6g})"
      raise ValueError(
          "coefs define an unstable strategy: sum_j c_j z^j has a root in the closed unit disk"
          f"{where}, so the streamed noise w_t = (z_t - sum_j c_j w_(t-j)) / c_0 grows without "
          "bound. Use coefficients whose polynomial has every root outside |z| <= 1 (e.g. from "
          "optimize_bandmf).")
    object.__setattr__(self, "coefs", _frozen(c))

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
class BLT(Strategy):
  """Buffered linear Toeplitz strategy (Dvijotham et al. 2024, Definition 1 form).

  ``c_0 = 1``, ``c_j = sum_i omega_i theta_i^(j - 1)`` for ``j >= 1``, with
  buffer decays ``theta_i`` in (0, 1) and weights ``omega_i >= 0``. The
  inverse noise ``w = C^{-1} z`` streams with one d-vector buffer per
  ``theta_i``: ``w_t = z_t - sum_i omega_i S_i``, then ``S_i <- theta_i S_i + w_t``
  (``S_i`` starts at 0), derived from ``C w = z`` row by row. Refused: a
  recursion whose state matrix ``diag(theta) - 1 omega^T`` has spectral radius
  >= 1 (the noise would grow without bound; module docstring).
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
    if not np.sum(omega / (1.0 + theta)) < 1.0:
      radius = blt_inverse_spectral_radius(theta, omega)
      if not radius < 1.0:
        raise ValueError(
            f"theta and omega define an unstable BLT: the inverse recursion S <- (diag(theta) - "
            f"1 omega^T) S + 1 z_t has spectral radius {radius:.6g} >= 1, so the streamed noise "
            "C^{-1} z grows without bound. Use smaller omega (sum(omega) < 1 is always stable; "
            "optimize_blt's strategies satisfy it).")
    object.__setattr__(self, "theta", _frozen(theta))
    object.__setattr__(self, "omega", _frozen(omega))

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


def _band_mask(n: int, bands: int) -> np.ndarray:
  """``mask[t, r] = t + r < n``: the entries of an (n, bands) band table inside the matrix."""
  return (np.arange(n)[:, None] + np.arange(bands)[None, :]) < n


def banded_inverse_max_row_norm(table: np.ndarray) -> float:
  """``max_t ||row_t(C^{-1})||`` (float64) for the banded C with ``table[t, r] = C[t + r, t]``.

  Row t of ``W = C^{-1}`` is ``(e_t - sum_{r>=1} C[t, t-r] W[t-r]) / C[t, t]``;
  O(n^2 bands) time, O(n bands) memory. Stops early (returning inf) once a row
  norm exceeds :data:`MAX_INVERSE_ROW_NORM` or overflows.
  """
  n, bands = table.shape
  m = bands - 1
  window = np.zeros((max(m, 1), n))  # window[(t - r) mod m] = W[t - r]
  worst = 0.0
  for t in range(n):
    row = np.zeros(n)
    row[t] = 1.0
    if m:
      r = np.arange(1, min(m, t) + 1)
      coef = table[t - r, r]  # C[t, t - r]
      row -= coef @ window[(t - r) % m]
    row /= table[t, 0]
    norm = float(np.sqrt(row @ row))
    if not np.isfinite(norm) or norm > MAX_INVERSE_ROW_NORM:
      return math.inf
    worst = max(worst, norm)
    if m:
      window[t % m] = row
  return worst


@dataclasses.dataclass(frozen=True, eq=False)
class ColumnNormalizedBanded(Strategy):
  """A general (non-Toeplitz) lower-triangular banded C for n steps, columns of unit norm.

  ``table`` has shape ``(n, bands)`` and holds the columns of C:
  ``C[t + r, t] = table[t, r]`` (``0 <= r < bands``, ``t + r < n``; entries
  with ``t + r >= n`` lie outside the matrix and must be 0), so row t of the
  table is the nonzero part of column t. Stored scaled to unit norm
  (``||C[:, t]|| = 1``): the same parametrisation as JAX Privacy's
  ``banded.ColumnNormalizedBanded`` (whose ``params`` are this table before the
  normalisation), optimised by
  :func:`~jaxdp.dpsgd.correlated.optimize_column_normalized_banded`.

  Its single-participation sensitivity is 1 and, under (k, b) participation
  with ``bands <= b``, columns of two participations (at least b apart) have
  disjoint supports, so the cross terms of ``||sum_i C[:, p_i] u_i||^2``
  vanish and ``sens^2 = sum_i ||C[:, p_i]||^2 = k`` exactly: ``sens = sqrt(k)
  * max_t ||C[:, t]|| = sqrt(k)`` (:mod:`.sensitivity`, ``"orthogonal"``).
  A run may use the first ``num_steps <= n`` steps (the top-left block of C).

  Refused (before any work): non-finite or boolean entries, a diagonal
  ``table[:, 0] <= 0`` or one that is not a normal float32 after the
  normalisation, nonzero entries outside the matrix, and a ``C^{-1}`` with a
  row norm above :data:`MAX_INVERSE_ROW_NORM` (module docstring).
  """

  table: np.ndarray

  def __post_init__(self):
    x = _as_float64_array(self.table, "table", 2)
    n, bands = x.shape
    if bands > n:
      raise ValueError(f"table must have shape (n, bands) with bands <= n, got {x.shape}.")
    mask = _band_mask(n, bands)
    if np.any(x[~mask] != 0):
      raise ValueError("table[t, r] with t + r >= n lies outside the n x n matrix and must be 0.")
    if not np.all(x[:, 0] > 0):
      raise ValueError("table[:, 0] (the diagonal of C) must be > 0.")
    norms = np.sqrt(np.sum(x * x, axis=1))
    if not np.all(np.isfinite(norms)):  # overflow of the squares: rescale each row first
      peak = np.max(np.abs(x), axis=1, keepdims=True)
      x = x / peak
      norms = np.sqrt(np.sum(x * x, axis=1))
    x = x / norms[:, None]
    if not np.all(x[:, 0] >= _F32_TINY):
      raise ValueError("table[:, 0] / ||table[t]|| (the diagonal of the column-normalised C) must "
                       "be a positive normal float32: the streamed noise divides by it.")
    growth = banded_inverse_max_row_norm(x)
    if not growth <= MAX_INVERSE_ROW_NORM:
      raise ValueError(
          f"table defines an unstable strategy: C^(-1) has a row of norm > {MAX_INVERSE_ROW_NORM:.3g}"
          " (2^23), so the streamed noise C^(-1) z would be amplified beyond float32 precision. "
          "Use a better-conditioned table (e.g. from optimize_column_normalized_banded).")
    object.__setattr__(self, "table", _frozen(x))

  is_toeplitz = False

  @classmethod
  def from_toeplitz(cls, coefs, num_steps) -> "ColumnNormalizedBanded":
    """The banded Toeplitz ``C[t, s] = coefs[t - s]`` on n steps, its columns normalised.

    ``coefs`` is a vector or a :class:`BandMF`.
    """
    n = _validation.check_positive_int(num_steps, "num_steps")
    c = coefs.coefs if isinstance(coefs, BandMF) else _as_float64_vector(coefs, "coefs")
    if c.size > n:
      raise ValueError(f"len(coefs) must be <= num_steps ({n}), got {c.size}.")
    table = np.where(_band_mask(n, c.size), c[None, :], 0.0)
    return cls(table)

  @property
  def n(self) -> int:
    return int(self.table.shape[0])

  @property
  def max_steps(self) -> int:
    return self.n

  @property
  def bands(self) -> int:
    return int(self.table.shape[1])

  @property
  def state_size(self) -> int:
    """Noise vectors the streaming generator keeps (``bands - 1``)."""
    return self.bands - 1

  def band_table(self, n: int) -> np.ndarray:
    """The (n, bands) table of the top-left n x n block (entries past row n zeroed)."""
    n = self.check_num_steps(n)
    return np.where(_band_mask(n, self.bands), self.table[:n], 0.0)

  def matrix(self, n: int | None = None) -> np.ndarray:
    """Dense n x n C (float64; default the full n)."""
    n = self.n if n is None else self.check_num_steps(n)
    t = self.band_table(n)
    out = np.zeros((n, n))
    cols = np.arange(n)
    for r in range(min(self.bands, n)):
      out[cols[:n - r] + r, cols[:n - r]] = t[:n - r, r]
    return out

  def column_norms_squared(self, n: int) -> np.ndarray:
    t = self.band_table(n)
    return np.sum(t * t, axis=1)

  def fingerprint(self, n: int) -> np.ndarray:
    return self.band_table(n).ravel()

  def __repr__(self) -> str:
    return f"ColumnNormalizedBanded(n={self.n}, bands={self.bands})"


__all__ = ["BLT", "BandMF", "ColumnNormalizedBanded", "MAX_INVERSE_ROW_NORM", "Strategy",
           "banded_inverse_max_row_norm", "blt_inverse_spectral_radius", "toeplitz_inverse_coefs",
           "toeplitz_matrix", "toeplitz_polynomial_is_stable"]
