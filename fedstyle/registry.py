"""A small name -> object registry shared by datasets, partitioners, protocols, models and methods.

Registries replace string-keyed if-chains: adding a component is one decorated definition, and
every listing, CLI choice and parametrized test reads the registry.
"""

from __future__ import annotations

from typing import Callable, Generic, Iterator, TypeVar

from fedstyle.errors import UnknownNameError

T = TypeVar("T")


class Registry(Generic[T]):
    """Maps names to components; unknown names get an error that lists the valid ones."""

    def __init__(self, kind: str):
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def decorator(obj: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._items[name] = obj
            return obj

        return decorator

    def add(self, name: str, obj: T) -> T:
        return self.register(name)(obj)

    def unregister(self, name: str) -> T:
        """Remove ``name`` and return its component (for a component registered for a while, e.g. by a test)."""
        self.get(name)  # an unknown name: the error that lists the valid ones
        return self._items.pop(name)

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            valid = ", ".join(sorted(self._items)) or "(none registered)"
            raise UnknownNameError(f"unknown {self.kind} {name!r}; choose one of: {valid}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._items))

    def names(self) -> list[str]:
        return sorted(self._items)

    def items(self) -> list[tuple[str, T]]:
        return sorted(self._items.items())
