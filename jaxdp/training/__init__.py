"""Private linear models: ERM by L-BFGS, output and objective (loss) perturbation, functional mechanism.

DP-SGD and correlated-noise training live in :mod:`jaxdp.dpsgd`. The old paths
``jaxdp.training.dpsgd`` and ``jaxdp.training.correlated`` remain importable for
one release as aliases of :mod:`jaxdp.dpsgd` and :mod:`jaxdp.dpsgd.correlated`
(the same module objects).
"""

import importlib as _importlib

from jaxdp import dpsgd
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


_ALIASES = {"dpsgd": "jaxdp.training.dpsgd", "correlated": "jaxdp.training.correlated"}


def __getattr__(name):
  if name in _ALIASES:
    return _importlib.import_module(_ALIASES[name])
  raise AttributeError(f"module 'jaxdp.training' has no attribute {name!r}")
