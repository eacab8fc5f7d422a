"""Conformance entries of the DP-SGD family (``jaxdp.dpsgd``).

Every DP-SGD release is the Gaussian mechanism on the SUM of per-example
gradients clipped to L2 norm ``C`` (paper 000 Section 3.1 Equation 4; survey
004 Section 4.2 Algorithm 1; Abadi et al. 2016), Poisson-subsampled at rate q
and composed over the steps. Adding or removing one example changes the sum by
one clipped gradient, so the L2 sensitivity of the sum is ``C`` under
add/remove neighbours (the relation written into the DP-SGD events).

Test configuration shared by all entries (tiny, one jit shape per dataset size):

* a softmax linear model without bias, ``W`` of shape ``(D, K) = (4, 3)``,
  starting at ``W_0 = 0``; its per-example gradient is ``x (softmax(0) - e_y)^T``
  in closed form, so the exact clipped sum (the reference of the noise check) is
  computed here in float64, independently of the library's clipping;
* ONE step with q = 1 (every example is in the batch: the worst case for the
  added example, and the sample is data-independent, so the noise check sees
  pure noise) and plain SGD with learning rate ``eta = N`` (``eta / (q N) = 1``),
  so the released parameters are ``W_1 = -(sum_n clip(g_n) + Z)``: the private
  vector is ``-W_1``, the noisy clipped sum itself;
* noise ``Z ~ N(0, (sigma C)^2 I)`` with ``sigma = 1``, ``C = 1``.

The claimed epsilon of one step (q = 1) is that of one Gaussian mechanism of
sensitivity C and std ``sigma C``, computed here from the exact privacy profile
(Balle & Wang 2018 Theorem 8), not from the library's accountant (whose RDP
value is larger, so the audit against this tighter number is stricter).

Pairs (add/remove): an added example whose gradient norm (8.2 C) makes the clip
bind (the worst case), an example on the clipping boundary, a duplicated row,
and a removed row.

Entries: ``train_dpsgd``; ``linear_dpsgd``; the optax transforms
``noisy_aggregate``, ``private_sgd`` and ``dp_optimizer`` (one update on the
clipped sum, divided by a constant ``q N``). ``PrivateSGD.step`` (the release
of a ``make_private`` plan) is registered once per cell of the plan (noise x
clip, batch selection, device path) in ``entries_plan_cells.py``.
``make_private`` itself, the plan, the result records and the calibrations are
declared at the end (they release nothing).
"""

from __future__ import annotations

import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from scipy import optimize, stats

import conformance_registry as reg
import conformance_checks as cc
from jaxdp.accounting import events

N, D, K = 16, 4, 3
# train_dpsgd and make_private compile a new step per call (~1.5 s on a busy CPU): they get
# only the worst-case pair and a wider input (D_WIDE * K = 192 noise coordinates per call),
# so the noise check needs 5 calls instead of 76.
D_WIDE = 64
CLIP = 1.0
SIGMA = 1.0
DELTA = 1e-5
FAMILY = "dpsgd"
_SEED = 2026


def gaussian_epsilon(mu: float, delta: float) -> float:
  """The exact epsilon at ``delta`` of one Gaussian mechanism with ``Delta / sigma = mu``.

  Balle & Wang 2018 Theorem 8: ``delta(eps) = Phi(mu/2 - eps/mu) - e^eps Phi(-mu/2 - eps/mu)``,
  decreasing in eps; solved by bisection in float64.
  """
  def excess(eps):
    return (stats.norm.cdf(mu / 2 - eps / mu) - math.exp(eps) * stats.norm.cdf(-mu / 2 - eps / mu)
            - delta)
  if excess(0.0) <= 0:
    return 0.0
  return float(optimize.brentq(excess, 0.0, 100.0, xtol=1e-12))


EPSILON_ONE_STEP = gaussian_epsilon(CLIP / (SIGMA * CLIP), DELTA)


# -- datasets -------------------------------------------------------------------


def _base(d: int = D) -> dict:
  rng = np.random.default_rng(_SEED)
  x = rng.normal(size=(N, d)).astype(np.float32)
  x /= np.maximum(1.0, np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)
  y = rng.integers(0, K, size=N).astype(np.int32)
  return {"x": x, "y": y}


