"""Conformance entries of correlated-noise training (``jaxdp.dpsgd.correlated``).

The matrix-factorization mechanism releases ``C x + z`` (Denisov et al. 2022;
Choquette-Choo et al. 2023); training sees ``x_t + (C^{-1} z)_t``, and
multiplying the stacked noisy gradients by C (float64, here) recovers
``C x + z``: that is the private vector the checks look at, with
``z ~ N(0, (sigma S s_1)^2 I)`` i.i.d., ``s_1 = ||C[:, 0]||``.

Test configuration (shared with ``entries_dpsgd.py``'s datasets and pairs):
T = 3 steps in which every example takes part (one group, ``b = 1``, q = 1,
so the sample is data-independent and ``x_t`` is the same clipped sum each
step); a LINEAR per-example loss ``<W, x e_y^T>`` whose gradient
``x e_y^T`` does not depend on W, so ``x_t`` is exactly the clipped sum
``sum_n clip_C(x_n e_{y_n}^T)`` (computed here in float64); sigma = 1, C = 1.

Independent numbers: adding one example whose clip binds moves ``C x`` by
``C (1 (x) g)`` with ``||g|| = C``, so the run's L2 sensitivity is
``S ||C 1||`` (C has non-negative entries here, so all-equal directions are
worst); the run is ONE Gaussian mechanism with ``Delta / std = ||C 1|| / (sigma
s_1)``, whose exact epsilon (Balle & Wang 2018 Thm 8) is the claim.

Entries: the transform ``correlated_noise`` for a BandMF and a BLT strategy
(vmapped, audited). ``PrivateSGD.step`` of a ``make_private(...,
noise_strategy=BandMF|BLT)`` plan (the sampler pays the run's one event before
its first batch) is registered per noise x clip cell in
``entries_plan_cells.py``.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

import conformance_registry as reg
import entries_dpsgd as dp
from jaxdp.accounting import events

T = 3
FAMILY = "dpsgd"
_DIVISOR = 16.0


def _strategies():
  from jaxdp.dpsgd import correlated
  return {"BandMF": correlated.BandMF(np.array([1.0, 0.6])),
          "BLT": correlated.BLT(np.array([0.7]), np.array([0.5]))}


@functools.lru_cache(maxsize=None)
def _matrix(name: str) -> np.ndarray:
  """The strategy's public ``C`` (T x T), read-only; kept (the checks map thousands of outputs)."""
  c = np.array(_strategies()[name].matrix(T))
  c.setflags(write=False)
  return c


def _s1(name: str) -> float:
  return float(np.linalg.norm(_matrix(name)[:, 0]))


def _run_ratio(name: str) -> float:
  """``||C 1|| / s_1``: the run's sensitivity in units of one participation's."""
  c = _matrix(name)
  return float(np.linalg.norm(c @ np.ones(T))) / _s1(name)


def _linear_loss(w, x, y):
  return jnp.sum(w * (x[:, None] * jax.nn.one_hot(y, dp.K)[None, :]))


def linear_clipped_sum(data: dict) -> np.ndarray:
  """Exact float64 ``sum_n clip_C(x_n e_{y_n}^T)``, flattened (D*K,)."""
  x = np.asarray(data["x"], np.float64)
  y = np.asarray(data["y"])
  scale = np.minimum(1.0, dp.CLIP / np.maximum(np.linalg.norm(x, axis=1), 1e-300))
  out = np.zeros((x.shape[1], dp.K))
  np.add.at(out.T, y, x * scale[:, None])
  return out.reshape(-1)


def _reference(name: str, data: dict) -> np.ndarray:
  """``C (1 (x) x)``: the exact statistic behind ``C x + z`` (T x D*K, flattened)."""
  x = linear_clipped_sum(data)
  return (_matrix(name) @ np.tile(x, (T, 1))).reshape(-1)


def _noise(name: str) -> reg.NoiseSpec:
  return reg.NoiseSpec(
      kind="gaussian", scale=dp.SIGMA * dp.CLIP * _s1(name),
      reference=functools.partial(_reference, name),
      theorem="MF mechanism C x + z, z ~ N(0, (sigma S ||C[:,0]||)^2 I) (Denisov et al. 2022; "
              "Choquette-Choo et al. 2023 Eq. 1)")


def _event(name: str) -> events.DpEvent:
  return events.GaussianDpEvent(dp.SIGMA / _run_ratio(name), neighbouring=events.ADD_REMOVE,
                                unit="example")


def _epsilon(name: str) -> float:
  return dp.gaussian_epsilon(_run_ratio(name) / dp.SIGMA, dp.DELTA)


def _pairs(d: int = dp.D):
  return dp.add_remove_pairs(d)


def _flat_stack(outs) -> np.ndarray:
  return np.stack([np.asarray(o, np.float64).reshape(-1) for o in outs])


