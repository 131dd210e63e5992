"""``fedstyle deploy``: run a method on a real Flower federation (SuperLink + SuperNodes as processes)."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

from fedstyle.cli.flags import add_run_flags, check_resume_flags, check_run_names, config_from_args, print_summary

DEPLOY_DESCRIPTION = """\
Run a star-topology method on a real Flower federation: a SuperLink (the coordinator) and one
SuperNode per site, each holding one client of the partition, talking over TLS. The run directory
is the simulator's (config.json, partition.json, metrics.jsonl, checkpoint, summary.json, done) plus
flower/ with the Flower logs. Needs: pip install -c constraints.txt 'fedstyle[flower]'.

Fault policy: a round starts once --min-sites sites are connected (default 1); sampled sites that
are gone, fail or do not reply drop out of that round, which is aggregated from the others; every
dropout is logged in metrics.jsonl ({"event": "dropout", ...}). A restarted site rejoins at the
next round. If the coordinator stops, `fedstyle deploy --resume OUT` continues from the last checkpoint.
Each site keeps its client's persistent state (FedDyn's, FedBN's local layers) on disk, versioned by
round, so a restarted site and a resumed coordinator continue exactly.

Every process a deployment starts stops with it, also when it is killed outright (kill -9, the OOM
killer; Linux); a resume refuses while any process of the earlier federation is alive. A deployment
that fails before its first checkpoint (a port in use, sites that never join) leaves nothing in OUT.
"""

DEPLOY_EPILOG = """\
examples:
  # try it on one machine: certificates, then 3 sites as local processes (free ports on 127.0.0.1)
  fedstyle deploy certs --out certs --sites 3
  fedstyle deploy --sites 3 --certs certs --method fedavg --dataset digits4 --target mnist \\
      --partition per_domain --clients 3 --rounds 5 --out runs/dep
  # the same without TLS (only on a trusted machine or network)
  fedstyle deploy --sites 3 --insecure --clients 3 --partition per_domain --target mnist --out runs/dep2
  # continue after a coordinator crash / Ctrl-C
  fedstyle deploy --resume runs/dep

across machines:
  # coordinator (host coord.example.org); certificate for that name, one key pair per site
  fedstyle deploy certs --out certs --host coord.example.org --sites 3
  fedstyle deploy coordinator --certs certs --host 0.0.0.0 --port 9093 --sites 3 \\
      --method fedavg --dataset digits4 --target mnist --partition per_domain --clients 3 --out runs/x
  # each site K (copy certs/ca.crt there; with --node-auth also certs/site-K.key)
  fedstyle deploy site --superlink coord.example.org:9093 --root-certificates ca.crt --partition-id K \\
      [--data-root /data/digits] [--auth-key site-K.key]
