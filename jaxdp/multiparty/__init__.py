"""Learning privately from multiparty data (paper 001, Hamm, Cao & Belkin 2016).

``M`` parties each train a local classifier on their private data
(:func:`fit_local_classifiers`, all ``M`` in one batched call, or any
black-box predictors via :func:`votes_from_predictors`); the ensemble labels
auxiliary unlabeled data and a global classifier is released with output
perturbation:

* :func:`private_vote_erm` — Algorithm 1 (majority votes, Theorem 1 / App. B.2);
* :func:`private_soft_label_erm` — Algorithm 2 (soft labels, weighted ERM,
  Theorem 3 / App. B.3), ``M`` times less noise;
* ``protect_auxiliary=True`` — Section 4.5 (also one auxiliary sample);
* baselines (Sec. 6): :func:`batch_classifier`, :func:`private_parameter_averaging`
  (Pathak et al. 2010), :func:`indiv_accuracy`.

**The privacy unit is a whole party** (all its samples replaced, ``M``
fixed): every event is tagged ``neighbouring="replace_one", unit="party"``.
The three releases take an optional ``accountant=`` (a
``PrivacyAccountant(unit="party")`` or ``PrivacyBudget``), charged one event
per key after validation and before any computation on the data; they return
only the noisy weights, the event and the public calibration. The vote
counts, soft labels, majority labels, :func:`global_minimizer`,
:func:`certify_local_classifiers` and :func:`batch_classifier` are
**non-private** intermediates/baselines (no noise): never release them.
Pure eps (L2-Laplace, the paper's noise), (eps, delta) (analytic Gaussian) and
zCDP variants; see :mod:`jaxdp.multiparty.private_global` for the sensitivities.
"""

from jaxdp.multiparty.aggregation import majority_labels
from jaxdp.multiparty.aggregation import soft_labels
from jaxdp.multiparty.aggregation import vote_counts
from jaxdp.multiparty.baselines import IndivAccuracy
from jaxdp.multiparty.baselines import batch_classifier
from jaxdp.multiparty.baselines import certify_local_classifiers
from jaxdp.multiparty.baselines import indiv_accuracy
from jaxdp.multiparty.baselines import parameter_averaging_sensitivity
from jaxdp.multiparty.baselines import private_parameter_averaging
from jaxdp.multiparty.local import LocalClassifiers
from jaxdp.multiparty.local import PartySplit
from jaxdp.multiparty.local import fit_local_classifiers
from jaxdp.multiparty.local import local_accuracies
from jaxdp.multiparty.local import local_votes
from jaxdp.multiparty.local import split_parties
from jaxdp.multiparty.local import votes_from_predictors
from jaxdp.multiparty.private_global import global_minimizer
from jaxdp.multiparty.private_global import party_calibration
from jaxdp.multiparty.private_global import private_soft_label_erm
from jaxdp.multiparty.private_global import private_vote_erm
from jaxdp.multiparty.private_global import release
from jaxdp.multiparty.private_global import soft_label_sensitivity
from jaxdp.multiparty.private_global import vote_sensitivity

__all__ = [
    "IndivAccuracy", "LocalClassifiers", "PartySplit", "batch_classifier",
    "certify_local_classifiers", "fit_local_classifiers", "global_minimizer", "indiv_accuracy",
    "local_accuracies", "local_votes", "majority_labels", "parameter_averaging_sensitivity",
    "party_calibration", "private_parameter_averaging", "private_soft_label_erm",
    "private_vote_erm", "release", "soft_label_sensitivity", "split_parties", "vote_counts",
    "votes_from_predictors", "vote_sensitivity",
]
