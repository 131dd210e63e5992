"""Payloads: what algorithms exchange besides model weights.

A payload is a flat ``dict[str, Tensor | int | float | bool | str]``: plain tensors and numbers,
never pickled objects, so the same algorithm runs in-process and under Flower (array and metric
records) unchanged. Byte counts are what the payload would occupy on the wire uncompressed.
"""

from __future__ import annotations

from typing import Iterable, Mapping, Union

import torch

from fedstyle.errors import FedstyleError

Scalar = Union[int, float, bool, str]
Payload = dict[str, Union[torch.Tensor, Scalar]]

_SCALAR_BYTES = 8


def check_payload(payload: Mapping | None, where: str) -> Payload:
    """Return ``payload`` as a dict after checking it holds only tensors and plain scalars."""
    if payload is None:
        return {}
    if not isinstance(payload, Mapping):
        raise FedstyleError(f"{where} returned {type(payload).__name__}; a payload must be a dict of tensors and numbers")
    for key, value in payload.items():
        if not isinstance(key, str):
            raise FedstyleError(f"{where}: payload keys must be strings, got {key!r}")
        if not isinstance(value, (torch.Tensor, int, float, bool, str)):
            raise FedstyleError(
                f"{where}: payload entry {key!r} is a {type(value).__name__}; only tensors, int, float, bool and str travel"
            )
    return dict(payload)


def payload_nbytes(payload: Mapping | None) -> int:
    if not payload:
        return 0
    total = 0
    for value in payload.values():
        if isinstance(value, torch.Tensor):
            total += value.numel() * value.element_size()
        elif isinstance(value, str):
            total += len(value.encode())
        else:
            total += _SCALAR_BYTES
    return total


def payload_values(payload: Mapping | None) -> int:
    """How many numbers ``payload`` carries: tensor elements, plus one per scalar (a string counts as one)."""
    if not payload:
        return 0
    return sum(value.numel() if isinstance(value, torch.Tensor) else 1 for value in payload.values())


def weights_nbytes(weights: Mapping[str, torch.Tensor], keys: Iterable[str] | None = None) -> int:
    keys = weights.keys() if keys is None else keys
    return sum(weights[k].numel() * weights[k].element_size() for k in keys)


def payload_to(payload: Payload, device: torch.device | str) -> Payload:
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in payload.items()}
