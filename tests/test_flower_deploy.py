"""A real Flower federation on loopback: SuperLink + 2 SuperNodes as processes (free ports, TLS).

Checks: CCST (a setup-phase method) gives the simulator's metrics bitwise (FedDyn's per-client state across
a restart is checked message by message in test_flower_policy.py); a federation stopped mid-run — coordinator and sites — while the sites are a round
ahead of the checkpoint resumes and ends exactly as an uninterrupted run; a SuperNode killed mid-run
drops out (logged), the run finishes, the restarted site rejoins; no process started is left when a
deployment returns.
"""

from __future__ import annotations

import json
import os
import signal
import warnings
from pathlib import Path

import pytest
import torch

pytest.importorskip("flwr", reason="fedstyle deploy needs fedstyle[flower] (flwr not installed)")

from safetensors.torch import load_file  # noqa: E402

from fedstyle.experiments.runner import run_experiment, start_run_dir  # noqa: E402
from fedstyle.runtimes.flower.certs import make_certificates  # noqa: E402
from fedstyle.runtimes.flower.deployment import (  # noqa: E402
    DeploySettings,
    Federation,
    deploy_run,
    load_settings,
)
from run_records import evaluations  # noqa: E402
from process_waits import signal_dispositions, wait_for as shared_wait_for  # noqa: E402

# each message starts a ClientApp process (Flower's design): ~10-60 s per run; on pytest-xdist workers the
# deployments run one after another on one worker while the other worker runs the rest
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("deploy")]

RUN_FILES = ("config.json", "partition.json", "metrics.jsonl", "checkpoint.safetensors", "summary.json", "done")


