"""Flags shared by every command that makes a run directory (``fedstyle run``, ``fedstyle deploy``,
``fedstyle deploy coordinator``): the run settings generated from :class:`RunConfig`, and the summary
they print."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path


def _flag(f: dataclasses.Field) -> str:
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def _add_config_flags(parser: argparse.ArgumentParser) -> None:
    from fedstyle.experiments.config import RunConfig

    group = parser.add_argument_group("run settings (also TOML keys of --config; flags override the file)")
    for f in dataclasses.fields(RunConfig):
        meta, annotation = f.metadata, str(f.type)
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        helptext = meta["help"] + ("" if default in (None, [], {}) else f" (default: {default})")
        kwargs = dict(dest=f.name, help=helptext, default=argparse.SUPPRESS)
        if meta.get("repeat"):
            kwargs.update(action="append", metavar={"hparams": "NAME=VALUE", "trackers": "NAME"}.get(f.name, "DOMAIN"))
        elif annotation.startswith("bool"):
            kwargs.update(action=argparse.BooleanOptionalAction)
        else:
            kwargs.update(type=int if "int" in annotation else float if "float" in annotation else str)
            if meta.get("choices"):
                kwargs["choices"] = meta["choices"]
        group.add_argument(_flag(f), **kwargs)


def add_run_flags(parser: argparse.ArgumentParser, resume_help: str, resume_accepts: tuple[str, ...] | None = None
                  ) -> None:
    """The options of every command that makes a run directory: --config, --out, --resume, --quiet, run settings.

    ``resume_accepts``: the run settings the command's --resume takes (default: ``fedstyle run``'s).
    """
    from fedstyle.experiments.rundir import RESUME_OPTIONS

    parser.add_argument("--config", metavar="FILE.toml", help="read settings from a TOML file ([hparams] table for --hp)")
    parser.add_argument("--out", metavar="DIR", help="run directory to create")
    accepts = RESUME_OPTIONS if resume_accepts is None else resume_accepts
    trackers = ("; --tracker adds trackers (a new one first logs the rounds done, also of a finished run), but a "
                "tracker that has logged goes on where it logs: one left out of --tracker, or given another "
                "--mlflow-uri / --tensorboard-dir, is refused (--restart ends the old tracker runs and starts new "
                "ones)" if "trackers" in accepts else "")
    parser.add_argument("--resume", metavar="DIR", help=resume_help + f"; besides DIR it accepts only "
                        f"{_resume_flags(accepts)}, which cannot change the result" + trackers)
    parser.add_argument("--restart", action="store_true",
                        help="with --resume: discard the run's progress and start it over from round 0 (same config; "
                        "its tracker runs are ended and new ones started)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar or messages (for CI and scripts)")
    _add_config_flags(parser)


def check_resume_flags(args: argparse.Namespace, accepted: tuple[str, ...] | None = None) -> None:
    """--resume continues a run as configured: refuse every flag that would change it.

    ``accepted``: the run settings this command's resume takes (default: ``fedstyle run``'s,
    :data:`~fedstyle.experiments.rundir.RESUME_OPTIONS`); --quiet is always accepted.
    """
    from fedstyle.errors import ConfigError
    from fedstyle.experiments.config import RunConfig
    from fedstyle.experiments.rundir import RESUME_OPTIONS

    accepted = RESUME_OPTIONS if accepted is None else accepted
    given = [_flag(f) for f in dataclasses.fields(RunConfig) if hasattr(args, f.name) and f.name not in accepted]
    given += [f"--{name}" for name in ("config", "out") if getattr(args, name, None)]
    if given:
        flags = ", ".join(given)
        raise ConfigError(f"--resume continues a run exactly as configured and accepts only {_resume_flags(accepted)}; "
                          f"drop {flags} (or start a new run with --out)")


def _resume_flags(accepted) -> str:
    from fedstyle.experiments.config import RunConfig

    flags = {f.name: _flag(f) for f in dataclasses.fields(RunConfig)}
    names = [flags.get(name, "--" + name.replace("_", "-")) for name in accepted if name != "quiet"] + ["--quiet"]
    return ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else names[0]


def resume_settings(args: argparse.Namespace) -> dict:
    """The run settings given beside --resume (those of RESUME_OPTIONS), to change in the saved config."""
    from fedstyle.experiments.rundir import RESUME_OPTIONS

    return {name: getattr(args, name) for name in RESUME_OPTIONS if name != "quiet" and hasattr(args, name)}


def config_from_args(args: argparse.Namespace):
    """The RunConfig of ``--config FILE.toml`` (if given) overridden by the flags given; a preset variant
    named by --method (:func:`check_run_names`) brings its hyperparameters, below those of --hp."""
    from fedstyle.experiments.config import RunConfig

    config = RunConfig.from_toml(args.config) if args.config else RunConfig()
    changes = {name: getattr(args, name) for name in RunConfig.field_names() if hasattr(args, name)}
    variant_hparams = getattr(args, "variant_hparams", {})
    if "hparams" in changes or variant_hparams:
        from fedstyle.algorithms.hparams import parse_assignments  # imports every method, and torch

        changes["hparams"] = {**config.hparams, **variant_hparams, **parse_assignments(changes.get("hparams", []))}
    return config.updated(**changes)


def _toml_keys(path: str) -> set[str]:
    import tomllib

    return set(tomllib.loads(Path(path).read_text()))


def check_run_names(args: argparse.Namespace) -> None:
    """The names of a new run, checked against the catalog before torch is imported: --method (a method in any
    case, a preset's variant or a row label, :func:`fedstyle.cli.names.resolve_method`), --dataset, --target,
    --val-domain, --source, --backbone and the --hp names, each refused with "did you mean". --method is
    rewritten to the method's name; a variant's hyperparameters, settings and label fill what is not given."""
    from fedstyle.cli import catalog
    from fedstyle.cli.names import resolve_method
    from fedstyle.errors import ConfigError, UnknownNameError
    from fedstyle.experiments.config import RunConfig
    from fedstyle.registry import did_you_mean

    base = RunConfig.from_toml(args.config) if args.config else RunConfig()
    choice = resolve_method(getattr(args, "method", base.method))
    args.method = choice.method
    if choice.hparams:
        args.variant_hparams = choice.hparams
    in_file = _toml_keys(args.config) if args.config else set()
    for key, value in choice.settings.items():  # the variant's settings (e.g. its lr), below the flags and file
        if not hasattr(args, key) and key not in in_file:
            setattr(args, key, value)
    if choice.label and not hasattr(args, "label") and not base.label:
        args.label = choice.label

    def value(name):
        return getattr(args, name, getattr(base, name))

    known = catalog.load()
    dataset = value("dataset")
    if not dataset.startswith("hf:") and dataset not in known["datasets"]:
        raise UnknownNameError(f"unknown dataset {dataset!r}; {did_you_mean(dataset, known['datasets'])}choose one "
                               f"of: {', '.join(sorted(known['datasets']))}; or hf:OWNER/NAME (`fedstyle data list`)")
    domains = (known["datasets"].get(dataset) or {}).get("domains")
    named = [("--target", t) for t in value("targets")] + [(flag, value(name)) for flag, name in
                                                            (("--val-domain", "val_domain"), ("--source", "source"))
                                                            if value(name) is not None]
    for flag, domain in named if domains else []:
        if domain not in domains:
            raise ConfigError(f"{flag} {domain!r} is no domain of {dataset}; {did_you_mean(domain, domains)}"
                              f"its domains: {', '.join(domains)}")
    backbone = value("backbone")
    if backbone != "auto" and backbone not in known["backbones"]:
        raise UnknownNameError(f"unknown backbone {backbone!r}; {did_you_mean(backbone, known['backbones'])}choose "
                               f"one of: auto, {', '.join(known['backbones'])}")
    hparams = {h["name"] for h in known["methods"][choice.method]["hparams"]}
    given = [*base.hparams, *choice.hparams, *(item.partition("=")[0].strip() for item in getattr(args, "hparams", []))]
    for name in given:
        if name and name not in hparams:
            raise ConfigError(f"unknown hyperparameter {name!r} for method {choice.method!r}; "
                              f"{did_you_mean(name, hparams)}see `fedstyle methods {choice.method}`")


def fetch_pretrained_weights(config, quiet: bool = False) -> None:
    """``--download``: put the torchvision file ``--pretrained`` loads into the torch hub cache (its hash checked);
    the backbone ``auto`` picks is resolved on the dataset first. Nothing to fetch for EfficientNet-Lite0, whose
    weights ship with its package."""
    from fedstyle.errors import ConfigError
    from fedstyle.models.hub_weights import TORCHVISION_FILES, download_torchvision_weights

    if not config.pretrained or config.weights:
        raise ConfigError("--download fetches the weights --pretrained loads; add --pretrained, or drop --download"
                          + (" (--weights names the file already)" if config.weights else ""))
    backbone = config.backbone
    if backbone == "auto":
        from fedstyle.experiments.build import load_config_dataset, resolve_config

        backbone = resolve_config(config, load_config_dataset(config, progress=not quiet)).backbone
    if backbone in TORCHVISION_FILES:
        path = download_torchvision_weights(backbone, progress=not quiet)
        if not quiet:
            print(f"{backbone}: torchvision's ImageNet weights in {path}", file=sys.stderr)


def print_summary(summary: dict, out: Path) -> None:
    targets = ", ".join(
        f"{d} {100 * v['selected']:.1f}% (last {100 * v['last']:.1f}%)" for d, v in summary["targets"].items()
    )
    if summary["targets"]:
        print(f"{summary['label']} on {summary['dataset']}: {targets}")
    else:  # --protocol all: the model to deploy, trained on every domain
        val = summary.get("source_val", {}).get("selected")
        print(f"{summary['label']} on {summary['dataset']}: trained on every domain, none held out (--protocol all)"
              + (f"; source validation {100 * val:.1f}%" if val is not None else ""))
    print(f"  selection: {summary['selection_rule']}, round {summary['selected_round']} of {summary['rounds']}; "
          f"{summary['seconds']:.1f} s; {summary['bytes_up'] / 1e6:.1f} MB up, {summary['bytes_down'] / 1e6:.1f} MB down")
    if "device_target_acc_last" in summary:  # peer-to-peer: the devices' own models and their agreement
        devices = ", ".join(f"{d} {100 * v['mean']:.1f} ± {100 * v['std']:.1f}%"
                            for d, v in summary["device_target_acc_last"].items())
        print(f"  devices (last round, mean ± std): {devices}; consensus distance "
              f"{summary['consensus_distance_last']:.3g}" if devices else  # --protocol all: no target to show
              f"  consensus distance (last round): {summary['consensus_distance_last']:.3g}")
    edge = summary.get("traffic", {}).get("per_edge_iteration")
    if edge:
        print(f"  per edge and iteration: weights {edge['model_bytes']:,.0f} bytes, share "
              f"{edge['payload_bytes']:,.0f} bytes ({edge['payload_values']:,.0f} numbers, "
              f"{100 * edge['payload_fraction_of_model']:.3g}% of the weights); {edge['iterations']} iterations")
    print(f"  run directory: {out}")


def stop_on_sigterm() -> None:
    """SIGTERM (``kill``, a scheduler ending a job) stops a run like Ctrl-C: it says how to resume."""
    import signal

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
