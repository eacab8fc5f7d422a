"""Config for experiments/dpsgd_mnist.py: DP-SGD on MNIST at (eps, delta = 1e-5).

Paper 000 (``000_tradeoffs_of_private_prediction.md``) Section 4.2 / Fig. 1b:
DP-SGD at delta = 1e-5 for a range of epsilons. Override any field with
``--config.field=value``, e.g. ``--config.model=cnn --config.epsilons='(0.5,1.0,2.0)'``.

Measured on the 2-core CPU machine (seed 0, full 60k, delta = 1e-5, eps = 1):
* defaults (linear, batch 1000, 3 epochs, lr 1.0, momentum 0.9): 91.1% test accuracy (~20 s);
* ``--config.model=cnn --config.epochs=4 --config.expected_batch_size=512
  --config.learning_rate=2.0 --config.momentum=0.0``: 95.75% (sigma 1.17, 469 steps, ~190 s).
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  config.model = "linear"          # "linear" | "mlp" | "cnn"
  config.mlp_hidden = (256,)
  config.epsilons = (0.5, 1.0, 2.0, 4.0)
  config.delta = 1e-5
  config.epochs = 3.0
  config.expected_batch_size = 1000  # q = expected_batch_size / N (Poisson sampling)
  config.l2_clip_norm = 1.0
  config.learning_rate = 1.0
  config.momentum = 0.9
  config.clipping_method = "reweight"  # "vmap" | "reweight" (same result, see clipped_grad)
  config.physical_batch_size = 0       # 0: binomial-tail bound; >0: gradient accumulation chunks
  config.accountant = "rdp"            # "rdp" | "pld"
  config.n_train = 0                   # 0: all 60,000 training images
  config.eval_every_epoch = True
  config.seed = 0
  config.data_dir = ""                 # "" -> $JAXDP_DATA_DIR
  config.out_dir = "results/dpsgd_mnist"
  return config
