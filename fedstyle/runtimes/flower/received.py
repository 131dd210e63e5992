"""Reading a received Flower message: its records checked, its weights and payloads on a device, its metrics.

The ServerApp reads the sites' replies (:mod:`.serverapp`) and a site the ServerApp's messages
(:mod:`.site`) the same way; how the pieces are stored in records is :mod:`.records`'.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from flwr.app import RecordDict

from fedstyle.payload import Payload, payload_to
from fedstyle.runtimes.flower.records import (
    META,
    METRICS,
    PAYLOAD,
    WEIGHTS,
    check_records,
    payload_names,
    record_to_weights,
    records_to_payload,
)


def check_received(content: RecordDict, where: str, allowed: Iterable[str] = ()) -> None:
    """Refuse records other than the run facts, the weights, the payload and ``allowed`` (unknown ones
    are not silently dropped: :func:`.records.check_records`)."""
    check_records(content, [META, WEIGHTS, *payload_names(PAYLOAD), *allowed], where)


def received_weights(content: RecordDict, device: torch.device | str) -> dict[str, torch.Tensor]:
    """The model weights the message carries, on ``device``."""
    return {k: v.to(device) for k, v in record_to_weights(content[WEIGHTS]).items()}


def received_payload(content: RecordDict, device: torch.device | str, name: str = PAYLOAD) -> Payload | None:
    """The payload stored under ``name``, on ``device`` (None when the sender had none)."""
    payload = records_to_payload(content, name)
    return None if payload is None else payload_to(payload, device)


def received_metrics(content: RecordDict) -> dict[str, float]:
    """The sender's own metrics (none: an empty dict)."""
    return {k: float(v) for k, v in content.metric_records.get(METRICS, {}).items()}