"""


#: the federation flags' defaults; the flags themselves default to "not given" (argparse.SUPPRESS), so that a
#: --resume can tell a flag given from one left alone
FEDERATION_DEFAULTS = {"sites": 0, "certs": None, "insecure": False, "node_auth": False, "min_sites": 1,
                       "wait_timeout": 600.0, "round_timeout": 1800.0, "site_data_root": [], "host": "0.0.0.0",
                       "port": 9093}
#: what --resume changes in flower/deploy.json: how to reach and wait for the sites, never who takes part or
#: how the traffic is protected (new certificates after a leaked CA is retired, a moved coordinator or dataset)
RESUME_CHANGES = ("certs", "wait_timeout", "round_timeout", "site_data_root", "host", "port")
#: what --resume refuses: each would change the federation the run was checkpointed on
RESUME_REFUSES = ("sites", "insecure", "node_auth", "min_sites")


def _settings_flags(parser: argparse.ArgumentParser, *, local: bool) -> None:
    group = parser.add_argument_group("federation")
    given = argparse.SUPPRESS
    group.add_argument("--sites", type=int, default=given, help="number of sites (SuperNodes); one client per site, so it must "
                       "equal the partition's number of clients")
    group.add_argument("--certs", metavar="DIR", default=given,
                       help="folder from `fedstyle deploy certs` (TLS is on by default); with --resume: new certificates")
    group.add_argument("--insecure", action="store_true", default=given,
                       help="no TLS: traffic unencrypted (trusted networks only)")
    group.add_argument("--node-auth", action="store_true", default=given,
                       help="Flower SuperNode authentication: only sites whose public key is registered "
                       "(certs/site-K.pub, registered automatically) may join; each site signs with certs/site-K.key")
    group.add_argument("--min-sites", type=int, default=given,
                       help="sites that must be connected for a round to start, and must reply for it to count (default: 1)")
    group.add_argument("--wait-timeout", type=float, default=given,
                       help="seconds to wait for --min-sites sites before giving up (default: 600)")
    group.add_argument("--round-timeout", type=float, default=given,
                       help="seconds a site may take to answer one message before it drops out of the round (default: 1800)")
    if local:
        group.add_argument("--site-data-root", action="append", metavar="DIR", default=given,
                           help="data folder of site K (repeat in site order); default: the coordinator's --data-root")
    else:
        group.add_argument("--host", default=given, help="address the SuperLink listens on (default: 0.0.0.0)")
        group.add_argument("--port", type=int, default=given, help="SuperLink port for sites and the run (default: 9093)")


def _federation_flag(args, name: str):
    """A federation flag's value, or its default when it was not given."""
    return getattr(args, name, FEDERATION_DEFAULTS[name])


