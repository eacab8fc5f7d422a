"""DP-SGD training loop for Flax (linen or nnx) classifiers: a builder over :func:`.make_private`.

Algorithm (survey ``004_dp_machine_learning_survey.md`` Section 4.2 Algorithm 1;
paper ``000_tradeoffs_of_private_prediction.md`` Section 3.1 Equation 4), for
T = ceil(epochs / q) steps:

1. Poisson-sample a batch B_t (each example w.p. q) -- :mod:`.sampling` on the
   host, or inside the jitted step from device-resident data
   (:mod:`.device_sampling`: the same batch for the same key);
2. sum the per-example gradients clipped to ``l2_clip_norm`` -- :mod:`.clipping`
   (in static-size chunks: a large logical batch is accumulated chunk by chunk,
   which is both gradient accumulation and the honest overflow handling);
3. add ``N(0, (sigma * S)^2 I)`` to the sum once, divide by ``q N`` and apply any
   optax optimiser -- :mod:`.transforms` (or the correlated noise ``C^{-1} z`` of
   a ``noise_strategy``, :mod:`.correlated`).

:func:`train_dpsgd` is :func:`.make_private` (which wires sampling, clipping,
noise, optimiser, accounting, checkpoints, correlated noise and adaptive
clipping together) plus the model handling of a Flax classifier, the input
checks on the whole dataset, the history/evaluation/progress bar, and the
``on_overflow="raise"`` abort rule. The same key gives the same run as a
hand-written ``make_private`` loop.

The noise multiplier sigma is either given or calibrated to a target
(epsilon, delta) by :func:`.make_private` for exactly (q, T) (float64,
dp_accounting; never in JAX); the spent epsilon is reported by the same accountant.

Reservation: the whole PLANNED run (T steps of the Poisson-subsampled
Gaussian, or a correlated-noise run's one event) is paid on the accountant by
the plan's sampler (``PaidSampler.pay``) BEFORE the first step and never
refunded. Everything released during training (evaluations, checkpoints, the
parameters of a run killed half-way) is covered by it, a run that crashes or
is killed has already paid, and two runs sharing one ``PrivacyBudget`` cannot
both pass its check (``spend`` is atomic: the second reservation raises
``BudgetExceededError`` before any training).
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxdp import _validation
from jaxdp.accounting import dpsgd_accounting as dpsgd_accounting
from jaxdp.accounting import events
from jaxdp.dpsgd import _inputs, private_step, sampling
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


def _throwaway_accountant(unit: str):
  """A private in-memory ledger for ``accountant=None`` (the sampler pays every step on one)."""
  from jaxdp.accounting.accountant import PrivacyAccountant  # pylint: disable=g-import-not-at-top
  return PrivacyAccountant(unit=unit)


def _check_arguments(x: Any, y: Any, *, loss: Any, accountant: Any, neighbouring: str,
                     accountant_method: str, on_overflow: str, max_overflow_delta_fraction: float,
                     sample_on_device: bool | None, mesh: Any,
                     physical_batch_size: int | None,
                     batch_selection: Any = None) -> tuple[Any, Any, float, bool]:
  """Checks train_dpsgd's own arguments and the dataset before any work: ``(x, y, frac, on_device)``."""
  if batch_selection is None:  # a batch_selection sampler is checked by make_private
    dpsgd_accounting.check_relation_and_accountant(neighbouring, accountant_method,
                                                   "accountant_method")
  if not (accountant is None or (isinstance(accountant, str) and accountant == "default")
          or hasattr(accountant, "spend")):
    raise TypeError("accountant must be a PrivacyAccountant or PrivacyBudget (anything with "
                    f"spend(event, count)), 'default' or None, got {accountant!r}.")
  if loss is not None and not callable(loss):
    raise TypeError(f"loss must be callable, got {type(loss).__name__}.")
  if on_overflow not in ("split", "raise"):
    raise ValueError(f"on_overflow must be 'split' or 'raise', got {on_overflow!r}.")
  frac = _validation._as_float(max_overflow_delta_fraction, "max_overflow_delta_fraction")
  if not 0.0 < frac <= 1.0:
    raise ValueError(f"max_overflow_delta_fraction must be in (0, 1], got {frac}.")
  if sample_on_device is None:  # data already on the device stay there; one program for all K
    sample_on_device = (isinstance(x, jax.Array) or mesh is not None
                        or physical_batch_size is not None)
  if not isinstance(sample_on_device, bool):
    raise TypeError(f"sample_on_device must be True, False or None, got {sample_on_device!r}.")
  if mesh is not None and not sample_on_device:
    raise ValueError("mesh needs sample_on_device=True (or None): the data are sharded over the "
                     "mesh and sampled inside the step.")
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
  return x, y, frac, sample_on_device


