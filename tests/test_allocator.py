"""fedstyle.allocator: glibc keeps freed tensor blocks, so a step's activations stop costing page faults."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

from fedstyle import allocator

glibc_only = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")

# 20 activations of 64 MiB each (the ConvNet's layer output at batch 256), written and freed one after the other,
# as a training step's are; the minor page faults they cost after a warm-up, read from the kernel's counters
_PROBE = """
import json, resource, sys
import torch
from fedstyle.allocator import keep_freed_memory
tuned = keep_freed_memory() if sys.argv[1] == "tune" else False
for _ in range(10):  # warm-up: glibc's heap grows over the first few blocks (6 on glibc 2.36), then holds them
    torch.empty(16 * 2**20).fill_(1.0)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    torch.empty(16 * 2**20).fill_(1.0)
print(json.dumps({"tuned": tuned, "faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before}))
"""


def _probe(mode: str, **env: str) -> dict:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != allocator.ENV}
    done = subprocess.run([sys.executable, "-c", _PROBE, mode], capture_output=True, text=True, check=True,
                          env={**environ, **env}, timeout=120)
    return json.loads(done.stdout.strip().splitlines()[-1])


@glibc_only
def test_freed_blocks_are_reused_instead_of_faulted_in_again():
    """Untuned, every 64 MiB block is a fresh mmap: 16,384 faults of 4 KiB pages each time (fewer with huge
    pages, still one per block). Tuned, the blocks come back from the heap and fault nothing new."""
    system = _probe("keep")
    tuned = _probe("tune")
    assert tuned["tuned"] is True and system["tuned"] is False
    assert system["faults"] >= 20, system  # at least one fault per fresh mapping
    assert tuned["faults"] * 10 <= system["faults"], (tuned, system)


@glibc_only
def test_the_environment_variable_keeps_glibcs_defaults():
    kept = _probe("tune", FEDSTYLE_MALLOC="system")
    assert kept["tuned"] is False
    assert kept["faults"] >= 20, kept


def test_it_is_called_once_and_answers_the_same_after(monkeypatch):
    monkeypatch.setattr(allocator, "_tuned", None)
    first = allocator.keep_freed_memory()
    monkeypatch.setenv(allocator.ENV, "system")  # read once: a later call answers what the first did
    assert allocator.keep_freed_memory() is first
    assert first is (platform.libc_ver()[0] == "glibc")


def test_an_unknown_value_warns_and_names_the_fix(monkeypatch):
    monkeypatch.setattr(allocator, "_tuned", None)
    monkeypatch.setenv(allocator.ENV, "off")
    with pytest.warns(UserWarning, match="FEDSTYLE_MALLOC='off' is none of tuned, system.*FEDSTYLE_MALLOC=system"):
        allocator.keep_freed_memory()
