"""Private prediction: prediction sensitivity, subsample-and-aggregate, PATE, budget-enforcing predictors.

References: ``../shared/papers/000_tradeoffs_of_private_prediction.md``
(Section 3.2, Appendix C) and ``../shared/papers/004_dp_machine_learning_survey.md``
(Section 4.3). Note the corrected subsample-and-aggregate calibration
(``beta = eps/(2B)``, not the paper's ``eps/B``) explained in
:mod:`jaxdp.prediction.subsample_aggregate`.
"""

from jaxdp.prediction.pate import (
    DataDependentEpsilon,
    PateResult,
    gnmax_data_dependent_epsilon,
    gnmax_data_dependent_rdp,
    gnmax_log_q,
    noisy_max_event,
    noisy_max_labels,
    noisy_max_scale,
    pate_label_and_train,
    rdp_to_epsilon,
)
from jaxdp.prediction.prediction_sensitivity import (
    PredictionSensitivityCalibration,
    SOFTMAX_LIPSCHITZ,
    calibrate_prediction_sensitivity,
    gaussian_prediction_sigma,
    l2_laplace_prediction_beta,
    noisy_logits,
    logit_sensitivity,
)
from jaxdp.prediction.predictor import (
    NoisyMaxPredictor,
    PredictionSensitivityPredictor,
    PrivatePredictor,
    SubsampleAggregatePredictor,
)
from jaxdp.prediction.subsample_aggregate import (
    adversarial_votes,
    aggregate_exponential,
    exponential_aggregation_beta,
    exponential_aggregation_event,
    exponential_privacy_loss,
    exponential_vote_distribution,
    linear_teacher_votes,
    partition_dataset,
    partition_indices,
    train_linear_teachers,
    train_teachers,
    votes_from_labels,
)

__all__ = [
    "DataDependentEpsilon", "NoisyMaxPredictor", "PateResult", "PredictionSensitivityCalibration",
    "PredictionSensitivityPredictor", "PrivatePredictor", "SOFTMAX_LIPSCHITZ",
    "SubsampleAggregatePredictor", "adversarial_votes", "aggregate_exponential",
    "calibrate_prediction_sensitivity", "exponential_aggregation_beta",
    "exponential_aggregation_event", "exponential_privacy_loss", "exponential_vote_distribution",
    "gaussian_prediction_sigma", "gnmax_data_dependent_epsilon", "gnmax_data_dependent_rdp",
    "gnmax_log_q", "l2_laplace_prediction_beta", "linear_teacher_votes", "noisy_logits",
    "noisy_max_event", "noisy_max_labels", "noisy_max_scale", "partition_dataset",
    "partition_indices", "logit_sensitivity", "pate_label_and_train", "rdp_to_epsilon",
    "train_linear_teachers", "train_teachers", "votes_from_labels",
]
