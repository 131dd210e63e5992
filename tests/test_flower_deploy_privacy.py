"""A real Flower deployment (SuperLink + 2 SuperNodes as processes) asked the same style query twice (issue 50 §1).

StableFDG's defence with OS noise; the ServerApp is killed after both sites answered round 2's query (its
checkpoint is round 1's) and the run resumed: the resumed coordinator asks round 2's query again, with the same
weights. Each site answers with the release it made the first time (its log names the ledger's digest of it),
and its ledger, kept in its state folder where the resume rolls nothing back, counts one release per round.
The fast tests of the same rules, message by message, are in test_site_releases.py.
"""

from __future__ import annotations

import os
import re
import signal

import pytest

pytest.importorskip("flwr", reason="fedstyle deploy needs fedstyle[flower] (flwr not installed)")

from fedstyle.experiments.checkpoint import load_checkpoint  # noqa: E402
from fedstyle.experiments.runner import start_run_dir  # noqa: E402
from fedstyle.runtimes.flower.deployment import DeploySettings, Federation, deploy_run, load_settings  # noqa: E402
from fedstyle.runtimes.site_privacy import ReleaseLedger  # noqa: E402
from test_flower_deploy import (  # noqa: E402,F401  (the deployment tests' fixtures and log readers)
    one_thread,
    pids_of,
    processes_of,
    received_trains,
    sent_trains,
    two_sites,
    wait_for,
)

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("deploy")]


def test_a_resumed_deployment_gets_the_same_style_release_counted_once(two_sites, tmp_path, one_thread):
    hp = {"attention": False, "dp_clip": 1e3, "dp_noise": 2.0}
    config = two_sites.updated(method="stablefdg", hparams=hp, rounds=2, local_steps=1)
    out = tmp_path / "dep"
    start_run_dir(config, out, quiet=True)
    settings = DeploySettings(sites=2, insecure=True, wait_timeout=120, round_timeout=300)
    with Federation(out, settings, quiet=True) as federation:
        federation.start()
        federation.submit()
        # round 2's training messages arrived: both sites answered its query
        wait_for(lambda: received_trains(out) == [2, 2], 300, "both sites to receive round 2", poll=0.05)
        server = [pid for pid, cmd in pids_of(out) if "flwr-serverapp" in cmd]
        assert server, "no ServerApp process"
        for pid in server:
            os.kill(pid, signal.SIGSTOP)
        wait_for(lambda: sent_trains(out) == [2, 2], 300, "both sites to send round 2's replies")
        for pid in server:
            os.kill(pid, signal.SIGKILL)
    assert load_checkpoint(out)[1]["round"] == 1 and not (out / "done").exists()
    state = out / "flower" / "state"
    before = [ReleaseLedger.open(state, c).entries() for c in (0, 1)]
    assert [[e.round for e in entries] for entries in before] == [[0, 1], [0, 1]]

    deploy_run(out, load_settings(out), quiet=True, rounds=2)  # = fedstyle deploy --resume OUT: redoes round 2
    assert (out / "done").exists() and not processes_of(out)
    assert [ReleaseLedger.open(state, c).entries() for c in (0, 1)] == before  # counted once
    for client, entries in enumerate(before):
        log = (out / "flower" / f"site-{client}.log").read_text(errors="replace")
        replayed = re.findall(rf"client {client} round 1 stablefdg-phi: .*replayed release ([0-9a-f]{{12}})", log)
        assert replayed == [entries[1].sha256[:12]], log[-3000:]  # round 2 (0-based 1) answered as before

    # ε as released (issue 50 §4): what summary.json reports, what the audit counts from metrics.jsonl's rows and
    # what the sites' ledgers compose to are one number (the coordinator has no client states in a deployment)
    import json

    from fedstyle.algorithms.style_exchange import style_privacy
    from fedstyle.audit.accounting import receiver_epsilon, releases_per_sender
    from fedstyle.experiments.build import build_experiment
    from fedstyle.experiments.rundir import METRICS, read_metrics_file, read_run_config

    reported = json.loads((out / "summary.json").read_text())["style_privacy"]
    exp = build_experiment(read_run_config(out), progress=False)
    privacy = style_privacy(exp.algorithm.hp)
    releases, _ = releases_per_sender(exp, read_metrics_file(out / METRICS))
    audited = receiver_epsilon(privacy, releases)["epsilon"]
    ledgers = max(ReleaseLedger.open(state, c).epsilon(privacy.delta) for c in (0, 1))
    assert releases == {0: 2, 1: 2} and reported["releases_per_client"] in ([2, 2], {"0": 2, "1": 2})
    assert reported["epsilon_total"] == pytest.approx(audited, rel=1e-9) == pytest.approx(ledgers, rel=1e-9)
