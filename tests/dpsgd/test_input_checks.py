"""Bad inputs to every DP-SGD entry point: a named error, from jaxdp, before any spend.

For each bad input of ``train_dpsgd``, ``make_private`` (``gather``/``step``),
``clipped_grad`` and the padded chunks, the tests check the error type, that
the message names the argument, that the error is raised from jaxdp (not from
inside jax/numpy/optax/flax) and that no budget was spent (the ledger is
unchanged by the failing call). Plus: a refused gather/step keeps its paid
batch usable, and one run reports one epsilon with its method.
"""

import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jaxdp.accounting import PrivacyAccountant
from jaxdp.dpsgd import (clipped_grad, make_per_example_loss, make_private, sampling,
                                  train_dpsgd)

N, D, C = 32, 4, 3
RNG = np.random.default_rng(0)
X = RNG.normal(size=(N, D)).astype(np.float32)
Y = RNG.integers(0, C, size=N).astype(np.int32)


class Net(nn.Module):

  @nn.compact
  def __call__(self, x):
    return nn.Dense(C)(x)


class BNNet(nn.Module):

  @nn.compact
  def __call__(self, x):
    return nn.Dense(C)(nn.BatchNorm(use_running_average=False)(nn.Dense(4)(x)))


class NnxBN(nnx.Module):

  def __init__(self, rngs):
    self.lin = nnx.Linear(D, 4, rngs=rngs)
    self.bn = nnx.BatchNorm(4, rngs=rngs)
    self.out = nnx.Linear(4, C, rngs=rngs)

  def __call__(self, x):
    return self.out(self.bn(self.lin(x)))


MODEL = Net()
PARAMS = MODEL.init(jax.random.key(0), X[:1])["params"]
LOSS = make_per_example_loss(lambda p, xb: MODEL.apply({"params": p}, xb))


def _from_jaxdp(excinfo):
  """The exception was raised by jaxdp code, not from inside jax/numpy/optax/flax."""
  path = str(excinfo.traceback[-1].path)
  assert "/jaxdp/" in path and "site-packages" not in path, path


def _ledger(acc):
  return [(repr(e), c) for e, c in acc.ledger]


def _nan_rows(x):
  x = x.copy()
  x[:] = np.nan
  return x


def _with_inf(x):
  x = x.copy()
  x[3, 1] = np.inf
  return x


# --- train_dpsgd -------------------------------------------------------------------------------

TRAIN_CASES = [
    ("all_nan_x", dict(x=_nan_rows(X)), ValueError, r"\bx\b.*NaN or inf"),
    ("inf_in_x", dict(x=_with_inf(X)), ValueError, r"\bx\b.*NaN or inf"),
    ("labels_too_large", dict(y=Y + 10), ValueError, r"\by\b.*outside \[0, 3\)"),
    ("negative_label", dict(y=np.where(np.arange(N) == 5, -1, Y)), ValueError,
     r"\by\b.*outside \[0, 3\)"),
    ("len_y_differs", dict(y=Y[:-1]), ValueError, r"x and y.*same number of rows"),
    ("float_labels", dict(y=Y.astype(np.float32)), TypeError, r"\by\b.*integer class labels"),
    ("complex_x", dict(x=X.astype(np.complex64)), TypeError, r"\bx\b.*complex"),
    ("string_x", dict(x=np.array([["a"] * D] * N)), TypeError, r"\bx\b.*numeric"),
    ("wrong_feature_count", dict(x=np.ones((N, D + 1), np.float32), params=PARAMS), ValueError,
     r"one example of x.*features"),
    ("batchnorm_linen", dict(model=BNNet()), ValueError, r"model.*BatchNorm.*GroupNorm"),
    ("batchnorm_nnx", dict(model="nnx_bn"), ValueError, r"model.*BatchNorm.*GroupNorm"),
    ("accountant_string", dict(accountant="acc"), TypeError, r"accountant"),
    ("accountant_method", dict(accountant_method="moments"), ValueError, r"accountant_method"),
]


