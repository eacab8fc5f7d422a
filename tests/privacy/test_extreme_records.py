"""Records that break arithmetic (jaxdp issue 40 section 2), for every registered release point.

For each entry, :mod:`extreme_records` builds neighbouring pairs whose
differing record is valid but extreme for the arithmetic (float32's overflow
threshold, 1e19, a subnormal, the domain's edge, huge targets, every other
record exactly zero; or the entry's own ``extreme_pairs``: all votes on one
class, the largest count), and :func:`conformance_checks.check_extreme_records`
requires both sides to release finite values on the same support, or the input
to be refused with a clear argument error before any spend. A NaN/inf on one
side only is an infinite privacy loss.

Always on: the ``FAST_VARIANTS`` (``f32_max``, ``zero_others``; the first two
entry-specific pairs) of every entry except the heavy ones of :data:`HEAVY`;
``@pytest.mark.slow``: every variant of every entry. The check's power (it
fails on a toy release that overflows, NaNs on both sides, errors inside
numpy, refuses after spending, or names an internal quantity) and the generic
construction are tested at the end.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import conformance_checks as cc
import conformance_registry as reg
import extreme_records as er

REGISTRY = reg.load_all()
NAMES = sorted(REGISTRY)

# Entries whose extreme check costs seconds (a training step compiled per call, estimator
# fits, teacher ensembles; measured on 2 cores with the always-on variants): slow only, as
# the strong audits of test_conformance.py. One cheap entry of each of their release
# functions stays always on (PrivateSGD.step[noise=independent, clip=fixed], linear_dpsgd,
# the closed-form classic releases, the prediction functions on votes and logits).
HEAVY = frozenset(
    [n for n in NAMES if n.startswith("jaxdp.dpsgd.PrivateSGD.step[")
     and n != "jaxdp.dpsgd.PrivateSGD.step[noise=independent, clip=fixed]"]
    + ["jaxdp.dpsgd.linear_dpsgd[neighbouring=replace_one]",
       "jaxdp.dpsgd.train_dpsgd",
       "jaxdp.dpsgd.adaptive_clipping.per_layer_adaptive_clip_noise",
       "jaxdp.classic.PrivateKMeans.fit",
       "jaxdp.classic.PrivateKMeans.fit[method=sample_aggregate]",
       "jaxdp.classic.PrivateNaiveBayes.fit",
       "jaxdp.inference.confidence_intervals",
       "jaxdp.inference.confidence_intervals_batched",
       "jaxdp.prediction.NoisyMaxPredictor.predict",
       "jaxdp.prediction.PredictionSensitivityPredictor.predict",
       "jaxdp.prediction.pate_label_and_train",
       "jaxdp.training.objective_perturbation.objective_perturbation",
       "jaxdp.training.output_perturbation.model_sensitivity",
       "jaxdp.tuning.PrivateSearchCV.fit",
       "jaxdp.tuning.PrivateSearchCV.fit[runs=1, check=score noise]",
       "jaxdp.tuning.repeat_and_select[law=logarithmic, audit=law of K]"])

# Release points with a known extreme-record defect (xfail, strict), with the fix: the case
# fails until the library is fixed, then is removed from here.
KNOWN_DEFECTS: dict[str, str] = {}


def _marks(name: str, slow: bool) -> list:
  marks = [pytest.mark.slow] if slow else []
  if name in KNOWN_DEFECTS:
    marks.append(pytest.mark.xfail(reason=KNOWN_DEFECTS[name], strict=True, raises=AssertionError))
  return marks


def _entry_or_skip(name: str) -> reg.ReleasePoint:
  entry = REGISTRY[name]
  skip = cc.canonical_skip(entry)
  if "extreme" in skip:
    pytest.skip(f"extreme does not apply: {skip['extreme']}")
  return entry


FAST_CASES = [pytest.param(n, marks=_marks(n, slow=n in HEAVY), id=n) for n in NAMES]
FULL_CASES = [pytest.param(n, marks=_marks(n, slow=True), id=n) for n in NAMES]


@pytest.mark.parametrize("name", FAST_CASES)
def test_extreme_records(name):
  """The always-on variants (``f32_max``, ``zero_others``; two entry-specific pairs)."""
  note = cc.check_extreme_records(_entry_or_skip(name), fast=True)
  print(f"{name} [extreme]: {note}")


@pytest.mark.parametrize("name", FULL_CASES)
def test_extreme_records_all_variants(name):
  """Every variant of :data:`extreme_records.VARIANTS` (or every entry-specific pair)."""
  note = cc.check_extreme_records(_entry_or_skip(name), fast=False)
  print(f"{name} [extreme, all variants]: {note}")


def test_every_entry_has_extreme_pairs_or_a_reason():
  """Completeness: every entry has >= 1 extreme pair (fast and full) or ``skip["extreme"]``."""
  missing = []
  for name in NAMES:
    entry = REGISTRY[name]
    if "extreme" in cc.canonical_skip(entry):
      continue
    fast, full = er.extreme_pairs_of(entry, fast=True), er.extreme_pairs_of(entry)
    if not fast or not full:
      missing.append(f"{name} ({len(fast)} always-on, {len(full)} in all)")
    assert len(full) <= er.MAX_VARIANTS, f"{name}: {len(full)} extreme pairs > {er.MAX_VARIANTS}"
  assert not missing, (
      "entries without extreme pairs (the generic construction found no float record to make "
      "extreme: give ReleasePoint.extreme_pairs, or skip['extreme'] with the reason):\n  "
      + "\n  ".join(missing))




def test_private_argmax_traced_extreme_score_stays_on_support():
  """A finite but huge score: beta * scores is shifted by the largest score, never +inf (jit too)."""
  from jaxdp import training  # pylint: disable=import-outside-toplevel
  scores = np.full(30, 0.5, np.float32)
  extreme = scores.copy()
  extreme[0] = np.float32(er.F32_MAX)  # finite: a valid (if absurd) score
  select = jax.jit(lambda k, s: training.private_argmax(k, s, sensitivity=0.125, epsilon=3.0))
  got = [int(select(jax.random.key(0), s)) for s in (scores, extreme)]
  assert all(0 <= g < scores.size for g in got), f"indices on D and D'': {got}"


def test_known_defects_and_heavy_names_are_registered():
  stale = sorted((set(KNOWN_DEFECTS) | set(HEAVY)) - set(REGISTRY))
  assert not stale, f"names in KNOWN_DEFECTS / HEAVY that are not registered: {stale}"


# ---------------------------------------------------------------------------
# Power of the check: toy releases with the defects it must catch.
# ---------------------------------------------------------------------------


def _toy_pairs():
  x = np.array([[0.5, 0.1], [0.2, -0.3], [0.0, 0.4]], np.float32)
  return [({"x": x}, {"x": np.vstack([x, [[0.6, 0.0]]]).astype(np.float32)})]


def _toy(release, charged=None, name="jaxdp.mechanisms.laplace_mechanism[toy]"):
  from jaxdp.accounting import PureDpEvent  # pylint: disable=import-outside-toplevel
  return reg.ReleasePoint(
      name=name, family="mechanisms", neighbouring="add_remove", unit="example",
      guarantee="toy", epsilon=1.0, delta=0.0, pairs=_toy_pairs, release=release,
      vector=lambda out: np.asarray(out, np.float64).ravel(),
      event=lambda: PureDpEvent(1.0), charged=charged)


def _noise(key, shape=()):
  return jax.random.laplace(key, shape, jnp.float32)


def _sum_of_squares(key, d):
  """No clipping: a float32 record at 3.4e38 overflows the sum of squares to +inf."""
  x = jnp.asarray(d["x"], jnp.float32)
  return jnp.sum(x * x) + _noise(key)


def test_power_one_sided_overflow_fails():
  with pytest.raises(AssertionError, match=r"f32_max .*non-finite release"):
    cc.check_extreme_records(_toy(_sum_of_squares), fast=True)


def test_power_nan_on_both_sides_fails():
  pair = er.ExtremePair("both_huge", ({"x": np.full((2, 2), 1e30, np.float32)},
                                      {"x": np.full((3, 2), 1e30, np.float32)}))
  release = lambda key, d: jnp.sum(jnp.asarray(d["x"]) ** 2) - jnp.sum(jnp.asarray(d["x"]) ** 2)
  with pytest.raises(AssertionError, match=r"D: non-finite.*\n.*D'': non-finite"):
    cc.check_extreme_records(_toy(release), pairs=[pair])


def test_power_error_inside_numpy_fails():
  def release(key, d):
    x = np.asarray(d["x"], np.float64)
    gram = x.T @ x - 1e6 * np.eye(2) * (np.max(np.abs(x)) > 1e6)  # not PD for the extreme row
    return np.linalg.cholesky(gram + 1e-3 * np.eye(2)).ravel() + float(_noise(key))
  with pytest.raises(AssertionError, match="raised inside .*numpy"):
    cc.check_extreme_records(_toy(release), fast=True)


def _refuse(d):
  from jaxdp import _validation  # pylint: disable=import-outside-toplevel
  _validation.check_unit_ball(np.asarray(d["x"], np.float64), "x")


def _refusing_release(key, d):
  _refuse(d)
  return jnp.sum(jnp.asarray(d["x"], jnp.float32), axis=0) + _noise(key, (2,))


def test_power_refusal_after_spend_fails():
  from jaxdp.accounting import PureDpEvent  # pylint: disable=import-outside-toplevel

  def charged(d, acc):
    acc.spend(PureDpEvent(1.0))  # spends, THEN validates: the defect
    _refuse(d)
    return _refusing_release(jax.random.key(0), d), 1
  with pytest.raises(AssertionError, match="refused only after spending"):
    cc.check_extreme_records(_toy(_refusing_release, charged), fast=True)


def test_power_release_refuses_but_charged_releases_fails():
  charged = lambda d, acc: (jnp.zeros(2), 1)  # never refuses
  with pytest.raises(AssertionError, match=r"charged\(\) released"):
    cc.check_extreme_records(_toy(_refusing_release, charged), fast=True)


def test_power_refusal_naming_an_internal_quantity_fails():
  def release(key, d):
    from jaxdp import _validation  # pylint: disable=import-outside-toplevel
    logits = np.asarray(d["x"], np.float32) * np.float32(12.0)  # overflows for 3.4e38
    _validation.check_finite_array(logits, "logits")
    return jnp.sum(jnp.asarray(logits), axis=0) + _noise(key, (2,))
  with np.errstate(over="ignore"):
    with pytest.raises(AssertionError, match="does not name an argument"):
      cc.check_extreme_records(_toy(release), fast=True)


def test_power_refusal_blaming_nan_on_a_finite_input_fails():
  def release(key, d):
    from jaxdp import _validation  # pylint: disable=import-outside-toplevel
    scaled = np.asarray(d["x"], np.float32) * np.float32(12.0)  # overflows for 3.4e38
    _validation.check_finite_array(scaled, "x")  # "x contains NaN or inf": x is finite
    return jnp.sum(jnp.asarray(scaled), axis=0) + _noise(key, (2,))
  with np.errstate(over="ignore"):
    with pytest.raises(AssertionError, match="blames NaN/inf on a finite input"):
      cc.check_extreme_records(_toy(release), fast=True)


def test_clear_refusal_before_spend_passes():
  from jaxdp.accounting import PureDpEvent  # pylint: disable=import-outside-toplevel

  def charged(d, acc):
    _refuse(d)  # validates first
    acc.spend(PureDpEvent(1.0))
    return _refusing_release(jax.random.key(0), d), 1
  note = cc.check_extreme_records(_toy(_refusing_release, charged), fast=True)
  assert "1 clear refusal(s)" in note and "rows of x" in note, note


def test_finite_release_passes_and_off_support_fails():
  clipped = lambda key, d: jnp.sum(jnp.clip(jnp.asarray(d["x"], jnp.float32), -1, 1)) + _noise(key)
  note = cc.check_extreme_records(_toy(clipped), fast=True)
  assert "4 finite release(s)" in note, note
  discrete = dataclasses.replace(_toy(clipped), support="discrete")
  with pytest.raises(AssertionError, match="not an integer"):
    cc.check_extreme_records(discrete, fast=True)


def test_skip_key_extreme_is_valid():
  entry = dataclasses.replace(_toy(_sum_of_squares),
                              skip={"extreme": "a toy whose data cannot be extreme"})
  cc.validate_entry(entry)


# ---------------------------------------------------------------------------
# The generic construction.
# ---------------------------------------------------------------------------


def _by_variant(pairs):
  return {p.variant: p for p in pairs}


def test_generic_add_remove_appended_row():
  x = np.arange(8, dtype=np.float32).reshape(4, 2) / 10
  y = np.array([0, 1, 2, 1], np.int32)
  d, d2 = {"x": x[:3], "y": y[:3]}, {"x": x, "y": y}
  made = _by_variant(er.generic_extreme_pairs([(d, d2)]))
  assert set(made) <= set(er.VARIANTS) and len(made) <= er.MAX_VARIANTS
  top = made["f32_max"]
  assert top.extreme_side == 1
  np.testing.assert_array_equal(top.pair[0]["x"], x[:3])  # D untouched
  np.testing.assert_array_equal(top.pair[1]["x"][:3], x[:3])
  assert np.all(top.pair[1]["x"][3] == np.float32(er.F32_MAX))
  np.testing.assert_array_equal(top.pair[1]["y"], y)  # labels are not features
  zero = made["zero_others"]
  assert not np.any(zero.pair[0]["x"]) and not np.any(zero.pair[1]["x"][:3])
  np.testing.assert_array_equal(zero.pair[1]["x"][3], x[3])
  assert made["edge"].pair[1]["y"][3] == 2  # the largest label seen
  assert "target_1e30" not in made  # no float target leaf


def test_generic_removed_and_inserted_rows():
  x = np.arange(12, dtype=np.float64).reshape(6, 2)
  user = np.array([0, 1, 2, 1, 3, 1])
  keep = user != 1  # user 1's three rows, at positions 1, 3 and 5
  big, small = {"x": x, "user": user}, {"x": x[keep], "user": user[keep]}
  made = _by_variant(er.generic_extreme_pairs([(big, small)]))  # D is the larger side
  top = made["f32_max"]
  assert top.extreme_side == 0
  assert np.all(top.pair[0]["x"][[1, 3, 5]] == er.F32_MAX)
  np.testing.assert_array_equal(top.pair[0]["x"][keep], x[keep])
  np.testing.assert_array_equal(top.pair[1]["x"], x[keep])


def test_generic_replace_one_with_targets():
  x = np.array([[0.1, 0.2], [0.3, 0.4], [0.5, -0.6]], np.float32)
  y = np.array([1.0, -2.0, 0.5], np.float32)
  x2, y2 = x.copy(), y.copy()
  x2[1], y2[1] = [-0.3, 0.1], 3.0
  made = _by_variant(er.generic_extreme_pairs([({"x": x, "y": y}, {"x": x2, "y": y2})]))
  top = made["f32_max"].pair
  np.testing.assert_array_equal(top[1]["y"], y2)  # targets untouched by the feature variants
  assert np.all(top[1]["x"][1] == np.float32(er.F32_MAX)) and np.array_equal(top[1]["x"][[0, 2]],
                                                                            x[[0, 2]])
  target = made["target_1e30"].pair
  np.testing.assert_array_equal(target[1]["x"], x2)
  assert target[1]["y"][1] == np.float32(1e30)
  assert made["edge"].pair[1]["y"][1] == 3.0  # largest |target| seen, the record's sign
  sub = made["subnormal"].pair[1]["x"][1]
  assert np.all(sub == np.float32(er.F32_SUBNORMAL)) and np.all(sub > 0)


def test_generic_raw_arrays_and_statistics():
  base = np.array([0.0, 2.0, -3.0, 5.0])
  made = _by_variant(er.generic_extreme_pairs([(base, base + np.array([1.0, 0, 0, 0]))]))
  assert made["f32_max"].pair[1][0] == er.F32_MAX and made["f32_max"].pair[1][1] == 2.0
  np.testing.assert_array_equal(made["zero_others"].pair[0], [0.0, 0.0, 0.0, 0.0])
  logits = np.ones((2, 3), np.float32)
  moved = logits.copy()
  moved[:, 0] += 1  # every row moved: no other record
  names = [p.variant for p in er.generic_extreme_pairs([(logits, moved)])]
  assert "zero_others" not in names and "f32_max" in names


def test_generic_integer_only_data_has_no_generic_pairs():
  votes = np.array([[1, 7, 0]] * 4, np.int32)
  assert er.generic_extreme_pairs([(votes, np.array([[0, 8, 0]] * 4, np.int32))]) == []


def test_specific_pairs_are_used_first():
  pairs = [({"x": np.zeros((1, 2))}, {"x": np.ones((2, 2))})] * 3
  entry = dataclasses.replace(_toy(_sum_of_squares), extreme_pairs=lambda: pairs)
  assert [p.variant for p in er.extreme_pairs_of(entry, fast=True)] == ["specific[0]",
                                                                        "specific[1]"]
  assert len(er.extreme_pairs_of(entry)) == 3
