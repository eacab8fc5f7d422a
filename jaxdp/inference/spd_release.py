r"""PrivSPDMat: private release of a symmetric positive (semi)definite matrix.

Paper 003 = ``../shared/papers/003_dp_confidence_intervals_for_erm.md``, Sec. 4.3,
**Algorithm 2** and **Lemma 1** (proof App. A.2).

Given a symmetric ``M`` (``d x d``) with L2 (Frobenius) sensitivity ``Delta`` and the privacy
parameter ``phi`` of Algorithm 2 (``epsilon`` for pure DP, ``rho`` for zCDP):

1. ``M~ = M + mat(eta)`` with ``eta`` in ``R^{d^2}``:

   * pure DP (``privacy="pure"``): density ``∝ exp(-(phi/Delta) ||eta||_2)`` (the spherical
     Laplace of paper 003 Eq. 3.2, :func:`jaxdp.mechanisms.l2_laplace_noise`);
     ``phi``-DP by the triangle inequality (App. A.2 (1));
   * zCDP (``privacy="zcdp"``): ``eta ~ N(0, Delta^2/(2 phi) I)`` (Bun & Steinke 2016, paper 003
     Prop. 3; :func:`jaxdp.mechanisms.gaussian_noise`); ``phi``-zCDP.

2. Post-processing (no privacy cost, App. A.2): symmetrise ``(M~ + M~^T)/2``, eigen-decompose,
   raise every eigenvalue to at least ``floor``, recompose.

Floors (beyond the paper). Algorithm 2 line 13 floors at ``2c`` (our ``Lambda = l2_reg``)
for both matrices. That is right for the Hessian (``H >= Lambda I`` for a convex loss, and
its inverse is taken), but the gradient covariance's true eigenvalues can be far below
``Lambda`` (about ``3e-4`` on Adult), so lifting them to ``Lambda`` lengthens the intervals.
Any floor is post-processing of ``M~`` (a data-independent map applied to a private
output), so it keeps the ``phi``-DP / ``phi``-zCDP guarantee of step 1 exactly; floor 0
still returns a PSD matrix, which is all that sampling ``N(0, Sigma~)`` needs. See
:data:`FLOORS` in :mod:`jaxdp.inference.intervals`.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

from jaxdp import _validation
from jaxdp.accounting import events
from jaxdp.mechanisms.gaussian import gaussian_noise
from jaxdp.mechanisms.l2_laplace import l2_laplace_noise

PRIVACY = ("pure", "zcdp")


def check_privacy(privacy: str) -> str:
  """Raises ValueError unless ``privacy`` is ``"pure"`` (eps-DP) or ``"zcdp"`` (rho-zCDP)."""
  if privacy not in PRIVACY:
    raise ValueError(f"privacy must be one of {PRIVACY}, got {privacy!r}.")
  return privacy


def spd_noise(key: jax.Array, dim: int, sensitivity: Any, phi: Any, *, privacy: str,
              dtype: Any = jnp.float32) -> jax.Array:
  r"""The ``(dim, dim)`` noise matrix ``mat(eta)`` of Algorithm 2 lines 1-7.

  ``phi`` is Algorithm 2's privacy parameter: ``epsilon`` for ``privacy="pure"``, ``rho`` for
  ``"zcdp"``. ``sensitivity`` and ``phi`` may be traced (vmap over them); ``phi = inf`` gives
  zeros. Pure: spherical Laplace with ``gamma = phi / sensitivity``; zCDP: Gaussian with
  ``sigma = sensitivity / sqrt(2 phi)``.
  """
  check_privacy(privacy)
  if privacy == "pure":
    return l2_laplace_noise(key, (dim, dim), phi / sensitivity, dtype)
  return gaussian_noise(key, (dim, dim), sensitivity / jnp.sqrt(2.0 * phi), dtype)


def symmetrize_and_floor(matrix: jax.Array, floor: Any) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Algorithm 2 lines 9-15: ``(V diag(max(lam, floor)) V^T, max(lam, floor), V)``.

  Pure post-processing. Also returns the floored eigenvalues and eigenvectors, which the
  interval construction reuses (inverse and square root without another decomposition).
  """
  sym = 0.5 * (matrix + matrix.T)
  lam, vec = jnp.linalg.eigh(sym)
  lam = jnp.maximum(lam, floor)
  return (vec * lam) @ vec.T, lam, vec


