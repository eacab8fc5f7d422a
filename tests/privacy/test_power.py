"""Power of the conformance checks: each one catches the defect it is meant to catch.

Two parts:

1. A toy Laplace release (``TOY``: ``f(D) = sum of records clipped to L1 norm
   1``, add/remove, ``Lap(1/eps)`` per coordinate; toy_release.py), with correct
   noise, passes every check; variants with ONE injected defect each fail the
   named check (20% less noise, a replayed key, one event charged for k
   releases, an exact statistic returned as a field, a record-anchored
   lattice, data moved 20% more than the claimed sensitivity, 50% less noise
   seen by the cheap audit, a per-process counter as the default seed).
2. ``INJECTIONS``: a table of defects injected into the LIBRARY with
   ``monkeypatch`` (family, registered entry, ``"module.attr"`` target,
   replacement factory, the check that must catch it). Each row is applied to
   the registered entry and the named check must raise ``AssertionError``;
   rows whose entry is not registered yet are skipped. Family owners add their
   rows here (see tests/privacy/README.md). ``test_catch_rate`` prints
   catches / injections.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import conformance_checks as cc
import conformance_registry as reg
from jaxdp import _keys
from jaxdp.accounting import events

# ---------------------------------------------------------------------------
# The toy release (toy_release.py: the fresh check's subprocesses import it alone).
# ---------------------------------------------------------------------------

from toy_release import (  # pylint: disable=wrong-import-position,unused-import
    BATCH, DIM, EPS, GRID, SCALE, TOY, TOY_COUNTER_KEY, TOY_FIXED_KEY, TOY_GRID, TOY_HALF_NOISE,
    TOY_KEYED, TOY_LEAK, TOY_ONE_CHARGE, TOY_OVER_NOISED, TOY_RECORD_LATTICE, TOY_SENSITIVITY,
    TOY_UNDER_NOISED, LeakyRelease, Toy, ToyRelease, exact_sum, make_toy, toy_event, toy_pairs)


# ---------------------------------------------------------------------------
# The correct toy passes every check; each defect is caught by its check.
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def toy_process_digests(request):
  """fresh(D) of the correct toy and of the per-process-counter toy in two processes (one spawn).

  Under pytest-xdist the two processes are started once for the run, by the first worker
  that needs them, and their digests are shared with the other worker (as the registry's,
  test_conformance.fresh_process_digests).
  """
  names = ["TOY", "TOY_COUNTER_KEY"]
  workerinput = getattr(request.config, "workerinput", None)
  if workerinput is None:
    procs = cc.FreshProcesses(names, module="toy_release")
  else:
    procs = cc.SharedFreshProcesses(names, run_id=workerinput.get("testrunuid", "run"),
                                    module="toy_release")
  yield procs.result()
  procs.kill()


def test_correct_toy_passes_every_check(toy_process_digests):
  cc.validate_entry(TOY)
  cc.check_replay(TOY)
  cc.check_fresh(TOY, process_digests=toy_process_digests)
  cc.check_charge(TOY)
  cc.check_no_nonprivate(TOY)
  assert cc.check_support(TOY).startswith("continuous support")
  assert cc.check_support(TOY_GRID) is None
  assert cc.check_noise_scale(TOY) is None  # vmappable: full power, no note
  cc.check_audit(TOY)


def test_keyed_api_refusing_none_passes_and_one_accepting_none_fails():
  """fresh=None means 'the API requires a key': release(None, D) must raise naming the key."""
  def keyed_release(key, data):
    if key is None:
      raise ValueError("key must be a jax.random key, got None.")
    return TOY.release(key, data)
  cc.check_fresh(dataclasses.replace(TOY_KEYED, release=keyed_release))

  def defaulting_release(key, data):  # a hidden default key: replayed noise
    return TOY.release(jax.random.key(0) if key is None else key, data)
  with pytest.raises(AssertionError, match="did not raise"):
    cc.check_fresh(dataclasses.replace(TOY_KEYED, release=defaulting_release))


@pytest.mark.parametrize("entry,check,match", [
    (TOY_UNDER_NOISED, cc.check_noise_scale, "less noise"),                 # (i)
    (TOY_OVER_NOISED, cc.check_noise_scale, "wrong units"),                  # gross over-noising
    (TOY_FIXED_KEY, cc.check_fresh, "identical outputs"),                   # (ii)
    (TOY_ONE_CHARGE, cc.check_charge, "ledger holds 1 x"),                  # (iii)
    (TOY_LEAK, cc.check_no_nonprivate, "exact_sum"),                        # (iv)
    (TOY_RECORD_LATTICE, cc.check_support, "not a multiple"),               # (v)
    (TOY_SENSITIVITY, cc.check_replay, "claimed sensitivity"),              # (vi)
    (TOY_HALF_NOISE, cc.check_audit, "exceeds the claimed"),                # (vii)
], ids=["under_noised", "over_noised", "fixed_key", "one_charge", "leak", "record_lattice",
        "sensitivity", "half_noise_audit"])
def test_toy_defect_is_caught(entry, check, match):
  with pytest.raises(AssertionError, match=match):
    check(entry)


def test_default_seed_counter_is_caught_across_processes(toy_process_digests):
  """A per-process counter (fresh in-process, identical across processes: the estimator bug)."""
  cc.check_fresh(TOY_COUNTER_KEY)  # two calls in one process differ: not caught here
  with pytest.raises(AssertionError, match="separate Python processes"):
    cc.check_fresh(TOY_COUNTER_KEY, process_digests=toy_process_digests)


def test_budget_refusal_after_partial_spend_is_caught():
  """A batch that spends one event per release refuses only at the last one: caught."""
  def charged(data, accountant):
    keys = jax.random.split(_keys.fresh_key(), BATCH)
    out = []
    for k in keys:
      accountant.spend(toy_event())
      out.append(TOY.release(k, data))
    return out, BATCH
  with pytest.raises(AssertionError, match="refused only after spending"):
    cc.check_charge(dataclasses.replace(TOY, charged=charged))


def test_noise_plan_error_rates():
  """The noise test's thresholds have the stated error rates (exact laws)."""
  from scipy import stats
  for kind in ("laplace", "gaussian", "l2_laplace"):
    n = cc.coordinates_needed(kind)
    plan = cc.plan_noise_test(kind, n)
    assert plan.power >= 1 - cc.NOISE_MISS
    assert cc.plan_noise_test(kind, n - 1).power < 1 - cc.NOISE_MISS
    if kind == "gaussian":
      false_alarm = stats.chi2.cdf(n * plan.low**2, n)
    else:
      false_alarm = stats.gamma.cdf(n * plan.low, n)
    assert false_alarm == pytest.approx(cc.NOISE_FALSE_ALARM, rel=1e-6)
  for kind in ("discrete_laplace", "discrete_gaussian"):
    n = cc.coordinates_needed(kind, 1.0, GRID)
    assert cc.plan_noise_test(kind, n, 1.0, GRID).power >= 1 - cc.NOISE_MISS


