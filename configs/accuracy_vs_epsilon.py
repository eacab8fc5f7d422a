"""Config for experiments/accuracy_vs_epsilon.py: private linear models, accuracy vs epsilon.

Paper 000 (``../shared/papers/000_tradeoffs_of_private_prediction.md``) Sec. 4.2,
Fig. 1: test accuracy of the private-training methods (model sensitivity, loss
perturbation) and the non-private baseline as a function of epsilon, for
delta = 0 (Fig. 1a) and delta = 1e-5 (Fig. 1b), 100 repetitions per point.

The default (``digits``, embedded in scikit-learn, N ~ 1,400) runs in well under
a minute on two CPU cores. ``--config.dataset=mnist`` (needs ``$JAXDP_DATA_DIR``)
is the paper's setting (full 60,000 x 784 MNIST) with the MNIST epsilon grid
below; add ``--config.num_seeds=100`` for the paper's number of draws.
Results of different datasets go to different folders
(``results/accuracy_vs_epsilon/<dataset>/``) and runs resume from the points
already written there.
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  config.name = "accuracy_vs_epsilon"
  config.dataset = "digits"             # "digits" | "mnist" (or any jaxdp.data.load name)
  config.data_dir = ""                  # "" -> $JAXDP_DATA_DIR
  config.n_train = 0                    # 0: all training examples
  config.pca_dims = 0                   # 0: raw features
  config.methods = ("non_private", "model_sensitivity", "loss_perturbation")
  # () -> default_epsilons[dataset] (else default_epsilons["default"]). digits has only
  # ~1,400 training examples, so its useful epsilons are larger than MNIST's (60,000).
  config.epsilons = ()
  config.default_epsilons = ml_collections.ConfigDict(dict(
      default=(0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0),
      mnist=(0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0),
  ))
  config.deltas = (0.0, 1e-5)
  # lambda grid (paper 000 Sec. 4.1: cross-validated in [1e-5, 5e-1]); chosen per
  # (method, epsilon, delta) on a held-out part of the training set. As in the
  # paper, the privacy cost of this selection is not accounted for.
  config.l2_regs = (1e-5, 1e-4, 1e-3, 1e-2, 1e-1)
  config.validation_fraction = 0.2
  config.num_seeds = 20                 # noise draws per point (paper: 100), one batched call each
  config.val_seeds = 0                  # noise draws per lambda on the held-out split (0: num_seeds)
  config.max_iter = 500
  config.tol = 1e-6                     # non-private and output perturbation (enters 2 tol/lambda)
  config.objective_tol = 0.0            # loss perturbation: 0 = AMP default tol (certified in float64)
  config.batch_mode = "auto"            # "vmap" | "map" | "auto" (map on CPU, vmap on GPU)
  config.seed = 0
  config.out_dir = "results"            # writes results/<name>/<dataset>/ (relative to the cwd)
  return config
