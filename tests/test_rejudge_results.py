"""benchmarks/rejudge_results.py: the verdicts of docs/results/ re-read by the rule from their recorded per-seed
values."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "rejudge_results.py"
T_975_2 = 4.302653  # Student's t, 0.975 quantile, 2 degrees of freedom (tables)


@pytest.fixture(scope="module")
def rejudge():
    spec = importlib.util.spec_from_file_location("rejudge_results", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


def test_every_recorded_figure_is_printed_on_its_row_of_results(rejudge):
    """The script's data are the figures of docs/results/: each recorded row's per-seed values are on that row there."""
    assert rejudge.check_recorded(rejudge.results_text(rejudge.RESULTS)) == []


def test_a_figure_changed_in_results_is_named(rejudge, tmp_path, capsys):
    text = rejudge.results_text(rejudge.RESULTS).replace("(30.9, 37.1, 33.6)", "(30.9, 37.1, 33.7)")
    problems = rejudge.check_recorded(text)
    assert len(problems) == 1 and problems[0].startswith("stablefdg-ref: fashion4 → sketch (30.9, 37.1, 33.6)")
    changed = tmp_path / "RESULTS.md"
    changed.write_text(text, encoding="utf-8")
    assert rejudge.main(["--results", str(changed)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "update ROWS in benchmarks/rejudge_results.py" in err


def test_readings_match_hand_computed_intervals(rejudge):
    """Mended vs before on fashion4: differences 3.4, 6.1, 2.2, mean 3.9, sd sqrt(7.98 / 2) = 1.9975, half width
    4.3027 * 1.9975 / sqrt(3) = 4.962: [-1.06, 8.86] -> within noise although 3 of 3 favour it (sign p = 0.25).
    Code vs paper on fashion4: 11.8, 8.6, 8.3, mean 9.567, sd sqrt(7.5267 / 2) = 1.9399, half 4.819 -> holds."""
    claims = {c.key: dict(rejudge.readings(c)) for c in rejudge.CLAIMS}
    mend = claims["stablefdg-mend"]["fashion4 → sketch"]
    half = T_975_2 * (7.98 / 2) ** 0.5 / 3 ** 0.5
    assert mend.status == "within noise" and mend.mean == pytest.approx(3.9)
    assert (mend.low, mend.high) == (pytest.approx(3.9 - half, abs=1e-3), pytest.approx(3.9 + half, abs=1e-3))
    assert (mend.ahead, mend.n, mend.sign_p) == (3, 3, pytest.approx(0.25))
    code = claims["stablefdg-code-vs-paper"]["fashion4 → sketch"]
    mean = (11.8 + 8.6 + 8.3) / 3
    half = T_975_2 * (sum((d - mean) ** 2 for d in (11.8, 8.6, 8.3)) / 2) ** 0.5 / 3 ** 0.5
    assert code.status == "holds" and code.low == pytest.approx(mean - half, abs=1e-3)
    # a claim over two cells is read per cell and over both; each reading names its cells
    assert list(claims["stablefdg-code-vs-paper"]) == ["digits4 → mnistm", "fashion4 → sketch", "all cells"]
    assert claims["stablefdg-code-vs-paper"]["all cells"].cells == ["digits4 → mnistm", "fashion4 → sketch"]
    assert claims["stablefdg-code-vs-paper"]["digits4 → mnistm"].status == "within noise"
    assert list(claims["pardon-client-style"]) == ["digits4 → mnistm"]  # one cell: no pooled reading
    assert claims["pardon-client-style"]["digits4 → mnistm"].status == "within noise"


def test_the_command_prints_every_claim_with_the_rules_fields(rejudge, capsys):
    assert rejudge.main([]) == 0
    out = capsys.readouterr().out
    for claim in rejudge.CLAIMS:
        assert f"{claim.key}: {claim.text}" in out
    assert "fashion4 → sketch: holds (+9.6 points, 95 % CI [+4.7, +14.4]; 3 of 3 pairs favour the claim, sign test " \
           "p = 0.25; cells: fashion4 → sketch; seeds 0, 1, 2; differences +11.8, +8.6, +8.3)" in out
    assert rejudge.main(["--json"]) == 0
    records = json.loads(capsys.readouterr().out)
    assert {r["status"] for r in records} <= {"holds", "fails", "within noise", "not judged"}
    assert len(records) == 7 and all(r["pairs"] >= 3 and r["source"] for r in records)
