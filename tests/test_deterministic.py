"""``--deterministic``: torch's deterministic kernels for the run's process; the CPU's results do not change."""

from __future__ import annotations

import os

import pytest
import torch
from safetensors.torch import load_file

from fedstyle import devices
from fedstyle.devices import CUBLAS_DETERMINISTIC_WORKSPACE, set_deterministic_kernels
from fedstyle.experiments.runner import run_experiment
from run_records import evaluations


@pytest.fixture
def torch_switches(monkeypatch):
    """Restore torch's process-wide switches (and CUBLAS_WORKSPACE_CONFIG) after the test."""
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
              torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    monkeypatch.setattr(devices, "_BEFORE_DETERMINISTIC", None)
    yield
    torch.use_deterministic_algorithms(before[0], warn_only=before[1])
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = before[2], before[3]


def test_the_switch_turns_torchs_deterministic_kernels_on_and_back_off(torch_switches, monkeypatch):
    torch.use_deterministic_algorithms(False)
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = False, True
    set_deterministic_kernels(True)
    assert torch.are_deterministic_algorithms_enabled()
    assert torch.is_deterministic_algorithms_warn_only_enabled()  # an op without such a kernel warns, not stops
    assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == CUBLAS_DETERMINISTIC_WORKSPACE
    set_deterministic_kernels(True)  # a second run with it: the state to go back to is still the first one
    set_deterministic_kernels(False)  # a later run without it, in the same process (a sweep's worker, a site)
    assert not torch.are_deterministic_algorithms_enabled()
    assert not torch.backends.cudnn.deterministic and torch.backends.cudnn.benchmark
    assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ  # it set the variable, so it takes it back
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")  # the other setting NVIDIA documents: the user's
    set_deterministic_kernels(True)
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"
    set_deterministic_kernels(False)
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"  # not its own: left alone


def test_a_callers_own_strict_setting_is_kept(torch_switches):
    torch.use_deterministic_algorithms(True)  # set by the caller (errors, not warnings), not by a --deterministic run
    set_deterministic_kernels(False)  # a run without it leaves it alone
    assert torch.are_deterministic_algorithms_enabled() and not torch.is_deterministic_algorithms_warn_only_enabled()
    set_deterministic_kernels(True)  # a run with it keeps it strict
    assert not torch.is_deterministic_algorithms_warn_only_enabled()
    set_deterministic_kernels(False)
    assert torch.are_deterministic_algorithms_enabled() and not torch.is_deterministic_algorithms_warn_only_enabled()


def _global_weights(run_dir):
    return {k: v for k, v in load_file(str(run_dir / "checkpoint.safetensors")).items() if k.startswith("global/")}


def test_a_cpu_run_is_the_same_with_and_without_it_and_trains_with_the_switch_on(tiny_config, tmp_path,
                                                                              torch_switches, monkeypatch):
    from fedstyle.algorithms.base import Algorithm

    torch.use_deterministic_algorithms(False)
    plain = run_experiment(tiny_config, tmp_path / "plain", quiet=True)
    assert not torch.are_deterministic_algorithms_enabled()  # a plain run leaves the switch alone

    seen = []
    original = Algorithm.training_step

    def spy(self, *args, **kwargs):
        seen.append(torch.are_deterministic_algorithms_enabled())
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Algorithm, "training_step", spy)
    strict = run_experiment(tiny_config.updated(deterministic=True), tmp_path / "strict", quiet=True)
    assert seen and all(seen)
    run_experiment(tiny_config, tmp_path / "after", quiet=True)  # the next run in this process, without it
    assert not torch.are_deterministic_algorithms_enabled()
    assert strict["targets"] == plain["targets"]
    assert evaluations(tmp_path / "strict") == evaluations(tmp_path / "plain")
    a, b = _global_weights(tmp_path / "plain"), _global_weights(tmp_path / "strict")
    assert a and all(torch.equal(v, b[k]) for k, v in a.items())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_deterministic_gpu_run_repeats_bit_for_bit(tiny_config, tmp_path, torch_switches):
    config = tiny_config.updated(device="cuda", deterministic=True, backbone="resnet18", method="mixstyle")
    first = run_experiment(config, tmp_path / "a", quiet=True)
    second = run_experiment(config, tmp_path / "b", quiet=True)
    assert first["targets"] == second["targets"]
    a, b = _global_weights(tmp_path / "a"), _global_weights(tmp_path / "b")
    assert a and all(torch.equal(v, b[k]) for k, v in a.items())
