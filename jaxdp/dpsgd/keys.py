"""Every key of a private training run, derived from the run's one key by disjoint ``split`` branches.

A run must never use one key twice: two steps sampled with the same key draw
the same batch, and two noise draws from the same key cancel in a difference
of released iterates. Under JAX's partitionable Threefry (the default),
``fold_in(k, d) == split(k, T)[d]`` for ``d < T``, so mixing ``fold_in`` tags
and ``split`` tables on one parent collides as soon as a run is long enough
(a tag ``0x6209`` is step 25,097's sampling key). Here every purpose gets its
own branch of a ``split`` tree, and within a branch only one kind of
derivation is used::

  key -> split(key, 3) = (init, sampling, noise)          [train_dpsgd's init uses init]
  sampling -> split(sampling, 3) = (steps, extra_steps, groups)
      step t < T:      split(steps, T)[t]
      extra step t>=T: fold_in(extra_steps, t)              [only fold_in in this branch]
      cyclic groups:   groups                               [drawn once]
  noise -> split(noise, 3) = (gradient, count, resume)
      gradient noise:  the chain of noisy_aggregate / correlated_noise (split every step)
      count noise:     adaptive clipping's chain (split every step)
      resume at step p: fold_in(resume, p) -> split(., 2) = (gradient, count)

Two keys of different branches are outputs of Threefry on different
counters under different parent keys; modelled as a random function they are
distinct except with probability about ``K^2 / 2^64`` over K keys.
``tests/dpsgd/test_keys.py`` lists every key a long run derives and checks
that no two are equal.
"""

from __future__ import annotations

from typing import NamedTuple

import jax


class RunKeys(NamedTuple):
  """The roots of a run's keys (see the module docstring)."""

  init: jax.Array
  steps: jax.Array
  extra_steps: jax.Array
  groups: jax.Array
  gradient_noise: jax.Array
  count_noise: jax.Array
  resume: jax.Array

  def step_keys(self, num_steps: int) -> jax.Array:
    """The sampling keys of the planned steps ``0 .. T-1``: ``split(steps, T)``."""
    return jax.random.split(self.steps, num_steps)

  def extra_step_key(self, step: int) -> jax.Array:
    """The sampling key of a step ``t >= T`` (``allow_extra_steps``): ``fold_in(extra_steps, t)``."""
    return jax.random.fold_in(self.extra_steps, step)

  def resume_noise(self, paid: int) -> tuple[jax.Array, jax.Array]:
    """Fresh ``(gradient, count)`` noise keys for a run continued at the first unpaid step ``paid``."""
    gradient, count = jax.random.split(jax.random.fold_in(self.resume, paid))
    return gradient, count


def derive(key: jax.Array) -> RunKeys:
  """The roots of every key of the run keyed ``key`` (module docstring)."""
  init, sampling, noise = jax.random.split(key, 3)
  steps, extra_steps, groups = jax.random.split(sampling, 3)
  gradient, count, resume = jax.random.split(noise, 3)
  return RunKeys(init=init, steps=steps, extra_steps=extra_steps, groups=groups,
                 gradient_noise=gradient, count_noise=count, resume=resume)


__all__ = ["RunKeys", "derive"]
