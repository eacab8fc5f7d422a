"""Config for experiments/confidence_intervals.py: private confidence intervals (paper 003 Sec. 7).

Paper 003 = ``../shared/papers/003_dp_confidence_intervals_for_erm.md``. For one dataset
(``adult``, ``kddcup99`` or ``bank``; preprocessed as Sec. 7.1 by :mod:`jaxdp.data`: categorical
attributes binarised, columns scaled to max 1; then the first ``d`` features, a constant
feature, rows projected into the unit ball), each loss (``logistic``, ``huber`` = SVM), each
variant ``<perturbation>_<privacy>`` and each eigenvalue floor (``psd`` = ours, ``paper`` =
Algorithm 2), the coverage and mean length of ``replicates`` private 95% intervals computed
on bootstrap replicates of size ``n`` of the pool (Sec. 7.2: the pool's non-private minimiser
is ``theta_0``), and the variability interval (quantiles of the replicates' private
``theta~``) for the same cells.

Default (``--config.preset=quick``): Adult, logistic regression, the four variants, both
floors, ``n in {5000, 30162}``, ``d in {5, 10}``, 100 replicates, exact quantiles
(``--config.quantiles=monte_carlo`` for the paper's ``m`` draws: 2,000 here), plus a small
budget-split study (Table 2) -- a few minutes on two busy cores.
``--config.preset=full``: both losses, ``n`` from 1,000 to 30,162, ``d in {1, 5, 10}``,
1,000 replicates (the paper's ``k``), ``m = 10,000``, the full split study.
Fields left at their empty value take the preset's.
"""

import ml_collections

PRESETS = {
    "quick": dict(losses=("logistic",), ns=(5000, 30162), ds=(5, 10), replicates=100,
                  num_samples=2000, split_fractions=(0.5, 0.8, 0.9), split_d=5,
                  split_n=30162),
    "full": dict(losses=("logistic", "huber"), ns=(1000, 2000, 5000, 10000, 20000, 30162),
                 ds=(1, 5, 10), replicates=1000, num_samples=10000,
                 split_fractions=(0.3, 0.5, 0.65, 0.8, 0.9, 0.95), split_d=5, split_n=30162),
}


def get_config():
  c = ml_collections.ConfigDict()
  c.name = "confidence_intervals"
  c.dataset = "adult"
  c.data_dir = ""
  c.out_dir = "results"
  c.preset = "quick"
  c.losses = ()
  c.variants = ("objective_pure", "output_pure", "objective_zcdp", "output_zcdp")
  c.floors = ("psd", "paper")
  c.ns = ()
  c.ds = ()
  c.replicates = 0
  c.quantiles = "exact"  # "exact" (default; no Monte Carlo error) or "monte_carlo" (the paper)
  c.num_samples = 0  # Monte Carlo draws m (quantiles="monte_carlo" only)
  c.epsilon = 1.0  # total epsilon= of the pure-DP variants (paper Sec. 7: eps = 1)
  c.rho = 0.5  # total rho= of the zCDP variants (rho = eps^2 / 2)
  c.l2_reg = 0.002  # = 2c, paper c = 0.001
  c.h = 0.5
  c.alpha = 0.05
  c.split_study = True
  c.split_fractions = ()
  c.split_d = 0
  c.split_n = 0
  c.pool_size = 50000  # larger pools (KDD Cup 99: 494,021 rows) are subsampled to this
  c.chunk_size = 50
  c.seed = 0
  return c
