"""Privacy audit benchmark (issue 24): what each method's shared styles leak, and the defence's price.

1. **Audit table**: FedAvg and the five style methods (CCST with per-image and with dataset styles,
   PARDON, StableFDG, StyleDDG on a ring, FedGCA, which shares no style) trained on digits4 (target
   mnistm) and fashion4 (target sketch), leave-one-domain-out, one client per source domain, then
   ``fedstyle audit privacy`` on each run directory.
2. **Trade-off**: CCST (dataset style) and StableFDG with the Gaussian defence (``--hp dp_clip=C
   --hp dp_noise=Z``) at several noise multipliers; target accuracy against membership AUC and
   reconstruction gain, with the (eps, delta) of one release (``OUT/<dataset>/tradeoff.png``).

Every run is small (``--per-class``, rounds x local steps below) so that the whole benchmark fits a
2-core CPU in about an hour; the attacks see the same payloads a full run would send (the styles are
of the clients' data at the run's final weights). Finished runs and audits are reused.

    python benchmarks/privacy_audit.py [--out runs/privacy] [--datasets digits4 fashion4] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import torch

from fedstyle.audit.playbook import AuditSettings
from fedstyle.audit.report import table, write_outputs
from fedstyle.audit.run import audit_run
from fedstyle.experiments.config import RunConfig
from fedstyle.experiments.runner import DONE, resume_experiment, run_experiment

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
}
#: the defence's clip C per method: about the median L2 norm of one image's contribution on digits4 (measured
#: 2026-11-25: StableFDG's [mu, mu^2, sigma, sigma^2] at layer1 after 2 rounds, 10/50/90 % quantiles 5-9 / 7-10 /
#: 8-16 over the three clients; CCST's lite-encoder moments 320-410 / 410-445 / 470-550), and the noise multipliers
CLIPS = {"ccst-overall": 450.0, "stablefdg": 10.0}
NOISES = (0.5, 2.0, 8.0)


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
    args = parser.parse_args()
    settings = AuditSettings(victims=args.victims, steps=args.steps, candidates=6, seed=args.seed,
                             shadow_sets=args.shadow_sets)
    for dataset in args.datasets:
        base = base_config(dataset, args.seed, args.device)
        reports = []
        for name in args.rows:
            method, hp, extra = ROWS[name]
            run_dir = train(base.updated(method=method, hparams=hp, **extra), args.out / dataset / name)
            # the weight-update inversion once per dataset (the FedAvg and FedGCA rows): it is the same attack on
            # every run, and the style rows' verdicts are read against the FedAvg row's
            reports.append(audit(run_dir, replace(settings, baseline=name in ("fedavg", "fedgca"))))
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