def _build_model(model: Any, params: PyTree | None, key: jax.Array, x: Any, y: Any,
                 loss: Any) -> tuple[Callable[..., jax.Array], PyTree, Callable[[PyTree], None]]:
  """``(per_example_loss, params, write_back)``, the model probed on one example, labels checked."""
  _inputs.refuse_batchnorm_nnx(model)
  # The init key is make_private's (.keys): the same key gives the same run.
  apply, params, write_back = _model_apply(model, params, keys_lib.derive(key).init, x[:1])
  per_example = make_per_example_loss(apply, loss)
  _inputs.probe_loss(per_example, params, (x, y), batch_argnums=(1, 2), names=("x", "y"),
                     what="the model and loss")
  if loss is None:
    _inputs.check_labels(y, "y", _inputs.num_classes_of(apply, params, _inputs.example_spec(x)))
  return per_example, params, write_back


def _abort_rule(private: private_step.PrivateSGD, on_overflow: str,
                frac: float) -> tuple[float, sampling.PoissonSampler | None]:
  """``(overflow_delta, checker)`` of ``on_overflow="raise"``; ``(0, None)`` for ``"split"``.

  The aborting mechanism M' runs the exact mechanism M of the plan and stops
  with :class:`~.sampling.BatchOverflowError` at the first step whose Poisson
  batch exceeds P. M' is ``(eps, delta + (1 + e^eps) * steps * p)``-DP with
  ``p = Pr[Binomial(N + 1, q) > P]`` (:mod:`.sampling`, coupling argument;
  :func:`.sampling.abort_delta`). The checker is a host Poisson sampler of the
  plan's (N, q, P) that raises on overflow; drawn with the plan's step keys it
  gives the batch the step is about to use (:mod:`.device_sampling`: the same
  bits), so M' is exactly what runs. A P whose term exceeds ``frac * delta``
  is refused here, before anything is spent. Correlated noise (cyclic
  batches) has no abort rule.
  """
  if on_overflow == "split":
    return 0.0, None
  if private.noise_strategy is not None or private.batch_selection is not None:
    what = "noise_strategy" if private.noise_strategy is not None else "batch_selection"
    raise ValueError(f"on_overflow='raise' is not available with {what} (its batches are not "
                     "DP-SGD's Poisson batches of examples, for which the abort term is "
                     "derived). Use on_overflow='split' (exact, no extra delta). Nothing was "
                     "trained or spent.")
  n, q, steps, delta = private.num_examples, private.sample_rate, private.steps, private.delta
  checker = sampling.PoissonSampler(n, q, padded_size=private.padded_size, on_overflow="raise")
  if private.noise_multiplier == 0:
    return 0.0, checker
  p_abort = checker.overflow_probability
  eps_planned = private.epsilon(steps)
  overflow_delta = sampling.abort_delta(p_abort, steps, eps_planned)
  if not overflow_delta <= frac * delta:
    allowed = frac * delta / (steps * (1.0 + math.exp(min(eps_planned, 700.0))))
    needed = sampling.padded_batch_size(n + 1, q, allowed) if allowed > 0 else n + 1
    raise ValueError(
        f"on_overflow='raise' with padded size P={checker.padded_size} (physical_batch_size / "
        f"overflow_prob) aborts with probability p={p_abort:.3g} per step, adding "
        f"(1 + e^eps) * steps * p = {overflow_delta:.3g} to delta, more than "
        f"max_overflow_delta_fraction * delta = {frac * delta:.3g}; use P >= {needed} "
        f"(overflow_prob <= {allowed:.3g}) or on_overflow='split' (exact, no extra delta). "
        "Nothing was trained or spent.")
  return overflow_delta, checker


