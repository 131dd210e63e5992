"""A small name -> object registry shared by datasets, partitioners, protocols, models and methods.

Registries replace string-keyed if-chains: adding a component is one decorated definition, and
every listing, CLI choice and parametrized test reads the registry.
"""

from __future__ import annotations

from typing import Callable, Generic, Iterable, Iterator, TypeVar

from fedstyle.errors import UnknownNameError

T = TypeVar("T")


def close_names(word: str, names: Iterable[str], n: int = 3, cutoff: float = 0.6) -> list[str]:
    """The names nearest to ``word`` (difflib's ratio, case ignored), best first: a name equal but for case
    comes first, then up to ``n`` close ones (ratio >= ``cutoff``)."""
    import difflib  # only when a name is wrong

    lowered: dict[str, str] = {}
    for name in names:
        lowered.setdefault(name.lower(), name)  # the first spelling of a name wins (a method before its label)
    exact = [lowered[word.lower()]] if word.lower() in lowered else []
    near = difflib.get_close_matches(word.lower(), list(lowered), n=n, cutoff=cutoff)
    return list(dict.fromkeys([*exact, *(lowered[name] for name in near)]))[:n]


def did_you_mean(word: str, names: Iterable[str]) -> str:
    """``"did you mean 'ccst'? "`` for the names close to ``word`` (empty when none is): the start of an
    error's advice."""
    close = close_names(word, names)
    if not close:
        return ""
    return "did you mean " + " or ".join(repr(name) for name in close) + "? "


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
            hint = did_you_mean(str(name), self._items)
            raise UnknownNameError(f"unknown {self.kind} {name!r}; {hint}choose one of: {valid}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._items))

    def names(self) -> list[str]:
        return sorted(self._items)

    def items(self) -> list[tuple[str, T]]:
        return sorted(self._items.items())