@pytest.mark.parametrize("bad, exc, match", [c[1:] for c in TRAIN_CASES],
                         ids=[c[0] for c in TRAIN_CASES])
def test_train_dpsgd_refuses_bad_input_before_anything(bad, exc, match):
  acc = PrivacyAccountant()
  kw = dict(model=MODEL, x=X, y=Y, key=jax.random.key(1), epochs=1.0, l2_clip_norm=1.0,
            delta=1e-5, expected_batch_size=8, noise_multiplier=1.0, accountant=acc)
  if bad.get("model") == "nnx_bn":
    bad = dict(model=NnxBN(nnx.Rngs(0)))
  kw.update(bad)
  with pytest.raises(exc, match=re.compile(match, re.S)) as excinfo:
    train_dpsgd(**kw)
  _from_jaxdp(excinfo)
  assert len(acc.ledger) == 0  # nothing spent


# --- make_private: gather and step -------------------------------------------------------------

def _plan(loss=LOSS, **kw):
  args = dict(l2_clip_norm=1.0, num_examples=N, expected_batch_size=8, noise_multiplier=1.0,
              delta=1e-5, steps=3, key=jax.random.key(2), optimizer=optax.sgd(0.1))
  args.update(kw)
  return make_private(loss, **args)


def _bn_linen_loss():
  m = BNNet()
  v = m.init(jax.random.key(0), X[:1])
  loss = make_per_example_loss(lambda p, xb: m.apply(
      {"params": p, "batch_stats": v["batch_stats"]}, xb, mutable=["batch_stats"])[0])
  return loss, v["params"]


def _bn_nnx_loss():
  g, p, rest = nnx.split(NnxBN(nnx.Rngs(0)), nnx.Param, ...)
  return make_per_example_loss(lambda q, xb: nnx.merge(g, q, rest)(xb)), p


PARAMS_5 = MODEL.init(jax.random.key(0), np.ones((1, D + 1), np.float32))["params"]

PLAN_CASES = [
    # (id, gather arrays, loss/params factory, exception, message)
    ("nan_x", (_nan_rows(X), Y), None, ValueError, r"gather argument 0.*NaN or inf"),
    ("rows_differ", (X[:-1], Y[:-1]), None, ValueError, r"gather argument 0 has 31 rows"),
    ("one_array", (X,), None, ValueError, r"gather needs 2 arrays"),
    ("complex_x", (X.astype(np.complex64), Y), None, TypeError, r"gather argument 0.*complex"),
    ("float_labels", (X, Y.astype(np.float32)), None, TypeError,
     r"gather argument 1 \(labels\).*integer"),
    ("labels_out_of_range", (X, Y + 10), None, ValueError,
     r"gather argument 1 \(labels\).*outside \[0, 3\)"),
    ("wrong_feature_count", (np.ones((N, D + 1), np.float32), Y), None, ValueError,
     r"per_example_loss.*gather argument 0.*features"),
    ("batchnorm_linen", (X, Y), _bn_linen_loss, ValueError, r"BatchNorm.*GroupNorm"),
    ("batchnorm_nnx", (X, Y), _bn_nnx_loss, ValueError, r"BatchNorm.*GroupNorm"),
]


@pytest.mark.parametrize("arrays, factory, exc, match", [c[1:] for c in PLAN_CASES],
                         ids=[c[0] for c in PLAN_CASES])
