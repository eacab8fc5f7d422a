"""Reproduction of "The Trade-Offs of Private Prediction" (paper 000), Figures 1-6.

Paper: ``../shared/papers/000_tradeoffs_of_private_prediction.md``, Sec. 4.1-4.2.
Usage (one figure per run; the figure is the config's argument)::

  python experiments/tradeoffs.py                                   # Fig. 1 on digits
  JAXDP_DATA_DIR=../shared/data python experiments/tradeoffs.py \
      --config=configs/tradeoffs.py:fig2 --config.dataset=mnist
  ... --config=configs/tradeoffs.py:fig6a --config.num_seeds=20       # any field overrides

Five private methods on a multiclass linear (softmax) model, each for a total
``(epsilon, delta)`` guarantee on the training set and an inference budget B:

* private TRAINING (one released model; any number of predictions is
  post-processing, so the accuracy does not depend on B):

  - ``model_sensitivity``: output perturbation (App. B.1, Alg. 1 / 3), noise on
    the float64-certified minimiser, ``Delta = 2K/(N lambda) + 2 tol/lambda``;
  - ``loss_perturbation``: objective perturbation (App. B.2, Alg. 4 / 5), as
    Approximate Minima Perturbation certified in float64;
  - ``dpsgd``: DP-SGD (Sec. 3.1, Eq. 4; delta > 0 only), Poisson sampling
    (RDP accountant under add/remove, PLD under replace-one), per-example
    clipping of the WHOLE gradient
    (:func:`jaxdp.dpsgd.linear_dpsgd`), no L2 regularisation (Sec. 4.1);

* private PREDICTION (noise calibrated to B answers):

  - ``prediction_sensitivity`` (Sec. 3.2, App. C.1, Alg. 6 / 7, Thm. 5 / 6):
    logits ``theta^T x + b`` of the non-private L2-regularised minimiser, ``b``
    L2-Laplace with ``beta = eps / (B Delta)`` (delta = 0) or Gaussian
    with the smaller of the basic / advanced composition sigmas (delta > 0), by
    :func:`jaxdp.prediction.calibrate_prediction_sensitivity` exactly as
    :class:`jaxdp.prediction.PredictionSensitivityPredictor` does for budget B,
    scale rounded to float32 towards more noise. Lemma 1 (``||theta(D) -
    theta(D')|| <= 2K/(N lambda)``) holds for the exact minimiser; the released
    float32 weights are the float64 certified fit (within ``tol/lambda`` of it,
    :func:`jaxdp.training.output_perturbation.certified_fit`, repaired and never
    refused when L-BFGS stops short) rounded to float32, so ``Delta = 2K/(N
    lambda) + 2 s/lambda`` with ``s = tol + 2^-24 (K + tol)``
    (:meth:`jaxdp.prediction.PredictionSensitivityPredictor.from_linear_model`'s
    ``solver_tol``);
  - ``subsample_aggregate`` (App. C.2, Alg. 8) with T teachers on disjoint parts
    and the exponential mechanism with ``beta = eps/(2B)`` for delta = 0 (the
    paper's ``eps/B`` is not eps-DP; see :mod:`jaxdp.prediction.subsample_aggregate`)
    and ``max(eps/(2B), beta'')`` for delta > 0 (Thm. 8)
    (:func:`jaxdp.prediction.exponential_aggregation_beta`), rounded down to
    float32 as :class:`jaxdp.prediction.SubsampleAggregatePredictor` does. T is
    ``config.num_teachers``, or, with several values in
    ``config.num_teachers_grid``, chosen on the held-out split together with the
    teachers' lambda.

The accuracy at budget B is the mean accuracy over the whole test set of answers
calibrated for B queries (each test point is one query; the expected accuracy of
B such answers is the same whether B is smaller or larger than the test set);
the ``noise_scale`` column is the float32 scale of those answers (0 for private
training).

For comparison only, ``subsample_aggregate_paper_beta`` (not in the default
methods) is subsample-and-aggregate at delta = 0 with the paper's printed
``beta = eps/B``: its answers are ``2 eps``-DP, not ``eps``-DP; it measures how
much of the paper's delta = 0 advantage of subsample-and-aggregate comes from
that factor of two.

One neighbouring relation per figure (``config.neighbouring``). The paper's
proofs use two: model sensitivity (Lemma 1, hence prediction sensitivity) and
subsample-and-aggregate (one replaced example changes one teacher) are
replace-one; loss perturbation (App. B.2) and DP-SGD are add/remove. Under
ONE relation:

* ``"replace_one"`` (default): every method; loss perturbation with its
  replace-one constants (``||b' - b|| <= 2K``: half the paper's beta, see
  :mod:`jaxdp.training.objective_perturbation`) and DP-SGD accounted by the PLD
  of the replace-one subsampled Gaussian (:mod:`jaxdp.accounting.dpsgd_accounting`);
* ``"add_remove"``: the methods with an add/remove proof: loss perturbation
  with the paper's constants (``neighbouring="add_remove"``: ``l2_reg = 0`` and
  ``rho = lambda N + 2LC/eps``, the same objective as the replace-one fit at
  lambda) and DP-SGD (RDP). Model and prediction sensitivity calibrate to a
  replace-one sensitivity, and subsample-and-aggregate's partition of the row
  indices moves under an insertion, so they are refused under this relation.

Where this differs from the paper's reference code (which we have not read
into ours; the differences are stated in the issue and checked in our tests):
subsample-and-aggregate answers are eps-DP (half the paper's ``beta``), DP-SGD
clips the whole per-example gradient (one norm, as the accountant assumes) and
samples Poisson batches (as the accountant assumes).

Protocol (Sec. 4.1): hyper-parameters -- lambda (model sensitivity, loss
perturbation, prediction sensitivity, the teachers of subsample-and-aggregate),
the clip norm and learning rate of DP-SGD -- are chosen on a held-out part of
the training set over the config's grids (``val_seeds`` noise draws per
candidate); then ``num_seeds`` (paper: 100) releases with fresh noise are made
from the whole training set in one batched call (the non-private parts -- the
certified minimiser, the teachers' votes -- computed once) and scored on the
test set: mean and s.d. over the draws.

Work shared between points is done once per dataset variant (N, D, C): the
non-private minimiser for each (split, lambda), certified in float64 within
``tol/lambda`` (:func:`jaxdp.training.output_perturbation.certified_fit`), to
which model sensitivity only adds its calibrated noise (exactly
:func:`jaxdp.training.output_perturbation.model_sensitivity` per call:
:func:`~jaxdp.training.output_perturbation.output_perturbation_calibration` with
``solver_tol = tol`` and
:func:`~jaxdp.training.output_perturbation.add_noise_float64`), from which
loss perturbation's perturbed solves start (``warm_start``: the release is
certified within ``tol/Lambda`` of the exact perturbed minimiser whatever the
start, so the guarantee is unchanged; :mod:`jaxdp.training.objective_perturbation`),
and whose logits prediction sensitivity perturbs; and the teachers' votes.
Every random key is derived from what it is drawn for (the point, the split,
the candidate: :class:`_Keys`), never from the grid or from what was already
computed, so a resumed run gives the same numbers as an uninterrupted one.

Selection (``config.selection``). ``"none"`` (the paper's protocol, the
default): the selection is NOT private and NOT accounted for: the candidates
are trained at the full ``(epsilon, delta)`` and the winner is the ``argmax``
of their accuracies on held-out rows of the private training set, a
non-private function of those rows; the reported ``(epsilon, delta)`` covers
the final release only.

``"repeat_and_select"`` (also ``--config.account_selection=True``) makes the
whole protocol ``(epsilon, delta)``-DP with private hyper-parameter tuning
(Papernot & Steinke 2022, ICLR, Algorithm 1; :func:`jaxdp.tuning.repeat_and_select`):
K runs, K drawn from ``LogarithmicRepetitions(config.repetitions)`` (E[K] =
``config.repetitions``; K is never released), each run drawing a candidate
uniformly, training it on the non-held-out rows at ``eps_fit`` with its pure
(delta = 0) calibration and scoring it on the held-out rows with
:func:`jaxdp.tuning.private_accuracy` (Laplace on the count of correct answers,
sensitivity 1, at ``eps_score``); the best run's MODEL is the release (its test
accuracy is reported). One run is ``eps_run = eps_fit + eps_score``-DP (basic
composition; ``eps_score = score_fraction * eps_run``) and the whole search is
``RepeatAndSelectDpEvent(run, E[K], shape 0)``: for delta = 0, ``2 eps_run``-DP
(PS22 Thm 2 with eta = 0, lambda -> inf), so ``eps_run = eps / 2``; for
delta > 0, ``eps_run`` is the largest value whose event the accountant
(``auto``: the smaller of the pure bound and the RDP conversion of PS22 Thm 2)
bounds by ``(eps, delta)`` (bisection). Each search is spent on its own
``PrivacyAccountant`` and checked against the point's ``(eps, delta)``. Private
training methods with a pure calibration only (model sensitivity, loss
perturbation); the others are refused.

``"composition"``, for comparison, accounts the selection by basic composition
(Dwork & Roth 2014, Thm. 3.16; derivation in :mod:`jaxdp.training.selection`):
with ``C`` candidates and ``V = val_seeds``, the ``C V`` candidate releases
(trained on the non-held-out rows; a private-prediction candidate answers
exactly B held-out queries, the answers it is calibrated for), the final
release (all rows) and the selection each get one share, ``epsilon / (C V +
2)``; delta is split over the ``C V + 1`` releases that have one, ``delta / (C
V + 1)`` (the selection is pure DP). The selection is
:func:`jaxdp.training.private_argmax`, the exponential mechanism over the
candidates' numbers of correct held-out answers summed over their V draws
(sensitivity V under replace-one: one held-out row changes each draw's count
by at most 1; equivalently mean accuracies with sensitivity ``1/n_val``). The
scores themselves are never published: the row's ``nonprivate_val_accuracy``
(the chosen candidate's mean held-out accuracy) is a non-private diagnostic
(NaN under repeat-and-select, where no run's score leaves the search).

Figures (``configs/tradeoffs.py``): ``fig1`` accuracy vs epsilon (B = 100,
delta in {0, 1e-5}); ``fig2`` vs B (epsilon = 1); ``fig3`` vs delta; ``fig4`` vs
N (MNIST subsets: the 1M-image InfiMNIST set of the paper is not available
offline: beyond MNIST's 60,000 the training set is extended with translated
copies of its images, :func:`shifted_copies`, labelled "augmented" in the
results); ``fig5a`` vs D (PCA); ``fig5b`` vs C
(the first C digits); ``fig6a`` loss perturbation vs lambda; ``fig6b``
subsample-and-aggregate vs T.

Output: ``<out_dir>/tradeoffs_<figure>/<dataset>/`` (``<dataset>_n<N>``,
``_pca<D>`` when ``n_train`` / ``pca_dims`` are set; runs from any directory,
``out_dir`` is relative to the current one): ``points.jsonl`` (every finished
point appended, flushed and fsync'd, as it completes; re-running the same
command resumes, skipping the points already there:
:class:`jaxdp.results_io.PointLog`), ``results.csv`` (rewritten after each
point), ``results.json`` (the resolved config, the rows, and per dataset
variant its split sizes and the time of its certified fits) and
``<figure>.png`` (the paper's layout: one panel per delta, one line per method,
shaded +-1 s.d.).
"""

