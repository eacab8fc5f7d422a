"""Continuous samplers with long float32 tails.

``jax.random.laplace`` and ``jax.random.normal`` map one float32 uniform with a
2^-23 grid through the inverse CDF, so their float32 output is bounded:
``|Lap(1)| <= ~16.6`` and ``|N(0, 1)| <= ~5.42``. Bounded noise breaks the
density-ratio argument of the Laplace/Gaussian mechanisms at the edge of the
support: an output beyond ``f(D') + bound`` is possible under ``D`` and
impossible under ``D'``. For a Gaussian with ``Delta/sigma = 0.27`` in
``d = 7840`` coordinates the mass of such outputs is of order
``phi(5.42) sqrt(d) Delta/sigma ~ 4e-6``, the size of a typical ``delta``.

Laplace: the tail-relevant uniform has a 2^-46 grid (two 23-bit words), so
``Exp(1) = -log U`` reaches ``46 ln 2 = 31.9``: ``|Lap(1)| <= 31.9`` (tail
mass beyond ``e^-31.9 = 1.4e-14``), ``sign * E``.

Gaussian: Box-Muller (Box & Muller 1958: ``2E = R^2 ~ chi^2_2`` and the angle
is uniform), ``sqrt(2E) (cos 2 pi V, sin 2 pi V)`` with ``E = -log U``, from
exactly 64 random bits per PAIR of outputs, both words of one Threefry-2x32
block (``jax.random.normal`` spends a whole block per output): 41 bits for
the radius uniform ``U`` on a 2^-41 grid in (0, 1] and 23 bits for the
angle ``V``. So
``|N(0,1)| <= sqrt(2 * 41 ln 2) = 7.54`` (``P(|Z| > 7.54) = 4.7e-14``; the
boundary mass of the first paragraph becomes ``phi(7.54) sqrt(d) Delta/sigma
~ 2e-13 sqrt(d) Delta/sigma``, ~1e-10 even for a million coordinates). The
angle's cosine and sine are evaluated without ``jnp.cos``/``jnp.sin``: the
angle is ``q pi/2 + x`` with the quadrant ``q`` and ``|x| <= pi/4`` read off
the integer angle exactly, and ``sin x``, ``cos x`` are Taylor polynomials of
degree 9 and 10 (truncation error ``< 2e-9`` on ``|x| <= pi/4``; measured
``<= 1e-7`` absolute with float32 rounding). These choices make the sampler
about twice as fast as ``jax.random.normal`` on CPU; the Threefry counters
form an even-length array (odd lengths are several times slower on
XLA:CPU), and the two halves are joined along an array axis (see
:func:`standard_normal`).

The remaining floating-point caveat (outputs lie on a float grid; Mironov 2012) is
listed in ``docs/sharp_edges.md``.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.random import threefry2x32_p as _threefry2x32_p

_MANTISSA_BITS = 23
_TWO_POW_M23 = float(2.0**-_MANTISSA_BITS)


def exponential_from_bits(word_hi: jax.Array, word_lo: jax.Array, dtype: Any) -> jax.Array:
  """``Exp(1) = -log U`` with ``U = (hi * 2^23 + lo + 1) 2^-46`` in ``(0, 1]``.

  ``hi`` and ``lo`` are the top 23 bits of two uint32 words, so ``U`` is uniform
  on a grid of ``2^46`` points and ``-log U`` ranges over ``[0, 46 ln 2]``.
  """
  hi = (word_hi >> 9).astype(dtype)
  lo = ((word_lo >> 9) + 1).astype(dtype)
  u = (hi + lo * _TWO_POW_M23) * _TWO_POW_M23  # exact for hi = 0, <= 1 ulp otherwise
  return -jnp.log(u)


def uniform_from_bits(word: jax.Array, dtype: Any) -> jax.Array:
  """``U[0, 1)`` on a 2^-23 grid from the top 23 bits of a uint32 word."""
  return (word >> 9).astype(dtype) * _TWO_POW_M23


def _compute_dtype(dtype: Any) -> Any:
  # at least float32 for the bit-to-float construction, even for bf16/fp16 output
  return jnp.promote_types(dtype, jnp.float32)


def standard_laplace(key: jax.Array, shape: tuple[int, ...], dtype: Any) -> jax.Array:
  """``Lap(1)`` (density ``e^{-|x|}/2``) as ``sign * Exp(1)``, ``|x| <= 31.9``."""
  cdt = _compute_dtype(dtype)
  words = jax.random.bits(key, (2,) + shape, jnp.uint32)
  magnitude = exponential_from_bits(words[0], words[1], cdt)
  sign = jnp.where((words[0] >> 8) & 1 == 1, 1.0, -1.0).astype(cdt)
  return (sign * magnitude).astype(dtype)


_RADIUS_BITS = 41  # 32 bits of word 0 + the low 9 bits of word 1
_HALF_PI_2M21 = float(np.pi / 2.0 * 2.0**-21)


def radius_uniform_from_bits(word0: jax.Array, word1: jax.Array, dtype: Any) -> jax.Array:
  """``U = (hi + (mid + 1) 2^-18) 2^-23`` in ``(0, 1]`` on a 2^-41 grid.

  ``hi`` = the top 23 bits of ``word0``; ``mid`` = its low 9 bits followed by
  the low 9 bits of ``word1`` (18 bits). ``hi`` and ``mid + 1 <= 2^18`` are
  exact in float32, and for ``hi = 0`` (the tail, ``U <= 2^-23``) so is ``U``;
  otherwise ``U`` is rounded once (relative error ``<= 2^-24``).
  """
  hi = (word0 >> 9).astype(dtype)
  mid = (((word0 & 511) << 9) | (word1 & 511)) + 1
  return (hi + mid.astype(dtype) * float(2.0**-18)) * _TWO_POW_M23


def cos_sin_from_bits(word: jax.Array, dtype: Any) -> tuple[jax.Array, jax.Array]:
  """``(cos 2 pi V, sin 2 pi V)`` for ``V = ((word >> 9) + 1/2) 2^-23``, uniform on a 2^-23 grid.

  With ``a = word >> 9`` (23 bits) the angle is ``q pi/2 + x``: ``q = round(a /
  2^21)`` and ``x = (a - q 2^21 + 1/2) pi/2^22`` with ``|x| < pi/4`` (integer
  arithmetic then one exact float32 conversion); ``sin x`` and ``cos x`` are
  their Taylor polynomials to degree 9 and 10 (remainder
  ``<= (pi/4)^11/11! = 2e-9``), rotated by ``q mod 4`` quarter turns.

  The half-step offset keeps the grid off the multiples of ``pi/2`` (it is
  symmetric under ``V -> 1 - V`` and quarter turns, so the angle stays uniform
  on its grid): neither output is ever exactly 0. Without it, ``cos`` or
  ``sin`` is exactly 0 with probability ``2^-22``, and a 1-D uniform direction
  ``g/|g|`` (``l2_laplace_noise`` of one coordinate) came out as ``0/0 = NaN``.
  """
  a = (word >> 9).astype(jnp.int32)
  q = (a + (1 << 20)) >> 21  # 0..4
  x = ((a - (q << 21)).astype(dtype) + 0.5) * _HALF_PI_2M21
  x2 = x * x
  s = x * (1.0 + x2 * (-1.0 / 6 + x2 * (1.0 / 120 + x2 * (-1.0 / 5040 + x2 * (1.0 / 362880)))))
  c = 1.0 + x2 * (-0.5 + x2 * (1.0 / 24 + x2 * (-1.0 / 720 + x2 * (1.0 / 40320
                                                                  + x2 * (-1.0 / 3628800)))))
  q = q & 3
  cos = jnp.where(q == 0, c, jnp.where(q == 1, -s, jnp.where(q == 2, -c, s)))
  sin = jnp.where(q == 0, s, jnp.where(q == 1, c, jnp.where(q == 2, -s, -c)))
  return cos, sin


def normal_pairs_from_bits(word0: jax.Array, word1: jax.Array,
                           dtype: Any) -> tuple[jax.Array, jax.Array]:
  """Box-Muller: two independent ``N(0, 1)`` arrays from two uint32 word arrays.

  See the module docstring.
  """
  radius = jnp.sqrt(-2.0 * jnp.log(radius_uniform_from_bits(word0, word1, dtype)))
  cos, sin = cos_sin_from_bits(word1, dtype)
  return radius * cos, radius * sin


def _is_threefry_key(key: jax.Array) -> bool:
  if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
    return "threefry" in str(jax.random.key_impl(key)).lower()
  return key.shape[-1:] == (2,) and "threefry" in str(jax.config.jax_default_prng_impl).lower()


def threefry_word_pairs(key: jax.Array, shape: tuple[int, ...]) -> tuple[jax.Array, jax.Array]:
  """Two independent uint32 arrays of ``shape``: both output words of one Threefry block each.

  ``jax.random.bits(key, shape, uint32)`` evaluates one Threefry-2x32 block
  per 32-bit word and XORs its two output words; here block ``i`` (counter
  ``(0, i)`` under ``key``) supplies word ``i`` of BOTH arrays, half the
  Threefry work per random bit (Salmon et al. 2011: each block of a
  counter-based generator is an independent 64-bit draw). The counter
  array has even length (odd lengths are several times slower on XLA:CPU).
  Keys of another PRNG implementation use ``jax.random.bits``.
  """
  size = int(np.prod(shape, dtype=np.int64))
  count = size + size % 2
  if not _is_threefry_key(key) or count >= 2**32:
    words = jax.random.bits(key, (2,) + tuple(shape), jnp.uint32)
    return words[0], words[1]
  data = jax.random.key_data(key) if jnp.issubdtype(key.dtype, jax.dtypes.prng_key) else key
  data = data.astype(jnp.uint32)
  lo = jax.lax.iota(jnp.uint32, count)
  w0, w1 = _threefry2x32_p.bind(data[0], data[1], jnp.zeros_like(lo), lo)
  if count != size:
    w0, w1 = w0[:size], w1[:size]
  return w0.reshape(shape), w1.reshape(shape)


def standard_normal(key: jax.Array, shape: tuple[int, ...], dtype: Any) -> jax.Array:
  """``N(0, 1)`` by Box-Muller with a 41-bit radius uniform, ``|x| <= 7.54``.

  One Threefry block (:func:`threefry_word_pairs`) per pair of outputs. When
  some axis has even length (the first with a length divisible by 4, else
  the first even one: axis ``k``), word pairs of
  ``shape`` with axis ``k`` halved give the cosine half and the sine half of
  that axis, concatenated along it (XLA:CPU fuses that into a consumer such
  as ``grad + noise``; a flat concatenation reshaped to ``shape`` is not
  fused and costs twice as much). Otherwise (odd size) ``ceil(size/2)`` word
  pairs give a flat cosine half followed by the first ``floor(size/2)`` sines.
  """
  cdt = _compute_dtype(dtype)
  shape = tuple(int(d) for d in shape)
  # prefer an axis whose half is even too: the counter array is then even-length without a slice
  even = ([i for i, d in enumerate(shape) if d % 4 == 0]
          + [i for i, d in enumerate(shape) if d % 4 == 2])
  if even:
    axis = even[0]
    half = shape[:axis] + (shape[axis] // 2,) + shape[axis + 1:]
    w0, w1 = threefry_word_pairs(key, half)
    z_cos, z_sin = normal_pairs_from_bits(w0, w1, cdt)
    return jnp.concatenate([z_cos, z_sin], axis=axis).astype(dtype)
  size = int(np.prod(shape, dtype=np.int64))
  pairs = (size + 1) // 2
  w0, w1 = threefry_word_pairs(key, (pairs,))
  z_cos, z_sin = normal_pairs_from_bits(w0, w1, cdt)
  # slice before concatenating: a slice of the concatenation is not fused on XLA:CPU
  z = jnp.concatenate([z_cos, z_sin[:size - pairs]])
  return z.reshape(shape).astype(dtype)


def standard_gamma_integer(key: jax.Array, dim: int, dtype: Any) -> jax.Array:
  """``Gamma(dim, 1)`` for an integer ``dim`` as a sum of ``dim`` i.i.d. ``Exp(1)``.

  Exact in law (no rejection loop, no truncation near the mean: the support
  reaches ``31.9 dim``), at the cost of ``2 dim`` random words.
  """
  cdt = _compute_dtype(dtype)
  words = jax.random.bits(key, (2, dim), jnp.uint32)
  return jnp.sum(exponential_from_bits(words[0], words[1], cdt)).astype(dtype)