def test_make_private_refuses_bad_batch_and_keeps_the_paid_batch(arrays, factory, exc, match):
  loss, params = factory() if factory is not None else (LOSS, PARAMS)
  private = _plan(loss)
  acc = PrivacyAccountant()
  sampler = private.sampler(acc)
  state = private.init(params)
  ticket = sampler.sample()  # pays step 0
  before = _ledger(acc)
  with pytest.raises(exc, match=re.compile(match, re.S)) as excinfo:
    private.step(params, state, ticket.gather(*arrays))
  _from_jaxdp(excinfo)
  assert "Nothing was spent by this call" in str(excinfo.value)
  assert _ledger(acc) == before and sampler.steps_paid == 1 and int(state.step) == 0
  assert sampler.sample() is ticket  # the same paid batch is handed out again, not paid again
  assert _ledger(acc) == before
  # check_inputs finds the same problem on the whole dataset, before anything is paid.
  if len(arrays) == 2:
    fresh = PrivacyAccountant()
    with pytest.raises(exc, match=re.compile(match.split(".*")[-1], re.S)) as excinfo:
      private.check_inputs(params, *arrays)
    _from_jaxdp(excinfo)
    assert len(fresh.ledger) == 0


@pytest.mark.parametrize("case", ["raw_batch", "wrong_state", "other_plan"])
def test_private_sgd_step_refuses_wrong_pieces_without_spending(case):
  private = _plan()
  acc = PrivacyAccountant()
  sampler = private.sampler(acc)
  ticket = sampler.sample()
  batch, state = ticket.gather(X, Y), private.init(PARAMS)
  if case == "raw_batch":
    batch, exc, match = (X, Y), TypeError, "PrivateBatch"
  elif case == "wrong_state":
    state, exc, match = PARAMS, TypeError, "state must be the PrivateState"
  else:
    other = _plan(key=jax.random.key(9))
    batch = other.sampler(PrivacyAccountant()).sample().gather(X, Y)
    exc, match = ValueError, "another plan"
  before = _ledger(acc)
  with pytest.raises(exc, match=match) as excinfo:
    private.step(PARAMS, state, batch)
  _from_jaxdp(excinfo)
  assert _ledger(acc) == before and sampler.steps_paid == 1
  if case == "wrong_state":
    assert sampler.sample() is ticket  # kept for the corrected call


def test_failed_gather_then_correct_one_trains_normally():
  private = _plan()
  acc = PrivacyAccountant()
  sampler = private.sampler(acc)
  params, state = PARAMS, private.init(PARAMS)
  x_wrong = X[:, :2]
  for t in range(3):
    if t == 1:  # the user's loop: a wrong gather, then the loop goes on with sample() again
      with pytest.raises(ValueError, match="per_example_loss") as excinfo:
        private.step(params, state, sampler.sample().gather(x_wrong, Y))
      _from_jaxdp(excinfo)
      with pytest.raises(ValueError, match="outside"):
        private.step(params, state, sampler.sample().gather(X, (Y + 10)))
    params, state, info = private.step(params, state, sampler.sample().gather(X, Y))
    assert np.isfinite(float(info.nonprivate_loss_sum))
  # Exactly one paid step per applied update, and nothing left over.
  assert int(state.step) == 3 == sampler.steps_paid == sampler.steps_sampled
  assert acc.ledger[0][1] == 3 and len(acc.ledger) == 1
  assert all(np.all(np.isfinite(leaf)) for leaf in jax.tree.leaves(params))


# --- clipped_grad and padded chunks ------------------------------------------------------------

def _xy_loss(w, x, y):
  return optax.softmax_cross_entropy_with_integer_labels(x @ w, y)


W = jnp.zeros((D, C))


def test_clipped_grad_default_batch_argnums_names_the_fix():
  f = clipped_grad(_xy_loss, l2_clip_norm=1.0, method="vmap")  # default batch_argnums=1
  with pytest.raises(ValueError, match=re.escape("batch_argnums=(1, 2)")) as excinfo:
    f(W, X[:16], Y[:16])
  _from_jaxdp(excinfo)
  # Jitted: one compilation instead of one per primitive run op by op.
  g, info = jax.jit(clipped_grad(_xy_loss, l2_clip_norm=1.0, batch_argnums=(1, 2),
                                 method="vmap"))(W, X[:16], Y[:16])
  assert float(info.num_examples) == 16 and g.shape == W.shape


