"""Conformance entries of private selection (``jaxdp.training.selection``).

Release point: ``jaxdp.training.private_argmax`` (defined in
``jaxdp.training.selection``), the exponential mechanism over candidates'
scores computed on private held-out rows, e.g. the mean held-out accuracy of
hyper-parameter candidates (``experiments/tradeoffs.py`` with
``account_selection=True``). Its companion ``private_argmax_event`` builds the
DpEvent from public parameters.

Claim (written here from the theorem, not from the library): output ``c`` with
probability ``∝ exp(beta u_c)``, ``beta = eps / (2 Delta)``, is ``eps``-DP for
scores of sensitivity ``Delta`` (McSherry & Talwar 2007 Thm 6; Dwork & Roth
2014 Thm 3.10). Neighbouring: replace-one on the training set. A score is the
mean accuracy over ``n_val = 8`` held-out rows, so ``Delta = 1/n_val = 0.125``
(replacing one held-out row changes one 0/1 term of each candidate's mean;
averaging over independent draws keeps it).

Pairs (worst case first): one held-out row is classified correctly by
candidate 0 only in ``D`` and by every other candidate only in ``D'`` (the
non-monotone case: candidate 0 loses ``Delta`` while the ``C - 1 = 29`` others
gain ``Delta``; ``p(0|D)/p(0|D')`` tends to ``e^{2 beta Delta}`` as ``C``
grows, so with ``C = 30`` it is ``e^{2.864}`` at the claimed ``eps = 3``: the
audit has room to see a 20% smaller noise, ``beta x 1.25``, whose ratio is
``e^{3.55}``); the monotone case (every score moves up); and scores averaged
over ``V = 2`` draws (multiples of ``1/(2 n_val)``) moved by ``1/n_val``.
Scores are exact binary fractions (``k/8``, ``k/16``), so the float32 cast
moves no score by more than ``Delta``. The audit statistic is the indicator of
output 0.
"""

from __future__ import annotations

import numpy as np

import conformance_registry as reg

N_VAL = 8
SENSITIVITY = 1.0 / N_VAL  # replace-one, mean accuracy over N_VAL held-out rows
EPSILON = 3.0
NUM_CANDIDATES = 30
FAST_TRIALS, SLOW_TRIALS = 100_000, 400_000
NAME = "jaxdp.training.private_argmax[selection=held_out_accuracy]"


def selection_pairs():
  """Replace-one pairs of held-out accuracy scores; the non-monotone worst case first."""
  c = NUM_CANDIDATES
  # Candidate 0 classifies the replaced row correctly only in D'... (5/8 -> 4/8 for it,
  # 4/8 -> 5/8 for every other candidate): the audit's pair, candidate 0 loses in D.
  lose = np.full(c, 5.0 / N_VAL).astype(np.float32)
  lose[0] = 4.0 / N_VAL
  gain = np.full(c, 4.0 / N_VAL).astype(np.float32)
  gain[0] = 5.0 / N_VAL
  # Monotone: the replaced row is classified correctly by every candidate only in D'.
  base = (np.arange(c) % N_VAL).astype(np.float32) / N_VAL
  up = base + np.float32(SENSITIVITY)
  # Averaged over V = 2 draws: scores on the 1/16 grid, each moved by 1/8 (both draws'
  # term of the replaced row flips), candidate 1 up, the others down.
  avg = ((np.arange(c) * 3) % 16).astype(np.float32) / 16 + np.float32(2.0 / 16)
  avg_moved = avg - np.float32(SENSITIVITY)
  avg_moved[1] = avg[1] + np.float32(SENSITIVITY)
  return [({"scores": lose}, {"scores": gain}),
          ({"scores": base}, {"scores": up}),
          ({"scores": avg}, {"scores": avg_moved})]


def _release(key, d):
  from jaxdp import training  # pylint: disable=import-outside-toplevel
  return training.private_argmax(key, d["scores"], sensitivity=SENSITIVITY, epsilon=EPSILON)


def _event():
  from jaxdp import training  # pylint: disable=import-outside-toplevel
  return training.private_argmax_event(sensitivity=SENSITIVITY, epsilon=EPSILON)


