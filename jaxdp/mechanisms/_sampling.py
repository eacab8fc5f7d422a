"""Continuous samplers with long float32 tails.

``jax.random.laplace`` and ``jax.random.normal`` map one float32 uniform with a
2^-23 grid through the inverse CDF, so their float32 output is bounded:
``|Lap(1)| <= ~16.6`` and ``|N(0, 1)| <= ~5.42``. Bounded noise breaks the
density-ratio argument of the Laplace/Gaussian mechanisms at the edge of the
support: an output beyond ``f(D') + bound`` is possible under ``D`` and
impossible under ``D'``. For a Gaussian with ``Delta/sigma = 0.27`` in
``d = 7840`` coordinates the mass of such outputs is of order
``phi(5.42) sqrt(d) Delta/sigma ~ 4e-6``, the size of a typical ``delta``.

Here the tail-relevant uniform has a 2^-46 grid (two 23-bit words), so
``Exp(1) = -log U`` reaches ``46 ln 2 = 31.9``: ``|Lap(1)| <= 31.9`` (tail
mass beyond ``e^-31.9 = 1.4e-14``) and ``|N(0,1)| <= sqrt(2 * 31.9) = 7.99``
(tail mass ``1.4e-15``). Laplace: ``sign * E``. Gaussian: Box-Muller,
``sqrt(2E) (cos 2 pi V, sin 2 pi V)`` with ``E ~ Exp(1)``, ``V ~ U[0, 1)``
(Box & Muller 1958: ``2E = R^2 ~ chi^2_2`` and the angle is uniform). The
remaining floating-point caveat (outputs lie on a float grid; Mironov 2012) is
listed in ``docs/sharp_edges.md``.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

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


def standard_normal(key: jax.Array, shape: tuple[int, ...], dtype: Any) -> jax.Array:
  """``N(0, 1)`` by Box-Muller with a long-tailed radius, ``|x| <= 7.99``."""
  cdt = _compute_dtype(dtype)
  size = int(np.prod(shape, dtype=np.int64))
  pairs = (size + 1) // 2
  words = jax.random.bits(key, (3, pairs), jnp.uint32)
  radius = jnp.sqrt(2.0 * exponential_from_bits(words[0], words[1], cdt))
  angle = (2.0 * np.pi) * uniform_from_bits(words[2], cdt)
  z = jnp.concatenate([radius * jnp.cos(angle), radius * jnp.sin(angle)])
  return z[:size].reshape(shape).astype(dtype)


def standard_gamma_integer(key: jax.Array, dim: int, dtype: Any) -> jax.Array:
  """``Gamma(dim, 1)`` for an integer ``dim`` as a sum of ``dim`` i.i.d. ``Exp(1)``.

  Exact in law (no rejection loop, no truncation near the mean: the support
  reaches ``31.9 dim``), at the cost of ``2 dim`` random words.
  """
  cdt = _compute_dtype(dtype)
  words = jax.random.bits(key, (2, dim), jnp.uint32)
  return jnp.sum(exponential_from_bits(words[0], words[1], cdt)).astype(dtype)
