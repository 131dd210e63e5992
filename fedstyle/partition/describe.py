"""Human- and machine-readable summaries of a partition (per client: domains and classes)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from fedstyle.data.contract import DomainDataset
from fedstyle.io import atomic_write_text
from fedstyle.partition.partitioners import ClientSpec


def describe_partition(clients: Sequence[ClientSpec], dataset: DomainDataset) -> list[dict]:
    """Per client ``{"client": i, "size": n, "domains": {domain: count}, "classes": {class: count}}``;
    zero counts are left out, domains in dataset order, classes in label order."""
    rows = []
    for i, client in enumerate(clients):
        class_counts = torch.zeros(dataset.num_classes, dtype=torch.long)
        for domain, idx in client.indices.items():
            labels = dataset.labels[domain][idx.to(dataset.labels[domain].device)]
            class_counts += torch.bincount(labels, minlength=dataset.num_classes).cpu()
        domain_counts = client.domain_counts()
        rows.append(
            {
                "client": i,
                "size": client.size,
                "domains": {d: domain_counts[d] for d in dataset.domains if d in domain_counts},
                "classes": {dataset.classes[k]: int(c) for k, c in enumerate(class_counts.tolist()) if c},
            }
        )
    return rows


def write_partition_json(
    clients: Sequence[ClientSpec], dataset: DomainDataset, path: str | os.PathLike, include_indices: bool = False
) -> Path:
    """Write the partition summary (and, optionally, every client's indices) to ``path`` atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = describe_partition(clients, dataset)
    if include_indices:
        for row, client in zip(rows, clients):
            row["indices"] = {d: t.tolist() for d, t in client.indices.items()}
    payload = {"dataset": dataset.name, "num_clients": len(clients), "clients": rows}
    return atomic_write_text(path, json.dumps(payload, indent=1))


def format_partition_table(clients: Sequence[ClientSpec], dataset: DomainDataset, max_rows: int = 12) -> str:
    """Clients x domains sample counts (first ``max_rows`` clients) and a size summary, for the CLI."""
    domains = [d for d in dataset.domains if any(d in c.indices for c in clients)]
    counts = np.array([[c.domain_counts().get(d, 0) for d in domains] for c in clients], dtype=np.int64)
    counts = counts.reshape(len(clients), len(domains))
    sizes = counts.sum(axis=1)
    header = ["client", *domains, "total"]
    body = [[str(i), *map(str, row), str(total)] for i, (row, total) in enumerate(zip(counts.tolist(), sizes.tolist()))]
    widths = [max(len(h), *(len(r[k]) for r in body[:max_rows])) if body else len(h) for k, h in enumerate(header)]

    def line(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) for c, w in zip(cells, widths))

    lines = [line(header), *(line(r) for r in body[:max_rows])]
    if len(body) > max_rows:
        lines.append(f"... {len(body) - max_rows} more clients")
    if len(sizes):
        lines.append(
            f"{len(clients)} clients, {int(sizes.sum())} samples; client size min {int(sizes.min())}, "
            f"median {int(np.median(sizes))}, max {int(sizes.max())}; "
            f"domains per client min {int((counts > 0).sum(1).min())}, max {int((counts > 0).sum(1).max())}"
        )
    return "\n".join(lines)
