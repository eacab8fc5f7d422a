"""Config for experiments/survey_models.py: the survey's classic models vs epsilon.

Paper 004 (``../shared/papers/004_dp_machine_learning_survey.md``) Sec. 3.1-3.5.
For each model (naive Bayes, random decision trees, k-means on Adult / Bank
Marketing; PCA on MNIST) and each epsilon: jaxdp (``jaxdp.classic``),
diffprivlib (optional extra ``pip install -e .[compare]``; skipped with a note
if missing) at the same epsilon and the same declared bounds, and non-private
scikit-learn. ``--config.dataset=adult|bank|mnist`` (needs ``$JAXDP_DATA_DIR``).

Declared bounds are PUBLIC choices written here (domain ranges of the UCI
documentation, heavy tails clipped), never read off the data; data are clipped
to them (``clip=True``) for every library alike.
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  config.name = "survey_models"
  config.dataset = "adult"              # "adult" | "bank" (NB, trees, k-means) | "mnist" (PCA)
  config.data_dir = ""                  # "" -> $JAXDP_DATA_DIR
  config.n_train = 0                    # 0: all training examples
  config.models = ()                    # () -> naive_bayes, random_trees, kmeans (tabular) / pca (mnist)
  config.libraries = ("jaxdp", "diffprivlib", "sklearn")
  config.epsilons = (0.1, 0.3, 1.0, 3.0, 10.0)
  config.num_seeds = 3
  # Random trees.
  config.num_trees = 10
  config.tree_depth = 6
  config.tree_budget = "disjoint"       # "disjoint" (parallel composition) | "split" (eps/N per tree)
  # k-means on features min-max scaled by the declared bounds (a public map).
  config.n_clusters = 5
  config.kmeans_iterations = 3
  config.kmeans_method = "lloyd"        # "lloyd" | "sample_aggregate"
  # diffprivlib's KMeans is add/remove DP (count sensitivity 1, sum sensitivity u - l per
  # coordinate): jaxdp is run under the same relation for the comparison.
  config.kmeans_neighbouring = "add_remove"
  # diffprivlib 0.6.6's KMeans spends (1 + d c)/(d + c) times its nominal epsilon (c = cbrt(4 d
  # 0.225^2); its two budget shares are unpacked swapped). True: call it with epsilon divided by
  # that factor, so both libraries SPEND the epsilon of the row; False: the same nominal epsilon.
  config.kmeans_equal_spend = True
  config.kmeans_num_seeds = 10          # k-means costs vary more across fits than accuracies
  # PCA (MNIST rows scaled by 1/28 so ||x||_2 <= 1; uncentred second moment).
  config.pca_components = 10
  config.pca_delta = 1e-5               # Analyze-Gauss delta (the Laplace variant is pure DP)
  # Declared clip ranges of the continuous columns (binary columns: [0, 1]).
  config.bounds = ml_collections.ConfigDict(dict(
      adult={"age": (17.0, 90.0), "fnlwgt": (0.0, 1.5e6), "education-num": (1.0, 16.0),
             "capital-gain": (0.0, 20000.0), "capital-loss": (0.0, 3000.0),
             "hours-per-week": (1.0, 99.0)},
      bank={"age": (18.0, 100.0), "balance": (-3000.0, 20000.0), "day": (1.0, 31.0),
            "duration": (0.0, 3000.0), "campaign": (1.0, 20.0), "pdays": (-1.0, 900.0),
            "previous": (0.0, 30.0)},
  ))
  config.seed = 0
  config.out_dir = "results"            # writes results/<name>/<dataset>/ (relative to the cwd)
  return config
