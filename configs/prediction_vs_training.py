"""Config for experiments/prediction_vs_training.py: accuracy vs inference budget B.

Paper 000 (``../shared/papers/000_tradeoffs_of_private_prediction.md``) Sec. 4.2,
Fig. 2: test accuracy of private TRAINING (model sensitivity, loss
perturbation: one private model, so its accuracy does not depend on B) and
private PREDICTION (prediction sensitivity, subsample-and-aggregate: noise
calibrated to B answers) as a function of the inference budget B, at fixed
epsilon, for delta = 0 (Fig. 2a) and delta = 1e-5 (Fig. 2b).

The default (``digits``, embedded in scikit-learn, N ~ 1,400) runs in a minute or
two on two CPU cores. digits has ~40x fewer training examples than MNIST, so its
useful epsilons are larger (1 and 10 here; the paper's Fig. 2 uses eps = 1 on
MNIST). For the paper's setting use ``--config.dataset=mnist --config.epsilons=1.0
--config.num_seeds=100 --config.num_teachers=256`` (needs ``$JAXDP_DATA_DIR``).
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  config.name = "prediction_vs_training"
  config.dataset = "digits"             # "digits" | "mnist" (or any jaxdp.data.load name)
  config.data_dir = ""                  # "" -> $JAXDP_DATA_DIR
  config.n_train = 0                    # 0: all training examples
  config.pca_dims = 0                   # 0: raw features
  config.methods = ("non_private", "model_sensitivity", "loss_perturbation",
                    "prediction_sensitivity", "subsample_aggregate")
  config.epsilons = (1.0, 10.0)         # one row of panels per epsilon
  config.deltas = (0.0, 1e-5)           # one column of panels per delta
  config.budgets = (1, 3, 10, 30, 100, 300, 1000)  # inference budgets B (x axis)
  # lambda grid (paper 000 Sec. 4.1: cross-validated in [1e-5, 5e-1]); chosen on a
  # held-out part of the training set per (method, epsilon, delta) for private
  # training and per (method, epsilon, delta, B) for private prediction. As in the
  # paper, the privacy cost of this selection is not accounted for.
  config.l2_regs = (1e-5, 1e-4, 1e-3, 1e-2, 1e-1)
  # Subsample-and-aggregate: number of teachers T (paper: 256 on MNIST's 60k
  # examples; digits has ~1,400, so fewer). With several values, T is chosen on the
  # held-out split together with the teachers' lambda.
  config.num_teachers = (16, 32, 64)
  config.validation_fraction = 0.2
  config.num_seeds = 20                 # noise draws per point (paper: 100), vmapped
  config.max_iter = 500
  config.tol = 1e-6                     # non-private fit, model sensitivity, teachers
  config.objective_tol = 1e-5           # loss perturbation (float32 gradient floor)
  config.gaussian_method = "best"       # prediction sensitivity, delta > 0 (paper: "best")
  config.batch_mode = "auto"            # loss perturbation: "vmap" | "map" | "auto"
  config.seed = 0
  config.out_dir = "results"            # writes results/<name>/
  return config
