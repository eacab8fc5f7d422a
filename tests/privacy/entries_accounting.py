"""Accounting and audit: public callables with privacy parameters that release no private data.

Everything here is a function of PUBLIC numbers only (privacy parameters, noise
multipliers, sampling rates, step counts, event descriptions), or, for the
audit package, of a mechanism's outputs on datasets the auditor constructs:
an audit releases statistics about a MECHANISM (an empirical lower bound on
its epsilon), never a record of a private dataset. None of them draws noise
for, or spends budget on behalf of, a private release, so none is a release
point; each is declared with the reason, one by one
(``conformance_registry.not_a_release_point``).

The ledger itself is exercised by every entry's charge check
(``conformance_checks.check_charge`` spends on a ``PrivacyAccountant`` and a
``PrivacyBudget``), and the accounting formulas by tests/accounting/.
"""

from __future__ import annotations

import conformance_registry as reg

_EVENT = ("a DpEvent constructor: a description of a mechanism by its public parameters "
          "(dp_accounting's event algebra); it computes nothing from data and spends nothing")
_CALIBRATION = ("a calibration of public privacy parameters (float64 formula of epsilon, delta, "
                "sensitivity); reads no data, draws no noise, spends nothing")

_DECLARED = {
    # -- events ---------------------------------------------------------------------
    "jaxdp.accounting.ApproxDpEvent": _EVENT + " ((eps, delta) of a finished release).",
    "jaxdp.accounting.ExponentialMechanismDpEvent": _EVENT + " (beta, sensitivity).",
    "jaxdp.accounting.GaussianDpEvent": _EVENT + " (noise multiplier).",
    "jaxdp.accounting.LaplaceDpEvent": _EVENT + " (noise multiplier).",
    "jaxdp.accounting.PureDpEvent": _EVENT + " (epsilon).",
    "jaxdp.accounting.ZCDpEvent": _EVENT + " (rho).",
    "jaxdp.accounting.dpsgd_event": _EVENT + ": T x PoissonSampled(q, Gaussian(sigma)) of DP-SGD "
                                    "from (sigma, q, T); train_dpsgd's entry checks it is spent.",
    "jaxdp.accounting.replace_one_from_add_remove":
        "converts a finished add/remove (eps, delta) to replace-one by group privacy (a formula "
        "of public numbers returning an event); releases and spends nothing",
    "jaxdp.accounting.with_neighbouring":
        "re-tags an event's neighbouring relation / unit (metadata of a public description); "
        "releases and spends nothing",
    "jaxdp.accounting.events.event_from_dict":
        "deserialises a DpEvent from its JSON dict (ledger persistence); no data, no noise",
    # -- accountant and budget --------------------------------------------------------
    "jaxdp.accounting.PrivacyAccountant.as_event":
        "returns the ledger's composed event (public descriptions already spent); releases "
        "nothing from data",
    "jaxdp.accounting.PrivacyAccountant.get_epsilon":
        "epsilon at a public delta of the ledger's public events (dp_accounting, float64)",
    "jaxdp.accounting.PrivacyAccountant.guarantee":
        "the (epsilon, delta) guarantee of the ledger's public events",
    "jaxdp.accounting.PrivacyAccountant.ledger":
        "read-only view of the events spent so far (public descriptions and counts)",
    "jaxdp.accounting.PrivacyBudget":
        "a spending limit (epsilon, delta) that refuses events beyond it; it holds no data and "
        "releases nothing (its refusals are exercised by every entry's charge check)",
    "jaxdp.accounting.PrivacyGuarantee":
        "a record of (epsilon, delta) numbers computed from public events",
    # -- composition and conversions ----------------------------------------------------
    "jaxdp.accounting.advanced_composition": _CALIBRATION + " (Dwork-Rothblum-Vadhan 2010).",
    "jaxdp.accounting.basic_composition": _CALIBRATION + " (sum of epsilons and deltas).",
    "jaxdp.accounting.per_query_gaussian_sigma": _CALIBRATION + " (paper 000 Alg. 7).",
    "jaxdp.accounting.analytic_gaussian_alpha": _CALIBRATION + " (Balle & Wang 2018).",
    "jaxdp.accounting.analytic_gaussian_delta": _CALIBRATION + " (Balle & Wang 2018 Thm 8).",
    "jaxdp.accounting.analytic_gaussian_epsilon": _CALIBRATION + " (Balle & Wang 2018).",
    "jaxdp.accounting.analytic_gaussian_sigma": _CALIBRATION + " (Balle & Wang 2018 Alg. 1).",
    "jaxdp.accounting.classic_gaussian_sigma": _CALIBRATION + " (Dwork & Roth Thm A.1).",
    "jaxdp.accounting.approx_dp_to_zcdp_budget": _CALIBRATION + " (zCDP conversion).",
    "jaxdp.accounting.bounded_range_to_zcdp": _CALIBRATION + " (Cesar & Rogers 2021).",
    "jaxdp.accounting.gaussian_zcdp_rho": _CALIBRATION + " (Bun & Steinke 2016 Prop. 1.6).",
    "jaxdp.accounting.gaussian_zcdp_sigma": _CALIBRATION + " (Bun & Steinke 2016 Prop. 1.6).",
    "jaxdp.accounting.pure_dp_to_zcdp": _CALIBRATION + " (Bun & Steinke 2016 Prop. 1.4).",
    "jaxdp.accounting.zcdp_to_approx_dp": _CALIBRATION + " (Bun & Steinke 2016 Prop. 1.3).",
    "jaxdp.accounting.zcdp_to_approx_dp_tight": _CALIBRATION + " (Canonne et al. 2020).",
    # -- DP-SGD accounting ----------------------------------------------------------------
    "jaxdp.accounting.calibrate_noise_multiplier":
        _CALIBRATION + ": the smallest sigma for (target_epsilon, delta) at (q, T).",
    "jaxdp.accounting.dpsgd_epsilon": _CALIBRATION + ": epsilon of T steps at (sigma, q, delta).",
    "jaxdp.accounting.dpsgd_accounting.check_relation_and_accountant":
        "validates a public (neighbouring, accountant) pair of strings; no data, no event",
    "jaxdp.accounting.events.replace_one_sampled_gaussian_std":
        _CALIBRATION + ": dp_accounting's REPLACE_ONE std (2z) of a replace-one sampled "
        "Gaussian event (Zhu, Dong & Wang 2022).",
    "jaxdp.accounting.dpsgd_accounting.make_accountant":
        "constructs an empty dp_accounting RDP/PLD accountant object; holds no data",
    "jaxdp.accounting.dpsgd_accounting.resolve_noise_multiplier":
        _CALIBRATION + ": sigma given, or calibrated from (target_epsilon, delta, q, T).",
    "jaxdp.accounting.dpsgd_accounting.resolve_with":
        _CALIBRATION + ": sigma given, or the given calibration at public (target_epsilon, delta).",
    # -- fixed-size (without replacement) and user-level batch selection ----------------
    "jaxdp.accounting.dpsgd_accounting.fixed_size_dpsgd_event":
        _EVENT + ": T x SampledWithoutReplacement(N, B, Gaussian(sigma / 2)) tagged replace_one.",
    "jaxdp.accounting.dpsgd_accounting.fixed_size_dpsgd_epsilon":
        _CALIBRATION + ": replace-one RDP epsilon of T fixed-size steps at (sigma, N, B, delta).",
    "jaxdp.accounting.dpsgd_accounting.calibrate_fixed_size_noise_multiplier":
        _CALIBRATION + ": the smallest sigma for (target_epsilon, delta) at (N, B, T).",
    "jaxdp.accounting.dpsgd_accounting.check_fixed_size_accountant":
        "validates a public accountant string ('rdp' only); no data, no event",
    "jaxdp.dpsgd.fixed_size_sampling.FixedSizeSampler.event":
        _EVENT + ": fixed_size_dpsgd_event of the sampler's public (N, B).",
    "jaxdp.dpsgd.fixed_size_sampling.FixedSizeSampler.epsilon":
        _CALIBRATION + ": fixed_size_dpsgd_epsilon of public (sigma, N, B, T, delta).",
    "jaxdp.dpsgd.fixed_size_sampling.FixedSizeSampler.calibrate_noise_multiplier":
        _CALIBRATION + ": calibrate_fixed_size_noise_multiplier at public (N, B, T).",
    "jaxdp.dpsgd.user_sampling.UserPoissonSampler.event":
        _EVENT + ": dpsgd_event at the public user rate q, unit 'user'.",
    "jaxdp.dpsgd.user_sampling.UserPoissonSampler.epsilon":
        _CALIBRATION + ": dpsgd_epsilon of public (sigma, q, T, delta) at the user rate.",
    "jaxdp.dpsgd.user_sampling.UserPoissonSampler.calibrate_noise_multiplier":
        _CALIBRATION + ": calibrate_noise_multiplier at the public user rate q.",
    # -- audit ------------------------------------------------------------------------------
    "jaxdp.audit.AuditReport":
        "an audit's result (empirical lower bound on a mechanism's epsilon and its test counts) "
        "on auditor-built neighbouring datasets; a statistic about the mechanism, not a release "
        "of private data",
    "jaxdp.audit.audit_epsilon":
        "audits a mechanism: runs it many times on auditor-built neighbouring datasets and "
        "reports a Clopper-Pearson lower bound on its epsilon; releases nothing of a private "
        "dataset (the checks' cheap audits use it)",
    "jaxdp.audit.canary_mechanism":
        "builds the DP-SGD canary mechanism on an auditor-chosen canary gradient (synthetic "
        "data) for dpsgd_canary_audit; no private data enters it",
    "jaxdp.audit.dpsgd_canary_audit":
        "the canary-gradient audit of DP-SGD at a public noise multiplier on synthetic canaries; "
        "reports a lower bound on epsilon (a statistic about the mechanism)",
    "jaxdp.audit.epsilon_from_rates":
        "converts an attack's false-positive / false-negative rates to epsilon at a public delta "
        "(hypothesis-testing bound, Kairouz et al. 2015); arithmetic on audit statistics",
    "jaxdp.audit.epsilon_lower_bound":
        "Clopper-Pearson lower bound on epsilon from precomputed audit statistics of a mechanism "
        "(Jagielski et al. 2020); releases nothing of a private dataset",
    "jaxdp.audit.exponential_mechanism_pair":
        "builds the worst-case neighbouring utility vectors for auditing the exponential "
        "mechanism from a public sensitivity; synthetic data, no release",
    "jaxdp.audit.scalar_query_pair":
        "builds a synthetic neighbouring pair of scalar queries at a public sensitivity for an "
        "audit; no release",
}

for _name, _reason in _DECLARED.items():
  reg.not_a_release_point(_name, _reason)
