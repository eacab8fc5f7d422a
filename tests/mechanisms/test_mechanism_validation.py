"""Bad privacy arguments raise ValueError naming the argument, before any noise is drawn."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdp import mechanisms as mech

KEY = jax.random.key(0)
VALUE = jnp.zeros(3)
NAN, INF = math.nan, math.inf

BAD_EPSILON = [0.0, -1.0, INF, NAN, "abc", None]
BAD_SENSITIVITY = [0.0, -1.0, INF, NAN]
BAD_DELTA_GAUSSIAN = [0.0, -0.1, 1.0, 1.5, NAN]

# (callable taking the bad value, argument name expected in the message)
CASES = []
for bad in BAD_EPSILON:
  CASES += [
      (lambda e: mech.laplace_mechanism(KEY, VALUE, 1.0, e), bad, "epsilon"),
      (lambda e: mech.laplace_mechanism_event(1.0, e), bad, "epsilon"),
      (lambda e: mech.gaussian_mechanism(KEY, VALUE, 1.0, e, 1e-5), bad, "epsilon"),
      (lambda e: mech.gaussian_mechanism_event(1.0, e, 1e-5), bad, "epsilon"),
      (lambda e: mech.classic_gaussian_mechanism(KEY, VALUE, 1.0, e, 1e-5), bad, "epsilon"),
      (lambda e: mech.l2_laplace_mechanism(KEY, VALUE, 1.0, e), bad, "epsilon"),
      (lambda e: mech.l2_laplace_mechanism_event(1.0, e), bad, "epsilon"),
      (lambda e: mech.exponential_mechanism_beta(e), bad, "epsilon"),
  ]
for bad in BAD_SENSITIVITY:
  CASES += [
      (lambda s: mech.laplace_mechanism(KEY, VALUE, s, 1.0), bad, "l1_sensitivity"),
      (lambda s: mech.gaussian_mechanism(KEY, VALUE, s, 1.0, 1e-5), bad, "l2_sensitivity"),
      (lambda s: mech.zcdp_gaussian_mechanism(KEY, VALUE, s, 0.5), bad, "l2_sensitivity"),
      (lambda s: mech.l2_laplace_mechanism(KEY, VALUE, s, 1.0), bad, "l2_sensitivity"),
      (lambda s: mech.exponential_mechanism_event(1.0, s), bad, "sensitivity"),
      (lambda s: mech.report_noisy_max_laplace_event(1.0, s), bad, "l1_sensitivity"),
      (lambda s: mech.report_noisy_max_gaussian_event(1.0, s), bad, "l2_sensitivity"),
  ]
for bad in BAD_DELTA_GAUSSIAN:
  CASES += [
      (lambda d: mech.gaussian_mechanism(KEY, VALUE, 1.0, 1.0, d), bad, "delta"),
      (lambda d: mech.gaussian_mechanism_event(1.0, 1.0, d), bad, "delta"),
      (lambda d: mech.classic_gaussian_mechanism(KEY, VALUE, 1.0, 0.5, d), bad, "delta"),
  ]
for bad in [0.0, -0.5, INF, NAN]:
  CASES += [
      (lambda r: mech.zcdp_gaussian_mechanism(KEY, VALUE, 1.0, r), bad, "rho"),
      (lambda r: mech.zcdp_gaussian_mechanism_event(1.0, r), bad, "rho"),
      (lambda b: mech.exponential_mechanism(KEY, VALUE, b), bad, "beta"),
      (lambda b: mech.exponential_mechanism_event(b), bad, "beta"),
      (lambda b: mech.report_noisy_max_laplace(KEY, VALUE, b), bad, "scale"),
      (lambda b: mech.report_noisy_max_gaussian(KEY, VALUE, b), bad, "stddev"),
      (lambda b: mech.report_noisy_max_laplace_event(b), bad, "scale"),
      (lambda b: mech.report_noisy_max_gaussian_event(b), bad, "stddev"),
  ]
for bad in [-1.0, INF, NAN, jnp.array([1.0, -1.0, 1.0])]:
  CASES += [
      (lambda s: mech.laplace_noise(KEY, (3,), s), bad, "scale"),
      (lambda s: mech.gaussian_noise(KEY, (3,), s), bad, "stddev"),
  ]
for bad in [0.0, -1.0, NAN]:
  CASES += [(lambda b: mech.l2_laplace_noise(KEY, (3,), b), bad, "beta")]


@pytest.mark.parametrize("call,bad,name", CASES)
def test_bad_argument_raises_value_error_naming_it(call, bad, name):
  with pytest.raises(ValueError, match=name):
    call(bad)


def test_errors_are_raised_under_vmap_over_keys():
  keys = jax.random.split(KEY, 4)
  for bad in (0.0, -1.0, INF, NAN):
    with pytest.raises(ValueError, match="epsilon"):
      jax.vmap(lambda k: mech.laplace_mechanism(k, VALUE, 1.0, bad))(keys)
    with pytest.raises(ValueError, match="epsilon"):
      jax.jit(jax.vmap(lambda k: mech.gaussian_mechanism(k, VALUE, 1.0, bad, 1e-5)))(keys)
  with pytest.raises(ValueError, match="delta"):
    jax.vmap(lambda k: mech.gaussian_mechanism(k, VALUE, 1.0, 1.0, 0.0))(keys)


def test_traced_privacy_parameters_are_refused():
  with pytest.raises(TypeError, match="epsilon"):
    jax.jit(lambda e: mech.laplace_mechanism(KEY, VALUE, 1.0, e))(1.0)
  with pytest.raises(TypeError, match="l2_sensitivity"):
    jax.vmap(lambda s: mech.gaussian_mechanism(KEY, VALUE, s, 1.0, 1e-5))(jnp.ones(2))


def test_error_message_states_the_allowed_range():
  with pytest.raises(ValueError, match=r"delta must be in \(0, 1\)"):
    mech.gaussian_mechanism(KEY, VALUE, 1.0, 1.0, 0.0)
  with pytest.raises(ValueError, match="> 0"):
    mech.laplace_mechanism(KEY, VALUE, 1.0, -2.0)


# ----------------------------------------------------------- traced bad data
# Under jit the NaN check cannot raise; the output must then be deterministic
# (all-NaN for additive mechanisms, -1 for argmax mechanisms), never the
# position of the bad entry or a partially noised answer.

ADDITIVE = [
    lambda k, x: mech.laplace_mechanism(k, x, 1.0, 1.0),
    lambda k, x: mech.gaussian_mechanism(k, x, 1.0, 1.0, 1e-5),
    lambda k, x: mech.zcdp_gaussian_mechanism(k, x, 1.0, 0.5),
    lambda k, x: mech.l2_laplace_mechanism(k, x, 1.0, 1.0),
]


@pytest.mark.parametrize("release", ADDITIVE)
@pytest.mark.parametrize("bad", [NAN, INF, -INF])
def test_traced_nonfinite_value_gives_an_all_nan_output(release, bad):
  value = jnp.array([0.0, bad, 2.0])
  out = jax.jit(release)(KEY, value)
  assert out.shape == (3,) and bool(jnp.all(jnp.isnan(out)))
  ok = jax.jit(release)(KEY, jnp.array([0.0, 1.0, 2.0]))
  assert bool(jnp.all(jnp.isfinite(ok)))
  # The same, eagerly, is an error naming `value`.
  with pytest.raises(ValueError, match="value contains NaN or inf"):
    release(KEY, value)


@pytest.mark.parametrize("select", [
    lambda k, c: mech.report_noisy_max_laplace(k, c, 1.0),
    lambda k, c: mech.report_noisy_max_gaussian(k, c, 1.0),
    lambda k, c: mech.exponential_mechanism(k, c, 1.0),
    lambda k, c: mech.gumbel_max(k, c),
])
def test_traced_nan_or_plus_inf_rows_give_minus_one(select):
  # Row 0: fine; row 1: NaN in the last (otherwise losing) class; row 2: +inf.
  counts = jnp.array([[50.0, 0.0, 0.0], [50.0, 0.0, NAN], [0.0, INF, 0.0]])
  out = np.asarray(jax.jit(select)(KEY, counts))
  np.testing.assert_array_equal(out, [0, -1, -1])


def test_minus_inf_scores_stay_allowed_eagerly_and_under_jit():
  scores = jnp.array([[-INF, 0.0, -INF]])
  assert int(mech.exponential_mechanism(KEY, scores, 1.0)[0]) == 1
  assert int(jax.jit(lambda k, s: mech.exponential_mechanism(k, s, 1.0))(KEY, scores)[0]) == 1


def test_vmap_over_legacy_and_typed_keys():
  raw = jax.random.split(jax.random.PRNGKey(0), 4)
  typed = jax.random.wrap_key_data(raw)
  f = lambda k: mech.laplace_mechanism(k, VALUE, 1.0, 1.0)
  np.testing.assert_array_equal(np.asarray(jax.vmap(f)(raw)), np.asarray(jax.vmap(f)(typed)))
  with pytest.raises(TypeError, match="key must be a jax.random key"):
    jax.vmap(f)(jnp.zeros((4, 2), jnp.float32))
