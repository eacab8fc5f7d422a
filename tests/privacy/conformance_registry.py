"""The privacy conformance registry: one :class:`ReleasePoint` per public release point.

A *release point* is every public function, estimator or object method that
releases something computed from private data or spends a ``DpEvent``. Each
family registers its entries in ``tests/privacy/entries_<family>.py`` with
:func:`register`; ``tests/privacy/test_conformance.py`` runs the generic
checks of ``tests/privacy/conformance_checks.py`` on every entry, and
``tests/privacy/test_completeness.py`` walks the public API and fails when an
entry point that takes ``epsilon``/``delta``/``rho``/``noise_multiplier`` (or
returns/spends a ``DpEvent``) is neither registered here nor listed in
``NOT_RELEASE_POINTS`` (public-parameter calibrations and accounting only,
each with its reason).

Everything a check needs is stated in the entry and computed INDEPENDENTLY of
the library's own calibration functions where the entry gives a number
(``sensitivity``, ``noise.scale``): a defect in the library's formula must not
be copied into the expectation.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional, Sequence

# A dataset is whatever the entry's callables take (usually a dict of arrays).
Dataset = Any
Output = Any


@dataclasses.dataclass(frozen=True)
class NoiseSpec:
  """The additive noise a release must carry, from the theorem it cites.

  Attributes:
    kind: ``"laplace"`` (per-coordinate scale b), ``"gaussian"`` (per-coordinate
      standard deviation sigma), ``"l2_laplace"`` (density prop. to
      exp(-||z||_2 / scale)), ``"discrete_laplace"`` / ``"discrete_gaussian"``
      (on the grid of ``ReleasePoint.support``, scale in output units).
    scale: the noise scale implied by the cited theorem, computed in the entry
      from the sensitivity and the privacy parameters (not by calling the
      library's calibration).
    reference: ``data -> np.ndarray``, the exact non-private statistic the noise is
      added to (test-only; same shape as ``ReleasePoint.vector(output)``).
    theorem: citation (paper, equation / lemma) of the scale.
  """
  kind: str
  scale: float
  reference: Callable[[Dataset], Any]
  theorem: str


@dataclasses.dataclass(frozen=True)
class AuditSpec:
  """An empirical distinguishing audit on the worst-case pair (``jaxdp.audit``).

  ``statistic(output) -> scalar`` reduces one output to the test statistic;
  ``trials`` runs per dataset in the always-on check (a larger ``slow_trials`` for
  the ``slow`` variant). The audit's Clopper-Pearson lower bound must not exceed
  the claimed epsilon.
  """
  statistic: Callable[[Output], Any]
  trials: int = 2_000
  slow_trials: int = 50_000


@dataclasses.dataclass(frozen=True)
class ReleasePoint:
  """One public release point and everything the generic checks need.

  Attributes:
    name: the public dotted name (``"jaxdp.classic.private_quantile"``,
      ``"jaxdp.classic.PrivateKMeans.fit"``); the completeness test matches it.
    family: ``mechanisms``, ``accounting``, ``training``, ``dpsgd``,
      ``prediction``, ``multiparty``, ``inference`` or ``classic``.
    neighbouring: ``"add_remove"`` or ``"replace_one"`` (the relation the
      claim is proven for, as written into its DpEvent).
    unit: the privacy unit (``"example"``, ``"party"``, ...).
    guarantee: the claim in words, with its theorem (``"eps-DP, Laplace
      mechanism, Dwork-Roth Thm 3.6"``).
    epsilon, delta: the claimed guarantee of ONE call in this entry's test
      configuration (after any budget split the method does internally).
    sensitivity: the claimed sensitivity of the additive-noise statistic under
      ``neighbouring`` in ``norm`` (None when the release is not additive noise:
      exponential mechanism, argmax, ...).
    norm: ``"l1"``, ``"l2"`` or ``"linf"``: the norm of ``sensitivity``.
    pairs: ``() -> [(D, D'), ...]`` neighbouring pairs under ``neighbouring``,
      worst cases included (records on the boundary, under-full blocks and
      parties, duplicated rows, extreme labels).
    release: ``(key, D) -> output``, one call with an explicit key and no
      accountant.
    vector: ``output -> 1-D float64 np.ndarray``: the private part of an output
      (for replay, noise and audit checks).
    fresh: ``(D) -> output``: one call WITHOUT an explicit key or seed (the
      object's default), or None where the API requires an explicit key (then
      the check asserts that omitting it raises).
    charged: ``(D, accountant) -> (output, releases)``: one call that spends on
      ``accountant``; ``releases`` is the number of independent releases the
      output contains, which the ledger must have grown by (counting events
      with multiplicity; see ``conformance_checks.ledger_releases``).
    event: ``() -> DpEvent`` of ONE release as the library states it (used by
      the charge check to compare the ledger with releases x event).
    noise: the additive noise the release must carry (None: not additive).
    audit: the empirical audit (None: no cheap audit; the reason goes in
      ``skip``).
    support: ``"continuous"`` (float output of continuous noise; the float-
      lattice caveat is documented in docs/sharp_edges.md), ``"discrete"``
      (integer / label / index output) or ``"grid:<step>"`` (values on the public
      grid ``step * Z``, data-independent).
    public_outputs: attribute / field names of returned objects that are
      deterministic functions of PUBLIC inputs only (shapes, classes, events,
      calibrations); every other deterministic field that changes between D
      and D' is a non-private leak unless its name starts with ``nonprivate_``.
    skip: ``{check_name: reason}`` for checks that do not apply, with the
      reason (e.g. ``{"replay": "not additive: exponential mechanism"}``).
    extreme_pairs: ``() -> [(D, D''), ...]`` neighbouring pairs whose differing
      record (in D'') is valid but extreme for the arithmetic (all votes on one
      class, the largest count, a record at float32's overflow threshold); None:
      the generic construction of ``tests/privacy/extreme_records.py`` derives
      them from ``pairs`` (jaxdp issue 40 section 2). Checked by
      ``conformance_checks.check_extreme_records``; skip key ``"extreme"``.
  """
  name: str
  family: str
  neighbouring: str
  unit: str
  guarantee: str
  epsilon: float
  delta: float
  pairs: Callable[[], Sequence[tuple[Dataset, Dataset]]]
  release: Callable[[Any, Dataset], Output]
  vector: Callable[[Output], Any]
  event: Callable[[], Any]
  charged: Optional[Callable[[Dataset, Any], tuple[Output, int]]] = None
  fresh: Optional[Callable[[Dataset], Output]] = None
  sensitivity: Optional[float] = None
  norm: str = "l2"
  noise: Optional[NoiseSpec] = None
  audit: Optional[AuditSpec] = None
  support: str = "continuous"
  public_outputs: tuple[str, ...] = ()
  skip: dict = dataclasses.field(default_factory=dict)
  extreme_pairs: Optional[Callable[[], Sequence[tuple[Dataset, Dataset]]]] = None


REGISTRY: dict[str, ReleasePoint] = {}

# name -> the ``entries_*`` module whose import registered it (the outermost one being
# imported), so that a process that needs a few entries (the fresh check's subprocesses)
# imports only their modules.
MODULE_OF: dict[str, str] = {}

# Public callables that take privacy parameters but release nothing computed from
# private data (calibrations, accounting of public parameters): name -> reason.
NOT_RELEASE_POINTS: dict[str, str] = {}

# Names declared with ``not_a_release_point(..., default=True)``: a fallback that an
# explicit declaration (or a registration) of the same name replaces silently.
_DEFAULT_DECLARATIONS: set[str] = set()


def register(entry: ReleasePoint) -> ReleasePoint:
  """Adds ``entry``; a second entry with the same name raises."""
  if entry.name in REGISTRY:
    raise ValueError(f"release point {entry.name!r} registered twice.")
  module = _registering_module()
  if module is not None:
    MODULE_OF[entry.name] = module
  if entry.name in _DEFAULT_DECLARATIONS:  # a registration replaces a fallback declaration
    _DEFAULT_DECLARATIONS.discard(entry.name)
    NOT_RELEASE_POINTS.pop(entry.name, None)
  REGISTRY[entry.name] = entry
  return entry


def _registering_module() -> Optional[str]:
  """The outermost ``entries_*`` module on the call stack (the one being imported)."""
  import sys  # pylint: disable=import-outside-toplevel
  frame, found = sys._getframe(1), None  # pylint: disable=protected-access
  while frame is not None:
    name = frame.f_globals.get("__name__", "")
    if name.startswith("entries_"):
      found = name
    frame = frame.f_back
  return found


def not_a_release_point(name: str, reason: str, *, default: bool = False) -> None:
  """Declares a public callable with privacy parameters that releases no private data.

  ``default=True`` declares a fallback (used for families without an owner, e.g.
  accounting): it is ignored when the name is already registered or declared,
  and a later explicit declaration or registration of the name replaces it.
  Two explicit declarations of one name raise.
  """
  if default:
    if name not in NOT_RELEASE_POINTS and name not in REGISTRY:
      NOT_RELEASE_POINTS[name] = reason
      _DEFAULT_DECLARATIONS.add(name)
    return
  if name in NOT_RELEASE_POINTS and name not in _DEFAULT_DECLARATIONS:
    raise ValueError(f"{name!r} declared twice.")
  _DEFAULT_DECLARATIONS.discard(name)
  NOT_RELEASE_POINTS[name] = reason


def load_all() -> dict[str, ReleasePoint]:
  """Imports every ``entries_*.py`` module (each registers its family) once."""
  import importlib
  import pathlib
  import sys
  here = pathlib.Path(__file__).parent
  if str(here) not in sys.path:
    sys.path.insert(0, str(here))
  for path in sorted(here.glob("entries_*.py")):
    importlib.import_module(path.stem)  # each module registers its entries on import
  return REGISTRY
