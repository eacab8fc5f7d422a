"""Tests of the shared argument checks."""

import math

import numpy as np
import pytest

from jaxdp import _validation as v


@pytest.mark.parametrize("value,match", [(0.0, "> 0"), (-1.0, "> 0"), (math.inf, "finite"),
                                         (math.nan, "NaN"), ("x", "real number")])
def test_epsilon(value, match):
  with pytest.raises(ValueError, match=match):
    v.check_epsilon(value)


def test_epsilon_inf_allowed_where_asked():
  assert v.check_epsilon(math.inf, allow_inf=True) == math.inf


@pytest.mark.parametrize("value", [-0.1, 1.0, 1.5, math.nan])
def test_delta(value):
  with pytest.raises(ValueError, match="delta"):
    v.check_delta(value)
  assert v.check_delta(0.0) == 0.0
  with pytest.raises(ValueError, match=r"\(0, 1\)"):
    v.check_delta(0.0, allow_zero=False)


@pytest.mark.parametrize("value", [0.0, -0.1, 1.01, math.nan])
def test_sample_rate(value):
  with pytest.raises(ValueError, match="sample_rate"):
    v.check_sample_rate(value)
  assert v.check_sample_rate(1.0) == 1.0


def test_sensitivity_and_arrays():
  with pytest.raises(ValueError, match="sensitivity"):
    v.check_sensitivity(-1)
  with pytest.raises(ValueError, match="NaN"):
    v.check_finite_array(np.array([1.0, np.nan]), "x")
  with pytest.raises(ValueError, match="normalize_rows"):
    v.check_unit_ball(np.array([[1.0, 1.0]]))
  v.check_unit_ball(np.array([[0.6, 0.8], [0.0, 0.0]]))
  with pytest.raises(ValueError, match="integer"):
    v.check_positive_int(1.5, "k")


@pytest.mark.parametrize("value", [math.inf, math.nan, None, "3", 0, -2, 2.5, True])
def test_positive_int_rejects_with_a_named_value_error(value):
  with pytest.raises(ValueError, match="k must be an integer >= 1"):
    v.check_positive_int(value, "k")
  assert v.check_positive_int(np.int64(3), "k") == 3


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_unit_ball_check_names_nan_and_inf(bad, dtype):
  """The row norms double as the NaN/inf scan: a bad entry still gets the NaN/inf error
  (not a unit-ball one), and a finite row whose squares overflow gets the unit-ball error."""
  x = np.zeros((5, 3), dtype)
  x[3, 1] = bad
  with pytest.raises(ValueError, match="x contains NaN or inf"):
    v.check_unit_ball(x, "x")
  with np.errstate(over="ignore"):
    with pytest.raises(ValueError, match="unit L2 ball.*row 0 does not"):
      v.check_unit_ball(np.array([[1e200, 0.0]]), "x")


def test_unit_ball_pulls_rounding_overshoot_strictly_inside():
  x = np.array([[0.6, 0.8000003], [0.3, 0.4]], dtype=np.float32)  # norm 1 + 2.4e-7
  assert np.linalg.norm(x[0].astype(np.float64)) > 1.0
  out = v.check_unit_ball(x)
  assert out.dtype == np.float32
  assert np.all(np.linalg.norm(out.astype(np.float64), axis=1) <= 1.0)
  np.testing.assert_array_equal(out[1], x[1])  # rows inside the ball are untouched
  np.testing.assert_allclose(out[0], x[0], rtol=1e-6)


# --------------------------------------------------------------------------
# Library-wide table: public functions x bad inputs -> an error of the right
# type whose message names the argument (issue "86 bad inputs tried").
# --------------------------------------------------------------------------

