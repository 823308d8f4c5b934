"""A registry of named plug-ins that live one file each in a package (the forecasters, the profile statistics).

The package's own modules are imported on first use (each calls `register` at import), so that a caller needs no list
of them; a plug-in's missing optional attributes are filled in from the defaults the package gives; tests register
toy plug-ins for a while and `unregister` them.
"""
from __future__ import annotations

import importlib
import pkgutil
from typing import Any, Callable, Iterator


class Registry:
    def __init__(self, package: str, path, defaults: Callable[[Any], dict]):
        self.package, self.path, self.defaults = package, path, defaults
        self.items: dict[str, Any] = {}
        self.loaded = False

    def load(self) -> None:
        """Import the package's own modules once (they register themselves)."""
        if not self.loaded:
            self.loaded = True
            for m in pkgutil.iter_modules(self.path):
                importlib.import_module(f"{self.package}.{m.name}")

    def add(self, item: Any) -> Any:
        """Registers item under item.name, its missing optional attributes filled in from the defaults."""
        for attr, value in self.defaults(item).items():
            if not hasattr(item, attr):
                setattr(item, attr, value)
        self.items[item.name] = item
        return item

    def remove(self, name: str) -> None:
        self.items.pop(name, None)

    def __contains__(self, name: str) -> bool:
        self.load()
        return name in self.items

    def __getitem__(self, name: str) -> Any:
        self.load()
        return self.items[name]

    def __iter__(self) -> Iterator[str]:
        self.load()
        return iter(list(self.items))

    def values(self) -> list:
        self.load()
        return list(self.items.values())