def test_ledger_releases_expands_compositions():
  from jaxdp.accounting import PrivacyAccountant
  e = toy_event()
  acc = PrivacyAccountant(neighbouring="add_remove")
  acc.spend(e, count=2)
  acc.spend(events.SelfComposedDpEvent(e, 3))
  acc.spend(events.ComposedDpEvent([e, events.SelfComposedDpEvent(e, 2)]))
  assert cc.ledger_releases(acc, e) == 2 + 3 + 3
  other = events.LaplaceDpEvent(noise_multiplier=2.0, neighbouring="add_remove")
  pair = events.ComposedDpEvent([e, other])
  acc2 = PrivacyAccountant(neighbouring="add_remove")
  acc2.spend(e, count=4)
  acc2.spend(other, count=4)  # components spent separately: 4 releases of the pair
  assert cc.ledger_releases(acc2, pair) == 4
  acc2.spend(other)
  assert cc.ledger_releases(acc2, pair) == 0  # not a whole number of pairs


def test_numeric_leaves_walks_objects():
  class Est:
    def __init__(self):
      self.coef_ = np.ones(2)
      self._hidden = {"w": np.zeros(3), "name": "x"}
      self.info = ToyRelease(jnp.ones(1), 3)

    @property
    def intercept_(self):
      return 1.5
  leaves = cc.numeric_leaves(Est())
  assert set(leaves) == {"coef_", "_hidden.w", "info.value", "info.dim", "intercept_"}


