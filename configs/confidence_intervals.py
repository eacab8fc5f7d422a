"""Config for experiments/confidence_intervals.py: private confidence intervals (paper 003 Sec. 7).

Paper 003 = ``../shared/papers/003_dp_confidence_intervals_for_erm.md``. One data set per run
(``adult``, ``kddcup99`` or ``bank``; preprocessed as Sec. 7.1 by :mod:`jaxdp.data`: categorical
attributes binarised, columns scaled to max 1; then the first ``d`` features, a constant
feature, rows projected into the unit ball). Every cell is a (loss, variant
``<perturbation>_<privacy>``, eigenvalue floor, ``n``, ``d``, total ``epsilon`` -- zCDP at
``rho = epsilon^2 / 2``, the paper's comparison --, budget fractions) with ``replicates``
bootstrap replicates of size ``n`` drawn with replacement from the pool; ``c = 0.001``
(``l2_reg = 0.002``), ``alpha = 0.05`` and the Table 2 fractions unless a study varies them.

Studies (``--config.studies='("grid", "split")'``; empty: the preset's for the data set):

* ``grid`` (Figs. 9-10, 14 by n, 17-18): ``ns x ds``, eps = 1, ``floors``, ``losses``.
* ``split`` (Figs. 1-4): ``phi_1/phi`` over ``split_fractions`` (restricted to the paper's
  range: 0.3-0.9 pure, 0.1-0.98 zCDP), ``phi_2 = phi_3``, ``d = split_d``, ``n = split_n``.
* ``split23`` (Figs. 5-8): ``phi_1`` at Table 2, ``phi_2 / (phi - phi_1)`` over
  ``split23_shares``, ``d`` over ``split23_ds``, ``split23_replicates`` replicates (paper
  k = 100,000).
* ``epsilon_grid`` (Figs. 11-12; KDD Cup 99): ``epsilon_grid_ns x epsilons``, ``d = 10``.
* ``vi_n`` / ``vi_d`` / ``vi_epsilon`` (Figs. 14-16): CI and variability-interval length over
  n (``ns``, d = 10), d (``vi_ds``, n = ``vi_fixed_n``), epsilon (``epsilons``,
  n = ``vi_fixed_n``, d = 10), ``vi_replicates`` replicates (the paper's m = 10,000).
* ``epsilon_fit`` (Fig. 19): ``fit_epsilons`` at ``n = fit_n``, ``d = fit_d``.
* ``sample_complexity`` (Fig. 13): the non-private mean length at each
  ``nonprivate_ns`` and, per private variant, the smallest multiple of
  ``sample_complexity_step`` (at most ``sample_complexity_max_n``) with a private mean length no
  longer.

``--config.preset=quick`` (default): every study with a few cells and 100-200 replicates;
``--config.preset=full``: the paper's values. Fields left at their empty value take the
preset's. ``floor=""``: the library's default eigenvalue floor (every study but ``grid``,
which runs ``floors``).
"""

import ml_collections

# The studies a run does by default: the paper's figures for that data set.
DATASET_STUDIES = {
    "adult": ("grid", "split", "split23", "vi_n", "vi_d", "epsilon_fit", "sample_complexity"),
    "kddcup99": ("epsilon_grid", "vi_epsilon", "sample_complexity"),
    "bank": ("sample_complexity",),
}

