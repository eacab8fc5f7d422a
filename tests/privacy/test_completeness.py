"""Completeness: every public entry point with privacy parameters is registered or declared.

The public API is walked: every module under ``jaxdp`` whose dotted path has no
``_``-prefixed component, the public functions and classes defined in jaxdp
that it exposes, and each class's ``__init__`` and public methods. A callable
is a *candidate release point* when

* a parameter is named in :data:`PRIVACY_PARAMETERS` (``epsilon``, ``delta``,
  ``rho``, ``noise_multiplier``, ``budget``, ``accountant``, ...), or
* its return annotation mentions ``Event`` (it returns / describes a DpEvent), or
* it takes a noise scale (:data:`NOISE_SCALE_PARAMETERS`: ``scale``, ``beta``,
  ``stddev``, ...) together with a key (``key``, ``keys``, ``rng``, ``seed``):
  a randomised release calibrated by its caller (report-noisy-max, samplers), or
* it is a public method named in :data:`RELEASE_METHOD_NAMES` (``fit``,
  ``predict``, ``answer``, ``step``, ...) of a class whose ``__init__`` takes
  a privacy parameter.

Every candidate must be in ``conformance_registry.REGISTRY`` (a release point
with its checks) or ``NOT_RELEASE_POINTS`` (with the reason it releases nothing
computed from private data). Names are canonical dotted names (see
:func:`public_names` and tests/privacy/README.md): the shortest public import
path, e.g. ``jaxdp.classic.private_quantile`` and
``jaxdp.classic.PrivateKMeans.fit``; every other public path of the same object
(such as the defining module's ``jaxdp.classic.quantile.private_quantile``) is
accepted as an alias. A class's ``__init__`` is named by the class
(``jaxdp.classic.PrivateKMeans``; ``...PrivateKMeans.__init__`` is an alias).
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from typing import Any

import pytest

import conformance_registry as reg

PRIVACY_PARAMETERS = frozenset({
    "epsilon", "eps", "epsilons", "delta", "deltas", "rho", "noise_multiplier",
    "noise_multipliers", "target_epsilon", "target_delta", "budget", "privacy_budget",
    "accountant", "l1_sensitivity", "l2_sensitivity", "sensitivity",
})
# A noise scale counts only together with a key: a randomised release that takes its
# noise scale directly (report-noisy-max, the exponential mechanism, the samplers).
NOISE_SCALE_PARAMETERS = frozenset({"scale", "scales", "beta", "stddev", "sigma", "noise_scale",
                                    "temperature"})
KEY_PARAMETERS = frozenset({"key", "keys", "rng", "seed"})
RELEASE_METHOD_NAMES = frozenset({"fit", "predict", "predict_proba", "answer", "step", "release",
                                  "query"})


def public_modules() -> tuple[dict[str, Any], dict[str, str]]:
  """``({dotted name: module}, {dotted name: import error})`` of jaxdp's public modules."""
  import jaxdp  # pylint: disable=import-outside-toplevel
  modules = {"jaxdp": jaxdp}
  errors = {}
  for info in pkgutil.walk_packages(jaxdp.__path__, "jaxdp."):
    if any(part.startswith("_") for part in info.name.split(".")):
      continue
    try:
      modules[info.name] = importlib.import_module(info.name)
    except ImportError as err:  # an optional dependency (e.g. tensorflow-datasets)
      errors[info.name] = f"{type(err).__name__}: {err}"
  return modules, errors


def _is_jaxdp(obj: Any) -> bool:
  return getattr(obj, "__module__", "") .startswith("jaxdp")


def _sort_key(path: str, home: str) -> tuple:
  module = path.rsplit(".", 1)[0]
  return (path.count("."), not home.startswith(module), path)


def public_names(modules: dict[str, Any]) -> dict[int, list[str]]:
  """``{id(obj): [public paths, canonical first]}`` for jaxdp functions and classes.

  Canonical: the path with the fewest components; among equals, one whose
  module is an ancestor of (or is) the defining module; then alphabetical.
  """
  paths: dict[int, list[str]] = {}
  objects: dict[int, Any] = {}
  for mod_name, module in modules.items():
    for attr, obj in vars(module).items():
      if attr.startswith("_") or not (inspect.isfunction(obj) or inspect.isclass(obj)):
        continue
      if not _is_jaxdp(obj):
        continue
      paths.setdefault(id(obj), []).append(f"{mod_name}.{attr}")
      objects[id(obj)] = obj
  for key, names in paths.items():
    home = objects[key].__module__
    names.sort(key=lambda p: _sort_key(p, home))
  public_names.objects = objects  # type: ignore[attr-defined]
  return paths


def _params(fn: Any) -> set[str]:
  try:
    return set(inspect.signature(fn).parameters)
  except (TypeError, ValueError):
    return set()


