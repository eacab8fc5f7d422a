"""The toy release of the power tests (tests/privacy/test_power.py), in a module of its own.

``f(D) = sum of records clipped to L1 norm 1`` (add/remove), ``Lap(1/eps)`` per coordinate;
``Toy``'s knobs inject one defect each. Kept apart from test_power so that the fresh
check's two subprocesses (``conformance_checks.FreshProcesses(..., module="toy_release")``)
import only jax, numpy and the registry schema, not the test module and what it imports.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

import conformance_registry as reg
from jaxdp import _keys

DIM = 4
EPS = 1.0
SCALE = 1.0 / EPS  # Laplace scale b = Delta_1 / eps with Delta_1 = 1 (Dwork & Roth Thm 3.6)
GRID = 2.0**-4
BATCH = 3  # releases per charged call


class ToyRelease(NamedTuple):
  value: jax.Array     # the private release
  dim: int             # public: the output dimension


class LeakyRelease(NamedTuple):
  value: jax.Array
  dim: int
  exact_sum: np.ndarray  # the non-private statistic itself (defect iv)


def _clip_rows(x: np.ndarray, bound: float) -> np.ndarray:
  """Rows scaled to L1 norm <= bound."""
  norms = np.abs(x).sum(axis=1, keepdims=True)
  return x * np.minimum(1.0, bound / np.maximum(norms, 1e-30))


def exact_sum(data: dict, bound: float = 1.0) -> np.ndarray:
  """``sum_i clip(x_i)`` in float64 (the reference of the noise check)."""
  return _clip_rows(np.asarray(data["x"], np.float64), bound).sum(axis=0)


def toy_pairs() -> list:
  """Add/remove pairs; the worst cases (a record at and beyond the clip bound) first."""
  rng = np.random.default_rng(7)
  base = {"x": _clip_rows(rng.uniform(0, 1, size=(6, DIM)), 1.0).astype(np.float32)}
  def add(row):
    return {"x": np.concatenate([base["x"], np.asarray([row], np.float32)])}
  return [(base, add([1.0, 0.0, 0.0, 0.0])),        # on the boundary, one coordinate
          (base, add([30.0, 0.0, 0.0, 0.0])),       # far beyond: clipped
          (base, add(base["x"][0])),                # duplicated row
          (base, {"x": base["x"][:-1]})]            # removed row


def toy_event():
  """``LaplaceDpEvent(1/eps)``, add/remove (imported here: the subprocesses never spend)."""
  from jaxdp.accounting import events  # pylint: disable=import-outside-toplevel
  return events.LaplaceDpEvent(noise_multiplier=SCALE / 1.0, neighbouring="add_remove")


@dataclasses.dataclass(frozen=True)
class Toy:
  """Knobs of the toy release; the defaults are the correct release."""
  noise_factor: float = 1.0   # (i) / (vii): scale multiplier
  clip: float = 1.0           # (vi): clip bound actually used (the claim is 1)
  fresh_mode: str = "os"      # (ii) "fixed": key 0 every call; "counter": per-process counter
  charge_count: int = BATCH   # (iii): events spent for BATCH releases
  leak: bool = False          # (iv): return the exact sum
  lattice: str = "none"       # (v): "public" grid or "record" anchored lattice

  def release(self, key, data):
    cc_value = jnp.asarray(exact_sum(data, self.clip), jnp.float32)
    noisy = cc_value + jnp.float32(self.noise_factor * SCALE) * jax.random.laplace(
        key, (DIM,), jnp.float32)
    if self.lattice == "public":
      noisy = jnp.round(noisy / GRID) * GRID
    elif self.lattice == "record":
      anchor = jnp.float32(data["x"][0, 0])
      noisy = anchor + jnp.round((noisy - anchor) / GRID) * GRID
    if self.leak:
      return LeakyRelease(noisy, DIM, exact_sum(data, self.clip))
    return ToyRelease(noisy, DIM)

  def fresh(self, data):
    if self.fresh_mode == "fixed":
      key = jax.random.key(0)
    elif self.fresh_mode == "counter":
      key = jax.random.fold_in(jax.random.key(0), next(_COUNTER))
    else:
      key = _keys.fresh_key()
    return self.release(key, data)

  def charged(self, data, accountant):
    accountant.spend(toy_event(), count=self.charge_count)
    keys = jax.random.split(_keys.fresh_key(), BATCH)
    return [self.release(k, data) for k in keys], BATCH


_COUNTER = itertools.count()


def make_toy(name: str, toy: Toy = Toy(), **overrides) -> reg.ReleasePoint:
  fields = dict(
      name=name, family="mechanisms", neighbouring="add_remove", unit="example",
      guarantee="eps-DP, Laplace mechanism on a clipped sum, Dwork-Roth Thm 3.6",
      epsilon=EPS, delta=0.0, pairs=toy_pairs, release=toy.release,
      vector=lambda out: np.asarray(out.value, np.float64), event=toy_event,
      charged=toy.charged, fresh=toy.fresh, sensitivity=1.0, norm="l1",
      noise=reg.NoiseSpec("laplace", SCALE, exact_sum, "Dwork & Roth 2014 Thm 3.6: b = 1/eps"),
      audit=reg.AuditSpec(statistic=lambda out: out.value[0], trials=4000, slow_trials=100_000),
      support="continuous", public_outputs=("dim",))
  fields.update(overrides)
  return reg.ReleasePoint(**fields)


# Module-level (the fresh check's subprocesses import them from here).
TOY = make_toy("toy.laplace")
TOY_GRID = make_toy("toy.laplace_grid", Toy(lattice="public"), support=f"grid:{GRID}")
TOY_UNDER_NOISED = make_toy("toy.under_noised", Toy(noise_factor=0.8))
TOY_FIXED_KEY = make_toy("toy.fixed_key", Toy(fresh_mode="fixed"))
TOY_COUNTER_KEY = make_toy("toy.counter_key", Toy(fresh_mode="counter"))
TOY_ONE_CHARGE = make_toy("toy.one_charge", Toy(charge_count=1))
TOY_LEAK = make_toy("toy.leak", Toy(leak=True))
TOY_RECORD_LATTICE = make_toy("toy.record_lattice", Toy(lattice="record"), support=f"grid:{GRID}")
TOY_SENSITIVITY = make_toy("toy.sensitivity", Toy(clip=1.2))
TOY_HALF_NOISE = make_toy("toy.half_noise", Toy(noise_factor=0.5))
TOY_KEYED = make_toy("toy.keyed", fresh=None)
TOY_OVER_NOISED = make_toy("toy.over_noised", Toy(noise_factor=1.6))