PRESETS = {
    "quick": dict(
        studies={"adult": ("grid", "split"), "kddcup99": ("epsilon_grid",),
                 "bank": ("sample_complexity",)},
        losses=("logistic",), ns=(5000, 30162), ds=(5, 10), replicates=100, num_samples=2000,
        split_fractions=(0.5, 0.8, 0.9), split_d=5, split_n=30162,
        split23_shares=(0.25, 0.5, 0.75), split23_ds=(1, 10), split23_n=30162,
        split23_replicates=200,
        epsilons=(0.5, 1.0, 2.0), epsilon_grid_ns=(2000, 10000), epsilon_grid_d=10,
        vi_replicates=200, vi_ds=(1, 5, 10), vi_fixed_n=15000, vi_d=10,
        fit_epsilons=(0.5, 1.0, 2.0), fit_n=10000, fit_d=5,
        nonprivate_ns=(1000, 5000), sample_complexity_step=2500,
        sample_complexity_max_n=50000, sample_complexity_d=10),
    "full": dict(
        studies=DATASET_STUDIES,
        losses=("logistic", "huber"), ns=(1000, 2000, 5000, 10000, 20000, 30162), ds=(1, 5, 10),
        replicates=1000, num_samples=10000,
        split_fractions=(0.1, 0.3, 0.5, 0.65, 0.8, 0.9, 0.95, 0.98), split_d=5, split_n=30162,
        split23_shares=(0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875), split23_ds=(1, 10),
        split23_n=30162, split23_replicates=100_000,
        epsilons=(0.1, 0.25, 0.5, 1.0, 2.0, 4.0),
        epsilon_grid_ns=(1000, 2000, 5000, 10000, 20000, 50000), epsilon_grid_d=10,
        vi_replicates=10_000, vi_ds=tuple(range(1, 11)), vi_fixed_n=15000, vi_d=10,
        fit_epsilons=(0.25, 0.5, 1.0, 2.0, 4.0, 8.0), fit_n=10000, fit_d=5,
        nonprivate_ns=tuple(range(1000, 10001, 1000)), sample_complexity_step=2500,
        sample_complexity_max_n=500_000, sample_complexity_d=10),
}


def get_config():
  c = ml_collections.ConfigDict()
  c.name = "confidence_intervals"
  c.dataset = "adult"
  c.data_dir = ""
  c.out_dir = "results"
  c.preset = "quick"
  c.studies = ()  # empty: the preset's studies for the data set
  c.losses = ()  # grid and split; the other studies are logistic regression (the paper's)
  c.variants = ("objective_pure", "output_pure", "objective_zcdp", "output_zcdp")
  c.floors = ("psd", "paper")  # grid study
  c.floor = ""  # every other study; "": the library's default
  c.ns = ()  # grid and vi_n
  c.ds = ()  # grid
  c.replicates = 0  # k of every study but split23 and the vi_* studies
  c.replicate_chunk = 1000  # replicates per batched call (at most 2^25 row indices per call)
  c.quantiles = "exact"  # "exact" (default; no Monte Carlo error) or "monte_carlo" (the paper)
  c.num_samples = 0  # Monte Carlo draws m (quantiles="monte_carlo" only)
  c.epsilon = 1.0  # total epsilon of every study without an epsilon axis (rho = epsilon^2 / 2)
  c.l2_reg = 0.002  # = 2c, paper c = 0.001
  c.h = 0.5
  c.alpha = 0.05
  c.split_fractions = ()
  c.split_d = 0
  c.split_n = 0
  c.split23_shares = ()  # phi_2 / (phi - phi_1)
  c.split23_ds = ()
  c.split23_n = 0
  c.split23_replicates = 0
  c.epsilons = ()  # epsilon_grid and vi_epsilon
  c.epsilon_grid_ns = ()
  c.epsilon_grid_d = 0
  c.vi_replicates = 0  # the variability interval's m (vi_n, vi_d, vi_epsilon)
  c.vi_ds = ()  # vi_d
  c.vi_fixed_n = 0  # vi_d and vi_epsilon
  c.vi_d = 0  # vi_n and vi_epsilon
  c.fit_epsilons = ()  # epsilon_fit
  c.fit_n = 0
  c.fit_d = 0  # epsilon_fit (the grid's n fits, Figs. 17-18, use its d = 5 rows)
  c.nonprivate_ns = ()  # sample_complexity: n' of the non-private intervals
  c.sample_complexity_step = 0
  c.sample_complexity_max_n = 0
  c.sample_complexity_d = 0
  c.pool_size = 50000  # larger pools (KDD Cup 99: 494,021 rows) are subsampled to this
  c.chunk_size = 50  # replicates per compiled chunk inside the library call
  c.seed = 0
  return c
