"""Privacy accounting: events, composition, conversions, DP-SGD, and one shared accountant.

All accounting runs in float64 on the host (numpy/scipy/dp_accounting).
"""

from jaxdp.accounting import events
from jaxdp.accounting.accountant import (
    METHODS,
    PrivacyAccountant,
    PrivacyBudget,
    PrivacyGuarantee,
    UnsupportedEventError,
)
from jaxdp.accounting.analytic_gaussian import (
    analytic_gaussian_alpha,
    analytic_gaussian_delta,
    analytic_gaussian_epsilon,
    analytic_gaussian_sigma,
    classic_gaussian_sigma,
)
from jaxdp.accounting.composition import (
    PerQueryGaussian,
    advanced_composition,
    advanced_composition_per_query_epsilon,
    advanced_composition_per_query_epsilon_exact,
    basic_composition,
    per_query_gaussian_sigma,
)
from jaxdp.accounting.dpsgd_accounting import (
    calibrate_noise_multiplier,
    dpsgd_epsilon,
    dpsgd_event,
    expected_batch_size,
    steps_for_epochs,
)
from jaxdp.accounting.events import (
    ADD_REMOVE,
    REPLACE_ONE,
    ApproxDpEvent,
    ComposedDpEvent,
    DpEvent,
    ExponentialMechanismDpEvent,
    GaussianDpEvent,
    LaplaceDpEvent,
    NeighbouringRelation,
    NoOpDpEvent,
    NonPrivateDpEvent,
    PoissonSampledDpEvent,
    PureDpEvent,
    SelfComposedDpEvent,
    ZCDpEvent,
    replace_one_from_add_remove,
    with_neighbouring,
)
from jaxdp.accounting.zcdp import (
    approx_dp_to_zcdp_budget,
    bounded_range_to_zcdp,
    gaussian_zcdp_rho,
    gaussian_zcdp_sigma,
    pure_dp_to_zcdp,
    zcdp_to_approx_dp,
    zcdp_to_approx_dp_tight,
)
from jaxdp.errors import BudgetExceededError