# ---------------------------------------------------------------------------
# Defects injected into the library (monkeypatch), one row per defect.
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Injection:
  """A defect injected into the library.

  Attributes:
    family: the family whose entry must catch it.
    entry: the registered entry name the check runs on.
    target: ``"package.module.attr"`` to monkeypatch.
    factory: ``original -> replacement`` (e.g. a wrapper returning 0.8x).
    check: the check name (``conformance_checks.CHECKS``) that must raise.
    defect: one line saying what was injected.
  """
  family: str
  entry: str
  target: str
  factory: Callable[[Any], Any]
  check: str
  defect: str


def scaled(factor: float) -> Callable[[Any], Any]:
  """Factory: the original function's (scalar) result times ``factor``."""
  def factory(original):
    def replacement(*args, **kwargs):
      return factor * original(*args, **kwargs)
    return replacement
  return factory


INJECTIONS: list[Injection] = [
    Injection("mechanisms", "jaxdp.mechanisms.laplace_mechanism",
              "jaxdp.mechanisms.laplace.laplace_scale", scaled(0.8), "noise",
              "Laplace scale b = 0.8 Delta/eps"),
    Injection("mechanisms", "jaxdp.mechanisms.laplace_mechanism",
              "jaxdp.mechanisms._sampling.standard_laplace", scaled(0.8), "noise",
              "Laplace sampler draws 0.8 x Lap(1)"),
    Injection("mechanisms", "jaxdp.mechanisms.gaussian_mechanism",
              "jaxdp.mechanisms.gaussian.analytic_gaussian_sigma", scaled(0.8), "noise",
              "analytic Gaussian sigma x 0.8"),
    Injection("mechanisms", "jaxdp.mechanisms.classic_gaussian_mechanism",
              "jaxdp.mechanisms.gaussian.classic_gaussian_sigma", scaled(0.8), "noise",
              "classic Gaussian sigma x 0.8"),
    Injection("mechanisms", "jaxdp.mechanisms.zcdp_gaussian_mechanism",
              "jaxdp.mechanisms.gaussian.gaussian_zcdp_sigma", scaled(0.8), "noise",
              "zCDP Gaussian sigma x 0.8"),
    Injection("mechanisms", "jaxdp.mechanisms.l2_laplace_mechanism",
              "jaxdp.mechanisms.l2_laplace.l2_laplace_beta", scaled(1.25), "noise",
              "L2-Laplace beta x 1.25 (scale x 0.8)"),
    Injection("multiparty", "jaxdp.multiparty.private_soft_label_erm",
              "jaxdp.multiparty.private_global.soft_label_sensitivity", scaled(0.8), "noise",
              "soft-label (Thm 3) sensitivity x 0.8"),
    Injection("multiparty", "jaxdp.multiparty.private_vote_erm",
              "jaxdp.multiparty.private_global.vote_sensitivity", scaled(0.8), "noise",
              "majority-vote (App. B.2) sensitivity x 0.8"),
    Injection("multiparty", "jaxdp.multiparty.private_parameter_averaging",
              "jaxdp.multiparty.baselines.parameter_averaging_sensitivity", scaled(0.8), "noise",
              "parameter-averaging (App. B.4) sensitivity x 0.8"),
    Injection("multiparty", "jaxdp.multiparty.private_soft_label_erm",
              "jaxdp.multiparty.private_global._num_releases", lambda original: lambda key: 1,
              "charge", "a batch of keys charged as one release"),
]

# -- dpsgd and prediction rows (entries_dpsgd.py, entries_prediction.py) ---------------


def _constant_nonce(original):
  """Factory: a ``secrets`` stand-in whose ``randbits`` always returns one nonce."""
  del original
  import types  # pylint: disable=import-outside-toplevel
  return types.SimpleNamespace(randbits=lambda bits: 0x5EED)


