"""Private hyper-parameter tuning that is paid for (jaxdp issue 41).

Run a private training + private scoring mechanism a RANDOM number of times K
on random candidates and release only the best run (Papernot & Steinke 2022,
ICLR, arXiv 2110.03620; Liu & Talwar 2019, STOC). The whole search costs one
``RepeatAndSelectDpEvent`` -- a small multiple of one run's RDP, independent of
the number of candidates -- spent once, before any run.

* :mod:`.repetitions` -- laws of K: :class:`TruncatedNegativeBinomial`,
  :class:`GeometricRepetitions`, :class:`LogarithmicRepetitions`,
  :class:`PoissonRepetitions` (``sample``, ``pmf``, ``event``);
* :func:`repeat_and_select` -- the procedure (:class:`TuningResult`), with
  :func:`dominating_event` for candidates whose events differ;
* :mod:`.scoring` -- private validation scores :func:`private_accuracy`,
  :func:`private_loss` (the validation rows are private and paid for);
* :func:`tune_dpsgd` -- the DP-SGD path (:mod:`.dpsgd_tuning`);
* :class:`PrivateSearchCV` -- the scikit-learn search (beside ``GridSearchCV``
  / ``RandomizedSearchCV``) over any jaxdp estimator or pipeline, charged once
  (:mod:`.search_cv`); :func:`fit_events` reads the events a fit would spend.
"""

from jaxdp.tuning.repetitions import (GeometricRepetitions, LogarithmicRepetitions,
                                      PoissonRepetitions, TruncatedNegativeBinomial)
from jaxdp.tuning.repeat_and_select import TuningResult, dominating_event, repeat_and_select
from jaxdp.tuning.scoring import private_accuracy, private_loss
from jaxdp.tuning.dpsgd_tuning import DPSGDTuningResult, tune_dpsgd
from jaxdp.tuning.search_cv import PrivateSearchCV, fit_events

__all__ = [
    "DPSGDTuningResult", "GeometricRepetitions", "LogarithmicRepetitions", "PoissonRepetitions",
    "PrivateSearchCV",
    "TruncatedNegativeBinomial", "TuningResult", "dominating_event", "private_accuracy",
    "fit_events", "private_loss", "repeat_and_select", "tune_dpsgd",
]
