"""The audit's figures: the reconstructions as a PNG grid and the accuracy/leakage trade-off across runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fedstyle.colours import colour_for
from fedstyle.figures import accuracy_axis, save_figure


def save_grid(report: dict[str, Any], path: Path) -> Path:
    """PNG: per payload, a row of the senders' true images above a row of the reconstructions."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = [r for r in report["results"] if r.examples]
    columns = max(len(r.examples) for r in results)
    fig, axes = plt.subplots(2 * len(results), columns, figsize=(columns * 1.1, 2.3 * len(results)), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for i, r in enumerate(results):
        for j, (truth, recon) in enumerate(r.examples):
            for row, image in ((2 * i, truth), (2 * i + 1, recon)):
                axes[row, j].imshow(image.clamp(0, 1).permute(1, 2, 0).numpy())
        axes[2 * i, 0].set_title(f"{r.method}: {r.kind} — true (top), reconstructed (bottom)", loc="left", fontsize=8)
    fig.subplots_adjust(left=0.01, right=0.99, top=0.95, bottom=0.01, hspace=0.35)
    save_figure(fig, path)  # and the PDF beside it
    plt.close(fig)
    return path


def save_tradeoff(reports: list[dict[str, Any]], path: Path) -> Path:
    """PNG: target accuracy against leakage (membership AUC, reconstruction gain over a guess) per run,
    each point labelled with its defence (noise multiplier, the receiver's total epsilon over every release of a
    sender), one colour per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for method in sorted({r["method"] for r in reports}):
        points = sorted((r for r in reports if r["method"] == method), key=lambda r: r["defence"].get("dp_noise", 0))
        xs_auc, xs_gain, ys, labels = [], [], [], []
        for r in points:
            style = next((s for s in r["results"] if s.method != "fedavg"), None)
            accuracy = r["summary"].get("target_avg", {}).get("last")
            if style is None or accuracy is None:
                continue
            xs_auc.append(style.scores["membership_auc"])
            xs_gain.append(style.scores["psnr_gain"])
            ys.append(100 * float(accuracy))
            eps, releases = r.get("epsilon"), r.get("releases", 1)
            total = f", ε={eps:.2g}" + (f" over {releases} releases" if releases > 1 else "") if eps else ""
            labels.append(f"z={r['defence'].get('dp_noise', 0):g}{total}")
        for ax, xs in ((axes[0], xs_auc), (axes[1], xs_gain)):
            ax.plot(xs, ys, "o-", label=method, color=colour_for(method))
            for x, y, text in zip(xs, ys, labels):
                ax.annotate(text, (x, y), fontsize=7, textcoords="offset points", xytext=(3, 3))
    classes = {r["summary"].get("num_classes") for r in reports} - {None}
    chance = 100.0 / next(iter(classes)) if len(classes) == 1 else None
    for ax in axes:
        accuracy_axis(ax, chance)
    axes[0].set_xlabel("membership AUC (0.5 = no leak)")
    axes[1].set_xlabel("reconstruction PSNR over the best uninformed guess (dB)")
    for ax in axes:
        ax.set_ylabel("target accuracy (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("Accuracy vs leakage of shared styles under the Gaussian defence")
    fig.tight_layout()
    save_figure(fig, path)  # and the PDF beside it
    plt.close(fig)
    return path
