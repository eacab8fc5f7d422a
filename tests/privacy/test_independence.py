"""Conformance: the several noise draws of one release point are independent.

A release point that adds several noises (adaptive clipping: the gradient's and the
count's; correlated noise: one ``z_t`` per step, mixed by ``C^{-1}``; the private
confidence intervals: the objective's ``b``, the AMP output noise and the two PrivSPDMat
noises) is accounted as a composition of mechanisms with INDEPENDENT noises (Andrew et
al. 2021 Thm 1 whitening; Denisov et al. 2022 Thm 2.1 with ``z ~ N(0, s^2 I)``; paper
003 Thm 2). Two draws from one key, or one noise reused, break that silently: each draw
alone keeps its law, so scale and audit checks pass. Here each part is recovered from
the release over many keys (or fresh steps) and every pair of coordinates of two
different parts must have a sample correlation within a few standard errors
(``1/sqrt(M)``) of 0; so must their norms (a shared key makes them proportional).

``PARTS`` names the registered entry (``conformance_registry``) each check covers; a
test fails when a name is no longer registered, so the table follows the registry.
"""

import importlib.util
import itertools
import math
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import conformance_registry as reg

Z_BOUND = 4.5  # standard errors: pairs per check are few, so chance alone stays far below


def _max_abs_correlation(a: np.ndarray, b: np.ndarray) -> float:
  a = (a - a.mean(0)) / a.std(0)
  b = (b - b.mean(0)) / b.std(0)
  return float(np.max(np.abs(a.T @ b / a.shape[0])))


def check_independent(parts: dict) -> None:
  """``parts``: ``{name: (M, size) draws}``, row i of every part from the same release i."""
  m = {v.shape[0] for v in parts.values()}
  assert len(m) == 1, {k: v.shape for k, v in parts.items()}
  bound = Z_BOUND / math.sqrt(m.pop())
  for v in parts.values():
    assert np.all(np.std(v, axis=0) > 0)
  for (na, a), (nb, b) in itertools.combinations(sorted(parts.items()), 2):
    r = _max_abs_correlation(a, b)
    assert r < bound, (na, nb, r, bound)
    r_norm = abs(np.corrcoef(np.linalg.norm(a, axis=1), np.linalg.norm(b, axis=1))[0, 1])
    assert r_norm < bound, (na, nb, "norms", r_norm, bound)


# -- adaptive clipping: gradient noise and count noise (Andrew et al. 2021 Alg. 1) ---------


def _adaptive_parts(per_layer: bool, steps: int = 600) -> dict:
  """``steps`` updates of a zero sum and zero counts: noises recovered from update and C_{t+1}."""
  from jaxdp.dpsgd import adaptive_clipping as ac  # pylint: disable=import-outside-toplevel
  qn, c0, eta, gamma, sigma_b = 64.0, 0.5, 0.25, 0.5, 2.0
  config = ac.AdaptiveClipNorm(initial=c0, target_quantile=gamma, learning_rate=eta,
                               count_noise_multiplier=sigma_b)
  key = jax.random.key(5)
  if per_layer:
    tx = ac.adaptive_noisy_aggregate(config, noise_multiplier=1.0, expected_batch_size=qn,
                                     key=key, per_layer=True, num_groups=2)
    params = {"a": jnp.zeros((3,), jnp.float32), "b": jnp.zeros((3,), jnp.float32)}
  else:
    tx = ac.adaptive_noisy_aggregate(config, noise_multiplier=1.0, expected_batch_size=qn,
                                     key=key)
    params = jnp.zeros((6,), jnp.float32)
  state = tx.init(params)
  zero = jax.tree.map(jnp.zeros_like, params)
  counts = jnp.zeros((2,), jnp.float32) if per_layer else jnp.float32(0.0)

  def body(state, _):
    c_t = ac.current_clip_norm(state)
    updates, new = tx.update((zero, counts), state, params)
    return new, (updates, c_t, ac.current_clip_norm(new))

  _, (upd, c_t, c_next) = jax.jit(lambda s: jax.lax.scan(body, s, None, length=steps))(state)
  # (steps,) or, per layer, (steps, G): the clip norms of the groups (a pytree of them)
  c_t, c_next = (np.stack([np.asarray(leaf, np.float64).reshape(steps, -1)
                           for leaf in jax.tree.leaves(c)], axis=1).reshape(steps, -1).squeeze()
                 for c in (c_t, c_next))
  count = qn * (gamma - np.log(c_next / c_t) / eta) - qn / 2.0  # inverts C_{t+1} = C_t e^{..}
  if per_layer:
    grad = np.concatenate([np.asarray(u, np.float64) for u in jax.tree.leaves(upd)], axis=1)
    parts = {"gradient": grad}
    for g in range(count.shape[1]):
      parts[f"count[{g}]"] = count[:, g:g + 1]
    return parts
  return {"gradient": np.asarray(upd, np.float64), "count": count[:, None]}


