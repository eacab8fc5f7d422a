"""Continuous samplers whose float32 tails reach beyond any relevant ``delta``.

Why tails matter. ``jax.random.laplace`` and ``jax.random.normal`` map one
float32 uniform with a 2^-23 grid through the inverse CDF, so their float32
output is bounded: ``|Lap(1)| <= ~16.6`` and ``|N(0, 1)| <= ~5.42``. Bounded
noise breaks the density-ratio argument of the Laplace/Gaussian mechanisms at
the edge of the support: an output beyond ``f(D') + bound`` is possible under
``D`` and impossible under ``D'``. For a Gaussian with ``Delta/sigma = 0.27`` in
``d = 7840`` coordinates the mass of such outputs is of order
``phi(5.42) sqrt(d) Delta/sigma ~ 4e-6``, the size of a typical ``delta``.

No sampler that consumes a bounded number of random bits can be exactly
pure-DP (or zCDP): its noise takes finitely many values, so the largest output
``f(D) + max noise`` is impossible under a neighbour with ``f(D') < f(D)``, an
infinite privacy loss with probability at least the mass of that atom
(``>= 2^-bits``). The achievable goal is to make that probability negligible
and to state it. Here every draw spends 128 random bits (two Threefry-2x32
blocks), which pushes the cut to:

* Laplace (:func:`standard_laplace`): 1 sign bit and a 127-bit uniform
  ``U = (N + 1) 2^-127``; ``E = -log U`` reaches ``127 ln 2 = 88.03``, so
  ``|Lap(1)| <= 88.03`` and the cut-off mass is ``P(Exp(1) > 127 ln 2) =
  2^-127 = 5.9e-39`` per coordinate (was ``31.9`` and ``1.4e-14`` with 46 bits).
* Gaussian (:func:`standard_normal`, Box-Muller, Box & Muller 1958:
  ``R^2/2 = E ~ Exp(1)`` and an independent uniform angle): per PAIR of outputs
  a 105-bit radius uniform and a 23-bit angle, so ``R <= sqrt(210 ln 2) = 12.06``
  (``|N(0, 1)| <= 12.06``, was ``7.54``) and the cut-off mass is
  ``P(R > 12.06) = 2^-105 = 2.5e-32`` per pair.
* Gamma / L2-Laplace radius (:func:`standard_gamma_integer`): a sum of ``d``
  exponentials from 128-bit uniforms, each cut at ``128 ln 2 = 88.7`` with mass
  ``2^-128 = 2.9e-39``.

The multi-word uniform is turned into ``-log U`` without subnormals
(:func:`exponential_from_words`): with ``j`` the first non-zero chunk of
``N``'s bits, ``-log U = (bits before chunk j) ln 2 - log(u_j)`` where
``u_j in (2^-32, 1]`` is read from chunks ``j`` and ``j + 1`` in float32
(the neglected lower chunks change ``u_j`` by a relative ``<= 2^-32``).

Formal statement (the tail is NOT added to the
DpEvents; the cut is pushed beyond any relevant ``delta`` and the residual is
stated here and in ``docs/sharp_edges.md``, "Floating-point outputs and the
discrete path"). Model the sampler in real arithmetic: the noise equals the
exact noise (``-log U*`` with ``U*`` uniform on ``(0, 1]``; Box-Muller with an
exact radius) except on the *tail event* ``T`` that some draw's ``U*`` falls
below ``2^-B`` (``B`` = 127, 105, 128 above), where the cut value is returned
instead. The two are coupled to agree outside ``T``, so their total variation
distance is at most ``tau = P(T) <= (number of draws) * 2^-B``. If the exact
mechanism is ``(eps, delta)``-DP, then for every output set ``S``
``P[M(D) in S] <= P[M*(D) in S] + tau <= e^eps P[M*(D') in S] + delta + tau
<= e^eps P[M(D') in S] + delta + (1 + e^eps) tau``: the sampler's mechanism is
``(eps, delta + (1 + e^eps) tau)``-DP. The same holds for every point of the
privacy profile an accountant computes from the events (pure ``eps``,
``rho``-zCDP converted to ``(eps, delta)``, composition: the ``tau`` of the
releases add up). So a "pure ``eps``-DP" release of ``d`` Laplace
coordinates is formally ``(eps, (1 + e^eps) d 2^-127)``-DP (for the Laplace
mechanism directly, ``(eps, (d - 1 + e^eps) 2^-127)``: the outputs whose
density ratio is not bounded by ``e^eps`` lie in the tail beyond
``88.03 - Delta_i/b`` in some coordinate ``i``), and a ``rho``-zCDP
Gaussian release of ``d`` coordinates is ``(eps, delta_rho(eps) + (1 + e^eps)
ceil(d/2) 2^-105)``-DP for every ``eps``. :func:`tail_delta` computes that
residual: a billion Gaussian coordinates per step for a million steps
(``2^50`` coordinates, ``2^49`` pairs) gives ``tau = 2^-56 = 1.4e-17``, i.e.
``5e-17`` at ``eps = 1`` and ``3e-13`` at ``eps = 10``; a million Laplace
coordinates gives ``(1 + e^eps) 6e-33``. Both are far below any ``delta`` in
use. (The exponential mechanism's Gumbel noise uses
``jax.random.gumbel(mode="highest")``, 64-bit uniforms: ``tau <= 2 C 2^-64``
per row of ``C`` candidates.)

What the real-arithmetic model leaves out is the float grid itself: outputs
are float32 numbers whose low-order bits depend on ``f(D)`` (Mironov 2012;
Jin et al. 2022), so no float mechanism is formally DP on arbitrary real
inputs. For low-dimensional releases use the discrete mechanisms of
:mod:`jaxdp.mechanisms.discrete` (exact integer noise on a public grid).

The angle's cosine and sine are evaluated without ``jnp.cos``/``jnp.sin``: the
angle is ``q pi/2 + x`` with the quadrant ``q`` and ``|x| <= pi/4`` read off
the integer angle exactly, and ``sin x``, ``cos x`` are Taylor polynomials of
degree 9 and 10 (truncation error ``< 2e-9`` on ``|x| <= pi/4``; measured
``<= 1e-7`` absolute with float32 rounding).

Speed. The random bits are Threefry-2x32 with 20 rounds (Salmon et al. 2011,
"Parallel random numbers: as easy as 1, 2, 3", SC'11), the generator of
``jax.random``'s default keys, evaluated by :func:`threefry2x32`: the rounds
written out as array operations, bit for bit the words of JAX's
``threefry2x32`` primitive, which XLA fuses with the transform that consumes
them (XLA:CPU runs the primitive as a loop of five passes over the whole
counter array whose result is written to memory before the transform reads
it). The two halves of the Box-Muller pairs are joined by a select along a
new axis of length 2 (see :func:`standard_normal`), which fuses into the
consumer (``grad + noise``) as one vectorised loop. On two CPU cores this
halves the time of 670,000 normals (Laplace: a third) against the primitive
and a concatenation, with identical output. Philox through XLA's
``RngBitGenerator`` (``jax.random.key(..., impl="rbg")``) is several times
slower than Threefry on XLA:CPU for the same number of bits and is not used.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

_LN2 = math.log(2.0)

# Bits of the tail-deciding uniform of one draw, and the cut-off mass 2^-bits.
LAPLACE_UNIFORM_BITS = 127
GAUSSIAN_RADIUS_BITS = 105
GAMMA_UNIFORM_BITS = 128
LAPLACE_CUT = LAPLACE_UNIFORM_BITS * _LN2  # |Lap(1)| <= 88.03
GAUSSIAN_CUT = math.sqrt(2.0 * GAUSSIAN_RADIUS_BITS * _LN2)  # |N(0, 1)| <= 12.06
LAPLACE_TAIL_PROB = 2.0**-LAPLACE_UNIFORM_BITS  # per coordinate
GAUSSIAN_TAIL_PROB = 2.0**-GAUSSIAN_RADIUS_BITS  # per Box-Muller pair
GAMMA_TAIL_PROB = 2.0**-GAMMA_UNIFORM_BITS  # per exponential summand


def tail_delta(epsilon: float, laplace_coordinates: int = 0, gaussian_coordinates: int = 0,
               gamma_summands: int = 0) -> float:
  """The residual ``(1 + e^eps) tau`` that the samplers' cut adds to ``delta`` (float64).

  ``tau`` bounds the probability that any of the listed draws falls beyond its
  cut: ``laplace_coordinates 2^-127 + ceil(gaussian_coordinates / 2) 2^-105 +
  gamma_summands 2^-128`` (an L2-Laplace draw of ``d`` coordinates has ``d``
  gamma summands and ``d`` Gaussian direction coordinates). See the module
  docstring for the coupling argument: a mechanism that is
  ``(eps, delta)``-DP with exact noise is ``(eps, delta + tail_delta(eps, ...))``-DP
  with these samplers.
  """
  tau = (laplace_coordinates * LAPLACE_TAIL_PROB
         + math.ceil(gaussian_coordinates / 2) * GAUSSIAN_TAIL_PROB
         + gamma_summands * GAMMA_TAIL_PROB)
  return (1.0 + math.exp(epsilon)) * tau


def exponential_from_words(chunks: Sequence[tuple[jax.Array, int]], dtype: Any) -> jax.Array:
  """``Exp(1) = -log U`` with ``U = (N + 1) 2^-B`` in ``(0, 1]``, ``N`` read from ``chunks``.

  ``chunks`` is a sequence of ``(word, width)``: uint32 arrays whose values are
  ``< 2^width`` (the caller masks them), most significant first; ``N`` is their
  concatenation and ``B`` the sum of the widths, so ``U`` is uniform on a grid
  of ``2^B`` points and ``-log U`` ranges over ``[0, B ln 2]``. Every width
  after the first must be 32 (so that reading two chunks is accurate to a
  relative ``2^-32``).

  With ``j`` the first non-zero chunk (the last one when all are zero) and
  ``s_j`` the widths before it, ``U = 2^-s_j u_j`` with
  ``u_j = c_j 2^-w_j + (c_{j+1} + [j+1 last]) 2^-(w_j + w_{j+1}) + ...`` (the
  last chunk alone: ``(c_last + 1) 2^-w_last``); ``u_j`` lies in
  ``(2^-32, 1]``, a normal float32, so ``-log U = s_j ln 2 - log u_j`` needs no
  subnormal and one ``log``.
  """
  words = [c for c, _ in chunks]
  widths = [int(w) for _, w in chunks]
  if any(w != 32 for w in widths[1:]) or not 0 < widths[0] <= 32:
    raise ValueError(f"chunk widths must be (w <= 32, 32, ..., 32), got {widths}.")
  last = len(words) - 1
  f = lambda c: c.astype(dtype)
  # last level: (c_last + 1) 2^-w_last (the +1 in float32: c_last + 1 may be 2^32)
  u = (f(words[last]) + 1.0) * float(2.0**-widths[last])
  shift = jnp.full(u.shape, float(sum(widths[:last])), dtype)
  for j in range(last - 1, -1, -1):
    nxt = f(words[j + 1]) + (1.0 if j + 1 == last else 0.0)
    u_j = f(words[j]) * float(2.0**-widths[j]) + nxt * float(2.0**-(widths[j] + widths[j + 1]))
    nonzero = words[j] != 0
    u = jnp.where(nonzero, u_j, u)
    shift = jnp.where(nonzero, float(sum(widths[:j])), shift)
  e_far = shift * _LN2 - jnp.log(u)
  # Near U = 1, u rounds to 1.0 in float32 (probability ~2^-(w_0 + 16)) and -log u
  # would be exactly 0 (a zero Box-Muller radius: 0/0 in a 1-D uniform direction).
  # There 1 - U = (~N) 2^-B exactly (complement of N in B bits), summed smallest
  # chunk first (each term exact, one rounding per add), and -log1p(-(1 - U)) is
  # accurate; it is 0 only when N = 2^B - 1 (probability 2^-B, as in real arithmetic),
  # or when 1 - U < 2^-126 flushes to zero as a float32 subnormal (B = 127 only:
  # probability 2^-126, an atom inside the stated tail residual's order).
  # Summed in units of 2^-ref, ref = the first two widths, so that every constant is a
  # normal float32 (XLA folds a product of constants into one, and 2^-127 is subnormal).
  ref = sum(widths[:2])
  scaled = jnp.zeros(u.shape, dtype)
  for j in range(last, -1, -1):
    complement = jnp.bitwise_and(jnp.invert(words[j]), np.uint32(2**widths[j] - 1))
    scaled = scaled + f(complement) * float(2.0**(ref - sum(widths[:j + 1])))
  one_minus_u = scaled * float(2.0**-ref)
  e_near = -jnp.log1p(-one_minus_u)
  return jnp.where(one_minus_u <= 0.5, e_near, e_far)


_HALF_PI_2M21 = float(np.pi / 2.0 * 2.0**-21)


def _compute_dtype(dtype: Any) -> Any:
  # at least float32 for the bit-to-float construction, even for bf16/fp16 output
  return jnp.promote_types(dtype, jnp.float32)


def _four_words(key: jax.Array, shape: tuple[int, ...]) -> list[jax.Array]:
  """Four independent uint32 arrays of ``shape`` from two Threefry blocks per entry."""
  w0, w1 = threefry_word_pairs(key, (2,) + tuple(shape))
  return [w0[0], w1[0], w0[1], w1[1]]


def _computed_once(words: Sequence[jax.Array]) -> list[jax.Array]:
  """``words`` unchanged, evaluated in one loop and stored, for consumers that read them twice.

  XLA:CPU fuses integer arithmetic into every consumer: in the joined Box-Muller
  halves each output recomputed its pair's second Threefry block, so every pair
  enciphered four blocks instead of two. Each word is summed with a zero along a
  new axis of length 2 (exact in uint32), one variadic reduce; XLA does not fuse a
  reduce into its consumers, and fuses the Threefry rounds of all four words into
  one loop with four outputs. On two CPU cores this takes a third off a
  ``(784, 512)`` draw, with identical output.
  """
  ops = [jnp.stack([w, jnp.zeros_like(w)], -1) for w in words]
  zero = np.uint32(0)
  out = jax.lax.reduce(ops, [zero] * len(ops), lambda x, y: tuple(a + b for a, b in zip(x, y)),
                       (ops[0].ndim - 1,))
  return list(out)


_LOW31 = np.uint32(0x7FFFFFFF)


def laplace_from_words(words: Sequence[jax.Array], dtype: Any) -> jax.Array:
  """``Lap(1)`` from four uint32 words: sign = top bit of word 0, ``Exp(1)`` from the other 127 bits."""
  a, b, c, d = words
  magnitude = exponential_from_words([(a & _LOW31, 31), (b, 32), (c, 32), (d, 32)], dtype)
  return jnp.where((a >> 31) == 1, magnitude, -magnitude)


def _static(shape: Sequence[int], dtype: Any) -> tuple[tuple[int, ...], Any]:
  """Hashable ``(shape, dtype)`` for the jitted samplers' static arguments."""
  return tuple(int(d) for d in shape), jnp.dtype(dtype)


