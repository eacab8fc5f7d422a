from jaxdp.training import dpsgd
from jaxdp.training import estimators, functional_mechanism, lbfgs, linear, linear_losses
from jaxdp.training import objective_perturbation, output_perturbation, selection
from jaxdp.training.estimators import PrivateLinearClassifier, PrivateLogisticRegression
from jaxdp.training.functional_mechanism import functional_mechanism as functional_mechanism_fit
from jaxdp.training.lbfgs import SolverInfo, minimize_lbfgs
from jaxdp.training.linear import (
    LinearModel,
    NonPrivateDiagnostics,
    PrivateLinearModel,
    append_bias_feature,
    fit_linear,
    fit_linear_batched,
    linear_logits,
    linear_objective,
    predict_labels,
)
from jaxdp.training.objective_perturbation import (
    loss_perturbation,
    loss_perturbation_calibration,
    objective_perturbation_calibration,
)
from jaxdp.training.objective_perturbation import objective_perturbation as objective_perturbation_fit
from jaxdp.training.output_perturbation import (
    model_sensitivity,
    output_perturbation_calibration,
)
from jaxdp.training.output_perturbation import output_perturbation as output_perturbation_fit
from jaxdp.training.selection import private_argmax, private_argmax_event
