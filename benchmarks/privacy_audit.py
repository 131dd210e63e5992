"""Privacy audit benchmark (issue 24): what each method's shared styles leak, and the defence's price.

1. **Audit table**: FedAvg and the five style methods (CCST with per-image and with dataset styles,
   PARDON, StableFDG, StyleDDG on a ring, FedGCA, which shares no style), FedCCRL (per-image input
   statistics every round) and gPerXAN (weights only; issue 38) trained on digits4 (target mnistm) and
   fashion4 (target sketch), leave-one-domain-out, one client per source domain, then
   ``fedstyle audit privacy`` on each run directory. A method that sends weights only (none of its
   payloads in the audit's surfaces) gets the weight-update attack, the only thing it sends.
2. **Trade-off**: CCST (dataset style) and StableFDG with the Gaussian defence (``--hp dp_clip=C
   --hp dp_noise=Z``) at several noise multipliers; target accuracy against membership AUC and
   reconstruction gain, with the (eps, delta) of one release (``OUT/<dataset>/tradeoff.png``).

3. **The defence on per-image styles** (issue 36, ``--per-image-defence``): CCST ``style_type=single``
   undefended and with the defence (C the median contribution norm of public images,
   ``clip_from_public``) at ``--per-image-noises``, for each of ``--seeds``; each run audited with a canary
   audit of ``--canary`` releases per world (an empirical lower bound on eps beside the analytic one).
   Writes ``OUT/per_image.md`` and ``OUT/per_image.json``.
4. **Canaries in set styles** (issue 36, ``--canary-sets``): the canary audit alone (no training: the bound is
   about the release mechanism, which holds at any weights) of CCST's dataset style and StableFDG's Phi with
   the trade-off's C at ``--noises``, at the initial weights of ``--seeds``' first seed. Writes
   ``OUT/canary_sets.md``.

Every run is small (``--per-class``, rounds x local steps below) so that the whole benchmark fits a
2-core CPU in about an hour; the attacks see the same payloads a full run would send (the styles are
of the clients' data at the run's final weights). Finished runs and audits are reused.

    python benchmarks/privacy_audit.py [--out runs/privacy] [--datasets digits4 fashion4] [--seed 0]
    python benchmarks/privacy_audit.py --per-image-defence [--seeds 0 1 2] [--per-image-noises 0.25 1]
    python benchmarks/privacy_audit.py --canary-sets [--noises 1 4]
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from fedstyle.audit.canary import audit_canary
from fedstyle.audit.playbook import AuditSettings
from fedstyle.audit.report import table, write_outputs
from fedstyle.audit.run import SURFACES, _normalizer, audit_run
from fedstyle.experiments.build import build_experiment
from fedstyle.experiments.config import RunConfig
from fedstyle.experiments.runner import DONE, resume_experiment, run_experiment
from fedstyle.experiments.verdict import judge_paired
from fedstyle.style.privacy import clip_from_public

TARGETS = {"digits4": "mnistm", "fashion4": "sketch"}
#: name -> (method, hyperparameters, extra settings)
ROWS = {
    "fedavg": ("fedavg", {}, {}),
    "ccst-single": ("ccst", {"style_type": "single"}, {}),
    "ccst-overall": ("ccst", {"style_type": "overall"}, {}),
    "pardon": ("pardon", {}, {}),
    "stablefdg": ("stablefdg", {}, {}),
    "styleddg": ("styleddg", {}, {"topology": "ring"}),
    "fedgca": ("fedgca", {}, {"momentum": 0.0}),
    "fedccrl": ("fedccrl", {}, {}),
    "gperxan": ("gperxan", {}, {}),
}
#: the defence's clip C per method: about the median L2 norm of one image's contribution on digits4 (measured
#: 2026-11-25: StableFDG's [mu, mu^2, sigma, sigma^2] at layer1 after 2 rounds, 10/50/90 % quantiles 5-9 / 7-10 /
#: 8-16 over the three clients; CCST's lite-encoder moments 320-410 / 410-445 / 470-550), and the noise multipliers
CLIPS = {"ccst-overall": 450.0, "stablefdg": 10.0}
NOISES = (0.5, 2.0, 8.0)
#: issue 36: noise multipliers of the defence on CCST's per-image styles (C from public data)
PER_IMAGE_NOISES = (0.25, 1.0)


def base_config(dataset: str, seed: int, device: str) -> RunConfig:
    return RunConfig(dataset=dataset, targets=[TARGETS[dataset]], partition="per_domain", clients=3, per_class=60,
                     rounds=10, local_steps=20, batch_size=32, lr=0.05, seed=seed, device=device, eval_every=10)


def train(config: RunConfig, out: Path) -> Path:
    if (out / DONE).exists():
        return out
    if (out / "config.json").exists():  # interrupted: continue it
        resume_experiment(out, quiet=True)
    else:
        run_experiment(config, out, quiet=True)
    return out


def audit(run_dir: Path, settings: AuditSettings) -> dict:
    """The run's audit, kept in RUN_DIR/audit_report.pt (examples included) so a rerun reuses it."""
    saved = run_dir / "audit_report.pt"
    if saved.exists():
        return torch.load(saved, weights_only=False)
    print(f"auditing {run_dir}", flush=True)
    report = audit_run(run_dir, settings, log=lambda line: print("  " + line, flush=True))
    torch.save(report, saved)
    return report


