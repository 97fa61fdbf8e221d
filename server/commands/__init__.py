"""Command handlers, one module per command family.

Importing this package imports every module in it, so each module's
``@command`` declarations land in ``server.registry.DECLARED`` (a server runs a table built from them, ``registry.client_table()``). A new family
needs only a new module here; nothing else lists them.
"""

from __future__ import annotations

import importlib
import pkgutil

from server.registry import orphans

for _module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    if not _module.startswith("_"):
        importlib.import_module(f"{__name__}.{_module}")

assert not orphans(), f"subcommands without a container: {orphans()}"