import functools  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from jaxdp import mechanisms as mech  # noqa: E402
from jaxdp.accounting import accountant as acc  # noqa: E402
from jaxdp.accounting import analytic_gaussian as ag  # noqa: E402
from jaxdp.accounting import composition  # noqa: E402
from jaxdp.accounting import dpsgd_accounting as dpsgd_acc  # noqa: E402
from jaxdp.accounting import zcdp  # noqa: E402
from jaxdp.audit import core as audit_core  # noqa: E402
from jaxdp.errors import ArgumentTypeError  # noqa: E402
from jaxdp.prediction import pate  # noqa: E402
from jaxdp.prediction import prediction_sensitivity  # noqa: E402
from jaxdp.prediction import subsample_aggregate  # noqa: E402
from jaxdp.training import functional_mechanism  # noqa: E402
from jaxdp.training import objective_perturbation  # noqa: E402
from jaxdp.training import output_perturbation  # noqa: E402
from jaxdp.dpsgd import sampling  # noqa: E402
from jaxdp.dpsgd import transforms  # noqa: E402

_KEY = jax.random.key(0)


def _names(arg):
  """The message must name the argument as its subject ("epsilon must be ...").

  A bare mention is not enough: JAX's own errors for ``key=0`` say "PRNG key
  data" without naming the argument.
  """
  return rf"(^|\W){arg} (must|contains|is)\b"
_VALUE = jnp.zeros(3)
_COUNTS = jnp.array([[3.0, 1.0, 0.0]])
_X = np.full((4, 2), 0.5, np.float32)
_Y = np.array([0, 1, 0, 1])

# Wrong types where a real number is expected: TypeError (ArgumentTypeError).
# Before, True and "1.0" were silently read as 1.0.
_NOT_A_NUMBER = [
    pytest.param(True, id="True"),
    pytest.param(np.bool_(False), id="np.False_"),
    pytest.param("1.0", id="str"),
    pytest.param(None, id="None"),
    pytest.param(1.0 + 0.0j, id="complex"),
]

# One call per (function, numeric argument): f(bad) must raise naming the argument.
_NUMERIC_ARGS = [
    ("laplace_mechanism", "epsilon", lambda b: mech.laplace_mechanism(_KEY, _VALUE, 1.0, b)),
    ("laplace_mechanism", "l1_sensitivity", lambda b: mech.laplace_mechanism(_KEY, _VALUE, b, 1.0)),
    ("laplace_mechanism_event", "epsilon", lambda b: mech.laplace_mechanism_event(1.0, b)),
    ("gaussian_mechanism", "epsilon", lambda b: mech.gaussian_mechanism(_KEY, _VALUE, 1.0, b, 1e-5)),
    ("gaussian_mechanism", "delta", lambda b: mech.gaussian_mechanism(_KEY, _VALUE, 1.0, 1.0, b)),
    ("gaussian_mechanism", "l2_sensitivity",
     lambda b: mech.gaussian_mechanism(_KEY, _VALUE, b, 1.0, 1e-5)),
    ("zcdp_gaussian_mechanism", "rho", lambda b: mech.zcdp_gaussian_mechanism(_KEY, _VALUE, 1.0, b)),
    ("l2_laplace_mechanism", "epsilon", lambda b: mech.l2_laplace_mechanism(_KEY, _VALUE, 1.0, b)),
    ("exponential_mechanism_beta", "epsilon", lambda b: mech.exponential_mechanism_beta(b)),
    ("exponential_mechanism_event", "beta", lambda b: mech.exponential_mechanism_event(b)),
    ("laplace_noise", "scale", lambda b: mech.laplace_noise(_KEY, (3,), b)),
    ("gaussian_noise", "stddev", lambda b: mech.gaussian_noise(_KEY, (3,), b)),
    ("l2_laplace_noise", "beta", lambda b: mech.l2_laplace_noise(_KEY, (3,), b)),
    ("exponential_mechanism", "beta", lambda b: mech.exponential_mechanism(_KEY, _COUNTS, b)),
    ("report_noisy_max_laplace", "scale", lambda b: mech.report_noisy_max_laplace(_KEY, _COUNTS, b)),
    ("report_noisy_max_gaussian", "stddev",
     lambda b: mech.report_noisy_max_gaussian(_KEY, _COUNTS, b)),
    ("analytic_gaussian_sigma", "epsilon", lambda b: ag.analytic_gaussian_sigma(b, 1e-5)),
    ("analytic_gaussian_sigma", "delta", lambda b: ag.analytic_gaussian_sigma(1.0, b)),
    ("pure_dp_to_zcdp", "epsilon", lambda b: zcdp.pure_dp_to_zcdp(b)),
    ("zcdp_to_approx_dp", "delta", lambda b: zcdp.zcdp_to_approx_dp(0.1, b)),
    ("advanced_composition", "epsilon", lambda b: composition.advanced_composition(b, 0.0, 10, 1e-6)),
    ("dpsgd_epsilon", "sample_rate", lambda b: dpsgd_acc.dpsgd_epsilon(1.0, b, 10, 1e-5)),
    ("dpsgd_epsilon", "delta", lambda b: dpsgd_acc.dpsgd_epsilon(1.0, 0.01, 10, b)),
    ("poisson_sample_indices", "sample_rate",
     lambda b: sampling.poisson_sample_indices(_KEY, 10, b)),
    ("PrivacyBudget", "epsilon", lambda b: acc.PrivacyBudget(b, 1e-5)),
    ("check_positive_int", "k", lambda b: check_positive_int_k(b)),
]