@pytest.mark.parametrize("case", ["wrong_features", "non_scalar", "batchnorm"])
def test_clipped_grad_refuses_a_loss_that_cannot_work_on_one_example(case):
  if case == "wrong_features":
    f, args, match = clipped_grad(_xy_loss, l2_clip_norm=1.0, batch_argnums=(1, 2)), (
        W, np.ones((8, D + 1), np.float32), Y[:8]), r"loss_fn.*argument 1"
  elif case == "non_scalar":
    f, args, match = clipped_grad(lambda w, x: x @ w, l2_clip_norm=1.0), (W, X[:8]), "scalar"
  else:
    loss, params = _bn_linen_loss()
    f, args, match = clipped_grad(loss, l2_clip_norm=1.0, batch_argnums=(1, 2)), (
        params, X[:8], Y[:8]), r"BatchNorm.*GroupNorm"
  with pytest.raises(ValueError, match=re.compile(match, re.S)) as excinfo:
    f(*args)
  _from_jaxdp(excinfo)


def test_padded_chunk_cannot_be_used_without_its_mask():
  (chunk,) = sampling.pad_and_split(np.arange(16, dtype=np.int32), 49)
  assert chunk.num_examples == 16 and chunk.padded_indices.shape == (49,)
  for use in (lambda: X[chunk.padded_indices], lambda: np.asarray(chunk.padded_indices),
              lambda: chunk.padded_indices[np.ones(49, bool)]):
    with pytest.raises(TypeError, match="padd") as excinfo:
      use()
    _from_jaxdp(excinfo)
  x = np.tile(X, (2, 1))
  y = np.tile(Y, 2)
  f = clipped_grad(_xy_loss, l2_clip_norm=1.0, batch_argnums=(1, 2), method="vmap")
  # The mask travels with the batch (also through jit): 16 examples, not 49.
  _, info = jax.jit(f)(W, chunk.gather(x, y))
  assert float(info.num_examples) == 16
  np.testing.assert_array_equal(chunk.indices, np.arange(16))
  slots, mask = chunk.slots_and_mask()
  assert slots.shape == mask.shape == (49,) and mask.sum() == 16


# --- one epsilon per run -----------------------------------------------------------------------

@pytest.mark.slow
def test_one_epsilon_per_run_with_its_method():
  # make_private: calibration, sampler.epsilon(), the guarantee and the ledger agree.
  private = _plan(noise_multiplier=None, target_epsilon=2.0, steps=20)
  acc = PrivacyAccountant()
  sampler = private.sampler(acc)
  sampler.pay(20)
  g = sampler.guarantee()
  assert g.method == private.accountant_method == "rdp" and "rdp" in str(g)
  assert g.epsilon <= 2.0  # calibrated under the method it names
  assert acc.get_epsilon(1e-5, g.method) == pytest.approx(g.epsilon, rel=1e-9)
  assert acc.get_epsilon(1e-5) <= g.epsilon  # "auto": the minimum of sound bounds
  # train_dpsgd: the result names its method, and the ledger gives the same number by it.
  res = train_dpsgd(MODEL, X, Y, key=jax.random.key(3), epochs=0.5, l2_clip_norm=1.0,
                    delta=1e-5, expected_batch_size=8, noise_multiplier=1.0)
  assert res.guarantee.method == res.accountant_method == "rdp"
  assert res.guarantee.epsilon == res.epsilon and "rdp" in str(res.guarantee)
  assert res.accountant.get_epsilon(1e-5, res.accountant_method) == pytest.approx(
      res.epsilon, rel=1e-9)
  assert all(rec["accountant_method"] == "rdp" for rec in res.history)
  # PLD: the same agreement, with the method named.
  pld = _plan(accountant_method="pld", steps=2)
  acc_pld = PrivacyAccountant()
  s = pld.sampler(acc_pld)
  s.pay(2)
  g_pld = s.guarantee()
  assert g_pld.method == "pld" and "pld" in str(g_pld)
  assert acc_pld.get_epsilon(1e-5, "pld") == pytest.approx(g_pld.epsilon, rel=1e-6)
