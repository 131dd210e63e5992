"""A deployed site's releases (issue 50 §1, §3): the same question gets the same release, the ledger counts each
release once whatever a coordinator repeats or resumes, the budget refuses past the operator's eps, and the
operator's noise floor and clip cap hold whatever the coordinator's config says."""

from __future__ import annotations

import json
import math

import pytest
import torch

pytest.importorskip("flwr", reason="the Flower sites need fedstyle[flower] (flwr not installed)")

from fedstyle.errors import ConfigError  # noqa: E402
from fedstyle.runtimes.flower import site  # noqa: E402
from fedstyle.runtimes.flower.node_config import SitePrivacy, site_privacy  # noqa: E402
from fedstyle.runtimes.site_privacy import (  # noqa: E402
    PrivacyBudgetError,
    ReleaseLedger,
    apply_floor,
    composed_noise,
    ledger_epsilon,
    tensors_digest,
)
from fedstyle.runtimes.site_state import run_key  # noqa: E402
from fedstyle.style.privacy import StylePrivacy, gaussian_epsilon  # noqa: E402
from site_messages import node, send  # noqa: E402

Z, C = 2.0, 1e3  # sigma = z * 2C = 4000 on the sums: two draws never agree


@pytest.fixture(autouse=True)
def fresh_site_processes():
    site._SITES.clear()
    yield
    site._SITES.clear()


@pytest.fixture
def stablefdg(tiny_config) -> str:
    return tiny_config.updated(method="stablefdg", rounds=1,
                               hparams={"attention": False, "dp_clip": C, "dp_noise": Z}).to_json()


def ledger(state, client=0) -> ReleaseLedger:
    return ReleaseLedger.open(state, client)


def test_a_repeated_or_resumed_query_gets_the_same_release_and_the_ledger_counts_one(stablefdg, tmp_path):
    state = tmp_path / "site"
    context = node(partition_id=0, state_dir=str(state))
    first = send("round_query", stablefdg, context)["style"]
    assert torch.equal(send("round_query", stablefdg, context)["style"], first)  # asked again
    site._SITES.clear()  # a restarted site (a fresh process), a resumed coordinator (a new session)
    resumed = send("round_query", stablefdg, node(partition_id=0, state_dir=str(state)), session="s2")["style"]
    assert torch.equal(resumed, first)
    (entry,) = ledger(state).entries()
    assert (entry.run, entry.client, entry.round, entry.name) == (run_key(stablefdg), 0, 0, "stablefdg-phi")
    assert (entry.noise, entry.clip, entry.source) == (Z, C, "os")
    assert torch.equal(ledger(state).load(entry)["style"], first)  # what was sent, kept on the site
    # kept outside the run's folder, which a resume prunes
    assert ledger(state).path.parent.parent.name == "privacy" and not (state / run_key(stablefdg) / "privacy").exists()

    # another question (other weights, another round) is another release, counted
    exp = site._SITES[next(iter(site._SITES))].experiment
    moved = {k: (v + 0.01 if v.is_floating_point() else v) for k, v in exp.simulator.initial_weights.items()}
    other = send("round_query", stablefdg, context, weights=moved)["style"]
    later = send("round_query", stablefdg, context, round_index=1)["style"]
    assert not torch.equal(other, first) and not torch.equal(later, first)
    assert [(e.round, e.inputs == entry.inputs) for e in ledger(state).entries()] == [(0, True), (0, False), (1, True)]
    assert ledger(state).epsilon(1e-5) == pytest.approx(gaussian_epsilon(Z / math.sqrt(3), 1e-5))


def test_the_simulation_engine_keeps_no_ledger(stablefdg, tmp_path, monkeypatch):
    from fedstyle.runtimes.flower.node_config import SIMULATION_MARKER_ENV, SIMULATION_MARKER_VALUE

    monkeypatch.setenv("FEDSTYLE_SITE_STATE", str(tmp_path / "sim-state"))
    monkeypatch.setenv(SIMULATION_MARKER_ENV, SIMULATION_MARKER_VALUE)
    send("round_query", stablefdg, node(partition_id=0, num_partitions=3))
    assert not (tmp_path / "sim-state" / "privacy").exists()


def test_a_release_past_the_budget_is_refused_in_one_line(stablefdg, tmp_path):
    """eps of one release at z = 2 is 1.99 (delta 1e-5), of two 2.94: a budget of 2.5 takes one; asking the same
    question again costs nothing, a new one is refused and nothing is added to the ledger."""
    one, two = gaussian_epsilon(Z, 1e-5), gaussian_epsilon(Z / math.sqrt(2), 1e-5)
    assert one < 2.5 < two
    state = tmp_path / "site"
    context = node(partition_id=0, state_dir=str(state), dp_max_epsilon=2.5)
    first = send("round_query", stablefdg, context)["style"]
    assert torch.equal(send("round_query", stablefdg, context, session="s2")["style"], first)
    with pytest.raises(PrivacyBudgetError, match=r"eps would reach 2\.94.* > dp-max-epsilon=2\.5 ") as refused:
        send("round_query", stablefdg, context, round_index=1)
    assert "\n" not in str(refused.value)
    assert len(ledger(state).entries()) == 1


