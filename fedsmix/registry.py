"""The one list of each kind of extension: protocols (strategies), central trainers, attacks, defences.

Each registry is filled by its home package, one line per entry (`STRATEGIES.add("fedprox", ...)` in
strategies/__init__.py); the settings schema accepts exactly the names registered, so a new entry needs no second
list. A registry loads its home package the first time its names are asked for (the schema lives below the homes
and never imports them). Your own extensions live in any module you name under the `plugins` setting: it is
imported on the server and on every party before the names are checked (docs/extend.md).
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class UnknownName(ValueError):
    """A name no registry entry has; the message names the kind, the nearest names and every allowed one (the
    settings schema puts the key in front)."""


class Registry(Generic[T]):
    """Name -> entry, in registration order. `home`: the module whose import registers the built-in entries."""

    def __init__(self, kind: str, key: str, home: str) -> None:
        self.kind, self.key, self.home = kind, key, home
        self._entries: dict[str, T] = {}
        self._loaded = False

    def add(self, name: str, entry: T) -> T:
        """Register `entry` under `name` (a name is registered once: a second entry would silently win)."""
        if name in self._entries and self._entries[name] is not entry:
            raise ValueError(f"{self.kind} {name!r} is registered already ({self._entries[name]!r})")
        self._entries[name] = entry
        return entry

    def remove(self, name: str) -> None:
        """Unregister `name` (a test's toy, a plugin reloaded)."""
        self._entries.pop(name, None)

    def _load(self) -> None:
        if not self._loaded:
            self._loaded = True
            importlib.import_module(self.home)

    def names(self) -> tuple[str, ...]:
        self._load()
        return tuple(self._entries)

    def __contains__(self, name: object) -> bool:
        self._load()
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())

    def __getitem__(self, name: str) -> T:
        self._load()
        try:
            return self._entries[name]
        except KeyError:
            raise self.unknown(name) from None

    def items(self) -> list[tuple[str, T]]:
        self._load()
        return list(self._entries.items())

    def unknown(self, name: str) -> UnknownName:
        near = difflib.get_close_matches(name, self.names(), n=3, cutoff=0.6)
        hint = f" (did you mean {' or '.join(map(repr, near))}?)" if near else ""
        allowed = ", ".join(self.names()) or "none registered"
        return UnknownName(f"unknown {self.kind} {name!r}{hint}; allowed: {allowed}")

    def check(self, name: str) -> str:
        """`name` if registered, else UnknownName."""
        if name not in self:
            raise self.unknown(name)
        return name

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {len(self._entries)} entries{'' if self._loaded else ', home not loaded'})"


STRATEGIES: Registry = Registry("strategy", "strategies", home="strategies")
TRAINERS: Registry = Registry("trainer", "trainer", home="fedsmix.trainers")
ATTACKS: Registry = Registry("attack", "adversary", home="server.adversary.registry")
DEFENCES: Registry = Registry("defence", "defences", home="fedsmix.defences")


def load_plugins(modules: tuple[str, ...] | list[str]) -> None:
    """Import each plugin module (its import registers its entries); a module that cannot be imported is named."""
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as error:
            raise ValueError(f"plugins: cannot import {module!r} ({error})") from error
