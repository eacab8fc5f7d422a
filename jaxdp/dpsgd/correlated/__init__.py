"""Correlated-noise private training: the matrix-factorization (MF) mechanism.

DP-SGD adds independent noise at every step; the MF mechanism adds noise
``C^{-1} z`` correlated across steps, which at the same (epsilon, delta) gives
lower error on the prefix sums SGD computes (Denisov et al. 2022; Choquette-Choo
et al. 2023, multi-epoch MF and amplified BandMF; Dvijotham, McMahan et al.
2024, BLT).

* :mod:`.strategies` -- :class:`BandMF` (banded Toeplitz), :class:`BLT`
  (buffered linear Toeplitz) and :class:`ColumnNormalizedBanded` (general
  banded, unit columns) strategies C, all subclasses of :class:`Strategy`;
* :mod:`.optimize` -- :func:`optimize_bandmf`, :func:`optimize_blt`,
  :func:`optimize_column_normalized_banded`: C for the
  SGD workload (momentum and learning rates folded in) under (k, b)
  participation, in float64;
* :mod:`.sensitivity` -- the sensitivity of C under k participations at least
  b steps apart;
* :mod:`.participation` -- :class:`CyclicPoissonSampler`, the sampling that
  realises that schema;
* :mod:`.noise` -- :func:`correlated_noise`, the streaming optax transform;
* :mod:`.accounting` -- :func:`mf_event` (one DpEvent per run),
  :func:`mf_epsilon`, :func:`calibrate_mf_noise_multiplier`.

``make_private(..., noise_strategy=...)`` wires them into a paid training loop.
"""

from jaxdp.dpsgd.correlated import accounting, optimize, sensitivity, workloads
from jaxdp.dpsgd.correlated.accounting import (calibrate_mf_noise_multiplier, mf_epsilon,
                                                  mf_event)
from jaxdp.dpsgd.correlated.noise import CorrelatedNoiseState, correlated_noise, noise_stddev
from jaxdp.dpsgd.correlated.optimize import (expected_error, optimize_bandmf, optimize_blt,
                                             optimize_column_normalized_banded)
from jaxdp.dpsgd.correlated.participation import CyclicPoissonSampler, max_participations
from jaxdp.dpsgd.correlated.strategies import BLT, BandMF, ColumnNormalizedBanded, Strategy

__all__ = [
    "BLT", "BandMF", "ColumnNormalizedBanded", "CorrelatedNoiseState", "CyclicPoissonSampler",
    "Strategy", "accounting", "calibrate_mf_noise_multiplier", "correlated_noise",
    "expected_error", "max_participations", "mf_epsilon", "mf_event", "noise_stddev", "optimize",
    "optimize_bandmf", "optimize_blt", "optimize_column_normalized_banded", "sensitivity",
    "workloads",
]