from __future__ import annotations

import copy
import functools
import math
import pathlib
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app
from ml_collections import config_flags
from tqdm import tqdm

from jaxdp import data as jdata
from jaxdp import prediction as jpred
from jaxdp import mechanisms as jmech
from jaxdp import results_io
from jaxdp import tuning as jtuning
from jaxdp.accounting import PrivacyAccountant, events as jevents
from jaxdp.mechanisms import noise_scale_as
from jaxdp import dpsgd as jdpsgd
from jaxdp.training import objective_perturbation, output_perturbation
from jaxdp.training import selection as jselection

_HERE = pathlib.Path(__file__).resolve().parent
CONFIG_FILE = _HERE.parent / "configs" / "tradeoffs.py"


class _Keys:
  """Fresh ``jax.random`` keys that depend only on what they are for.

  ``keys.for_(tag, ...)`` is ``fold_in(root, point_seed(tag))``: the same tag
  always gives the same key, different tags independent keys, whatever else the
  run computes (so resumed runs reproduce uninterrupted ones). Each tag is used
  for one draw only.
  """

  def __init__(self, seed: int):
    self._root = jax.random.key(seed)

  def for_(self, *tag, num: int | None = None) -> jax.Array:
    key = jax.random.fold_in(self._root, results_io.point_seed(tag))
    return key if num is None else jax.random.split(key, num)


@jax.jit
def _accuracies(weights, x, y):
  """Accuracy of each model in a ``(M, D, C)`` stack."""
  return jax.vmap(lambda w: jnp.mean(jnp.argmax(x @ w, axis=-1) == y))(weights)


@functools.partial(jax.jit, static_argnames="noise")
def _noisy_logit_accuracies(keys, logits, y, scale, noise):
  """Accuracy of argmax(noisy logits) per key: one fresh noise vector per query and key."""
  def one(key):
    return jnp.mean(jnp.argmax(jpred.noisy_logits(key, logits, noise, scale), axis=-1) == y)
  return jax.vmap(one)(keys)


@jax.jit
def _aggregation_accuracies(keys, votes, y, beta):
  """Accuracy of exponential-mechanism vote aggregation per key."""
  return jax.vmap(lambda k: jnp.mean(jpred.aggregate_exponential(k, votes, beta) == y))(keys)