def check_positive_int_k(b):
  return v.check_positive_int(b, "k")


@pytest.mark.parametrize("bad", _NOT_A_NUMBER)
@pytest.mark.parametrize("fn_name,arg,call", _NUMERIC_ARGS, ids=lambda x: x if isinstance(x, str) else "")
def test_wrong_type_for_a_number_raises_type_error_naming_it(fn_name, arg, call, bad):
  del fn_name
  with pytest.raises(TypeError, match=_names(arg)):
    call(bad)


# Every public function that takes a key; one policy (jaxdp._validation.check_key).
_KEY_ARGS = [
    ("laplace_mechanism", lambda k: mech.laplace_mechanism(k, _VALUE, 1.0, 1.0)),
    ("gaussian_mechanism", lambda k: mech.gaussian_mechanism(k, _VALUE, 1.0, 1.0, 1e-5)),
    ("classic_gaussian_mechanism", lambda k: mech.classic_gaussian_mechanism(k, _VALUE, 1.0, 0.5, 1e-5)),
    ("zcdp_gaussian_mechanism", lambda k: mech.zcdp_gaussian_mechanism(k, _VALUE, 1.0, 0.5)),
    ("l2_laplace_mechanism", lambda k: mech.l2_laplace_mechanism(k, _VALUE, 1.0, 1.0)),
    ("laplace_noise", lambda k: mech.laplace_noise(k, (3,), 1.0)),
    ("gaussian_noise", lambda k: mech.gaussian_noise(k, (3,), 1.0)),
    ("l2_laplace_noise", lambda k: mech.l2_laplace_noise(k, (3,), 1.0)),
    ("l2_laplace_radius", lambda k: mech.l2_laplace_radius(k, (3,), 1.0)),
    ("uniform_direction", lambda k: mech.uniform_direction(k, (3,))),
    ("exponential_mechanism", lambda k: mech.exponential_mechanism(k, _COUNTS, 1.0)),
    ("gumbel_max", lambda k: mech.gumbel_max(k, _COUNTS)),
    ("report_noisy_max_laplace", lambda k: mech.report_noisy_max_laplace(k, _COUNTS, 1.0)),
    ("report_noisy_max_gaussian", lambda k: mech.report_noisy_max_gaussian(k, _COUNTS, 1.0)),
    ("poisson_sample_indices", lambda k: sampling.poisson_sample_indices(k, 10, 0.5)),
    ("noisy_aggregate", lambda k: transforms.noisy_aggregate(1.0, 1.0, 4.0, k)),
    ("noisy_logits", lambda k: prediction_sensitivity.noisy_logits(k, _COUNTS, "gaussian", 1.0)),
    ("noisy_max_labels", lambda k: pate.noisy_max_labels(k, _COUNTS, "gnmax", 1.0)),
    ("partition_indices", lambda k: subsample_aggregate.partition_indices(10, 2, k)),
    ("output_perturbation", lambda k: output_perturbation.output_perturbation(
        k, _X, _Y, l2_reg=1.0, loss="logistic", epsilon=1.0)),
    ("objective_perturbation", lambda k: objective_perturbation.objective_perturbation(
        k, _X, _Y, epsilon=1.0, l2_reg=1.0)),
    ("functional_mechanism", lambda k: functional_mechanism.functional_mechanism(
        k, _X, _Y.astype(np.float32), epsilon=1.0)),
    ("run_trials", lambda k: audit_core.run_trials(
        lambda keys, data: jnp.zeros(keys.shape[0]), None, key=k, num_trials=2, batch_size=2)),
]

