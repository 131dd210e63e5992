"""``fedstyle audit privacy RUN_DIR``: play the receiver of a run's style payloads and score what leaks.

The run directory gives the configuration (``config.json``) and, when one exists, the checkpoint's
weights (a running or finished run; without a checkpoint the initial weights, and the report says
so). The experiment is rebuilt from the configuration, so the senders' images are the clients'
original training images (before any stylization) and the attacker's public data is the run's
source-validation split. Which payloads a method sends is :data:`SURFACES`; a method that sends only
weights is audited by the gradient-inversion baseline alone, which every report carries for scale.

``settings.canary`` = N > 0 adds a canary audit of every surface the style defence applies to (CCST,
StableFDG; defended or not; :mod:`fedstyle.audit.canary`): an empirical lower bound on eps from N releases with
and N without a planted canary, beside the analytic eps of the same release.

The headline eps is the receiver's: over every release of the sender that made the most
(:mod:`fedstyle.audit.accounting`), eps per release beside it; a sender's T > 1 noisy releases are also
attacked combined (their mean, :func:`fedstyle.audit.surfaces.averaged_surface`), as the receiver can.
"""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path
from typing import Any, Callable

import torch

from fedstyle.algorithms.fedccrl import EPS as FEDCCRL_EPS
from fedstyle.algorithms.fedccrl import upload_count
from fedstyle.algorithms.feddg_fft import BANK_FRACTION
from fedstyle.algorithms.style_exchange import style_privacy
from fedstyle.audit.accounting import public_clip_scores, receiver_epsilon, releases_per_sender
from fedstyle.audit.baseline import gradient_baseline
from fedstyle.audit.canary import audit_canary
from fedstyle.audit.playbook import AuditSettings, Public, SurfaceResult, Victim, attack_surface
from fedstyle.audit.surfaces import (Surface, amplitude_surface, averaged_surface, classifier_surface, encoder_surface,
                                     input_statistics_surface)
from fedstyle.errors import ConfigError
from fedstyle.experiments.build import Experiment, build_experiment
from fedstyle.experiments.checkpoint import CHECKPOINT, load_checkpoint
from fedstyle.experiments.rundir import CONFIG, DONE, METRICS, read_metrics_file, read_run_config, read_summary
from fedstyle.style.privacy import StylePrivacy
from fedstyle.federation.client import load_weights
from fedstyle.registry import Registry

#: method name -> ``factory(exp, normalize) -> [Surface]``: what the method sends beyond weights
SURFACES: Registry[Callable[[Experiment, Callable], list[Surface]]] = Registry("audited method")


def replayed_privacy(hp) -> StylePrivacy:
    """The run's defence as the audit replays its releases: the same clipping and noise level, the noise seeded
    (the audit is reproducible; an ``os`` run's actual noise is unknowable, and only its distribution matters
    to the attacks). The run's own source is reported beside (``defence_of``)."""
    return dataclasses.replace(style_privacy(hp), source="seeded")


@SURFACES.register("ccst")
def _ccst(exp: Experiment, normalize) -> list[Surface]:
    alg = exp.algorithm
    privacy, seed = replayed_privacy(alg.hp), exp.config.seed
    if alg.hp["style_type"] == "single":
        return [encoder_surface("ccst", alg, exp.device, "per-image style", alg.num_styles, privacy, seed)]
    limit = alg.hp.get("style_images", 0)
    return [encoder_surface("ccst", alg, exp.device, "dataset style", lambda n: limit if 0 < limit < n else n,
                            privacy, seed)]


@SURFACES.register("pardon")
def _pardon(exp: Experiment, normalize) -> list[Surface]:
    limit = exp.algorithm.hp.get("style_images", 0)
    return [encoder_surface("pardon", exp.algorithm, exp.device, "client style",
                            lambda n: limit if 0 < limit < n else n)]


@SURFACES.register("stablefdg")
def _stablefdg(exp: Experiment, normalize) -> list[Surface]:
    hp = exp.algorithm.hp
    if not hp["share"]:
        return []
    limit = hp["style_images"]
    return [classifier_surface("stablefdg", exp.model, [hp["share_stage"]], normalize, exp.device,
                               exp.config.resolution, "each sampled client, every round, to the server, which "
                               "relays it to another client", lambda n: limit if 0 < limit < n else n,
                               privacy=replayed_privacy(hp), seed=exp.config.seed)]


@SURFACES.register("styleddg")
def _styleddg(exp: Experiment, normalize) -> list[Surface]:
    alg = exp.algorithm
    return [classifier_surface("styleddg", exp.model, list(alg.stages), normalize, exp.device, exp.config.resolution,
                               "each device, every iteration, to each neighbour", lambda n: exp.config.batch_size,
                               batch_stats=alg.hp["share_stats"] == "train")]


