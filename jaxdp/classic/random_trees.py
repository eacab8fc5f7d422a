r"""Differentially private random decision tree ensembles (paper 004, Sec. 3.3, Eq. 31).

Paper 004 = ``../shared/papers/004_dp_machine_learning_survey.md``; Jagannathan,
Pillaipakkamnatt & Wright (2009). Each of ``N`` trees of depth ``h`` is chosen
WITHOUT looking at the data: every internal node draws a feature uniformly and
a threshold uniformly in that feature's declared bounds ``[l_j, u_j]`` (a
missing bound is an error). A record follows ``x_j > t`` branches to one of
``2^h`` leaves; the leaf holds class counts ``l_{v,c}`` (Eq. 31), released
with Laplace noise. Prediction averages the leaves' smoothed class
distributions over trees and takes the argmax (post-processing).

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

Either way the whole ensemble is one ``LaplaceDpEvent(1/epsilon)`` (an
``epsilon``-DP Laplace mechanism on a sum). The trees are vmapped.
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxdp import _validation
from jaxdp.accounting import events
from jaxdp.classic import _common
from jaxdp.mechanisms import laplace_noise

TREE_BUDGETS = ("split", "disjoint")


class RandomTrees(NamedTuple):
  features: jax.Array     # (N, 2^h - 1) int32 feature of every internal node (heap order)
  thresholds: jax.Array   # (N, 2^h - 1)
  counts: jax.Array       # (N, 2^h, C) noisy leaf counts


def random_trees_scale(*, num_trees: int, epsilon: float, tree_budget: str = "disjoint",
                       neighbouring: str = "replace_one") -> float:
  """Laplace scale of every leaf count (module docstring); 0 for ``epsilon = inf``."""
  n_trees = _validation.check_positive_int(num_trees, "num_trees")
  if tree_budget not in TREE_BUDGETS:
    raise ValueError(f"tree_budget must be one of {TREE_BUDGETS}, got {tree_budget!r}.")
  eps = _validation.check_epsilon(epsilon, "epsilon", allow_inf=True)
  per_record = float(n_trees) if tree_budget == "split" else 1.0
  sens = _common.sum_sensitivity(per_record, neighbouring)
  return 0.0 if math.isinf(eps) else sens / eps


def random_trees_event(epsilon: float, neighbouring: str = "replace_one") -> events.DpEvent:
  eps = _validation.check_epsilon(epsilon, "epsilon", allow_inf=True)
  if math.isinf(eps):
    return events.NonPrivateDpEvent()
  return events.LaplaceDpEvent(noise_multiplier=1.0 / eps, neighbouring=_common.check_relation(neighbouring))


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
  feats = jax.random.randint(kf, (num_trees, n_nodes), 0, lo.shape[0])
  u = jax.random.uniform(kt, (num_trees, n_nodes), lo.dtype)
  return feats, lo[feats] + u * (hi - lo)[feats]


@functools.partial(jax.jit, static_argnames=("num_trees", "depth", "num_classes", "disjoint", "scale"))
def _fit_core(key, x, y, lo, hi, *, num_trees, depth, num_classes, disjoint, scale):
  k_struct, k_assign, k_noise = jax.random.split(key, 3)
  feats, thr = _random_structure(k_struct, num_trees, depth, lo, hi)
  onehot_y = jax.nn.one_hot(y, num_classes, dtype=x.dtype)                      # (n, C)
  if disjoint:
    owner = jax.random.randint(k_assign, (x.shape[0],), 0, num_trees)
    weights = jax.nn.one_hot(owner, num_trees, dtype=x.dtype).T                # (N, n)
  else:
    weights = jnp.ones((num_trees, x.shape[0]), x.dtype)

  def one_tree(f, t, w):
    # Leaf-by-class counts as a segment sum over the rows' leaf indices: memory O(n C + L C)
    # per tree (a one-hot (n, L) leaf matrix would need n 2^depth floats per tree).
    return jax.ops.segment_sum(onehot_y * w[:, None], leaf_index(x, f, t, depth),
                               num_segments=2 ** depth)                        # (L, C)

  counts = jax.vmap(one_tree)(feats, thr, weights)
  return RandomTrees(feats, thr, counts + laplace_noise(k_noise, counts.shape, scale, x.dtype))


@functools.partial(jax.jit, static_argnames=("depth",))
def predict_scores(trees: RandomTrees, x, depth: int, smoothing: float = 1.0):
  """Mean over trees of the leaf class distributions of each row: ``(n, C)``.

  A leaf's distribution is ``(max(l~_{v,c}, 0) + smoothing)`` normalised over
  classes (Fan et al. 2003's probability averaging; post-processing).
  """
  def one_tree(f, t, c):
    p = jnp.maximum(c, 0.0) + smoothing
    p = p / p.sum(-1, keepdims=True)
    return p[leaf_index(x, f, t, depth)]
  return jax.vmap(one_tree)(trees.features, trees.thresholds, trees.counts).mean(0)


def private_random_trees(key: jax.Array, x: Any, y: Any, *, num_classes: int, epsilon: float,
                         lower: Any, upper: Any, num_trees: int = 10, depth: int = 5,
                         tree_budget: str = "disjoint", clip: bool = False,
                         neighbouring: str = "replace_one",
                         accountant: Any = None) -> tuple[RandomTrees, events.DpEvent]:
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
  """
  _validation.check_key(key)
  arr, lo, hi = _common.check_bounded_data(x, lower, upper, clip=clip)
  c = _validation.check_positive_int(num_classes, "num_classes")
  yy = _common.check_labels(y, c, arr.shape[0])
  h = _validation.check_positive_int(depth, "depth")
  if h > 20:
    raise ValueError(f"depth must be <= 20 (2^depth leaves per tree), got {h}.")
  scale = random_trees_scale(num_trees=num_trees, epsilon=epsilon, tree_budget=tree_budget,
                             neighbouring=neighbouring)
  event = random_trees_event(epsilon, neighbouring)
  _common.spend(accountant, event)
  trees = _fit_core(key, jnp.asarray(arr, jnp.float32), jnp.asarray(yy, jnp.int32),
                    jnp.asarray(lo, jnp.float32), jnp.asarray(hi, jnp.float32),
                    num_trees=int(num_trees), depth=h, num_classes=c,
                    disjoint=tree_budget == "disjoint", scale=float(scale))
  return trees, event


class PrivateRandomTrees:
  """scikit-learn-like private random decision tree ensemble."""

  def __init__(self, *, epsilon: float, num_classes: int, lower: Any = None, upper: Any = None,
               n_estimators: int = 10, depth: int = 5, tree_budget: str = "disjoint",
               clip: bool = False, neighbouring: str = "replace_one", accountant: Any = None,
               seed: int = 0):
    self.epsilon = _validation.check_epsilon(epsilon, "epsilon", allow_inf=True)
    self.num_classes = _validation.check_positive_int(num_classes, "num_classes")
    self.lower, self.upper, self.clip = lower, upper, clip
    self.n_estimators, self.depth, self.tree_budget = n_estimators, depth, tree_budget
    self.neighbouring = _common.check_relation(neighbouring)
    self.accountant, self.seed = accountant, seed
    self._fits = 0

  def fit(self, x: Any, y: Any) -> "PrivateRandomTrees":
    key = _common.fit_key(self.seed, self._fits)
    self._fits += 1
    self.trees_, self.event_ = private_random_trees(
        key, x, y, num_classes=self.num_classes, epsilon=self.epsilon, lower=self.lower,
        upper=self.upper, num_trees=self.n_estimators, depth=self.depth,
        tree_budget=self.tree_budget, clip=self.clip, neighbouring=self.neighbouring,
        accountant=self.accountant)
    self.classes_ = np.arange(self.num_classes)
    return self

  def predict(self, x: Any) -> np.ndarray:
    if not hasattr(self, "trees_"):
      raise ValueError("this estimator is not fitted yet; call fit(x, y) first.")
    s = predict_scores(self.trees_, jnp.asarray(x, jnp.float32), int(self.depth))
    return np.asarray(jnp.argmax(s, axis=1))

  def score(self, x: Any, y: Any) -> float:
    return float(np.mean(self.predict(x) == np.asarray(y)))
