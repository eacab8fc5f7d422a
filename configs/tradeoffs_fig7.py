"""Config for experiments/cifar_tradeoffs.py: paper 000 Fig. 7 (CIFAR-10, ResNet-20 with GroupNorm).

Paper 000 Sec. 4.3: SGD with batch size 600, initial learning rate 0.1 divided by 10
thrice at equally spaced epochs, standard augmentation (random flips and crops);
DP-SGD for 100 epochs, the T = 16 subsample-and-aggregate teachers for 500 epochs;
delta = 1e-5; Fig. 7a at B = 10, Fig. 7b at epsilon = 1. The paper gives no momentum
or clip value (the clip is cross-validated): ``dpsgd.clip_norms`` lists the candidates
(one value: no selection). Needs a GPU for the paper's settings; ``--config.dataset=random``
(CIFAR-shaped random data) with small ``epochs`` runs anywhere.
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  config.name = "tradeoffs_fig7"
  config.dataset = "cifar10"            # "cifar10" (directory or TFDS) | "random"
  config.data_dir = ""                  # "" -> $JAXDP_DATA_DIR/cifar10/cifar-10-batches-py, else TFDS
  config.tfds_data_dir = ""
  config.n_train = 0                    # 0: all 50,000 (random: 256)
  config.n_test = 0                     # 0: all 10,000 (random: 64)
  config.delta = 1e-5
  config.epsilons = (0.5, 1.0, 2.0, 5.0, 10.0)  # Fig. 7a x axis
  config.budget = 10                    # Fig. 7a inference budget
  config.budget_epsilon = 1.0           # Fig. 7b epsilon
  config.budgets = (1, 2, 5, 10, 20, 50, 100, 1000)  # Fig. 7b x axis
  config.num_seeds = 100                # noise draws of the aggregation per point
  config.validation_fraction = 0.1      # held out to choose the clip norm (when several)
  config.dpsgd = ml_collections.ConfigDict(dict(
      epochs=100.0, expected_batch_size=600.0, learning_rate=0.1, momentum=0.9,
      clip_norms=(1.0,), physical_batch_size=0, augment=True,
      checkpoint_every=0))  # steps between checkpoints of a DP-SGD model (0: once per epoch)
  config.teachers = ml_collections.ConfigDict(dict(
      num_teachers=16, epochs=500.0, batch_size=600, learning_rate=0.1, momentum=0.9,
      augment=True,
      batch_mode="auto"))  # "auto" | "map" | "vmap" over the teachers in their one jitted step
  config.seed = 0
  config.out_dir = "results"
  return config
