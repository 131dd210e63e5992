"""Payloads and weights <-> Flower records: bitwise tensors, typed scalars, several array records per message."""

from __future__ import annotations

import pytest
import torch

flwr = pytest.importorskip("flwr", reason="the Flower bridge needs fedstyle[flower] (flwr not installed)")

from flwr.app import RecordDict  # noqa: E402

from fedstyle.runtimes.flower.records import (  # noqa: E402
    META,
    PAYLOAD,
    RESULT,
    SETUP,
    WEIGHTS,
    RecordError,
    build_content,
    check_records,
    meta_record,
    payload_names,
    payload_to_records,
    record_to_weights,
    records_to_payload,
    weights_to_record,
)


def _serialize_round_trip(content: RecordDict) -> RecordDict:
    """What the wire does: deflate to bytes and inflate again (Flower's own object protocol)."""
    from flwr.supercore.inflatable.inflatable_utils import inflate_object_from_contents
    from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects

    objects = get_all_nested_objects(content)
    contents = {oid: obj.deflate() for oid, obj in objects.items()}
    return inflate_object_from_contents(content.object_id, contents)


def test_payload_round_trip_is_bitwise_and_typed():
    g = torch.Generator().manual_seed(0)
    payload = {
        "mu": torch.randn(3, 5, generator=g),
        "count": 7,
        "scale": 0.1 + 0.2,  # not exactly representable: must come back bit for bit
        "flag": True,
        "name": "overall",
        "half": torch.randn(4, generator=g).half(),
        "ids": torch.tensor([3, 1, 2], dtype=torch.int64),
        "mask": torch.tensor([True, False]),
        "empty": torch.zeros(0, 3),
        "scalar_tensor": torch.tensor(2.5, dtype=torch.float64),
    }
    content = _serialize_round_trip(build_content(meta_record(round=1), payloads={PAYLOAD: payload}))
    back = records_to_payload(content, PAYLOAD)
    assert list(back) == list(payload)  # key order kept across tensors and scalars
    for key, value in payload.items():
        if isinstance(value, torch.Tensor):
            assert back[key].dtype == value.dtype and back[key].shape == value.shape
            assert torch.equal(back[key].view(-1).view(torch.uint8) if value.numel() else back[key],
                               value.view(-1).view(torch.uint8) if value.numel() else value)
        else:
            assert type(back[key]) is type(value) and back[key] == value


def test_none_and_empty_payloads_stay_apart():
    content = build_content(meta_record(round=0), payloads={PAYLOAD: None, SETUP: {}})
    assert records_to_payload(content, PAYLOAD) is None
    assert records_to_payload(content, SETUP) == {}


def test_weights_and_payload_travel_as_separate_array_records():
    """A reply with model weights AND a tensor payload: two array records, both recovered by name."""
    weights = {"conv.weight": torch.randn(4, 3, 3, 3).to(memory_format=torch.channels_last),
               "bn.num_batches_tracked": torch.tensor(5)}
    payload = {"style_mean": torch.randn(2, 8), "n": 3}
    content = _serialize_round_trip(build_content(meta_record(round=2), weights=weights,
                                                  payloads={PAYLOAD: payload}, result={"num_samples": 10, "train_loss": 0.5}))
    assert set(content.array_records) == {WEIGHTS, PAYLOAD}
    w = record_to_weights(content[WEIGHTS])
    assert list(w) == list(weights)
    for key in weights:
        assert torch.equal(w[key], weights[key]) and w[key].dtype == weights[key].dtype
    p = records_to_payload(content, PAYLOAD)
    assert torch.equal(p["style_mean"], payload["style_mean"]) and p["n"] == 3
    assert content.metric_records[RESULT]["num_samples"] == 10
    check_records(content, [META, WEIGHTS, RESULT, *payload_names(PAYLOAD)], "reply")


def test_unknown_records_are_refused_not_dropped():
    content = build_content(meta_record(round=0), weights={"w": torch.zeros(2)})
    content["extra"] = weights_to_record({"x": torch.ones(1)})
    with pytest.raises(RecordError, match="unexpected records \\['extra'\\]"):
        check_records(content, [META, WEIGHTS], "client 0's reply")


def test_bad_payload_values_and_reserved_keys():
    with pytest.raises(Exception, match="only tensors, int, float, bool and str travel"):
        payload_to_records({"obj": object()})
    with pytest.raises(RecordError, match="reserved"):
        payload_to_records({"__order__": 1})
    with pytest.raises(RecordError, match="bfloat16"):
        payload_to_records({"b": torch.zeros(2, dtype=torch.bfloat16)})


def test_flowers_noise_is_filtered_and_its_other_warnings_kept():
    import logging

    from flwr.common.logger import log

    from fedstyle.runtimes.flower import quiet_flower_noise

    seen = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    quiet_flower_noise()
    quiet_flower_noise()  # once per process, however often it is called
    handler = Keep()
    logger = logging.getLogger("flwr")
    logger.addHandler(handler)
    try:
        log(logging.WARNING, "Manually terminating %s", "ClientAppActor")
        log(logging.WARNING, "The `run_simulation` function is deprecated and will be removed")
        log(logging.WARNING, "a node did not reply")
    finally:
        logger.removeHandler(handler)
    assert seen == ["a node did not reply"]
    assert sum(type(f).__name__ == "FlowerNoiseFilter" for f in logger.filters) == 1


def test_deploy_status_counts_joined_and_identified_local_sites(tmp_path):
    from fedstyle.runtimes.flower.deployment import sites_joined

    assert sites_joined(tmp_path, 3) is None  # remote sites: nothing to say
    (tmp_path / "site-0.log").write_text("INFO: Starting Flower SuperNode\nINFO: SuperNode ID: 1\n"
                                         "INFO: Sending: query.identify message (ID: a)\n")
    (tmp_path / "site-1.log").write_text("INFO: Starting Flower SuperNode\nINFO: SuperNode ID: 2\n")
    (tmp_path / "site-2.log").write_text("INFO: Starting Flower SuperNode\n")
    assert sites_joined(tmp_path, 3) == (2, 1)