# -- the optax transform --------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def _clipped_sum_fn():
  from jaxdp import dpsgd
  fn = dpsgd.clipped_grad(_linear_loss, l2_clip_norm=dp.CLIP, batch_argnums=(1, 2),
                          method="vmap")
  return jax.jit(lambda w, x, y: fn(w, x, y)[0])


def _transform_release(name, key, data):
  """T updates of ``correlated_noise`` on the clipped sum, times the divisor: ``x + C^{-1} z``."""
  from jaxdp.dpsgd import correlated
  w0 = jnp.zeros((data["x"].shape[1], dp.K), jnp.float32)
  grad_sum = _clipped_sum_fn()(w0, jnp.asarray(data["x"]), jnp.asarray(data["y"]))
  tx = correlated.correlated_noise(_strategies()[name], T, dp.SIGMA, dp.CLIP, _DIVISOR, key)
  state = tx.init(w0)
  outs = []
  for _ in range(T):
    u, state = tx.update(grad_sum, state, w0)
    outs.append(u * _DIVISOR)
  return jnp.stack(outs)


def _transform_vector(name, out) -> np.ndarray:
  """``C`` (float64) times the stacked noisy gradients: ``C x + z``."""
  return (_matrix(name) @ _flat_stack(np.asarray(out))).reshape(-1)


def _audit_statistic(name, out) -> float:
  """Projection of ``C x + z`` on the worst-case example's direction ``C 1 (x) g``."""
  v = _transform_vector(name, out).reshape(T, -1)
  g = np.zeros((dp.D, dp.K))
  g[0, dp.K - 1] = 1.0  # the "far" example x = 10 e_0 with label K - 1, clipped to e_0 e_{K-1}^T
  u = np.outer(_matrix(name) @ np.ones(T), g.reshape(-1))
  return float(np.sum(v * u) / np.linalg.norm(u))


_TRANSFORM_GUARANTEE = ("(eps, delta)-DP for add/remove of one example taking part in all T "
                        "steps: the MF mechanism C x + z is one Gaussian mechanism of "
                        "sensitivity S ||C 1|| and std sigma S ||C[:,0]|| (Denisov et al. 2022 "
                        "Thm 2.1; Balle & Wang 2018 Thm 8)")

for _name in ("BandMF", "BLT"):
  reg.register(reg.ReleasePoint(
      name=f"jaxdp.dpsgd.correlated.correlated_noise[{_name}]",
      family=FAMILY, neighbouring="add_remove", unit="example",
      guarantee=_TRANSFORM_GUARANTEE, epsilon=_epsilon(_name), delta=dp.DELTA, pairs=_pairs,
      release=functools.partial(_transform_release, _name),
      vector=functools.partial(_transform_vector, _name),
      event=functools.partial(_event, _name),
      charged=None, fresh=None,
      sensitivity=dp.CLIP * _run_ratio(_name) * _s1(_name), norm="l2",
      noise=_noise(_name),
      audit=reg.AuditSpec(statistic=functools.partial(_audit_statistic, _name)),
      support="continuous",
      skip={"charge": "an optax transform spends nothing; make_private's sampler pays the run "
                      "(the PrivateSGD.step[noise=BandMF|BLT, clip=...] entries check it)"}))


# -- PrivateSGD.step of a make_private(noise_strategy=...) plan: entries_plan_cells.py --------
# (one entry per noise x clip cell: [noise=BandMF|BLT, clip=fixed|adaptive]).


# -- declared: public callables that release nothing themselves ------------------------------

for _name, _reason in {
    "jaxdp.dpsgd.correlated.BandMF":
        "a public strategy matrix (coefficients); reads no data",
    "jaxdp.dpsgd.correlated.BLT":
        "a public strategy matrix (buffer decays and weights); reads no data",
    "jaxdp.dpsgd.correlated.CyclicPoissonSampler":
        "draws batch indices from keys and the public N, b, p only (never reads the data); the "
        "release is PrivateSGD.step[noise=BandMF|BLT, clip=fixed|adaptive] (registered)",
    "jaxdp.dpsgd.correlated.mf_event":
        "the DpEvent of a run from public (strategy, sigma, n, b, p); spends nothing",
    "jaxdp.dpsgd.correlated.mf_epsilon":
        "epsilon of public (strategy, sigma, n, b, p, delta)",
    "jaxdp.dpsgd.correlated.calibrate_mf_noise_multiplier":
        "a calibration on public numbers",
    "jaxdp.dpsgd.correlated.noise_stddev":
        "sigma S s_1 from public numbers (a calibration)",
    "jaxdp.dpsgd.correlated.max_participations":
        "ceil(n / b) from public numbers",
    "jaxdp.dpsgd.correlated.accounting.adaptive_gradient_noise_multiplier":
        "sigma_Delta from public (strategy, sigma, sigma_b, n, b, p): a calibration",
    "jaxdp.dpsgd.PrivateSGD.run_event":
        "the DpEvent of the plan's run from public numbers; spends nothing",
}.items():
  reg.not_a_release_point(_name, _reason)