def _open_run(private: private_step.PrivateSGD, params: PyTree, data: tuple, accountant: Any,
              mesh: Any, on_device: bool
              ) -> tuple[PyTree, private_step.PrivateState, private_step.PaidSampler]:
  """Restores (``checkpoint_dir``), opens the sampler (on the device or host) and prepays the plan.

  ``restore(params, data=)`` binds a replay of lost paid steps to this data and
  these starting parameters (the resume rules of :meth:`.PrivateSGD.restore`);
  the sampler charges the steps released before it unless the accountant
  provably holds them, then every unpaid planned step is paid at once, before
  the first batch exists (a correlated-noise plan pays its one run event).
  """
  if private.checkpoint_dir is not None:
    params, state = private.restore(params, data=data)
  else:
    state = private.init(params)
  sampler = (private.sampler(accountant, data=data, mesh=mesh) if on_device
             else private.sampler(accountant))
  unpaid = private.steps - sampler.steps_paid
  if unpaid > 0:
    sampler.pay(unpaid)
  return params, state, sampler


class _History:
  """``DPSGDResult.history``: one record per evaluation, NON-PRIVATE loss diagnostics included."""

  def __init__(self, private: private_step.PrivateSGD, eval_fn: Any):
    self.private, self.eval_fn = private, eval_fn
    self.records: list[dict[str, float]] = []
    self._stats: list[Any] = []  # (loss_sum, num_examples) on device, since the last record
    self._loss, self._count = 0.0, 0.0

  def add(self, info: private_step.StepInfo) -> None:
    self._stats.append((info.nonprivate_loss_sum, info.nonprivate_num_examples))
    if len(self._stats) >= 1024:  # bound the live buffers; one host sync per 1024 steps
      self._fold()

  def _fold(self) -> None:
    for loss, count in jax.device_get(self._stats):
      self._loss += float(loss)
      self._count += float(count)
    self._stats = []

  def record(self, step: int, params: PyTree) -> float:
    """Appends the record of ``step`` (evaluating ``eval_fn``); returns its epsilon."""
    self._fold()
    p = self.private
    eps = p.epsilon(step)
    rec = {"step": step, "epoch": step * p.sample_rate / p.min_separation, "epsilon": eps,
           "accountant_method": p.accountant_method,
           "nonprivate_train_loss": self._loss / max(self._count, 1)}
    self._loss, self._count = 0.0, 0.0
    if self.eval_fn is not None:
      rec.update(self.eval_fn(params))
    self.records.append(rec)
    return eps