_BAD_KEYS = [
    pytest.param(0, TypeError, id="int-seed"),
    pytest.param(None, TypeError, id="None"),
    pytest.param(1.5, TypeError, id="float"),
    pytest.param(np.zeros(2, np.float32), TypeError, id="float-array"),
    pytest.param(np.zeros(2, np.int32), TypeError, id="int32-array"),
    pytest.param(np.zeros(3, np.uint32), ValueError, id="uint32-wrong-shape"),
]


@pytest.mark.parametrize("bad,err", _BAD_KEYS)
@pytest.mark.parametrize("fn_name,call", _KEY_ARGS, ids=lambda x: x if isinstance(x, str) else "")
def test_bad_key_raises_naming_key(fn_name, call, bad, err):
  if fn_name == "partition_indices" and bad is None:
    pytest.skip("key=None means 'no shuffle' for partition_indices")
  with pytest.raises(err, match=_names("key")):
    call(bad)


@pytest.mark.parametrize("fn_name,call", _KEY_ARGS[:15], ids=lambda x: x if isinstance(x, str) else "")
def test_legacy_and_typed_keys_are_both_accepted_and_agree(fn_name, call):
  del fn_name
  legacy = jax.random.PRNGKey(3)
  typed = jax.random.wrap_key_data(legacy)
  np.testing.assert_array_equal(np.asarray(call(legacy)), np.asarray(call(typed)))


@pytest.mark.parametrize("call", [
    lambda k: mech.laplace_mechanism(k, _VALUE, 1.0, 1.0),
    lambda k: mech.report_noisy_max_laplace(k, _COUNTS, 1.0),
    lambda k: sampling.poisson_sample_indices(k, 10, 0.5),
])
def test_a_batch_of_keys_is_refused_where_one_key_is_expected(call):
  with pytest.raises(ValueError, match=r"key must be a single jax.random key.*vmap"):
    call(jax.random.split(_KEY, 2))


_NONFINITE = [
    pytest.param(np.array([0.0, np.nan, 1.0]), id="nan"),
    pytest.param(np.array([np.inf, 0.0, 1.0]), id="inf"),
    pytest.param([0.0, -np.inf, 1.0], id="list-minus-inf"),
]
_DATA_ARGS = [
    ("laplace_mechanism", "value", lambda x: mech.laplace_mechanism(_KEY, x, 1.0, 1.0)),
    ("gaussian_mechanism", "value", lambda x: mech.gaussian_mechanism(_KEY, x, 1.0, 1.0, 1e-5)),
    ("zcdp_gaussian_mechanism", "value", lambda x: mech.zcdp_gaussian_mechanism(_KEY, x, 1.0, 0.5)),
    ("l2_laplace_mechanism", "value", lambda x: mech.l2_laplace_mechanism(_KEY, x, 1.0, 1.0)),
    ("report_noisy_max_laplace", "counts", lambda x: mech.report_noisy_max_laplace(_KEY, x, 1.0)),
    ("report_noisy_max_gaussian", "counts", lambda x: mech.report_noisy_max_gaussian(_KEY, x, 1.0)),
]


@pytest.mark.parametrize("bad", _NONFINITE)
@pytest.mark.parametrize("fn_name,arg,call", _DATA_ARGS, ids=lambda x: x if isinstance(x, str) else "")
def test_nonfinite_data_raises_value_error_naming_it(fn_name, arg, call, bad):
  del fn_name
  with pytest.raises(ValueError, match=rf"\b{arg}\b contains NaN or inf"):
    call(bad)


