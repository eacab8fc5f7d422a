"""Alias of :mod:`jaxdp.dpsgd.correlated` (moved there with DP-SGD); kept for one release."""

from jaxdp import _module_alias

_module_alias.install(__name__, "jaxdp.dpsgd.correlated")