def _run_steps(private: private_step.PrivateSGD, sampler: private_step.PaidSampler,
               params: PyTree, state: private_step.PrivateState, history: _History, *,
               data: tuple | None, eval_every: int | None, progress: bool, checker: Any,
               step_keys: Any) -> tuple[PyTree, int]:
  """Runs the paid steps from the sampler's position to T: ``(params, steps_run)``.

  ``data``: the host arrays to gather each batch from (host path), or None
  (the sampler holds the data: device path).
  """
  first, steps = sampler.steps_sampled, private.steps
  iterator = range(first, steps)
  if progress:
    from tqdm.auto import tqdm  # pylint: disable=g-import-not-at-top
    iterator = tqdm(iterator, desc="DP-SGD", unit="step", initial=first, total=steps)
  done = first
  try:
    for t in iterator:
      if checker is not None:  # on_overflow="raise": abort before the batch is used
        checker.sample(step_keys[t])
      batch = sampler.sample() if data is None else sampler.sample().gather(*data)
      params, state, info = private.step(params, state, batch)
      history.add(info)
      done = t + 1
      if eval_every and history.eval_fn is not None and done % eval_every == 0 and done < steps:
        history.record(done, params)
  finally:
    private.close()  # wait for a pending checkpoint save (also when the loop raised)
  return params, done


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
    noise_strategy: Any = None,
    min_separation: int | None = None,
    sample_on_device: bool | None = None,
    batch_selection: Any = None,
) -> DPSGDResult:
  """Trains ``model`` with DP-SGD on ``(x, y)`` and reports the epsilon spent.

  A builder over :func:`.make_private`: the same key gives the same run (to
  float rounding) as a ``make_private`` loop that prepays the plan
  (``sampler.pay(private.steps)``) and steps through its sampler, on the host
  (``sampler(accountant)``, ``sample().gather(x, y)``) or the device
  (``sampler(accountant, data=(x, y), mesh=mesh)``).

  Privacy: (epsilon, delta)-DP with respect to adding or removing one example
  of ``(x, y)`` (or, with ``neighbouring="replace_one"``, replacing one: PLD of
  the replace-one subsampled Gaussian, :mod:`jaxdp.accounting.dpsgd_accounting`)
  for the released parameters (and everything computed from them), by the
  Poisson-subsampled Gaussian mechanism composed over ``steps`` steps (RDP or
  PLD accountant of :mod:`jaxdp.accounting.dpsgd_accounting`); with
  ``noise_strategy``, by the matrix mechanism's one run event
  (:func:`~jaxdp.dpsgd.correlated.mf_event`); with an adaptive clip norm, the
  gradient and count noise together cost sigma (Andrew et al. 2021 Thm 1).
  Not covered: hyper-parameter tuning, ``eval_fn`` on private data, and the
  non-private diagnostics (``history[i]["nonprivate_train_loss"]``). N =
  ``len(y)`` is treated as public (q and the divisor ``q N`` are computed from
  it, as in Opacus and TF Privacy). With ``on_overflow="raise"`` an abort is
  itself a release: the guarantee is ``(epsilon, delta + (1 + e^epsilon) *
  steps * p)``, ``p = Pr[Binomial(N + 1, q) > P]`` (:mod:`.sampling`), reported
  in ``result.delta`` / ``result.overflow_delta``; a P whose extra term exceeds
  ``max_overflow_delta_fraction * delta`` is refused before anything is spent.
  The ledger holds the exact (non-aborting) mechanism's events.

  Budget: the whole planned run is paid on ``accountant`` before the first
  step, by the plan's sampler: ``T x PoissonSampled(q, Gaussian(sigma))`` as
  ONE ledger entry ``(step_event, T)`` (a correlated-noise run: its one run
  event). A ``PrivacyBudget`` that cannot afford it raises
  ``BudgetExceededError`` and nothing is trained; nothing is refunded if the
  run stops early.

  Args:
    model: a ``flax.linen.Module`` (``params`` optional; initialised from
      ``key`` when omitted) or a ``flax.nnx.Module`` (its ``nnx.Param`` state is
      trained and written back). Applied deterministically to one example at a
      time: no BatchNorm statistics (use GroupNorm), no dropout.
    x, y: training inputs (N, ...) (real and finite) and labels (N,): integers
      in ``[0, num_classes)`` for the default loss. Checked before anything is
      computed or spent (``ValueError``/``TypeError`` naming the argument).
    key: ``jax.random`` key, split as :mod:`.keys` (init / sampling / noise).
    epochs: expected passes over the data: T = ceil(epochs / q) (with
      ``noise_strategy``, ``min_separation`` steps per pass).
    l2_clip_norm: per-example clip norm (per-group norms with ``per_layer``),
      or an :class:`~.adaptive_clipping.AdaptiveClipNorm` (adaptive clipping).
    delta: target delta in (0, 1) (use < 1/N).
    sample_rate, expected_batch_size, target_epsilon, noise_multiplier: as for
      :func:`.make_private` (``sample_rate`` or ``expected_batch_size``,
      ``target_epsilon`` or ``noise_multiplier``; sigma = 0 trains non-privately,
      epsilon = inf).
    optimizer, learning_rate, per_layer, microbatch_size, clipping_method: as for
      :func:`.make_private`.
    physical_batch_size, overflow_prob, neighbouring: as for :func:`.make_private`.
    noise_strategy, min_separation, batch_selection: as for :func:`.make_private`.
    accountant_method: as for :func:`.make_private` (ONE method for
      the calibration and ``result.epsilon`` / ``result.guarantee``).
    params: initial parameters (a linen ``params`` tree, optional).
    loss: per-example loss on (logits, label); default softmax cross-entropy.
    on_overflow: ``"split"`` (exact) or ``"raise"`` (abort rule above; not with
      ``noise_strategy``).
    max_overflow_delta_fraction: bound on the abort term, as a fraction of ``delta``.
    accountant: a ``PrivacyAccountant`` / ``PrivacyBudget`` (anything with
      ``spend(event, count)``); ``"default"`` makes a fresh one; ``None``
      records the run on a private throwaway ledger only.
    mesh: optional 1-D ``jax.sharding.Mesh`` (axis ``"data"``): data parallelism,
      the data sharded over it and the clipped sums ``psum``-reduced.
    eval_fn, eval_every: ``params -> dict`` of metrics, run every ``eval_every``
      steps and at the end (records in ``history``).
    progress: show a tqdm bar.
    checkpoint_dir, checkpoint_every: make the run resumable
      (:meth:`.PrivateSGD.restore` rules): calling ``train_dpsgd`` again with
      the same arguments and data continues from the newest checkpoint with the
      same batches and noise (the result equals an uninterrupted run's); steps
      already paid are charged again only to an accountant that does not hold
      them (a durable ``PrivacyBudget(path=...)`` does). ``history`` and
      ``seconds`` cover the steps this call ran. A directory of another plan is
      refused.
    sample_on_device: where the Poisson batches are drawn (the same batches either
      way, and the same parameters to float rounding): ``True``: the data are
      placed on the device(s) once and each step samples, gathers and updates in
      ONE jit-compiled call (``sampler(data=, mesh=)``: one program for every
      chunk count, about a third of the host work per step, but a program that
      takes about twice as long to compile); ``False``: each batch is drawn on
      the host and gathered (``sampler().sample().gather``: one program per
      chunk count K). ``None`` (default): on the device when ``x`` already is
      a ``jax.Array``, with ``mesh``, or with ``physical_batch_size`` (chunk
      counts vary), else on the host. For long runs, ``True`` is faster.
  """
  _validation.check_key(key)
  # Every input is checked here, before any calibration, gradient or spend.
  x, y, frac, on_device = _check_arguments(
      x, y, loss=loss, accountant=accountant, neighbouring=neighbouring,
      accountant_method=accountant_method, on_overflow=on_overflow,
      max_overflow_delta_fraction=max_overflow_delta_fraction, sample_on_device=sample_on_device,
      mesh=mesh, physical_batch_size=physical_batch_size, batch_selection=batch_selection)
  per_example, params, write_back = _build_model(model, params, key, x, y, loss)
  default_accountant = isinstance(accountant, str)
  if default_accountant:
    accountant = _default_accountant()
  # Argument checks, then the calibration (the slow part), inside make_private.
  private = private_step.make_private(
      per_example, l2_clip_norm=l2_clip_norm, num_examples=len(y), key=key,
      expected_batch_size=expected_batch_size, sample_rate=sample_rate,
      target_epsilon=target_epsilon, noise_multiplier=noise_multiplier, delta=delta,
      epochs=epochs, optimizer=optimizer, learning_rate=learning_rate,
      physical_batch_size=physical_batch_size, overflow_prob=overflow_prob,
      clipping_method=clipping_method, per_layer=per_layer, microbatch_size=microbatch_size,
      accountant_method=accountant_method, neighbouring=neighbouring,
      checkpoint_dir=checkpoint_dir, checkpoint_every=checkpoint_every,
      noise_strategy=noise_strategy, min_separation=min_separation,
      batch_selection=batch_selection)
  if default_accountant and accountant is not None and accountant.unit != private.unit:
    accountant = type(accountant)(unit=private.unit)  # the default ledger is in the plan's unit
  overflow_delta, checker = _abort_rule(private, on_overflow, frac)
  ledger = accountant if accountant is not None else _throwaway_accountant(private.unit)
  data = (x, y) if on_device else (np.asarray(x), np.asarray(y))  # host path: gather on host
  params, state, sampler = _open_run(private, params, data, ledger, mesh, on_device)
  step_keys = None if checker is None else keys_lib.derive(key).step_keys(private.steps)
  history = _History(private, eval_fn)
  t0 = time.perf_counter()
  params, steps_run = _run_steps(private, sampler, params, state, history,
                                 data=None if on_device else data, eval_every=eval_every,
                                 progress=progress, checker=checker, step_keys=step_keys)
  seconds = time.perf_counter() - t0
  eps = history.record(steps_run, params)
  write_back(params)
  return _result(private, params, eps, steps_run, history.records, accountant, seconds,
                 overflow_delta, accountant_method)


def _result(private: Any, params: PyTree, eps: float, steps_run: int, records: list,
            accountant: Any, seconds: float, overflow_delta: float,
            accountant_method: str) -> DPSGDResult:
  """The :class:`DPSGDResult` of a finished :func:`train_dpsgd` call."""
  return DPSGDResult(params=params, noise_multiplier=private.noise_multiplier,
                     epsilon=eps, delta=private.delta + overflow_delta,
                     steps=steps_run, sample_rate=private.sample_rate,
                     expected_batch_size=private.expected_batch_size,
                     sensitivity=private.sensitivity, padded_size=private.padded_size,
                     history=records, accountant=accountant, seconds=seconds,
                     overflow_delta=overflow_delta, accountant_method=accountant_method,
                     neighbouring=private.neighbouring)
