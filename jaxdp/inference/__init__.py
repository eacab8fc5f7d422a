"""Differentially private statistical inference: confidence intervals for ERM parameters.

Paper 003 (``../shared/papers/003_dp_confidence_intervals_for_erm.md``): PrivSPDMat
(Algorithm 2), the Hessian / gradient-covariance sensitivities of logistic regression and
Huberized SVM (Lemmas 2-5), and private confidence intervals for objective perturbation
(Algorithm 3) and output perturbation (Algorithm 5), under pure DP or zCDP.

Release points (they spend on an accountant or describe their DpEvent): :func:`confidence_intervals`,
:func:`confidence_intervals_batched` (``M`` keys = ``M`` releases) and :func:`priv_spd_matrix`
(event: :func:`priv_spd_matrix_event`). The exact, NOT private statistics they are built
from (the ERM minimiser, the Hessian and the gradient covariance, Eqs. 3.1, 4.2-4.3) live
under :mod:`jaxdp.inference.nonprivate`, a name that says what they are: their outputs on
private data must be released through PrivSPDMat or an equivalent mechanism.

:class:`CoverageWarning` (rule: :func:`coverage_warning`) marks configurations whose
intervals are known to cover less often than nominal (the Huberized hinge; objective
perturbation with ``n eps^2 < OBJECTIVE_MIN_N_EPS_SQUARED``).
"""

from jaxdp.inference.intervals import (
    FLOORS, OBJECTIVE_MIN_N_EPS_SQUARED, PERTURBATIONS, PRIVACY, TABLE2_FRACTIONS, BudgetSplit,
    Calibration, ConfidenceIntervals, CoverageWarning, budget_split, calibrate,
    confidence_intervals, confidence_intervals_batched, coverage_warning)
from jaxdp.inference import nonprivate
from jaxdp.inference.sensitivities import (
    as_signed_labels, covariance_sensitivity, hessian_sensitivity,
    huber_covariance_sensitivity, huber_hessian_sensitivity, logistic_covariance_sensitivity,
    logistic_hessian_sensitivity, loss_derivatives)
from jaxdp.inference.spd_release import (
    priv_spd_matrix, priv_spd_matrix_event, spd_noise, symmetrize_and_floor)

__all__ = [
    "FLOORS", "OBJECTIVE_MIN_N_EPS_SQUARED", "PERTURBATIONS", "PRIVACY", "TABLE2_FRACTIONS",
    "BudgetSplit", "Calibration", "ConfidenceIntervals", "CoverageWarning", "budget_split",
    "calibrate", "confidence_intervals", "confidence_intervals_batched", "coverage_warning",
    "as_signed_labels", "covariance_sensitivity",
    "hessian_sensitivity", "nonprivate",
    "huber_covariance_sensitivity", "huber_hessian_sensitivity",
    "logistic_covariance_sensitivity", "logistic_hessian_sensitivity", "loss_derivatives",
    "priv_spd_matrix", "priv_spd_matrix_event", "spd_noise", "symmetrize_and_floor",
]