def add_deploy_command(sub) -> None:

    deploy = sub.add_parser("deploy", help="run on a real Flower federation (local processes or across machines)",
                            description=DEPLOY_DESCRIPTION, epilog=DEPLOY_EPILOG,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    _settings_flags(deploy, local=True)
    add_run_flags(deploy, resume_help="restart the federation of DIR and continue from its checkpoint",
                  resume_accepts=())
    deploy.set_defaults(func=_cmd_deploy)
    actions = deploy.add_subparsers(dest="deploy_command", metavar="ACTION")

    certs = actions.add_parser("certs", help="make a CA, a SuperLink certificate and site key pairs (tests, trials)",
                               description="Write ca.crt/ca.key, server.crt/server.key (SANs: localhost, 127.0.0.1 and "
                               "every --host) and site-K.key/site-K.pub for --sites sites (node authentication).")
    certs.add_argument("--out", required=True, metavar="DIR", help="folder to write (files are never overwritten)")
    certs.add_argument("--host", action="append", default=[], help="extra host name or IP of the SuperLink (repeatable)")
    certs.add_argument("--sites", type=int, default=0, help="SuperNode key pairs to make (default: 0)")
    certs.set_defaults(func=_cmd_certs)

    coord = actions.add_parser("coordinator", help="the SuperLink and the run; sites join from their machines",
                               description="Start the SuperLink on --host:--port, submit the run and wait for it; sites "
                               "join with `fedstyle deploy site`. Stops the SuperLink at the end.",
                               epilog=DEPLOY_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    _settings_flags(coord, local=False)
    add_run_flags(coord, resume_help="continue the run in DIR", resume_accepts=())
    coord.set_defaults(func=_cmd_coordinator)

    site = actions.add_parser("site", help="one site: a SuperNode holding one client, in the foreground",
                              description="Start this site's SuperNode (flower-supernode) connected to the coordinator's "
                              "SuperLink; it runs the ClientApp for every message, each in a process forked from the site's own, "
                              "which imported torch and fedstyle once (FEDSTYLE_COLD_SITES=1: a fresh flwr-clientapp "
                              "process each, Flower's default), until stopped (Ctrl-C).")
    site.add_argument("--superlink", required=True, metavar="HOST:PORT", help="the coordinator's SuperLink address")
    site.add_argument("--partition-id", type=int, required=True, metavar="K", help="which client of the partition this site holds")
    site.add_argument("--root-certificates", metavar="CA.crt", help="the coordinator's CA certificate (TLS)")
    site.add_argument("--insecure", action="store_true", help="no TLS (only if the coordinator runs --insecure)")
    site.add_argument("--auth-key", metavar="site-K.key", help="this site's private key (coordinator runs --node-auth)")
    site.add_argument("--data-root", metavar="DIR", help="this site's copy of the dataset (default: the run's --data-root)")
    site.add_argument("--port", type=int, default=0, help="local port of the SuperNode's runtime API (default: free)")
    site.add_argument("--state-dir", metavar="DIR",
                      help="where this site keeps its client's persistent state between messages, restarts and "
                      "resumed runs (FedDyn's, FedBN's local layers; a folder per run and client, removable once "
                      "the run is done); default: $FEDSTYLE_SITE_STATE or the per-user state folder")
    floor = site.add_argument_group("this site's privacy settings (node config; no coordinator can change them; "
                                    "docs/privacy.md)")
    floor.add_argument("--min-noise", type=float, default=0.0, metavar="Z",
                       help="release defended styles with a noise multiplier of at least Z, whatever the run asks "
                       "(dp-min-noise; default 0: the run's)")
    floor.add_argument("--max-clip", type=float, default=0.0, metavar="C",
                       help="clip each image's contribution at C at most (dp-max-clip; default 0: the run's)")
    floor.add_argument("--max-epsilon", type=float, default=None, metavar="EPS",
                       help="refuse a release that takes this site's eps, over every run in its release ledger, past "
                       "EPS (dp-max-epsilon; default: no budget, the ledger still counts)")
    floor.add_argument("--budget-delta", type=float, default=1e-5, metavar="DELTA",
                       help="the delta of --max-epsilon (dp-budget-delta; default 1e-5)")
    site.set_defaults(func=_cmd_site)


def _settings(args, *, local: bool):
    from fedstyle.runtimes.flower.deployment import DeploySettings

    flag = lambda name: _federation_flag(args, name)  # noqa: E731
    certs = flag("certs")
    return DeploySettings(
        sites=flag("sites") or 0, insecure=flag("insecure"), certs=str(Path(certs).resolve()) if certs else None,
        node_auth=flag("node_auth"), host="127.0.0.1" if local else flag("host"), port=0 if local else flag("port"),
        min_sites=flag("min_sites"), wait_timeout=flag("wait_timeout"), round_timeout=flag("round_timeout"),
        # deploy.json is read again by --resume, perhaps from another folder: absolute paths only
        site_data_roots=[str(Path(d).resolve()) for d in flag("site_data_root") or []],
    )


def _resume_settings(args, out: Path):
    """flower/deploy.json of ``out`` with the flags --resume may change applied (checked, then saved), after
    refusing in one line the flags it may not change; the settings a resumed federation starts with."""
    import dataclasses

    from fedstyle.errors import ConfigError
    from fedstyle.runtimes.flower.deployment import load_settings, save_settings

    refused = [f"--{name.replace('_', '-')}" for name in RESUME_REFUSES if hasattr(args, name)]
    if refused:
        raise ConfigError(f"--resume continues the federation the run was checkpointed on: drop {', '.join(refused)} "
                          f"(it may change only {', '.join('--' + n.replace('_', '-') for n in RESUME_CHANGES)})")
    settings = load_settings(out)
    changes = {}
    if hasattr(args, "certs"):
        changes["certs"] = str(Path(args.certs).resolve())
    for name in ("wait_timeout", "round_timeout", "host", "port"):
        if hasattr(args, name):
            changes[name] = getattr(args, name)
    if hasattr(args, "site_data_root"):
        changes["site_data_roots"] = [str(Path(d).resolve()) for d in args.site_data_root]
    if settings.certs and not Path(settings.certs).is_absolute() and "certs" not in changes:
        if not Path(settings.certs).is_dir():  # deploy.json of an older fedstyle: --certs as typed
            raise ConfigError(f"{out}/flower/deploy.json names the certificates folder {settings.certs!r} relative to "
                              f"the folder the deployment was started from; resume from that folder, or give --certs DIR")
        changes["certs"] = str(Path(settings.certs).resolve())
    settings = dataclasses.replace(settings, **changes)
    settings.validate(resume=out)  # new certificates, or old ones expired since: checked before the federation starts
    if changes:
        save_settings(out, settings)
    return settings


def _new_run(args, settings):
    """Validate, then write the run directory (config.json, partition.json) like `fedstyle run`."""
    from fedstyle.errors import ConfigError
    from fedstyle.experiments.backends import refuse_peer_to_peer
    from fedstyle.experiments.build import deployment_noise
    from fedstyle.experiments.runner import start_run_dir
    from fedstyle.runtimes.flower import require_flower
    from fedstyle.runtimes.flower.deployment import save_settings

    require_flower("fedstyle deploy")
    if not args.out:
        raise ConfigError("give --out DIR for the run directory (or --resume DIR to continue one)")
    check_run_names(args)  # the naming scheme of `fedstyle run --method`, and its refusals
    # a style defence's noise from the OS CSPRNG: the coordinator knows the config and the seed
    config = deployment_noise(config_from_args(args))
    # the ServerApp and the sites run in other folders: paths in config.json must be absolute
    config = config.updated(**{k: str(Path(v).resolve()) for k in ("data_root", "weights")
                               if (v := getattr(config, k)) is not None})
    if config.backend != "sim":
        raise ConfigError("fedstyle deploy runs on Flower processes; drop --backend")
    if config.client_batching == "on":
        raise ConfigError("--client-batching on batches the clients one process trains; each site of a deployment "
                          "trains its one client in a process of its own: drop --client-batching")
    refuse_peer_to_peer(config, "fedstyle deploy")  # a coordinator and sites: star only
    settings.validate()
    out = Path(args.out)
    save_settings(out, settings)  # first: a directory with config.json but no deploy.json would resume on the simulator
    exp = start_run_dir(config, out, quiet=args.quiet)
    if len(exp.client_specs) != settings.sites:  # (what was written is removed by _new_locked)
        raise ConfigError(f"the partition has {len(exp.client_specs)} clients but --sites is {settings.sites}; "
                          f"each site holds one client: give --clients {settings.sites} (or --sites "
                          f"{len(exp.client_specs)})")
    return exp.config


def _resuming(args) -> Path:
    """The run directory a --resume names, after refusing flags that would change the run, and refusing
    while any process of its last federation is alive (a killed deploy's orphans hold its lock)."""
    from fedstyle.errors import ConfigError
    from fedstyle.experiments.rundir import read_run_config
    from fedstyle.runtimes.flower.processes import check_stopped

    if args.restart:
        raise ConfigError("--restart is `fedstyle run`'s; a deployment resumes from its checkpoint")
    check_resume_flags(args, accepted=())
    out = Path(args.resume)
    read_run_config(out, starter="fedstyle deploy")  # a clear error for a folder that holds no run
    check_stopped(out / "flower")
    return out


def _resume_locked(args, command) -> int:
    """Run ``command(args, lock)`` to continue the deployment in --resume DIR, holding its lock."""
    from fedstyle.io import DirectoryLock
    from fedstyle.runtimes.flower.processes import DeployError

    out = _resuming(args)
    with DirectoryLock(out) as lock:
        try:
            return command(args, lock)
        except DeployError as err:
            raise DeployError(f"{err}\ncontinue it with: fedstyle deploy --resume {out}") from None


def _new_locked(args, command) -> int:
    """Run ``command(args, lock)`` for a new deployment holding --out's lock.

    A deployment that fails before its first checkpoint (a port in use, a certificate the SuperLink
    refuses, sites that never joined) has nothing to resume: it leaves nothing behind (not even the
    folder, if it made it), so that the corrected command runs. An interrupted one stays resumable once
    its config.json is written, as does one that failed after a checkpoint."""
    from fedstyle.errors import ConfigError
    from fedstyle.experiments.checkpoint import CHECKPOINT
    from fedstyle.experiments.rundir import CONFIG, check_new_run_dir
    from fedstyle.experiments.runner import remove_new_run
    from fedstyle.io import DirectoryLock
    from fedstyle.runtimes.flower.processes import DeployError

    if not args.out:
        raise ConfigError("give --out DIR for the run directory (or --resume DIR to continue one)")
    out = Path(args.out)
    check_new_run_dir(out)
    created = not out.exists()
    lock = DirectoryLock(out).acquire()
    try:
        return command(args, lock)
    except BaseException as err:
        if (out / CHECKPOINT).exists():
            if isinstance(err, DeployError):
                raise DeployError(f"{err}\ncontinue it with: fedstyle deploy --resume {out}") from None
            raise
        if isinstance(err, KeyboardInterrupt) and (out / CONFIG).exists():
            raise  # interrupted: resumable (from round 0)
        remove_new_run(out, created)
        if isinstance(err, DeployError):  # its log went with the rest: quoted, never named
            raise DeployError(f"{err.without_log()}\nnothing was kept in {out}: run the same command again once "
                              "this is fixed") from None
        raise
    finally:
        lock.release()


def _cmd_deploy(args: argparse.Namespace) -> int:
    return _resume_locked(args, _deploy) if args.resume else _new_locked(args, _deploy)


def _deploy(args: argparse.Namespace, lock) -> int:
    from fedstyle.errors import ConfigError
    from fedstyle.experiments.runner import CONFIG, DONE, SUMMARY
    from fedstyle.runtimes.flower.deployment import deploy_run

    if args.resume:
        out = Path(args.resume)
        settings = _resume_settings(args, out)
        rounds = json.loads((out / CONFIG).read_text())["rounds"]
        if (out / DONE).exists():
            summary = json.loads((out / SUMMARY).read_text())
        else:
            try:
                summary = deploy_run(out, settings, quiet=args.quiet, rounds=rounds, lock=lock)
            except KeyboardInterrupt:
                print(f"\ninterrupted; continue with: fedstyle deploy --resume {out}", file=sys.stderr)
                raise
    else:
        if not _federation_flag(args, "sites"):
            raise ConfigError("give --sites N (one site per client), or an action: certs, coordinator, site")
        settings = _settings(args, local=True)
        config = _new_run(args, settings)
        out = Path(args.out)
        try:
            summary = deploy_run(out, settings, quiet=args.quiet, rounds=config.rounds, lock=lock)
        except KeyboardInterrupt:
            print(f"\ninterrupted; every Flower process is stopped; continue with: fedstyle deploy --resume {out}",
                  file=sys.stderr)
            raise
    print_summary(summary, out)
    print(f"  Flower logs: {out / 'flower'}")
    return 0


def _cmd_coordinator(args: argparse.Namespace) -> int:
    return _resume_locked(args, _coordinate) if args.resume else _new_locked(args, _coordinate)


def _coordinate(args: argparse.Namespace, lock) -> int:
    from fedstyle.errors import ConfigError
    from fedstyle.experiments.runner import CONFIG, SUMMARY
    from fedstyle.runtimes.flower.deployment import Federation

    if args.resume:
        out = Path(args.resume)
        settings = _resume_settings(args, out)
        rounds = json.loads((out / CONFIG).read_text())["rounds"]
    else:
        if not _federation_flag(args, "sites"):
            raise ConfigError("give --sites N: the number of sites (one client each) that will join")
        settings = _settings(args, local=False)
        rounds = _new_run(args, settings).rounds
        out = Path(args.out)
    with Federation(out, settings, quiet=args.quiet, lock=lock) as federation:
        federation.prepare()
        federation.start_superlink()
        if not args.quiet:
            tls = "--insecure" if settings.insecure else "--root-certificates ca.crt"
            print(f"SuperLink listening on {settings.host}:{federation.port}; start each site K with:\n"
                  f"  fedstyle deploy site --superlink <this host>:{federation.port} {tls} --partition-id K",
                  file=sys.stderr)
        federation.wait(federation.submit(), rounds)
    summary = json.loads((out / SUMMARY).read_text())
    print_summary(summary, out)
    return 0


def check_site_args(args: argparse.Namespace) -> None:
    """What Flower's SuperNode would take and fail on later, refused here: a negative --partition-id, a
    --superlink without HOST:PORT, a --root-certificates file that is not there."""
    from fedstyle.errors import ConfigError

    if args.partition_id < 0:
        raise ConfigError(f"--partition-id must be 0 or more (the site's client, 0 to sites - 1), got "
                          f"{args.partition_id}")
    host, sep, port = args.superlink.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"--superlink {args.superlink}: give HOST:PORT, the address the coordinator printed "
                          "(e.g. coord.example.org:9093)")
    if args.root_certificates and not Path(args.root_certificates).is_file():
        raise ConfigError(f"--root-certificates {args.root_certificates} is not a file; give the ca.crt that "
                          "`fedstyle deploy certs` wrote on the coordinator")


def check_certs_args(args: argparse.Namespace) -> None:
    """Refused before any key is written: a negative --sites, a --host that is no host name or address."""
    import re

    from fedstyle.errors import ConfigError

    if args.sites < 0:
        raise ConfigError(f"--sites must be 0 or more, got {args.sites}")
    for host in args.host:  # a DNS name (letters, digits, dots, hyphens), an IPv4 or an IPv6 address
        if not re.fullmatch(r"[A-Za-z0-9.-]+|[0-9A-Fa-f:.]+", host) or host.startswith(("-", ".")):
            raise ConfigError(f"--host {host!r} is no host name or IP address (e.g. coord.example.org or "
                              "10.0.0.5)")


def _cmd_certs(args: argparse.Namespace) -> int:
    from fedstyle.runtimes.flower.certs import make_certificates

    check_certs_args(args)
    for path in make_certificates(args.out, hosts=args.host, sites=args.sites):
        print(f"wrote {path}")
    return 0


def _cmd_site(args: argparse.Namespace) -> int:
    from fedstyle.errors import ConfigError
    from fedstyle.runtimes.flower import require_flower
    from fedstyle.runtimes.flower.deployment import fedstyle_path, flower_bin, free_port
    from fedstyle.runtimes.flower.node_config import SIMULATION_MARKER_ENV, SitePrivacy
    from fedstyle.runtimes.flower.node_config import node_config as make_node_config
    from fedstyle.runtimes.flower.warm_site import site_command
    from fedstyle.runtimes.site_state import default_state_root

    require_flower("fedstyle deploy site")
    if args.insecure == bool(args.root_certificates):
        raise ConfigError("give --root-certificates CA.crt (the coordinator's CA) or, without TLS, --insecure")
    check_site_args(args)
    state_dir = Path(args.state_dir).expanduser().resolve() if args.state_dir else default_state_root()
    privacy = SitePrivacy(min_noise=args.min_noise, max_clip=args.max_clip, budget_delta=args.budget_delta,
                          max_epsilon=math.inf if args.max_epsilon is None else args.max_epsilon)
    node_config = make_node_config(args.partition_id, state_dir, args.data_root, privacy)
    argv = [flower_bin("flower-supernode"), "--superlink", args.superlink, "--port", str(args.port or free_port()),
            "--node-config", node_config]
    argv += ["--insecure"] if args.insecure else ["--root-certificates", str(Path(args.root_certificates).resolve())]
    if args.auth_key:
        argv += ["--auth-supernode-private-key", str(Path(args.auth_key).resolve())]
    print(f"site {args.partition_id}: per-client state in {state_dir}", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os.environ["PYTHONPATH"] = fedstyle_path(os.environ.get("PYTHONPATH"))  # its ClientApps run this fedstyle
    os.environ.pop(SIMULATION_MARKER_ENV, None)  # a deployed site: never fedstyle's simulation engine
    # the site (a warm one: runtimes/flower/warm_site.py, around the SuperNode) replaces this process, in the
    # foreground: Ctrl-C and signals reach it, its SuperNode and its ClientApps directly
    argv = site_command(argv)
    os.execv(argv[0], argv)
    return 0  # not reached
