"""Declarations: the audit helpers release nothing beyond the registered release points they run.

An audit trains (or reads) a private release and scores canaries against it:
the scores are post-processing of that release and of the audit's own coins
(drawn from the audit's key, independent of the data). The release itself is
the registered one it runs (``PrivateSGD.step`` of a ``make_private`` plan, or
an estimator's ``fit``), paid on the caller's accountant by that release's own
code, whose charge the conformance suite checks. The statistics functions take
scores and coins the caller already holds.
"""

import conformance_registry as reg

_STATS = ("an audit statistic of scores and coins the caller passes (an epsilon LOWER bound); "
          "reads no private data of its own")
_POST = ("runs a registered release (PrivateSGD.step of a make_private plan, paid by its sampler "
         "on the caller's accountant; or an estimator's fit) with canaries mixed into the data; "
         "the canary scores are post-processing of that release and of coins drawn from the "
         "audit's key")

for _name, _reason in {
    "jaxdp.audit.OneRunAuditResult": "the record of a one-run audit's statistic; computes nothing",
    "jaxdp.audit.OneRunRunAudit": "the record of an audited run (released params, coins, scores)",
    "jaxdp.audit.audit_dpsgd_run": _POST,
    "jaxdp.audit.audit_training_run": _POST,
    "jaxdp.audit.one_run_audit": _STATS,
    "jaxdp.audit.one_run_audit_fdp": _STATS,
    "jaxdp.audit.one_run.fdp_epsilon_lower_bound": _STATS,
    "jaxdp.audit.one_run.steinke_epsilon_lower_bound": _STATS,
    "jaxdp.audit.one_run.steinke_p_value": _STATS,
    "jaxdp.audit.one_run.gdp_epsilon": "converts a public mu of Gaussian DP to epsilon at delta",
    "jaxdp.audit.one_run_canaries.with_gradient_canaries":
        "wraps a per-example loss with canary terms (a function of public directions); "
        "reads no data",
}.items():
  reg.not_a_release_point(_name, _reason)