# The samplers below are jitted with static shape and dtype: called eagerly, the
# ~100 primitives of one draw would otherwise be compiled and dispatched one by
# one for every new shape (seconds per shape on CPU); under an outer jit/vmap the
# inner jit is inlined, so traced callers see the same computation.


def standard_laplace(key: jax.Array, shape: tuple[int, ...], dtype: Any) -> jax.Array:
  """``Lap(1)`` (density ``e^{-|x|}/2``) as ``sign * Exp(1)``, ``|x| <= 127 ln 2 = 88.03``."""
  return _standard_laplace(key, *_static(shape, dtype))


@functools.partial(jax.jit, static_argnames=("shape", "dtype"))
def _standard_laplace(key: jax.Array, shape: tuple[int, ...], dtype: Any) -> jax.Array:
  cdt = _compute_dtype(dtype)
  size = int(np.prod(shape, dtype=np.int64))
  if size % 2 and _padded_layout_applies(key, size):
    # the words of _four_words(key, shape), flat: entry i from blocks i and size + i
    padded = _round_up(size, _PAD)
    lap = laplace_from_words(_padded_word_quads(key, size, padded), cdt).astype(dtype)
    return _scatter_flat(lap, jax.lax.iota(jnp.int32, padded), size).reshape(shape)
  return laplace_from_words(_four_words(key, shape), cdt).astype(dtype)


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