@pytest.mark.parametrize("bad", [
    pytest.param(np.array(["a", "b"]), id="str-array"),
    pytest.param(np.array([1.0 + 1.0j]), id="complex"),
    pytest.param(None, id="None"),
])
@pytest.mark.parametrize("fn_name,arg,call", _DATA_ARGS, ids=lambda x: x if isinstance(x, str) else "")
def test_non_numeric_data_raises_type_error_naming_it(fn_name, arg, call, bad):
  del fn_name
  with pytest.raises(TypeError, match=_names(arg)):
    call(bad)


@pytest.mark.parametrize("bad", [np.array([np.nan, 1.0]), np.array([np.inf, 1.0])])
@pytest.mark.parametrize("call", [
    lambda s: mech.exponential_mechanism(_KEY, s, 1.0),
    lambda s: mech.exponential_mechanism_probs(s, 1.0),
])
def test_nan_or_plus_inf_scores_raise_naming_scores(call, bad):
  with pytest.raises(ValueError, match=r"\bscores\b contains NaN or \+inf"):
    call(bad)


@pytest.mark.parametrize("bad,err", [(1.5, TypeError), ("3", TypeError), (True, TypeError),
                                     ((2, 1.0), TypeError), ((-1,), ValueError)])
@pytest.mark.parametrize("sampler", [mech.laplace_noise, mech.gaussian_noise, mech.l2_laplace_noise])
def test_bad_shape_raises_naming_shape(sampler, bad, err):
  with pytest.raises(err, match=_names("shape")):
    sampler(_KEY, bad, 1.0)


@pytest.mark.parametrize("bad", [jnp.int32, np.int64, jnp.complex64, None, "not-a-dtype"])
@pytest.mark.parametrize("sampler", [mech.laplace_noise, mech.gaussian_noise, mech.l2_laplace_noise])
def test_non_float_noise_dtype_raises_naming_dtype(sampler, bad):
  with pytest.raises(TypeError, match=_names("dtype")):
    sampler(_KEY, (3,), 1.0, dtype=bad)


def test_argument_type_error_is_also_a_value_error():
  # Callers that caught ValueError for a bad argument keep working.
  with pytest.raises(ValueError):
    v.check_epsilon("1.0")
  assert issubclass(ArgumentTypeError, TypeError) and issubclass(ArgumentTypeError, ValueError)


def test_concrete_real_scalars_of_every_kind_are_accepted():
  for eps in (1, 1.0, np.float32(1.0), np.int64(1), np.array(1.0), jnp.float32(1.0)):
    assert v.check_epsilon(eps) == 1.0
  with pytest.raises(ValueError, match="epsilon must be a scalar"):
    v.check_epsilon(np.array([1.0]))


def test_key_check_runs_on_traced_keys_under_jit_and_vmap():
  keys = jax.random.split(_KEY, 3)
  jax.vmap(functools.partial(v.check_key, allow_batch=False))(keys)
  jax.jit(v.check_key)(jax.random.PRNGKey(0))
  assert v.check_key(keys, allow_batch=True) is keys
  with pytest.raises(TypeError, match="key"):
    jax.jit(v.check_key)(jnp.zeros(2, jnp.float32))


def test_refusals_name_the_rule_and_row_not_the_private_value():
  """Issue 26 item 7: the unit-ball refusal printed the largest row norm (a private value) and
  the NaN refusals the number of bad entries. Now: the rule and the row / index only."""
  x = np.zeros((6, 2))
  x[4] = [3.1415926535, 7.3141592653]
  with pytest.raises(ValueError, match=r"unit L2 ball.*row 4 does not") as err:
    v.check_unit_ball(x, "x_num")
  norm = float(np.linalg.norm(x[4]))
  for text in (f"{norm:.6g}", f"{norm:.3g}", "7.31", "3.14", f"{norm:.2f}"):
    assert text not in str(err.value)
  y = np.zeros((6, 2))
  y[5, 1] = np.nan
  with pytest.raises(ValueError, match=r"NaN or inf values \(the first at index \(5, 1\)\)"):
    v.check_finite_array(y, "y")
  with pytest.raises(ValueError, match=r"the first at index \(5, 1\)") as err:
    v.check_finite_if_concrete(y, "y")
  assert "1 of 12" not in str(err.value)
