"""Device names (fedstyle.devices): every name a run cannot use is a ConfigError naming the ones it can."""

from __future__ import annotations

import pytest
import torch

from fedstyle.devices import parse_device_name, resolve_device
from fedstyle.errors import ConfigError


def test_cpu_and_auto_resolve_and_a_device_passes_through():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type in ("cpu", "cuda", "mps")
    assert resolve_device(torch.device("cpu")) == torch.device("cpu")


@pytest.mark.parametrize("name, message", [
    ("banana", "is not a device; use cpu, cuda, cuda:N, mps or auto"),
    ("xpu", "fedstyle runs on cpu, cuda, cuda:N or mps"),
    ("meta", "fedstyle runs on cpu, cuda, cuda:N or mps"),  # torch accepts it; a run's tensors would be empty
])
def test_names_no_run_can_use_are_refused(name, message):
    with pytest.raises(ConfigError, match=message):
        resolve_device(name)


def test_an_accelerator_this_machine_lacks_is_refused(monkeypatch):
    """Asked for by name, CUDA or MPS must be there (they failed later with RuntimeError or AssertionError)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="sees no GPU"):
        resolve_device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert resolve_device("cuda:0") == torch.device("cuda:0")
    with pytest.raises(ConfigError, match=r"--device cuda:3: this machine has 1 GPU\(s\), cuda:0 to cuda:0"):
        resolve_device("cuda:3")
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="Apple's MPS, which this machine or torch lacks"):
        resolve_device("mps")


def test_a_name_is_checked_apart_from_this_machine(monkeypatch):
    """A plan for a GPU machine is valid here (parse_device_name); only resolve_device asks for the GPU."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert parse_device_name("cuda:1") == torch.device("cuda:1") and parse_device_name("auto") is None
    with pytest.raises(ConfigError, match="is not a device"):
        parse_device_name("banana")
    with pytest.raises(ConfigError, match="fedstyle runs on cpu, cuda, cuda:N or mps"):
        parse_device_name("xpu")
