"""How often ``--data-copies K`` puts one training sample twice or more in one client (issue 50, section 7),
measured with the real partitioner on 3 source domains of 2,000 training samples each:

    python benchmarks/data_copies_repeats.py
"""

from __future__ import annotations

from collections import Counter

import torch

from fedstyle.partition.partitioners import make_partition
from fedstyle.partition.protocols import Split

PER_DOMAIN = 2000
SOURCES = ["a", "b", "c"]
SETTINGS = [("domain", None, 2), ("per_domain", 9, 3), ("per_domain", 30, 3), ("per_domain", 300, 3),
            ("per_domain", 999, 11)]


def main() -> None:
    split = Split(sources=SOURCES, targets=["t"], val_domain=None,
                  train={d: torch.arange(PER_DOMAIN) for d in SOURCES}, val={d: torch.arange(0) for d in SOURCES},
                  heldout={"t": torch.arange(10)}, protocol="lodo")
    for partition, clients, copies in SETTINGS:
        specs = make_partition(partition, split, None, num_clients=clients, seed=0, copies=copies)
        repeated = {(d, i) for spec in specs for d, idx in spec.indices.items()
                    for i, n in Counter(idx.tolist()).items() if n > 1}
        print(f"--partition {partition} --clients {len(specs)} --data-copies {copies}: "
              f"{len(repeated) / (len(SOURCES) * PER_DOMAIN):.3f} of the samples sit twice or more in one client")


if __name__ == "__main__":
    main()