def _add(data: dict, x_row, y_row) -> dict:
  return {"x": np.concatenate([data["x"], np.asarray(x_row, np.float32)[None]]),
          "y": np.concatenate([data["y"], np.asarray([y_row], np.int32)])}


def _residual_norm() -> float:
  """``||softmax(0) - e_y||`` for K classes: ``sqrt((K - 1) / K)``."""
  return math.sqrt((K - 1) / K)


def add_remove_pairs(d: int = D) -> list[tuple[dict, dict]]:
  """Neighbouring (D, D') under add/remove of one example; the worst case first."""
  base = _base(d)
  far = np.zeros(d, np.float32)
  far[0] = 10.0  # gradient norm 10 sqrt(2/3) = 8.2 C: the clip binds
  boundary = np.zeros(d, np.float32)
  boundary[1] = CLIP / _residual_norm()  # gradient norm exactly C
  removed = {"x": base["x"][:-1], "y": base["y"][:-1]}
  return [
      (base, _add(base, far, K - 1)),
      (base, _add(base, boundary, 0)),
      (base, _add(base, base["x"][0], int(base["y"][0]))),  # duplicated row
      (base, removed),
  ]


def clipped_sum_reference(data: dict) -> np.ndarray:
  """Exact float64 ``sum_n clip_C(x_n (softmax(0) - e_{y_n})^T)``, flattened (D*K,)."""
  x = np.asarray(data["x"], np.float64)
  y = np.asarray(data["y"])
  r = np.full((len(y), K), 1.0 / K)
  r[np.arange(len(y)), y] -= 1.0
  norms = np.linalg.norm(x, axis=1) * np.linalg.norm(r, axis=1)
  scale = np.minimum(1.0, CLIP / np.where(norms > 0, norms, 1.0))
  return np.einsum("nd,nk->dk", x * scale[:, None], r).reshape(-1)


def _flat(w) -> np.ndarray:
  return np.asarray(w, np.float64).reshape(-1)


def step_event() -> events.DpEvent:
  """One DP-SGD step at q = 1: ``PoissonSampled(1, Gaussian(sigma))``, add/remove, per example."""
  return events.PoissonSampledDpEvent(
      1.0, events.GaussianDpEvent(SIGMA, neighbouring=events.ADD_REMOVE, unit="example"))


NOISE = reg.NoiseSpec(
    kind="gaussian", scale=SIGMA * CLIP, reference=clipped_sum_reference,
    theorem="Gaussian mechanism on the clipped sum, std sigma*C (paper 000 Sec. 3.1 Eq. 4; "
            "Abadi et al. 2016 Alg. 1)")


