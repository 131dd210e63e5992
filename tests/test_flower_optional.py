"""fedstyle works without Flower: the Flower features fail early with the install command, writing nothing."""

from __future__ import annotations

import sys

import pytest

from fedstyle.cli.main import main


@pytest.fixture
def no_flower(monkeypatch):
    for name in ("flwr", "ray"):
        monkeypatch.setitem(sys.modules, name, None)  # `import flwr` now raises ImportError


def test_flower_backends_name_the_extra_and_write_nothing(no_flower, tiny_root, tmp_path, capsys):
    data = ["--dataset", "folder", "--data-root", str(tiny_root), "--resolution", "16", "--target", "grey", "--quiet"]
    assert main(["run", "--backend", "flower-sim", "--out", str(tmp_path / "a"), *data]) == 2
    assert "pip install -c constraints.txt 'fedstyle[flower-sim]'" in capsys.readouterr().err
    assert main(["deploy", "--sites", "3", "--insecure", "--out", str(tmp_path / "b"), *data]) == 2
    assert "pip install -c constraints.txt 'fedstyle[flower]'" in capsys.readouterr().err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_simulator_and_help_need_no_flower(no_flower, tiny_config, tmp_path, capsys):
    from fedstyle.experiments.runner import run_experiment

    assert run_experiment(tiny_config, tmp_path / "run", quiet=True)["rounds"] == 2
    with pytest.raises(SystemExit):
        main(["deploy", "--help"])
    assert "fedstyle deploy certs" in capsys.readouterr().out
