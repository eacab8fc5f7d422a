"""Small helpers shared by experiments and benchmarks for writing results."""

from __future__ import annotations

import math
from typing import Any


def strict_json(obj: Any) -> Any:
  """``obj`` with non-finite floats (e.g. epsilon = inf) replaced by strings, so
  ``json.dump(..., allow_nan=False)`` writes strict JSON."""
  if isinstance(obj, dict):
    return {k: strict_json(v) for k, v in obj.items()}
  if isinstance(obj, (list, tuple)):
    return [strict_json(v) for v in obj]
  if isinstance(obj, float) and not math.isfinite(obj):
    return str(obj)
  return obj