_LOW9 = np.uint32(511)


def normal_pairs_from_words(words: Sequence[jax.Array], dtype: Any) -> tuple[jax.Array, jax.Array]:
  """Box-Muller: two independent ``N(0, 1)`` arrays from four uint32 word arrays.

  The angle is the top 23 bits of ``words[3]`` (:func:`cos_sin_from_bits`);
  the radius is ``sqrt(2 E)`` with ``E = -log U`` for the 105-bit uniform made
  of the low 9 bits of ``words[3]`` followed by ``words[0..2]``
  (:func:`exponential_from_words`), so ``R <= sqrt(210 ln 2) = 12.06``.
  """
  a, b, c, d = words
  e = exponential_from_words([(d & _LOW9, 9), (a, 32), (b, 32), (c, 32)], dtype)
  radius = jnp.sqrt(2.0 * e)
  cos, sin = cos_sin_from_bits(d, dtype)
  return radius * cos, radius * sin


_THREEFRY_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_THREEFRY_PARITY = np.uint32(0x1BD11BDA)


def _rotate_left(x: jax.Array, r: int) -> jax.Array:
  return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def threefry2x32(k0: jax.Array, k1: jax.Array, x0: jax.Array,
                 x1: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Threefry-2x32 with 20 rounds: the block ``(x0, x1)`` enciphered under the key ``(k0, k1)``.

  Salmon et al. 2011 ("Parallel random numbers: as easy as 1, 2, 3"), the
  counter-based generator of ``jax.random``'s default keys: key schedule
  ``(k0, k1, k0 ^ k1 ^ 0x1BD11BDA)``, five groups of four rounds
  ``x0 += x1; x1 = rotl(x1, r) ^ x0`` with rotations ``(13, 15, 26, 6)`` and
  ``(17, 29, 16, 24)`` alternating, each group followed by the key injection
  ``x0 += ks[(g + 1) % 3]; x1 += ks[(g + 2) % 3] + g + 1``. Elementwise on
  broadcastable uint32 arrays; the same words as JAX's ``threefry2x32``
  primitive, written out so that XLA fuses them with their consumer.
  """
  ks = (k0, k1, k0 ^ k1 ^ _THREEFRY_PARITY)
  x0 = x0 + ks[0]
  x1 = x1 + ks[1]
  for group in range(5):
    for r in _THREEFRY_ROTATIONS[group % 2]:
      x0 = x0 + x1
      x1 = _rotate_left(x1, r) ^ x0
    x0 = x0 + ks[(group + 1) % 3]
    x1 = x1 + ks[(group + 2) % 3] + np.uint32(group + 1)
  return x0, x1


def _is_threefry_key(key: jax.Array) -> bool:
  if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
    return "threefry" in str(jax.random.key_impl(key)).lower()
  return key.shape[-1:] == (2,) and "threefry" in str(jax.config.jax_default_prng_impl).lower()


def threefry_word_pairs(key: jax.Array, shape: tuple[int, ...]) -> tuple[jax.Array, jax.Array]:
  """Two independent uint32 arrays of ``shape``: both output words of one Threefry block each.

  ``jax.random.bits(key, shape, uint32)`` evaluates one Threefry-2x32 block
  per 32-bit word and XORs its two output words; here block ``i`` (counter
  ``(0, i)`` under ``key``, ``i`` the row-major index in ``shape``) supplies
  word ``i`` of BOTH arrays, half the Threefry work per random bit (Salmon et
  al. 2011: each block of a counter-based generator is an independent 64-bit
  draw). Keys of another PRNG implementation, and ``2^32`` or more blocks, use
  ``jax.random.bits``.
  """
  size = int(np.prod(shape, dtype=np.int64))
  if not _is_threefry_key(key) or size + size % 2 >= 2**32:
    words = jax.random.bits(key, (2,) + tuple(shape), jnp.uint32)
    return words[0], words[1]
  data = jax.random.key_data(key) if jnp.issubdtype(key.dtype, jax.dtypes.prng_key) else key
  data = data.astype(jnp.uint32)
  lo = jax.lax.iota(jnp.uint32, size).reshape(shape)
  return threefry2x32(data[0], data[1], jnp.zeros_like(lo), lo)


def _join_halves(z_cos: jax.Array, z_sin: jax.Array, axis: int) -> jax.Array:
  """``concatenate([z_cos, z_sin], axis)``, as a select along a new axis of length 2.

  XLA:CPU fuses a concatenation of two computed arrays into a loop that
  branches on the index and is not vectorised (several times slower); a select
  between the two, broadcast along a new axis ``axis`` and reshaped, is the
  same array and an ordinary elementwise loop.
  """
  z_cos, z_sin = jnp.expand_dims(z_cos, axis), jnp.expand_dims(z_sin, axis)
  shape = z_cos.shape[:axis] + (2,) + z_cos.shape[axis + 1:]
  half = jax.lax.broadcasted_iota(jnp.int32, shape, axis)
  joined = jnp.where(half == 0, z_cos, z_sin)
  return joined.reshape(shape[:axis] + (2 * shape[axis + 1],) + shape[axis + 2:])


# XLA:CPU (measured) vectorises an elementwise loop only when its number of elements is even
# (a loop of 670,001 Threefry words takes ~10x the time of one of 670,000), and it
# fuses the producer of a slice or concatenation into that consumer's loop. For an
# odd number of outputs (and Box-Muller with an odd number of pairs) the words and
# the transform are therefore computed on a length padded to a multiple of _PAD,
# and the outputs are placed by a scatter, whose operands XLA does not fuse into it.
# Threefry block i depends only on its counter i, so the padding changes no word.
_PAD = 8


def _round_up(n: int, m: int) -> int:
  return -(-n // m) * m


def _padded_layout_applies(key: jax.Array, size: int) -> bool:
  """Whether a draw of ``size`` outputs takes the padded layout.

  Threefry keys and int32 indices only; and ``size >= 3``: the unpadded layout
  of one or two outputs computes arrays of one element, which XLA evaluates as
  scalars, rounding the transform's last bit differently from its loops.
  """
  return _is_threefry_key(key) and 3 <= size and 2 * _round_up(size, _PAD) + 2 * _PAD < 2**31


def _padded_word_quads(key: jax.Array, pairs: int, padded: int) -> list[jax.Array]:
  """Four uint32 arrays of length ``padded >= pairs``, the first ``pairs`` as ``_four_words``.

  Entry ``j < pairs`` equals entry ``j`` of ``_four_words(key, (pairs,))``:
  blocks ``j`` (words 0, 1) and ``pairs + j`` (words 2, 3) under ``key``, as
  in :func:`threefry_word_pairs` for the shape ``(2, pairs)``. The entries
  from ``pairs`` on are further blocks, for the caller to discard.
  """
  data = jax.random.key_data(key) if jnp.issubdtype(key.dtype, jax.dtypes.prng_key) else key
  data = data.astype(jnp.uint32)
  lo = jax.lax.iota(jnp.uint32, padded)
  zero = jnp.zeros_like(lo)
  a, b = threefry2x32(data[0], data[1], zero, lo)
  c, d = threefry2x32(data[0], data[1], zero, lo + np.uint32(pairs))
  return [a, b, c, d]


def _scatter_flat(values: jax.Array, dst: jax.Array, size: int) -> jax.Array:
  """``out[dst[t]] = values[t]`` where ``dst[t] < size`` (others dropped), length ``size``."""
  out = jnp.zeros((size,), values.dtype)
  return out.at[dst].set(values, mode="drop")


def _standard_normal_padded(key: jax.Array, shape: tuple[int, ...], half: tuple[int, ...],
                            axis: int, cdt: Any, dtype: Any) -> jax.Array:
  """:func:`standard_normal`'s layout, computed on a padded number of pairs and scattered.

  Pair ``p`` (row-major index in ``half``, words from :func:`_padded_word_quads`)
  gives the cosine at its position in ``shape`` and the sine ``half[axis]``
  further along ``axis``; for an odd size ``half = (pairs,)`` and the last sine
  falls at ``size`` and is dropped.
  """
  size = int(np.prod(shape, dtype=np.int64))
  hsize = int(np.prod(half, dtype=np.int64))
  padded = _round_up(hsize, _PAD)
  z_cos, z_sin = normal_pairs_from_words(_computed_once(_padded_word_quads(key, hsize, padded)), cdt)
  values = _join_halves(z_cos, z_sin, 0).astype(dtype)  # cosines of pairs 0.., then sines
  t = jax.lax.iota(jnp.int32, 2 * padded)
  is_sin = t >= padded
  p = jnp.where(is_sin, t - padded, t)
  inner = int(np.prod(half[axis + 1:], dtype=np.int64))
  along = half[axis]
  outer, rest = p // (along * inner), p % (along * inner)
  index, rest = rest // inner, rest % inner
  dst = outer * (2 * along * inner) + (index + jnp.where(is_sin, along, 0)) * inner + rest
  dst = jnp.where(p < hsize, dst, size)
  return _scatter_flat(values, dst, size).reshape(shape)


def standard_normal(key: jax.Array, shape: tuple[int, ...], dtype: Any) -> jax.Array:
  """``N(0, 1)`` by Box-Muller with a 105-bit radius uniform, ``|x| <= 12.06``.

  Two Threefry blocks (:func:`threefry_word_pairs`) per pair of outputs: 128
  random bits, a 105-bit radius uniform and a 23-bit angle
  (:func:`normal_pairs_from_words`), so the cut-off mass is ``2^-105`` per pair
  (the module docstring's formal statement). Layout: when some axis has even
  length (the first with a length divisible by 4, else the first even one:
  axis ``k``), word pairs of ``shape`` with axis ``k`` halved give the cosine
  half and the sine half of that axis, concatenated along it. Otherwise (odd
  size) ``ceil(size/2)`` word pairs give a flat cosine half followed by the
  first ``floor(size/2)`` sines. The words are bit for bit those of JAX's
  Threefry on every backend and sharding (the float arithmetic after them may
  round differently where backends' ``log`` and ``sqrt`` differ).
  """
  return _standard_normal(key, *_static(shape, dtype))


@functools.partial(jax.jit, static_argnames=("shape", "dtype"))
def _standard_normal(key: jax.Array, shape: tuple[int, ...], dtype: Any) -> jax.Array:
  cdt = _compute_dtype(dtype)
  shape = tuple(int(d) for d in shape)
  size = int(np.prod(shape, dtype=np.int64))
  pairs = (size + 1) // 2
  even = ([i for i, d in enumerate(shape) if d % 4 == 0]
          + [i for i, d in enumerate(shape) if d % 4 == 2])
  axis = even[0] if even else 0
  half = shape[:axis] + (shape[axis] // 2,) + shape[axis + 1:] if even else (pairs,)
  if (size % 2 or int(np.prod(half, dtype=np.int64)) % 2) and _padded_layout_applies(key, size):
    return _standard_normal_padded(key, shape, half, axis, cdt, dtype)
  if even:
    z_cos, z_sin = normal_pairs_from_words(_computed_once(_four_words(key, half)), cdt)
    return _join_halves(z_cos, z_sin, axis).astype(dtype)
  z_cos, z_sin = normal_pairs_from_words(_computed_once(_four_words(key, (pairs,))), cdt)
  z = _join_halves(z_cos, z_sin, 0)[:size]
  return z.reshape(shape).astype(dtype)


def standard_gamma_integer(key: jax.Array, dim: int, dtype: Any) -> jax.Array:
  """``Gamma(dim, 1)`` for an integer ``dim`` as a sum of ``dim`` i.i.d. ``Exp(1)``.

  Exact in law (no rejection loop, no truncation near the mean), at the cost
  of two Threefry blocks per summand: each ``Exp(1)`` is ``-log U`` for a
  128-bit uniform (cut at ``128 ln 2 = 88.7``, cut-off mass ``2^-128`` per
  summand).
  """
  return _standard_gamma_integer(key, int(dim), jnp.dtype(dtype))


@functools.partial(jax.jit, static_argnames=("dim", "dtype"))
def _standard_gamma_integer(key: jax.Array, dim: int, dtype: Any) -> jax.Array:
  cdt = _compute_dtype(dtype)
  words = _four_words(key, (dim,))
  exps = exponential_from_words([(w, 32) for w in words], cdt)
  return jnp.sum(exps).astype(dtype)