def _index_vector(out) -> np.ndarray:
  return np.asarray(out, np.float64).ravel()


def _is_first(out) -> float:
  return float(np.asarray(out).ravel()[0] == 0)


reg.register(reg.ReleasePoint(
    name=NAME, family="training", neighbouring="replace_one", unit="example",
    guarantee="eps-DP, exponential mechanism with beta = eps/(2 Delta), Delta = 1/n_val for "
              "mean held-out accuracies (McSherry-Talwar 2007 Thm 6; Dwork-Roth Thm 3.10)",
    epsilon=EPSILON, delta=0.0, pairs=selection_pairs, release=_release,
    vector=_index_vector, event=_event, charged=None, fresh=None, sensitivity=None,
    noise=None,
    audit=reg.AuditSpec(statistic=_is_first, trials=FAST_TRIALS, slow_trials=SLOW_TRIALS),
    support="discrete",
    skip={"charge": "a pure function of a key: spends nothing; the caller spends "
                    "private_argmax_event (experiments/tradeoffs.py composes it)",
          "replay": "not additive: the release is an argmax index",
          "noise": "not additive: the release is an argmax index (its law is tested against "
                   "the exact softmax in tests/training/test_selection.py)"}))

reg.not_a_release_point(
    "jaxdp.training.private_argmax_event",
    "builds the DpEvent from public epsilon and sensitivity; reads no data and releases nothing")


# The accounting of the batch selections combined with adaptive clipping and correlated noise:
# public calibrations and events; the release is PrivateSGD.step of the plan that uses them.
_SELECTION_ACCOUNTING = ("{what} from public (N, B or q, sigma, steps, strategy, delta): "
                         "accounting only; the release is PrivateSGD.step[selection=...]")
for _name, _what in {
    "jaxdp.dpsgd.correlated.accounting.calibrate_fixed_size_mf_noise_multiplier": "sigma",
    "jaxdp.dpsgd.correlated.accounting.fixed_size_adaptive_gradient_noise_multiplier":
        "the gradient share sigma_Delta of sigma (Andrew et al. 2021 Thm 1)",
    "jaxdp.dpsgd.correlated.accounting.fixed_size_mf_epsilon": "epsilon",
    "jaxdp.dpsgd.correlated.accounting.fixed_size_mf_event": "the run's DpEvent",
    "jaxdp.dpsgd.fixed_size_sampling.FixedSizeSampler.adaptive_event": "the step's DpEvent",
    "jaxdp.dpsgd.fixed_size_sampling.FixedSizeSampler.adaptive_gradient_noise_multiplier":
        "sigma_Delta",
    "jaxdp.dpsgd.fixed_size_sampling.FixedSizeSampler.calibrate_mf_noise_multiplier": "sigma",
    "jaxdp.dpsgd.fixed_size_sampling.FixedSizeSampler.mf_epsilon": "epsilon",
    "jaxdp.dpsgd.fixed_size_sampling.FixedSizeSampler.mf_event": "the run's DpEvent",
    "jaxdp.dpsgd.fixed_size_sampling.adaptive_dpsgd_event": "the steps' DpEvent",
    "jaxdp.dpsgd.user_sampling.UserPoissonSampler.adaptive_event": "the step's DpEvent",
    "jaxdp.dpsgd.user_sampling.UserPoissonSampler.adaptive_gradient_noise_multiplier":
        "sigma_Delta",
    "jaxdp.dpsgd.user_sampling.UserPoissonSampler.calibrate_mf_noise_multiplier": "sigma",
    "jaxdp.dpsgd.user_sampling.UserPoissonSampler.mf_epsilon": "epsilon",
    "jaxdp.dpsgd.user_sampling.UserPoissonSampler.mf_event": "the run's DpEvent",
}.items():
  reg.not_a_release_point(_name, _SELECTION_ACCOUNTING.format(what=_what))
reg.not_a_release_point(
    "jaxdp.dpsgd.user_clipping.UserClippedGradFn",
    "the per-user clipped-sum function's type (sensitivity C per user); adds no noise and "
    "releases nothing; the release is PrivateSGD.step[selection=user]")
