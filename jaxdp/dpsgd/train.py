"""DP-SGD training loop for Flax (linen or nnx) classifiers.

Algorithm (survey ``004_dp_machine_learning_survey.md`` Section 4.2 Algorithm 1;
paper ``000_tradeoffs_of_private_prediction.md`` Section 3.1 Equation 4), for
T = ceil(epochs / q) steps:

1. Poisson-sample a batch B_t (each example w.p. q) -- :mod:`.sampling`;
2. sum the per-example gradients clipped to ``l2_clip_norm`` -- :mod:`.clipping`
   (in static-size chunks: a large logical batch is accumulated chunk by chunk,
   which is both gradient accumulation and the honest overflow handling);
3. add ``N(0, (sigma * S)^2 I)`` to the sum once, divide by ``q N`` and apply any
   optax optimiser -- :mod:`.transforms`;

The noise multiplier sigma is either given or calibrated to a target
(epsilon, delta) with :func:`jaxdp.accounting.dpsgd_accounting.calibrate_noise_multiplier`
for exactly (q, T); the spent epsilon is reported by the same accountant.
The accounting is in float64 (dp_accounting), never in JAX.

Reservation: the PLANNED event ``dpsgd_event(sigma, q, T)`` (T-fold
composition of the Poisson-subsampled Gaussian) is spent on the accountant
BEFORE the first step and never refunded. Everything released during training
(evaluations, checkpoints, the parameters of a run killed half-way) is covered
by it, a run that crashes or is killed has already paid, and two runs sharing
one ``PrivacyBudget`` cannot both pass its check (``spend`` is atomic: the
second reservation raises ``BudgetExceededError`` before any training).
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxdp import _validation
from jaxdp.accounting import dpsgd_accounting as dpsgd_accounting
from jaxdp.accounting import events
from jaxdp.errors import BudgetExceededError
from jaxdp.dpsgd import _inputs, checkpointing, clipping, sampling, transforms
from jaxdp.dpsgd import keys as keys_lib

PyTree = Any


@dataclasses.dataclass
class DPSGDResult:
  """Outcome of :func:`train_dpsgd`.

  Attributes:
    params: trained parameters (for nnx models, also written back into the module).
    noise_multiplier: sigma used (noise std on the clipped sum = sigma * sensitivity).
    epsilon: epsilon spent at ``delta`` by ``steps`` steps (inf when sigma = 0).
    delta: total delta of the guarantee: the target delta plus ``overflow_delta``.
    steps: DP-SGD steps run.
    sample_rate: Poisson rate q.
    expected_batch_size: q N, the divisor of the noisy sum.
    sensitivity: L2 sensitivity of the clipped sum.
    padded_size: static chunk size P.
    history: per-evaluation dicts (step, epoch, epsilon, eval metrics, and
      ``nonprivate_train_loss``: the mean UN-NOISED per-example loss of the batches
      since the last record, a deterministic function of the private data; never
      publish it unaccounted).
    accountant: the accountant the event was spent on (or None).
    seconds: wall-clock training time.
    overflow_delta: extra delta of aborting on overflow
      (``on_overflow="raise"``): ``(1 + e^epsilon) * steps * p`` with
      ``p = Pr[Binomial(N + 1, q) > P]`` (:func:`.sampling.abort_delta`); 0 for
      ``"split"``.
    accountant_method: the method of ``epsilon`` (and of the calibration):
      ``"rdp"`` or ``"pld"``. ``accountant.get_epsilon(delta, accountant_method)``
      gives the same number from the ledger; the ledger's default ``"auto"``
      is the smallest of all its sound bounds and can be smaller (e.g. PLD
      when this is ``"rdp"``). Report :attr:`guarantee`, which names it.
    neighbouring: the relation ``epsilon`` holds for (``"add_remove"`` or ``"replace_one"``).
  """

  params: PyTree
  noise_multiplier: float
  epsilon: float
  delta: float
  steps: int
  sample_rate: float
  expected_batch_size: float
  sensitivity: float
  padded_size: int
  history: list[dict[str, float]]
  accountant: Any
  seconds: float
  overflow_delta: float = 0.0
  accountant_method: str = "rdp"
  neighbouring: str = events.ADD_REMOVE

  @property
  def guarantee(self) -> Any:
    """``PrivacyGuarantee(epsilon, delta, neighbouring, "example", accountant_method)``.

    The one number to report for this run, with the method that produced it
    (the one the noise was calibrated with) and what it is a guarantee about.
    """
    from jaxdp.accounting.accountant import PrivacyGuarantee  # pylint: disable=g-import-not-at-top
    return PrivacyGuarantee(self.epsilon, self.delta, self.neighbouring, events.DEFAULT_UNIT,
                            self.accountant_method)


def _model_apply(model: Any, params: PyTree | None, init_key: jax.Array,
                 example: jax.Array) -> tuple[Callable[[PyTree, jax.Array], jax.Array], PyTree,
                                              Callable[[PyTree], None]]:
  """Returns (apply(params, x_batch) -> logits, params, write_back) for linen or nnx."""
  try:
    from flax import nnx
    is_nnx = isinstance(model, nnx.Module)
  except ImportError:  # pragma: no cover
    is_nnx = False
  if is_nnx:
    graphdef, nnx_params, rest = nnx.split(model, nnx.Param, ...)
    if params is None:
      params = nnx_params

    def apply(p, xb):
      return nnx.merge(graphdef, p, rest)(xb)

    def write_back(p):
      nnx.update(model, p)

    return apply, params, write_back
  if not hasattr(model, "apply"):
    raise ValueError("model must be a flax.linen.Module or a flax.nnx.Module.")
  if params is None:
    variables = model.init(init_key, example)
    if "batch_stats" in variables:
      raise _inputs.batchnorm_error("model")
    params = variables["params"]
  elif isinstance(params, dict) and "params" in params and len(params) == 1:
    params = params["params"]

  def apply(p, xb):
    return model.apply({"params": p}, xb)

  return apply, params, lambda p: None


def make_per_example_loss(apply: Callable[[PyTree, jax.Array], jax.Array],
                          loss: Callable[[jax.Array, jax.Array], jax.Array] | None = None
                          ) -> Callable[[PyTree, jax.Array, jax.Array], jax.Array]:
  """``(params, x_n, y_n) -> loss(apply(params, x_n[None])[0], y_n)`` for one example.

  Default loss: softmax cross-entropy with integer labels (the multi-class
  logistic loss of paper 000 Section 4.1).
  """
  integer_labels = loss is None
  if loss is None:
    loss = optax.softmax_cross_entropy_with_integer_labels

  def per_example(params, x, y):
    return loss(apply(params, x[None])[0], y)

  # Read by make_private / train_dpsgd to check the labels against the model's outputs.
  per_example.logits_fn = apply
  per_example.integer_labels = integer_labels
  return per_example


_PREDICT_CACHE: dict[Any, Any] = {}


def accuracy(apply: Callable[[PyTree, jax.Array], jax.Array], params: PyTree, x: Any, y: Any,
             batch_size: int = 2048) -> float:
  """Top-1 accuracy of ``apply(params, x)`` (non-private evaluation on held-out data)."""
  f = _PREDICT_CACHE.get(apply)
  if f is None:  # compile once per apply function, not once per evaluation
    f = _PREDICT_CACHE[apply] = jax.jit(lambda p, xb: jnp.argmax(apply(p, xb), axis=-1))
  correct = 0
  n = len(y)
  for s in range(0, n, batch_size):
    pred = np.asarray(f(params, jnp.asarray(x[s:s + batch_size])))
    correct += int((pred == np.asarray(y[s:s + batch_size])).sum())
  return correct / max(n, 1)


def _default_accountant():
  try:
    from jaxdp.accounting.accountant import PrivacyAccountant
  except ImportError:  # accountant module not available: record nothing.
    return None
  return PrivacyAccountant()


def train_dpsgd(
    model: Any,
    x: Any,
    y: Any,
    *,
    key: jax.Array,
    epochs: float,
    l2_clip_norm: Any,
    delta: float,
    sample_rate: float | None = None,
    expected_batch_size: float | None = None,
    target_epsilon: float | None = None,
    noise_multiplier: float | None = None,
    params: PyTree | None = None,
    optimizer: optax.GradientTransformation | None = None,
    learning_rate: float = 0.1,
    loss: Callable[[jax.Array, jax.Array], jax.Array] | None = None,
    per_layer: bool = False,
    microbatch_size: int | None = None,
    clipping_method: str = "vmap",
    physical_batch_size: int | None = None,
    overflow_prob: float = 1e-9,
    on_overflow: str = "split",
    max_overflow_delta_fraction: float = 0.1,
    accountant_method: str = "rdp",
    accountant: Any = "default",
    mesh: Any = None,
    eval_fn: Callable[[PyTree], dict[str, float]] | None = None,
    eval_every: int | None = None,
    progress: bool = False,
    neighbouring: str = "add_remove",
    checkpoint_dir: str | None = None,
    checkpoint_every: int | None = None,
) -> DPSGDResult:
  """Trains ``model`` with DP-SGD on ``(x, y)`` and reports the epsilon spent.

  Privacy: (epsilon, delta)-DP with respect to adding or removing one example
  of ``(x, y)`` (or, with ``neighbouring="replace_one"``, replacing one: PLD of
  the replace-one subsampled Gaussian, :mod:`jaxdp.accounting.dpsgd_accounting`)
  for the released parameters (and everything computed from them),
  by the Poisson-subsampled Gaussian mechanism composed over ``steps`` steps
  (RDP or PLD accountant of :mod:`jaxdp.accounting.dpsgd_accounting`). Not covered:
  hyper-parameter tuning, ``eval_fn`` on private data, and the non-private
  diagnostics (training loss, ``history[i]["nonprivate_train_loss"]``). Two conventions
  the accounting relies on: q and the divisor ``q N`` are computed from
  ``N = len(y)``, i.e. the dataset size is treated as public (as in Opacus and
  TF Privacy; strictly, under add/remove both should be constants fixed before
  seeing the data); with ``on_overflow="raise"`` an abort is itself a release
  (it reveals a large batch): the guarantee is
  ``(epsilon, delta + (1 + e^epsilon) * steps * p)`` with
  ``p = Pr[Binomial(N + 1, q) > P]`` (see :mod:`.sampling`), reported in
  ``result.delta`` / ``result.overflow_delta``; a P for which that extra term
  exceeds ``max_overflow_delta_fraction * delta`` is refused before anything
  is spent. The event spent on the accountant is the exact (non-aborting)
  DP-SGD event; the abort term is not in the ledger (it is bounded by
  ``max_overflow_delta_fraction * delta``).

  Budget: the planned event for all T steps is spent on ``accountant`` before
  the first step (a ``PrivacyBudget`` that cannot afford it raises
  ``BudgetExceededError`` and nothing is trained) and is not refunded if the
  run stops early.

  Args:
    model: a ``flax.linen.Module`` (``params`` optional; initialised from
      ``key`` when omitted) or a ``flax.nnx.Module`` (its ``nnx.Param`` state is
      trained and written back). The model is applied deterministically to one
      example at a time: no BatchNorm statistics (they mix examples; use
      GroupNorm) and no dropout (non-``Param`` nnx state is held fixed).
    x, y: training inputs (N, ...) (real and finite) and labels (N,): integers
      in ``[0, num_classes)`` for the default loss. Checked before anything is
      computed or spent (``ValueError``/``TypeError`` naming the argument):
      ``len(x) == len(y)``, no NaN/inf, no complex or non-numeric data, labels
      in range, a model that accepts one example of ``x`` and has no BatchNorm
      in training mode.
    key: ``jax.random`` key; split into init / sampling / noise keys.
    epochs: expected passes over the data; steps T = ceil(epochs / q).
    l2_clip_norm: per-example clip norm (or per-group norms with ``per_layer``).
    delta: target delta in (0, 1) (use < 1/N).
    sample_rate / expected_batch_size: q, or q N (exactly one).
    target_epsilon / noise_multiplier: calibrate sigma for this epsilon, or use
      the given sigma (exactly one; sigma = 0 trains non-privately, epsilon = inf).
    optimizer: optax optimiser applied to the private average (default
      ``optax.sgd(learning_rate)``).
    loss: per-example loss on (logits, label); default softmax cross-entropy.
    per_layer, microbatch_size, clipping_method: see :func:`clipped_grad`
      (``clipping_method`` is its ``method``: ``"vmap"`` or ``"reweight"``).
    physical_batch_size: static chunk size P (gradient accumulation: a Poisson
      batch larger than P is processed as several chunks before ONE noisy
      update). Default: the binomial bound at ``overflow_prob``.
    on_overflow: ``"split"`` or ``"raise"`` (see :mod:`.sampling`).
    max_overflow_delta_fraction: with ``on_overflow="raise"``, refuse (ValueError)
      a padded size whose abort delta ``(1 + e^epsilon) * steps * p`` exceeds
      this fraction of ``delta``.
    accountant_method: ``"rdp"`` (default) or ``"pld"``: ONE method for the
      calibration of sigma and for ``result.epsilon`` / ``result.guarantee``
      (which names it). ``"pld"`` is tighter (a smaller sigma for the same
      target) but its calibration takes tens of seconds.
    accountant: a ``PrivacyAccountant`` (anything with ``spend(event, count)``)
      to record the DP-SGD event on; ``"default"`` makes a fresh one; ``None``
      records nothing.
    mesh: optional 1-D ``jax.sharding.Mesh`` for data parallelism (axis "data").
    eval_fn: ``params -> dict`` of metrics, run every ``eval_every`` steps and at the end.
    progress: show a tqdm bar.
    neighbouring: ``"add_remove"`` (default) or ``"replace_one"`` (needs
      ``accountant_method="pld"``): the relation of the guarantee and of the event spent.
    checkpoint_dir: make the run resumable (:mod:`.checkpointing`): Orbax
      checkpoints of the params and optimiser state (noise key and step)
      every ``checkpoint_every`` steps (default ``max(1, T // 10)``) and at
      the end, and a durable ledger that records the planned event as paid.
      Calling ``train_dpsgd`` again with the same arguments continues from the
      newest checkpoint with the same batches and noise (the result equals an
      uninterrupted run's); the planned event is charged again only to an
      in-memory accountant (a durable ``PrivacyBudget(path=...)`` already holds
      it), so the ledger holds the run once. ``history`` and ``seconds`` cover
      the steps this call ran. A directory of another plan is refused.
  """
  _validation.check_key(key)
  # Every input is checked here, before any calibration, gradient or spend.
  relation = dpsgd_accounting.check_relation_and_accountant(neighbouring, accountant_method,
                                                            "accountant_method")
  if not (accountant is None or (isinstance(accountant, str) and accountant == "default")
          or hasattr(accountant, "spend")):
    raise TypeError("accountant must be a PrivacyAccountant or PrivacyBudget (anything with "
                    f"spend(event, count)), 'default' or None, got {accountant!r}.")
  if loss is not None and not callable(loss):
    raise TypeError(f"loss must be callable, got {type(loss).__name__}.")
  if not hasattr(x, "dtype"):
    x = np.asarray(x)
  if not hasattr(y, "dtype"):
    y = np.asarray(y)
  x_rows = np.shape(x)[0] if np.ndim(x) else None
  y_rows = np.shape(y)[0] if np.ndim(y) else None
  if x_rows is None or y_rows is None or x_rows != y_rows:
    raise ValueError(f"x and y must have the same number of rows (one label per example), got "
                     f"x of shape {np.shape(x)} and y of shape {np.shape(y)}.")
  n = _validation.check_positive_int(int(y_rows), "len(y)")
  if loss is None:
    _inputs.check_label_dtype(y, "y")
    _inputs.check_label_shape(y, "y")
  _inputs.check_examples((x, y), ("x", "y"), n)
  q = sampling.resolve_sample_rate(sample_rate, expected_batch_size, n)
  delta = _validation.check_delta(delta, allow_zero=False)
  steps = dpsgd_accounting.steps_for_epochs(epochs, q)
  every = checkpointing.check_arguments(checkpoint_dir, checkpoint_every)
  frac = _validation._as_float(max_overflow_delta_fraction, "max_overflow_delta_fraction")
  if not 0.0 < frac <= 1.0:
    raise ValueError(f"max_overflow_delta_fraction must be in (0, 1], got {frac}.")

  run_keys = keys_lib.derive(key)  # the same keys as make_private's (.keys)
  init_key, noise_key = run_keys.init, run_keys.gradient_noise
  x = jnp.asarray(x)
  y = jnp.asarray(y)
  _inputs.refuse_batchnorm_nnx(model)
  apply, params, write_back = _model_apply(model, params, init_key, x[:1])
  per_example = make_per_example_loss(apply, loss)
  _inputs.probe_loss(per_example, params, (x, y), batch_argnums=(1, 2), names=("x", "y"),
                     what="the model and loss")
  if loss is None:
    _inputs.check_labels(y, "y", _inputs.num_classes_of(apply, params, _inputs.example_spec(x)))
  if isinstance(accountant, str):
    accountant = _default_accountant()
  grad_fn = clipping.clipped_grad(per_example, l2_clip_norm=l2_clip_norm, batch_argnums=(1, 2),
                                  microbatch_size=microbatch_size, per_layer=per_layer,
                                  method=clipping_method)
  n_dev = 1
  if mesh is not None:
    from jaxdp.dpsgd import data_parallel
    grad_fn = data_parallel.data_parallel_clipped_grad(grad_fn, mesh)
    n_dev = mesh.shape["data"]
    params = data_parallel.replicate(params, mesh)
  sampler = sampling.PoissonSampler(n, q, padded_size=physical_batch_size,
                                    overflow_prob=overflow_prob, on_overflow=on_overflow,
                                    multiple_of=n_dev)
  # Calibration last: it is the slow part (seconds), and every cheap check ran before it.
  sigma = dpsgd_accounting.resolve_noise_multiplier(target_epsilon, noise_multiplier, delta, q,
                                                    steps, accountant=accountant_method,
                                                    neighbouring=relation)
  sensitivity = grad_fn.sensitivity
  if sigma > 0 and math.isinf(sensitivity):
    raise ValueError("l2_clip_norm must be finite for private training (noise_multiplier > 0).")
  overflow_delta = 0.0
  if on_overflow == "raise" and sigma > 0:
    p_abort = sampler.overflow_probability
    eps_planned = dpsgd_accounting.dpsgd_epsilon(sigma, q, steps, delta, accountant_method,
                                                 relation)
    overflow_delta = sampling.abort_delta(p_abort, steps, eps_planned)
    if not overflow_delta <= frac * delta:
      allowed = frac * delta / (steps * (1.0 + math.exp(min(eps_planned, 700.0))))
      needed = sampling.padded_batch_size(n + 1, q, allowed, n_dev) if allowed > 0 else n + 1
      raise ValueError(
          f"on_overflow='raise' with padded size P={sampler.padded_size} (physical_batch_size / "
          f"overflow_prob) aborts with probability p={p_abort:.3g} per step, adding "
          f"(1 + e^eps) * steps * p = {overflow_delta:.3g} to delta, more than "
          f"max_overflow_delta_fraction * delta = {frac * delta:.3g}; use P >= {needed} "
          f"(overflow_prob <= {allowed:.3g}) or on_overflow='split' (exact, no extra delta). "
          "Nothing was trained or spent.")

  ckpt, newest = None, None
  if checkpoint_dir is not None:
    ckpt = checkpointing.RunCheckpointer(os.fspath(checkpoint_dir), {
        "function": "train_dpsgd", "num_examples": n, "sample_rate": q,
        "noise_multiplier": float(sigma), "sensitivity": float(sensitivity), "steps": steps,
        "padded_size": int(sampler.padded_size), "on_overflow": on_overflow,
        "neighbouring": relation, "accountant_method": accountant_method,
        "key_sha256": checkpointing.key_digest(key)})
    every = every or max(1, steps // 10)
    newest, through = ckpt.latest_step(), ckpt.checkpointed_through()
    if through and (newest is None or newest < through):
      raise ValueError(
          f"checkpoint_dir holds no checkpoint of step {through}, which was saved (released) "
          f"before; resuming from step {newest or 0} would replay the noise of released steps. "
          "Use a fresh checkpoint_dir, or make_private(...).restore, which continues with fresh "
          "keys.")
  already_paid = ckpt is not None and ckpt.steps_paid() >= steps
  # Reserve the planned event BEFORE the first step; no refund if the run stops.
  if accountant is not None and not (already_paid and getattr(accountant, "path", None)):
    planned = (dpsgd_accounting.dpsgd_event(sigma, q, steps, neighbouring=relation) if sigma > 0
               else events.NonPrivateDpEvent())
    try:
      accountant.spend(planned)
    except BudgetExceededError as err:
      raise BudgetExceededError(
          f"DP-SGD ({steps} steps, q={q}, noise_multiplier={sigma}) would exceed the budget; "
          f"nothing was trained or spent. ({err})") from err
  if ckpt is not None:
    ckpt.record_paid(steps)
  base = optimizer if optimizer is not None else optax.sgd(learning_rate)
  tx = optax.chain(
      transforms.noisy_aggregate(sigma, sensitivity, sampler.expected_batch_size, noise_key), base)
  opt_state = tx.init(params)
  first_step = 0
  if newest is not None:
    first_step, restored = ckpt.restore({"params": params, "opt_state": opt_state})
    params, opt_state = restored["params"], restored["opt_state"]
    if mesh is not None:
      params, opt_state = data_parallel.replicate((params, opt_state), mesh)

  @jax.jit
  def accumulate(params, acc, xs, ys, idx, mask):
    g, info = grad_fn(params, sampling.MaskedBatch((xs[idx], ys[idx]), mask))
    return jax.tree.map(jnp.add, acc, g), info.loss_sum

  @jax.jit
  def final(params, opt_state, acc, xs, ys, idx, mask):
    g, info = grad_fn(params, sampling.MaskedBatch((xs[idx], ys[idx]), mask))
    g = jax.tree.map(jnp.add, acc, g)
    updates, opt_state = tx.update(g, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, info.loss_sum

  # The clipped sums are at least float32 (clipping.clipped_grad), also for bf16 params.
  zeros = jax.tree.map(
      lambda p: jnp.zeros(jnp.shape(p), jnp.promote_types(jnp.result_type(p), jnp.float32)), params)
  history: list[dict[str, float]] = []
  step_keys = run_keys.step_keys(steps)
  iterator = range(first_step, steps)
  if progress:
    from tqdm.auto import tqdm
    iterator = tqdm(iterator, desc="DP-SGD", unit="step", initial=first_step, total=steps)
  steps_run = first_step
  loss_acc, count_acc = 0.0, 0
  t0 = time.perf_counter()

  def epsilon_after(t: int) -> float:
    if t == 0:
      return 0.0
    if sigma == 0:
      return math.inf
    return dpsgd_accounting.dpsgd_epsilon(sigma, q, t, delta, accountant_method, relation)

  try:
    for t in iterator:
      chunks = sampler.sample(step_keys[t])
      acc = zeros
      loss_sum = jnp.zeros(())
      for c in chunks[:-1]:
        idx, mask = c.slots_and_mask()
        acc, ls = accumulate(params, acc, x, y, jnp.asarray(idx), jnp.asarray(mask))
        loss_sum = loss_sum + ls
      idx, mask = chunks[-1].slots_and_mask()
      params, opt_state, ls = final(params, opt_state, acc, x, y, jnp.asarray(idx),
                                    jnp.asarray(mask))
      steps_run = t + 1
      if ckpt is not None and (steps_run % every == 0 or steps_run == steps):
        ckpt.save(steps_run, {"params": params, "opt_state": opt_state}, wait=steps_run == steps)
      loss_acc += float(loss_sum + ls)
      count_acc += sum(c.num_examples for c in chunks)
      if eval_every and eval_fn is not None and steps_run % eval_every == 0 and steps_run < steps:
        rec = {"step": steps_run, "epoch": steps_run * q, "epsilon": epsilon_after(steps_run),
               "accountant_method": accountant_method,
               "nonprivate_train_loss": loss_acc / max(count_acc, 1)}
        rec.update(eval_fn(params))
        history.append(rec)
        loss_acc, count_acc = 0.0, 0
  finally:
    if ckpt is not None:
      ckpt.close()  # wait for a pending save (also when the loop raised)
  seconds = time.perf_counter() - t0
  eps = epsilon_after(steps_run)
  rec = {"step": steps_run, "epoch": steps_run * q, "epsilon": eps,
         "accountant_method": accountant_method,
         "nonprivate_train_loss": loss_acc / max(count_acc, 1)}
  if eval_fn is not None:
    rec.update(eval_fn(params))
  history.append(rec)
  write_back(params)
  return DPSGDResult(params=params, noise_multiplier=float(sigma), epsilon=eps,
                     delta=delta + overflow_delta, steps=steps_run, sample_rate=q,
                     expected_batch_size=sampler.expected_batch_size,
                     sensitivity=float(sensitivity), padded_size=sampler.padded_size,
                     history=history, accountant=accountant, seconds=seconds,
                     overflow_delta=overflow_delta, accountant_method=accountant_method,
                     neighbouring=relation)
