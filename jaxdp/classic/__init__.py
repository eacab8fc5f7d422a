"""Classic DP models of the survey (paper 004, Sec. 3.1-3.5), pure functions + estimators.

Every function takes a ``jax.random`` key, validates its inputs (declared
bounds are required, see :mod:`jaxdp.classic._common`), spends its DpEvent on
an optional accountant *before* releasing, and returns the release and the
event. Every event is tagged with the relation it was proven for
(``neighbouring="replace_one"`` by default, like the library's estimators, or
``"add_remove"``) and ``unit="example"``. The estimators (``Private*``) draw a
fresh key from OS entropy at every ``fit`` unless given an explicit ``seed``
(:mod:`jaxdp._keys`; an explicit seed is the user's promise not to reuse it).
Released sums are accumulated in float64; refusal messages name the rule and
the row, never a data value.

Names (scikit-learn's where one exists):

* an estimator (``Private*``) takes ``classes=``, the PUBLIC label set (any
  sortable labels, e.g. ``["<=50K", ">50K"]``), fixed before seeing the data,
  as :class:`jaxdp.training.PrivateLogisticRegression` does: it is released as
  ``classes_`` and ``predict`` returns its labels; ``classes=None`` reads it off
  the training labels, which is NOT private, and warns;
* a function (``private_naive_bayes``, ``private_random_trees``) or a Flax
  model takes ``num_classes=``, an int count, the labels being ``0..K-1``
  already;
* clusters are ``n_clusters`` everywhere (functions and estimators).

* :mod:`~jaxdp.classic.quantile`: private quantiles and bounds on a public grid (explicit
  budgeted step);
* :mod:`~jaxdp.classic.naive_bayes`: categorical / Gaussian naive Bayes (Eqs. 25-28);
* :mod:`~jaxdp.classic.random_trees`: random decision tree ensembles (Eq. 31);
* :mod:`~jaxdp.classic.kmeans`: DP-Lloyd and sample-and-aggregate k-means (Eqs. 32-33);
* :mod:`~jaxdp.classic.pca`: Analyze-Gauss and Laplace noisy-covariance PCA (Sec. 3.5);
* :mod:`~jaxdp.classic.linear_regression`: bounded linear regression with intercept by the
  functional mechanism of :mod:`jaxdp.training.functional_mechanism` (Sec. 3.1).
"""

from jaxdp.classic.kmeans import PrivateKMeans
from jaxdp.classic.kmeans import dp_lloyd
from jaxdp.classic.kmeans import kmeans_cost
from jaxdp.classic.kmeans import lloyd_calibration
from jaxdp.classic.kmeans import lloyd_event
from jaxdp.classic.kmeans import lloyd_iteration_event
from jaxdp.classic.kmeans import sample_aggregate_kmeans
from jaxdp.classic.kmeans import sample_aggregate_sensitivity
from jaxdp.classic.linear_regression import PrivateLinearRegression
from jaxdp.classic.linear_regression import private_linear_regression
from jaxdp.classic.naive_bayes import NaiveBayesModel
from jaxdp.classic.naive_bayes import NaiveBayesStats
from jaxdp.classic.naive_bayes import PrivateNaiveBayes
from jaxdp.classic.naive_bayes import naive_bayes_calibration
from jaxdp.classic.naive_bayes import naive_bayes_event
from jaxdp.classic.naive_bayes import private_naive_bayes
from jaxdp.classic.pca import PCAResult
from jaxdp.classic.pca import PrivatePCA
from jaxdp.classic.pca import explained_variance_ratio
from jaxdp.classic.pca import pca_calibration
from jaxdp.classic.pca import pca_event
from jaxdp.classic.pca import private_pca
from jaxdp.classic.quantile import private_bounds
from jaxdp.classic.quantile import private_quantile
from jaxdp.classic.quantile import quantile_event
from jaxdp.classic.random_trees import PrivateRandomTrees
from jaxdp.classic.random_trees import RandomTrees
from jaxdp.classic.random_trees import private_random_trees
from jaxdp.classic.random_trees import random_trees_event
from jaxdp.classic.random_trees import random_trees_scale

__all__ = [
    "PCAResult",
    "PrivateKMeans",
    "PrivateLinearRegression",
    "PrivatePCA",
    "PrivateRandomTrees",
    "RandomTrees",
    "dp_lloyd",
    "explained_variance_ratio",
    "kmeans_cost",
    "lloyd_calibration",
    "lloyd_event",
    "lloyd_iteration_event",
    "pca_calibration",
    "pca_event",
    "private_linear_regression",
    "private_pca",
    "private_random_trees",
    "random_trees_event",
    "random_trees_scale",
    "sample_aggregate_kmeans",
    "sample_aggregate_sensitivity",
    "NaiveBayesModel",
    "NaiveBayesStats",
    "PrivateNaiveBayes",
    "naive_bayes_calibration",
    "naive_bayes_event",
    "private_bounds",
    "private_naive_bayes",
    "private_quantile",
    "quantile_event",
]
