"""User-level DP-SGD: Poisson sampling of USERS, one clipped contribution per user.

The privacy unit is a user (all the examples that share a ``user_ids`` value),
not an example (McMahan, Ramage, Talwar & Zhang 2018, "Learning differentially
private recurrent language models": user-level DP by sampling users and
bounding each user's whole contribution). At every step each of the U users
joins the batch independently with probability q (the Poisson rule of
:func:`jaxdp.dpsgd.poisson_sample_indices`, applied to the user indices
``0 .. U-1``), and the step releases

  sum_{u in batch} clip_C(g_u) + N(0, (z C)^2 I),    divided by the public q U,

with ``g_u`` the gradient of user u's REDUCED loss (``reduction="mean"``, the
default: the mean of the per-example losses of u's examples, so
``g_u = (1 / n_u) sum_{i in u} grad l_i``; ``"sum"``: their sum) and
``clip_C(g) = g min(1, C / ||g||)`` (float32-safe and overflow-safe:
:func:`jaxdp.dpsgd.clipping.clip_groups`, with the clip-norm rounding
of :func:`~jaxdp.dpsgd.clipped_grad`). A user whose ``g_u`` is not finite
contributes exactly zero. Whatever a user's number of examples, its
contribution ``f(u)`` is a function of its own examples only (and of the
public parameters) with ``||f(u)|| <= C``. Adding or removing one user
therefore moves the sum by at most ``C``: the step is the Poisson-subsampled
Gaussian mechanism at rate q on users (Abadi et al. 2016; Mironov, Talwar &
Zhang 2019), ``dpsgd_event(z, q, T, unit="user")``
(:meth:`UserPoissonSampler.event`), composed on a
``PrivacyAccountant(unit="user")``. Under replace-one (one user replaced) the
sum moves by at most ``2C``: ``neighbouring="replace_one"`` (PLD), as for
examples. The same choice is the "user-level sampling" of Charles et al. 2024
("Fine-tuning large language models with user-level differential privacy"):
one averaged gradient per sampled user, clipped. JAX Privacy's
``UserSelectionStrategy`` instead takes a fixed number of examples per
selected user, cycling through (and so repeating) a small user's examples;
here every example of a user (up to the declared cap) is used once and the
padding is masked.

Static shapes. A user's examples are laid out as one row of a
``(U, K)`` table of example indices, ``K = max_examples_per_user`` DECLARED by
the caller (public: it fixes the shapes; privacy does not depend on it since
the clip bounds each user's contribution whatever its size). Data where some
user has more than K examples is refused (``on_excess="raise"``, default), or
each such user keeps its first K examples in row order
(``on_excess="truncate"``: a per-user deterministic rule that reads only that
user's rows, so add/remove neighbours stay neighbours after it). Padding slots
of a user repeat that user's own first example and are masked, so even a
non-finite gradient from padding can only zero its own user's contribution.
A batch is ``ceil(count / P)`` chunks of P user slots (P from the binomial
tail on U users, as :func:`~jaxdp.dpsgd.padded_batch_size`); an overflowing
batch is split, never truncated. Empty user slots contribute exactly zero.

The number of users U is treated as public, like N in example-level DP-SGD
(it fixes the divisor q U).

Host and device paths, the same batch for the same key:

* host: :meth:`UserPoissonSampler.sample` -> list of :class:`UserPaddedBatch`;
  ``chunk.gather(x, y)`` -> a :class:`~jaxdp.dpsgd.MaskedBatch` with leaves
  ``(P, K, ...)`` and mask ``(P, K)``, for :func:`user_clipped_grad`.
* device: :meth:`UserPoissonSampler.place_data` stores the data user-major,
  ``(U, K, ...)`` plus the ``(U, K)`` example mask (memory ``U K`` rows: the
  price of static shapes when counts are unequal), and
  :meth:`UserPoissonSampler.device_clipped_sum_fn` is
  :func:`~jaxdp.dpsgd.device_sampling.clipped_sum_fn` over the U "rows" (users):
  the same inclusion words (partitionable Threefry: user u's word depends on
  the key and u only, on any mesh), the same chunking.

Other parts of a user-level plan (derivations in the docstrings named):

* **Adaptive clip norm** (Andrew et al. 2021, whose Algorithm 1 and Thm 1 are stated for
  user-level DP with users sampled each round): :func:`adaptive_user_clipped_grad` and
  :meth:`UserPoissonSampler.adaptive_event`; the event is DP-SGD's at the joint multiplier,
  unit ``"user"``, under add/remove or replace-one.
* **Correlated noise**: :meth:`UserPoissonSampler.mf_event`, the correlated module's
  :func:`~jaxdp.dpsgd.correlated.mf_event` at ``min_separation=1`` and the user rate q.
* **Per-layer clipping** (no user-level implementation here; the analysis would be the
  flat one with C replaced by ``sqrt(sum_g C_g^2)``) and ``microbatch_size`` (memory only:
  the chunk size P of user slots, ``padded_size``, already bounds the memory of a step).
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxdp import _validation
from jaxdp.accounting import dpsgd_accounting
from jaxdp.accounting import events
from jaxdp.dpsgd import device_sampling
from jaxdp.dpsgd import sampling
from jaxdp.dpsgd.sampling import MaskedBatch
from jaxdp.dpsgd.user_clipping import (UserClippedGradFn, adaptive_user_clipped_grad,  # noqa: F401
                                        user_clipped_grad)
from jaxdp.errors import ArgumentTypeError

PyTree = Any
USER_UNIT = "user"
_MAX_ROWS = 2 ** 31 - 1


def check_user_ids(user_ids: Any, name: str = "user_ids") -> np.ndarray:
  """``user_ids`` as a (N,) int64 host array: 1-D, non-empty, integer dtype (not bool).

  Raises:
    ArgumentTypeError: not an integer array (floats, strings, bools, objects).
    ValueError: not 1-D, empty, or more than ``2^31 - 1`` rows.
  """
  if isinstance(user_ids, jax.core.Tracer):
    raise ArgumentTypeError(f"{name} must be a concrete host array (the layout is built on the "
                            "host), got a traced array.")
  try:
    ids = np.asarray(user_ids)
  except Exception as err:  # pylint: disable=broad-except
    raise ArgumentTypeError(f"{name} must be a 1-D array of integers, got "
                            f"{type(user_ids).__name__}.") from err
  if ids.dtype == bool or not np.issubdtype(ids.dtype, np.integer):
    raise ArgumentTypeError(f"{name} must be a 1-D array of integers (one user id per example), "
                            f"got dtype {ids.dtype}.")
  if ids.ndim != 1:
    raise ValueError(f"{name} must be 1-D (one user id per example), got shape {ids.shape}.")
  if ids.shape[0] == 0:
    raise ValueError(f"{name} must hold at least one example, got an empty array.")
  if ids.shape[0] > _MAX_ROWS:
    raise ValueError(f"{name} must have < 2^31 rows (int32 indices), got {ids.shape[0]}.")
  return ids.astype(np.int64)


def user_table(user_ids: Any, max_examples_per_user: int, on_excess: str = "raise"
               ) -> tuple[np.ndarray, np.ndarray]:
  """``(rows, counts)``: user u's example rows (U, K) int32 and their number (U,) int32.

  Users are numbered ``0 .. U-1`` in increasing order of their id; a user's
  rows are in increasing row order; slots ``>= counts[u]`` repeat the user's
  first row (masked padding). NON-PRIVATE (which rows belong to whom): an
  internal layout, never to be released.

  Raises:
    ValueError: a user has more than ``max_examples_per_user`` examples and
      ``on_excess="raise"`` (nothing is dropped silently), or a bad argument.
  """
  ids = check_user_ids(user_ids)
  k = _validation.check_positive_int(max_examples_per_user, "max_examples_per_user")
  if on_excess not in ("raise", "truncate"):
    raise ValueError(f"on_excess must be 'raise' or 'truncate', got {on_excess!r}.")
  _, inverse, counts = np.unique(ids, return_inverse=True, return_counts=True)
  inverse = inverse.reshape(-1)
  if on_excess == "raise" and counts.max() > k:
    raise ValueError(
        f"{int((counts > k).sum())} user(s) have more than max_examples_per_user={k} examples "
        f"(at most {int(counts.max())}): declare a larger max_examples_per_user or pass "
        "on_excess='truncate' (each such user keeps its first max_examples_per_user rows).")
  order = np.argsort(inverse, kind="stable")  # rows grouped by user, row order within a user
  starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
  users_sorted = inverse[order]
  position = np.arange(ids.shape[0]) - starts[users_sorted]
  keep = position < k
  table = np.empty((counts.shape[0], k), np.int32)
  table[:] = order[starts][:, None]  # every slot first holds the user's first row
  table[users_sorted[keep], position[keep]] = order[keep]
  return table, np.minimum(counts, k).astype(np.int32)


class UserPaddedBatch:
  """P user slots of a user-level batch, each with K example slots, and their masks.

  Use :meth:`gather` (the masks travel with the data). Padding (user slots
  past the batch, example slots past a user's count) is masked and holds the
  slot's own user's first row (or user 0's for empty user slots).

  Attributes:
    user_mask: (P,) bool, True for sampled users.
    mask: (P, K) bool, True for real examples of sampled users.
  """

  def __init__(self, users: np.ndarray, user_mask: np.ndarray, rows: np.ndarray,
               mask: np.ndarray):
    self._users = np.asarray(users, np.int32)
    self.user_mask = np.asarray(user_mask, bool)
    self._rows = np.asarray(rows, np.int32)
    self.mask = np.asarray(mask, bool)

  @property
  def num_users(self) -> int:
    """Sampled users in this chunk (NON-PRIVATE)."""
    return int(self.user_mask.sum())

  @property
  def num_examples(self) -> int:
    """Real examples in this chunk (NON-PRIVATE)."""
    return int(self.mask.sum())

  @property
  def users(self) -> np.ndarray:
    """Dense indices (``0 .. U-1``) of the sampled users, increasing (NON-PRIVATE)."""
    return self._users[self.user_mask]

  @property
  def indices(self) -> np.ndarray:
    """The real example rows of the chunk, user by user (no padding)."""
    return self._rows[self.mask]

  def slots_and_mask(self) -> tuple[np.ndarray, np.ndarray]:
    """``(rows, mask)``: (P, K) int32 example rows (padding included) and (P, K) bool mask."""
    return self._rows.copy(), self.mask.copy()

  def gather(self, *arrays: Any) -> MaskedBatch:
    """``MaskedBatch((a[rows] for a in arrays), mask)``: leaves (P, K, ...), mask (P, K)."""
    if not arrays:
      raise ValueError("gather needs at least one array (the dataset on the leading axis).")
    rows, mask = self.slots_and_mask()
    return MaskedBatch(tuple(jax.tree.map(lambda a: a[rows], a) for a in arrays), mask)


def _mf_accounting():
  from jaxdp.dpsgd.correlated import accounting  # pylint: disable=g-import-not-at-top
  return accounting


class UserPoissonSampler:
  """Poisson sampling of users (rate q), each user's examples in one padded row.

  Args:
    user_ids: (N,) integer user id of every example (any integers; users are
      numbered ``0 .. U-1`` in increasing id order).
    sample_rate: the user sampling rate q in (0, 1]; or give
      ``expected_users_per_batch`` (``q = that / U``), exactly one of the two.
    max_examples_per_user: K, declared (public): the example slots per user.
    padded_size: user slots P per chunk (default: the binomial bound on U
      users at ``overflow_prob``, :func:`~jaxdp.dpsgd.padded_batch_size`).
    overflow_prob: target overflow probability of the default P.
    on_excess: ``"raise"`` (default) or ``"truncate"`` for users with more
      than K examples (module docstring).
    multiple_of: round P up to a multiple of this (devices).

  >>> import jax, numpy as np
  >>> s = UserPoissonSampler(np.array([7, 7, 3, 9, 9, 9]), sample_rate=1.0,
  ...                        max_examples_per_user=3)
  >>> chunk, = s.sample(jax.random.key(0))
  >>> chunk.mask.astype(int).tolist()
  [[1, 0, 0], [1, 1, 0], [1, 1, 1]]
  """

  unit = USER_UNIT

  def __init__(self, user_ids: Any, *, sample_rate: float | None = None,
               expected_users_per_batch: float | None = None, max_examples_per_user: int,
               padded_size: int | None = None, overflow_prob: float = 1e-9,
               on_excess: str = "raise", multiple_of: int = 1):
    self._rows, self._counts = user_table(user_ids, max_examples_per_user, on_excess)
    self.num_examples = int(np.shape(user_ids)[0])
    self.num_users = int(self._counts.shape[0])
    self.max_examples_per_user = int(self._rows.shape[1])
    self.sample_rate = sampling.resolve_sample_rate(sample_rate, expected_users_per_batch,
                                                    self.num_users)
    m = _validation.check_positive_int(multiple_of, "multiple_of")
    if padded_size is None:
      padded_size = sampling.padded_batch_size(self.num_users, self.sample_rate, overflow_prob, m)
    else:
      padded_size = _validation.check_positive_int(padded_size, "padded_size")
      if padded_size % m:
        raise ValueError(f"padded_size must be a multiple of multiple_of={m}, got {padded_size}.")
    self.padded_size = int(padded_size)
    self._example_mask = np.arange(self.max_examples_per_user)[None, :] < self._counts[:, None]

  @property
  def expected_batch_size(self) -> float:
    """``q U``: expected users per batch, the divisor of the noisy sum."""
    return self.sample_rate * self.num_users

  @property
  def overflow_probability(self) -> float:
    """Per-step ``Pr[Binomial(U + 1, q) > P]`` (:func:`~jaxdp.dpsgd.overflow_probability`)."""
    return sampling.overflow_probability(self.num_users, self.sample_rate, self.padded_size)

  def _chunk(self, chunk: sampling.PaddedBatch) -> UserPaddedBatch:
    users, user_mask = chunk.slots_and_mask()
    mask = self._example_mask[users] & user_mask[:, None]
    return UserPaddedBatch(users, user_mask, self._rows[users], mask)

  def sample(self, key: jax.Array) -> list[UserPaddedBatch]:
    """One Poisson batch of users as ``ceil(count / P)`` chunks (at least one)."""
    users = sampling.poisson_sample_indices(key, self.num_users, self.sample_rate)
    return [self._chunk(c) for c in sampling.pad_and_split(users, self.padded_size, "split")]

  def event(self, noise_multiplier: float, steps: int = 1, *,
            neighbouring: str = events.ADD_REMOVE) -> events.DpEvent:
    """``dpsgd_event(z, q, steps, neighbouring=..., unit="user")`` (module docstring)."""
    return dpsgd_accounting.dpsgd_event(noise_multiplier, self.sample_rate, steps,
                                        neighbouring=neighbouring, unit=USER_UNIT)

  def epsilon(self, noise_multiplier: float, steps: int, delta: float, accountant: str = "rdp",
              neighbouring: str = events.ADD_REMOVE) -> float:
    """User-level epsilon of ``steps`` steps: :func:`~jaxdp.accounting.dpsgd_epsilon` at q."""
    return dpsgd_accounting.dpsgd_epsilon(noise_multiplier, self.sample_rate, steps, delta,
                                          accountant, neighbouring)

  def calibrate_noise_multiplier(self, target_epsilon: float, delta: float, steps: int,
                                 accountant: str = "rdp",
                                 neighbouring: str = events.ADD_REMOVE) -> float:
    """:func:`~jaxdp.accounting.calibrate_noise_multiplier` at the user rate q."""
    return dpsgd_accounting.calibrate_noise_multiplier(
        target_epsilon, delta, self.sample_rate, steps, accountant, neighbouring=neighbouring)

  def user_major(self, *arrays: Any) -> tuple:
    """Host copies of ``arrays`` laid out user-major: leaves ``(U, K, ...)``, then the (U, K) mask.

    The last element is the example mask (bool). NON-PRIVATE layout (data of
    every user); for :meth:`place_data` and tests.
    """
    if not arrays:
      raise ValueError("user_major needs at least one array (the dataset on the leading axis).")
    out = []
    for i, a in enumerate(arrays):
      def take(leaf, i=i):
        leaf = np.asarray(leaf)
        if leaf.ndim == 0 or leaf.shape[0] != self.num_examples:
          raise ValueError(f"data[{i}] must have num_examples={self.num_examples} rows (one per "
                           f"user_ids entry), got shape {leaf.shape}.")
        return leaf[self._rows]
      out.append(jax.tree.map(take, a))
    return tuple(out) + (self._example_mask.copy(),)

  def place_data(self, arrays: tuple, mesh: Any = None) -> tuple:
    """Device-resident user-major data for :meth:`device_clipped_sum_fn`.

    :meth:`user_major` placed by :func:`~jaxdp.dpsgd.device_sampling.place_data`
    over U "rows" (users): with a mesh, padded to ``U_pad = D ceil(U / D)``
    users (zero data, zero mask) and sharded ``P("data")``.
    """
    arrays = tuple(arrays) if isinstance(arrays, (tuple, list)) else (arrays,)
    return device_sampling.place_data(self.user_major(*arrays), self.num_users, mesh)

  def device_clipped_sum_fn(self, user_grad_fn: Callable[..., Any] | None = None, *,
                            mesh: Any = None, physical_batch_size: int | None = None,
                            overflow_prob: float = 1e-9,
                            make_grad_fn: Callable[[jax.Array], Callable[..., Any]] | None = None
                            ) -> Callable[..., Any]:
    """``(params, step_key, placed, *, clip_norm) -> (grad_sum, stats)``: sample users in jit, clip, sum.

    ``placed`` is :meth:`place_data`'s output; ``user_grad_fn`` a
    :func:`user_clipped_grad` function, or ``make_grad_fn`` (``clip_norm -> user_grad_fn``,
    e.g. ``lambda c: adaptive_user_clipped_grad(loss, c)``) for a clip norm per step, passed
    as ``clip_norm=`` to every call. The users sampled are those of
    :meth:`sample` for the same key (module docstring); ``stats`` are the
    NON-PRIVATE ``(loss_sum, num_users, num_clipped)``. Without ``mesh`` and
    ``physical_batch_size`` the chunk size is this sampler's P.
    """
    if (user_grad_fn is None) == (make_grad_fn is None):
      raise ValueError("give exactly one of user_grad_fn (a fixed clip norm) or make_grad_fn (a "
                       "clip norm per step).")
    if mesh is not None and device_sampling.DATA_AXIS not in mesh.axis_names:
      raise ValueError(f"mesh must have an axis named {device_sampling.DATA_AXIS!r}, got "
                       f"{mesh.axis_names}.")
    if mesh is None and physical_batch_size is None:
      padded = self.padded_size
    else:
      shards = 1 if mesh is None else mesh.shape[device_sampling.DATA_AXIS]
      padded = device_sampling.local_padded_size(self.num_users, self.sample_rate, shards,
                                                 physical_batch_size, overflow_prob)

    def adapter_for(grad_fn):
      def adapter(params, masked):
        *data, example_mask = masked.arrays
        mask = jnp.asarray(example_mask, bool) & (jnp.asarray(masked.mask) > 0)[:, None]
        return grad_fn(params, MaskedBatch(tuple(data), mask))
      return adapter

    if make_grad_fn is not None:
      return device_sampling.clipped_sum_fn(
          None, num_examples=self.num_users, sample_rate=self.sample_rate, padded_size=padded,
          mesh=mesh, make_grad_fn=lambda c: adapter_for(make_grad_fn(c)))
    return device_sampling.clipped_sum_fn(adapter_for(user_grad_fn), num_examples=self.num_users,
                                          sample_rate=self.sample_rate, padded_size=padded,
                                          mesh=mesh)

  # -- the other parts of a plan: adaptive clipping, correlated noise (module docstring) --------

  def adaptive_event(self, gradient_noise_multiplier: float, count_noise_multiplier: float,
                     steps: int = 1, *, num_counts: int = 1,
                     neighbouring: str = events.ADD_REMOVE) -> events.DpEvent:
    """User-level DP-SGD with adaptive clipping: its event from its parts (sigma_Delta, sigma_b).

    One step releases ``(sum_{u in S} gbar_u + N(0, sigma_Delta^2 I), sum_{u in S} (b_u - 1/2)
    + N(0, sigma_b^2 I_G))`` for a Poisson sample S of users (rate q), ``gbar_u`` user u's
    update clipped to C_t and divided by C_t (:func:`adaptive_user_clipped_grad`), ``b_u``
    its G unclipped bits. This is Andrew et al. 2021's own setting (Algorithm 1 and Thm 1
    are stated for user-level DP in federated learning, users sampled each round, one
    clipped update and one bit per user). Whitened, the step is Poisson-sampled DP-SGD
    over users whose per-user vector ``(gbar_u / sigma_Delta, (b_u - 1/2) / sigma_b)`` has
    norm <= ``sqrt(sigma_Delta^-2 + G (2 sigma_b)^-2) = 1 / sigma`` under unit noise:
    add/remove of a user shifts one mixture component by at most ``1 / sigma``, replace-one
    moves it by at most ``2 / sigma`` (both blocks double). So the event is
    :meth:`event` at ``sigma = joint_noise_multiplier(sigma_Delta, sigma_b,
    participations=G)``: ``PoissonSampled(q, Gaussian(sigma))`` (add/remove; RDP or PLD) or
    ``PoissonSampled(q, Gaussian(sigma / 2))`` tagged replace-one (PLD), unit ``"user"``.
    """
    from jaxdp.dpsgd import adaptive_clipping  # pylint: disable=g-import-not-at-top
    sigma_delta = _validation.check_positive(gradient_noise_multiplier,
                                             "gradient_noise_multiplier")
    sigma = adaptive_clipping.joint_noise_multiplier(sigma_delta, count_noise_multiplier,
                                                     participations=num_counts)
    return self.event(sigma, steps, neighbouring=neighbouring)

  def adaptive_gradient_noise_multiplier(self, noise_multiplier: float,
                                         count_noise_multiplier: float, *,
                                         num_counts: int = 1, noise_strategy: Any = None,
                                         steps: int | None = None) -> float:
    """sigma_Delta that makes gradient and counts together cost ``noise_multiplier`` sigma.

    Independent noise: ``gradient_noise_multiplier(sigma, sigma_b, participations=G)``
    (either relation: replace-one doubles both blocks). With ``noise_strategy`` (and
    ``steps``): :func:`jaxdp.dpsgd.correlated.accounting.adaptive_gradient_noise_multiplier`
    at ``min_separation=1``, ``sample_rate=q`` (G = 1 only: per-layer counts are not
    implemented there).
    """
    from jaxdp.dpsgd import adaptive_clipping  # pylint: disable=g-import-not-at-top
    if noise_strategy is None:
      return adaptive_clipping.gradient_noise_multiplier(noise_multiplier, count_noise_multiplier,
                                                         participations=num_counts)
    if steps is None:
      raise ValueError("steps (the run's number of steps n) is required with noise_strategy.")
    if _validation.check_positive_int(num_counts, "num_counts") != 1:
      raise ValueError("num_counts > 1 (per-layer adaptive counts) with noise_strategy has no "
                       "implementation here; use one clip group.")
    return _mf_accounting().adaptive_gradient_noise_multiplier(
        noise_strategy, noise_multiplier=noise_multiplier,
        count_noise_multiplier=count_noise_multiplier, num_steps=steps, min_separation=1,
        sample_rate=self.sample_rate)

  def mf_event(self, strategy: Any, noise_multiplier: float, steps: int, *,
               neighbouring: str = events.ADD_REMOVE) -> events.DpEvent:
    """A correlated-noise run over Poisson-sampled users: :func:`jaxdp.dpsgd.correlated.mf_event`.

    ``mf_event(strategy, sigma, steps, min_separation=1, sample_rate=q, unit="user")``:
    Poisson sampling of users at every step is the b = 1 case of cyclic Poisson sampling
    (every user in the one group), so the correlated module's analysis applies verbatim
    with the user as the unit: amplified (Choquette-Choo et al. 2023, Thm 4) for a
    one-band strategy with q < 1, otherwise the deterministic Gaussian of the strategy's
    sensitivity under (n, 1)-participation (a user may be sampled at every step; Denisov
    et al. 2022, Thm 2.1), doubled for replace-one.
    """
    return _mf_accounting().mf_event(strategy, noise_multiplier=noise_multiplier, num_steps=steps,
                                     min_separation=1, sample_rate=self.sample_rate,
                                     unit=USER_UNIT, neighbouring=neighbouring)

  def mf_epsilon(self, strategy: Any, noise_multiplier: float, steps: int, delta: float,
                 accountant: str = "rdp", neighbouring: str = events.ADD_REMOVE) -> float:
    """User-level epsilon of :meth:`mf_event` (:func:`jaxdp.dpsgd.correlated.mf_epsilon`)."""
    return _mf_accounting().mf_epsilon(strategy, noise_multiplier=noise_multiplier,
                                       num_steps=steps, min_separation=1,
                                       sample_rate=self.sample_rate, delta=delta,
                                       accountant=accountant, neighbouring=neighbouring)

  def calibrate_mf_noise_multiplier(self, strategy: Any, target_epsilon: float, delta: float,
                                    steps: int, accountant: str = "rdp", tol: float = 1e-4,
                                    neighbouring: str = events.ADD_REMOVE) -> float:
    """Smallest sigma meeting ``(target_epsilon, delta)`` for :meth:`mf_event`."""
    return _mf_accounting().calibrate_mf_noise_multiplier(
        target_epsilon, delta, strategy, num_steps=steps, min_separation=1,
        sample_rate=self.sample_rate, accountant=accountant, tol=tol, neighbouring=neighbouring)

  def __repr__(self) -> str:
    return (f"UserPoissonSampler(num_users={self.num_users}, sample_rate={self.sample_rate}, "
            f"max_examples_per_user={self.max_examples_per_user}, "
            f"padded_size={self.padded_size})")


__all__ = ["USER_UNIT", "UserClippedGradFn", "UserPaddedBatch", "UserPoissonSampler",
           "adaptive_user_clipped_grad", "check_user_ids", "user_clipped_grad", "user_table"]