class _NonPrivateFits:
  """Certified non-private minimisers, one per (split, lambda), computed on first use.

  Each is :func:`jaxdp.training.output_perturbation.certified_fit`: certified in
  float64 within ``tol/lambda`` of the exact minimiser (repaired, never refused,
  when L-BFGS stops short: refusing a fit would depend on the data), the point
  model sensitivity adds its noise to and prediction sensitivity's
  ``2 tol/lambda`` slack refers to.
  """

  def __init__(self, splits, num_classes, config):
    self._splits, self._c, self._config, self._cache = splits, num_classes, config, {}
    self.seconds = 0.0

  def certified(self, split: str, l2_reg: float) -> np.ndarray:
    """Float64 certified weights ``(D, C)``."""
    if (split, l2_reg) not in self._cache:
      start = time.time()
      x, y = self._splits[split]
      _, cert = output_perturbation.certified_fit(
          x, y, num_classes=self._c, l2_reg=l2_reg, max_iter=self._config.max_iter,
          tol=self._config.tol)
      self._cache[split, l2_reg] = cert.weights
      self.seconds += time.time() - start
    return self._cache[split, l2_reg]

  def __call__(self, split: str, l2_reg: float) -> jax.Array:
    """Float32 certified weights ``(D, C)``."""
    return jnp.asarray(self.certified(split, l2_reg), jnp.float32)


_AMP_FRACTION = 0.01  # loss_perturbation's default share of epsilon for the output noise (AMP)


def private_models(method, keys, split, l2_reg, eps, delta, *, splits, fits, num_classes, config):
  """``(M, D, C)`` weights of ``method`` on ``split`` (``"fit"`` or ``"full"``), one per key.

  ``non_private`` (one model), ``model_sensitivity`` or ``loss_perturbation``
  under ``config.neighbouring`` (module docstring).
  """
  x, y = splits[split]
  if method == "non_private":
    return fits(split, l2_reg)[None]
  if method == "model_sensitivity":
    # = output_perturbation.model_sensitivity(keys, x, y, ...), sharing the certified fit across
    # points: Alg. 1 (delta = 0) / Alg. 3 (delta > 0), Delta = 2K/(N lambda) + 2 tol/lambda.
    cal = output_perturbation.output_perturbation_calibration(
        num_examples=int(x.shape[0]), l2_reg=l2_reg, epsilon=eps, delta=delta,
        solver_tol=config.tol)
    return output_perturbation.add_noise_float64(keys, fits.certified(split, l2_reg), cal)
  if method == "loss_perturbation":
    # Approximate Minima Perturbation, certified within objective_tol/Lambda in float64
    # (objective_tol < 0: the AMP default, output noise ~1% of the objective noise).
    init = fits(split, l2_reg) if config.warm_start else None
    if config.neighbouring == "add_remove":
      # Paper 000 App. B.2 (add/remove): l2_reg = 0 and rho = lambda N + 2LC/eps_1, with
      # eps_1 = (1 - amp_fraction) eps the objective's share under AMP: the same mean
      # objective as the replace-one fit at lambda (extra_l2 = rho / N).
      eps_objective = (1.0 - _AMP_FRACTION) * eps
      relaxed = dict(l2_reg=0.0, neighbouring="add_remove", amp_fraction=_AMP_FRACTION,
                     rho=float(l2_reg * x.shape[0] + objective_perturbation.loss_perturbation_rho(
                         eps_objective, num_classes)))
    else:
      relaxed = dict(l2_reg=l2_reg)
    return objective_perturbation.loss_perturbation(
        keys, x, y, num_classes=num_classes, epsilon=eps, delta=delta,
        batch_mode=config.batch_mode, max_iter=config.max_iter,
        tol=config.objective_tol if config.objective_tol > 0 else None, init_weights=init,
        **relaxed).weights
  raise ValueError(f"private_models: unknown method {method!r}.")


def _ps_solver_tol(config) -> float:
  """Distance slack of the float32 certified weights, as ``PredictionSensitivityPredictor``.

  ``tol`` (certified, :class:`_NonPrivateFits`) plus ``2^-24 (K + tol)`` for rounding the
  certified float64 point (``||theta|| <= (K + tol)/lambda``) to float32, so
  ``Delta = 2K/(N lambda) + 2 solver_tol/lambda`` (paper 000 Lemma 1 plus strong convexity).
  """
  return config.tol + 2.0 ** -24 * (jpred.SOFTMAX_LIPSCHITZ + config.tol)


def _prediction_noise(method, eps, delta, budget, n, l2_reg, config):
  """``(noise, float32 scale)`` of a private-prediction method's answers for ``budget`` queries.

  Rounded to float32 towards more noise (:func:`jaxdp.mechanisms.noise_scale_as`):
  the rates ``beta`` of the L2-Laplace and of the exponential mechanism down, the
  Gaussian sigma up.
  """
  if method == "prediction_sensitivity":
    cal = jpred.calibrate_prediction_sensitivity(eps, delta, budget, n, l2_reg,
                                                 jpred.SOFTMAX_LIPSCHITZ,
                                                 method=config.gaussian_method,
                                                 solver_tol=_ps_solver_tol(config))
    return cal.noise, noise_scale_as(cal.scale, jnp.float32, round_up=cal.noise != "l2_laplace")
  if method == "subsample_aggregate":
    beta = jpred.exponential_aggregation_beta(eps, delta, budget)
  elif method == "subsample_aggregate_paper_beta":
    beta = eps / budget  # paper 000 Thm. 7 as printed: beta = eps/B, which is (2 eps)-DP
  else:
    raise ValueError(f"_prediction_noise: {method!r} is not a private-prediction method.")
  return "exponential", noise_scale_as(beta, jnp.float32, round_up=False)


TRAINING = ("model_sensitivity", "loss_perturbation", "dpsgd")
PREDICTION = ("prediction_sensitivity", "subsample_aggregate", "subsample_aggregate_paper_beta")
METHODS = ("non_private",) + TRAINING + PREDICTION
AXES = ("epsilon", "delta", "budget", "n_train", "pca_dims", "num_classes", "l2_reg",
        "num_teachers")
LABELS = dict(non_private="non-private", model_sensitivity="model sensitivity",
              loss_perturbation="loss perturbation", dpsgd="DP-SGD",
              prediction_sensitivity="prediction sensitivity",
              subsample_aggregate="subsample-and-aggregate",
              subsample_aggregate_paper_beta="subsample-and-aggregate, paper's β = ε/B (2ε-DP)")
# Config fields that change a point's result (the grid only selects points).
RESULT_FIELDS = ("dataset", "l2_regs", "validation_fraction", "num_seeds", "val_seeds",
                 "max_iter", "tol", "objective_tol", "warm_start", "gaussian_method",
                 "account_selection", "seed", "neighbouring")
RELATIONS = ("replace_one", "add_remove")
SELECTIONS = ("none", "composition", "repeat_and_select")
# Methods whose run has a pure (delta = 0) calibration: repeat-and-select trains them.
REPEAT_AND_SELECT_METHODS = ("non_private", "model_sensitivity", "loss_perturbation")
ADD_REMOVE_METHODS = ("non_private", "loss_perturbation", "dpsgd")
# Fields that take presets[dataset] (else presets["digits"]) when left at these values.
PRESET_FIELDS = {"axis_values": (), "epsilons": (), "l2_regs": (), "num_teachers": 0, "num_seeds": 0,
                 "val_seeds": 0, "objective_tol": 0.0}
