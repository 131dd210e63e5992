"""The audit's outputs: ``privacy.json``, a table (``privacy.md``), the reconstructions as a PNG grid, and
across runs that differ in their style defence, the accuracy/leakage trade-off plot.

Every number is the receiver's: reconstruction PSNR / SSIM and the classifier's accuracy on the
reconstructions beside the same scores of an uninformed guess (public images of the sender's
domain), membership AUC (0.5 = nothing), attribute accuracy beside chance. The verdict line
compares each style payload with the weight update the sender already sends.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fedstyle.audit.playbook import SurfaceResult
from fedstyle.io import atomic_write

COLUMNS = (
    ("set", "images per payload", "set_size", "{:.0f}"),
    ("PSNR", "reconstruction PSNR (dB), best-matching sender image", "recon_psnr", "{:.1f}"),
    ("guess", "PSNR of a public image of the sender's domain, matched the same way", "guess_psnr", "{:.1f}"),
    ("SSIM", "reconstruction SSIM", "recon_ssim", "{:.2f}"),
    ("g.SSIM", "guess SSIM", "guess_ssim", "{:.2f}"),
    ("acc", "classifier accuracy on the reconstructions (matched image's label)", "recon_accuracy", "{:.2f}"),
    ("MIA", "membership AUC (0.5: no signal)", "membership_auc", "{:.2f}"),
    ("domain", "sender-domain accuracy / chance", "domain_accuracy", "{:.2f}"),
    ("class", "image class (per-image payloads) or the set's majority class / chance",
     "class_or_mix", "{:.2f}"),
)


def _value(result: SurfaceResult, key: str) -> float | None:
    if key == "set_size":
        return result.set_size
    if key == "class_or_mix":
        return result.scores.get("class_accuracy", result.scores.get("mix_majority_class_accuracy"))
    return result.scores.get(key)


def _chance(result: SurfaceResult, key: str) -> float | None:
    if key == "domain_accuracy":
        return result.scores.get("domain_chance")
    if key == "class_or_mix":
        return result.scores.get("class_chance", result.scores.get("mix_majority_chance"))
    return None


def verdict(result: SurfaceResult, baseline: SurfaceResult | None) -> str:
    """One sentence: does this payload let the receiver see more or less of the images than one weight
    update does? Gains are PSNR over the uninformed guess; an attack that does not beat the guess shows
    nothing, and the sentence says so rather than ranking two failures."""
    gain = result.scores.get("recon_psnr", float("nan")) - result.scores.get("guess_psnr", float("nan"))
    mia = result.scores.get("membership_auc")
    member = f"; membership AUC {mia:.2f}" if mia is not None else ""
    if baseline is None or result is baseline:
        return f"reconstruction {gain:+.1f} dB over a guess{member}"
    base = baseline.scores["recon_psnr"] - baseline.scores["guess_psnr"]
    against = f"one weight update of {baseline.set_size:.0f} image{'s' if baseline.set_size != 1 else ''}"
    if gain <= 0 and base <= 0:
        return (f"reconstruction {gain:+.1f} dB over a guess vs {base:+.1f} dB from {against}: neither lets this "
                f"attacker see the sender's images better than public images of its domain do{member}")
    word = "more" if gain > base else "less"
    return (f"reconstruction {gain:+.1f} dB over a guess vs {base:+.1f} dB from {against}: this payload shows "
            f"the receiver {word} of the images than the weights do{member}")


def table(report: dict[str, Any]) -> str:
    """Markdown table of one audited run plus its verdict lines."""
    results: list[SurfaceResult] = report["results"]
    head = "| payload | " + " | ".join(c[0] for c in COLUMNS) + " |"
    lines = [f"### {report['label']} — `{report['run']}` (round {report['round']}, {report['weights']} weights)", "",
             head, "|" + "---|" * (len(COLUMNS) + 1)]
    for r in results:
        cells = []
        for _, _, key, fmt in COLUMNS:
            value, chance = _value(r, key), _chance(r, key)
            cell = "—" if value is None else fmt.format(value)
            cells.append(cell + (f" / {chance:.2f}" if chance is not None and value is not None else ""))
        lines.append(f"| {r.kind} | " + " | ".join(cells) + " |")
    # the receiver's best weight-update attack (largest gain over its guess) is the scale
    baselines = sorted((r for r in results if r.method == "fedavg"),
                       key=lambda r: r.scores["recon_psnr"] - r.scores["guess_psnr"])
    lines.append("")
    for r in results:
        if r.method != "fedavg":
            lines.append(f"- {r.kind}: {verdict(r, baselines[-1] if baselines else None)}.")
        lines += [f"  - note: {note}" for note in r.notes]
    if any(report["defence"].get(k) for k in ("dp_clip", "dp_noise")):
        eps = report.get("epsilon")
        numbers = {k: v for k, v in report["defence"].items() if not isinstance(v, str)}
        source = report["defence"].get("dp_noise_source")
        where = {"os": "drawn from the OS CSPRNG (the receiver cannot regenerate it)",
                 "seeded": "seeded (reproducible; whoever knows the run's seed can subtract it)"}.get(source, "")
        lines.append("- defence: " + ", ".join(f"{k}={v:g}" for k, v in numbers.items())
                     + (f"; eps = {eps:.3g} per release (Gaussian mechanism)" if eps is not None else "; no noise: no eps")
                     + (f"; the run's noise was {where}; the audit replays it seeded" if where and eps is not None else ""))
    lines += ["", "Columns: " + "; ".join(f"{c[0]} = {c[1]}" for c in COLUMNS) + "."]
    return "\n".join(lines) + "\n"


def as_json(report: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in report.items() if k != "results"}
    out["results"] = [{"method": r.method, "payload": r.kind, "sender": r.sender, "set_size": r.set_size,
                       "scores": r.scores, "notes": r.notes} for r in report["results"]]
    return out


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
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110))
    plt.close(fig)
    return path


def save_tradeoff(reports: list[dict[str, Any]], path: Path) -> Path:
    """PNG: target accuracy against leakage (membership AUC, reconstruction gain over a guess) per run,
    each point labelled with its defence (noise multiplier, epsilon per release), one colour per method."""
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
            xs_gain.append(style.scores["recon_psnr"] - style.scores["guess_psnr"])
            ys.append(100 * float(accuracy))
            eps = r.get("epsilon")
            labels.append(f"z={r['defence'].get('dp_noise', 0):g}" + (f", ε={eps:.2g}" if eps else ""))
        for ax, xs in ((axes[0], xs_auc), (axes[1], xs_gain)):
            ax.plot(xs, ys, "o-", label=method)
            for x, y, text in zip(xs, ys, labels):
                ax.annotate(text, (x, y), fontsize=7, textcoords="offset points", xytext=(3, 3))
    axes[0].set_xlabel("membership AUC (0.5 = no leak)")
    axes[1].set_xlabel("reconstruction PSNR over a guess (dB)")
    for ax in axes:
        ax.set_ylabel("target accuracy (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("Accuracy vs leakage of shared styles under the Gaussian defence")
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110))
    plt.close(fig)
    return path


def write_outputs(reports: list[dict[str, Any]], out: Path) -> list[Path]:
    """privacy.json, privacy.md and reconstructions.png (one per run, numbered when several), plus
    tradeoff.png when the runs differ in their defence and one of them uses it."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    text = "".join(table(r) + "\n" for r in reports)
    data = json.dumps([as_json(r) for r in reports], indent=2, allow_nan=True)
    written.append(atomic_write(out / "privacy.json", lambda tmp: Path(tmp).write_text(data)))
    written.append(atomic_write(out / "privacy.md", lambda tmp: Path(tmp).write_text("# Privacy audit\n\n" + text)))
    for i, r in enumerate(reports):
        if not any(result.examples for result in r["results"]):
            continue  # nothing reconstructed (a weights-only method audited with --no-baseline)
        name = "reconstructions.png" if len(reports) == 1 else f"reconstructions-{i}-{r['method']}.png"
        written.append(save_grid(r, out / name))
    defended = any(r["defence"].get("dp_clip") or r["defence"].get("dp_noise") for r in reports)
    if defended and len({json.dumps(r["defence"], sort_keys=True) for r in reports}) > 1:
        written.append(save_tradeoff(reports, out / "tradeoff.png"))
    return written
