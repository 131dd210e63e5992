"""One naming scheme (issue 53): --method, report --claim and --only variant= take a method name (any case), a
preset's variant name or a row label, in that order; claims are checked before anything is written, an ordering
that names a row twice is refused, and a claim on a row at chance is not judged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedstyle.cli.main import main
from fedstyle.cli.names import resolve_method, resolve_variants, row_resolver
from fedstyle.errors import ConfigError
from fedstyle.experiments.config import RunConfig
from fedstyle.experiments.verdict import NOT_LEARNED_STATUS, parse_ordering


def make_run(root: Path, label: str, method: str, seed: int, target: str, accuracy: float, source_val: float,
             num_classes: int = 10, **settings) -> Path:
    """A finished run directory as the runner writes it (the keys reports read)."""
    run = root / f"{label.replace(' ', '_')}-seed{seed}-{target}"
    run.mkdir(parents=True)
    config = RunConfig(method=method, seed=seed, targets=[target], **settings).to_dict()
    (run / "config.json").write_text(json.dumps(config))
    (run / "metrics.jsonl").write_text(json.dumps({"round": 1, "seconds": 1.0, "train_loss": 1.0,
                                                   "source_val_acc": {"a": source_val}, "target_acc": {target: accuracy},
                                                   "bytes_up": 1, "bytes_down": 1}) + "\n")
    summary = {"method": method, "label": label, "dataset": "digits4", "seed": seed, "selection": "source_val",
               "selected_round": 1, "targets": {target: {"selected": accuracy, "last": accuracy}}, "seconds": 1.0,
               "bytes_up": 1, "bytes_down": 1, "num_classes": num_classes}
    (run / "summary.json").write_text(json.dumps(summary))
    (run / "done").touch()
    return run


def table_of_runs(root: Path, rows: dict[str, tuple[str, list[float], float]]) -> Path:
    """rows: label -> (method, target accuracy per seed, source-validation accuracy)."""
    for label, (method, accuracies, source_val) in rows.items():
        for seed, accuracy in enumerate(accuracies):
            make_run(root, label, method, seed, "mnist", accuracy, source_val)
    return root


def test_method_names_resolve_in_any_case_then_variants_then_row_labels():
    assert resolve_method("fedAvg").method == "fedavg"
    variant = resolve_method("ccst-overall-k3")
    assert (variant.method, variant.hparams, variant.label) == ("ccst", {"style_type": "overall", "k": 3},
                                                                "CCST (overall, K=3)")
    label = resolve_method("ccst (overall, k=1)")
    assert (label.method, label.hparams) == ("ccst", {"style_type": "overall", "k": 1})
    assert resolve_method("ccst").hparams == {}  # the method comes first, though presets have a variant "ccst"
    with pytest.raises(ConfigError, match="did you mean 'ccst-overall-k3'"):
        resolve_method("ccst-overal-k3")


def test_run_takes_a_variant_name_and_fills_its_hyperparameters(monkeypatch):
    """`fedstyle run --method ccst-overall-k3`: CCST with the variant's hyperparameters and label; --hp wins."""
    from fedstyle.cli.flags import check_run_names, config_from_args
    from fedstyle.cli.main import build_parser

    args = build_parser().parse_args(["run", "--method", "ccst-overall-k3", "--hp", "k=2", "--out", "x"])
    check_run_names(args)
    config = config_from_args(args)
    assert (config.method, config.hparams, config.label) == ("ccst", {"style_type": "overall", "k": "2"},
                                                             "CCST (overall, K=3)")


def test_claim_rows_resolve_by_method_variant_and_label(tmp_path):
    labels = ["FedAvg", "MixStyle", "CCST (overall, K=3)", "CCST (overall, K=1)"]
    methods = {"FedAvg": {"fedavg"}, "MixStyle": {"mixstyle"}, "CCST (overall, K=3)": {"ccst"},
               "CCST (overall, K=1)": {"ccst"}}
    resolve = row_resolver(labels, methods)
    assert resolve("fedavg") == "FedAvg" and resolve("MIXSTYLE") == "MixStyle"
    assert resolve("ccst-overall-k3") == "CCST (overall, K=3)"
    assert resolve("ccst (overall, k=1)") == "CCST (overall, K=1)"
    with pytest.raises(ConfigError, match="the method of several rows"):
        resolve("ccst")


@pytest.mark.parametrize("claim, said", [("A > A", "names 'A' twice"), ("A > B > A", "names 'A' twice"),
                                         ("A > B < C", "mixes > and <"), ("A >> B", "not an ordering")])
def test_orderings_that_cannot_hold_are_refused(claim, said):
    with pytest.raises(ConfigError, match=said):
        parse_ordering(claim)


def test_report_checks_claims_before_writing_anything(tmp_path, capsys):
    runs = table_of_runs(tmp_path / "runs", {"FedAvg": ("fedavg", [0.5, 0.52], 0.6),
                                            "MixStyle": ("mixstyle", [0.55, 0.58], 0.6)})
    out = tmp_path / "report"
    assert main(["report", str(runs), "--out", str(out), "--claim", "mixstyl > fedavg"]) == 2
    assert "no row 'mixstyl' in the table; did you mean 'MixStyle'?" in capsys.readouterr().err
    assert not out.exists()
    assert main(["report", str(runs), "--out", str(out), "--claim", "mixstyle > fedavg"]) == 0
    assert "claim MixStyle > FedAvg: " in capsys.readouterr().out