def _noop_event(original):
  """Factory: the event function returns a no-op event (the steps are not charged)."""
  del original
  def replacement(*args, **kwargs):
    return events.NoOpDpEvent()
  return replacement


def _spend_noop(original):
  """Factory: the sampler's spend records a no-op event instead of the step's."""
  del original
  def replacement(accountant, event, count):
    accountant.spend(events.NoOpDpEvent(), count=count)
  return replacement


INJECTIONS.extend([
    Injection("dpsgd", "jaxdp.dpsgd.noisy_aggregate",
              "jaxdp.dpsgd.transforms.noise_stddev", scaled(0.8), "noise",
              "noise std sigma*S x 0.8 in noisy_aggregate"),
    Injection("dpsgd", "jaxdp.dpsgd.linear_dpsgd",
              "jaxdp.accounting.dpsgd_accounting.resolve_noise_multiplier", scaled(0.8),
              "noise", "linear_dpsgd noise multiplier x 0.8"),
    Injection("dpsgd", "jaxdp.dpsgd.linear_dpsgd[neighbouring=replace_one]",
              "jaxdp.accounting.dpsgd_accounting.resolve_noise_multiplier", scaled(0.8),
              "noise", "replace-one linear_dpsgd noise multiplier x 0.8"),
    Injection("dpsgd", "jaxdp.dpsgd.linear_dpsgd",
              "jaxdp.dpsgd.linear.safe_clip_norm", scaled(1.2), "replay",
              "linear_dpsgd clips to 1.2 C (sensitivity 20% above the claim)"),
    Injection("dpsgd", "jaxdp.dpsgd.train_dpsgd",
              "jaxdp.dpsgd.paid_sampler._spend_once", _spend_noop, "charge",
              "train_dpsgd's sampler prepays no-op events instead of its T steps"),
    Injection("dpsgd", "jaxdp.dpsgd.PrivateSGD.step[noise=independent, clip=fixed]",
              "jaxdp.dpsgd.transforms.noise_stddev", scaled(0.8), "noise",
              "make_private plan (host sampling): noise std sigma*S x 0.8"),
    Injection("dpsgd", "jaxdp.dpsgd.PrivateSGD.step[noise=independent, clip=fixed, data=device]",
              "jaxdp.dpsgd.transforms.noise_stddev", scaled(0.8), "noise",
              "make_private plan (in-jit sampling from device data): noise std sigma*S x 0.8"),
    Injection("dpsgd", "jaxdp.dpsgd.PrivateSGD.step[noise=independent, clip=fixed, data=device]",
              "jaxdp.dpsgd.paid_sampler._spend_once", _spend_noop, "charge",
              "device-resident sampler pays a no-op event instead of each step"),
    Injection("dpsgd", "jaxdp.dpsgd.correlated.correlated_noise[BandMF]",
              "jaxdp.dpsgd.correlated.noise.noise_stddev", scaled(0.8), "noise",
              "correlated noise: std sigma*S*s_1 of z x 0.8 (BandMF)"),
    Injection("dpsgd", "jaxdp.dpsgd.correlated.correlated_noise[BLT]",
              "jaxdp.dpsgd.correlated.noise.single_participation_sensitivity", scaled(0.8),
              "noise", "correlated noise: s_1 = ||C[:,0]|| x 0.8 (BLT)"),
    Injection("dpsgd", "jaxdp.dpsgd.PrivateSGD.step[noise=BandMF, clip=fixed]",
              "jaxdp.dpsgd.correlated.noise.noise_stddev", scaled(0.8), "noise",
              "make_private(noise_strategy=BandMF): std of z x 0.8"),
    Injection("dpsgd", "jaxdp.dpsgd.PrivateSGD.step[noise=BandMF, clip=fixed]",
              "jaxdp.dpsgd.correlated.accounting.run_sensitivity", scaled(0.8), "charge",
              "make_private(noise_strategy=BandMF): (k, b) run sensitivity x 0.8 in the event"),
    Injection("dpsgd", "jaxdp.dpsgd.PrivateSGD.step[noise=BandMF, clip=fixed]",
              "jaxdp.dpsgd.paid_sampler._spend_once", _spend_noop, "charge",
              "correlated-noise sampler pays a no-op event instead of the run"),
    Injection("dpsgd", "jaxdp.dpsgd.PrivateSGD.step[noise=BLT, clip=fixed]",
              "jaxdp.dpsgd.correlated.noise.noise_stddev", scaled(0.8), "noise",
              "make_private(noise_strategy=BLT): std of z x 0.8"),
    Injection("prediction", "jaxdp.prediction.PredictionSensitivityPredictor.predict",
              "jaxdp.prediction.predictor.secrets", _constant_nonce, "fresh",
              "predictor nonce is a constant: two instances with one key replay the noise"),
    Injection("prediction", "jaxdp.prediction.PredictionSensitivityPredictor.predict",
              "jaxdp.prediction.predictor._f32_at_least", scaled(0.8), "noise",
              "predictor Gaussian sigma x 0.8 when cast to float32"),
    Injection("prediction", "jaxdp.prediction.PredictionSensitivityPredictor.predict",
              "jaxdp.prediction.prediction_sensitivity.logit_sensitivity", scaled(0.8),
              "noise", "logit sensitivity 2K/(N lambda) x 0.8 in the calibration"),
    Injection("prediction", "jaxdp.prediction.noisy_logits",
              "jaxdp.mechanisms.gaussian.gaussian_noise", scaled(0.8), "noise",
              "Gaussian logit noise x 0.8"),
])

