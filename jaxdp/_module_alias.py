"""Old import paths kept for one release: a package name that IS another package.

``install(alias, target)`` imports ``target`` and every one of its submodules and
registers each under the alias name in ``sys.modules``, so that
``import <alias>.x`` gives the very module object ``<target>.x`` (one copy of
every class and of every module-level state), never a second import of the same
file.
"""

import importlib
import pkgutil
import sys
import types
import warnings


def install(alias: str, target: str) -> types.ModuleType:
  """Makes ``alias`` (and ``alias.sub...``) the modules ``target`` (and ``target.sub...``)."""
  warnings.warn(f"{alias} moved to {target}; the old path is an alias kept for one release.",
                DeprecationWarning, stacklevel=3)
  package = importlib.import_module(target)
  sys.modules[alias] = package
  for info in pkgutil.walk_packages(package.__path__, prefix=target + "."):
    module = importlib.import_module(info.name)
    sys.modules[alias + info.name[len(target):]] = module
  return package
