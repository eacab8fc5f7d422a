"""Config for experiments/multiparty.py: paper 001 Figure 2 (activity recognition, 6 classes).

Paper 001 Sec. 6.1: UCI HAR reduced to d = 50 by PCA, multiclass logistic
regression, M = 1000 parties of 6 samples, 1000 auxiliary samples,
lambda = 1e-4. Paper at 1/eps = 0: batch 0.90, vote 0.79, soft 0.76,
avg 0.67, indiv 0.47.

UCI HAR's feature matrices are NOT in the offline data (only labels), so the
default runs the same protocol on a STAND-IN: MNIST digits 0-5, PCA to 50
dims (fitted on the auxiliary rows only), every output labelled
``mnist_standin``. With the full HAR files (``uci-har/X_train.txt`` ...)::

  python experiments/multiparty.py --config=configs/multiparty_har.py --config.dataset=har
"""

import importlib.util
import pathlib

import ml_collections


def _kdd_config() -> ml_collections.ConfigDict:
  # Loaded by path: config files are imported by file name, from any cwd.
  path = pathlib.Path(__file__).resolve().with_name("multiparty_kdd.py")
  spec = importlib.util.spec_from_file_location("_multiparty_kdd_config", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


def get_config() -> ml_collections.ConfigDict:
  config = _kdd_config()
  config.dataset = "mnist_standin"     # "har" with the full UCI HAR files
  config.num_parties = (1000,)
  config.samples_per_party = 6
  config.num_aux = 1000
  config.pca_dims = 50
  config.num_classes_kept = 6
  config.l2_regs = (1e-4,)
  config.inv_epsilons = (0.0, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0)
  config.num_draws = 100
  config.eval_test_size = 0
  return config
