"""A run with no source validation image is refused in one line before training (issues 49 and 55).

``--per-class 1`` leaves each class one image per domain; the stratified split keeps it for training,
so source validation was an empty set, its accuracy NaN, and the first checkpoint's JSON a traceback."""

from __future__ import annotations

import pytest
import torch

from fedstyle.cli.main import main
from fedstyle.errors import DataError
from fedstyle.experiments.build import check_source_validation
from fedstyle.experiments.config import RunConfig
from fedstyle.partition import Split


def test_per_class_one_is_refused_in_one_line_and_leaves_nothing_in_out(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["run", "--method", "fedavg", "--dataset", "digits4", "--target", "mnist", "--per-class", "1",
                 "--rounds", "1", "--quiet", "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert code != 0
    assert "\n" not in err and "Traceback" not in err
    assert "no source validation image" in err and "raise --per-class to 2 or more" in err
    assert "--selection last" in err
    assert not out.exists()


def _split(val_sizes: dict[str, int]) -> Split:
    split = Split(list(val_sizes), ["t"], None, protocol="lodo")
    split.val = {d: torch.arange(n) for d, n in val_sizes.items()}
    return split


def test_the_refusal_needs_every_source_empty_and_source_validation():
    config = RunConfig(dataset="digits4", targets=["t"])
    check_source_validation(config, _split({"a": 0, "b": 3}))  # one source validates: selection works
    with pytest.raises(DataError, match=r"the source domains \(a, b\) hold too few images per class"):
        check_source_validation(config, _split({"a": 0, "b": 0}))
    check_source_validation(RunConfig(dataset="digits4", targets=["t"], selection="last"), _split({"a": 0}))