def _projection_statistic(output_vector) -> float:
  """Projection of the noisy sum on the worst-case example's clipped gradient direction."""
  v = np.asarray(output_vector, np.float64)
  r = np.full(K, 1.0 / K)
  r[K - 1] -= 1.0
  u = np.zeros((v.size // K, K))
  u[0] = r
  u = u.reshape(-1) / np.linalg.norm(u)
  return float(np.dot(v, u))


GUARANTEE = ("(eps, delta)-DP for add/remove of one example: Poisson-subsampled Gaussian "
             "mechanism on the clipped gradient sum (Abadi et al. 2016; Mironov, Talwar & Zhang "
             "2019), here one step at q = 1: the Gaussian mechanism (Balle & Wang 2018 Thm 8)")


def _common(**overrides):
  fields = dict(
      family=FAMILY, neighbouring="add_remove", unit="example", guarantee=GUARANTEE,
      epsilon=EPSILON_ONE_STEP, delta=DELTA, pairs=add_remove_pairs, event=step_event,
      sensitivity=CLIP, norm="l2", noise=NOISE, support="continuous")
  fields.update(overrides)
  return fields


_HOST_LOOP_AUDIT = (
    "each call compiles a new jitted step (~1.5 s), so 2 x trials calls do not fit the always-on "
    "suite; the same noise path (transforms.noisy_aggregate) is audited by the noisy_aggregate, "
    "private_sgd and dp_optimizer entries (vmapped), and DP-SGD end to end by "
    "jaxdp.audit.dpsgd_canary_audit in tests/audit")
_TRANSFORM_GUARANTEE = ("(eps, delta)-DP for add/remove of one example per update: Gaussian "
                        "mechanism of std sigma*S on a clipped sum of L2 sensitivity S (Balle & "
                        "Wang 2018 Thm 8; paper 000 Sec. 3.1 Eq. 4), divided by the constant q N")


# -- train_dpsgd ------------------------------------------------------------------


class _Linear(nn.Module):

  @nn.compact
  def __call__(self, x):
    return nn.Dense(K, use_bias=False)(x)


def _zero_params(d: int):
  return {"Dense_0": {"kernel": jnp.zeros((d, K), jnp.float32)}}


def _train_dpsgd(key, data, accountant=None):
  from jaxdp import dpsgd
  n = len(data["y"])
  return dpsgd.train_dpsgd(
      _Linear(), data["x"], data["y"], key=key, epochs=1.0, l2_clip_norm=CLIP, delta=DELTA,
      sample_rate=1.0, noise_multiplier=SIGMA, params=_zero_params(data["x"].shape[1]),
      optimizer=optax.sgd(float(n)), accountant=accountant)


def _train_dpsgd_charged(data, accountant):
  return _train_dpsgd(jax.random.key(11), data, accountant), 1


reg.register(reg.ReleasePoint(
    name="jaxdp.dpsgd.train_dpsgd",
    release=lambda key, data: _train_dpsgd(key, data),
    vector=lambda out: -_flat(out.params["Dense_0"]["kernel"]),
    charged=_train_dpsgd_charged,
    fresh=None,
    audit=None,
    # N is public by the documented convention (q and q N are computed from it);
    # `accountant` is the caller's ledger; `seconds` is wall-clock time.
    public_outputs=("noise_multiplier", "epsilon", "delta", "steps", "sample_rate",
                    "expected_batch_size", "sensitivity", "padded_size", "accountant",
                    "seconds", "overflow_delta"),
    **_common(pairs=lambda: add_remove_pairs(D_WIDE)[:1], skip={"audit": _HOST_LOOP_AUDIT})))


# -- linear_dpsgd -----------------------------------------------------------------


def _linear_dpsgd(key, data, **relation):
  from jaxdp import dpsgd
  n = len(data["y"])
  return dpsgd.linear_dpsgd(
      key, data["x"], data["y"], num_classes=K, noise_multiplier=SIGMA, delta=DELTA,
      epochs=1.0, expected_batch_size=float(n), l2_clip_norm=CLIP, learning_rate=float(n),
      momentum=0.0, **relation)


# The fields both linear_dpsgd entries (add/remove, replace-one) share.
_LINEAR_DPSGD = dict(
    vector=lambda out: -_flat(out.weights),
    charged=None,
    fresh=None,
    audit=reg.AuditSpec(statistic=lambda out: _projection_statistic(-_flat(out.weights)),
                        trials=500, slow_trials=20_000),
    public_outputs=("event", "noise_multiplier", "sample_rate", "steps", "padded_size",
                    "epsilon", "delta"))


reg.register(reg.ReleasePoint(
    name="jaxdp.dpsgd.linear_dpsgd",
    release=_linear_dpsgd,
    **_LINEAR_DPSGD,
    **_common(skip={"charge": "linear_dpsgd spends on no accountant: it returns the event of one "
                              "run in result.event (M keys release M models; the caller spends "
                              "it M times), checked in tests/dpsgd/test_dpsgd_linear.py"})))


# -- linear_dpsgd, replace-one neighbours -------------------------------------------
# The same mechanism accounted for replace-one neighbours (neighbouring="replace_one"):
# one example replaced moves the clipped sum by up to 2C, so at q = 1 the step is the
# Gaussian mechanism of sensitivity 2C at std sigma C (Balle & Wang 2018 Thm 8); the
# event is PoissonSampled(1, Gaussian(sigma / 2)) tagged replace_one, accounted by PLD
# (Zhu, Dong & Wang 2022; jaxdp.accounting.dpsgd_accounting).


def replace_one_pairs(d: int = D) -> list[tuple[dict, dict]]:
  """Neighbouring (D, D') under replacement of one example; the worst case first.

  The last row is replaced by a row whose gradient points against the replaced one's
  (both clipped to norm C: the sum moves by up to 2C), then by the boundary row.
  """
  base = _base(d)
  far = np.zeros(d, np.float32)
  far[0] = -10.0 * np.sign(base["x"][-1][0] or 1.0)
  boundary = np.zeros(d, np.float32)
  boundary[1] = CLIP / _residual_norm()
  def replaced(x_row, y_row):
    x = base["x"].copy()
    y = base["y"].copy()
    x[-1], y[-1] = x_row, y_row
    return {"x": x, "y": y}
  return [
      (base, replaced(far, (int(base["y"][-1]) + 1) % K)),
      (base, replaced(boundary, 0)),
  ]


def step_event_replace_one() -> events.DpEvent:
  """One DP-SGD step at q = 1 for replace-one: ``PoissonSampled(1, Gaussian(sigma / 2))``."""
  return events.PoissonSampledDpEvent(
      1.0, events.GaussianDpEvent(SIGMA / 2, neighbouring=events.REPLACE_ONE, unit="example"))


reg.register(reg.ReleasePoint(
    name="jaxdp.dpsgd.linear_dpsgd[neighbouring=replace_one]",
    release=functools.partial(_linear_dpsgd, accountant="pld", neighbouring="replace_one"),
    **_LINEAR_DPSGD,
    **_common(neighbouring="replace_one", pairs=replace_one_pairs, event=step_event_replace_one,
              epsilon=gaussian_epsilon(2 * CLIP / (SIGMA * CLIP), DELTA), sensitivity=2 * CLIP,
              guarantee=("(eps, delta)-DP for replacing one example: the Poisson-subsampled "
                         "Gaussian on the clipped gradient sum, replace-one pair (Zhu, Dong & "
                         "Wang 2022), here one step at q = 1: the Gaussian mechanism of "
                         "sensitivity 2C (Balle & Wang 2018 Thm 8)"),
              skip={"charge": "linear_dpsgd spends on no accountant: it returns the event of "
                              "one run in result.event, checked in "
                              "tests/dpsgd/test_dpsgd_replace_one_training.py"})))


# -- PrivateSGD.step: registered per cell of the plan in entries_plan_cells.py ---------------


def _per_example_loss(w, x, y):
  return optax.softmax_cross_entropy_with_integer_labels(x @ w, y)


# -- optax transforms: noisy_aggregate, private_sgd, dp_optimizer -----------------

# The divisor is a data-independent constant (q N of the plan), the same on D and D'.
_DIVISOR = 16.0


@functools.lru_cache(maxsize=None)
def _clipped_sum_fn():
  from jaxdp import dpsgd
  fn = dpsgd.clipped_grad(_per_example_loss, l2_clip_norm=CLIP, batch_argnums=(1, 2),
                          method="vmap")
  return jax.jit(lambda w, x, y: fn(w, x, y)[0])


def _transform_release(make_tx, key, data):
  """One update of the transform on the clipped sum of ``data`` at ``W_0 = 0``."""
  w0 = jnp.zeros((D, K), jnp.float32)
  grad_sum = _clipped_sum_fn()(w0, jnp.asarray(data["x"]), jnp.asarray(data["y"]))
  tx = make_tx(key)
  updates, _ = tx.update(grad_sum, tx.init(w0), w0)
  return updates


def _noisy_aggregate(key):
  from jaxdp import dpsgd
  return dpsgd.noisy_aggregate(SIGMA, CLIP, _DIVISOR, key)


def _private_sgd(key):
  from jaxdp import dpsgd
  return dpsgd.private_sgd(1.0, noise_multiplier=SIGMA, l2_sensitivity=CLIP,
                           expected_batch_size=_DIVISOR, key=key)


def _dp_optimizer(key):
  from jaxdp import dpsgd
  return dpsgd.dp_optimizer(optax.sgd(1.0), noise_multiplier=SIGMA, l2_sensitivity=CLIP,
                            expected_batch_size=_DIVISOR, key=key)


def _gaussian_event() -> events.DpEvent:
  return events.GaussianDpEvent(SIGMA, neighbouring=events.ADD_REMOVE, unit="example")


for _name, _make, _sign in (("noisy_aggregate", _noisy_aggregate, 1.0),
                            ("private_sgd", _private_sgd, -1.0),
                            ("dp_optimizer", _dp_optimizer, -1.0)):
  _vec = functools.partial(lambda sign, out: sign * _DIVISOR * _flat(out), _sign)
  reg.register(reg.ReleasePoint(
      name=f"jaxdp.dpsgd.{_name}",
      release=functools.partial(_transform_release, _make),
      vector=_vec,
      charged=None,
      fresh=None,
      audit=reg.AuditSpec(statistic=functools.partial(
          lambda vec, out: _projection_statistic(vec(out)), _vec)),
      **_common(event=_gaussian_event, guarantee=_TRANSFORM_GUARANTEE,
                skip={"charge": "an optax transform spends nothing; its callers (make_private's "
                                "PaidSampler, train_dpsgd) pay each step before it runs, checked "
                                "by their entries"})))


# -- declared: public DP-SGD callables that release nothing themselves ----------------

_PLAN = ("the release is PrivateSGD.step (registered per cell of the plan in "
         "entries_plan_cells.py: one step or run of the plan, paid by the PaidSampler before its "
         "batch exists)")
for _name, _reason in {
    "jaxdp.dpsgd.make_private":
        "builds a PrivateSGD plan from public hyper-parameters (calibrates sigma, fixes q, P, "
        "the clip norm and the keys); it reads no data and spends nothing; " + _PLAN,
    "jaxdp.dpsgd.PrivateSGD":
        "the frozen plan made by make_private (public numbers, the optimiser and keys); " + _PLAN,
    "jaxdp.dpsgd.PrivateSGD.sampler":
        "opens the plan's PaidSampler on the caller's accountant; spends nothing until "
        "sample()/pay(), whose charge is checked by the PrivateSGD.step entry (one step paid "
        "per batch, a short PrivacyBudget refuses before any batch exists)",
    "jaxdp.dpsgd.PaidSampler":
        "made by PrivateSGD.sampler; its sample()/pay() spend the step event, checked by the "
        "PrivateSGD.step entry's charge check; " + _PLAN,
    "jaxdp.dpsgd.PaidSampler.epsilon":
        "epsilon of the steps paid so far: dpsgd_epsilon of public (sigma, q, t, delta)",
    "jaxdp.dpsgd.PrivateSGD.epsilon":
        "epsilon of t steps: dpsgd_epsilon of public (sigma, q, t, delta)",
    "jaxdp.dpsgd.PaidSampler.guarantee":
        "PaidSampler.epsilon as a PrivacyGuarantee naming the accountant method: public "
        "(sigma, q, t, delta)",
    "jaxdp.dpsgd.PrivateSGD.guarantee":
        "PrivateSGD.epsilon(t) as a PrivacyGuarantee naming the accountant method: public "
        "(sigma, q, t, delta)",
    "jaxdp.dpsgd.PrivateSGD.check_inputs":
        "validates params, x and y before anything is paid; returns nothing computed from the "
        "data (errors name the rule and the row, not the value)",
    "jaxdp.dpsgd.PrivateSGD.step_event":
        "the DpEvent of one step from public (q, sigma, unit); spends nothing",
    "jaxdp.dpsgd.ClippedGradFn":
        "the clipped per-example gradient SUM with its .sensitivity: the statistic before any "
        "noise (documented non-private, like its ClippedGradInfo), never released by the "
        "library; noisy_aggregate (registered) adds the noise",
    "jaxdp.dpsgd.DPSGDResult":
        "the result record of train_dpsgd (registered); its fields are checked there by the "
        "no_nonprivate check",
    "jaxdp.dpsgd.LinearDPSGDResult":
        "the result record of linear_dpsgd (registered); its fields are checked there",
    "jaxdp.dpsgd.abort_delta":
        "the extra delta (1 + e^eps) T p of aborting on overflow: arithmetic on public numbers",
    "jaxdp.dpsgd.noise_stddev":
        "sigma * S from the public noise multiplier and sensitivity (a calibration)",
    "jaxdp.dpsgd.transforms.noise_transformation":
        "tags a caller's (init, update) pair with the public noise_multiplier and l2_sensitivity "
        "it states (the metadata adaptive_clip_noise checks); draws no noise and reads no data "
        "itself; the library's noise transforms built with it (noisy_aggregate, "
        "correlated_noise) are registered",
}.items():
  reg.not_a_release_point(_name, _reason)

# train_dpsgd returns a DPSGDResult, which is not a pytree of arrays: its checks loop
# from the start (each call builds and compiles its own jitted step). linear_dpsgd and
# the transforms above are vmapped over the key (one trace per batch).
cc.host_side("jaxdp.dpsgd.train_dpsgd")
