"""Paper-ready report figures and table: PNG and PDF, one colour per method, chance on accuracy axes, no
empty panels, and a booktabs LaTeX table beside report.md and report.csv."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedstyle.colours import colour_for
from fedstyle.experiments.report import collect, plot_accuracy, plot_training, results_table, to_latex, write_report
from fedstyle.experiments.report import plots
from fedstyle.figures import MIN_ACCURACY_SPAN, save_figure
from test_report import make_run, make_sweep


@pytest.fixture
def runs(tmp_path) -> Path:
    return make_sweep(tmp_path)


@pytest.fixture
def drawn(monkeypatch) -> list:
    """The figures the report draws, kept as they are saved."""
    figures = []
    real = plots.save_figure

    def keep(figure, path, **options):
        figures.append(figure)
        return real(figure, path, **options)

    monkeypatch.setattr(plots, "save_figure", keep)
    return figures


def line_colours(figure) -> dict[str, str]:
    """Legend label -> hex colour of every labelled line in the figure's axes."""
    from matplotlib.colors import to_hex

    return {line.get_label(): to_hex(line.get_color()) for axes in figure.axes for line in axes.get_lines()
            if not line.get_label().startswith("_") and line.get_label() != "chance"}


def test_every_figure_is_written_as_png_and_pdf_beside_the_latex_table(runs, tmp_path):
    out = tmp_path / "report"
    _, paths = write_report([runs], out)
    assert sorted(p.name for p in out.iterdir()) == ["accuracy.pdf", "accuracy.png", "report.csv", "report.md",
                                                     "report.tex", "training.pdf", "training.png"]  # no temps
    for name in ("accuracy", "training"):
        assert (out / f"{name}.png").read_bytes().startswith(b"\x89PNG")
        assert (out / f"{name}.pdf").read_bytes().startswith(b"%PDF")
    assert paths["latex"] == out / "report.tex"


def test_a_method_keeps_its_colour_whatever_the_row_order(runs, tmp_path, drawn):
    records = collect([runs])
    write_report([runs], tmp_path / "a", order=["FedAvg", "MixStyle"])
    write_report([runs], tmp_path / "b", order=["MixStyle", "FedAvg"])
    plot_accuracy(records[::-1], tmp_path / "reversed.png")  # curves met in the other order too
    first, *others = [line_colours(figure) for figure in drawn]
    assert first == {"FedAvg": colour_for("fedavg"), "MixStyle": colour_for("mixstyle")}
    assert all(colours == first for colours in others)


@pytest.mark.parametrize("devices", [False, True])
def test_training_figure_has_no_empty_panel(tmp_path, drawn, devices):
    make_run(tmp_path / "runs", "FedAvg", 0, "art", 0.8)
    if devices:  # peer-to-peer runs add a fifth panel: the devices' own models
        metrics = tmp_path / "runs" / "FedAvg-seed0-art" / "metrics.jsonl"
        rows = [json.loads(line) for line in metrics.read_text().splitlines()]
        for row in rows:
            row["device_target_acc"] = {"art": {"mean": 0.5, "std": 0.1}}
        metrics.write_text("".join(json.dumps(row) + "\n" for row in rows))
    plot_training(collect([tmp_path / "runs"]), tmp_path / "training.png")
    [figure] = drawn
    assert len(figure.axes) == (5 if devices else 4)  # the grid holds what is drawn, nothing hidden
    assert all(axes.get_visible() and axes.has_data() for axes in figure.axes)


def test_accuracy_axes_show_chance_and_do_not_magnify_noise_near_it(tmp_path, drawn):
    for seed, final in ((0, 0.096), (1, 0.088)):  # a 10-class smoke run ending at chance
        run = make_run(tmp_path / "runs", "FedGCA", seed, "sketch", final)
        summary = json.loads((run / "summary.json").read_text())
        summary["targets"]["sketch"]["last"] = final
        (run / "summary.json").write_text(json.dumps({**summary, "num_classes": 10}))
        metrics = run / "metrics.jsonl"
        rows = [json.loads(line) for line in metrics.read_text().splitlines()]
        for row, value in zip(rows, (0.092, 0.098, final)):
            row["target_acc"] = {"sketch": value}
        metrics.write_text("".join(json.dumps(row) + "\n" for row in rows))
    records = collect([tmp_path / "runs"])
    plot_accuracy(records, tmp_path / "accuracy.png")
    plot_training(records, tmp_path / "training.png")
    accuracy_axes = [axes for figure in drawn for axes in figure.axes if axes.get_ylabel() == "accuracy (%)"]
    assert len(accuracy_axes) == 1 + 3  # one target panel; training: target, source validation, traffic
    for axes in accuracy_axes:
        chance = [line for line in axes.get_lines() if line.get_label() == "chance"]
        assert len(chance) == 1 and chance[0].get_ydata()[0] == pytest.approx(10.0)
        low, high = axes.get_ylim()
        assert low <= 10.0 <= high and high - low >= MIN_ACCURACY_SPAN


def test_latex_table_is_booktabs_with_escaped_labels_and_the_best_mean_in_bold(tmp_path):
    for seed, (plain, styled) in enumerate(((0.50, 0.60), (0.54, 0.62))):
        make_run(tmp_path, "FedAvg", seed, "art", plain)
        make_run(tmp_path, "Fed_DG & 50%", seed, "art", styled, method="feddg_fft")
    table = results_table(collect([tmp_path]), "selected")
    latex = to_latex(table)
    lines = latex.splitlines()
    assert r"\toprule" in lines and r"\midrule" in lines and r"\bottomrule" in lines
    assert lines[lines.index(r"\toprule") + 1] == r"Method & art & Avg & n \\"
    assert r"\begin{tabular}{@{}lrrr@{}}" in lines and r"\resizebox{" not in latex  # 4 columns fit one column
    assert r"Fed\_DG \& 50\% & \textbf{61.0}{\scriptsize\,$\pm$1.4} & \textbf{61.0}{\scriptsize\,$\pm$1.4} & 2 \\" \
        in lines
    assert r"FedAvg & 52.0{\scriptsize\,$\pm$2.8} & 52.0{\scriptsize\,$\pm$2.8} & 2 \\" in lines
    assert "Src-val" not in latex and "±" not in latex  # columns it leaves out; non-ASCII made LaTeX


def test_save_figure_writes_the_pdf_beside_and_refuses_a_pdf_name(tmp_path):
    from matplotlib.figure import Figure

    from fedstyle.errors import ConfigError

    figure = Figure()
    figure.add_subplot().plot([0, 1], [0, 1])
    assert save_figure(figure, tmp_path / "line.png") == tmp_path / "line.png"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["line.pdf", "line.png"]
    with pytest.raises(ConfigError, match="name the .png"):
        save_figure(figure, tmp_path / "line.pdf")
