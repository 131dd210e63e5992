"""Payloads and model weights as Flower records, without pickle.

A message's :class:`flwr.app.RecordDict` holds named records; fedstyle uses these names::

    "fedstyle"            ConfigRecord  run facts: config JSON, client id, round, number of clients, the
                                        coordinator's session (id, start round, durable round; see site_state)
    "weights"             ArrayRecord   model weights (global down, client's update up)
    "payload"             ArrayRecord   the tensor entries of a payload ...
    "payload.scalars"     ConfigRecord  ... and its int / float / bool / str entries, plus the key order
    "setup", "setup.scalars"            the setup broadcast (same split) for a site that joined late
    "result"              MetricRecord  num_samples, train_loss
    "metrics"             MetricRecord  the client's own metrics (floats)

Tensors travel as NumPy ``.npy`` bytes (``allow_pickle=False``; bitwise round trip for every dtype
NumPy has — bfloat16 is refused with a clear error), scalars as typed config values (an int stays
an int, a bool a bool). A payload that was ``None`` (no setup / query phase) is marked by
``present = False`` so "nothing" and "an empty dict" stay apart. Unknown record names in a reply
raise an error instead of being ignored: Flower's stock strategies accept a single array record
per reply, fedstyle's replies carry several (weights and payload) and handles each by name.
"""

from __future__ import annotations

from typing import Iterable, Mapping

import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from fedstyle.errors import FedstyleError
from fedstyle.io import aligned
from fedstyle.payload import Payload, check_payload

META, WEIGHTS, RESULT, METRICS = "fedstyle", "weights", "result", "metrics"
PAYLOAD, SETUP = "payload", "setup"
_SCALARS = ".scalars"
_ORDER, _PRESENT = "__order__", "__present__"


class RecordError(FedstyleError):
    """A Flower message does not hold what fedstyle's protocol expects."""


def tensor_to_array(name: str, tensor: torch.Tensor) -> Array:
    if tensor.dtype == torch.bfloat16:
        raise RecordError(f"payload entry {name!r} is bfloat16, which has no NumPy dtype; send it as float32")
    return Array.from_numpy_ndarray(tensor.detach().cpu().contiguous().numpy())


def array_to_tensor(array: Array) -> torch.Tensor:
    # np.load returns a fresh, writable array: torch.from_numpy shares it without a copy, unless its memory
    # is less aligned than torch's own (BLAS reductions round differently then; see fedstyle.io.aligned)
    return aligned(torch.from_numpy(array.numpy()))


def weights_to_record(weights: Mapping[str, torch.Tensor]) -> ArrayRecord:
    """A state dict as an ArrayRecord (key order kept)."""
    record = ArrayRecord()
    for key, value in weights.items():
        record[key] = tensor_to_array(key, value)
    return record


def record_to_weights(record: ArrayRecord) -> dict[str, torch.Tensor]:
    return {key: array_to_tensor(array) for key, array in record.items()}


def payload_to_records(payload: Payload | None, name: str = PAYLOAD) -> dict[str, ArrayRecord | ConfigRecord]:
    """``{name: ArrayRecord of the tensors, name + ".scalars": ConfigRecord of the rest}``."""
    tensors = ArrayRecord()
    scalars = ConfigRecord()
    scalars[_PRESENT] = payload is not None
    payload = check_payload(payload, f"payload {name!r}")
    scalars[_ORDER] = list(payload.keys())
    for key, value in payload.items():
        if key in (_ORDER, _PRESENT):
            raise RecordError(f"payload key {key!r} is reserved by fedstyle's Flower bridge; rename it")
        if isinstance(value, torch.Tensor):
            tensors[key] = tensor_to_array(key, value)
        else:
            scalars[key] = value
    return {name: tensors, name + _SCALARS: scalars}


def records_to_payload(content: RecordDict, name: str = PAYLOAD) -> Payload | None:
    """The payload stored under ``name`` (None when the sender had none); key order as sent."""
    if name + _SCALARS not in content.config_records:
        raise RecordError(f"message has no {name!r} payload records")
    scalars = content.config_records[name + _SCALARS]
    if not scalars[_PRESENT]:
        return None
    tensors = content.array_records.get(name, ArrayRecord())
    out: Payload = {}
    for key in scalars[_ORDER]:
        out[key] = array_to_tensor(tensors[key]) if key in tensors else scalars[key]
    return out


def meta_record(**values: int | float | str | bool) -> ConfigRecord:
    return ConfigRecord(dict(values))


def check_records(content: RecordDict, allowed: Iterable[str], where: str) -> None:
    """Refuse records fedstyle does not know instead of silently dropping them."""
    unknown = sorted(set(content.keys()) - set(allowed))
    if unknown:
        raise RecordError(f"{where}: unexpected records {unknown}; fedstyle's Flower protocol carries "
                          f"only {sorted(allowed)}")


def build_content(
    meta: ConfigRecord,
    *,
    weights: Mapping[str, torch.Tensor] | ArrayRecord | None = None,
    payloads: Mapping[str, Payload | None] | None = None,
    result: Mapping[str, int | float] | None = None,
    metrics: Mapping[str, float] | None = None,
) -> RecordDict:
    """One message's RecordDict from fedstyle's pieces (every piece under its own record)."""
    content = RecordDict({META: meta})
    if weights is not None:  # an ArrayRecord already built (the round's weights, serialised once) travels as is
        content[WEIGHTS] = weights if isinstance(weights, ArrayRecord) else weights_to_record(weights)
    for name, payload in (payloads or {}).items():
        for key, record in payload_to_records(payload, name).items():
            content[key] = record
    if result is not None:
        content[RESULT] = MetricRecord(dict(result))
    if metrics is not None:
        content[METRICS] = MetricRecord({k: float(v) for k, v in metrics.items()})
    return content


def payload_names(*names: str) -> list[str]:
    """Record names a message with these payloads may hold."""
    return [n for name in names for n in (name, name + _SCALARS)]