def public_clip(config: RunConfig) -> float:
    """C for CCST's per-image styles from public data: the median L2 norm of [mu, sigma] of the style encoder's
    features over the run's source-validation images (the attacker's public data; never a client's image)."""
    exp = build_experiment(config, progress=False)
    surface = SURFACES.get("ccst")(exp, _normalizer(exp))[0]
    norms = torch.linalg.vector_norm(surface.image_vectors(torch.cat([v.images for v in exp.source_val.values()])),
                                     dim=1)
    return round(clip_from_public(norms, 0.5), 2)


def per_image_defence(args: argparse.Namespace, settings: AuditSettings) -> None:
    """Section 3 of the module docstring: one row per (dataset, noise, seed), then means over the seeds."""
    rows = []
    for dataset in args.datasets:
        for seed in args.seeds:
            base = base_config(dataset, seed, args.device).updated(method="ccst", hparams={"style_type": "single"})
            clip = public_clip(base)
            for z in [0.0, *args.per_image_noises]:
                hp = {"style_type": "single"} if z == 0 else {"style_type": "single", "dp_clip": clip, "dp_noise": z}
                name = "ccst-single" + (f"-z{z:g}" if z else "") + f"-s{seed}"
                run_dir = train(base.updated(hparams=hp), args.out / dataset / name)
                report = audit(run_dir, replace(settings, baseline=False, canary=args.canary))
                (run_dir / "audit.md").write_text(table(report))
                s = report["results"][0].scores
                rows.append({"dataset": dataset, "seed": seed, "noise": z, "clip": clip if z else None,
                             "accuracy": 100 * report["summary"]["target_avg"]["last"],
                             "membership_auc": s["membership_auc"], "psnr_gain": s["psnr_gain"],
                             "psnr_gain_lo": s["psnr_gain_lo"], "psnr_gain_hi": s["psnr_gain_hi"],
                             "ssim_gain": s["recon_ssim"] - s["guess_ssim"], "class": s.get("class_accuracy"),
                             "class_chance": s.get("class_chance"), "domain": s.get("domain_accuracy"),
                             "domain_chance": s.get("domain_chance"), "epsilon": report["epsilon"],
                             **{k: s[k] for k in s if k.startswith("canary_")}})
                print(json.dumps(rows[-1]), flush=True)
    (args.out / "per_image.json").write_text(json.dumps(rows, indent=1))
    (args.out / "per_image.md").write_text(per_image_table(rows))
    print(per_image_table(rows))


def _eps(value) -> str:
    return "∞ (no noise)" if value is None or value == float("inf") else f"{value:.3g}"


def _canary(r: dict) -> str:
    share = "" if r["canary_share"] != r["canary_share"] else f"; {r['canary_share']:.2f}"  # NaN: no clipping
    return f"{r['canary_epsilon_lb']:.2f} (≤ {r['canary_ceiling']:.2f}{share})"