def _naive_bayes_scales(factor: float) -> Callable[[Any], Any]:
  """Factory: naive_bayes_calibration with every Laplace scale times ``factor``."""
  def factory(original):
    def replacement(*args, **kwargs):
      cal = original(*args, **kwargs)
      return cal._replace(scales=tuple(factor * s for s in cal.scales))
    return replacement
  return factory


def _naive_bayes_epsilons(factor: float) -> Callable[[Any], Any]:
  """Factory: naive_bayes_calibration with every block epsilon times ``factor``.

  The discrete release derives its integer noise parameters from the block
  epsilons, so ``factor = 1.25`` draws noise 20% narrower than the claim.
  """
  def factory(original):
    def replacement(*args, **kwargs):
      cal = original(*args, **kwargs)
      return cal._replace(epsilons=tuple(factor * e for e in cal.epsilons))
    return replacement
  return factory


# Generic rows for families whose owners had not added theirs (20% less noise).
INJECTIONS.extend([
    # The continuous row first: it is the family's always-on row (the discrete path
    # compiles its sampler anew for each cleared cache, ~3x the time); both run under slow.
    Injection("classic", "jaxdp.classic.private_naive_bayes[noise=continuous]",
              "jaxdp.classic.naive_bayes.naive_bayes_calibration", _naive_bayes_scales(0.8),
              "noise", "naive-Bayes Laplace scales x 0.8 (continuous path)"),
    Injection("classic", "jaxdp.classic.private_naive_bayes",
              "jaxdp.classic.naive_bayes.naive_bayes_calibration", _naive_bayes_epsilons(1.25),
              "noise", "naive-Bayes discrete Laplace block epsilons x 1.25 (noise x 0.8)"),
    Injection("inference", "jaxdp.inference.priv_spd_matrix",
              "jaxdp.inference.spd_release.spd_noise", scaled(0.8), "noise",
              "symmetric SPD-release noise x 0.8"),
])


def _constant_fresh_key(original):
  """Factory: ``fresh_key`` that returns one fixed key (an object replaying its noise)."""
  del original
  import jax  # pylint: disable=import-outside-toplevel
  return lambda: jax.random.key(0)


# Linear training, the estimators' key rule, and the classic estimators.
INJECTIONS.extend([
    Injection("training", "jaxdp.training.output_perturbation.model_sensitivity",
              "jaxdp.training.output_perturbation.minimizer_sensitivity", scaled(0.8), "noise",
              "model sensitivity's minimiser sensitivity 2K/(N lambda) x 0.8"),
    Injection("training", "jaxdp.training.output_perturbation.output_perturbation",
              "jaxdp.training.output_perturbation.minimizer_sensitivity", scaled(0.8), "noise",
              "output perturbation's minimiser sensitivity x 0.8"),
    Injection("training", "jaxdp.training.estimators.PrivateLogisticRegression.fit",
              "jaxdp._keys.fresh_key", _constant_fresh_key, "fresh",
              "seed=None replays one fixed key (every default instance adds the same noise)"),
    Injection("classic", "jaxdp.classic.PrivateNaiveBayes.fit",
              "jaxdp._keys.fresh_key", _constant_fresh_key, "fresh",
              "seed=None replays one fixed key in the classic estimators"),
])


