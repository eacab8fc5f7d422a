"""NON-PRIVATE building blocks of the private confidence intervals (paper 003).

Everything here is an exact function of its inputs: called on private data its
outputs are NOT differentially private and must not be released. They exist to
build and test private pipelines (the private release of these statistics is
:func:`jaxdp.inference.confidence_intervals`, or :func:`jaxdp.inference.priv_spd_matrix`
on a matrix whose sensitivity you have bounded with
:func:`jaxdp.inference.hessian_sensitivity` / :func:`jaxdp.inference.covariance_sensitivity`).

* :func:`newton_minimize`: the exact minimiser of the regularised ERM objective
  (paper 003 Eq. 3.1; :class:`NewtonResult`).
* :func:`hessian`: ``H(theta) = (1/n) sum_i f''(y_i theta^T x_i) x_i x_i^T + Lambda I``
  (paper 003 Eq. 4.2).
* :func:`gradient_covariance`: ``Sigma(theta) = (1/n) sum_i g_i g_i^T`` of the
  per-example regularised gradients (paper 003 Eq. 4.3).

The namespace says what they are: ``from jaxdp.inference import nonprivate;
nonprivate.hessian(theta, x, y, loss="logistic", l2_reg=0.1)``.
"""

from jaxdp.inference.newton import NewtonResult, newton_minimize
from jaxdp.inference.sensitivities import gradient_covariance, hessian

__all__ = ["NewtonResult", "gradient_covariance", "hessian", "newton_minimize"]
