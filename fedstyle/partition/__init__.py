"""Evaluation protocols (which domains train, validate, test) and client partitioners."""

from fedstyle.partition.describe import (
    describe_partition,
    format_partition_table,
    write_partition_json,
)
from fedstyle.partition.partitioners import (
    PARTITIONERS,
    ClientSpec,
    lambda_counts,
    make_partition,
)
from fedstyle.partition.protocols import PROTOCOLS, Split, make_split

__all__ = [
    "PROTOCOLS",
    "Split",
    "make_split",
    "PARTITIONERS",
    "ClientSpec",
    "make_partition",
    "lambda_counts",
    "describe_partition",
    "write_partition_json",
    "format_partition_table",
]
