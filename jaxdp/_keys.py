"""Where the noise keys of stateful objects come from: fresh OS entropy unless told otherwise.

Rule (library-wide; scikit-learn's ``random_state=None`` semantics). An object
that draws noise (an estimator's ``fit``, a predictor's answers) and is given no
explicit seed or key draws its key from the operating system's entropy
(:func:`secrets.randbits`, 64 bits) *at every fit*: two instances, a refit on
updated data, or two processes never add the same noise, so the difference of
two releases cannot cancel the noise and expose the change in the data.

An explicit ``seed`` (an ``int``) or ``key`` (a ``jax.random`` key) is the
user's promise not to reuse it across releases of overlapping data. With it,
fit ``i`` of an instance uses ``fold_in(key(seed), i)``: the same explicit seed
and the same sequence of calls give the same results (reproducible
experiments), and the fits of one instance never share a key.
"""

from __future__ import annotations

import numbers
import secrets
from typing import Any

import jax
import numpy as np

from jaxdp import _validation


def fresh_key() -> jax.Array:
  """A typed ``jax.random`` key from 64 bits of OS entropy (never the same twice)."""
  words = np.array([secrets.randbits(32), secrets.randbits(32)], dtype=np.uint32)
  return jax.random.wrap_key_data(words)


def check_seed(seed: Any, name: str = "seed") -> Any:
  """``None``, a Python/numpy integer, or a ``jax.random`` key; anything else raises.

  Floats (``1.5``, and also ``2.0``), bools and strings raise ``ValueError``
  naming ``name``: a silently truncated seed would make two different seeds
  collide.
  """
  if seed is None:
    return None
  if isinstance(seed, (bool, np.bool_)):
    raise ValueError(f"{name} must be None (fresh OS entropy), an integer or a jax.random key; "
                     f"got a bool ({seed!r}).")
  if isinstance(seed, numbers.Integral):
    value = int(seed)
    if not -2**63 <= value < 2**64:
      raise ValueError(f"{name} must fit in 64 bits, got {value}.")
    return value
  if isinstance(seed, (jax.Array, np.ndarray)) and (
      jax.dtypes.issubdtype(seed.dtype, jax.dtypes.prng_key) or seed.dtype == np.uint32):
    return _validation.check_key(seed, name)
  raise ValueError(f"{name} must be None (fresh OS entropy), an integer or a jax.random key; "
                   f"got {type(seed).__name__} {seed!r}.")


def key_from_seed(seed: Any, name: str = "seed") -> jax.Array:
  """The key of an explicit seed (int or key), or a fresh OS-entropy key for ``None``."""
  seed = check_seed(seed, name)
  if seed is None:
    return fresh_key()
  if isinstance(seed, int):
    # Two 32-bit words: every 64-bit seed is a distinct key, negatives included.
    value = seed % 2**64
    words = np.array([value >> 32, value & 0xFFFFFFFF], dtype=np.uint32)
    return jax.random.wrap_key_data(words)
  if jax.dtypes.issubdtype(seed.dtype, jax.dtypes.prng_key):
    return seed
  return jax.random.wrap_key_data(seed)


def fit_key(seed: Any, counter: int, name: str = "seed") -> jax.Array:
  """The key of fit number ``counter`` of an object built with ``seed``.

  ``seed=None``: a fresh OS-entropy key (the counter is not needed: every call is
  fresh). Otherwise ``fold_in(key_from_seed(seed), counter)``.
  """
  seed = check_seed(seed, name)
  if seed is None:
    return fresh_key()
  return jax.random.fold_in(key_from_seed(seed, name), int(counter))