def _count_noise_scaled(factor: float) -> Callable[[Any], Any]:
  """Factory: adaptive_state's ``mechanisms`` with ``gaussian_noise`` times ``factor``.

  Only the count noise of adaptive clipping is drawn through that module attribute (the
  gradient noise is drawn inside ``noisy_aggregate``).
  """
  def factory(original):
    import types  # pylint: disable=import-outside-toplevel
    namespace = types.SimpleNamespace(**vars(original))
    namespace.gaussian_noise = lambda *args, **kwargs: factor * original.gaussian_noise(
        *args, **kwargs)
    return namespace
  return factory


def _uncentered_count(original):
  """Factory: ``centered_unclipped_count`` returning ``sum_i b_i`` (sensitivity 1, not 1/2)."""
  del original
  return lambda num_examples, num_clipped: (jnp.asarray(num_examples, jnp.float32)
                                            - jnp.asarray(num_clipped, jnp.float32))


# Adaptive clipping (entries_adaptive_clipping.py).
INJECTIONS.extend([
    Injection("dpsgd", "jaxdp.dpsgd.adaptive_noisy_aggregate",
              "jaxdp.dpsgd.adaptive_accounting.gradient_noise_multiplier", scaled(0.8),
              "noise", "adaptive clipping: gradient noise sigma_Delta x 0.8"),
    Injection("dpsgd", "jaxdp.dpsgd.adaptive_clip_noise[part=count]",
              "jaxdp.dpsgd.adaptive_state.mechanisms", _count_noise_scaled(0.8),
              "noise", "adaptive clipping: count noise drawn at 0.8 sigma_b"),
    Injection("dpsgd", "jaxdp.dpsgd.adaptive_noisy_aggregate",
              "jaxdp.dpsgd.adaptive_state.mechanisms", _count_noise_scaled(0.0),
              "no_nonprivate", "adaptive clipping: the next clip norm from the exact count (no "
              "count noise)"),
    Injection("dpsgd", "jaxdp.dpsgd.adaptive_noisy_aggregate",
              "jaxdp.dpsgd.adaptive_clipping.centered_unclipped_count",
              _uncentered_count, "replay",
              "adaptive clipping: uncentered count sum b_i (sensitivity 1) noised for 1/2"),
    Injection("dpsgd", "jaxdp.dpsgd.PrivateSGD.step[noise=independent, clip=adaptive]",
              "jaxdp.dpsgd.adaptive_accounting.gradient_noise_multiplier", scaled(0.8),
              "noise", "make_private with adaptive clipping: gradient noise sigma_Delta x 0.8"),
    Injection("dpsgd", "jaxdp.dpsgd.PrivateSGD.step[noise=BandMF, clip=adaptive]",
              "jaxdp.dpsgd.adaptive_accounting.gradient_noise_multiplier", scaled(0.8), "noise",
              "make_private(BandMF, AdaptiveClipNorm): run-level gradient noise sigma_Delta x 0.8 "
              "(adaptive_clip_noise builds the correlated noise with it)"),
    Injection("dpsgd", "jaxdp.dpsgd.PrivateSGD.step[noise=BLT, clip=adaptive]",
              "jaxdp.dpsgd.adaptive_accounting.gradient_noise_multiplier", scaled(0.8), "noise",
              "make_private(BLT, AdaptiveClipNorm): run-level gradient noise sigma_Delta x 0.8 "
              "(adaptive_clip_noise builds the correlated noise with it)"),
    Injection("dpsgd", "jaxdp.dpsgd.adaptive_clipping.per_layer_adaptive_clip_noise",
              "jaxdp.dpsgd.adaptive_accounting.gradient_noise_multiplier", scaled(0.8),
              "noise", "per-layer adaptive clipping: gradient noise sigma_Delta (G counts) x 0.8"),
])