def test_ledger_composes_gaussian_releases_exactly():
    # GDP (Dong, Roth & Su, Cor. 3.3): mu_i = 1 / z_i add in quadrature; z = 1 and z = 2 give mu^2 = 1 + 1/4
    assert composed_noise([1.0, 2.0]) == pytest.approx(1 / math.sqrt(1.25))
    assert composed_noise([3.0] * 9) == pytest.approx(1.0)
    assert ledger_epsilon([3.0] * 9, 1e-5) == pytest.approx(gaussian_epsilon(1.0, 1e-5))
    assert ledger_epsilon([2.0] * 4, 1e-5) == pytest.approx(StylePrivacy(1.0, 2.0).total_epsilon(4))
    assert ledger_epsilon([], 1e-5) == 0.0 and ledger_epsilon([2.0, 0.0], 1e-5) == math.inf


def test_ledger_lines_are_appended_and_a_torn_line_is_skipped(stablefdg, tmp_path):
    state = tmp_path / "site"
    context = node(partition_id=0, state_dir=str(state))
    send("round_query", stablefdg, context)
    with open(ledger(state).path, "a") as f:
        f.write('{"key": "torn by a cr')  # a crash before the fsync
    send("round_query", stablefdg, context, round_index=1)
    lines = ledger(state).path.read_text().splitlines()
    assert len(lines) == 3 and json.loads(lines[0])["round"] == 0 and lines[1] == '{"key": "torn by a cr'
    assert [e.round for e in ledger(state).entries()] == [0, 1]  # the torn line skipped, the next one on its own
    assert tensors_digest({"a": torch.zeros(2)}) != tensors_digest({"a": torch.zeros(2, dtype=torch.float64)})


# -- the operator's floor -------------------------------------------------------------------------
def test_the_site_floor_raises_the_noise_and_caps_the_clip(tiny_config, tmp_path):
    hp = {"attention": False, "dp_clip": 50.0, "dp_noise": 0.5}
    config_json = tiny_config.updated(method="stablefdg", rounds=1, hparams=hp).to_json()
    state = tmp_path / "site"
    context = node(partition_id=0, state_dir=str(state), dp_min_noise=3.0, dp_max_clip=10.0)
    send("round_query", config_json, context)
    (built,) = site._SITES.values()
    assert (built.experiment.algorithm.hp["dp_noise"], built.experiment.algorithm.hp["dp_clip"]) == (3.0, 10.0)
    (entry,) = ledger(state).entries()
    assert (entry.noise, entry.clip, entry.asked) == (3.0, 10.0, {"noise": 0.5, "clip": 50.0})


def test_the_floor_never_weakens_what_the_coordinator_asks(tiny_config):
    from fedstyle.experiments.config import RunConfig

    def applied(hp, floor):
        config = RunConfig(method="stablefdg", dataset="digits4", hparams=hp)
        out, asked = apply_floor(config, floor)
        return out.hparams["dp_noise"], out.hparams["dp_clip"]

    floor = SitePrivacy(min_noise=1.0, max_clip=5.0)
    assert applied({"dp_noise": 4.0, "dp_clip": 2.0}, floor) == (4.0, 2.0)  # stronger already: kept
    assert applied({"dp_noise": 0.2, "dp_clip": 9.0}, floor) == (1.0, 5.0)
    assert applied({}, floor) == (1.0, 5.0)  # the defence off (C = 0 is no clipping): the floor turns it on
    assert applied({"dp_noise": 0.2, "dp_clip": 9.0}, SitePrivacy()) == (0.2, 9.0)  # no floor
    with pytest.raises(ConfigError, match="add dp-max-clip=C to the site's node config"):
        applied({}, SitePrivacy(min_noise=1.0))
    fedavg = RunConfig(method="fedavg", dataset="digits4")
    assert apply_floor(fedavg, floor) == (fedavg, {})  # no defence to raise


def test_node_config_privacy_keys_are_checked():
    assert site_privacy(node(partition_id=0)) == SitePrivacy()
    read = site_privacy(node(partition_id=0, dp_min_noise=1.5, dp_max_clip=2, dp_max_epsilon=8, dp_budget_delta=1e-6))
    assert read == SitePrivacy(min_noise=1.5, max_clip=2.0, max_epsilon=8.0, budget_delta=1e-6)
    for bad, match in (({"dp_min_noise": -1}, "dp-min-noise"), ({"dp_max_clip": "big"}, "dp-max-clip"),
                       ({"dp_max_epsilon": 0}, "dp-max-epsilon"), ({"dp_budget_delta": 1.0}, "dp-budget-delta")):
        with pytest.raises(ConfigError, match=match):
            site_privacy(node(partition_id=0, **bad))