@SURFACES.register("fedccrl")
def _fedccrl(exp: Experiment, normalize) -> list[Surface]:
    hp = exp.algorithm.hp
    return [input_statistics_surface("fedccrl", normalize, lambda n: upload_count(n, hp["upload_ratio"]), FEDCCRL_EPS,
                                     unbiased=hp["reference_code"])]


@SURFACES.register("feddg_fft")
def _feddg_fft(exp: Experiment, normalize) -> list[Surface]:
    size = exp.algorithm.hp["bank_size"]
    return [amplitude_surface(exp.device, lambda n: size or math.ceil(n / BANK_FRACTION))]


def _normalizer(exp: Experiment) -> Callable[[torch.Tensor], torch.Tensor]:
    mean = torch.tensor(exp.transform.mean, device=exp.device).view(1, 3, 1, 1)
    std = torch.tensor(exp.transform.std, device=exp.device).view(1, 3, 1, 1)
    return lambda x01: ((x01.to(exp.device) - mean) / std).contiguous(memory_format=torch.channels_last)


def _victims(exp: Experiment, limit: int, seed: int) -> list[Victim]:
    clients = [(i, c) for i, c in enumerate(exp.simulator.clients) if len(c) > 0]
    order = torch.randperm(len(clients), generator=torch.Generator().manual_seed(seed)).tolist()
    return [Victim(i, c.images.cpu(), c.labels.cpu(), int(torch.mode(c.domains.cpu()).values))
            for i, c in (clients[k] for k in sorted(order[:limit]))]


def _public(exp: Experiment) -> Public:
    sets = {exp.dataset.domains.index(d): s for d, s in exp.source_val.items() if len(s) >= 4}
    if not sets:
        raise ConfigError("the audit's attacker uses the run's source-validation images as its public data, and this "
                          "run has none; audit a run made with --val-fraction > 0 (the default 0.1)")
    return Public({d: s.images.cpu() for d, s in sets.items()}, {d: s.labels.cpu().long() for d, s in sets.items()},
                  exp.dataset.num_classes)