# A point: (method, epsilon, delta, budget, n_train, pca_dims, num_classes, l2_reg, num_teachers).
FIELDS = ("method",) + AXES


def _normalise(method, s):
  """The settings of ``method`` that matter, the others set to a fixed value (shared points)."""
  s = dict(s)
  if method == "non_private":
    s.update(epsilon=math.inf, delta=0.0)
  if method not in PREDICTION:
    s["budget"] = 0  # private training is flat in B
  if method not in ("subsample_aggregate", "subsample_aggregate_paper_beta"):
    s["num_teachers"] = 0
  if method == "dpsgd":
    s["l2_reg"] = 0.0  # paper 000 Sec. 4.1: DP-SGD without L2 regularisation
  return tuple([method] + [s[a] for a in AXES])


def resolve_config(config):
  """A copy of ``config`` with the empty :data:`PRESET_FIELDS` filled from its dataset's preset."""
  config = copy.deepcopy(config)
  presets = config.presets.to_dict()
  preset = presets.get(config.dataset, presets["digits"])
  with config.unlocked():
    for field, empty in PRESET_FIELDS.items():
      value = config[field]
      if (tuple(value) if isinstance(value, (tuple, list)) else value) == empty:
        config[field] = tuple(preset[field]) if isinstance(empty, tuple) else preset[field]
    if not config.dpsgd.epochs:
      config.dpsgd.epochs = float(preset["dpsgd_epochs"])
  if config.num_seeds < 1 or config.val_seeds < 1:
    raise ValueError(f"config.num_seeds and config.val_seeds must be >= 1, got "
                     f"{config.num_seeds}, {config.val_seeds}.")
  with config.unlocked():
    config.selection = selection_mode(config)
  if config.selection == "repeat_and_select":
    if not (math.isfinite(float(config.repetitions)) and float(config.repetitions) > 1.0):
      raise ValueError(f"config.repetitions (E[K] of the logarithmic law) must be finite and "
                       f"> 1, got {config.repetitions!r}.")
    if not 0.0 < float(config.score_fraction) < 1.0:
      raise ValueError(f"config.score_fraction must be in (0, 1), got {config.score_fraction!r}.")
  return config


def selection_mode(config) -> str:
  """``config.selection``, or from ``account_selection`` when it is empty (module docstring)."""
  mode = config.get("selection", "") or ""
  accounted = bool(config.get("account_selection", False))
  if not mode:
    return "repeat_and_select" if accounted else "none"
  if mode not in SELECTIONS:
    raise ValueError(f"config.selection must be one of {SELECTIONS} (or empty), got {mode!r}.")
  if accounted and mode == "none":
    raise ValueError("config.account_selection=True contradicts config.selection='none'; set "
                     f"one of them (selection: {SELECTIONS}).")
  return mode


def teacher_grid(config) -> tuple[int, ...]:
  """Subsample-and-aggregate's candidate T: ``config.num_teachers_grid``, else ``num_teachers``."""
  values = tuple(config.num_teachers_grid) or (config.num_teachers,)
  if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 1 for t in values):
    raise ValueError(f"config.num_teachers_grid (else config.num_teachers) must hold integers "
                     f">= 1, got {values!r}.")
  return tuple(dict.fromkeys(values))


def _fixed_teachers(config) -> int:
  """A point's T: the one candidate, or 0 (chosen on the held-out split from the grid)."""
  teachers = teacher_grid(config)
  return teachers[0] if len(teachers) == 1 else 0


def grid(config) -> list[tuple]:
  """The figure's points in plotting order (duplicates shared, DP-SGD only for delta > 0)."""
  unknown = set(config.methods) - set(METHODS)
  if unknown:
    raise ValueError(f"config.methods must be a subset of {METHODS}, got {sorted(unknown)}.")
  if config.axis not in AXES:
    raise ValueError(f"config.axis must be one of {AXES}, got {config.axis!r}.")
  if config.neighbouring not in RELATIONS:
    raise ValueError(f"config.neighbouring must be one of {RELATIONS}, got "
                     f"{config.neighbouring!r}.")
  if config.neighbouring == "add_remove":
    refused = sorted(set(config.methods) - set(ADD_REMOVE_METHODS))
    if refused:
      raise ValueError(
          f"config.methods {refused} have no add/remove calibration (model and prediction "
          "sensitivity calibrate to the replace-one sensitivity of Lemma 1; "
          "subsample-and-aggregate's partition moves under an insertion): with "
          f"config.neighbouring='add_remove' use a subset of {ADD_REMOVE_METHODS}.")
  if selection_mode(config) == "repeat_and_select":
    refused = sorted(set(config.methods) - set(REPEAT_AND_SELECT_METHODS))
    if refused:
      raise ValueError(
          f"config.methods {refused}: config.selection='repeat_and_select' trains private "
          "models with a pure (delta = 0) calibration and releases the best run's model; use a "
          f"subset of {REPEAT_AND_SELECT_METHODS}, or selection='composition'.")
  base = dict(budget=int(config.budget), n_train=int(config.n_train),
              pca_dims=int(config.pca_dims), num_classes=int(config.num_classes),
              l2_reg=float(config.l2_reg), num_teachers=_fixed_teachers(config))
  cast = dict(epsilon=float, delta=float, budget=int, n_train=int, pca_dims=int,
              num_classes=int, l2_reg=float, num_teachers=int)[config.axis]
  points = []
  for method in config.methods:
    for delta in config.deltas:
      for eps in config.epsilons:
        for v in config.axis_values:
          s = dict(base, epsilon=float(eps), delta=float(delta))
          s[config.axis] = cast(v)
          if method == "dpsgd" and s["delta"] == 0.0:
            continue  # DP-SGD has no delta = 0 analysis (paper 000 Sec. 4.2)
          if method == "subsample_aggregate_paper_beta" and s["delta"] > 0.0:
            continue  # the comparison is for the paper's delta = 0 calibration (Thm. 7)
          points.append(_normalise(method, s))
  return list(dict.fromkeys(points))