def test_deploy_site_passes_the_floor_in_its_node_config(tmp_path, monkeypatch, capsys):
    import os

    from fedstyle.cli.main import main

    started = []
    monkeypatch.setattr(os, "execv", lambda path, argv: started.append(argv))
    assert main(["deploy", "site", "--superlink", "coord:9093", "--insecure", "--partition-id", "1",
                 "--state-dir", str(tmp_path / "st"), "--min-noise", "2", "--max-clip", "0.5",
                 "--max-epsilon", "8"]) == 0
    config = started[0][started[0].index("--node-config") + 1]
    assert config == f'partition-id=1 state-dir="{tmp_path / "st"}" dp-min-noise=2.0 dp-max-clip=0.5 dp-max-epsilon=8.0'
    assert main(["deploy", "site", "--superlink", "coord:9093", "--insecure", "--partition-id", "1",
                 "--min-noise", "-1"]) != 0
    assert "--min-noise) must be a finite number >= 0, got -1" in capsys.readouterr().err and len(started) == 1


def test_a_resumed_coordinator_gets_the_rounds_it_redoes_as_they_were_released(tiny_config, tmp_path):
    """Through Flower's ServerApp and ClientApp (tests/flower_grid.py): the coordinator stops in round 4 with its
    checkpoint at round 2 and resumes. It redoes rounds 3 and 4; every site answers their queries with the
    releases it made the first time (same weights, since the styles it trained round 3 with were the same), so
    each client's ledger holds one release per round, 4, not 6."""
    from fedstyle.experiments.checkpoint import load_checkpoint
    from fedstyle.experiments.runner import start_run_dir
    from fedstyle.runtimes.flower.serverapp import FaultPolicy, serve
    from flower_grid import FakeGrid, server_task_identity

    hp = {"attention": False, "dp_clip": C, "dp_noise": Z}
    config = tiny_config.updated(method="stablefdg", hparams=hp, rounds=4, eval_every=2, lr_schedule="constant")
    out, state = tmp_path / "run", tmp_path / "site-state"
    start_run_dir(config, out, quiet=True)
    grid = FakeGrid({10: 0, 11: 1, 12: 2})
    for n in grid.contexts:
        grid.contexts[n].node_config["state-dir"] = str(state)  # what `fedstyle deploy site` gives each site

    def crash(g):
        if g.trains == 10:  # round 4's first training message (3 clients a round): its queries are answered
            raise KeyboardInterrupt

    grid.on_train = crash
    with server_task_identity():
        with pytest.raises(KeyboardInterrupt):
            serve(grid, out, FaultPolicy(wait_timeout=1), quiet=True, log_events=False)
        assert load_checkpoint(out)[1]["round"] == 2
        first = {c: ledger(state, c).entries() for c in range(3)}
        assert all([e.round for e in first[c]] == [0, 1, 2, 3] for c in range(3))
        site._SITES.clear()  # fresh processes
        restarted = FakeGrid({20: 0, 21: 1, 22: 2})
        for n in restarted.contexts:
            restarted.contexts[n].node_config["state-dir"] = str(state)
        serve(restarted, out, FaultPolicy(wait_timeout=1), quiet=True, log_events=False)
    assert (out / "done").exists()
    assert {c: ledger(state, c).entries() for c in range(3)} == first  # nothing released again


def test_ccst_answers_a_repeated_setup_upload_with_its_one_style_release(tiny_config, tmp_path):
    """CCST releases its style once, at setup; a coordinator that reruns the setup exchange (every start of
    its round loop does) gets that release again, not a fresh noisy one."""
    hp = {"style_backend": "lite", "style_type": "overall", "k": 1, "dp_clip": 10.0, "dp_noise": 0.5}
    config_json = tiny_config.updated(method="ccst", hparams=hp, rounds=1).to_json()
    state = tmp_path / "site"
    first = send("setup_upload", config_json, node(partition_id=1, state_dir=str(state)), round_index=-1)
    site._SITES.clear()
    again = send("setup_upload", config_json, node(partition_id=1, state_dir=str(state)), round_index=-1,
                 session="s2")
    assert first.keys() == again.keys() and all(torch.equal(first[k], again[k]) for k in first
                                                if isinstance(first[k], torch.Tensor))
    (entry,) = ledger(state, 1).entries()
    assert (entry.name, entry.round, entry.noise, entry.clip) == ("ccst-styles", -1, 0.5, 10.0)
