"""Every key a long run derives is distinct (jaxdp.dpsgd.keys)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdp.dpsgd import keys as keys_lib


def _chain(key, steps):
  """The keys of a noise chain (``next, draw = split(state.key)`` every step): chain and draws."""

  def body(k, _):
    nxt, draw = jax.random.split(k)
    return nxt, (jax.random.key_data(nxt), jax.random.key_data(draw))

  _, (chain, draws) = jax.lax.scan(body, key, None, length=steps)
  return np.concatenate([np.asarray(chain), np.asarray(draws)])


def _all_keys(run, steps, extra, resumes):
  data = [jax.random.key_data(k)[None] for k in (run.init, run.steps, run.extra_steps, run.groups,
                                                    run.gradient_noise, run.count_noise,
                                                    run.resume)]
  data.append(jax.random.key_data(run.step_keys(steps)))
  data.append(jax.vmap(lambda t: jax.random.key_data(run.extra_step_key(t)))(
      jnp.arange(steps, steps + extra)))
  data += [_chain(run.gradient_noise, steps), _chain(run.count_noise, steps)]
  for paid in resumes:
    g, c = run.resume_noise(paid)
    data += [_chain(g, 64), _chain(c, 64)]
  return np.concatenate([np.asarray(d).reshape(-1, 2) for d in data])


def _assert_distinct(words):
  as_int = words[:, 0].astype(np.uint64) << np.uint64(32) | words[:, 1].astype(np.uint64)
  assert np.unique(as_int).size == as_int.size


def test_every_key_of_a_long_run_is_distinct():
  # 30,000 steps: past 0x5EED = 24,301 and 0x6209 = 25,097, the tags that collided with
  # split(sampling, T)[d] under fold_in-based derivation.
  keys = _all_keys(keys_lib.derive(jax.random.key(0)), 30_000, 2_000, (0, 1, 17, 29_999))
  assert keys.shape[0] > 150_000
  _assert_distinct(keys)


def test_the_old_tag_derivation_collides_and_the_new_does_not():
  # Why fold_in tags are not used: fold_in(k, d) == split(k, T)[d] for d < T.
  k = jax.random.key(3)
  np.testing.assert_array_equal(jax.random.key_data(jax.random.fold_in(k, 5)),
                                jax.random.key_data(jax.random.split(k, 8)[5]))
  run = keys_lib.derive(k)
  steps = jax.random.key_data(run.step_keys(40))
  for root in (run.extra_steps, run.groups):
    assert not (np.asarray(steps) == np.asarray(jax.random.key_data(root))).all(axis=1).any()


@pytest.mark.parametrize("seed", [1, 2])
def test_two_runs_share_no_key(seed):
  a = _all_keys(keys_lib.derive(jax.random.key(seed)), 500, 50, (3,))
  b = _all_keys(keys_lib.derive(jax.random.key(seed + 100)), 500, 50, (3,))
  _assert_distinct(np.concatenate([a, b]))