def shifted_copies(x, y, n_total, seed, side=28, max_shift=2):
  """``x`` plus ``n_total - len(x)`` translated copies: a stand-in for InfiMNIST (Fig. 4).

  Paper 000 Fig. 4 goes to N = 1M with InfiMNIST (Loosli et al. 2007: elastic
  deformations and translations of MNIST digits), which is not available
  offline. Copy ``i`` is training image ``perm[i mod N]`` shifted by a random
  ``(dy, dx)`` in ``[-max_shift, max_shift]^2`` other than ``(0, 0)``, zero
  filled (an image of ``side x side`` pixels; row norms can only shrink, so
  the unit-ball bound still holds). The privacy unit is then one GENERATED
  image, as in the paper's InfiMNIST runs: one original MNIST image influences
  up to ``ceil(n_total / N)`` examples (group privacy).
  """
  n = len(y)
  extra = n_total - n
  if extra <= 0:
    return x, y
  if x.shape[1] != side * side:
    raise ValueError(f"shifted copies need raw {side}x{side} images (pca_dims = 0), got "
                     f"{x.shape[1]} features.")
  rng = np.random.default_rng(seed)
  src = np.resize(rng.permutation(n), extra)
  shifts = [(dy, dx) for dy in range(-max_shift, max_shift + 1)
            for dx in range(-max_shift, max_shift + 1) if (dy, dx) != (0, 0)]
  which = rng.integers(0, len(shifts), size=extra)
  imgs = x.reshape(n, side, side)
  pad = np.pad(imgs, ((0, 0), (max_shift, max_shift), (max_shift, max_shift)))
  out = np.empty((extra, side, side), x.dtype)
  for k, (dy, dx) in enumerate(shifts):
    sel = np.flatnonzero(which == k)
    out[sel] = pad[src[sel], max_shift + dy:max_shift + dy + side,
                   max_shift + dx:max_shift + dx + side]
  return (np.concatenate([x, out.reshape(extra, -1)]), np.concatenate([y, y[src]]))


class _Problem:
  """One dataset variant (N, D, C): splits, certified fits and teacher votes, computed once."""

  def __init__(self, config, n_train, pca_dims, num_classes):
    load = lambda n: jdata.load(config.dataset, data_dir=config.data_dir or None, n_train=n,
                                seed=config.seed, pca_dims=pca_dims or None,
                                num_classes=num_classes if num_classes else None,
                                unit_ball="project")
    self.augmented = False
    try:
      ds = load(n_train or None)
    except ValueError:  # n_train larger than the training set: the InfiMNIST stand-in below
      ds = load(None)
      if not n_train > len(ds.y_train):
        raise
      self.augmented = True
    x, y = np.asarray(ds.x_train, np.float32), np.asarray(ds.y_train, np.int32)
    if self.augmented:  # beyond the training set: translated copies (InfiMNIST stand-in)
      x, y = shifted_copies(x, y, int(n_train), config.seed)
    self.num_classes = int(ds.num_classes)
    perm = np.random.default_rng(config.seed).permutation(len(y))
    n_val = int(round(config.validation_fraction * len(y)))
    val, fit = perm[:n_val], perm[n_val:]
    self.splits = {"fit": (x[fit], y[fit]), "full": (x, y)}
    self.eval = {"fit": (jnp.asarray(x[val]), jnp.asarray(y[val])),
                 "full": (jnp.asarray(ds.x_test), jnp.asarray(ds.y_test))}
    self.n = {"fit": len(fit), "full": len(y)}
    self.num_features = int(x.shape[1])
    self.fits = _NonPrivateFits(self.splits, self.num_classes, config)
    self.config = config
    self._votes = {}

  def summary(self) -> dict:
    """Sizes of this variant's splits and the time spent on its certified fits."""
    return dict(n_train=self.n["full"], n_fit=self.n["fit"],
                n_val=int(self.eval["fit"][1].shape[0]), n_test=int(self.eval["full"][1].shape[0]),
                num_features=self.num_features, num_classes=self.num_classes,
                augmented=self.augmented, seconds_nonprivate_fits=self.fits.seconds)

  def votes(self, split, t, lam, keys):
    """``(num_eval, C)`` vote counts of ``t`` teachers (lambda ``lam``) on the eval set of ``split``."""
    if (split, t, lam) not in self._votes:
      xs, ys = self.splits[split]
      teachers = jpred.train_linear_teachers(
          xs, ys, num_teachers=int(t), num_classes=self.num_classes, l2_reg=lam,
          key=keys.for_("teachers", split, int(t), lam), max_iter=self.config.max_iter,
          tol=self.config.tol).weights
      self._votes[split, t, lam] = jpred.linear_teacher_votes(teachers, self.eval[split][0])
    return self._votes[split, t, lam]


# Names of the accounted selection protocols, fingerprinted (results_io) with their points: a
# protocol's rows are never resumed as rows of another (a changed protocol gets a new name).
ACCOUNTED_SELECTION = "exponential_mechanism_on_correct_counts_v2"
REPEAT_AND_SELECT = "repeat_and_select_logarithmic_v1"


def _accounts_selection(eps, candidates, config):
  return selection_mode(config) == "composition" and candidates > 1 and not math.isinf(eps)


def _repeats(eps, candidates, config):
  return selection_mode(config) == "repeat_and_select" and candidates > 1 and not math.isinf(eps)


def _run_event(eps_run, config):
  """One run's DpEvent: the pure release at ``eps_fit`` then the Laplace score at ``eps_score``."""
  relation = config.neighbouring
  eps_score = float(config.score_fraction) * eps_run
  return jevents.ComposedDpEvent([
      jevents.PureDpEvent(eps_run - eps_score, neighbouring=relation),
      jmech.laplace_mechanism_event(1.0, eps_score, neighbouring=relation)])


def _search_epsilon(eps_run, delta, config) -> float:
  """The accountant's epsilon at ``delta`` of the whole search with runs of ``eps_run``."""
  acc = PrivacyAccountant(config.neighbouring)
  acc.spend(jtuning.LogarithmicRepetitions(float(config.repetitions)).event(
      _run_event(eps_run, config)))
  return float(acc.get_epsilon(delta))


def run_epsilon(eps, delta, config) -> float:
  """The per-run epsilon whose repeat-and-select event meets the point's ``(eps, delta)``.

  Logarithmic K (shape 0) and a pure run: ``2 eps_run`` (PS22 Thm 2, lambda -> inf), so
  ``eps / 2`` at any delta; for delta > 0 the largest ``eps_run`` in ``[eps/2, eps]`` that
  the accountant bounds by ``eps`` (bisection, 40 steps; the RDP conversion helps at large
  eps only).
  """
  lo = eps / 2.0
  if _search_epsilon(lo, delta, config) > eps * (1 + 1e-9):
    raise AssertionError(f"the pure bound 2 eps_run does not hold for eps={eps}")
  if delta == 0.0:
    return lo
  hi = eps
  if _search_epsilon(hi, delta, config) <= eps:
    return hi
  for _ in range(40):
    mid = 0.5 * (lo + hi)
    if _search_epsilon(mid, delta, config) <= eps:
      lo = mid
    else:
      hi = mid
  return lo


