"""Alias of :mod:`jaxdp.dpsgd` (DP-SGD moved there); kept for one release."""

from jaxdp import _module_alias

_module_alias.install(__name__, "jaxdp.dpsgd")