@pytest.fixture
def one_thread(monkeypatch):
    """Sites inherit OMP_NUM_THREADS=1; the in-process reference trains with one thread too (bitwise equality)."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def two_sites(tiny_config):
    # grey and blue held out: red and green are the 2 source domains -> 2 clients, one per site
    return tiny_config.updated(targets=["grey", "blue"], lr_schedule="constant")


def records(run_dir):
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]


def global_weights(run_dir):
    return {k: v for k, v in load_file(str(run_dir / "checkpoint.safetensors")).items() if k.startswith("global/")}


def assert_same_run(a, b):
    assert evaluations(a) == evaluations(b)
    wa, wb = global_weights(a), global_weights(b)
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def pids_of(run_dir) -> list[tuple[int, str]]:
    """(pid, command line) of the live processes anywhere on the machine started for ``run_dir`` (their
    FLWR_HOME lies inside it), also those that left this test's process tree (Flower's SuperExec, ServerApp,
    ClientApp processes). Live: running code, also after its main thread exited (a Z in `ps` whose other
    threads run on, as Flower's SuperExec shutting down); an exited process waiting to be reaped is not."""
    from pathlib import Path

    from fedstyle.runtimes.flower.watchdog import alive

    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if str(run_dir).encode() in (entry / "environ").read_bytes() and alive(int(entry.name)):
                found.append((int(entry.name), (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()))
        except OSError:
            continue
    return found


def processes_of(run_dir) -> list[str]:
    return [cmd for _, cmd in pids_of(run_dir)]


def _train_messages(run_dir, step: str, done: str) -> list[int]:
    """Per site: training messages its SuperNode logged at ``step`` ("Receiving: ", "Sending: ") and completed
    (``done`` later in the same entry of Flower's log)."""
    counts = []
    for site in (0, 1):
        log = run_dir / "flower" / f"site-{site}.log"
        text = log.read_text(errors="replace") if log.exists() else ""
        counts.append(sum(1 for part in text.split(step)[1:] if part.startswith("train") and done in part))
    return counts


def received_trains(run_dir) -> list[int]:
    """Per site: training messages its SuperNode received in full (Flower's log)."""
    return _train_messages(run_dir, "Receiving: ", "Received successfully")


def sent_trains(run_dir) -> list[int]:
    """Per site: training replies its SuperNode sent to the SuperLink (Flower's log)."""
    return _train_messages(run_dir, "Sending: ", "Sent successfully")


def wait_for(predicate, timeout, what, poll=0.5):
    """process_waits.wait_for, polling every 0.5 s (the predicates here read logs and scan /proc); a wait that a
    kill follows polls every 0.05 s, so the kill lands within 0.05 s of the logged step, not 0.5 s."""
    shared_wait_for(predicate, timeout, what, poll=poll)


def test_deploy_matches_simulator_with_tls_and_resumes(two_sites, tmp_path, one_thread):
    from fedstyle.experiments.checkpoint import load_checkpoint

    certs = tmp_path / "certs"
    make_certificates(certs, sites=2)
    # TLS with Flower's node authentication (the coordinator registers each site's public key, sites sign
    # with theirs), kept by the resume (load_settings)
    settings = DeploySettings(sites=2, certs=str(certs), node_auth=True, wait_timeout=120, round_timeout=300)

    # CCST: the setup exchange (style upload, bank broadcast, local augmentation) as message round trips over
    # gRPC, 2 rounds with a checkpoint after each. The ServerApp is frozen once both sites received round 2
    # (the checkpoint is round 1's) and killed once both trained it and sent their replies; then every process
    # stops and everything restarts: new SuperNodes (nothing in memory) and a resumed coordinator that redoes
    # round 2 without a second setup exchange: the sites take what the setup gave them from their state
    # folders. The run ends as an uninterrupted one, bitwise. (A site's per-round state across a restart,
    # FedDyn's gradient term, is checked message by message in test_flower_policy.py.)
    config = two_sites.updated(method="ccst", hparams={"style_backend": "fft", "k": 2}, rounds=2)
    run_experiment(config, tmp_path / "sim-ccst", quiet=True)
    out = tmp_path / "dep-ccst"
    start_run_dir(config, out, quiet=True)
    with Federation(out, settings, quiet=True) as federation:
        federation.start()
        federation.submit()
        wait_for(lambda: received_trains(out) == [2, 2], 300, "both sites to receive round 2", poll=0.05)
        server = [pid for pid, cmd in pids_of(out) if "flwr-serverapp" in cmd]
        assert server, "no ServerApp process"
        for pid in server:  # it cannot take the sites' replies: no checkpoint of round 2
            os.kill(pid, signal.SIGSTOP)
        wait_for(lambda: sent_trains(out) == [2, 2], 300, "both sites to train round 2 and send their replies")
        for pid in server:
            os.kill(pid, signal.SIGKILL)
    assert not processes_of(out)  # stopped mid-run: every process gone when the federation returns
    assert load_checkpoint(out)[1]["round"] == 1 and not (out / "done").exists()
    deploy_run(out, load_settings(out), quiet=True, rounds=2)  # = fedstyle deploy --resume OUT
    assert not processes_of(out)
    for name in RUN_FILES:
        assert (out / name).exists(), name
    for log in ("superlink.log", "site-0.log", "site-1.log", "serverapp.log"):
        assert (out / "flower" / log).stat().st_size > 0
    for log in ("site-0.log", "site-1.log"):  # warm sites (runtimes/flower/warm_site.py): each message a forked process
        text = (out / "flower" / log).read_text(errors="replace")
        assert text.count("fedstyle site: ClientApp task") == text.count("Receiving:") > 0, text[-3000:]
    assert_same_run(out, tmp_path / "sim-ccst")
    setup = [r for r in records(out) if r.get("event") == "setup"]
    assert len(setup) == 1 and setup[0]["setup_bytes_up"] > 0  # the resume did not redo the exchange


def test_killed_site_drops_out_and_rejoins(two_sites, tmp_path, one_thread):
    config = two_sites.updated(rounds=2)
    out = tmp_path / "dep"
    start_run_dir(config, out, quiet=True)
    settings = DeploySettings(sites=2, insecure=True, wait_timeout=120, round_timeout=300)

    with Federation(out, settings, quiet=True) as federation:
        federation.start()
        submitted = federation.submit()
        wait_for(lambda: received_trains(out)[1] >= 1, 300, "site 1 to receive round 1", poll=0.05)
        federation.stop("site-1", signal.SIGKILL)  # a crash in the middle of round 1: no reply, no goodbye
        federation.start_site(1)  # restarted at once: a new Flower node while the old one is not yet declared dead
        # Flower declares the old node unavailable after two missed heartbeats (<= 60 s): round 1 goes on without it
        federation.wait(submitted, rounds=2)
    assert not processes_of(out)
    assert (out / "done").exists()
    events = [r for r in records(out) if "event" in r]
    assert events == [{"event": "dropout", "round": 1, "phase": "train", "clients": [1]},
                      {"event": "rejoin", "round": 2, "phase": "identify", "clients": [1]}]
    assert [r["round"] for r in records(out) if "event" not in r] == [1, 2]
    assert json.loads((out / "summary.json").read_text())["rounds"] == 2


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_or_sigterm_stops_every_process(two_sites, tmp_path, sig):
    import subprocess
    import sys

    out = tmp_path / "run"
    argv = [sys.executable, "-m", "fedstyle.cli.main", "deploy", "--sites", "2", "--insecure", "--quiet",
            "--out", str(out), "--dataset", "folder", "--data-root", two_sites.data_root, "--resolution", "16",
            "--target", "grey", "--target", "blue", "--rounds", "50", "--batch-size", "8", "--local-steps", "2",
            "--min-client-size", "2", "--device", "cpu"]
    # PYTHONFAULTHANDLER: should deploy hang, SIGABRT makes it print where each of its threads is
    # Ctrl-C as a terminal delivers it: with SIGINT at its default disposition. A process started with SIGINT
    # ignored (a background job of a non-interactive shell, as the suite is when a CI script runs it with `&`)
    # passes the ignore on through exec, and Python then installs no KeyboardInterrupt handler: deploy rightly
    # ignores that Ctrl-C (this was the "full-suite only" failure: SigIgn 0x...1001006, SIGINT and SIGQUIT)
    argv = [sys.executable, "-c", "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
            "os.execv(sys.argv[1], sys.argv[1:])", *argv]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONFAULTHANDLER": "1"})
    try:
        wait_for(lambda: (out / "flower" / "site-1.log").exists() and len(processes_of(out)) >= 5, 120,
                 "the SuperLink and both sites")
        dispositions = signal_dispositions(proc.pid)
        proc.send_signal(sig)
        try:
            _, err = proc.communicate(timeout=120)  # an orderly stop: 10 s grace + 5 s kill, more when loaded
        except subprocess.TimeoutExpired:
            hung = signal_dispositions(proc.pid)
            proc.send_signal(signal.SIGABRT)  # faulthandler's dump of every thread's stack, then exit
            try:
                _, err = proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                err = "(no stack dump within 30 s of SIGABRT)"
            message = (f"deploy did not return within 120 s of signal {sig}; its signal masks when signalled "
                       f"{dispositions}, 120 s later {hung}, this test process's {signal_dispositions(os.getpid())}; "
                       f"its stderr:\n{err[-6000:]}")
            # also as a warning: the known-defect mark below reports an expected failure by its reason alone, and
            # the suite's warnings summary is where this dump then shows (it names where deploy hung)
            warnings.warn(message, RuntimeWarning, stacklevel=1)
            raise AssertionError(message) from None
        left = processes_of(out)  # gone when `fedstyle deploy` returns, not some time later
    finally:
        if proc.poll() is None:
            proc.kill()
        # whatever the outcome, no federation of this test may go on training beside the rest of the suite
        for pid, _ in pids_of(out):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    assert proc.returncode == 130, err[-2000:]
    assert f"fedstyle deploy --resume {out}" in err
    assert not left, left


def test_a_killed_serverapp_is_noticed_within_seconds(tiny_config, tmp_path):
    # Flower's SuperLink notices it only after two missed heartbeats (51-61 s measured); the deployment watches it
    # once it began the run (issue 55 item 11). One killed earlier, still starting, Flower launches again (measured:
    # another 30 s later, and the run finished): not reported. One site: red is the one source domain
    import threading
    import time

    from fedstyle.runtimes.flower.deployment import read_serverapp_record
    from fedstyle.runtimes.flower.processes import DeployError

    out = tmp_path / "dep"
    start_run_dir(tiny_config.updated(targets=["grey", "blue", "green"], rounds=50), out, quiet=True)
    killed = []

    def kill(pid):
        os.kill(pid, signal.SIGKILL)
        killed.append(time.monotonic())

    with Federation(out, DeploySettings(sites=1, insecure=True, wait_timeout=120, round_timeout=300),
                    quiet=True) as federation:
        federation.start()
        submitted = federation.submit()
        wait_for(lambda: read_serverapp_record(out / "flower"), 300, "the ServerApp to begin the run")
        server = int(read_serverapp_record(out / "flower").split(":")[0])
        assert any(pid == server and "flwr-serverapp" in cmd for pid, cmd in pids_of(out))
        timer = threading.Timer(1.0, kill, (server,))  # while the deployment waits for the run
        timer.start()
        try:
            with pytest.raises(DeployError, match=f"the ServerApp \\(pid {server}\\) ended before the run finished"):
                federation.wait(submitted, rounds=50)
        finally:
            timer.join()
        noticed = time.monotonic() - killed[0]
    stopped = time.monotonic() - killed[0]
    print(f"the SIGKILLed ServerApp noticed after {noticed:.2f} s, every process stopped after {stopped:.2f} s")
    assert noticed < 5
    assert not processes_of(out)
