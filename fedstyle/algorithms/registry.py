"""The method registry: ``fedstyle methods`` and the parametrized tests read it."""

from __future__ import annotations

from typing import TypeVar

from fedstyle.registry import Registry

METHODS: Registry = Registry("method")

A = TypeVar("A")


def register_method(cls: A) -> A:
    """Class decorator: register an Algorithm subclass under its ``name``."""
    return METHODS.register(cls.name)(cls)
