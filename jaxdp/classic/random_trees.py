r"""Differentially private random decision tree ensembles (paper 004, Sec. 3.3, Eq. 31).

Paper 004 = ``../shared/papers/004_dp_machine_learning_survey.md``; Jagannathan,
Pillaipakkamnatt & Wright (2009). Each of ``N`` trees of depth ``h`` is chosen
WITHOUT looking at the data: as the survey describes (Sec. 3.3, "RDT pre-selects
``h <= m`` features (with order) randomly"), each tree draws ``h`` distinct
features in a random order, the ``l``-th splitting every node of depth ``l``
(for ``h > m`` the order continues with a fresh permutation),
and every internal node draws a threshold uniformly in its feature's declared
bounds ``[l_j, u_j]`` (a missing bound is an error). A record follows
``x_j > t`` branches to one of ``2^h`` leaves; the leaf holds class counts
``l_{v,c}`` (Eq. 31), released with Laplace noise.

Prediction (post-processing of the noisy counts, any rule keeps the guarantee),
``combine``:

* ``"product"`` (default): the trees as independent pieces of evidence,
  ``argmax_c sum_t log p_t(c | leaf_t(x)) - (N - 1) log pi(c)``, with
  ``p_t(c | v) ∝ max(l~_{v,c}, 0) + s`` (smoothing ``s``) and ``pi`` the class
  shares of the noisy counts (summed over all leaves and trees);
* ``"average"``: Fan et al. (2003)'s probability averaging,
  ``argmax_c mean_t p_t(c | leaf_t(x))``.

Why the product is the default: with random features most trees see no
informative feature, so the averaged distribution is pulled to the class prior
and the argmax is the majority class (Adult, 10 trees of depth 6: 0.754 = the
majority rate at every epsilon, also without noise), while the product lets
the few informative trees decide (0.80 without noise, 0.80 at epsilon = 1;
``benchmarks/survey_models.py``).

Budget across trees — two modes, say which (``tree_budget``):

* ``"split"`` (the survey's Eq. 31 followed by sequential composition, Prop.
  1): every record updates one leaf in each of the ``N`` trees, so the
  concatenated count vector has per-record L1 contribution ``B = N`` and gets
  ``Lap(Delta / epsilon)`` with ``Delta = N`` (add/remove) or ``2N``
  (replace-one), i.e. ``Lap(N/epsilon)`` per count as the survey says, doubled
  under replace-one (a replaced record leaves one cell and enters another).
* ``"disjoint"`` (parallel composition, McSherry 2009 Thm. 4): every record is
  assigned to ONE tree independently and uniformly (data-independent), so
  ``B = 1`` and every count gets ``Lap(1/epsilon)`` (add/remove) or
  ``Lap(2/epsilon)`` (replace-one); each tree sees about ``n/N`` records.

Either way the whole ensemble is one ``epsilon``-DP Laplace mechanism on a sum
of per-record contributions with L1 sensitivity ``Delta`` (an integer).

Noise (``noise``, :mod:`jaxdp.classic._common`). ``"discrete"`` (default): the
leaf counts are integers, on the public grid ``1 Z`` already, and get integer
discrete Laplace noise of scale ``t/s >= Delta/epsilon`` (Canonne, Kamath &
Steinke 2020, Algorithm 2): no rounding happens, so the rounded L1 sensitivity
is ``Delta`` itself (``K_1 = ceil(Delta/1)``, the ``+ (c - 1)`` of the rounding
bound does not arise although a replaced record changes up to ``2N`` cells) and
the pmf ratio on neighbours is at most ``exp(Delta s/t) <= e^epsilon``: the
release is ``epsilon``-DP with the same scale as the continuous one, charged as
``PureDpEvent(epsilon)`` (:func:`jaxdp.mechanisms.discrete_laplace_mechanism_event`).
The counts are accumulated in int32 and released as the float32 of the integer
``count + z`` (a data-independent set of values). ``"continuous"``: float
``Lap(Delta/epsilon)`` noise and ``LaplaceDpEvent(1/epsilon)``, as in earlier
releases. The trees are vmapped.
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import scipy.special
from sklearn.base import BaseEstimator, ClassifierMixin

from jaxdp import _estimator_checks as checks
from jaxdp import _keys
from jaxdp import _validation
from jaxdp.accounting import events
from jaxdp.classic import _common
from jaxdp.mechanisms import discrete
from jaxdp.mechanisms import laplace_noise

TREE_BUDGETS = ("split", "disjoint")


class RandomTrees(NamedTuple):
  features: jax.Array     # (N, 2^h - 1) int32 feature of every internal node (heap order)
  thresholds: jax.Array   # (N, 2^h - 1)
  counts: jax.Array       # (N, 2^h, C) noisy leaf counts


def _count_sensitivity(num_trees: int, tree_budget: str, neighbouring: str) -> float:
  n_trees = _validation.check_positive_int(num_trees, "num_trees")
  if tree_budget not in TREE_BUDGETS:
    raise ValueError(f"tree_budget must be one of {TREE_BUDGETS}, got {tree_budget!r}.")
  per_record = float(n_trees) if tree_budget == "split" else 1.0
  return _common.sum_sensitivity(per_record, neighbouring)


def random_trees_noise_parameters(*, num_trees: int, epsilon: float,
                                  tree_budget: str = "disjoint",
                                  neighbouring: str = "replace_one") -> tuple[int, int]:
  """``(t, s)`` of the discrete Laplace leaf noise, ``t/s >= Delta/epsilon`` (module docstring)."""
  sens = _count_sensitivity(num_trees, tree_budget, neighbouring)
  eps = _validation.check_epsilon(epsilon, "epsilon")
  return _common.discrete_count_parameters(sens, eps)


def random_trees_scale(*, num_trees: int, epsilon: float, tree_budget: str = "disjoint",
                       neighbouring: str = "replace_one", noise: str = "discrete") -> float:
  """Noise scale of every leaf count (module docstring); 0 for ``epsilon = inf``.

  ``"continuous"``: ``Delta/epsilon``; ``"discrete"``: ``t/s`` of
  :func:`random_trees_noise_parameters` (``>= Delta/epsilon``, within ``2^-20``).
  """
  noise = _common.check_noise(noise)
  sens = _count_sensitivity(num_trees, tree_budget, neighbouring)
  eps = _validation.check_epsilon(epsilon, "epsilon", allow_inf=True)
  if math.isinf(eps):
    return 0.0
  if noise == "continuous":
    return sens / eps
  t, s = _common.discrete_count_parameters(sens, eps)
  return t / s


def random_trees_event(epsilon: float, neighbouring: str = "replace_one",
                       noise: str = "discrete") -> events.DpEvent:
  """``PureDpEvent(epsilon)`` (``noise="discrete"``) or ``LaplaceDpEvent(1/epsilon)``."""
  noise = _common.check_noise(noise)
  eps = _validation.check_epsilon(epsilon, "epsilon", allow_inf=True)
  rel = _common.check_relation(neighbouring)
  if math.isinf(eps):
    return events.NonPrivateDpEvent()
  if noise == "discrete":
    return events.PureDpEvent(eps, neighbouring=rel)
  return events.LaplaceDpEvent(noise_multiplier=1.0 / eps, neighbouring=rel)


def leaf_index(x, features, thresholds, depth: int):
  """Leaf (0 .. 2^h - 1) of every row of ``x`` in one tree (heap-ordered nodes)."""
  node = jnp.zeros(x.shape[0], jnp.int32)
  for _ in range(depth):
    f = features[node]
    bit = (jnp.take_along_axis(x, f[:, None], axis=1)[:, 0] > thresholds[node]).astype(jnp.int32)
    node = 2 * node + 1 + bit
  return node - (2 ** depth - 1)


def _random_structure(key, num_trees, depth, lo, hi):
  n_nodes = 2 ** depth - 1
  kf, kt = jax.random.split(key)
  # Survey Sec. 3.3 (Jagannathan et al. 2009): each tree pre-selects h distinct features in a
  # random order, the one of level l splitting every node at depth l.
  # For h > m (low-dimensional continuous data) the order continues with fresh permutations,
  # so a feature recurs only after all m have been used (with new thresholds).
  reps = -(-depth // lo.shape[0])
  perms = jax.vmap(lambda k: jax.random.permutation(k, lo.shape[0]))(
      jax.random.split(kf, num_trees * reps))
  order = perms.reshape(num_trees, reps * lo.shape[0])[:, :depth]               # (N, h)
  level = np.floor(np.log2(np.arange(n_nodes) + 1)).astype(np.int32)          # node -> depth
  feats = order[:, level]
  u = jax.random.uniform(kt, (num_trees, n_nodes), lo.dtype)
  return feats, lo[feats] + u * (hi - lo)[feats]


@functools.partial(jax.jit, static_argnames=("num_trees", "depth", "num_classes", "disjoint",
                                             "scale", "discrete_ts"))
def _fit_core(key, x, y, lo, hi, *, num_trees, depth, num_classes, disjoint, scale,
              discrete_ts=None):
  """Random trees and noisy leaf counts: float ``Lap(scale)`` noise, or (``discrete_ts``
  = ``(t, s)``) int32 counts plus discrete Laplace integers, released as float32."""
  k_struct, k_assign, k_noise = jax.random.split(key, 3)
  feats, thr = _random_structure(k_struct, num_trees, depth, lo, hi)
  cdtype = x.dtype if discrete_ts is None else jnp.int32  # exact integer counts when discrete
  onehot_y = jax.nn.one_hot(y, num_classes, dtype=cdtype)                       # (n, C)
  if disjoint:
    owner = jax.random.randint(k_assign, (x.shape[0],), 0, num_trees)
    weights = jax.nn.one_hot(owner, num_trees, dtype=cdtype).T                 # (N, n)
  else:
    weights = jnp.ones((num_trees, x.shape[0]), cdtype)

  def one_tree(f, t, w):
    # Leaf-by-class counts as a segment sum over the rows' leaf indices: memory O(n C + L C)
    # per tree (a one-hot (n, L) leaf matrix would need n 2^depth floats per tree).
    return jax.ops.segment_sum(onehot_y * w[:, None], leaf_index(x, f, t, depth),
                               num_segments=2 ** depth)                        # (L, C)

  counts = jax.vmap(one_tree)(feats, thr, weights)
  if discrete_ts is not None:
    z = discrete.discrete_laplace_noise(k_noise, counts.shape, *discrete_ts)
    return RandomTrees(feats, thr, (counts + z).astype(x.dtype))
  return RandomTrees(feats, thr, counts + laplace_noise(k_noise, counts.shape, scale, x.dtype))


COMBINE_RULES = ("product", "average")


def _check_combine(combine: str) -> str:
  if combine not in COMBINE_RULES:
    raise ValueError(f"combine must be one of {COMBINE_RULES}, got {combine!r}.")
  return combine


@functools.partial(jax.jit, static_argnames=("depth", "combine"))
def predict_scores(trees: RandomTrees, x, depth: int, smoothing: float = 1.0,
                   combine: str = "product"):
  """Class scores ``(n, C)`` of each row (module docstring, ``combine``); argmax predicts.

  ``"average"``: the mean over trees of the leaf distributions ``p_t(c | v) ∝
  max(l~_{v,c}, 0) + smoothing``. ``"product"``: ``sum_t log p_t(c | v_t) - (N - 1)
  log pi(c)`` with ``pi`` the class shares of all noisy counts. Post-processing.
  """
  _check_combine(combine)
  counts = jnp.maximum(trees.counts, 0.0) + smoothing              # (N, L, C)
  dist = counts / counts.sum(-1, keepdims=True)

  def one_tree(f, t, p):
    return p[leaf_index(x, f, t, depth)]

  if combine == "average":
    return jax.vmap(one_tree)(trees.features, trees.thresholds, dist).mean(0)
  prior = counts.sum((0, 1)) / counts.sum()
  logp = jax.vmap(one_tree)(trees.features, trees.thresholds, jnp.log(dist))
  return logp.sum(0) - (trees.counts.shape[0] - 1) * jnp.log(prior)


def private_random_trees(key: jax.Array, x: Any, y: Any, *, num_classes: int, epsilon: float,
                         lower: Any, upper: Any, num_trees: int = 10, depth: int = 5,
                         tree_budget: str = "disjoint", clip: bool = False,
                         neighbouring: str = "replace_one", accountant: Any = None,
                         noise: str = "discrete") -> tuple[RandomTrees, events.DpEvent]:
  """An ``epsilon``-DP ensemble of random decision trees (module docstring).

  Args:
    key: a ``jax.random`` key, used once.
    x: ``(n, d)`` features inside the declared bounds.
    y: ``(n,)`` labels in ``{0, ..., num_classes - 1}``.
    num_classes: public number of classes.
    epsilon: total privacy parameter (``inf``: no noise).
    lower, upper: declared per-feature bounds (required).
    num_trees, depth: ``N`` and ``h``.
    tree_budget: ``"split"`` (every tree sees all data, ``epsilon/N`` each) or
      ``"disjoint"`` (one tree per record, parallel composition).
    clip: clip out-of-bound values instead of raising.
    neighbouring: ``"replace_one"`` or ``"add_remove"``.
    accountant: optional accountant/budget, spent before release.
    noise: ``"discrete"`` (default: integer leaf counts plus discrete Laplace integers) or
      ``"continuous"`` (float Laplace); module docstring.
  """
  _validation.check_key(key)
  noise = _common.check_noise(noise)
  arr, lo, hi = _common.check_bounded_data(x, lower, upper, clip=clip)
  c = _validation.check_positive_int(num_classes, "num_classes")
  yy = _common.check_labels(y, c, arr.shape[0])
  h = _validation.check_positive_int(depth, "depth")
  if h > 20:
    raise ValueError(f"depth must be <= 20 (2^depth leaves per tree), got {h}.")
  scale = random_trees_scale(num_trees=num_trees, epsilon=epsilon, tree_budget=tree_budget,
                             neighbouring=neighbouring, noise=noise)
  discrete_ts = None
  if noise == "discrete" and scale > 0:
    discrete_ts = random_trees_noise_parameters(num_trees=num_trees, epsilon=epsilon,
                                                tree_budget=tree_budget, neighbouring=neighbouring)
  event = random_trees_event(epsilon, neighbouring, noise)
  _common.spend(accountant, event)
  trees = _fit_core(key, jnp.asarray(arr, jnp.float32), jnp.asarray(yy, jnp.int32),
                    jnp.asarray(lo, jnp.float32), jnp.asarray(hi, jnp.float32),
                    num_trees=int(num_trees), depth=h, num_classes=c,
                    disjoint=tree_budget == "disjoint", scale=float(scale),
                    discrete_ts=discrete_ts)
  return trees, event


class PrivateRandomTrees(checks.SharedAccountantMixin, ClassifierMixin, BaseEstimator):
  """Private random decision tree ensemble, a scikit-learn classifier.

  ``noise``: ``"discrete"`` (default) or ``"continuous"``, as :func:`private_random_trees`.

  ``classes``: the PUBLIC label set, as for every jaxdp estimator
  (:func:`jaxdp._estimator_checks.encode_labels`; ``None`` is NOT private and warns).

  scikit-learn conventions, a shared ``accountant`` and the noise-key rule
  (``seed=None``: fresh OS entropy per fit):
  :class:`jaxdp._estimator_checks.SharedAccountantMixin`.

  Attributes (after ``fit``): ``trees_`` (the private :class:`RandomTrees`),
  ``event_``, ``classes_`` (the label set, public when ``classes`` is given),
  ``n_features_in_``.
  """

  def __init__(self, *, epsilon: float, classes: Any = None, lower: Any = None, upper: Any = None,
               n_estimators: int = 10, depth: int = 5, tree_budget: str = "disjoint",
               clip: bool = False, neighbouring: str = "replace_one", accountant: Any = None,
               seed: Any = None, combine: str = "product", noise: str = "discrete"):
    self.epsilon = epsilon
    self.noise = noise
    self.classes = classes
    self.lower, self.upper, self.clip = lower, upper, clip
    self.n_estimators, self.depth, self.tree_budget = n_estimators, depth, tree_budget
    self.neighbouring = neighbouring
    self.accountant, self.seed = accountant, seed
    self.combine = combine
    self._fits = 0

  def _check_params(self) -> dict[str, Any]:
    """The parameters checked (before any work); the attributes are left unchanged."""
    epsilon = _validation.check_epsilon(self.epsilon, "epsilon", allow_inf=True)
    noise = _common.check_noise(self.noise)
    classes = checks.check_classes(self.classes, "classes")
    n_estimators = _validation.check_positive_int(self.n_estimators, "n_estimators")
    depth = _validation.check_positive_int(self.depth, "depth")
    neighbouring = _common.check_relation(self.neighbouring)
    _common.check_accountant(self.accountant)
    _keys.check_seed(self.seed, "seed")
    combine = _check_combine(self.combine)
    return dict(epsilon=epsilon, noise=noise, classes=classes,
                n_estimators=n_estimators, depth=depth, neighbouring=neighbouring,
                combine=combine)

  def fit(self, x: Any, y: Any) -> "PrivateRandomTrees":
    """Fits privately; parameters, ``x`` and ``y`` are checked before any key or spend."""
    p = self._check_params()
    x_np = checks.check_x(x, "x")
    y_np = checks.check_y(y, x_np.shape[0], "y")
    classes, y_idx = checks.encode_labels(y_np, p["classes"], "y", "classes", stacklevel=3)
    key = _keys.fit_key(self.seed, self._fits)
    self._fits += 1
    self.trees_, self.event_ = private_random_trees(
        key, x_np, y_idx, num_classes=classes.size, epsilon=p["epsilon"], lower=self.lower,
        upper=self.upper, num_trees=p["n_estimators"], depth=p["depth"],
        tree_budget=self.tree_budget, clip=self.clip, neighbouring=p["neighbouring"],
        accountant=self.accountant, noise=p["noise"])
    self.classes_ = classes
    self.n_features_in_ = int(x_np.shape[1])
    self._depth, self._combine = p["depth"], p["combine"]
    return self

  def predict(self, x: Any) -> np.ndarray:
    """The label of ``classes_`` with the highest combined score, for every row."""
    checks.check_is_fitted(self, "trees_")  # NotFittedError (a ValueError)
    x = _common.check_query_x(x, self.n_features_in_, self)
    s = predict_scores(self.trees_, jnp.asarray(x, jnp.float32), self._depth,
                       combine=self._combine)
    return self.classes_[np.asarray(jnp.argmax(s, axis=1))]

  def predict_proba(self, x: Any) -> np.ndarray:
    """Class probabilities ``(n, len(classes_))`` from the released leaf counts; rows sum to 1.

    ``combine="average"``: the mean over trees of the leaf distributions (as
    scikit-learn's ``RandomForestClassifier.predict_proba``); ``"product"``: the
    softmax of the combined log scores (the normalised product of the trees' leaf
    distributions over the prior). Post-processing of the released trees; the
    argmax is :meth:`predict`.
    """
    checks.check_is_fitted(self, "trees_")
    x = _common.check_query_x(x, self.n_features_in_, self)
    s = np.asarray(predict_scores(self.trees_, jnp.asarray(x, jnp.float32), self._depth,
                                  combine=self._combine), np.float64)
    if self._combine == "average":
      return s / s.sum(axis=1, keepdims=True)
    return np.exp(s - scipy.special.logsumexp(s, axis=1, keepdims=True))

  def score(self, x: Any, y: Any) -> float:
    """Accuracy: the share of rows whose predicted label equals ``y``'s."""
    return float(np.mean(self.predict(x) == np.asarray(y)))