# -- correlated noise: the per-step z_t of C x + z (Denisov et al. 2022) ---------------------


def _correlated_parts(strategy_name: str, keys: int = 512) -> dict:
  """``z = C w`` from the streamed noise ``w_t`` of a zero sum; one part per step."""
  from jaxdp.dpsgd.correlated import BLT, BandMF, correlated_noise  # pylint: disable=import-outside-toplevel
  n = 5
  strategy = (BandMF(np.array([1.0, 0.5, 0.25])) if strategy_name == "BandMF"
              else BLT(np.array([0.6]), np.array([0.3])))

  def run(key):
    tx = correlated_noise(strategy, n, 1.0, 1.0, 1.0, key)
    state = tx.init(jnp.zeros((2,), jnp.float32))
    out = []
    for _ in range(n):
      w, state = tx.update(jnp.zeros((2,), jnp.float32), state)
      out.append(w)
    return jnp.stack(out)

  w = np.asarray(jax.jit(jax.vmap(run))(jax.random.split(jax.random.key(8), keys)), np.float64)
  z = np.einsum("ts,msd->mtd", strategy.matrix(n), w)  # undo the C^{-1} mixing
  return {f"z[{t}]": z[:, t, :] for t in range(n)}


# -- private confidence intervals: b, the AMP noise, the PrivSPDMat noises (paper 003) -------


def _interval_parts(monkeypatch) -> dict:
  path = pathlib.Path(__file__).parents[1] / "inference" / "test_ci_key_independence.py"
  spec = importlib.util.spec_from_file_location("_ci_key_independence", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module._record_draws(monkeypatch, perturbation="objective", epsilon=20.0)  # pylint: disable=protected-access


PARTS = {
    "jaxdp.dpsgd.adaptive_noisy_aggregate": lambda mp: _adaptive_parts(False),
    "jaxdp.dpsgd.adaptive_clipping.per_layer_adaptive_clip_noise":
        lambda mp: _adaptive_parts(True),
    "jaxdp.dpsgd.correlated.correlated_noise[BandMF]": lambda mp: _correlated_parts("BandMF"),
    "jaxdp.dpsgd.correlated.correlated_noise[BLT]": lambda mp: _correlated_parts("BLT"),
    "jaxdp.inference.confidence_intervals_batched": _interval_parts,
}
SLOW = {"jaxdp.inference.confidence_intervals_batched",  # compiles the whole pipeline (~10 s)
        "jaxdp.dpsgd.adaptive_clipping.per_layer_adaptive_clip_noise",
        "jaxdp.dpsgd.correlated.correlated_noise[BLT]"}


def test_every_checked_name_is_a_registered_release_point():
  registry = reg.load_all()
  assert not set(PARTS) - set(registry), sorted(set(PARTS) - set(registry))


@pytest.mark.parametrize("name", [
    pytest.param(n, marks=(pytest.mark.slow,) if n in SLOW else ()) for n in PARTS])
def test_noise_parts_are_independent(name, monkeypatch):
  parts = PARTS[name](monkeypatch)
  assert len(parts) >= 2, sorted(parts)
  check_independent(parts)


def test_the_check_sees_a_shared_draw():
  """The check itself: a second part that reuses the first one's draw is caught."""
  rng = np.random.default_rng(0)
  a = rng.normal(size=(512, 3))
  with pytest.raises(AssertionError):
    check_independent({"a": a, "b": 0.5 * a[:, ::-1] + rng.normal(size=(512, 3))})
  check_independent({"a": a, "b": rng.normal(size=(512, 3))})