def _repeat_and_select_point(point, prob, cands, keys, config):
  """``num_seeds`` private searches (jaxdp.tuning.repeat_and_select); the best run's model each.

  Returns ``(test accuracies, chosen candidate indices, eps_fit, eps_score)``.
  """
  s = dict(zip(FIELDS, point))
  method, eps, delta = s["method"], s["epsilon"], s["delta"]
  eps_run = run_epsilon(eps, delta, config)
  per_run = _run_event(eps_run, config)
  eps_score = float(config.score_fraction) * eps_run
  eps_fit = eps_run - eps_score
  score_event = jevents.event_to_dict(per_run.events[1])
  law = jtuning.LogarithmicRepetitions(float(config.repetitions))
  xv, yv = prob.eval["fit"]
  xt, yt = prob.eval["full"]

  def mechanism(run_key, index):
    k_fit, k_score = jax.random.split(run_key)
    w = private_models(method, k_fit[None], "fit", cands[index]["l2_reg"], eps_fit, 0.0,
                       splits=prob.splits, fits=prob.fits, num_classes=prob.num_classes,
                       config=config)[0]
    preds = jnp.argmax(xv @ w, axis=-1)
    score, ev = jtuning.private_accuracy(k_score, preds, yv, epsilon=eps_score,
                                         neighbouring=config.neighbouring)
    if jevents.event_to_dict(ev) != score_event:
      raise RuntimeError("the score's event differs from the planned one.")
    return w, score, per_run

  accs, chosen = [], []
  for seed in range(int(config.num_seeds)):
    acc = PrivacyAccountant(config.neighbouring)
    out = jtuning.repeat_and_select(keys.for_(*point, "search", seed), mechanism,
                                    list(range(len(cands))), repetitions=law, event=per_run,
                                    accountant=acc)
    spent = float(acc.get_epsilon(delta))
    if not spent <= eps * (1 + 1e-9):
      raise AssertionError(f"the search spent epsilon {spent} > {eps} at delta {delta}")
    accs.append(float(jnp.mean(jnp.argmax(xt @ out.release, axis=-1) == yt)))
    chosen.append(int(out.candidate))
  return np.asarray(accs), chosen, eps_fit, eps_score


def _split_budget(eps, delta, candidates, config):
  """``(eps_release, delta_release, eps_selection)`` of one point.

  Not accounted (the paper's protocol, or nothing to select): every release at
  the total ``(eps, delta)``, ``eps_selection = None`` (np.argmax). Accounted:
  ``C V`` candidate releases + 1 final release at ``(eps/k, delta/(k-1))`` and
  the selection (pure DP) at ``eps/k``, ``k = C V + 2``: the shares sum to
  ``(eps, delta)`` (basic composition, Dwork & Roth 2014 Thm. 3.16).
  """
  if not _accounts_selection(eps, candidates, config):
    return eps, delta, None
  releases = candidates * config.val_seeds + 1
  k = releases + 1
  return eps / k, delta / releases, eps / k


def _dpsgd_models(keys, prob, split, eps, delta, clip, lr, config):
  x, y = prob.splits[split]
  d = config.dpsgd
  replace = config.neighbouring == "replace_one"
  return jdpsgd.linear_dpsgd(
      keys, x, y, num_classes=prob.num_classes, epsilon=eps, delta=delta, epochs=d.epochs,
      expected_batch_size=min(float(d.expected_batch_size), len(y) / 10.0), l2_clip_norm=clip,
      learning_rate=lr, momentum=d.momentum, batch_mode=config.batch_mode,
      neighbouring=config.neighbouring, accountant="pld" if replace else "rdp").weights


def _eval_set(method, prob, split, budget, config):
  """The rows a release of ``split`` is scored on (held-out rows for ``"fit"``, else test)."""
  xe, ye = prob.eval[split]
  if split == "fit" and selection_mode(config) == "composition" and method in PREDICTION:
    xe, ye = xe[:budget], ye[:budget]  # an accounted candidate answers exactly B queries
  return xe, ye


def _release_accuracies(method, keys, prob, split, eps, delta, budget, hyper, config, rng_keys):
  """Accuracies (one per key) on the eval set of ``split`` of ``method`` with ``hyper``."""
  xe, ye = _eval_set(method, prob, split, budget, config)
  n = prob.n[split]
  if method == "non_private":
    return _accuracies(prob.fits(split, hyper["l2_reg"])[None], xe, ye)
  if method in ("model_sensitivity", "loss_perturbation"):
    w = private_models(method, keys, split, hyper["l2_reg"], eps, delta, splits=prob.splits,
                       fits=prob.fits, num_classes=prob.num_classes, config=config)
    return _accuracies(w, xe, ye)
  if method == "dpsgd":
    w = _dpsgd_models(keys, prob, split, eps, delta, hyper["clip"], hyper["lr"], config)
    return _accuracies(w, xe, ye)
  if method in PREDICTION:
    noise, scale = _prediction_noise(method, eps, delta, budget, n, hyper["l2_reg"], config)
    if method == "prediction_sensitivity":
      logits = xe @ prob.fits(split, hyper["l2_reg"])
      return _noisy_logit_accuracies(keys, logits, ye, scale, noise)
    votes = prob.votes(split, hyper["num_teachers"], hyper["l2_reg"], rng_keys)[:ye.shape[0]]
    return _aggregation_accuracies(keys, votes, ye, scale)
  raise ValueError(f"unknown method {method!r}")


def _candidates(method, point, config):
  """Hyper-parameter candidates of a point (a fixed value on the figure's axis is not tuned)."""
  s = dict(zip(FIELDS, point))
  lams = [s["l2_reg"]] if s["l2_reg"] > 0 else [float(v) for v in config.l2_regs]
  if method == "dpsgd":
    return [dict(clip=float(c), lr=float(lr)) for c in config.dpsgd.clip_norms
            for lr in config.dpsgd.learning_rates]
  if method in ("subsample_aggregate", "subsample_aggregate_paper_beta"):
    teachers = [s["num_teachers"]] if s["num_teachers"] > 0 else list(teacher_grid(config))
    return [dict(num_teachers=t, l2_reg=lam) for t in teachers for lam in lams]
  return [dict(l2_reg=lam) for lam in lams]