def _returns_event(fn: Any) -> bool:
  try:
    ann = inspect.signature(fn).return_annotation
  except (TypeError, ValueError):
    return False
  if ann is inspect.Signature.empty:
    return False
  text = ann if isinstance(ann, str) else getattr(ann, "__name__", repr(ann))
  return "Event" in str(text)


def _is_candidate(fn: Any) -> bool:
  params = _params(fn)
  return (bool(params & PRIVACY_PARAMETERS) or _returns_event(fn)
          or bool(params & NOISE_SCALE_PARAMETERS) and bool(params & KEY_PARAMETERS))


def candidates() -> dict[str, list[str]]:
  """``{canonical name: [aliases]}`` of every candidate release point of the public API."""
  modules, _ = public_modules()
  paths = public_names(modules)
  objects = public_names.objects  # type: ignore[attr-defined]
  found: dict[str, list[str]] = {}
  for key, names in paths.items():
    obj = objects[key]
    if inspect.isfunction(obj):
      if _is_candidate(obj):
        found[names[0]] = names
      continue
    init_private = bool(_params(obj) & PRIVACY_PARAMETERS)
    if init_private or _returns_event(obj):
      found[names[0]] = names + [n + ".__init__" for n in names]
    for attr, member in inspect.getmembers(obj):
      if attr.startswith("_"):
        continue
      fn = member.fget if isinstance(member, property) else member
      if not (inspect.isfunction(fn) or inspect.ismethod(fn)) or not _is_jaxdp(fn):
        continue
      if _is_candidate(fn) or (init_private and attr in RELEASE_METHOD_NAMES):
        found[f"{names[0]}.{attr}"] = [f"{n}.{attr}" for n in names]
  return found


def base_name(name: str) -> str:
  """``name`` without a configuration suffix: ``"jaxdp.x.f[neighbouring=add_remove]"`` -> ``"jaxdp.x.f"``.

  Several entries may test one release point in different configurations; each
  appends ``[variant]`` to the canonical name, and any of them registers it.
  """
  return name.split("[", 1)[0]


def resolve(name: str) -> Any:
  """The public object a dotted name refers to; AssertionError if none or not public."""
  parts = base_name(name).split(".")
  if parts[0] != "jaxdp":
    raise AssertionError(f"{name!r} is not a jaxdp name.")
  if any(p.startswith("_") and p != "__init__" for p in parts):
    raise AssertionError(f"{name!r} has a private component.")
  for i in range(len(parts), 0, -1):
    try:
      obj = importlib.import_module(".".join(parts[:i]))
    except ImportError:
      continue
    for attr in parts[i:]:
      if not hasattr(obj, attr):
        raise AssertionError(f"{name!r} does not resolve: {'.'.join(parts[:i])} has no {attr!r}.")
      obj = getattr(obj, attr)
    return obj
  raise AssertionError(f"{name!r} does not resolve to a module.")


@pytest.fixture(scope="module")
def registry():
  reg.load_all()
  return reg


def test_public_modules_import():
  _, errors = public_modules()
  optional = {m: e for m, e in errors.items() if "No module named 'jaxdp" not in e}
  broken = {m: e for m, e in errors.items() if m not in optional}
  assert not broken, f"public modules fail to import: {broken}"


def test_every_candidate_is_registered_or_declared(registry):
  known = {base_name(n) for n in set(registry.REGISTRY) | set(registry.NOT_RELEASE_POINTS)}
  found = candidates()
  missing = sorted(name for name, aliases in found.items() if not known.intersection(aliases))
  assert not missing, (
      f"{len(missing)} public entry point(s) take privacy parameters or return a DpEvent but are "
      "neither registered (tests/privacy/entries_<family>.py: reg.register(ReleasePoint(...))) "
      "nor declared (reg.not_a_release_point(name, reason)):\n  " + "\n  ".join(missing))


def test_registered_names_resolve(registry):
  bad = []
  for name in sorted(set(registry.REGISTRY) | set(registry.NOT_RELEASE_POINTS)):
    try:
      resolve(name)
    except AssertionError as err:
      bad.append(str(err))
  assert not bad, "registered / declared names that are not public objects:\n  " + "\n  ".join(bad)


def test_no_name_is_both_registered_and_declared(registry):
  both = sorted({base_name(n) for n in registry.REGISTRY}
                & {base_name(n) for n in registry.NOT_RELEASE_POINTS})
  assert not both, f"registered as a release point AND declared not one: {both}"


def test_walker_finds_known_release_points():
  """The walk itself has power: known release points and aliases are found."""
  found = candidates()
  assert "jaxdp.mechanisms.laplace_mechanism" in found
  assert "jaxdp.mechanisms.laplace.laplace_mechanism" in found["jaxdp.mechanisms.laplace_mechanism"]
  assert any(n.endswith("PrivateKMeans.fit") for n in found)
  assert resolve("jaxdp.mechanisms.laplace.laplace_mechanism") is resolve(
      "jaxdp.mechanisms.laplace_mechanism")
  with pytest.raises(AssertionError):
    resolve("jaxdp.mechanisms.no_such_mechanism")
