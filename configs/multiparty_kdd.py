"""Config for experiments/multiparty.py: paper 001 Figure 3 (KDD Cup 99, network intrusion).

Paper 001 (``../shared/papers/001_learning_privately_from_multiparty_data.md``)
Sec. 6.2: binary logistic regression, categorical attributes one-hot
(jaxdp's loader: d = 119 with the constant feature; the paper reports 123),
M in {5K, 10K, 20K} parties of 22 samples each, 43K auxiliary samples,
lambda = 1e-4, accuracy vs 1/eps for batch / soft / avg / vote / indiv,
100 private repetitions per point.

The default is QUICK (M = 5000, 20 noise draws, one split, evaluation on a
50,000-row test subsample): a few minutes on two CPU cores. The paper's grid::

  python experiments/multiparty.py --config.num_parties='(5000,10000,20000)' \
      --config.num_draws=100 --config.l2_regs='(1e-4,1e-2,1.0)'

(``l2_regs`` beyond the paper's 1e-4 show where the soft-label claim holds,
docs/paper_001.md). Needs ``$JAXDP_DATA_DIR`` (or ``--config.data_dir``).
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  config.name = "multiparty"
  config.dataset = "kddcup99"          # "kddcup99" | "har" | "mnist_standin"
  config.data_dir = ""                 # "" -> $JAXDP_DATA_DIR
  config.num_parties = (5000,)         # paper: (5000, 10000, 20000)
  config.samples_per_party = 22
  config.num_aux = 43000
  config.pca_dims = 0                  # 0: raw (one-hot) features
  config.num_classes_kept = 0          # 0: all classes
  config.l2_regs = (1e-4,)             # paper: 1e-4
  config.inv_epsilons = (0.0, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0)
  config.delta = 0.0                   # 0: the paper's pure eps (L2-Laplace); > 0: analytic Gaussian
  config.methods = ("batch", "soft", "avg", "vote", "indiv")
  config.num_draws = 20                # private repetitions per point, one vmapped call (paper: 100)
  config.num_splits = 1                # random party splits (non-private trials; paper: 10)
  config.eval_test_size = 50000        # test rows for accuracy (0: all 311,029)
  config.tol = 1e-6                    # certified gradient norm (enters 2 tol / lambda)
  config.max_iter = 500
  config.batch_mode = "auto"
  config.seed = 0
  config.out_dir = "results"
  return config