def run_point(point, problem, keys, config) -> dict:
  """Hyper-parameters chosen on the held-out split, then ``num_seeds`` test-set releases."""
  start = time.time()
  s = dict(zip(FIELDS, point))
  method, eps, delta, budget = s["method"], s["epsilon"], s["delta"], s["budget"]
  prob = problem(s["n_train"], s["pca_dims"], s["num_classes"])
  cands = _candidates(method, point, config)
  if _repeats(eps, len(cands), config):
    accs, chosen, eps_fit, eps_score = _repeat_and_select_point(point, prob, cands, keys, config)
    lams = [cands[i]["l2_reg"] for i in chosen]
    row = dict(s, num_classes=prob.num_classes, n_train=prob.n["full"], augmented=prob.augmented,
               neighbouring=config.neighbouring, num_features=prob.num_features, kind="training",
               l2_reg=float(max(set(lams), key=lams.count)), num_teachers=0, clip_norm=0.0,
               learning_rate=0.0, release_epsilon=float(eps_fit), release_delta=0.0,
               noise_scale=0.0,
               selection_epsilon=float(eps_score), selection="repeat_and_select",
               chosen_l2_regs=";".join(f"{v:g}" for v in lams),
               repetitions=float(config.repetitions), score_fraction=float(config.score_fraction),
               nonprivate_val_accuracy=float("nan"),
               test_accuracy_mean=float(accs.mean()), test_accuracy_std=float(accs.std()),
               num_draws=int(accs.size), seconds=time.time() - start)
    row["point"] = list(point)
    return row
  eps_r, delta_r, eps_select = _split_budget(eps, delta, len(cands), config)
  num_val = 1 if method == "non_private" else config.val_seeds
  n_val = int(_eval_set(method, prob, "fit", budget, config)[1].shape[0])
  scores, correct = [], []  # per candidate: mean held-out accuracy; correct answers, all draws
  for i, hyper in enumerate(cands):
    accs = _release_accuracies(method, keys.for_(*point, "val", i, num=num_val), prob, "fit",
                               eps_r, delta_r, budget, hyper, config, keys)
    scores.append(float(jnp.mean(accs)))
    # each accuracy is count / n_val: the exact integer counts, summed over the draws
    correct.append(float(np.rint(np.asarray(accs, np.float64) * n_val).sum()))
  if eps_select is not None:
    # Accounted: the exponential mechanism (jaxdp.training.selection). One held-out row
    # changes each draw's count by at most 1 (replace-one), the sum by at most num_val.
    best = int(jselection.private_argmax(keys.for_(*point, "select"), np.asarray(correct),
                                         sensitivity=float(num_val), epsilon=eps_select))
  else:  # the paper's protocol: a non-private argmax, NOT accounted (module docstring)
    best = int(np.argmax(scores)) if len(cands) > 1 else 0
  hyper = cands[best]
  num = 1 if method == "non_private" else config.num_seeds
  accs = np.asarray(_release_accuracies(method, keys.for_(*point, "test", num=num), prob, "full",
                                        eps_r, delta_r, budget, hyper, config, keys), np.float64)
  row = dict(s, num_classes=prob.num_classes, n_train=prob.n["full"], augmented=prob.augmented,
             neighbouring=config.neighbouring,
             num_features=prob.num_features, kind=("prediction" if method in PREDICTION
                                                   else "training"),
             l2_reg=float(hyper.get("l2_reg", 0.0)), num_teachers=int(hyper.get("num_teachers", 0)),
             clip_norm=float(hyper.get("clip", 0.0)), learning_rate=float(hyper.get("lr", 0.0)),
             release_epsilon=float(eps_r), release_delta=float(delta_r),
             noise_scale=float(_prediction_noise(method, eps_r, delta_r, budget, prob.n["full"],
                                                 hyper["l2_reg"], config)[1])
             if method in PREDICTION else 0.0,
             selection_epsilon=float(eps_select) if eps_select is not None else 0.0,
             selection="exponential_mechanism" if eps_select is not None else (
                 "argmax_not_accounted" if len(cands) > 1 else "none"),
             nonprivate_val_accuracy=scores[best] if scores else float("nan"),
             test_accuracy_mean=float(accs.mean()), test_accuracy_std=float(accs.std()),
             num_draws=int(accs.size), seconds=time.time() - start)
  row["point"] = list(point)
  return row


def _uniform(rows):
  """Rows with the same columns, missing ones empty (a repeat-and-select row has columns that
  the other rows lack)."""
  fields = list(dict.fromkeys(k for r in rows for k in r))
  return [{k: r.get(k, "") for k in fields} for r in rows]


def main(config) -> list[dict]:
  start = time.time()
  config = resolve_config(config)
  points = grid(config)
  extra = dict(dpsgd=config.dpsgd.to_dict())
  if config.selection == "composition":  # the protocol's name: no other protocol's rows resume
    extra["selection"] = ACCOUNTED_SELECTION
  elif config.selection == "repeat_and_select":
    extra["selection"] = dict(protocol=REPEAT_AND_SELECT, repetitions=float(config.repetitions),
                              score_fraction=float(config.score_fraction))
  teachers = teacher_grid(config)
  if len(teachers) > 1:  # T chosen per point from this grid (the point's num_teachers is 0)
    extra["num_teachers_grid"] = list(teachers)
  log, out = results_io.open_point_log(config, RESULT_FIELDS, extra_settings=extra)
  todo = [p for p in points if p not in log]
  print(f"{config.name} on {config.dataset}: {len(points) - len(todo)} of {len(points)} points "
        f"already in {out / 'points.jsonl'}", file=sys.stderr)
  keys = _Keys(config.seed)
  problems = {}  # (N, D, C) -> _Problem, built on first use (none if every point is done)

  def problem(n, d, c):
    if (n, d, c) not in problems:
      problems[n, d, c] = _Problem(config, n, d, c)
    return problems[n, d, c]

  bar = tqdm(todo, desc=f"{config.name} {config.dataset}")
  for point in bar:
    bar.set_postfix_str(f"{point[0]} {config.axis}={dict(zip(FIELDS, point))[config.axis]}")
    log.append(point, [run_point(point, problem, keys, config)])
    results_io.write_csv_atomic(out / "results.csv", _uniform([log.get(p)[0] for p in points
                                                                if p in log]))
  rows = [log.get(p)[0] for p in points]
  elapsed = time.time() - start
  results_io.write_csv_atomic(out / "results.csv", _uniform(rows))
  results_io.write_json_atomic(out / "results.json", dict(
      config=config.to_dict(), seconds_this_run=elapsed, points_computed_this_run=len(todo),
      backend=jax.default_backend(), datasets=[p.summary() for p in problems.values()],
      rows=rows))
  figure = out / f"{config.figure}.png"
  plot(rows, config, figure)
  print(f"wrote {out}/results.csv, results.json, {figure.name} ({len(todo)} points computed in "
        f"{elapsed:.1f} s)")
  for r in rows:
    print(f"{r['method']:>22s} ε={r['epsilon']:<6g} δ={r['delta']:<6g} B={r['budget']:<5d} "
          f"N={r['n_train']:<6d} D={r['num_features']:<4d} C={r['num_classes']:<2d} "
          f"λ={r['l2_reg']:<7g} T={r['num_teachers']:<4d} acc={r['test_accuracy_mean']:.4f} ± "
          f"{r['test_accuracy_std']:.4f}")
  return rows


_LOG_AXES = ("epsilon", "delta", "budget", "n_train", "l2_reg", "num_teachers", "pca_dims")
_AXIS_LABEL = dict(epsilon="privacy loss ε", delta="privacy failure probability δ",
                   budget="inference budget B", n_train="training set size N",
                   pca_dims="number of dimensions D (PCA)", num_classes="number of classes C",
                   l2_reg="L2 regularisation λ", num_teachers="number of teachers T")
_COLORS = dict(model_sensitivity="C0", loss_perturbation="C1", dpsgd="C2",
               prediction_sensitivity="C3", subsample_aggregate="C4",
               subsample_aggregate_paper_beta="C5")
_ROW_AXIS = dict(n_train="n_train", pca_dims="num_features")  # the value actually used
# A row's selection protocol (its "selection" column) -> the curve's name and line style.
_SELECTION_OF_ROW = dict(repeat_and_select="repeat_and_select",
                         exponential_mechanism="composition",
                         argmax_not_accounted="none", none="none")
_SELECTION_LABELS = dict(repeat_and_select="repeat-and-select (private)",
                         composition="basic composition (private)",
                         none="selection not accounted (not private)")
