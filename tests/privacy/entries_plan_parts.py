"""Declarations: the parts ``make_private`` builds a ``PrivateSGD`` plan from release nothing.

The plan's release is ``PrivateSGD.step`` (registered per cell of the plan in
``entries_plan_cells.py``); its payment is checked there (charge check). The
part builders below (:mod:`jaxdp.dpsgd.plan_selection`, ``plan_clipping``,
``plan_noise``, ``plan_accounting``, ``plan_checkpoints``, ``paid_sampler``)
compute public numbers, build transforms, or serve the plan's methods of the
same names, which are declared in ``entries_dpsgd.py``.
"""

import conformance_registry as reg

_PLAN = ("the release is PrivateSGD.step (registered per cell of the plan in "
         "entries_plan_cells.py, whose charge check covers the payment)")

for _name, _reason in {
    "jaxdp.dpsgd.plan_accounting.calibrate":
        "sigma of a plan from public (target_epsilon, delta, q, T, relation, strategy): a "
        "calibration; reads no data; " + _PLAN,
    "jaxdp.dpsgd.plan_accounting.check_arguments":
        "checks the public delta and allow_extra_steps arguments of make_private",
    "jaxdp.dpsgd.plan_accounting.epsilon":
        "PrivateSGD.epsilon's accounting: epsilon of t steps from public (sigma, q, t, delta)",
    "jaxdp.dpsgd.plan_accounting.guarantee":
        "PrivateSGD.guarantee's accounting: the epsilon of public (sigma, q, t, delta) as a "
        "PrivacyGuarantee",
    "jaxdp.dpsgd.plan_accounting.step_event":
        "PrivateSGD.step_event: the DpEvent of one step from public (q, sigma, unit)",
    "jaxdp.dpsgd.plan_accounting.run_event":
        "PrivateSGD.run_event: the DpEvent of the whole run from public (q, sigma, T, strategy)",
    "jaxdp.dpsgd.plan_noise.build":
        "builds the plan's noise transform from the public calibrated sigma and sensitivity; "
        "draws no noise and reads no data itself; " + _PLAN,
    "jaxdp.dpsgd.plan_clipping.Clipping":
        "the record of a plan's clipping part (clipped-gradient function, public sensitivity); "
        "computes nothing",
    "jaxdp.dpsgd.plan_checkpoints.run_checkpointer":
        "opens the run's checkpoint directory with the plan's public fingerprint (N, q, sigma, "
        "S, T, key digest); reads no data and spends nothing",
    "jaxdp.dpsgd.paid_sampler.open_sampler":
        "PrivateSGD.sampler: opens the plan's PaidSampler on the caller's accountant and charges "
        "steps released before it; the charge is checked by the PrivateSGD.step entries",
    "jaxdp.dpsgd.paid_sampler.charge_earlier_steps":
        "charges the caller's accountant the steps a resumed run released before its sampler "
        "opened (never refunds); checked by the resume tests and the PrivateSGD.step entries",
}.items():
  reg.not_a_release_point(_name, _reason)
