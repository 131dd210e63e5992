"""The audit's outputs: ``privacy.json``, a table (``privacy.md``), the reconstructions as a PNG grid, and
across runs that differ in their style defence, the accuracy/leakage trade-off plot (:mod:`fedstyle.audit.plots`).

Every number is the receiver's: reconstruction PSNR / SSIM and the classifier's accuracy on the
reconstructions beside the same scores of the best uninformed guess, the gain with a 95 % bootstrap
interval; membership AUC (0.5 = nothing); attribute accuracy with a Wilson interval beside chance, a class
only where one is defined. The verdict line compares each style payload with the weight update the sender
already sends; the weight update's line shows the loss its inversion reached beside the loss at the true
images; the defence line gives eps over every release the receiver sees.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from fedstyle.audit.canary import canary_line
from fedstyle.audit.playbook import SurfaceResult
from fedstyle.audit.plots import save_grid, save_tradeoff
from fedstyle.errors import ConfigError
from fedstyle.figures import pdf_beside
from fedstyle.io import atomic_write

COLUMNS = (
    ("set", "images per payload"),
    ("attack", "the reconstruction the receiver kept, by its loss (inversion from noise or retrieval of the nearest "
               "public images then inversion; k/n: retrieval for k of n senders)"),
    ("PSNR", "reconstruction PSNR (dB) against the image a row describes or the best-matching sender image"),
    ("guess", "PSNR of the best uninformed guess, matched the same way"),
    ("gain", "PSNR gain over the guess, [95 % bootstrap interval over senders and their images]"),
    ("SSIM", "reconstruction SSIM / the guess's"),
    ("acc", "classifier accuracy on the reconstructions (matched image's label) / on the guess"),
    ("MIA", "membership AUC (0.5: no signal)"),
    ("domain", "sender-domain accuracy [95 % Wilson interval] / chance"),
    ("class", "image class (per-image payloads) or the majority class of senders that have one / chance"),
)


def _number(value: float | None, fmt: str = "{:.2f}") -> str:
    return "—" if value is None or (isinstance(value, float) and math.isnan(value)) else fmt.format(value)


def _attack(scores: dict[str, float]) -> str:
    if "retrieval_share" not in scores:
        return "gradient"
    share, n = scores["retrieval_share"], int(scores.get("recon_victims", 1))
    return "retrieval" if share == 1 else "inversion" if share == 0 else f"retrieval {round(share * n)}/{n}"


def _class_cell(s: dict[str, float]) -> str:
    if "class_accuracy" in s:
        return f"{s['class_accuracy']:.2f} / {s['class_chance']:.2f}"
    if s.get("mix_majority_rows"):
        return f"{s['mix_majority_class_accuracy']:.2f} / {s['mix_majority_chance']:.2f}"
    return "—"


def cells(r: SurfaceResult) -> list[str]:
    """The table row of one result."""
    s = r.scores
    gain = (f"{s['psnr_gain']:+.1f} [{s['psnr_gain_lo']:+.1f}, {s['psnr_gain_hi']:+.1f}]"
            if "psnr_gain" in s else "—")
    domain = (f"{s['domain_accuracy']:.2f} [{s['domain_lo']:.2f}, {s['domain_hi']:.2f}] / {s['domain_chance']:.2f}"
              if "domain_accuracy" in s else "—")
    return [f"{r.set_size:.0f}", _attack(s), _number(s.get("recon_psnr"), "{:.1f}"),
            _number(s.get("guess_psnr"), "{:.1f}"), gain,
            f"{_number(s.get('recon_ssim'))} / {_number(s.get('guess_ssim'))}",
            f"{_number(s.get('recon_accuracy'))} / {_number(s.get('guess_accuracy'))}",
            _number(s.get("membership_auc")), domain, _class_cell(s)]


def _gain(scores: dict[str, float]) -> str:
    return (f"{scores['psnr_gain']:+.1f} dB [{scores['psnr_gain_lo']:+.1f}, {scores['psnr_gain_hi']:+.1f}] over "
            "a guess")


def verdict(result: SurfaceResult, baseline: SurfaceResult | None) -> str:
    """One sentence: does this payload let the receiver see more or less of the images than one weight
    update does? Gains are PSNR over the best uninformed guess; an attack that does not beat the guess shows
    nothing, and the sentence says so rather than ranking two failures."""
    gain = result.scores.get("psnr_gain", float("nan"))
    mia = result.scores.get("membership_auc")
    member = f"; membership AUC {mia:.2f}" if mia is not None else ""
    if baseline is None or result is baseline:
        return f"reconstruction {_gain(result.scores)}{member}"
    base = baseline.scores["psnr_gain"]
    against = f"one weight update of {baseline.set_size:.0f} image{'s' if baseline.set_size != 1 else ''}"
    if gain <= 0 and base <= 0:
        high = result.scores["psnr_gain_hi"]
        return (f"reconstruction {_gain(result.scores)} vs {base:+.1f} dB from {against}: neither lets this "
                f"attacker see the sender's images better than public images of its domain do"
                + (f" on average (the interval reaches {high:+.1f} dB)" if high > 0 else "") + member)
    word = "more" if gain > base else "less"
    return (f"reconstruction {_gain(result.scores)} vs {base:+.1f} dB from {against}: this payload shows "
            f"the receiver {word} of the images than the weights do{member}")


def weight_update_line(r: SurfaceResult) -> str:
    """The baseline's reconstruction beside its optimiser's state: loss reached vs loss at the true images."""
    s = r.scores
    stalled = _stalled(s)
    return (f"{r.kind}: reconstruction {_gain(s)}; gradient-matching loss reached {s['recon_loss']:.3g} vs "
            f"{s['truth_loss']:.3g} at the true images (labels {s['label_accuracy']:.2f} right)"
            + (": the optimiser stalled, so this row bounds what the update leaks from below, it does not show the "
               "update hides its images" if stalled else ""))


def _stalled(scores: dict[str, float]) -> bool:
    return scores["recon_loss"] > 10 * scores["truth_loss"] + 1e-3


def weights_only_verdict(method: str, best: SurfaceResult | None) -> str:
    """The verdict of a method that sends weights only: the weight update is all the receiver gets."""
    if best is None:
        return (f"- verdict: {method} sends weights only, so the weight update is all a receiver gets; the "
                "weight-update attack was skipped (--no-baseline), so this report measures nothing.")
    s = best.scores
    tail = (": its optimiser stalled, so read this as a lower bound on what the weights leak, not as privacy"
            if _stalled(s) else "")
    return (f"- verdict: {method} sends weights only, so the weight update is all a receiver gets: inverting "
            f"{best.kind} gives {_gain(s)}{tail}.")


def defence_line(report: dict[str, Any], results: list[SurfaceResult]) -> str:
    """The defence's settings, the receiver's eps (total, per release), the noise's source and the clip's origin."""
    numbers = {k: v for k, v in report["defence"].items() if not isinstance(v, str)}
    line = "- defence: " + ", ".join(f"{k}={v:g}" for k, v in numbers.items())
    eps, releases = report.get("epsilon"), report.get("releases", 1)
    if eps is None:
        line += "; no noise: no eps"
    else:
        over = f"over all {releases} releases of the sender with the most" if releases > 1 else "over its one release"
        line += (f"; eps = {eps:.3g} {over} (what the receiver holds; {report['epsilon_per_release']:.3g} per release; "
                 f"releases counted from {report.get('releases_from', 'the run')})")
        source = report["defence"].get("dp_noise_source")
        where = {"os": "drawn from the OS CSPRNG (the receiver cannot regenerate it)",
                 "seeded": "seeded (reproducible; whoever knows the run's seed can subtract it)"}.get(source)
        line += f"; the run's noise was {where}; the audit replays it seeded" if where else ""
    clip = next((r.scores for r in results if "public_clip" in r.scores), None)
    if clip is not None:
        line += (f"; C clips {100 * clip['public_clipped_share']:.0f} % of public contributions (C from public data, "
                 f"their median norm: {clip['public_clip']:.3g}, fedstyle.style.privacy.clip_from_public); if C was "
                 "tuned on the clients' own contribution norms, that choice is not accounted for in eps")
    return line


def table(report: dict[str, Any]) -> str:
    """Markdown table of one audited run plus its verdict lines."""
    results: list[SurfaceResult] = report["results"]
    if any("psnr_gain" not in r.scores for r in results):
        raise ConfigError(f"the audit of {report['run']} was made by an older fedstyle (no gains over the best guess); "
                          "delete its saved report and run fedstyle audit privacy again")
    lines = [f"### {report['label']} — `{report['run']}` (round {report['round']}, {report['weights']} weights)", "",
             "| payload | " + " | ".join(c[0] for c in COLUMNS) + " |", "|" + "---|" * (len(COLUMNS) + 1)]
    lines += [f"| {r.kind} | " + " | ".join(cells(r)) + " |" for r in results]
    # the receiver's best weight-update attack (largest gain over its guess) is the scale
    baselines = sorted((r for r in results if r.method == "fedavg"), key=lambda r: r.scores["psnr_gain"])
    styles = [r for r in results if r.method != "fedavg"]
    lines.append("")
    for r in styles:
        lines.append(f"- {r.kind}: {verdict(r, baselines[-1] if baselines else None)}.")
        lines += [f"  - note: {note}" for note in r.notes]
        if r.guess:
            lines.append(f"  - guess: {r.guess}" + ("" if "per-image" in r.kind or "spectrum" in r.kind else
                         " (uninformed: it uses nothing from the payload, but choosing the best of that many real "
                         "images makes it a strong baseline)"))
        if canary_line(r.scores):
            lines.append(f"  - {canary_line(r.scores)}")
        if r.scores.get("mix_majority_rows") == 0 and "class_accuracy" not in r.scores:
            lines.append("  - class: no sender has a single majority class (class-balanced): nothing to read")
    for r in baselines:
        lines.append(f"- {weight_update_line(r)}.")
    if not styles:
        lines.append(weights_only_verdict(report["method"], baselines[-1] if baselines else None))
    if any(report["defence"].get(k) for k in ("dp_clip", "dp_noise")):
        lines.append(defence_line(report, styles))
    lines += ["", "Columns: " + "; ".join(f"{c[0]} = {c[1]}" for c in COLUMNS) + "."]
    return "\n".join(lines) + "\n"


def as_json(report: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in report.items() if k != "results"}
    out["results"] = [{"method": r.method, "payload": r.kind, "sender": r.sender, "set_size": r.set_size,
                       "scores": r.scores, "notes": r.notes, "guess": r.guess} for r in report["results"]]
    return out


def write_outputs(reports: list[dict[str, Any]], out: Path) -> list[Path]:
    """privacy.json, privacy.md and reconstructions.png (one per run, numbered when several), plus
    tradeoff.png when the runs differ in their defence and one of them uses it; each figure with its PDF
    beside it."""
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
        written += [save_grid(r, out / name), pdf_beside(out / name)]
    defended = any(r["defence"].get("dp_clip") or r["defence"].get("dp_noise") for r in reports)
    if defended and len({json.dumps(r["defence"], sort_keys=True) for r in reports}) > 1:
        written += [save_tradeoff(reports, out / "tradeoff.png"), pdf_beside(out / "tradeoff.png")]
    return written
