"""Clipping of a private plan: the per-example (or per-user) clipped gradient sum and its sensitivity.

The noise of every plan is scaled to the L2 sensitivity S of the clipped SUM
of one step (paper ``000_tradeoffs_of_private_prediction.md`` Section 3.1
Equation 4): S is the clip norm C for flat clipping, ``sqrt(sum_g C_g^2)``
for per-layer clipping (:func:`~.clipping.per_layer_sensitivity`), and the
clip norm of one user's contribution with user-level sampling. With an
:class:`~.adaptive_clipping.AdaptiveClipNorm` (Andrew et al. 2021) the
gradients are clipped in units of the current clip norm C_t, so S = 1 in
those units and C_t comes from the noise state (:mod:`.plan_noise`).

:func:`build` checks the clipping arguments of :func:`.make_private` once and
returns the :class:`Clipping` part: the ``clipped_grad`` function (vmap or
ghost norms, :mod:`.clipping`), the adaptive rule or None, the batch
arguments and S.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import numpy as np

from jaxdp import _validation
from jaxdp.dpsgd import adaptive_clipping, clipping, user_sampling


class Clipping(NamedTuple):
  """The clipping part of a plan.

  Attributes:
    grad_fn: the :func:`~.clipping.clipped_grad` (or user-level) function, ``.sensitivity`` S.
    adaptive: the :class:`~.adaptive_clipping.AdaptiveClipNorm`, or None (fixed clip norm).
    batch_argnums: the batch arguments of the per-example loss, ``(1, ..., k)``.
    sensitivity: S as a float (``inf`` for an infinite clip norm).
  """

  grad_fn: clipping.ClippedGradFn
  adaptive: Any
  batch_argnums: tuple[int, ...]
  sensitivity: float


def check_batch_argnums(batch_argnums: Any) -> tuple[int, ...]:
  """``batch_argnums`` as the sorted tuple ``(1, ..., k)`` (every argument after params)."""
  if isinstance(batch_argnums, (int, np.integer)) and not isinstance(batch_argnums, bool):
    batch_argnums = (batch_argnums,)
  try:
    batch_argnums = tuple(sorted(_validation.check_positive_int(a, "batch_argnums entry")
                                 for a in batch_argnums))
  except TypeError as err:
    raise TypeError(f"batch_argnums must be an int or a sequence of ints >= 1, got "
                    f"{batch_argnums!r}.") from err
  if batch_argnums != tuple(range(1, len(batch_argnums) + 1)):
    raise ValueError(f"batch_argnums must be (1, ..., k): every argument of per_example_loss "
                     f"after params is gathered from the batch, got {batch_argnums}.")
  return batch_argnums


def build(per_example_loss: Callable[..., Any], l2_clip_norm: Any, *, batch_argnums: Any,
          microbatch_size: Any, per_layer: Any, clipping_method: Any,
          batch_selection: Any) -> Clipping:
  """The clipping part from :func:`.make_private`'s clipping arguments (checked here).

  A fixed ``l2_clip_norm`` (per-group norms with ``per_layer``) or an
  ``AdaptiveClipNorm``: the normalised gradient is clipped to 1, in units of
  C_t (flat), or, with ``per_layer``, group l of every per-example gradient to
  its own C_t^l, one group (one quantile, one noisy count) per params leaf,
  the whole divided by ``D = sqrt(sum_l (C_t^l)^2)`` (Andrew et al. 2021
  Alg. 1 per group; McMahan et al. 2018 Sec. 3), so S = 1 in both cases. The
  ``grad_fn`` returned for an adaptive rule is the template of that
  clipping (S = 1, its method, microbatches and ``per_layer``); the step
  builds the function of the current C_t from it. With a
  ``UserPoissonSampler`` selection each user's examples form one clipped
  contribution (flat; per-layer and microbatches are refused by
  :mod:`.plan_selection`).
  """
  batch_argnums = check_batch_argnums(batch_argnums)
  adaptive = None
  if isinstance(l2_clip_norm, adaptive_clipping.AdaptiveClipNorm):
    adaptive = l2_clip_norm
    l2_clip_norm = 1.0  # gradients are clipped in units of the current clip norm(s)
  if isinstance(batch_selection, user_sampling.UserPoissonSampler):
    grad_fn = user_sampling.user_clipped_grad(per_example_loss, l2_clip_norm=l2_clip_norm,
                                              batch_argnums=batch_argnums)
  else:
    grad_fn = clipping.clipped_grad(per_example_loss, l2_clip_norm=l2_clip_norm,
                                    batch_argnums=batch_argnums, microbatch_size=microbatch_size,
                                    per_layer=per_layer, method=clipping_method)
  return Clipping(grad_fn, adaptive, batch_argnums, float(grad_fn.sensitivity))


__all__ = ["Clipping", "build", "check_batch_argnums"]