_SELECTION_STYLES = dict(repeat_and_select="-", composition="-.", none=":")


def _row_selection(row) -> str:
  return _SELECTION_OF_ROW.get(row.get("selection", "none"), "none")


def _legend_below(fig, axes, note, ncol, rank, fontsize=7):
  """One legend for every panel (entries sorted by ``rank[label]``), below the axes and above
  ``note``; returns its top as a fraction of the figure height, for ``tight_layout``."""
  handles = {}
  for ax in axes:
    for handle, label in zip(*ax.get_legend_handles_labels()):
      handles.setdefault(label, handle)
  handles = dict(sorted(handles.items(), key=lambda item: rank.get(item[0], (math.inf, 0.0))))
  renderer = fig.canvas.get_renderer()
  bottom = note.get_window_extent(renderer).y1 / fig.bbox.height if note is not None else 0.0
  legend = fig.legend(list(handles.values()), list(handles), loc="lower center",
                      bbox_to_anchor=(0.5, bottom + 0.01), ncol=max(1, min(ncol, len(handles))),
                      fontsize=fontsize, frameon=False)
  return legend.get_window_extent(renderer).y1 / fig.bbox.height


def plot(rows, config, path, metadata=None):
  """The paper's layout: one panel per delta (columns), one line per method (and epsilon).

  The legend is below the panels (it never covers a line); on the N axis (Fig. 4) the
  training sets beyond the real one (rows with ``augmented``: translated copies,
  :func:`shifted_copies`) are shaded. ``metadata``: PNG text entries (``savefig``).
  """
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

  axis = config.axis
  panels = [None] if axis == "delta" else [float(d) for d in config.deltas]
  ncol = 2 if len(panels) == 1 else 3
  labels = len(config.methods) * (1 if axis == "epsilon" else len(config.epsilons)) + 1
  fig, axes = plt.subplots(1, len(panels), squeeze=False, figsize=(
      5.5 * len(panels), 4.2 + 0.35 + 0.17 * math.ceil(labels / ncol)))
  xkey = _ROW_AXIS.get(axis, axis)
  flat_axes = ("epsilon", "delta", "budget")  # non-private does not move along these
  single_method = len([m for m in config.methods if m != "non_private"]) == 1
  # Several selection protocols in one figure (accounted-selection curves): one line per
  # (method, protocol), the protocol in the label and the line style.
  modes = [m for m in SELECTIONS[::-1] if any(_row_selection(r) == m for r in rows
                                                if r["method"] != "non_private")]
  mixed = len(modes) > 1
  rank = {}  # legend order: the methods' order, then epsilon (then the protocol)
  for ax, delta in zip(axes[0], panels):
    for method, mode in [(m, md) for m in config.methods
                         for md in (modes if mixed and m != "non_private" else [None])]:
      for eps in ([None] if axis == "epsilon" else config.epsilons):
        rs = [r for r in rows if r["method"] == method
              and (mode is None or _row_selection(r) == mode)
              and (method == "non_private" or delta is None or r["delta"] == delta)
              and (method == "non_private" or eps is None or r["epsilon"] == float(eps))]
        if not rs:
          continue
        if method == "non_private":
          rs = rs[:1]
        color = (f"C{list(config.epsilons).index(eps) % 10}" if single_method and eps is not None
                 else "k" if method == "non_private" else _COLORS[method])
        label = LABELS[method] + ("" if eps is None or len(config.epsilons) == 1
                                  or method == "non_private" else f", ε = {eps:g}")
        if mode is not None:
          label += f", {_SELECTION_LABELS[mode]}"
        rank.setdefault(label, (list(config.methods).index(method), eps or 0.0,
                                modes.index(mode) if mode in modes else 0))
        if method == "non_private" and axis in flat_axes:
          ax.axhline(rs[0]["test_accuracy_mean"], color=color, ls=":", label=label)
          continue
        if method in TRAINING and axis == "budget":
          rs = [dict(rs[0], budget=int(b)) for b in config.axis_values]
        rs = sorted(rs, key=lambda r: r[xkey])
        xs = np.array([r[xkey] for r in rs], float)
        mean = np.array([r["test_accuracy_mean"] for r in rs])
        std = np.array([r["test_accuracy_std"] for r in rs])
        style = ("--" if method in TRAINING and axis == "budget"
                 else ":" if method == "subsample_aggregate_paper_beta"
                 else _SELECTION_STYLES[mode] if mode is not None else "-")
        ax.plot(xs, mean, style, marker="o", ms=3, label=label, color=color)
        ax.fill_between(xs, mean - std, mean + std, color=color, alpha=0.15)
    augmented = sorted({r[xkey] for r in rows if r.get("augmented") is True})
    real = [r[xkey] for r in rows if r.get("augmented") is not True]
    if axis == "n_train" and augmented and real:
      n_real = max(real)
      ax.axvspan(n_real, max(augmented), color="0.85", lw=0, zorder=0,
                 label=f"N > {n_real:,}: augmented (real images + translated copies)")
      ax.axvline(n_real, color="0.4", ls="--", lw=0.8)
    if axis in _LOG_AXES:
      ax.set_xscale("log")
    ax.set_xlabel(_AXIS_LABEL[axis])
    ax.set_ylabel("test accuracy")
    fixed = {"epsilon": f"ε = {config.epsilons[0]:g}" if axis != "epsilon" and
             len(config.epsilons) == 1 else "",
             "delta": "" if delta is None else f"δ = {delta:g}",
             "budget": "" if axis == "budget" else f"B = {config.budget}"}
    ax.set_title(f"{config.dataset}: " + ", ".join(v for v in fixed.values() if v), fontsize=10)
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
  draws = sorted({r["num_draws"] for r in rows if r["method"] != "non_private"})
  selection = ("protocols at the same total (ε, δ): " + "; ".join(
      _SELECTION_LABELS[m] for m in modes) if mixed else dict(
                   repeat_and_select="private, repeat-and-select (Papernot-Steinke 2022)",
                   composition="private, basic composition",
                   none="not accounted, as in the paper")[
                       modes[0] if modes else selection_mode(config)])
  relation = config.get("neighbouring", "replace_one").replace("_", "-")
  note = fig.text(0.5, 0.005, f"Paper 000 {config.figure}. Every method (ε, δ)-DP for {relation} "
                  f"neighbours. Mean test accuracy; bands ±1 s.d. over "
                  f"{'/'.join(map(str, draws)) or '?'} noise draws;\nhyper-parameters chosen on a "
                  f"held-out split ({selection}).", ha="center", va="bottom", fontsize=7)
  top = _legend_below(fig, axes[0], note, ncol, rank)
  fig.tight_layout(rect=(0, top, 1, 1))
  fig.savefig(path, dpi=120, metadata=metadata)
  plt.close(fig)


if __name__ == "__main__":
  _CONFIG = config_flags.DEFINE_config_file("config", f"{CONFIG_FILE}:fig1", "experiment config")
  app.run(lambda argv: main(_CONFIG.value) and None)