def per_image_table(rows: list[dict]) -> str:
    """Per run, then per (dataset, noise) the means over seeds (accuracy with its standard deviation)."""
    lines = ["| dataset | z | C | seed | target acc. % | membership AUC | PSNR gain over the best guess (dB) [95 %] | "
             "SSIM gain | image class / domain acc. (chance) | ε analytic | ε empirical ≥ (canary; the trials' "
             "ceiling; share of 2C) |", "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for r in rows:
        probe = (f"{r['class']:.2f} ({r['class_chance']:.2f}) / {r['domain']:.2f} ({r['domain_chance']:.2f})"
                 if r["class"] is not None and r["domain"] is not None else "—")
        lines.append(f"| {r['dataset']} | {r['noise']:g} | {r['clip'] or '—'} | {r['seed']} | {r['accuracy']:.1f} | "
                     f"{r['membership_auc']:.2f} | {r['psnr_gain']:+.1f} [{r['psnr_gain_lo']:+.1f}, "
                     f"{r['psnr_gain_hi']:+.1f}] | {r['ssim_gain']:+.2f} | {probe} | {_eps(r['epsilon'])} | "
                     f"{_canary(r)} |")
    lines += ["", "| dataset | z | seeds | target acc. % (mean ± sd) | membership AUC | PSNR gain (dB) | domain acc. | "
              "ε analytic | ε empirical ≥ (per seed) |", "|---|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for key in dict.fromkeys((r["dataset"], r["noise"]) for r in rows):
        group = [r for r in rows if (r["dataset"], r["noise"]) == key]
        acc = np.array([r["accuracy"] for r in group])
        spread = f" ± {acc.std(ddof=1):.1f}" if len(acc) > 1 else ""
        bounds = ", ".join(f"{r['canary_epsilon_lb']:.2f}" for r in group)
        lines.append(f"| {key[0]} | {key[1]:g} | {len(group)} | {acc.mean():.1f}{spread} | "
                     f"{np.mean([r['membership_auc'] for r in group]):.2f} | "
                     f"{np.mean([r['psnr_gain'] for r in group]):+.1f} | "
                     f"{np.mean([r['domain'] for r in group]):.2f} | {_eps(group[0]['epsilon'])} | {bounds} |")
    return "\n".join(lines + ["", *accuracy_cost(rows)]) + "\n"


def accuracy_cost(rows: list[dict]) -> list[str]:
    """The claim "undefended > defended at z" on target accuracy, read by fedstyle's rule (paired seeds per
    dataset -> target cell, :func:`~fedstyle.experiments.verdict.judge_paired`), per dataset and over both."""
    def accuracies(z: float, datasets: list[str]) -> dict[tuple[str, int], float]:
        return {(f"{r['dataset']} -> {TARGETS[r['dataset']]}", r["seed"]): r["accuracy"] for r in rows
                if r["noise"] == z and r["dataset"] in datasets}

    lines = []
    datasets = list(dict.fromkeys(r["dataset"] for r in rows))
    for z in sorted({r["noise"] for r in rows} - {0.0}):
        for scope in ([[d] for d in datasets] + ([datasets] if len(datasets) > 1 else [])):
            verdict = judge_paired(accuracies(0.0, scope), accuracies(z, scope))
            lines.append(f"- accuracy, undefended > z = {z:g} ({' + '.join(scope)}): {verdict.status}, "
                         f"{verdict.text()}")
    return lines


def canary_sets(args: argparse.Namespace) -> None:
    """Section 4 of the module docstring: one canary audit per (dataset, method, noise)."""
    lines = ["| dataset | payload | C | z | ε analytic | ε empirical ≥ | TPR / FPR | the trials' ceiling | share of 2C | "
             "statistic | separation on the means, measured / claimed | seconds |", "|---|---|--:|--:|--:|--:|--:|--:|--:|---|--:|--:|"]
    for dataset in args.datasets:
        base = base_config(dataset, args.seeds[0], args.device)
        for name in ("ccst-overall", "stablefdg"):
            method, hp, extra = ROWS[name]
            for z in args.noises:
                config = base.updated(method=method, hparams=dict(hp, dp_clip=CLIPS[name], dp_noise=z), **extra)
                exp = build_experiment(config, progress=False)
                exp.model.eval()
                surface = SURFACES.get(method)(exp, _normalizer(exp))[0]
                start = time.perf_counter()
                s = audit_canary(surface, exp.simulator.clients[0].images, [v.images for v in exp.source_val.values()],
                                 args.canary, args.seed)
                lines.append(f"| {dataset} | {name} {surface.kind} | {CLIPS[name]:g} | {z:g} | {s['canary_epsilon']:.3g} "
                             f"| {s['canary_epsilon_lb']:.2f} | {s['canary_tpr']:.3f} / {s['canary_fpr']:.3f} | "
                             f"{s['canary_ceiling']:.2f} | {s['canary_share']:.2f} | "
                             f"{'means only' if s['canary_linear'] else 'every moment'} | "
                             f"{s['canary_linear_separation']:.2f} / {s['canary_expected_separation']:.2f} | "
                             f"{time.perf_counter() - start:.0f} |")
                print(lines[-1], flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "canary_sets.md").write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("runs/privacy"))
    parser.add_argument("--datasets", nargs="+", default=list(TARGETS), choices=list(TARGETS))
    parser.add_argument("--rows", nargs="+", default=list(ROWS), choices=list(ROWS))
    parser.add_argument("--no-tradeoff", action="store_true", help="only the audit table")
    parser.add_argument("--noises", type=float, nargs="+", default=list(NOISES), help="noise multipliers z")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=200, help="inversion steps")
    parser.add_argument("--victims", type=int, default=3)
    parser.add_argument("--shadow-sets", type=int, default=24, help="shadow payloads per domain (attribute probes)")
    parser.add_argument("--per-image-defence", action="store_true", help="issue 36: only CCST's per-image styles, "
                        "undefended and defended at --per-image-noises, for --seeds, with a canary audit")
    parser.add_argument("--per-image-noises", type=float, nargs="+", default=list(PER_IMAGE_NOISES))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="with --per-image-defence")
    parser.add_argument("--canary", type=int, default=1000, help="with --per-image-defence and --canary-sets: canary "
                        "releases per world")
    parser.add_argument("--canary-sets", action="store_true", help="issue 36: only the canary audit of CCST's dataset "
                        "style and StableFDG's Phi at --noises (no training)")
    args = parser.parse_args()
    settings = AuditSettings(victims=args.victims, steps=args.steps, candidates=6, seed=args.seed,
                             shadow_sets=args.shadow_sets)
    if args.per_image_defence:
        per_image_defence(args, settings)
        return
    if args.canary_sets:
        canary_sets(args)
        return
    for dataset in args.datasets:
        base = base_config(dataset, args.seed, args.device)
        reports = []
        for name in args.rows:
            method, hp, extra = ROWS[name]
            run_dir = train(base.updated(method=method, hparams=hp, **extra), args.out / dataset / name)
            # the weight-update inversion only for the rows that send weights alone (FedAvg, FedGCA, gPerXAN): it is
            # the same attack on every run, all such a row's verdict can rest on, and the style rows' verdicts are
            # read against the FedAvg row's
            reports.append(audit(run_dir, replace(settings, baseline=method not in SURFACES)))
        write_outputs(reports, args.out / dataset / "audit")
        (args.out / dataset / "audit" / "table.md").write_text("".join(table(r) + "\n" for r in reports))
        if args.no_tradeoff:
            continue
        curves = []
        for name, clip in CLIPS.items():
            method, hp, extra = ROWS[name]
            curves += [reports[list(args.rows).index(name)]] if name in args.rows else []
            for z in args.noises:
                dp = dict(hp, dp_clip=clip, dp_noise=z)
                run_dir = train(base.updated(method=method, hparams=dp, **extra), args.out / dataset / f"{name}-z{z:g}")
                curves.append(audit(run_dir, replace(settings, baseline=False)))  # the plot needs no baseline
        write_outputs(curves, args.out / dataset / "tradeoff")
        (args.out / dataset / "tradeoff" / "table.md").write_text("".join(table(r) + "\n" for r in curves))
        print(json.dumps({"done": dataset}), flush=True)


if __name__ == "__main__":
    main()
