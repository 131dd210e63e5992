"""Partition summaries: per-client counts, atomic JSON, CLI table."""

import json
from pathlib import Path

import pytest
import torch

from fedstyle.data.contract import DomainDataset
from fedstyle.partition import (
    describe_partition,
    make_partition,
    make_split,
    write_partition_json,
)
from fedstyle.partition.describe import format_partition_table


@pytest.fixture
def dataset():
    labels = {"a": [0, 0, 0, 1, 1, 2], "b": [2, 2, 1, 1], "t": [0, 1]}
    return DomainDataset(
        "toy",
        list(labels),
        ["cat", "dog", "fish"],
        {d: torch.randint(0, 256, (len(y), 3, 2, 2), dtype=torch.uint8) for d, y in labels.items()},
        {d: torch.tensor(y) for d, y in labels.items()},
    )


@pytest.fixture
def clients(dataset):
    split = make_split(dataset, "lodo", targets=["t"], val_fraction=0.0)
    return make_partition("domain", split, dataset)


def test_describe_counts_domains_and_classes(dataset, clients):
    assert describe_partition(clients, dataset) == [
        {"client": 0, "size": 6, "domains": {"a": 6}, "classes": {"cat": 3, "dog": 2, "fish": 1}},
        {"client": 1, "size": 4, "domains": {"b": 4}, "classes": {"dog": 2, "fish": 2}},
    ]


def test_write_partition_json_roundtrip(tmp_path, dataset, clients):
    path = write_partition_json(clients, dataset, tmp_path / "run" / "partition.json", include_indices=True)
    payload = json.loads(path.read_text())
    assert payload["dataset"] == "toy" and payload["num_clients"] == 2
    assert payload["clients"][1]["indices"] == {"b": [0, 1, 2, 3]}
    assert [p.name for p in path.parent.iterdir()] == ["partition.json"]  # no temporary file left


def test_write_partition_json_is_atomic(tmp_path, dataset, clients, monkeypatch):
    path = tmp_path / "partition.json"
    path.write_text("old")

    real_write_text = Path.write_text

    def failing_write(self, text, *args, **kwargs):  # half a file, then the disk is full
        real_write_text(self, text[: len(text) // 2])
        raise RuntimeError("disk full")

    monkeypatch.setattr(Path, "write_text", failing_write)
    with pytest.raises(RuntimeError):
        write_partition_json(clients, dataset, path)
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["partition.json"]


def test_format_partition_table(dataset, clients):
    text = format_partition_table(clients, dataset)
    header = text.splitlines()[0].split()
    assert header == ["client", "a", "b", "total"]
    assert text.splitlines()[1].split() == ["0", "6", "0", "6"]
    assert "2 clients, 10 samples" in text
    short = format_partition_table(clients, dataset, max_rows=1)
    assert "... 1 more clients" in short and len(short.splitlines()) == 4
