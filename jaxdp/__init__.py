"""jaxdp: differentially private machine learning in JAX.

Subpackages (imported on first attribute access, so ``import jaxdp`` stays cheap):
``accounting`` (events, composition, one shared accountant and budgets),
``mechanisms`` (noise mechanisms as pure functions of a key), ``data``
(offline datasets and preprocessing), ``training`` (private linear models:
ERM, output and objective perturbation), ``dpsgd`` (DP-SGD and correlated-noise
training), ``models`` (Flax models), ``prediction`` (private prediction with
enforced budgets), ``multiparty`` (a private global classifier from M parties'
local classifiers), ``inference`` (private confidence intervals for ERM),
``audit`` (empirical privacy auditing), ``classic`` (the survey's classic models:
naive Bayes, random trees, k-means, PCA, linear regression), ``tuning`` (private
hyper-parameter tuning: the best of a random number of private runs).
"""

import importlib
import logging
import os

__version__ = "0.1.0"


class _DropMessages(logging.Filter):
  """Drops records whose formatted message starts with one of ``prefixes``."""

  def __init__(self, prefixes: tuple[str, ...]):
    super().__init__()
    self.prefixes = prefixes

  def filter(self, record: logging.LogRecord) -> bool:
    try:
      message = record.getMessage()
    except Exception:  # pylint: disable=broad-except
      return True  # a malformed record is not ours to hide
    return not message.startswith(self.prefixes)


# Log lines that are not actionable for a jaxdp user, silenced at import. Every
# other record of these loggers (and every other logger) is untouched. Set
# JAXDP_SHOW_ALL_LOGS=1 to keep them.
#
# * jax._src.xla_bridge, INFO "Unable to initialize backend 'tpu': ...": JAX probes
#   every platform it knows; on a machine without a TPU the probe fails quietly and
#   JAX falls back to CPU/GPU (it logs this at INFO because it is expected). Only the
#   'tpu' probe is silenced: a failed 'cuda' probe can mean a broken GPU install.
# * absl, WARNING "_compute_log_a_frac failed to converge ...": dp_accounting's RDP
#   accountant evaluates A_alpha at fractional orders alpha by a series; when the
#   series does not settle within 1000 terms it returns +inf for that order, i.e.
#   the order is excluded from the minimum over orders. epsilon = min over the other
#   orders is still a valid upper bound (RDP -> (eps, delta) holds order by order),
#   so nothing is wrong and nothing can be done about it by the user.
_SILENCED = {
    "jax._src.xla_bridge": ("Unable to initialize backend 'tpu'",),
    "absl": ("_compute_log_a_frac failed to converge",),
}


def _install_log_filters() -> None:
  if os.environ.get("JAXDP_SHOW_ALL_LOGS", "").strip() not in ("", "0"):
    return
  for name, prefixes in _SILENCED.items():
    logger = logging.getLogger(name)
    if not any(isinstance(f, _DropMessages) for f in logger.filters):
      logger.addFilter(_DropMessages(prefixes))


_install_log_filters()


def enable_compilation_cache(cache_dir: str | os.PathLike | None = None, *,
                             min_compile_time_secs: float = 0.0) -> str:
  """Turns on JAX's persistent compilation cache (opt-in; for scripts, experiments, benchmarks).

  Every new process otherwise recompiles every jitted solver (seconds per shape
  on a CPU). With the cache on, a program compiled once (by any process) is
  loaded from disk. ``min_compile_time_secs=0`` caches small programs too.

  Args:
    cache_dir: directory of the cache; default ``$JAXDP_COMPILATION_CACHE`` or
      ``~/.cache/jaxdp/jax_compilation_cache``.
    min_compile_time_secs: only programs that took at least this long to compile are cached.

  Returns:
    The cache directory used.
  """
  import jax  # pylint: disable=import-outside-toplevel
  if float(min_compile_time_secs) < 0:
    raise ValueError(f"min_compile_time_secs must be >= 0, got {min_compile_time_secs}.")
  if cache_dir is None:
    cache_dir = os.environ.get("JAXDP_COMPILATION_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "jaxdp", "jax_compilation_cache")
  cache_dir = os.fspath(cache_dir)
  os.makedirs(cache_dir, exist_ok=True)
  jax.config.update("jax_compilation_cache_dir", cache_dir)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", float(min_compile_time_secs))
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  return cache_dir


_SUBPACKAGES = ("accounting", "audit", "classic", "data", "dpsgd", "inference", "mechanisms",
                "models", "multiparty", "prediction", "training", "tuning")


def __getattr__(name):
  if name in _SUBPACKAGES:
    return importlib.import_module(f"jaxdp.{name}")
  raise AttributeError(f"module 'jaxdp' has no attribute {name!r}")


def __dir__():
  return sorted(list(globals()) + list(_SUBPACKAGES))


__all__ = list(_SUBPACKAGES)
