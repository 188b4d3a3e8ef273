"""Cost formulas, one module per operator family. Importing this package imports every module in
it, which fills the registry (:mod:`flopcount.registry`)."""

import importlib
import pkgutil

for _module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    importlib.import_module(f"{__name__}.{_module}")
