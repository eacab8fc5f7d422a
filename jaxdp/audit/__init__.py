"""Empirical privacy auditing: high-confidence lower bounds on epsilon.

A DP library must show that its guarantees hold, not only state them. This
package runs a randomized mechanism many times (vmapped over keys) on two
neighbouring datasets, thresholds a scalar statistic of its output, and turns
the attack's false-positive / false-negative rates into a lower bound on
epsilon with Clopper-Pearson confidence intervals (Jagielski, Ullman, Oprea
2020; Nasr et al. 2021). A lower bound above the claimed epsilon is a privacy
bug found with the stated confidence.

* :func:`audit_epsilon` / :class:`AuditReport` (``core``);
* :func:`epsilon_lower_bound` on precomputed statistics;
* worst-case neighbouring datasets and statistics (``cases``);
* :func:`dpsgd_canary_audit`, the canary-gradient audit of DP-SGD (``canary``);
* :func:`one_run_audit` / :func:`one_run_audit_fdp`, audits from ONE training run
  (Steinke et al. 2023; Mahloujifar et al. 2024; ``one_run``), and
  :func:`audit_dpsgd_run` / :func:`audit_training_run`, which mix canaries into a
  real jaxdp run and audit it (``one_run_canaries``).
"""

from jaxdp.audit.canary import CanaryAudit
from jaxdp.audit.canary import canary_mechanism
from jaxdp.audit.canary import dpsgd_canary_audit
from jaxdp.audit.cases import NeighbouringPair
from jaxdp.audit.cases import exponential_mechanism_log_ratio
from jaxdp.audit.cases import exponential_mechanism_pair
from jaxdp.audit.cases import flipped_label_pair
from jaxdp.audit.cases import implied_noise_statistic
from jaxdp.audit.cases import indicator_statistic
from jaxdp.audit.cases import l2_distance_statistic
from jaxdp.audit.cases import projection_statistic
from jaxdp.audit.cases import scalar_query_pair
from jaxdp.audit.cases import teacher_vote_pair
from jaxdp.audit.core import AuditReport
from jaxdp.audit.core import audit_epsilon
from jaxdp.audit.core import clopper_pearson_lower
from jaxdp.audit.core import clopper_pearson_upper
from jaxdp.audit.core import epsilon_from_rates
from jaxdp.audit.core import histogram_epsilon_lower_bound
from jaxdp.audit.core import epsilon_lower_bound
from jaxdp.audit.core import make_trial_fn
from jaxdp.audit.core import run_trials
from jaxdp.audit.one_run import OneRunAuditResult
from jaxdp.audit.one_run import one_run_audit
from jaxdp.audit.one_run import one_run_audit_fdp
from jaxdp.audit.one_run_canaries import OneRunRunAudit
from jaxdp.audit.one_run_canaries import audit_dpsgd_run
from jaxdp.audit.one_run_canaries import audit_training_run
from jaxdp.audit.one_run_canaries import mislabelled_canaries

__all__ = [
    "AuditReport",
    "CanaryAudit",
    "NeighbouringPair",
    "OneRunAuditResult",
    "OneRunRunAudit",
    "audit_dpsgd_run",
    "audit_training_run",
    "mislabelled_canaries",
    "one_run_audit",
    "one_run_audit_fdp",
    "audit_epsilon",
    "canary_mechanism",
    "clopper_pearson_lower",
    "clopper_pearson_upper",
    "dpsgd_canary_audit",
    "epsilon_from_rates",
    "epsilon_lower_bound",
    "histogram_epsilon_lower_bound",
    "exponential_mechanism_log_ratio",
    "exponential_mechanism_pair",
    "flipped_label_pair",
    "implied_noise_statistic",
    "indicator_statistic",
    "l2_distance_statistic",
    "make_trial_fn",
    "projection_statistic",
    "run_trials",
    "scalar_query_pair",
    "teacher_vote_pair",
]