def audit_run(run_dir: str | Path, settings: AuditSettings | None = None, device: str | None = None,
              log: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """Audit one run directory: every surface of its method, then the weight-update baseline.

    Returns ``{"run", "method", "label", "round", "weights", "defence", "epsilon" (over every release of the
    sender with the most; None without noise), "epsilon_per_release", "releases", "releases_from", "summary",
    "results": [SurfaceResult]}``.
    """
    settings = settings or AuditSettings()
    run_dir = Path(run_dir)
    config = read_run_config(run_dir)
    if device is not None:
        config = config.updated(device=device)
    exp = build_experiment(config, progress=False)
    check_trained_weights(run_dir)
    checkpoint = load_checkpoint(run_dir)
    rounds = 0
    if checkpoint is not None:
        exp.simulator.load_state_tensors({k: v.to(exp.device) for k, v in checkpoint[0].items()})
        load_weights(exp.model, exp.simulator.eval_weights())
        rounds = int(checkpoint[1]["round"])
    exp.model.eval()
    normalize = _normalizer(exp)

    @torch.no_grad()
    def classify(x01: torch.Tensor) -> torch.Tensor:
        return torch.cat([exp.model(normalize(x01[s:s + 256])).argmax(1).cpu() for s in range(0, len(x01), 256)])

    public = _public(exp)
    victims = [v for v in _victims(exp, 30, settings.seed) if v.domain in public.images]
    if not victims:
        raise ConfigError("no sender's domain has public (source-validation) images for the attacker: give the run "
                          "a larger --val-fraction (each source domain needs at least 4 validation images)")
    surfaces = SURFACES.get(config.method)(exp, normalize) if config.method in SURFACES else []
    releases, counted_from = releases_per_sender(exp, read_metrics_file(run_dir / METRICS))
    accounting = receiver_epsilon(style_privacy(exp.algorithm.hp), releases)
    results: list[SurfaceResult] = []
    for surface in surfaces:
        log(f"{config.method}: attacking its {surface.kind} ({len(victims)} senders)")
        result = attack_surface(surface, victims, public, classify, settings)
        result.scores.update(public_clip_scores(surface, list(public.images.values())))
        results.append(result)
        combined = None
        if accounting["releases"] > 1 and surface.privacy is not None and surface.privacy.noise > 0:
            combined = averaged_surface(surface, accounting["releases"])
            log(f"{config.method}: attacking the {combined.kind}")
            results.append(attack_surface(combined, victims, public, classify, settings, attributes_too=False))
        for audited, scores in ((surface, result.scores), (combined, results[-1].scores)):
            if settings.canary and audited is not None and audited.privacy is not None:
                log(f"{config.method}: canary audit of the {audited.kind} ({settings.canary} releases per world)")
                scores.update(audit_canary(audited, victims[0].images, list(public.images.values()),
                                           settings.canary, settings.seed, progress=settings.progress))
    lr, wd = config.lr, config.weight_decay
    for batch in sorted({1, min(8, config.batch_size)}) if settings.baseline else ():
        log(f"{config.method}: gradient inversion of one local step, batch {batch}")
        results.append(gradient_baseline(exp.model, normalize, victims, public, classify, settings, batch=batch,
                                         lr=lr, weight_decay=wd))
    return {"run": str(run_dir), "method": config.method, "label": exp.label, "round": rounds,
            "weights": "checkpoint" if checkpoint is not None else "initial (no checkpoint yet)",
            "defence": defence_of(exp), **accounting, "releases_from": counted_from,
            "summary": read_summary(run_dir) or {}, "results": results}


def defence_of(exp: Experiment) -> dict[str, float | str]:
    """The run's style defence settings (``dp_*`` hyperparameters: the numbers, and ``dp_noise_source``), empty
    when the method has none."""
    return {k: (v if isinstance(v, str) else float(v)) for k, v in exp.algorithm.hp.items() if k.startswith("dp_")}


def check_trained_weights(run_dir: Path) -> None:
    """A finished run whose checkpoint is gone: the audit would attack the initial weights (with exit 0)."""
    if (run_dir / DONE).exists() and not (run_dir / CHECKPOINT).exists():
        raise ConfigError(f"{run_dir} is a finished run without its checkpoint ({CHECKPOINT}): the audit would attack "
                          "the initial weights, not the trained ones; restore the file, or run it again")


def check_report_folder(out: Path) -> None:
    """Refuse, before any attack runs (minutes), a report folder that cannot be made: a path that is a file,
    or one below a file or a folder this process may not write to."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file, not a folder: name a folder for the report (it is made if missing)")
    ancestor = out
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise ConfigError(f"--out {out}: {ancestor} is a file, so the report folder cannot be made there")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise ConfigError(f"--out {out}: {ancestor} is not writable; name a folder you can write to")


def check_canary_applies(run_dirs: list[str | Path]) -> None:
    """``--canary`` audits the style defence's releases (CCST's and StableFDG's payloads); refuse it, before any
    attack runs, for a run whose method has no such release (it used to be skipped without a word)."""
    from fedstyle.algorithms import METHODS

    for run_dir in run_dirs:
        method = read_run_config(Path(run_dir)).method
        if "dp_clip" not in {h.name for h in METHODS.get(method).declared_hparams()}:
            defended = ", ".join(n for n in METHODS if "dp_clip" in {h.name for h in METHODS.get(n).declared_hparams()})
            raise ConfigError(f"--canary audits the style payloads of {defended}; {run_dir} is a {method} run, which "
                              "releases none: drop --canary (or audit a run of one of those)")


def audit_privacy(run_dirs: list[str | Path], *, settings: AuditSettings | None = None, out: str | Path | None = None,
                  device: str | None = None, log: Callable[[str], None] = lambda _: None
                  ) -> tuple[list[Path], str]:
    """Audit every run directory and write the report to ``out`` (default: the single run's ``audit/``).

    Returns the files written and the report's text (the tables and verdicts of ``privacy.md``).
    """
    from fedstyle.audit.report import table, write_outputs

    if not run_dirs:
        raise ConfigError("give at least one run directory to audit")
    if out is None and len(run_dirs) > 1:
        raise ConfigError("several run directories need one output folder for their joint report (out=...)")
    # before the report folder (a file given as the run made "--out FILE/audit" the error) and before any attack
    for run_dir in map(Path, run_dirs):
        if not (run_dir / CONFIG).is_file():
            what = "a file" if run_dir.is_file() else f"a folder without {CONFIG}" if run_dir.is_dir() else "not there"
            raise ConfigError(f"{run_dir} is no run directory ({what}); give the folder `fedstyle run --out` wrote")
        check_trained_weights(run_dir)
    out = Path(out) if out is not None else Path(run_dirs[0]) / "audit"
    check_report_folder(out)
    if settings is not None and settings.canary:
        check_canary_applies(run_dirs)
    reports = [audit_run(run_dir, settings, device, log) for run_dir in run_dirs]
    written = write_outputs(reports, out)
    return written, "".join(table(r) + "\n" for r in reports)
