"""The generic privacy checks run on every registered :class:`ReleasePoint`.

Each ``check_*`` function takes one entry (``conformance_registry.ReleasePoint``)
and raises ``AssertionError`` with a message that names the entry, the check
and the violated rule when the release breaks its claim. ``test_power.py``
injects defects and asserts that the named check raises, so every check here
is shown to have power, not only to pass.

What each check proves (and what it does not) is in ``tests/privacy/README.md``.
In short:

* :func:`check_replay` (same-randomness replay; Cebere et al. 2026): with the
  same key on neighbours D, D', an additive-noise release ``f(D) + Z`` differs
  by ``f(D) - f(D')``, whose norm must be within the claimed sensitivity.
* :func:`check_fresh`: no explicit key means fresh randomness (two calls, two
  processes); the same explicit key reproduces; a keyed API refuses ``None``.
* :func:`check_charge`: the ledger grows by exactly the number of independent
  releases returned (batched APIs included), and a budget one release short
  refuses before spending anything.
* :func:`check_no_nonprivate`: no field of the returned object is a
  deterministic function of the data (except under ``nonprivate_`` names or the
  entry's ``public_outputs``).
* :func:`check_support`: grid releases lie on the public grid ``step * Z``,
  discrete releases are integral.
* :func:`check_noise_scale`: the empirical noise scale is not 20% below the
  theorem's scale (a test with both error probabilities below 1e-6; host-side
  releases: miss probability 1e-3 always on, 1e-6 under ``slow``) nor 50% above.
* :func:`check_audit`: a Clopper-Pearson lower bound (95%) on epsilon from a
  distinguishing test on the first (worst-case) pair stays within the claim.

All randomness of the checks comes from fixed seeds: a check's verdict is
reproducible.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import hashlib
import json
import math
import os
import pathlib
import subprocess
import sys
from typing import Any, Callable, Iterable, Optional

import jax
import numpy as np
from scipy import stats as sp_stats

import conformance_registry as reg

# Check names as used in ``ReleasePoint.skip`` (and aliases an entry may use).
CHECKS = ("replay", "fresh", "charge", "no_nonprivate", "support", "noise", "audit")
SLOW_CHECKS = ("audit_slow",)
# Checks run by their own test file (not by test_conformance.py), whose names ``skip`` accepts:
# ``extreme`` is check_extreme_records (tests/privacy/test_extreme_records.py).
EXTRA_CHECKS = ("extreme",)
SKIP_ALIASES = {
    "noise_scale": "noise",
    "nonprivate": "no_nonprivate",
    "charged": "charge",
    "fresh_randomness": "fresh",
    "same_key_replay": "replay",
    "slow_audit": "audit_slow",
}
FAMILIES = ("mechanisms", "accounting", "training", "dpsgd", "prediction", "multiparty",
            "inference", "classic", "tuning")
RELATIONS = ("add_remove", "replace_one")
NORMS = ("l1", "l2", "linf")
NOISE_KINDS = ("laplace", "gaussian", "l2_laplace", "discrete_laplace", "discrete_gaussian")

# Error probabilities of the noise-scale test (each side; see check_noise_scale).
NOISE_FALSE_ALARM = 1e-6
NOISE_MISS = 1e-6
NOISE_UNDER_FACTOR = 0.8  # a scale 20% too small must be caught
NOISE_OVER_FACTOR = 1.5   # a scale 50% too large (wrong units) must be caught
# Host-side (non-vmappable) releases are looped; at most this many calls per
# noise check (enough for full power with one noise coordinate of every kind; a
# check limited by it states its reduced power instead of running longer).
MAX_LOOP_DRAWS = 2000
# Host-side releases in the always-on run: enough draws that a 20% smaller scale is
# caught with probability >= 1 - LOOP_FAST_MISS (the false-alarm rate stays
# NOISE_FALSE_ALARM: the thresholds are the exact quantiles at the number of
# coordinates drawn); the full power (1 - NOISE_MISS) under ``slow``
# (``check_noise_scale(entry, slow=True)``, test_conformance.test_noise_slow).
LOOP_FAST_MISS = 1e-3
MAX_VMAP_DRAWS = 200_000
REPLAY_KEYS = 3
NONPRIVATE_CONFIRM_KEYS = 3
AUDIT_CONFIDENCE = 0.95

# Unit roundoff allowance of the replay check (see _replay_slack).
_F32_EPS = float(np.finfo(np.float32).eps)  # 2^-23 = twice float32's unit roundoff 2^-24
_REL_SLACK = 1e-9  # the float64 sensitivity claim itself may carry a few ulps


def canonical_skip(entry: reg.ReleasePoint) -> dict[str, str]:
  """``entry.skip`` with aliases resolved to the names of :data:`CHECKS`."""
  return {SKIP_ALIASES.get(k, k): v for k, v in entry.skip.items()}


def _fail(entry: reg.ReleasePoint, check: str, message: str) -> None:
  raise AssertionError(f"[{check}] {entry.name}: {message}")


# ---------------------------------------------------------------------------
# Keys and batched release.
# ---------------------------------------------------------------------------

# Seeds of the checks' keys (distinct per check, so checks are independent).
_SEEDS = {"shared": 11, "bulk": 13, "replay": 101, "fresh": 202, "no_nonprivate": 303, "support": 404, "noise": 505,
          "audit": 606, "audit_slow": 707, "extreme": 808}


def keys_for(check: str, num: int, offset: int = 0) -> jax.Array:
  """``num`` typed ``jax.random`` keys for ``check`` (fixed seed: reproducible verdicts)."""
  base = jax.random.fold_in(jax.random.key(_SEEDS[check]), offset)
  return jax.random.split(base, num)


# Key data on the host. Every key is jax's own (``split`` and ``fold_in`` above and in
# bulk_keys); they are kept as numpy key data and wrapped where a release needs them,
# because indexing, concatenating, broadcasting or folding a device key array compiles a
# program per NUMBER of keys (about 0.2 s per count on a CPU, and the entries draw many
# counts), while wrapping compiles once per batch size (one key: once per process).
_FOLD_CHUNK = 4096  # bulk keys are folded in chunks of this many: one compiled program
_FOLD = jax.jit(jax.vmap(lambda base, i: jax.random.key_data(jax.random.fold_in(base, i)),
                         in_axes=(None, 0)))
_KEY_DATA: dict = {}  # ("shared",) / ("bulk", side, chunk) -> numpy key data


def wrap_keys(data: np.ndarray) -> jax.Array:
  """Typed keys from key data (``(..., 2)`` uint32 for the default threefry keys)."""
  return jax.random.wrap_key_data(np.ascontiguousarray(data))


def shared_key_data() -> np.ndarray:
  """Key data of ``keys_for("shared", SHARED_KEYS)`` (computed once)."""
  if ("shared",) not in _KEY_DATA:
    _KEY_DATA[("shared",)] = np.asarray(jax.random.key_data(keys_for("shared", SHARED_KEYS)))
  return _KEY_DATA[("shared",)]


def bulk_key_data(side: int, start: int, stop: int) -> np.ndarray:
  """Key data of bulk keys ``start..stop-1`` of ``side``: ``fold_in(bulk base of side, i)``.

  The same values as folding ``jnp.arange(start, stop)`` at once; computed by chunks of
  ``_FOLD_CHUNK`` indices (one compiled program whatever the count) and kept: every entry
  draws from the same two streams.
  """
  parts = []
  i = start
  while i < stop:
    chunk = i // _FOLD_CHUNK
    slot = ("bulk", side, chunk)
    if slot not in _KEY_DATA:
      base = jax.random.fold_in(jax.random.key(_SEEDS["bulk"]), side)
      idx = np.arange(chunk * _FOLD_CHUNK, (chunk + 1) * _FOLD_CHUNK, dtype=np.int32)
      _KEY_DATA[slot] = np.asarray(_FOLD(base, idx))
    lo = i - chunk * _FOLD_CHUNK
    hi = min(stop - chunk * _FOLD_CHUNK, _FOLD_CHUNK)
    parts.append(_KEY_DATA[slot][lo:hi])
    i = (chunk + 1) * _FOLD_CHUNK
  if not parts:
    return shared_key_data()[:0]
  return np.concatenate(parts)


def batch_keys(side: int, size: int) -> jax.Array:
  """The ``SHARED_KEYS`` shared keys, then bulk keys ``0..size - SHARED_KEYS - 1`` of ``side``."""
  return wrap_keys(np.concatenate([shared_key_data(),
                                   bulk_key_data(side, 0, size - SHARED_KEYS)]))


def as_vector(entry: reg.ReleasePoint, output: Any) -> np.ndarray:
  """``entry.vector(output)`` as a 1-D float64 array."""
  return np.asarray(entry.vector(output), dtype=np.float64).ravel()


# Entries whose release cannot run under jax.vmap over keys (host-side fits):
# remembered so that the failing vmap attempt is made once per entry.
_NOT_VMAPPABLE: set = set()


def _flag(entry: reg.ReleasePoint) -> tuple:
  return (entry.name, id(entry.release))


# Names of entries whose release is known to run host-side (a certified numpy solve, an
# estimator fit): a vmapped attempt fails only after tracing most of the release
# (seconds of op-by-op compilation per attempt), so these are looped from the start.
# Declared by the entries' modules with ``host_side(name)``; a wrong declaration only
# costs speed (the looped release is the same function), never a verdict.
HOST_SIDE: set = set()


def host_side(*names: str) -> None:
  """Declares registered entries whose release cannot run under ``jax.vmap`` (looped)."""
  HOST_SIDE.update(names)


# Host-side entries whose noise check would cost more than seconds in the default run (one
# noise coordinate per looped release): it runs under ``slow`` (test_conformance.test_noise_slow,
# full power) and in test_power's rows, with the same assertion.
SLOW_NOISE: set = set()
# (entry, check) cases that run only under ``slow``: entries whose every check compiles a
# whole training step, covered in the default run by a sibling entry of the same code path
# (the plan cell with the same clipper and noise) and, for their under-noising, by test_power.
SLOW_CASES: set = set()


def slow_checks(name: str, *checks: str) -> None:
  """Declares checks of ``name`` (all but ``schema`` when none are named) to run under slow."""
  for check in checks or CHECKS:
    if check != "schema":
      SLOW_CASES.add((name, check))


def slow_noise(*names: str) -> None:
  """Declares host-side entries whose noise check runs only under ``slow`` (and in test_power)."""
  SLOW_NOISE.update(names)
  HOST_SIDE.update(names)


def is_vmappable(entry: reg.ReleasePoint) -> bool:
  """False for a declared host-side entry, or once a vmapped release has failed (looped)."""
  return entry.name not in HOST_SIDE and _flag(entry) not in _NOT_VMAPPABLE


def _take(tree: Any, i: int) -> Any:
  return jax.tree.map(lambda x: x[i], tree)


class Batch:
  """Outputs of one release under several keys: stacked numpy leaves (vmapped) or a list.

  A vmapped batch keeps the output's tree structure, the stacked array leaves
  and the ``DpEvent`` leaves (public descriptions, identical for every key of
  one dataset; see :func:`_try_vmap`); ``batch[i]`` rebuilds the i-th output.
  """

  def __init__(self, stacked: Any = None, items: Optional[list] = None, size: int = 0,
               treedef: Any = None, events: Optional[dict] = None):
    self.stacked, self.items, self.size = stacked, items, size if items is None else len(items)
    self.treedef, self.events = treedef, events or {}

  def __len__(self) -> int:
    return self.size

  def __getitem__(self, i: int) -> Any:
    if self.items is not None:
      return self.items[i]
    if self.treedef is None:
      return _take(self.stacked, i)
    leaves = [self.events[j] if j in self.events else leaf[i]
              for j, leaf in enumerate(self.stacked)]
    return self.treedef.unflatten(leaves)


def _holds_tracer(x: Any, depth: int = 0) -> bool:
  """Whether a Python object (a DpEvent leaf) holds a JAX tracer anywhere inside."""
  if isinstance(x, jax.core.Tracer):
    return True
  if depth >= _MAX_DEPTH or isinstance(x, _SKIP_TYPES):
    return False
  if isinstance(x, (list, tuple)):
    return any(_holds_tracer(v, depth + 1) for v in x)
  if isinstance(x, dict):
    return any(_holds_tracer(v, depth + 1) for v in x.values())
  names = [a.name for a in getattr(type(x), "__attrs_attrs__", ())]  # dp_accounting's events
  if dataclasses.is_dataclass(x):
    names += [f.name for f in dataclasses.fields(x)]
  names += list(getattr(x, "__dict__", {}))
  return any(_holds_tracer(getattr(x, n, None), depth + 1) for n in set(names))


def _is_key_array(x: Any) -> bool:
  return isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def _try_vmap(entry: reg.ReleasePoint, keys: jax.Array, data: Any) -> Optional[Batch]:
  """The release vmapped over ``keys`` (numpy leaves); None if it cannot be vmapped.

  No ``jit``: the data stay concrete, so eager validation in the release still
  runs. ``DpEvent`` leaves of the output (a result's ``event``: a public
  description built from the concrete data and parameters, never from the
  traced key) are not arrays: they are taken out of the traced output and put
  back into every output of the batch; an event that holds a tracer makes the
  entry not vmappable. Any exception marks the entry as not vmappable; the
  caller then loops (and a genuine error is raised from the loop).
  """
  if not is_vmappable(entry) or keys.shape[0] < 2:
    return None
  from jaxdp.accounting import events as ev  # pylint: disable=import-outside-toplevel
  structure: dict = {}

  def arrays_only(key):
    leaves, treedef = jax.tree.flatten(entry.release(key, data))
    found = {j: leaf for j, leaf in enumerate(leaves) if isinstance(leaf, ev.DpEvent)}
    if any(_holds_tracer(e) for e in found.values()):
      raise TypeError("a DpEvent of the output depends on the key")
    structure.update(treedef=treedef, events=found)
    return [None if j in found else leaf for j, leaf in enumerate(leaves)]

  try:
    outs = jax.vmap(arrays_only)(keys)
    stacked = [leaf if leaf is None or _is_key_array(leaf) else np.asarray(leaf)
               for leaf in outs]  # key arrays (an optimiser state's) stay JAX arrays
    return Batch(stacked=stacked, size=keys.shape[0], treedef=structure["treedef"],
                 events=structure["events"])
  except Exception:  # pylint: disable=broad-except  # not vmappable: the caller loops
    _NOT_VMAPPABLE.add(_flag(entry))
    return None


def run_batch(entry: reg.ReleasePoint, keys: jax.Array, data: Any) -> Batch:
  """``[entry.release(k, data) for k in keys]``, vmapped when the release allows it."""
  keys = jax.numpy.asarray(keys)
  batch = _try_vmap(entry, keys, data)
  if batch is None:
    rows = np.asarray(jax.random.key_data(keys))
    batch = Batch(items=[entry.release(wrap_keys(row), data) for row in rows])
  return batch


def map_outputs(entry: reg.ReleasePoint, keys: jax.Array, data: Any,
                post: Callable[[Any], Any]) -> np.ndarray:
  """``np.stack([post(entry.release(k, data)) for k in keys])`` (float64), vmapped when possible."""
  batch = run_batch(entry, keys, data)
  return np.stack([np.asarray(post(batch[i]), dtype=np.float64) for i in range(len(batch))])


def release_vectors(entry: reg.ReleasePoint, keys: jax.Array, data: Any) -> np.ndarray:
  """``(len(keys), d)`` float64 private vectors of the release on ``data``."""
  return map_outputs(entry, keys, data, lambda out: as_vector(entry, out))


# ---------------------------------------------------------------------------
# Per-entry cache. JAX compiles once per batch shape (seconds per shape for a
# sampler such as Gamma) and host-side fits are slow, so every check draws from
# two cached sets of releases:
# * SHARED: keys 0..SHARED_KEYS-1 on every (pair, side): replay, support and
#   no_nonprivate (one vmapped batch per DISTINCT dataset, or lazily looped fits;
#   a dataset repeated across pairs, usually D, is released once: dataset_fingerprint);
# * BULK: on the first pair, the shared keys' outputs followed by the keys
#   fold_in(bulk_seed(side), i): the noise check (side 0) and the cheap audit
#   (both sides).
# A vmapped release runs ONE batch per distinct dataset, of one size for the
# whole entry (batch_size: the shared keys, then bulk keys up to what the noise
# check and the audit use, when that is at most MAX_SHARED_BATCH), so every check
# reads one compiled batch shape; an entry that needs more (a 100,000-trial
# audit) runs SHARED_KEYS per dataset and one bulk batch per side of the first pair.
# Kept for the two most recent entries; clear_caches() after monkeypatching.
# ---------------------------------------------------------------------------

SHARED_KEYS = 2 + NONPRIVATE_CONFIRM_KEYS  # shared key i is keys_for("shared", SHARED_KEYS)[i]
# Largest batch run on EVERY distinct dataset of a vmapped entry: above it, releasing
# each dataset that many times costs more than compiling a second batch shape.
MAX_SHARED_BATCH = 2_000


def dataset_fingerprint(data: Any) -> Any:
  """A content key of a dataset: equal for datasets whose releases are equal under one key.

  ``release`` is a pure function of ``(key, D)``, so two datasets with the same
  pytree structure and the same leaves (shape, dtype, bytes) have the same
  releases; pairs usually share D (one base dataset, several D'), whose
  releases are then computed once. A leaf that is not plain numeric data (an
  object, a key array) falls back to the dataset's identity.
  """
  leaves, treedef = jax.tree.flatten(data)
  digest = hashlib.sha256(str(treedef).encode())
  for leaf in leaves:
    if isinstance(leaf, (str, bytes)):
      digest.update(repr(leaf).encode())
      continue
    if not isinstance(leaf, (np.ndarray, np.generic, jax.Array, int, float, complex)):
      return ("id", id(data))
    try:
      arr = np.asarray(leaf)
    except Exception:  # pylint: disable=broad-except  # key arrays and the like
      return ("id", id(data))
    if arr.dtype == object:
      return ("id", id(data))
    digest.update(f"{arr.shape}{arr.dtype.str}".encode())
    digest.update(np.ascontiguousarray(arr).tobytes())
  return digest.hexdigest()


class _Cache:
  def __init__(self, entry: reg.ReleasePoint):
    self.pairs = [tuple(p) for p in entry.pairs()]
    # (pair, side) -> content key of the dataset: datasets repeated across pairs (the
    # shared D of most pair lists) are released once per key.
    self.data_keys = {(p, side): dataset_fingerprint(d)
                      for p, pair in enumerate(self.pairs) for side, d in enumerate(pair)}
    self.shared: dict = {}    # data key -> Batch of batch_size(entry) outputs (vmapped)
    self.outputs: dict = {}   # (data key, i) -> output (looped)
    self.vectors: dict = {}   # (data key, num) -> (num, d) vectors
    self.bulk: dict = {}      # side -> Batch
    self.audit: dict = {}     # (trials, id(statistic)) -> (s0, s1) of the cheap audit


_CACHES: "collections.OrderedDict[tuple, _Cache]" = collections.OrderedDict()


# Entries whose cache outlives the two-entry window (see pin).
PINNED: set = set()


def pin(*names: str) -> None:
  """Keeps the caches of the named entries beyond the two most recent entries.

  For the few entries a later test checks again unpatched (test_power's always-on
  injection rows, test_selection_power): that check then reads the releases this
  process computed for test_conformance instead of computing them again. Only releases
  computed without a patch are ever cached past a test (clear_caches after every patch).
  """
  PINNED.update(names)


def clear_caches(*names: str) -> None:
  """Forgets cached pairs, releases and vmappability (call after monkeypatching the library).

  With ``names``, only those entries' (the entries a patched check ran on); the epsilon
  expectations of the charge check are always forgotten.
  """
  if names:
    for key in [k for k in _CACHES if k[0] in names]:
      del _CACHES[key]
    _NOT_VMAPPABLE.difference_update([f for f in _NOT_VMAPPABLE if f[0] in names])
  else:
    _CACHES.clear()
    _NOT_VMAPPABLE.clear()
  _EPSILON_OF.clear()  # a patched accountant must not meet expectations computed before


def _cache(entry: reg.ReleasePoint) -> _Cache:
  key = (entry.name, id(entry.release), id(entry.pairs), id(entry.vector))
  if key not in _CACHES:
    _CACHES[key] = _Cache(entry)
    unpinned = [k for k in _CACHES if k[0] not in PINNED and k != key]
    while len(unpinned) > 1:  # the two most recent entries (pinned ones do not count)
      del _CACHES[unpinned.pop(0)]
  _CACHES.move_to_end(key)
  return _CACHES[key]


def pairs_of(entry: reg.ReleasePoint) -> list:
  """``entry.pairs()`` (cached); AssertionError when there is none."""
  pairs = _cache(entry).pairs
  if not pairs:
    _fail(entry, "pairs", "pairs() returned no neighbouring pair.")
  return pairs


def shared_key(i: int) -> jax.Array:
  """Shared key ``i``: ``keys_for("shared", SHARED_KEYS)[i]``."""
  return wrap_keys(shared_key_data()[i])


def batch_size(entry: reg.ReleasePoint) -> int:
  """Outputs per vmapped batch of each dataset: :func:`bulk_size` up to ``MAX_SHARED_BATCH``.

  Above ``MAX_SHARED_BATCH``, ``SHARED_KEYS`` (the first pair's bulk outputs are
  then a second batch shape, see :func:`bulk_outputs`).
  """
  size = bulk_size(entry)
  return size if size <= MAX_SHARED_BATCH else SHARED_KEYS


def bulk_size(entry: reg.ReleasePoint) -> int:
  """Vmapped outputs the noise check and the audit use (at least ``SHARED_KEYS``).

  The noise check's draws come from the size of ``noise.reference(D)`` (the
  check fails when the output's size differs, see :func:`check_noise_scale`).
  """
  size = SHARED_KEYS
  if _applies(entry, "audit"):
    size = max(size, int(entry.audit.trials))
  if _applies(entry, "noise"):
    try:
      d = np.asarray(entry.noise.reference(_first_dataset(entry))).size
    except Exception:  # pylint: disable=broad-except  # reported by the noise check
      d = 0
    if d:
      size = max(size, _draws(entry, d, NOISE_MISS))
  return size


def _vmapped(entry: reg.ReleasePoint, pair: int, side: int) -> Optional[Batch]:
  """The cached vmapped batch of ``pairs[pair][side]``; None when the release is looped.

  Keys: the ``SHARED_KEYS`` shared keys, then the bulk keys of the first pair's
  side this dataset is (side 0 for a dataset not in the first pair), up to
  :func:`batch_size`: the same batch shape for every dataset of the entry.
  """
  cache = _cache(entry)
  dkey = cache.data_keys[(pair, side)]
  if dkey not in cache.shared and is_vmappable(entry):
    bulk_side = 1 if dkey == cache.data_keys[(0, 1)] != cache.data_keys[(0, 0)] else 0
    batch = _try_vmap(entry, batch_keys(bulk_side, batch_size(entry)),
                      pairs_of(entry)[pair][side])
    if batch is not None:
      cache.shared[dkey] = batch
  return cache.shared.get(dkey)


def output_at(entry: reg.ReleasePoint, pair: int, side: int, i: int) -> Any:
  """``entry.release(shared_key(i), pairs[pair][side])``, cached (a slice of a vmapped batch)."""
  cache = _cache(entry)
  data = pairs_of(entry)[pair][side]
  dkey = cache.data_keys[(pair, side)]
  batch = _vmapped(entry, pair, side)
  if batch is not None:
    return batch[i]
  slot = (dkey, i)
  if slot not in cache.outputs:
    cache.outputs[slot] = entry.release(shared_key(i), data)
  return cache.outputs[slot]


def vectors_at(entry: reg.ReleasePoint, pair: int, side: int, num: int) -> np.ndarray:
  """``(num, d)`` vectors of the release under shared keys ``0..num-1``, cached."""
  cache = _cache(entry)
  pairs_of(entry)
  slot = (cache.data_keys[(pair, side)], num)
  if slot not in cache.vectors:
    cache.vectors[slot] = np.stack([as_vector(entry, output_at(entry, pair, side, i))
                                    for i in range(num)])
  return cache.vectors[slot]


def bulk_keys(side: int, start: int, stop: int) -> jax.Array:
  """Keys ``start..stop-1`` of the bulk stream of ``side`` (independent of how many are drawn).

  Key ``i`` is ``jax.random.fold_in(fold_in(key(bulk seed), side), i)`` (see bulk_key_data).
  """
  return wrap_keys(bulk_key_data(side, start, stop))


def _applies(entry: reg.ReleasePoint, check: str) -> bool:
  spec = entry.noise if check == "noise" else entry.audit
  return spec is not None and check not in canonical_skip(entry)


def noise_draws(entry: reg.ReleasePoint, slow: bool = False) -> tuple[int, int]:
  """``(draws, d)``: releases the noise check uses and noise coordinates per release.

  Vmapped releases: enough for miss probability ``NOISE_MISS``. Host-side
  (looped) releases: ``LOOP_FAST_MISS`` unless ``slow``, at most
  ``MAX_LOOP_DRAWS``.
  """
  d = as_vector(entry, output_at(entry, 0, 0, 0)).size  # also decides vmappability
  miss = NOISE_MISS if slow or is_vmappable(entry) else LOOP_FAST_MISS
  draws = _draws(entry, d, miss)
  if not is_vmappable(entry):
    draws = min(draws, MAX_LOOP_DRAWS)
  return draws, d


def _draws(entry: reg.ReleasePoint, d: int, miss: float) -> int:
  """Releases of ``d`` noise coordinates that give the noise test miss probability ``miss``."""
  spec = entry.noise
  step = parse_support(entry.support)[1] if spec.kind.startswith("discrete") else None
  scale_mean = float(np.mean(np.asarray(spec.scale, dtype=np.float64)))
  needed = (coordinates_needed(spec.kind, round(scale_mean, 12), step, miss) if step
            else coordinates_needed(spec.kind, miss=miss))
  return min(max(2, math.ceil(needed / max(d, 1))), MAX_VMAP_DRAWS)


def bulk_outputs(entry: reg.ReleasePoint, side: int, num: int) -> Batch:
  """``num`` releases on the first pair's ``side``: shared keys, then bulk keys (cached).

  Vmapped: the dataset's cached batch (:func:`_vmapped`: the ``SHARED_KEYS``
  shared keys, then the bulk keys of ``side``; one compiled shape for every
  check), rerun with more bulk keys only if ``num`` exceeds it. Looped: the
  outputs of the first ``REPLAY_KEYS`` shared keys on this dataset (computed for
  replay / no_nonprivate anyway) come first, then the bulk keys, extended
  lazily, so no fit is run that no check uses. Either way the keys of the i-th
  output are fixed and distinct within a side (independent draws; reproducible
  verdicts, whatever ran before).
  """
  cache = _cache(entry)
  data = pairs_of(entry)[0][side]
  output_at(entry, 0, 0, 0)  # decides vmappability
  if is_vmappable(entry):
    batch = _vmapped(entry, 0, side)
    if batch is not None and len(batch) >= num:
      return batch
    have = cache.bulk.get(side)
    if have is not None and len(have) >= num:
      return have
    if batch is not None:  # one larger batch of the same keys (the same size for both sides)
      size = max(num, bulk_size(entry))
      batch = _try_vmap(entry, batch_keys(side, size), data)
      if batch is not None:
        cache.bulk[side] = batch
        return batch
  have = cache.bulk.get(side)
  items = list(have.items) if have is not None and have.items is not None else []
  if not items:
    items = [output_at(entry, 0, side, i) for i in range(REPLAY_KEYS)]
  if len(items) < num:
    start = len(items) - REPLAY_KEYS
    rows = bulk_key_data(side, start, start + num - len(items))
    items.extend(entry.release(wrap_keys(row), data) for row in rows)
  cache.bulk[side] = Batch(items=items)
  return Batch(items=items[:num])


def bulk_map(entry: reg.ReleasePoint, side: int, num: int, post: Callable[[Any], Any]) -> np.ndarray:
  batch = bulk_outputs(entry, side, num)
  return np.stack([np.asarray(post(batch[i]), dtype=np.float64) for i in range(num)])


def _first_dataset(entry: reg.ReleasePoint) -> Any:
  return pairs_of(entry)[0][0]


def _norm(x: np.ndarray, norm: str) -> float:
  if norm == "l1":
    return float(np.sum(np.abs(x)))
  if norm == "l2":
    return float(np.sqrt(np.sum(np.square(x))))
  if norm == "linf":
    return float(np.max(np.abs(x), initial=0.0))
  raise AssertionError(f"unknown norm {norm!r}; use one of {NORMS}.")


# ---------------------------------------------------------------------------
# (a) Same-randomness replay.
# ---------------------------------------------------------------------------


def _replay_slack(y: np.ndarray, y_prime: np.ndarray) -> np.ndarray:
  """Per-coordinate float rounding allowance of a replayed difference.

  A release computes ``y = fl(v + z)`` with the SAME noise ``z`` on D and D'
  (same key). Round-to-nearest float32 has unit roundoff ``u = 2^-24``, so
  ``|y - (v + z)| <= u |y|`` and ``|(y - y') - (v - v')| <= u (|y| + |y'|)``.
  We allow ``2u (|y| + |y'|)`` (float32's machine epsilon, twice the bound) to
  absorb one more rounding when ``v + z`` is assembled (e.g. a shift and a
  scale). Nothing else is allowed: the rounding of ``v`` itself (float32 sums)
  is part of the sensitivity the release must honour.
  """
  return _F32_EPS * (np.abs(y) + np.abs(y_prime))


def check_replay(entry: reg.ReleasePoint, num_keys: int = REPLAY_KEYS) -> None:
  """Same key on every pair (D, D'): ``||y - y'|| <= sensitivity`` (+ rounding slack).

  For ``y = f(D) + Z`` and ``y' = f(D') + Z`` with the same ``Z``, the
  difference is ``f(D) - f(D')``: its norm (``entry.norm``) is at most the
  claimed sensitivity when the claim holds. Checked for ``num_keys`` keys on
  every pair. A release whose noise depends on the data size or that is not
  additive must skip this check with its reason.
  """
  if entry.sensitivity is None:
    _fail(entry, "replay", "sensitivity is None: give the claimed sensitivity, or list "
          "'replay' in skip with the reason (e.g. not an additive-noise release).")
  sens = float(entry.sensitivity)
  for p in range(len(pairs_of(entry))):
    y0 = vectors_at(entry, p, 0, num_keys)
    y1 = vectors_at(entry, p, 1, num_keys)
    if y0.shape != y1.shape:
      _fail(entry, "replay", f"pair {p}: output vectors have shapes {y0.shape[1:]} and "
            f"{y1.shape[1:]} on D and D' (the output shape must not depend on a record).")
    for k in range(num_keys):
      diff = np.abs(y0[k] - y1[k])
      excess = np.maximum(diff - _replay_slack(y0[k], y1[k]), 0.0)
      if not np.all(np.isfinite(diff)):
        _fail(entry, "replay", f"pair {p}, key {k}: non-finite output.")
      moved = _norm(excess, entry.norm)
      if moved > sens * (1.0 + _REL_SLACK):
        _fail(entry, "replay",
              f"pair {p}, key {k}: with the same key the outputs on D and D' differ by "
              f"{entry.norm} norm {moved:.9g} (raw {_norm(diff, entry.norm):.9g}) > claimed "
              f"sensitivity {sens:.9g} (ratio {moved / sens:.6f}); the data moved the release "
              "more than the noise was calibrated for.")


# ---------------------------------------------------------------------------
# (b) Fresh randomness.
# ---------------------------------------------------------------------------

_HERE = pathlib.Path(__file__).resolve().parent
_REPO = _HERE.parent.parent

_SUBPROCESS_SCRIPT = r"""
import hashlib, json, sys
sys.path.insert(0, {here!r})
sys.path.insert(0, {repo!r})
import numpy as np
import conformance_registry as reg
spec = json.loads(sys.argv[1])
entries = {{}}
if spec["mode"] == "registry":
  import importlib
  for module in spec.get("modules") or []:  # the modules that register the names
    importlib.import_module(module)
  if any(name not in reg.REGISTRY for name in spec["names"]):
    reg.load_all()
  for name in spec["names"]:
    entries[name] = reg.REGISTRY[name]
else:
  import importlib
  module = importlib.import_module(spec["module"])
  for name in spec["names"]:
    entries[name] = getattr(module, name)
out = {{}}
for name, entry in entries.items():
  try:
    data = list(entry.pairs())[0][0]
    vec = np.concatenate([np.asarray(entry.vector(entry.fresh(data)), dtype=np.float64).ravel()
                          for _ in range({calls})])
    out[entry.name] = hashlib.sha256(vec.tobytes()).hexdigest()
  except Exception as err:  # reported per entry by check_fresh
    out[entry.name] = "ERROR " + type(err).__name__ + ": " + str(err)[:300]
print("FRESH_DIGESTS " + json.dumps(out))
"""


# Each process digests FRESH_CALLS consecutive fresh releases: an output with atoms (e.g.
# cluster centres clipped to the box corners) repeats across processes by chance now and
# then (about 1 run in 150 with one release per process); three in a row do not, while a
# constant default seed still gives every process the same three outputs.
FRESH_CALLS = 3
# Calls without a key drawn in one process while all agree (see check_fresh).
FRESH_REPEATS = 5


def _digest(vec: np.ndarray) -> str:
  return hashlib.sha256(np.asarray(vec, dtype=np.float64).ravel().tobytes()).hexdigest()


class FreshProcesses:
  """``entry.fresh(D)`` for each named entry in ``processes`` separate Python processes.

  Started on construction and run concurrently with the caller (the suite
  starts them first and collects them last). ``module=None``: the names are
  registry names (``reg.load_all()`` in the child); otherwise attributes of
  ``module`` (importable from tests/privacy). :meth:`result` returns one
  ``{entry.name: sha256 of the vectors of FRESH_CALLS consecutive fresh calls}``
  per process (``"ERROR ..."`` for an entry whose fresh call raised).
  """

  def __init__(self, names: Iterable[str], module: Optional[str] = None, processes: int = 2):
    names = list(names)
    # Registry names: the child imports only the entries_* modules that register them.
    modules = (sorted({reg.MODULE_OF[n] for n in names})
               if module is None and all(n in reg.MODULE_OF for n in names) else None)
    spec = {"mode": "registry" if module is None else "module", "module": module,
            "names": names, "modules": modules}
    script = _SUBPROCESS_SCRIPT.format(here=str(_HERE), repo=str(_REPO), calls=FRESH_CALLS)
    env = dict(os.environ)
    env.setdefault("JAX_PLATFORMS", "cpu")
    self._procs = [subprocess.Popen([sys.executable, "-c", script, json.dumps(spec)],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    env=env, cwd=str(_REPO))
                   for _ in range(processes)]
    self._result: Optional[list[dict]] = None

  def result(self, timeout: float = 900.0) -> list[dict]:
    if self._result is None:
      results = []
      for proc in self._procs:
        stdout, stderr = proc.communicate(timeout=timeout)
        lines = [l for l in stdout.splitlines() if l.startswith("FRESH_DIGESTS ")]
        if proc.returncode != 0 or not lines:
          raise AssertionError(f"fresh-randomness subprocess failed (rc {proc.returncode}):\n"
                               f"{stderr[-3000:]}")
        results.append(json.loads(lines[-1][len("FRESH_DIGESTS "):]))
      self._result = results
    return self._result

  def kill(self) -> None:
    for proc in self._procs:
      if proc.poll() is None:
        proc.kill()
        proc.communicate()


class SharedFreshProcesses:
  """:class:`FreshProcesses` started ONCE for a test run split over several workers.

  Under pytest-xdist every worker runs the session fixture; without sharing, each
  would start its own two processes (each loads every entry and compiles every
  keyless release), competing for the same cores. The first worker to claim
  ``<tmp>/jaxdp_fresh_<run>.json.owner`` (an atomic ``O_EXCL`` create) starts
  the processes and, from a background thread, writes their digests to
  ``<tmp>/jaxdp_fresh_<run>.json`` when they finish; the other workers read
  that file. A worker that finds no file within ``timeout`` (the owner died)
  starts its own processes. The verdicts are those of :class:`FreshProcesses`:
  two separate processes, digests compared with this process's outputs.
  ``module``: as for :class:`FreshProcesses` (None: registry names). ``before_start`` is
  called by the owner alone, before it starts the processes.
  """

  def __init__(self, names: Iterable[str], run_id: str, processes: int = 2,
               module: Optional[str] = None, before_start: Optional[Callable[[], Any]] = None):
    import tempfile  # pylint: disable=import-outside-toplevel
    import threading  # pylint: disable=import-outside-toplevel
    self._names = list(names)
    self._processes = processes
    self._module = module
    tag = hashlib.sha256(json.dumps([module, self._names]).encode()).hexdigest()[:12]
    safe_run = "".join(ch for ch in str(run_id) if ch.isalnum())[:40]
    self._path = pathlib.Path(tempfile.gettempdir()) / f"jaxdp_fresh_{safe_run}_{tag}.json"
    self._own: Optional[FreshProcesses] = None
    self._thread = None
    self._outcome: dict = {}
    try:
      fd = os.open(str(self._path) + ".owner", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
      os.close(fd)
    except FileExistsError:
      return  # another worker owns the processes
    if before_start is not None:  # the owner only (e.g. compiling what the processes will read)
      before_start()
    self._own = FreshProcesses(self._names, module=module, processes=processes)
    self._thread = threading.Thread(target=self._publish, daemon=True)
    self._thread.start()

  def _publish(self) -> None:
    try:
      payload = {"digests": self._own.result()}
    except Exception as err:  # pylint: disable=broad-except  # reported to every worker
      payload = {"error": f"{type(err).__name__}: {err}"}
    self._outcome = payload
    tmp = self._path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(payload))
    os.replace(tmp, self._path)

  def result(self, timeout: float = 900.0) -> list[dict]:
    import time  # pylint: disable=import-outside-toplevel
    if self._thread is not None:  # the owner
      self._thread.join(timeout)
      payload = self._outcome
    else:
      deadline = time.monotonic() + timeout
      while not self._path.exists() and time.monotonic() < deadline:
        time.sleep(0.5)
      if not self._path.exists():  # the owner is gone: run our own processes
        self._own = FreshProcesses(self._names, module=self._module, processes=self._processes)
        return self._own.result()
      payload = json.loads(self._path.read_text())
    if "error" in payload or "digests" not in payload:
      raise AssertionError(f"fresh-randomness subprocess failed: {payload.get('error')}")
    return payload["digests"]

  def kill(self) -> None:
    """Waits for the owner's processes (another worker may still need them), then cleans up."""
    if self._thread is not None:
      self._thread.join(900.0)
    if self._own is not None:
      self._own.kill()


def fresh_digests_in_processes(names: Iterable[str], module: Optional[str] = None,
                               processes: int = 2) -> list[dict]:
  """:class:`FreshProcesses` started and collected (see there)."""
  return FreshProcesses(names, module, processes).result()


def check_fresh(entry: reg.ReleasePoint, process_digests: Optional[list[dict]] = None,
                locate: Optional[str] = None) -> None:
  """No explicit key: fresh noise every call and every process; same key: same output.

  * ``entry.fresh`` given: two calls on the same D must give different vectors
    (two instances / two calls without a seed), and so must two separate
    Python processes (``process_digests``: per-process digests computed by
    :func:`fresh_digests_in_processes`; computed here when None and
    ``locate`` says where the entry lives: ``"registry"`` or a module name).
  * ``entry.fresh`` None: the API requires a key, so ``release(None, D)`` must
    raise a ``TypeError``/``ValueError`` that names the key/seed argument.
  * Always: the same explicit key twice gives identical vectors.
  """
  data = _first_dataset(entry)
  output_at(entry, 0, 0, 0)  # decides vmappability (cached)
  if is_vmappable(entry):
    # Two separate calls of the SAME compiled batch shape as the cached shared batch
    # (no new compilation): the cached slice of key 0, and a batch of key 0 repeated.
    # Same program, same key: the bits must agree (a vmapped slice is compared only
    # with vmapped slices of the same batch shape).
    a = as_vector(entry, output_at(entry, 0, 0, 0))
    size = len(_vmapped(entry, 0, 0))
    again = run_batch(entry, wrap_keys(np.repeat(shared_key_data()[:1], size, axis=0)), data)
    b = as_vector(entry, again[0])
    if not np.array_equal(as_vector(entry, again[1]), b, equal_nan=True):
      _fail(entry, "fresh", "the same explicit key gave two different outputs in one batch (an "
            "explicit key must reproduce the release; randomness must come only from the key).")
  else:  # looped: the cached output of key 0 is itself a direct call; one more call
    a = as_vector(entry, output_at(entry, 0, 0, 0))
    b = as_vector(entry, entry.release(shared_key(0), data))
  if not np.array_equal(a, b, equal_nan=True):
    _fail(entry, "fresh", "the same explicit key gave two different outputs (an explicit key "
          "must reproduce the release; randomness must come only from the key).")
  if entry.fresh is None:
    try:
      entry.release(None, data)
    except (TypeError, ValueError) as err:
      text = str(err).lower()
      if not any(word in text for word in ("key", "seed", "rng")):
        _fail(entry, "fresh", f"release(key=None) raised {type(err).__name__}({err}) without "
              "naming the key/seed argument.")
      return
    except Exception as err:  # pylint: disable=broad-except
      _fail(entry, "fresh", f"release(key=None) raised {type(err).__name__}: {err}; expected a "
            "TypeError/ValueError naming the key argument.")
    _fail(entry, "fresh", "fresh is None (the API requires an explicit key) but release(key=None) "
          "did not raise: where does its randomness come from?")
  # An output with atoms (a clipped or rounded release: e.g. k-means centres clipped to the
  # box, ~1 in 4 draws at a corner) repeats by chance, so more calls are drawn while every
  # draw so far is identical (replayed noise repeats every time: FRESH_REPEATS calls in all
  # then, and a chance repeat of that length has probability p^(FRESH_REPEATS - 1)).
  draws = [as_vector(entry, entry.fresh(data)), as_vector(entry, entry.fresh(data))]
  while (len(draws) < FRESH_REPEATS
         and all(np.array_equal(v, draws[0], equal_nan=True) for v in draws[1:])):
    draws.append(as_vector(entry, entry.fresh(data)))
  if all(np.array_equal(v, draws[0], equal_nan=True) for v in draws[1:]):
    _fail(entry, "fresh", f"{len(draws)} calls without an explicit key gave identical outputs: "
          "the noise is replayed, so the difference of two releases cancels it.")
  if all(np.array_equal(v, a, equal_nan=True) for v in draws):
    _fail(entry, "fresh", "every call without a key reproduced the release of an explicit key.")
  v1, v2 = draws[0], draws[1]
  if process_digests is None and locate is not None:
    module = None if locate == "registry" else locate
    name = entry.name if module is None else _attr_name(entry, module)
    process_digests = fresh_digests_in_processes([name], module)
  if process_digests is not None:
    got = [d.get(entry.name) for d in process_digests]
    for g in got:
      if g is None or g.startswith("ERROR"):
        _fail(entry, "fresh", f"fresh(D) failed in a separate process: {g}")
    if len(set(got)) < len(got):
      _fail(entry, "fresh", f"{len(got)} separate Python processes gave identical outputs without "
            "an explicit key (the default seed is a constant).")
    extra = [as_vector(entry, entry.fresh(data)) for _ in range(FRESH_CALLS - 2)]
    mine = _digest(np.concatenate([np.ravel(v) for v in [v1, v2] + extra]))
    if mine in got:
      _fail(entry, "fresh", "a separate process reproduced this process's outputs.")


def _attr_name(entry: reg.ReleasePoint, module: str) -> str:
  import importlib  # pylint: disable=import-outside-toplevel
  mod = importlib.import_module(module)
  for name, value in vars(mod).items():
    if value is entry:
      return name
  raise AssertionError(f"entry {entry.name} is not a module-level attribute of {module}.")


# ---------------------------------------------------------------------------
# (c) Charge equals releases.
# ---------------------------------------------------------------------------


def _event_key(event: Any) -> str:
  from jaxdp.accounting import events as ev  # pylint: disable=import-outside-toplevel
  return json.dumps(ev.event_to_dict(event), sort_keys=True)


def _multiplicity(item: Any, event_key: str) -> int:
  """How many copies of the event (by canonical dict) ``item`` is, expanding compositions."""
  from jaxdp.accounting import events as ev  # pylint: disable=import-outside-toplevel
  if _event_key(item) == event_key:
    return 1
  if isinstance(item, ev.SelfComposedDpEvent):
    return int(item.count) * _multiplicity(item.event, event_key)
  if isinstance(item, ev.ComposedDpEvent):
    return sum(_multiplicity(e, event_key) for e in item.events)
  return 0


def _leaf_counts(event: Any, count: int = 1, out: Optional[collections.Counter] = None):
  """Multiset of the leaves of an event tree (SelfComposed / Composed expanded)."""
  from jaxdp.accounting import events as ev  # pylint: disable=import-outside-toplevel
  out = collections.Counter() if out is None else out
  if isinstance(event, ev.SelfComposedDpEvent):
    _leaf_counts(event.event, count * int(event.count), out)
  elif isinstance(event, ev.ComposedDpEvent):
    for e in event.events:
      _leaf_counts(e, count, out)
  elif not isinstance(event, ev.NoOpDpEvent):
    out[_event_key(event)] += count
  return out


def ledger_releases(accountant: Any, event: Any) -> int:
  """Total multiplicity of ``event`` in ``accountant``'s ledger.

  Sums ``count x multiplicity`` over the ledger items, where an item equal to
  the event (by its canonical dict, as the accountant stores it) counts 1 and a
  ``SelfComposedDpEvent`` / ``ComposedDpEvent`` is expanded. When no item
  matches as a whole (the library spent the event's components separately),
  the ledger's leaves are compared with the event's: the ledger is ``k``
  releases when its leaf multiset is exactly ``k`` times the event's. Returns 0
  when the ledger is not a whole number of copies of the event.
  """
  from jaxdp.accounting import events as ev  # pylint: disable=import-outside-toplevel
  event = ev.event_from_dict(ev.event_to_dict(event))  # canonical floats, as in a ledger
  key = _event_key(event)
  whole = sum(int(c) * _multiplicity(e, key) for e, c in accountant.ledger)
  if whole:
    return whole
  want = _leaf_counts(event)
  have = collections.Counter()
  for e, c in accountant.ledger:
    _leaf_counts(e, int(c), have)
  if not want or set(have) != set(want):
    return 0
  ratios = {have[k] / want[k] for k in want}
  if len(ratios) != 1:
    return 0
  k = ratios.pop()
  return int(k) if float(k).is_integer() else 0


def _epsilon_of(event: Any, count: int, delta: float, relation: str, unit: str) -> float:
  """Epsilon at ``delta`` of ``count`` x ``event`` on a fresh accountant (the expectation).

  A pure function of the event's canonical dict and the other arguments, memoised on them:
  a PLD of a sampled Gaussian costs about a second, and check_charge asks for the same
  value twice (the ledger comparison and the budget's size), as do entries that share
  their event (the DP-SGD plan cells). The library call under test (the ledger's
  ``get_epsilon``, the budget's refusal) is never memoised.
  """
  slot = (_event_key(event), int(count), float(delta), relation, unit)
  if slot not in _EPSILON_OF:
    from jaxdp.accounting import PrivacyAccountant  # pylint: disable=import-outside-toplevel
    acc = PrivacyAccountant(neighbouring=relation, unit=unit)
    if count:
      acc.spend(event, count=count)
    _EPSILON_OF[slot] = acc.get_epsilon(delta)
  return _EPSILON_OF[slot]


# (canonical event dict, count, delta, relation, unit) -> epsilon; emptied by clear_caches().
_EPSILON_OF: dict = {}


def _describe_ledger(accountant: Any) -> str:
  return "; ".join(f"{c} x {e}" for e, c in accountant.ledger) or "(empty)"


def check_charge(entry: reg.ReleasePoint) -> None:
  """The ledger grows by exactly the ``releases`` returned; a short budget refuses first.

  1. ``charged(D, PrivacyAccountant(entry.neighbouring, entry.unit))`` returns
     ``(output, releases)``; :func:`ledger_releases` of ``entry.event()`` must
     equal ``releases`` and the ledger must hold nothing else (its epsilon
     equals that of ``releases x event``).
  2. ``charged(D, PrivacyBudget(eps))`` with ``eps`` strictly between the cost of
     ``releases - 1`` and ``releases`` events must raise
     ``BudgetExceededError`` and leave the budget's ledger empty (refused
     before any spend, hence before any release).
  """
  from jaxdp.accounting import PrivacyAccountant, PrivacyBudget  # pylint: disable=import-outside-toplevel
  from jaxdp.errors import BudgetExceededError  # pylint: disable=import-outside-toplevel
  if entry.charged is None:
    _fail(entry, "charge", "charged is None: give charged(D, accountant), or list 'charge' in "
          "skip with the reason.")
  data = _first_dataset(entry)
  event = entry.event()
  acc = PrivacyAccountant(neighbouring=entry.neighbouring, unit=entry.unit)
  _, releases = entry.charged(data, acc)
  if isinstance(releases, bool) or not isinstance(releases, (int, np.integer)) or releases < 1:
    _fail(entry, "charge", f"charged must return (output, releases) with an integer releases >= 1, "
          f"got {releases!r}.")
  releases = int(releases)
  counted = ledger_releases(acc, event)
  if counted != releases:
    _fail(entry, "charge", f"the output holds {releases} independent release(s) but the ledger "
          f"holds {counted} x the event {event} (ledger: {_describe_ledger(acc)}).")
  deltas = [0.0] if entry.delta == 0 else []
  deltas.append(max(float(entry.delta) * releases, 1e-6))
  for d in deltas:
    got = acc.get_epsilon(d)
    want = _epsilon_of(event, releases, d, entry.neighbouring, entry.unit)
    if not (got == want or math.isclose(got, want, rel_tol=1e-9)):
      _fail(entry, "charge", f"the ledger's epsilon at delta={d:g} is {got!r} but {releases} x "
            f"the event gives {want!r} (ledger: {_describe_ledger(acc)}).")
  # A budget that affords releases - 1 events (but not releases) must refuse.
  budget_delta = deltas[0]
  full = _epsilon_of(event, releases, budget_delta, entry.neighbouring, entry.unit)
  if not math.isfinite(full):
    budget_delta = deltas[-1]
    full = _epsilon_of(event, releases, budget_delta, entry.neighbouring, entry.unit)
  if not math.isfinite(full) or full <= 0:
    _fail(entry, "charge", f"{releases} x {event} has epsilon {full} at delta={budget_delta:g}; "
          "cannot size a budget to test the refusal.")
  short = _epsilon_of(event, releases - 1, budget_delta, entry.neighbouring, entry.unit)
  if not short < full:
    _fail(entry, "charge", f"{releases - 1} and {releases} events cost the same epsilon {full}.")
  limit = 0.5 * (short + full)
  budget = PrivacyBudget(epsilon=limit, delta=budget_delta, neighbouring=entry.neighbouring,
                         unit=entry.unit)
  try:
    entry.charged(data, budget)
  except BudgetExceededError:
    if budget.accountant.ledger:
      _fail(entry, "charge", "the budget refused only after spending part of the releases "
            f"(ledger after refusal: {_describe_ledger(budget.accountant)}); a refusal must come "
            "before any spend and any release.")
    return
  _fail(entry, "charge", f"a PrivacyBudget of epsilon={limit:.6g} (delta={budget_delta:g}) that "
        f"affords {releases - 1} but not {releases} releases did not refuse (ledger: "
        f"{_describe_ledger(budget.accountant)}).")


# ---------------------------------------------------------------------------
# (d) Nothing non-private returned.
# ---------------------------------------------------------------------------

_MAX_DEPTH = 8


def _is_numeric_leaf(x: Any) -> bool:
  if isinstance(x, (bool, np.bool_)):
    return False
  if isinstance(x, (int, float, np.integer, np.floating)):
    return True
  if isinstance(x, (np.ndarray, jax.Array)):
    dtype = x.dtype
    if jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
      return False
    return np.issubdtype(np.dtype(dtype), np.number) or np.dtype(dtype) == np.bool_
  return False


def _children(x: Any) -> list[tuple[str, Any]]:
  """Named children of a container/object (fields, attributes, items)."""
  if isinstance(x, dict):
    return [(str(k), v) for k, v in x.items()]
  if isinstance(x, tuple) and hasattr(x, "_fields"):  # NamedTuple
    return [(f, getattr(x, f)) for f in x._fields]
  if isinstance(x, (list, tuple)):
    return [(f"[{i}]", v) for i, v in enumerate(x)]
  if dataclasses.is_dataclass(x) and not isinstance(x, type):
    out = [(f.name, getattr(x, f.name, None)) for f in dataclasses.fields(x)]
    extra = [(k, v) for k, v in getattr(x, "__dict__", {}).items()
             if k not in {f.name for f in dataclasses.fields(x)}]
    return out + extra
  out = []
  if hasattr(x, "__dict__") and not isinstance(x, type):
    out.extend(vars(x).items())
  for slot in getattr(type(x), "__slots__", ()) or ():
    if isinstance(slot, str) and hasattr(x, slot) and slot not in dict(out):
      out.append((slot, getattr(x, slot)))
  # Public properties ending in "_" (scikit-learn fitted attributes computed on access).
  for name in dir(type(x)):
    if name.endswith("_") and not name.startswith("__") and name not in dict(out):
      if isinstance(getattr(type(x), name, None), property):
        try:
          out.append((name, getattr(x, name)))
        except Exception:  # pylint: disable=broad-except
          continue
  return out


_SKIP_TYPES = (str, bytes, type(None), type, type(len), type(_norm))


def numeric_leaves(output: Any) -> dict[str, np.ndarray]:
  """``{path: value}`` for every numeric leaf reachable from ``output``.

  Walks dicts, lists/tuples, NamedTuples, dataclasses, objects' ``__dict__`` /
  ``__slots__`` (private ``_`` attributes included: Python does not hide them
  from the user) and ``*_`` properties, to depth 8. Modules, functions,
  classes, strings and ``jax.random`` keys are not leaves.
  """
  import types  # pylint: disable=import-outside-toplevel
  found: dict[str, np.ndarray] = {}
  seen: set[int] = set()

  def walk(x, path, depth):
    if _is_numeric_leaf(x):
      found[path or "<output>"] = np.asarray(x)
      return
    if depth >= _MAX_DEPTH or isinstance(x, _SKIP_TYPES) or callable(x) and not hasattr(
        x, "__dict__"):
      return
    if isinstance(x, (types.ModuleType, types.FunctionType, types.MethodType, functools.partial)):
      return
    if isinstance(x, (np.ndarray, jax.Array)):
      return  # key arrays, object arrays
    if id(x) in seen:
      return
    seen.add(id(x))
    for name, child in _children(x):
      sep = "" if not path or name.startswith("[") else "."
      walk(child, f"{path}{sep}{name}", depth + 1)

  walk(output, "", 0)
  return found


def _same(a: Optional[np.ndarray], b: Optional[np.ndarray]) -> bool:
  if a is None or b is None:
    return a is b
  if a.shape != b.shape or a.dtype.kind != b.dtype.kind and not (
      np.issubdtype(a.dtype, np.number) and np.issubdtype(b.dtype, np.number)):
    return False
  return bool(np.array_equal(a, b, equal_nan=np.issubdtype(a.dtype, np.inexact)))


def _exempt(entry: reg.ReleasePoint, path: str) -> bool:
  parts = [p for p in path.replace("[", ".[").split(".") if p and not p.startswith("[")]
  public = set(entry.public_outputs)
  if path in public:
    return True
  return any(p in public or p.startswith("nonprivate_") for p in parts)


def check_no_nonprivate(entry: reg.ReleasePoint) -> None:
  """No returned leaf is a deterministic, data-dependent value (an un-noised release).

  The output is released with two keys on D and one on D' (every pair). A
  numeric leaf identical under both keys on D (it does not depend on the
  noise) but different on D' (it depends on the data) is computed from the
  data without noise. Before failing, the leaf is confirmed on more keys on
  both datasets (so a discrete private output that is the same twice by
  chance is not reported). Exempt: leaves under a path component listed in
  ``entry.public_outputs`` or starting with ``nonprivate_``.
  """
  for p in range(len(pairs_of(entry))):
    a = numeric_leaves(output_at(entry, p, 0, 0))
    b = numeric_leaves(output_at(entry, p, 0, 1))
    c = numeric_leaves(output_at(entry, p, 1, 0))
    suspects = [path for path, v in a.items()
                if not _exempt(entry, path) and _same(v, b.get(path)) and not _same(v, c.get(path))]
    if not suspects:
      continue
    confirmed = set(suspects)
    for i in range(2, 2 + NONPRIVATE_CONFIRM_KEYS):  # more keys on both datasets
      on_d0 = numeric_leaves(output_at(entry, p, 0, i))
      on_d1 = numeric_leaves(output_at(entry, p, 1, i))
      confirmed = {s for s in confirmed
                   if _same(a[s], on_d0.get(s)) and _same(c.get(s), on_d1.get(s))}
      if not confirmed:
        break
    if confirmed:
      _fail(entry, "no_nonprivate",
            f"pair {p}: returned value(s) {sorted(confirmed)} do not depend on the noise "
            f"({2 + NONPRIVATE_CONFIRM_KEYS} keys) but change between D and D': they are computed "
            "from the private data without noise. Remove them, rename them nonprivate_*, or list "
            "them in public_outputs if they depend on public inputs only.")


# ---------------------------------------------------------------------------
# (e) Support.
# ---------------------------------------------------------------------------


def parse_support(support: str) -> tuple[str, Optional[float]]:
  """``("continuous"|"discrete", None)`` or ``("grid", step)``; AssertionError otherwise."""
  if support in ("continuous", "discrete"):
    return support, None
  if support.startswith("grid:"):
    try:
      step = float(support[len("grid:"):])
    except ValueError:
      step = math.nan
    if math.isfinite(step) and step > 0:
      return "grid", step
  raise AssertionError(f"support must be 'continuous', 'discrete' or 'grid:<step>' with a "
                       f"positive step, got {support!r}.")


def on_grid(values: np.ndarray, step: float) -> np.ndarray:
  """Whether each value is exactly ``k * step`` for an integer k (as float64 or float32).

  Exact: a value is on the grid when it equals ``k * step`` computed in
  float64, or its float32 rounding, or ``float32(k) * float32(step)`` (the
  representations a float32 release of the grid point can have). All three
  depend on k only, never on a record.
  """
  values = np.asarray(values, dtype=np.float64)
  k = np.round(values / step)
  cands = [k * step, (k * step).astype(np.float32).astype(np.float64),
           (k.astype(np.float32) * np.float32(step)).astype(np.float64)]
  ok = np.zeros(values.shape, dtype=bool)
  for cand in cands:
    ok |= values == cand
  return ok


def check_support(entry: reg.ReleasePoint, num_keys: int = REPLAY_KEYS) -> Optional[str]:
  """The set of possible outputs does not depend on a record.

  ``"grid:<step>"``: every released value (D and D' of every pair, several
  keys) is exactly on ``step * Z`` (:func:`on_grid`); ``"discrete"``: every
  value is an integer; ``"continuous"``: nothing to check here -- the float
  lattice of ``data + continuous noise`` is the documented caveat of
  docs/sharp_edges.md (returned as a note).
  """
  kind, step = parse_support(entry.support)
  if kind == "continuous":
    return ("continuous support: float outputs of continuous noise carry the float-lattice caveat "
            "documented in docs/sharp_edges.md (Mironov 2012).")
  for p in range(len(pairs_of(entry))):
    for side, label in enumerate(("D", "D'")):
      vecs = vectors_at(entry, p, side, num_keys)
      if kind == "discrete":
        bad = vecs != np.round(vecs)
        what = "not an integer"
      else:
        bad = ~on_grid(vecs, step)
        what = f"not a multiple of the public grid step {step!r}"
      if np.any(bad):
        idx = np.argwhere(bad)[0]
        _fail(entry, "support", f"pair {p}, {label}, key {idx[0]}: released coordinate {idx[1]} is "
              f"{what} (support {entry.support!r}); the set of possible outputs then depends on "
              "the data (Mironov 2012).")
  return None


# ---------------------------------------------------------------------------
# (f) Noise scale.
# ---------------------------------------------------------------------------


def _discrete_moments(kind: str, scale: float, step: float, power: int) -> tuple[float, float]:
  """Mean and variance of ``|Z|^power`` for discrete Laplace / Gaussian on ``step * Z``."""
  t = scale / step  # scale in grid units
  kmax = int(math.ceil(60 * t + 50)) if kind == "discrete_laplace" else int(math.ceil(12 * t + 50))
  k = np.arange(-kmax, kmax + 1, dtype=np.float64)
  logp = -np.abs(k) / t if kind == "discrete_laplace" else -k**2 / (2 * t**2)
  p = np.exp(logp - logp.max())
  p /= p.sum()
  s = np.abs(k * step) ** power
  mean = float(np.sum(p * s))
  return mean, float(np.sum(p * (s - mean) ** 2))


@dataclasses.dataclass(frozen=True)
class NoisePlan:
  """The noise test for one entry: N coordinates, thresholds on the scale ratio."""
  kind: str
  coordinates: int
  low: float    # fail when estimated scale / claimed scale < low
  high: float   # fail when it is > high
  power: float  # probability of catching a 20% smaller scale
  false_alarm: float


def _ratio_quantiles(kind: str, n: int, probs: np.ndarray) -> np.ndarray:
  """Quantiles of (estimated scale / true scale) for the exact laws of the statistic."""
  if kind in ("laplace", "l2_laplace"):
    return sp_stats.gamma.ppf(probs, n) / n  # mean |z|/b (or ||z||/b over d n) ~ Gamma(n)/n
  if kind == "gaussian":
    return np.sqrt(sp_stats.chi2.ppf(probs, n) / n)  # sqrt(mean z^2/sigma^2) ~ sqrt(chi2(n)/n)
  raise AssertionError(kind)


def plan_noise_test(kind: str, coordinates: int, scale: float = 1.0,
                    step: Optional[float] = None) -> NoisePlan:
  """Thresholds of the scale test for ``coordinates`` noise coordinates.

  Laplace: ``sum |z_i| / b ~ Gamma(N, 1)``; Gaussian: ``sum z_i^2 / sigma^2 ~
  chi2(N)``; L2-Laplace (per draw ``||z|| / b ~ Gamma(d, 1)``, so N = d x
  draws): ``Gamma(N, 1)``. The low threshold is the ``NOISE_FALSE_ALARM``
  quantile of the estimate under the true scale, so a correct release fails
  with probability <= 1e-6; the power is the probability that a scale of
  ``0.8 x`` falls below it. Discrete kinds use the exact moments of
  ``|z|`` (Laplace) or ``z^2`` (Gaussian) and a normal approximation of the
  sum at 5.5 standard deviations (1e-6 is 4.75; the margin covers the
  approximation error).
  """
  n = int(coordinates)
  if kind in ("laplace", "l2_laplace", "gaussian"):
    lo, hi = _ratio_quantiles(kind, n, np.array([NOISE_FALSE_ALARM, 1 - NOISE_FALSE_ALARM]))
    if kind == "gaussian":
      power = float(sp_stats.chi2.cdf(n * (lo / NOISE_UNDER_FACTOR) ** 2, n))
    else:
      power = float(sp_stats.gamma.cdf(n * lo / NOISE_UNDER_FACTOR, n))
    return NoisePlan(kind, n, float(lo), max(NOISE_OVER_FACTOR, float(hi)), power,
                     NOISE_FALSE_ALARM)
  if kind in ("discrete_laplace", "discrete_gaussian"):
    power_exp = 1 if kind == "discrete_laplace" else 2
    m1, v1 = _discrete_moments(kind, scale, step, power_exp)
    m0, v0 = _discrete_moments(kind, NOISE_UNDER_FACTOR * scale, step, power_exp)
    z = 5.5
    lo_stat = m1 - z * math.sqrt(v1 / n)  # on the mean of |z|^power
    hi_stat = m1 + z * math.sqrt(v1 / n)
    power = float(sp_stats.norm.cdf((lo_stat - m0) / math.sqrt(v0 / n)))
    to_ratio = (lambda s: s / m1) if power_exp == 1 else (lambda s: math.sqrt(max(s, 0) / m1))
    return NoisePlan(kind, n, to_ratio(lo_stat), max(NOISE_OVER_FACTOR, to_ratio(hi_stat)), power,
                     NOISE_FALSE_ALARM)
  raise AssertionError(f"noise.kind must be one of {NOISE_KINDS}, got {kind!r}.")


@functools.lru_cache(maxsize=None)
def coordinates_needed(kind: str, scale: float = 1.0, step: Optional[float] = None,
                       miss: float = NOISE_MISS) -> int:
  """Smallest N whose test catches a 20% smaller scale with probability >= 1 - miss (1e-6).

  The false-alarm rate is ``NOISE_FALSE_ALARM`` at every N (see
  :func:`plan_noise_test`); ``miss`` only sets the power.
  """
  lo, hi = 1, 1
  while plan_noise_test(kind, hi, scale, step).power < 1 - miss:
    lo, hi = hi, hi * 2
  while lo < hi:
    mid = (lo + hi) // 2
    if plan_noise_test(kind, mid, scale, step).power >= 1 - miss:
      hi = mid
    else:
      lo = mid + 1
  return hi


def estimated_scale_ratio(kind: str, z: np.ndarray, scale: Any, step: Optional[float] = None) -> float:
  """Estimated noise scale / claimed scale from noise draws ``z`` (draws, d)."""
  scale_arr = np.broadcast_to(np.asarray(scale, dtype=np.float64), z.shape[1:])
  if kind == "laplace":
    return float(np.mean(np.abs(z) / scale_arr))
  if kind == "gaussian":
    return float(np.sqrt(np.mean((z / scale_arr) ** 2)))
  if kind == "l2_laplace":
    d = z.shape[1]
    return float(np.sum(np.linalg.norm(z / scale_arr, axis=1)) / (d * z.shape[0]))
  if kind == "discrete_laplace":
    s = float(np.mean(scale_arr))
    return float(np.mean(np.abs(z))) / _discrete_moments(kind, s, step, 1)[0]
  if kind == "discrete_gaussian":
    s = float(np.mean(scale_arr))
    return math.sqrt(float(np.mean(z**2)) / _discrete_moments(kind, s, step, 2)[0])
  raise AssertionError(f"noise.kind must be one of {NOISE_KINDS}, got {kind!r}.")


def check_noise_scale(entry: reg.ReleasePoint, slow: bool = False) -> Optional[str]:
  """The empirical noise scale matches ``entry.noise.scale`` (from the cited theorem).

  ``z = vector(release(k, D)) - noise.reference(D)`` over enough keys that the
  test (see :func:`plan_noise_test`) passes the true scale with probability
  >= 1 - 1e-6 and catches a 20% smaller scale with probability >= 1 - 1e-6;
  an estimate above 1.5x the claim (wrong units, double noise) fails too.
  Vmappable releases draw as many as needed. Host-side (looped) releases draw,
  in the always-on run, enough to catch a 20% smaller scale with probability
  >= 1 - ``LOOP_FAST_MISS`` (1e-3; the false-alarm rate stays 1e-6: the
  thresholds are exact at the number drawn), and with ``slow=True`` the full
  1 - 1e-6; at most ``MAX_LOOP_DRAWS`` either way (the returned note states
  any reduced power).
  """
  spec = entry.noise
  if spec is None:
    _fail(entry, "noise", "noise is None: give the NoiseSpec of the cited theorem, or list "
          "'noise' in skip with the reason (e.g. not additive noise).")
  kind = spec.kind
  if kind not in NOISE_KINDS:
    _fail(entry, "noise", f"noise.kind must be one of {NOISE_KINDS}, got {kind!r}.")
  step = None
  if kind.startswith("discrete"):
    support, step = parse_support(entry.support)
    if support != "grid":
      _fail(entry, "noise", f"{kind} noise needs support 'grid:<step>', got {entry.support!r}.")
  data = _first_dataset(entry)
  reference = np.asarray(spec.reference(data), dtype=np.float64).ravel()
  scale_mean = float(np.mean(np.asarray(spec.scale, dtype=np.float64)))
  if not scale_mean > 0:
    _fail(entry, "noise", f"noise.scale must be > 0, got {spec.scale!r}.")
  draws, d = noise_draws(entry, slow)
  if d != reference.size:
    _fail(entry, "noise", f"noise.reference(D) has {reference.size} coordinates but "
          f"vector(output) has {d}.")
  note = None
  vecs = bulk_map(entry, 0, draws, lambda out: as_vector(entry, out))
  z = vecs - reference
  plan = plan_noise_test(kind, draws * d, scale_mean, step)
  if plan.power < 1 - NOISE_MISS:
    note = (f"noise test under-powered (host-side release, {draws} draws x {d} coordinates"
            f"{'' if slow else '; full power under slow'}): catches a 20% smaller scale with "
            f"probability {plan.power:.6f}.")
  ratio = estimated_scale_ratio(kind, z, spec.scale, step)
  if not math.isfinite(ratio):
    _fail(entry, "noise", "non-finite noise draws.")
  if ratio < plan.low:
    _fail(entry, "noise", f"the empirical {kind} scale is {ratio:.4f} x the claimed "
          f"{spec.scale!r} ({spec.theorem}); a correct release falls below {plan.low:.4f} with "
          f"probability < {plan.false_alarm:g} ({draws} draws x {d} coordinates): the release "
          "carries less noise than its theorem requires.")
  if ratio > plan.high:
    _fail(entry, "noise", f"the empirical {kind} scale is {ratio:.4f} x the claimed "
          f"{spec.scale!r} ({spec.theorem}), above {plan.high:.4f}: wrong units or a "
          "reference that is not the statistic the noise is added to.")
  return note


# ---------------------------------------------------------------------------
# (g) Cheap empirical audit.
# ---------------------------------------------------------------------------


def audit_report(entry: reg.ReleasePoint, slow: bool = False):
  """The :func:`jaxdp.audit.epsilon_lower_bound` report on the first pair."""
  from jaxdp import audit  # pylint: disable=import-outside-toplevel
  spec = entry.audit
  if spec is None:
    _fail(entry, "audit", "audit is None: give an AuditSpec (statistic on the worst-case pair), "
          "or list 'audit' in skip with the reason.")
  trials = int(spec.slow_trials if slow else spec.trials)
  name = "audit_slow" if slow else "audit"
  stat = lambda out: np.asarray(spec.statistic(out), dtype=np.float64).reshape(())
  if slow:  # its own keys (independent of the cheap audit), not cached
    d0, d1 = pairs_of(entry)[0]
    s0 = map_outputs(entry, keys_for(name, trials, offset=0), d0, stat)
    s1 = map_outputs(entry, keys_for(name, trials, offset=1), d1, stat)
  else:  # the statistics of the cached bulk outputs, kept with them
    cache, slot = _cache(entry), (trials, id(spec.statistic))
    if slot not in cache.audit:
      cache.audit[slot] = (bulk_map(entry, 0, trials, stat), bulk_map(entry, 1, trials, stat))
    s0, s1 = cache.audit[slot]
  if not (np.all(np.isfinite(s0)) and np.all(np.isfinite(s1))):
    _fail(entry, name, "the audit statistic is not finite on every output.")
  return audit.epsilon_lower_bound(s0, s1, delta=float(entry.delta), confidence=AUDIT_CONFIDENCE,
                                   claimed_epsilon=float(entry.epsilon))


def check_audit(entry: reg.ReleasePoint, slow: bool = False) -> None:
  """The 95% Clopper-Pearson lower bound on epsilon (first pair) is <= the claimed epsilon.

  ``slow=False`` runs ``entry.audit.trials`` per dataset, ``slow=True``
  ``entry.audit.slow_trials``. A lower bound above the claim is a privacy bug
  found with 95% confidence (:mod:`jaxdp.audit.core`); a bound below proves
  nothing about tightness.
  """
  report = audit_report(entry, slow)
  if report.epsilon_lower_bound > float(entry.epsilon):
    _fail(entry, "audit_slow" if slow else "audit",
          f"empirical epsilon lower bound {report.epsilon_lower_bound:.4f} exceeds the claimed "
          f"epsilon {entry.epsilon} (delta {entry.delta}):\n{report}")


# ---------------------------------------------------------------------------
# (h) Records that break arithmetic (jaxdp issue 40 section 2).
# ---------------------------------------------------------------------------

# A refusal must be an argument error raised by jaxdp itself: these are never one.
_NOT_A_REFUSAL = (ArithmeticError,)  # FloatingPointError, OverflowError, ZeroDivisionError


def _jaxdp_dir() -> str:
  import jaxdp  # pylint: disable=import-outside-toplevel
  return str(pathlib.Path(jaxdp.__file__).resolve().parent)


def _raising_file(err: BaseException) -> str:
  """The file of the innermost frame of ``err``'s traceback (where it was raised)."""
  tb = err.__traceback__
  while tb is not None and tb.tb_next is not None:
    tb = tb.tb_next
  return str(pathlib.Path(tb.tb_frame.f_code.co_filename).resolve()) if tb is not None else ""


def _resolve_public(name: str) -> Any:
  """The public object of a registry name (``[variant]`` suffix ignored); None if unknown."""
  import importlib  # pylint: disable=import-outside-toplevel
  parts = name.split("[", 1)[0].split(".")
  for i in range(len(parts), 0, -1):
    try:
      obj = importlib.import_module(".".join(parts[:i]))
    except ImportError:
      continue
    for attr in parts[i:]:
      obj = getattr(obj, attr, None)
    return obj
  return None


def _jaxdp_api_arguments(err: BaseException) -> set[str]:
  """Parameter names of the public jaxdp functions on ``err``'s traceback.

  Public: the function's name and its file's name do not start with ``_``
  (the ``_validation`` helpers' generic ``x``/``name``/``value`` do not count).
  """
  names: set[str] = set()
  tb = err.__traceback__
  while tb is not None:
    code = tb.tb_frame.f_code
    if _public_jaxdp_frame(code):
      names.update(code.co_varnames[:code.co_argcount + code.co_kwonlyargcount])
    tb = tb.tb_next
  return names - {"self", "cls"}


def argument_names(entry: reg.ReleasePoint, data: Any,
                   err: Optional[BaseException] = None) -> set[str]:
  """Names a refusal may name.

  The release point's parameters (and its class's constructor's), the
  parameters of the public jaxdp functions the call went through (the teacher
  training a predictor is built from, the function an estimator's ``fit``
  delegates to), and the dataset's keys.
  """
  import inspect  # pylint: disable=import-outside-toplevel
  names: set[str] = set() if err is None else _jaxdp_api_arguments(err)
  obj = _resolve_public(entry.name)
  owner = _resolve_public(entry.name.split("[", 1)[0].rsplit(".", 1)[0])
  for fn in (obj, owner if inspect.isclass(owner) else None):
    if fn is None:
      continue
    try:
      names.update(p for p in inspect.signature(fn).parameters if p not in ("self", "cls"))
    except (TypeError, ValueError):
      pass
  if isinstance(data, dict):
    names.update(str(k) for k in data)
  return names


def _all_finite(data: Any) -> bool:
  for leaf in jax.tree.leaves(data):
    if isinstance(leaf, jax.core.Tracer):
      continue
    try:
      arr = np.asarray(leaf)
    except Exception:  # pylint: disable=broad-except  # not numeric data
      continue
    if np.issubdtype(arr.dtype, np.inexact) and not np.all(np.isfinite(arr)):
      return False
  return True


def _public_jaxdp_frame(code: Any) -> bool:
  path = pathlib.Path(code.co_filename).resolve()
  return (str(path).startswith(_jaxdp_dir()) and not code.co_name.startswith("_")
          and not (path.name.startswith("_") and path.name != "__init__.py"))


def _input_was_finite(err: BaseException, data: Any) -> bool:
  """Whether the refused call's input was finite.

  The input is the arguments of the outermost public jaxdp function on the
  traceback (the API the entry called: its glue may compute the argument from the
  dataset, e.g. a covariance matrix that overflows float32 before the call), or the
  dataset when no public jaxdp frame is on it.
  """
  tb = err.__traceback__
  while tb is not None:
    code = tb.tb_frame.f_code
    if _public_jaxdp_frame(code):
      local = tb.tb_frame.f_locals
      args = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
      return _all_finite([local[a] for a in args if a in local and a not in ("self", "cls")])
    tb = tb.tb_next
  return _all_finite(data)


# A message that says the input holds NaN/inf (not one that explains an overflow).
_BLAMES_NON_FINITE = r"(?i)\bnan\b|\binf\b|infinity|non-finite|not finite|must be finite"


def refusal_problem(entry: reg.ReleasePoint, err: BaseException, data: Any) -> Optional[str]:
  """Why ``err`` is not a clear refusal of the input (None when it is one).

  A refusal is a ``ValueError``/``TypeError`` or an exception class of jaxdp,
  never an ``ArithmeticError`` (``FloatingPointError``) or a budget error,
  raised by jaxdp's own code (the innermost frame is in the jaxdp package, not
  inside jax, numpy or the test's glue), whose message names, in its opening
  words, an argument (:func:`argument_names`), and that does not blame NaN/inf
  on an input that was finite (:func:`_input_was_finite`): that is a quantity computed
  inside the release overflowing (e.g. ``beta * scores``), reported as if the
  caller had passed a non-finite value.
  """
  import re  # pylint: disable=import-outside-toplevel
  from jaxdp.errors import BudgetExceededError  # pylint: disable=import-outside-toplevel
  kind = type(err)
  text = f"{kind.__name__}: {str(err)[:300]}"
  if isinstance(err, _NOT_A_REFUSAL) or isinstance(err, BudgetExceededError):
    return f"{text} is not an argument error"
  if not (isinstance(err, (ValueError, TypeError)) or kind.__module__.startswith("jaxdp")):
    return f"{text} is not a ValueError/TypeError/jaxdp error"
  where = _raising_file(err)
  if not where.startswith(_jaxdp_dir()):
    return f"{text} was raised inside {where} (not a refusal by jaxdp)"
  opening = _opening(str(err))
  named = [n for n in argument_names(entry, data, err)
           if re.search(rf"(?<![A-Za-z0-9_]){re.escape(n)}(?![A-Za-z0-9_])", opening)]
  if not named:
    return (f"{text} does not name an argument in its opening words ({opening!r})")
  if re.search(_BLAMES_NON_FINITE, str(err)) and _input_was_finite(err, data):
    return (f"{text} blames NaN/inf on a finite input: a value computed inside the release "
            "overflowed and was reported as the caller's")
  return None


def _opening(message: str) -> str:
  """The subject of an error message: the words before its first verb or punctuation.

  ``"rows of x must lie in the unit ball"`` -> ``"rows of x"``; ``"logits
  contains NaN"`` -> ``"logits"``. At most 80 characters.
  """
  import re  # pylint: disable=import-outside-toplevel
  cut = re.search(r" must | contains | is | are | has | have | should | cannot | does | do |"
                  r" lies | lie |[;:]|\. ", message)
  return message[:cut.start() if cut else len(message)][:80]


def _leaf_finiteness(entry: reg.ReleasePoint, output: Any) -> dict[str, tuple]:
  """``{path: (shape, finite mask bytes)}`` of the output's numeric leaves (exempt ones left out)."""
  out = {}
  for path, value in numeric_leaves(output).items():
    if _exempt(entry, path):
      continue
    arr = np.asarray(value)
    if not np.issubdtype(arr.dtype, np.inexact):
      continue
    out[path] = (arr.shape, np.isfinite(arr).tobytes())
  return out


def _support_problem(entry: reg.ReleasePoint, vec: np.ndarray) -> Optional[str]:
  kind, step = parse_support(entry.support)
  if not np.all(np.isfinite(vec)):
    bad = np.flatnonzero(~np.isfinite(vec))
    return f"non-finite release ({vec[bad[0]]} at coordinate {bad[0]}, {bad.size} in all)"
  if kind == "discrete" and np.any(vec != np.round(vec)):
    return "a discrete release is not an integer"
  if kind == "grid" and not np.all(on_grid(vec, step)):
    return f"a release is off the public grid {step!r}"
  return None


def check_extreme_records(entry: reg.ReleasePoint, pairs: Optional[list] = None,
                          fast: bool = False) -> str:
  """Releases on neighbours with one extreme record are finite with the same support.

  For each extreme pair (D, D'') (``extreme_records.extreme_pairs_of(entry,
  fast)`` unless ``pairs`` is given: the entry's ``extreme_pairs``, else the
  generic construction from its first pair), ``entry.release`` runs on both
  sides with one fixed key. Each side must either

  (a) release: ``entry.vector(output)`` all finite and on the entry's support
      (integers for ``discrete``, ``step * Z`` for ``grid``), with the same
      shape on both sides, and every other float leaf of the output (outside
      ``public_outputs`` and ``nonprivate_*``) finite in the same places on both
      sides; or
  (b) refuse: raise a clear argument error (:func:`refusal_problem`) BEFORE any
      spend: ``entry.charged(data, PrivacyAccountant)`` (when given) must raise
      too and leave the ledger empty.

  A NaN/inf on one side is an output of probability 1 under one dataset and 0
  under its neighbour: infinite privacy loss, whatever the noise. Every failing
  pair is listed in one ``AssertionError``. Returns a one-line summary.
  """
  import extreme_records as er  # pylint: disable=import-outside-toplevel
  from jaxdp.accounting import PrivacyAccountant  # pylint: disable=import-outside-toplevel
  if pairs is None:
    pairs = er.extreme_pairs_of(entry, fast=fast)
  if not pairs:
    _fail(entry, "extreme", "no extreme pair could be built: give extreme_pairs, or list "
          "'extreme' in skip with the reason.")
  key = keys_for("extreme", 1)[0]  # one fixed key: both sides see the same noise
  memo: dict = {}

  def outcome(data):
    fp = dataset_fingerprint(data)
    if fp not in memo:
      try:
        out = entry.release(key, data)
        vec = as_vector(entry, out)
        memo[fp] = ("released", vec, _leaf_finiteness(entry, out))
      except Exception as err:  # pylint: disable=broad-except  # judged below
        memo[fp] = ("raised", err)
    return memo[fp]

  failures, counts, refusals = [], collections.Counter(), set()
  for xp in pairs:
    where = er.describe(xp)
    results = [outcome(d) for d in xp.pair]
    for side, (data, res) in enumerate(zip(xp.pair, results)):
      label = "D''" if side == xp.extreme_side else "D"
      if res[0] == "raised":
        problem = refusal_problem(entry, res[1], data)
        if problem is None and entry.charged is not None:
          acc = PrivacyAccountant(neighbouring=entry.neighbouring, unit=entry.unit)
          try:
            entry.charged(data, acc)
            problem = "release() refused the input but charged() released on it"
          except Exception:  # pylint: disable=broad-except  # the charged path refused too
            if acc.ledger:
              problem = (f"refused only after spending (ledger: {_describe_ledger(acc)}); a "
                         "refusal must come before any spend")
        if problem is not None:
          failures.append(f"{where}: {label} raised and it is not a clear refusal: {problem}")
        else:
          counts["refused"] += 1
          refusals.add(f"{type(res[1]).__name__}: {str(res[1])[:70]}")
        continue
      problem = _support_problem(entry, res[1])
      if problem is not None:
        failures.append(f"{where}: {label}: {problem}")
      else:
        counts["released"] += 1
    if all(r[0] == "released" for r in results):
      (_, v0, l0), (_, v1, l1) = results
      if v0.shape != v1.shape:
        failures.append(f"{where}: release shapes {v0.shape} and {v1.shape} differ")
      for path in sorted(set(l0) | set(l1)):
        if l0.get(path) != l1.get(path):
          failures.append(f"{where}: output field {path!r} is non-finite in different places "
                          "on D and D'' (or present on one side only)")
  if failures:
    _fail(entry, "extreme", f"{len(failures)} problem(s) on records extreme for the arithmetic "
          "(a NaN/inf on one side is an infinite privacy loss):\n  " + "\n  ".join(failures))
  return (f"{len(pairs)} extreme pair(s) [{', '.join(p.variant for p in pairs)}]: "
          f"{counts['released']} finite release(s), {counts['refused']} clear refusal(s)"
          + (f" ({'; '.join(sorted(refusals))})" if refusals else ""))


CHECK_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "replay": check_replay,
    "fresh": check_fresh,
    "charge": check_charge,
    "no_nonprivate": check_no_nonprivate,
    "support": check_support,
    "noise": check_noise_scale,
    "audit": check_audit,
}


def validate_entry(entry: reg.ReleasePoint) -> None:
  """Schema checks on an entry (names, relation, norm, support, skip keys and reasons)."""
  problems = []
  if entry.family not in FAMILIES:
    problems.append(f"family {entry.family!r} not in {FAMILIES}")
  if entry.neighbouring not in RELATIONS:
    problems.append(f"neighbouring {entry.neighbouring!r} not in {RELATIONS}")
  if not isinstance(entry.unit, str) or not entry.unit:
    problems.append("unit must be a non-empty string")
  if entry.norm not in NORMS:
    problems.append(f"norm {entry.norm!r} not in {NORMS}")
  if not (isinstance(entry.epsilon, (int, float)) and entry.epsilon > 0):
    problems.append(f"epsilon must be > 0, got {entry.epsilon!r}")
  if not (isinstance(entry.delta, (int, float)) and 0 <= entry.delta < 1):
    problems.append(f"delta must be in [0, 1), got {entry.delta!r}")
  try:
    parse_support(entry.support)
  except AssertionError as err:
    problems.append(str(err))
  for name, reason in entry.skip.items():
    if SKIP_ALIASES.get(name, name) not in CHECKS + SLOW_CHECKS + EXTRA_CHECKS:
      problems.append(f"skip key {name!r} is not a check name "
                      f"({CHECKS + SLOW_CHECKS + EXTRA_CHECKS})")
    if not isinstance(reason, str) or len(reason.strip()) < 10:
      problems.append(f"skip[{name!r}] needs a reason (a sentence), got {reason!r}")
  if entry.noise is not None and entry.noise.kind not in NOISE_KINDS:
    problems.append(f"noise.kind {entry.noise.kind!r} not in {NOISE_KINDS}")
  for field in ("pairs", "release", "vector", "event"):
    if not callable(getattr(entry, field)):
      problems.append(f"{field} must be callable")
  if problems:
    raise AssertionError(f"[schema] {entry.name}: " + "; ".join(problems))
