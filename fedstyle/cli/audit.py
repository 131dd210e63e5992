"""``fedstyle audit privacy RUN_DIR...``: how much a run's shared styles leak, beside its weight updates."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

PRIVACY_DESCRIPTION = """\
Play an honest-but-curious receiver of each run's style payloads and measure what it learns about
the senders' images: it inverts the shared statistics back to images, from noise and from the
nearest public images (PSNR, SSIM, the classifier's accuracy on them, each beside the best uninformed
guess: the domain's mean public image or the best of a few public images; gains with 95 % bootstrap
intervals), tells members of the style's image set from non-members (AUC), and infers the sender's
domain and class mix (accuracy with a Wilson interval beside chance). For scale every report also
inverts one plain weight update (gradient inversion of one local SGD step, the loss it reached beside
the loss at the true images): the verdict line says whether a payload shows more or less of the
images than the weights the sender already sends.

The run may be finished or still running (its last checkpoint is used). The attacker's public data is the
run's source-validation split. What each method sends: CCST per-image or dataset styles of a style
encoder, PARDON its client style, StableFDG its dataset style at a classifier stage every round, StyleDDG
a batch style at several stages every iteration, FedDG amplitude spectra, FedCCRL per-image input
statistics every round; other methods send only weights and get the baseline rows. Runs trained with the
style defence (--hp dp_clip=C --hp dp_noise=Z, CCST and StableFDG) are audited with it: the report's eps
is over every release of the sender that made the most (StableFDG: one each round it was sampled), eps per
release beside it, and a sender's releases are also attacked averaged; several such runs of one method
also give OUT/tradeoff.png (target accuracy against leakage). --canary N adds a canary audit of CCST's and
StableFDG's payloads (Jagielski et al. 2020): N releases with a planted canary at the clipping norm and N
without, the receiver's best test on them, and an empirical lower bound on eps (Clopper-Pearson, 95 %)
beside the analytic eps of the same release."""

PRIVACY_EPILOG = """\
examples:
  fedstyle audit privacy runs/ccst                      # writes runs/ccst/audit/
  fedstyle audit privacy runs/sfdg-z0 runs/sfdg-z1 --out audits/sfdg    # and tradeoff.png
  fedstyle audit privacy runs/ccst --victims 8 --steps 400              # slower, stronger attacker
  fedstyle audit privacy runs/ccst-z1 --canary 1000                     # and an empirical eps

outputs (OUT, default RUN_DIR/audit): privacy.md (table and verdicts), privacy.json (every score),
reconstructions.png (true images above their reconstructions), tradeoff.png (several runs)."""


def _cmd_audit_privacy(args: argparse.Namespace) -> int:
    from fedstyle.audit.playbook import AuditSettings
    from fedstyle.audit.run import audit_privacy
    from fedstyle.errors import ConfigError

    if args.out is None and len(args.run_dirs) > 1:
        raise ConfigError("several run directories need one --out folder for their joint report (e.g. --out audits/x)")
    for name in ("victims", "candidates", "steps", "shadow_sets", "restarts"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    from fedstyle.audit.canary import MAX_TRIALS

    if args.canary and not 8 <= args.canary <= MAX_TRIALS:
        raise ConfigError(f"--canary must be 0 (off) or 8 to {MAX_TRIALS:,} releases per world (a few hundred bound "
                          f"eps; the bound's ceiling grows only with log N), got {args.canary}")
    settings = AuditSettings(victims=args.victims, candidates=args.candidates, steps=args.steps,
                             shadow_sets=args.shadow_sets, seed=args.seed, baseline=not args.no_baseline,
                             restarts=args.restarts, canary=args.canary, progress=not args.quiet)
    log = (lambda _: None) if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True))
    written, text = audit_privacy(args.run_dirs, settings=settings, out=args.out, device=args.device, log=log)
    print(text, end="")
    for path in written:
        log(f"wrote {path}")
    return 0


def add_audit_command(sub: argparse._SubParsersAction) -> None:
    audit = sub.add_parser("audit", help="audit a run: what its shared styles leak (fedstyle audit privacy RUN_DIR)")
    audit_sub = audit.add_subparsers(dest="audit_command", required=True, metavar="{privacy}")
    privacy = audit_sub.add_parser("privacy", help="reconstruction, membership and attribute attacks on a run's "
                                   "style payloads, beside gradient inversion of its weight updates",
                                   description=PRIVACY_DESCRIPTION, epilog=PRIVACY_EPILOG,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    privacy.add_argument("run_dirs", nargs="+", type=Path, metavar="RUN_DIR",
                         help="run directories (fedstyle run --out)")
    privacy.add_argument("--out", type=Path, default=None, help="report folder (default RUN_DIR/audit; required "
                         "for several runs)")
    privacy.add_argument("--victims", type=int, default=4, help="senders whose payloads are inverted (default 4; "
                         "membership and attribute attacks use up to 30)")
    privacy.add_argument("--candidates", type=int, default=8, help="images reconstructed per sender (default 8)")
    privacy.add_argument("--steps", type=int, default=200, help="optimisation steps per inversion (default 200)")
    privacy.add_argument("--shadow-sets", type=int, default=24, help="shadow payloads per domain that train the "
                         "attribute probes (default 24)")
    privacy.add_argument("--restarts", type=int, default=1, help="random starts of the weight-update inversion, "
                         "the lowest loss kept (default 1; the report shows the loss reached beside the loss at the "
                         "true images)")
    privacy.add_argument("--no-baseline", action="store_true", help="skip the weight-update inversion (faster; "
                         "the verdict lines then have nothing to compare with)")
    privacy.add_argument("--canary", type=int, default=0, metavar="N", help="canary audit of CCST's and StableFDG's "
                         "payloads: N releases with and N without a canary, an empirical lower bound on eps beside "
                         "the analytic one (default 0: off; 1000 bounds eps up to about 4.9)")
    privacy.add_argument("--seed", type=int, default=0, help="the attacker's random draws")
    privacy.add_argument("--device", default=None, help="cpu, cuda, auto (default: the run's --device)")
    privacy.add_argument("--quiet", action="store_true", help="print only the table")
    privacy.set_defaults(func=_cmd_audit_privacy)