# Batch selections of the plan (entries_plan_cells.py).
INJECTIONS.extend([
    Injection("dpsgd", "jaxdp.dpsgd.PrivateSGD.step[selection=fixed_size]",
              "jaxdp.dpsgd.transforms.noise_stddev", scaled(0.8), "noise",
              "make_private(batch_selection=FixedSizeSampler): noise std sigma*C x 0.8"),
    Injection("dpsgd", "jaxdp.dpsgd.PrivateSGD.step[selection=fixed_size]",
              "jaxdp.dpsgd.plan_accounting._fixed_size_noise_multiplier", scaled(0.8), "noise",
              "make_private(batch_selection=FixedSizeSampler): sigma x 0.8 (noise and event)"),
    Injection("dpsgd", "jaxdp.dpsgd.PrivateSGD.step[selection=user]",
              "jaxdp.dpsgd.transforms.noise_stddev", scaled(0.8), "noise",
              "make_private(batch_selection=UserPoissonSampler): noise std sigma*C x 0.8"),
])


# Private hyper-parameter tuning (entries_tuning.py): the per-run mechanism under-noised, and a
# law of K that is not the one accounted (K fixed at its mean instead of random).
def _fixed_mean_count(original):
  del original
  return lambda law, u: int(round(law.mean))


INJECTIONS.extend([
    Injection("tuning", "jaxdp.tuning.repeat_and_select",
              "jaxdp.mechanisms.laplace.laplace_scale", scaled(0.8), "noise",
              "repeat_and_select: the per-run Laplace mechanism's scale x 0.8"),
    Injection("tuning", "jaxdp.tuning.repeat_and_select[law=logarithmic, audit=law of K]",
              "jaxdp.tuning.repetitions._draw_count", _fixed_mean_count, "audit",
              "repeat_and_select: K fixed at its mean instead of the accounted random law"),
])


# PrivateSearchCV (entries_tuning.py): each run's private validation score under-noised (the
# Laplace scale of jaxdp.tuning.scoring's count, x 0.8), seen on the one-run variant.
INJECTIONS.append(
    Injection("tuning", "jaxdp.tuning.PrivateSearchCV.fit[runs=1, check=score noise]",
              "jaxdp.mechanisms.laplace.laplace_scale", scaled(0.8), "noise",
              "PrivateSearchCV: the per-run validation score's Laplace scale x 0.8"))


# Wired plan cells: selection x {adaptive, correlated}, per-layer adaptive
# (entries_plan_cells_wired.py): 20% less gradient noise in each.
INJECTIONS.extend([
    Injection("dpsgd", "jaxdp.dpsgd.PrivateSGD.step[selection=fixed_size, clip=adaptive]",
              "jaxdp.dpsgd.adaptive_accounting.gradient_noise_multiplier", scaled(0.8), "noise",
              "make_private(FixedSizeSampler, AdaptiveClipNorm): gradient sigma_Delta x 0.8"),
    Injection("dpsgd", "jaxdp.dpsgd.PrivateSGD.step[selection=user, clip=adaptive]",
              "jaxdp.dpsgd.adaptive_accounting.gradient_noise_multiplier", scaled(0.8), "noise",
              "make_private(UserPoissonSampler, AdaptiveClipNorm): gradient sigma_Delta x 0.8"),
    Injection("dpsgd", "jaxdp.dpsgd.PrivateSGD.step[selection=fixed_size, noise=BandMF]",
              "jaxdp.dpsgd.correlated.noise.noise_stddev", scaled(0.8), "noise",
              "make_private(FixedSizeSampler, BandMF): std of z x 0.8"),
    Injection("dpsgd", "jaxdp.dpsgd.PrivateSGD.step[selection=user, noise=BandMF]",
              "jaxdp.dpsgd.correlated.noise.noise_stddev", scaled(0.8), "noise",
              "make_private(UserPoissonSampler, BandMF): std of z x 0.8"),
    Injection("dpsgd", "jaxdp.dpsgd.PrivateSGD.step[noise=independent, clip=adaptive, "
              "per_layer=True]",
              "jaxdp.dpsgd.adaptive_accounting.gradient_noise_multiplier", scaled(0.8), "noise",
              "make_private(per_layer=True, AdaptiveClipNorm): sigma_Delta for G counts x 0.8"),
])