def test_a_claim_on_a_row_at_chance_is_not_judged(tmp_path, capsys):
    """10 classes: chance 10 %; a row whose source validation is 15 % (within 10 points) did not learn."""
    runs = table_of_runs(tmp_path / "runs", {"FedAvg": ("fedavg", [0.09, 0.095, 0.088], 0.15),
                                            "FedGCA": ("fedgca", [0.096, 0.098, 0.093], 0.6)})
    assert main(["report", str(runs), "--out", str(tmp_path / "r"), "--claim", "fedgca > fedavg"]) == 0
    said = capsys.readouterr().out
    assert f"claim FedGCA > FedAvg: {NOT_LEARNED_STATUS}" in said and "FedAvg 15.0 %" in said
    record = json.loads((tmp_path / "r" / "claims.json").read_text())[0]
    assert record["status"] == NOT_LEARNED_STATUS


def test_a_row_just_past_the_margin_is_judged(tmp_path, capsys):
    runs = table_of_runs(tmp_path / "runs", {"FedAvg": ("fedavg", [0.5, 0.52, 0.5], 0.21),
                                            "MixStyle": ("mixstyle", [0.6, 0.62, 0.61], 0.6)})
    assert main(["report", str(runs), "--out", str(tmp_path / "r"), "--claim", "mixstyle > fedavg"]) == 0
    assert "claim MixStyle > FedAvg: holds" in capsys.readouterr().out


def test_sweep_verdicts_mark_rows_that_did_not_learn(tmp_path):
    from fedstyle.experiments.paper import Claim, RowStats, judge

    cells = {("digits4 → mnist", s): v for s, v in enumerate([9.0, 9.5, 8.8])}
    others = {("digits4 → mnist", s): v for s, v in enumerate([9.6, 9.9, 9.2])}
    stuck = RowStats("FedAvg", {0: 9.0, 1: 9.5, 2: 8.8}, per_cell=cells, source_val=[12.0, 11.0, 13.0], num_classes=10)
    other = RowStats("FedGCA", {0: 9.6, 1: 9.9, 2: 9.2}, per_cell=others, source_val=[40.0, 41.0, 39.0],
                     num_classes=10)
    verdict = judge(Claim("fedgca", "fedavg", "fedgca > fedavg"), {"fedgca": other, "fedavg": stuck})
    assert verdict.status == NOT_LEARNED_STATUS and "within 10 points of chance" in verdict.text
    other.source_val[:] = [40.0]
    stuck.source_val[:] = [40.0]
    assert judge(Claim("fedgca", "fedavg", "fedgca > fedavg"), {"fedgca": other, "fedavg": stuck}).status != \
        NOT_LEARNED_STATUS


def test_only_variant_takes_methods_names_and_labels():
    from fedstyle.experiments.grid.spec import VariantSpec

    variants = [VariantSpec("fedavg", "fedavg", "FedAvg", {}, {}), VariantSpec("ccst-k1", "ccst", "CCST (K=1)", {}, {}),
                VariantSpec("ccst-k3", "ccst", "CCST (K=3)", {}, {}), VariantSpec("fedbn", "fedbn", "FedBN", {}, {}),
                VariantSpec("fedbn-mixstyle", "fedbn", "FedBN + MixStyle", {}, {})]
    assert resolve_variants(["ccst"], variants, "grid") == ["ccst-k1", "ccst-k3"]  # every row of the method
    assert resolve_variants(["fedbn"], variants, "grid") == ["fedbn"]  # its variant of that name
    assert resolve_variants(["CCST-K3", "FedAvg"], variants, "grid") == ["ccst-k3", "fedavg"]
    assert resolve_variants(["ccst (k=1)"], variants, "grid") == ["ccst-k1"]
    with pytest.raises(ConfigError, match="did you mean 'fedavg'"):
        resolve_variants(["fedavgg"], variants, "grid")


def test_the_settings_line_lists_only_settings_that_apply(tmp_path, capsys):
    """Star runs on the domain partition: no radius (rgg), edge_prob (Erdős–Rényi), lam (lambda) or alpha."""
    runs = table_of_runs(tmp_path / "runs", {"FedAvg": ("fedavg", [0.5], 0.6), "MixStyle": ("mixstyle", [0.6], 0.6)})
    assert main(["report", str(runs), "--out", str(tmp_path / "r")]) == 0
    shared = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("Settings all rows share"))
    assert "partition domain" in shared and "topology star" in shared
    for unread in ("radius", "edge_prob", "lam ", "alpha", "min_client_size"):
        assert unread not in shared


def test_warnings_reach_the_user_as_one_plain_line(tmp_path, capsys):
    runs = table_of_runs(tmp_path / "runs", {"FedAvg": ("fedavg", [0.5], 0.6)})
    (tmp_path / "runs" / "crashed").mkdir()
    (tmp_path / "runs" / "crashed" / "metrics.jsonl").write_text("{}\n")
    assert main(["report", str(runs), "--out", str(tmp_path / "r")]) == 0
    err = capsys.readouterr().err
    assert "fedstyle: warning: 1 run(s) have no summary.json" in err
    assert ".py:" not in err and "UserWarning" not in err and len(err.strip().splitlines()) == 1
