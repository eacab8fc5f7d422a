"""DP-SGD for Flax models (paper 000 Section 3.1 Equation 4; survey 004 Section 4.2 Algorithm 1).

* :func:`clipped_grad` -- sum of per-example clipped gradients (vmap), with ``.sensitivity``;
* :func:`noisy_aggregate` / :func:`private_sgd` / :func:`dp_optimizer` -- optax transforms adding
  ``N(0, (sigma S)^2)`` to the SUM and dividing by the expected batch size ``q N``;
* :class:`PoissonSampler` -- Poisson sampling with static padded chunks and honest overflow;
* :func:`train_dpsgd` -- calibrate, train, account (linen or nnx models);
* :func:`make_private` -- the same pieces wired once for a custom loop (paid sampler, checked step);
* :func:`data_parallel_clipped_grad` -- shard_map data parallelism, noise added once;
* :mod:`.device_sampling` -- Poisson sampling inside the jitted step from device-resident data
  (``make_private(...).sampler(accountant, data=(x, y))``);
* :mod:`.multihost` -- the same over the devices of several processes (``jax.distributed``);
* :class:`RunCheckpointer` -- Orbax checkpoints of a private run plus its durable ledger
  (``make_private(..., checkpoint_dir=...)``, ``train_dpsgd(..., checkpoint_dir=...)``);
* :mod:`.adaptive_clipping` -- :class:`AdaptiveClipNorm` (Andrew et al. 2021): clip to a
  privately tracked quantile of the gradient norms (``make_private(l2_clip_norm=AdaptiveClipNorm(...))``);
* :func:`linear_dpsgd` -- many independent DP-SGD runs of a softmax linear model in one call.
"""

from jaxdp.dpsgd.clipping import ClippedGradFn, ClippedGradInfo, clipped_grad, per_layer_sensitivity
from jaxdp.dpsgd.linear import LinearDPSGDResult, linear_dpsgd
from jaxdp.dpsgd.data_parallel import data_parallel_clipped_grad, make_data_mesh
from jaxdp.dpsgd.sampling import (BatchOverflowError, MaskedBatch, PaddedBatch,
                                           PoissonSampler, abort_delta, effective_sample_rate,
                                           overflow_probability, pad_and_split, padded_batch_size,
                                           poisson_sample_indices)
from jaxdp.dpsgd import adaptive_clipping, device_sampling, multihost
from jaxdp.dpsgd.adaptive_clipping import (AdaptiveClipNorm, AdaptiveClipState,
                                                    adaptive_clip_noise, adaptive_noisy_aggregate)
from jaxdp.dpsgd.checkpointing import RunCheckpointer
from jaxdp.dpsgd.private_step import (DeviceBatch, PaidSampler, PrivateBatch, PrivateSGD, PrivateState,
                                               make_private)
from jaxdp.dpsgd.train import DPSGDResult, accuracy, make_per_example_loss, train_dpsgd
from jaxdp.dpsgd.transforms import NoisyAggregateState, dp_optimizer, noise_stddev, noisy_aggregate, private_sgd

__all__ = [
    "AdaptiveClipNorm", "AdaptiveClipState", "adaptive_clip_noise", "adaptive_clipping",
    "adaptive_noisy_aggregate", "BatchOverflowError", "ClippedGradFn", "DeviceBatch", "RunCheckpointer", "ClippedGradInfo", "DPSGDResult", "LinearDPSGDResult",
    "MaskedBatch", "linear_dpsgd",
    "NoisyAggregateState", "PaddedBatch", "PoissonSampler", "abort_delta", "accuracy",
    "clipped_grad", "data_parallel_clipped_grad",
    "dp_optimizer", "effective_sample_rate", "make_data_mesh", "make_per_example_loss", "make_private",
    "PaidSampler", "PrivateBatch", "PrivateSGD", "PrivateState", "noise_stddev",
    "noisy_aggregate", "overflow_probability", "pad_and_split", "padded_batch_size", "per_layer_sensitivity",
    "poisson_sample_indices", "private_sgd", "train_dpsgd",
]