_RESULTS: dict[str, str] = {}


def _row_id(row: Injection) -> str:
  return f"{row.family}:{row.target.rsplit('.', 1)[-1]}->{row.check}:{row.entry.rsplit('.', 1)[-1]}"


def _registry() -> dict:
  return reg.load_all()


def _resolve_target(target: str):
  module_name, attr = target.rsplit(".", 1)
  return importlib.import_module(module_name), attr


def run_injection(row: Injection, monkeypatch) -> bool:
  """Applies ``row`` and runs its check on the registered entry; True if the check raised.

  The entry's cached releases are forgotten before the patched check (releases cached
  before the patch must not be reused) and after it, whatever it raised (nothing computed
  under the patch survives it); only this entry is computed under the patch.
  """
  entry = _registry()[row.entry]
  module, attr = _resolve_target(row.target)
  original = getattr(module, attr)
  with monkeypatch.context() as patch:
    patch.setattr(module, attr, row.factory(original))
    cc.clear_caches(row.entry)
    try:
      cc.CHECK_FUNCTIONS[row.check](entry)
    except AssertionError:
      return True
    finally:
      cc.clear_caches(row.entry)
  return False


def _with_cost_marks(rows: list[Injection]) -> list:
  """The first row of each family always runs; the others are ``slow`` (same assertion).

  Every row runs its check unpatched and again patched with the entry's caches cleared
  (recompiling the entry), so the whole table takes minutes on 2 cores; ``-m slow`` runs
  every row. The always-on rows' entries are pinned (conformance_checks.pin): their
  unpatched check reads the releases test_conformance computed in this process, if any.
  """
  seen: set[str] = set()
  params = []
  for row in rows:
    marks = () if row.family not in seen else (pytest.mark.slow,)
    if row.family not in seen:
      cc.pin(row.entry)
    seen.add(row.family)
    params.append(pytest.param(row, marks=marks, id=_row_id(row)))
  return params


@pytest.mark.parametrize("row", _with_cost_marks(INJECTIONS))
def test_injected_library_defect_is_caught(row, monkeypatch):
  if row.entry not in _registry():
    _RESULTS[_row_id(row)] = "skipped"
    pytest.skip(f"{row.entry} is not registered yet.")
  skip = cc.canonical_skip(_registry()[row.entry])
  if row.check in skip:
    _RESULTS[_row_id(row)] = "skipped"
    pytest.skip(f"{row.entry} skips {row.check}: {skip[row.check]}")
  # The unpatched entry must pass the check (else the row shows nothing); its cached
  # releases, if any, were computed unpatched (every patched check clears them).
  cc.CHECK_FUNCTIONS[row.check](_registry()[row.entry])
  caught = run_injection(row, monkeypatch)  # clears the entry's caches before and after
  _RESULTS[_row_id(row)] = "caught" if caught else "MISSED"
  assert caught, f"injected defect not caught by {row.check} on {row.entry}: {row.defect}"


def test_catch_rate(capsys):
  """Prints catches / injections (runs after the rows in file order)."""
  ran = {k: v for k, v in _RESULTS.items() if v != "skipped"}
  caught = sum(v == "caught" for v in ran.values())
  by_family: dict[str, list[int]] = {}
  for row in INJECTIONS:
    state = _RESULTS.get(_row_id(row))
    if state in ("caught", "MISSED"):
      tally = by_family.setdefault(row.family, [0, 0])
      tally[0] += state == "caught"
      tally[1] += 1
  with capsys.disabled():
    print(f"\n[conformance power] library injections caught: {caught}/{len(ran)} "
          f"({len(INJECTIONS) - len(ran)} rows not run: deselected, entry not registered or check "
          "skipped); "
          + ", ".join(f"{f}: {c}/{t}" for f, (c, t) in sorted(by_family.items())))
  assert caught == len(ran)

