"""Neighbouring pairs whose differing record is valid but extreme for the arithmetic.

jaxdp issue 40 section 2 ("Records that break arithmetic"): the conformance
checks run on worst-case neighbouring pairs of well-behaved data, so they
cannot see a release that becomes NaN/inf when ONE record is extreme. A NaN on
D' and a number on D is an event of probability 1 under D' and 0 under D: the
privacy loss is infinite, whatever noise was added. This module builds, for
every registered :class:`~conformance_registry.ReleasePoint`, pairs (D, D'')
that are neighbours under the entry's relation and whose differing record is
extreme; ``conformance_checks.check_extreme_records`` runs the release on both
sides and requires finite releases with the same support, or a clear refusal
of the input before any spend.

Generic construction (:func:`generic_extreme_pairs`), from the entry's FIRST
(worst-case) pair ``(D, D')``:

1. Locate the differing record. The datasets are pytrees (a dict of arrays, a
   tuple, one array); every array leaf with ``ndim >= 1`` has records along
   axis 0, and leaves of one leading size form a *group* whose rows are joint
   records (``x[i]`` and ``y[i]``). Same shapes (replace-one, or a statistic
   moved in place): the record is the set of rows where any leaf of the group
   differs. Different leading sizes (add/remove): the record is the rows of the
   larger side left over after matching every row of the smaller side (a
   multiset match of joint rows, so a user's several rows, or an inserted
   row, are found wherever they sit).
2. Rewrite the record (on the side that holds it: D' for replace-one, the
   larger side for add/remove). In each group, float leaves with ``ndim >= 2``
   are *features*, 1-D float leaves beside them *targets* (regression targets,
   float labels), 1-D integer leaves *labels*; a group without a feature
   matrix has its float leaves as features (a statistic, a score vector, a 1-D
   sample). :data:`VARIANTS`: the record's features at float32's largest
   finite value (``f32_max``), its negation, ``1e19`` (whose square is finite
   but a sum of a few squares overflows float32), the smallest float32
   subnormal; ``edge``: the record's feature rows rescaled to the largest row
   norm of their leaf (a unit-norm row when the data live in the unit ball),
   its targets at the largest |target| seen and its labels at the largest
   label seen; ``zero_others``: every OTHER record's features exactly zero on
   both sides (all-zero features: exactly-zero gradients for the others),
   alone or with the ``f32_max`` record (``zero_others_f32_max``);
   ``target_1e30``: the record's targets at ``1e30`` (huge but finite; its
   square overflows float32), its features unchanged.

Variants that leave the pair unchanged (no float entry in the record, no other
record) are dropped, so an entry may get fewer than :data:`VARIANTS`. Integer
matrices (vote or count matrices) are never rewritten generically: the values
an integer leaf may take are not implied by its dtype, so entries whose
private data are integers only give ``ReleasePoint.extreme_pairs`` (all votes
on one class, the maximum count) or a ``skip["extreme"]`` reason.

The extreme pairs are deliberately NOT required to honour the entry's claimed
sensitivity (a mechanism's caller promises it; a record of norm 3.4e38 is
clipped by a training method): the check is about the arithmetic (finite,
same support), not the noise scale.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Callable, Optional, Sequence

import jax
import numpy as np

F32_MAX = float(np.finfo(np.float32).max)  # 3.4028235e38
F32_SUBNORMAL = float(np.float32(1e-45))  # 2^-149, the smallest positive float32

# Variant name -> the value written into the record's feature entries.
_CONSTANTS = {
    "f32_max": F32_MAX,
    "neg_f32_max": -F32_MAX,
    "1e19": 1e19,  # its square, 1e38, is finite, but a sum of a few squares overflows float32
    "subnormal": F32_SUBNORMAL,
}
TARGET_VALUE = 1e30  # a huge-but-finite regression target / float label (its square overflows)
VARIANTS = tuple(_CONSTANTS) + ("edge", "zero_others", "zero_others_f32_max", "target_1e30")
# The always-on subset (tests/privacy/test_extreme_records.py): the float32 overflow threshold
# and exactly-zero other records.
FAST_VARIANTS = ("f32_max", "zero_others")
MAX_VARIANTS = 8  # per entry: every variant costs two releases


@dataclasses.dataclass(frozen=True)
class ExtremePair:
  """One neighbouring pair with an extreme record.

  Attributes:
    variant: the variant's name (a name of :data:`VARIANTS`, or ``"specific[i]"``
      for the i-th pair of ``ReleasePoint.extreme_pairs``).
    pair: ``(D, D'')``, neighbours under the entry's relation.
    extreme_side: the index in ``pair`` of the dataset that holds the extreme
      record (1 for entry-specific pairs, by convention of ``extreme_pairs``).
  """
  variant: str
  pair: tuple
  extreme_side: int = 1


def _leaves(data: Any) -> tuple[list, Any]:
  return jax.tree.flatten(data, is_leaf=lambda x: isinstance(x, np.ndarray))


def _is_array(x: Any) -> bool:
  return isinstance(x, (np.ndarray, jax.Array)) and np.ndim(x) >= 1


def _is_float(x: np.ndarray) -> bool:
  return np.issubdtype(x.dtype, np.floating)


def _row_keys(arrays: list[np.ndarray]) -> list[bytes]:
  """One hashable signature per row (axis 0) of arrays sharing their leading size."""
  n = arrays[0].shape[0]
  return [b"|".join(np.ascontiguousarray(a[i]).tobytes() for a in arrays) for i in range(n)]


@dataclasses.dataclass
class _Located:
  """Where the differing record sits: per leaf index, its rows on each side."""
  small: list  # leaves of the side WITHOUT the extra rows (D for replace-one)
  big: list    # leaves of the side WITH the record (D' for replace-one)
  big_side: int
  # leaf index -> (rows of the record in ``big``, rows of the others in ``big``, rows of the
  # others in ``small``); leaves not in it hold no part of the record.
  rows: dict


def locate_record(pair: tuple) -> Optional[_Located]:
  """The differing record of a neighbouring pair, or None when it cannot be located.

  See the module docstring: groups of leaves by leading size, rows that differ
  (same sizes) or rows left over by a multiset match (different sizes).
  """
  (a_leaves, a_def), (b_leaves, b_def) = _leaves(pair[0]), _leaves(pair[1])
  if a_def != b_def or len(a_leaves) != len(b_leaves):
    return None
  a_leaves = [np.asarray(x) if _is_array(x) else x for x in a_leaves]
  b_leaves = [np.asarray(x) if _is_array(x) else x for x in b_leaves]
  idx = [i for i, (x, y) in enumerate(zip(a_leaves, b_leaves)) if _is_array(x) and _is_array(y)]
  sizes = {i: (a_leaves[i].shape[0], b_leaves[i].shape[0]) for i in idx}
  grown = [i for i in idx if sizes[i][0] != sizes[i][1]]
  if grown:
    big_side = 1 if sizes[grown[0]][1] > sizes[grown[0]][0] else 0
    if any((sizes[i][1] > sizes[i][0]) != bool(big_side) for i in grown):
      return None
  else:
    big_side = 1
  small, big = (a_leaves, b_leaves) if big_side == 1 else (b_leaves, a_leaves)
  groups = collections.defaultdict(list)  # (small size, big size) -> leaf indices
  for i in idx:
    groups[(small[i].shape[0], big[i].shape[0])].append(i)
  rows = {}
  for (n_small, n_big), members in groups.items():
    if n_small == n_big:
      if any(small[i].shape != big[i].shape for i in members):
        return None
      differ = np.zeros(n_big, bool)
      for i in members:
        differ |= np.any((small[i] != big[i]).reshape(n_big, -1), axis=1)
      if not differ.any():
        continue
      record = np.flatnonzero(differ)
      others = np.flatnonzero(~differ)
      for i in members:
        rows[i] = (record, others, others)
      continue
    if n_big < n_small:
      return None
    pool = collections.defaultdict(list)
    for r, key in enumerate(_row_keys([small[i] for i in members])):
      pool[key].append(r)
    matched_big, matched_small = [], []
    for r, key in enumerate(_row_keys([big[i] for i in members])):
      if pool.get(key):
        matched_big.append(r)
        matched_small.append(pool[key].pop(0))
    if len(matched_small) != n_small:
      return None  # not "the small side plus some rows"
    record = np.setdiff1d(np.arange(n_big), matched_big)
    for i in members:
      rows[i] = (record, np.asarray(matched_big, int), np.asarray(matched_small, int))
  if not rows:
    return None
  return _Located(small=small, big=big, big_side=big_side, rows=rows)


def _edge_rows(leaf_small: np.ndarray, leaf_big: np.ndarray, record: np.ndarray) -> np.ndarray:
  """The record's rows rescaled to the largest row norm seen in the leaf (the domain's edge)."""
  both = np.concatenate([leaf_small, leaf_big]).astype(np.float64)
  flat = both.reshape(both.shape[0], -1)
  radius = float(np.max(np.linalg.norm(flat, axis=1), initial=0.0))
  rows = leaf_big[record].astype(np.float64).reshape(len(record), -1)
  norms = np.linalg.norm(rows, axis=1, keepdims=True)
  fallback = np.full_like(rows, 1.0 / np.sqrt(max(rows.shape[1], 1)))
  direction = np.where(norms > 0, rows / np.where(norms > 0, norms, 1.0), fallback)
  return (direction * radius).reshape((len(record),) + leaf_big.shape[1:])


def _roles(loc: _Located) -> dict[int, str]:
  """``{leaf index: "feature" | "target" | "label"}`` of the leaves that hold the record.

  In a group of leaves (one leading size), float leaves with ``ndim >= 2`` are
  the features and 1-D float leaves beside them are targets (regression
  targets, float labels); a group without a ``>= 2``-D float leaf has its float
  leaves as features (a statistic, scores, a 1-D sample). 1-D integer leaves
  are labels; other integer leaves (vote or count matrices) are left alone.
  """
  groups = collections.defaultdict(list)
  for i in loc.rows:
    groups[(loc.small[i].shape[0], loc.big[i].shape[0])].append(i)
  roles = {}
  for members in groups.values():
    has_matrix = any(_is_float(loc.big[i]) and loc.big[i].ndim >= 2 for i in members)
    for i in members:
      leaf = loc.big[i]
      if _is_float(leaf):
        roles[i] = "feature" if (leaf.ndim >= 2 or not has_matrix) else "target"
      elif np.issubdtype(leaf.dtype, np.integer) and leaf.ndim == 1:
        roles[i] = "label"
  return roles


def _apply(loc: _Located, variant: str) -> Optional[tuple[list, list]]:
  """The (small, big) leaves of ``variant``, or None when it changes nothing."""
  small = [x.copy() if isinstance(x, np.ndarray) else x for x in loc.small]
  big = [x.copy() if isinstance(x, np.ndarray) else x for x in loc.big]
  changed = False
  for i, role in _roles(loc).items():
    record, others_big, others_small = loc.rows[i]
    leaf_big = big[i]
    if role == "feature":
      if variant in _CONSTANTS or variant == "zero_others_f32_max":
        value = F32_MAX if variant == "zero_others_f32_max" else _CONSTANTS[variant]
        leaf_big[record] = np.asarray(value, leaf_big.dtype)
        changed = True
      elif variant == "edge":
        leaf_big[record] = _edge_rows(loc.small[i], loc.big[i], record).astype(leaf_big.dtype)
        changed = True
      if variant.startswith("zero_others") and len(others_big):
        leaf_big[others_big] = 0
        small[i][others_small] = 0
        changed = True
    elif role == "target":
      if variant == "target_1e30":
        leaf_big[record] = np.asarray(TARGET_VALUE, leaf_big.dtype)
        changed = True
      elif variant == "edge":  # the largest |target| seen, with the record's sign
        top = max(float(np.max(np.abs(loc.small[i]), initial=0.0)),
                  float(np.max(np.abs(loc.big[i]), initial=0.0)))
        leaf_big[record] = np.where(loc.big[i][record] < 0, -top, top).astype(leaf_big.dtype)
        changed = True
    elif role == "label" and variant == "edge":
      top = max(int(loc.small[i].max(initial=0)), int(loc.big[i].max(initial=0)))
      leaf_big[record] = top  # labels at the largest class seen
      changed = True
  return (small, big) if changed else None


def _same(a: list, b: list) -> bool:
  return all((x is y) or (isinstance(x, np.ndarray) and isinstance(y, np.ndarray)
                          and x.shape == y.shape and x.dtype == y.dtype
                          and np.array_equal(x, y, equal_nan=True))
             or (not isinstance(x, np.ndarray) and x == y)
             for x, y in zip(a, b))


def generic_extreme_pairs(pairs: Sequence[tuple],
                          variants: Sequence[str] = VARIANTS) -> list[ExtremePair]:
  """The generic extreme pairs built from the first pair of ``pairs`` (module docstring).

  Returns ``[]`` when the differing record cannot be located or no variant
  changes the pair (integer-only data): the entry then needs
  ``ReleasePoint.extreme_pairs`` or a ``skip["extreme"]`` reason.
  """
  pairs = list(pairs)
  if not pairs:
    return []
  pair = tuple(pairs[0])
  loc = locate_record(pair)
  if loc is None:
    return []
  treedef = _leaves(pair[0])[1]
  out: list[ExtremePair] = []
  seen: list[tuple[list, list]] = [(loc.small, loc.big)]
  for variant in variants:
    if variant not in VARIANTS:
      raise ValueError(f"unknown variant {variant!r}; use one of {VARIANTS}.")
    made = _apply(loc, variant)
    if made is None or any(_same(made[0], s) and _same(made[1], b) for s, b in seen):
      continue
    seen.append(made)
    small, big = (treedef.unflatten(made[0]), treedef.unflatten(made[1]))
    new_pair = (small, big) if loc.big_side == 1 else (big, small)
    out.append(ExtremePair(variant=variant, pair=new_pair, extreme_side=loc.big_side))
  return out[:MAX_VARIANTS]


def extreme_pairs_of(entry: Any, fast: bool = False) -> list[ExtremePair]:
  """The extreme pairs of a registered entry: entry-specific, else generic.

  ``entry.extreme_pairs()`` (when given) returns ``[(D, D''), ...]`` with the
  extreme record in D''; under ``fast`` only its first two pairs are used.
  Otherwise :func:`generic_extreme_pairs` of ``entry.pairs()`` with
  :data:`VARIANTS` (``fast``: :data:`FAST_VARIANTS`).
  """
  specific: Optional[Callable[[], Sequence]] = getattr(entry, "extreme_pairs", None)
  if specific is not None:
    made = [ExtremePair(variant=f"specific[{i}]", pair=tuple(p), extreme_side=1)
            for i, p in enumerate(specific())]
    return made[:2] if fast else made[:MAX_VARIANTS]
  return generic_extreme_pairs(entry.pairs(), FAST_VARIANTS if fast else VARIANTS)


def describe(pair: ExtremePair) -> str:
  """A short human-readable description of an extreme pair (for failure messages)."""
  def leaf_text(data):
    leaves, _ = _leaves(data)
    parts = []
    for x in leaves:
      if _is_array(x):
        x = np.asarray(x)
        parts.append(f"{x.dtype}{x.shape} max|.|={float(np.max(np.abs(x), initial=0)):.3g}")
    return ", ".join(parts)
  return (f"{pair.variant} (extreme record on side {pair.extreme_side}; "
          f"D: {leaf_text(pair.pair[0])}; D'': {leaf_text(pair.pair[1])})")
