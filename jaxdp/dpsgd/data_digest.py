"""An order-sensitive digest of arrays, computed where they live (host or device, one or many processes).

A resumed run may replay its lost steps with their original batches and noise
only if the replayed updates are bit-identical to the ones that were lost; a
replay on re-ordered rows or re-initialised parameters would release two
iterates whose difference is a noise-free function of the data. The run's
ledger therefore binds the data and the starting parameters by this digest
(:mod:`.private_step`).

For each leaf, its words ``w_i`` (the bytes viewed as 32-bit words, in
row-major order; 1- and 2-byte types widened, 8-byte types split in two) are
mixed with their position ``i`` by the MurmurHash3 finaliser ``f`` and summed
modulo ``2^32`` in four lanes with different seeds::

  h_l = sum_i f(w_i XOR (i * 0x9E3779B9 + s_l))   (mod 2^32),  l = 1..4,

so swapping two different rows changes the digest (the position enters every
term). The sum is computed by one jitted reduction where the array lives (a
sharded global ``jax.Array`` is reduced by XLA across its devices and
processes; nothing but 16 bytes per leaf comes back to the host). The shapes,
dtypes and tree structure are hashed on the host with SHA-256 together with
the lane sums. This is a fingerprint against accidental change (re-ordered,
re-sampled or re-initialised inputs), not a cryptographic commitment.
"""

from __future__ import annotations

import functools
import hashlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

_SEEDS = (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344)


def _fmix(x: jax.Array) -> jax.Array:
  x = x ^ (x >> 16)
  x = x * jnp.uint32(0x85EBCA6B)
  x = x ^ (x >> 13)
  x = x * jnp.uint32(0xC2B2AE35)
  return x ^ (x >> 16)


def _words(a: jax.Array) -> jax.Array:
  """The array's bytes as a flat uint32 vector (row-major)."""
  if a.dtype == jnp.bool_:
    a = a.astype(jnp.uint8)
  size = jnp.dtype(a.dtype).itemsize
  if size == 4:
    return jax.lax.bitcast_convert_type(a, jnp.uint32).reshape(-1)
  if size == 8:
    return jax.lax.bitcast_convert_type(a, jnp.uint32).reshape(-1)
  unsigned = {1: jnp.uint8, 2: jnp.uint16}[size]
  return jax.lax.bitcast_convert_type(a, unsigned).astype(jnp.uint32).reshape(-1)


@functools.partial(jax.jit)
def _lanes(a: jax.Array) -> jax.Array:
  w = _words(a)
  pos = jnp.arange(w.shape[0], dtype=jnp.uint32) * jnp.uint32(0x9E3779B9)
  return jnp.stack([jnp.sum(_fmix(w ^ (pos + jnp.uint32(s))), dtype=jnp.uint32) for s in _SEEDS])


def digest(tree: Any) -> str:
  """Hex SHA-256 over the structure, shapes, dtypes and lane sums of every leaf of ``tree``."""
  h = hashlib.sha256(repr(jax.tree.structure(tree)).encode())
  for leaf in jax.tree.leaves(tree):
    if isinstance(leaf, jax.Array) and jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
      leaf = jax.random.key_data(leaf)
    if not isinstance(leaf, jax.Array):
      leaf = np.asarray(leaf)
    # The dtype the array has on the device (a NumPy int64 and a JAX int32 digest alike).
    dtype = np.dtype(jax.dtypes.canonicalize_dtype(leaf.dtype))
    h.update(f"{tuple(leaf.shape)}|{dtype.str}|".encode())
    if leaf.size:
      lanes = _lanes(leaf)  # replicated; on several processes read this process's copy
      h.update(np.asarray(lanes.addressable_shards[0].data).tobytes())
  return h.hexdigest()


__all__ = ["digest"]