def priv_spd_matrix(key: jax.Array, matrix: jax.Array, sensitivity: Any, phi: Any, *,
                    privacy: str = "pure", floor: Any = 0.0) -> jax.Array:
  r"""PrivSPDMat (paper 003 Algorithm 2): ``phi``-DP or ``phi``-zCDP release of a symmetric matrix.

  Args:
    key: a ``jax.random`` key, used once.
    matrix: ``(d, d)`` symmetric matrix computed from the data.
    sensitivity: its L2 (Frobenius) sensitivity under the neighbouring relation the
      caller accounts for (replace-one for paper 003 Lemmas 2-5), ``> 0``.
    phi: the privacy parameter ``phi`` of Algorithm 2: epsilon for ``privacy="pure"``, rho
      for ``"zcdp"``; ``> 0`` (``inf``: no noise).
    privacy: ``"pure"`` or ``"zcdp"``.
    floor: lower bound on the released eigenvalues (paper: ``2c``; see the module docstring);
      a real number (``-inf`` allowed: no floor), not NaN or ``+inf``.

  Returns:
    The released ``(d, d)`` symmetric matrix with every eigenvalue ``>= floor``.

  Raises:
    ValueError: naming ``sensitivity`` (not ``> 0``), ``phi`` (not ``> 0``), ``floor``
      (NaN, ``+inf`` or not a real scalar), ``privacy``, or ``matrix`` (not square, not finite).

  Describe the release with :func:`priv_spd_matrix_event`. Traced arguments are not
  validated (the pipeline in :mod:`jaxdp.inference.intervals` validates on the host).
  """
  _validation.check_key(key)
  check_privacy(privacy)
  for val, name in ((sensitivity, "sensitivity"), (phi, "phi")):
    if not isinstance(val, jax.core.Tracer):
      _validation.check_positive(val, name, allow_inf=(name == "phi"))
  if not isinstance(floor, jax.core.Tracer):
    fl = float(floor) if _is_real_scalar(floor) else None
    if fl is None or math.isnan(fl) or fl == math.inf:
      raise ValueError(f"floor must be a real number (an eigenvalue lower bound, -inf allowed), "
                       f"got {floor!r}.")
  matrix = jnp.asarray(matrix)
  if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1]:
    raise ValueError(f"matrix must be square (d, d), got shape {matrix.shape}.")
  _validation.check_finite_if_concrete(matrix, "matrix")
  dtype = matrix.dtype if jnp.issubdtype(matrix.dtype, jnp.floating) else jnp.float32
  noisy = matrix.astype(dtype) + spd_noise(key, matrix.shape[0], sensitivity, phi,
                                           privacy=privacy, dtype=dtype)
  return symmetrize_and_floor(noisy, floor)[0]


def _is_real_scalar(value: Any) -> bool:
  if isinstance(value, (bool, str)) or jnp.ndim(value) != 0:
    return False
  try:
    float(value)
  except (TypeError, ValueError):
    return False
  return not jnp.iscomplexobj(value)


def priv_spd_matrix_event(phi: float, *, privacy: str = "pure",
                          neighbouring: str = "replace_one",
                          unit: str = "example") -> events.DpEvent:
  """DpEvent of one :func:`priv_spd_matrix` call (paper 003 Lemma 1).

  ``phi`` is Algorithm 2's privacy parameter (epsilon for ``privacy="pure"``, rho for
  ``"zcdp"``). ``PureDpEvent(phi)`` or ``ZCDpEvent(phi)`` (``NonPrivateDpEvent`` for
  ``phi = inf``), tagged with the relation the sensitivity was computed for (paper 003
  Lemmas 2-5: replace-one) and the privacy unit.
  """
  check_privacy(privacy)
  phi = _validation.check_positive(phi, "phi", allow_inf=True)
  if math.isinf(phi):
    return events.NonPrivateDpEvent()
  if privacy == "pure":
    return events.PureDpEvent(phi, neighbouring=neighbouring, unit=unit)
  return events.ZCDpEvent(phi, neighbouring=neighbouring, unit=unit)
