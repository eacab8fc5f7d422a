"""Config for experiments/one_run_audit.py: one-run audits of DP-SGD plans on digits.

Steinke, Nasr & Jagielski 2023 (one-run auditing) and Mahloujifar, Melis &
Chaudhuri 2024 (its f-DP analysis), :mod:`jaxdp.audit.one_run`: one DP-SGD run
per point with ``num_canaries`` white-box Dirac canaries, each included with
probability 1/2, at each claimed epsilon, for a correct plan and two broken
ones (noise 10x too small; canaries that skip Poisson sampling). A correct plan
must give a bound below its claim; a broken one should give a bound above it
where the canaries can carry that much evidence: with m = 1000 canaries and
the default (k+, k-) grid, perfect guesses cap the bound at 4.29 (Steinke) and
7.00 (f-DP, delta = 1e-5), so a claim of 8 cannot be refuted at this m.

The default (digits, N = 1,438 real rows + 1,000 canary slots, softmax linear
model) runs in a few minutes on two busy CPU cores.
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  config.name = "one_run_audit"
  config.dataset = "digits"
  config.data_dir = ""                 # "" -> $JAXDP_DATA_DIR (digits is embedded)
  config.epsilons = (1.0, 2.0, 4.0, 8.0)
  config.plans = ("correct", "noise_div10", "skip_sampling")
  config.delta = 1e-5
  config.num_canaries = 1000
  config.expected_batch_size = 600.0   # q = 600 / 2438 ~ 0.25
  config.epochs = 10.0
  config.l2_clip_norm = 1.0
  config.learning_rate = 0.5           # optax.sgd
  config.confidence = 0.95
  config.seed = 0
  config.out_dir = "results"
  config.csv_copy = "docs/data/one_run_audit.csv"   # "" to skip the docs copy
  return config
