"""Deployments that lose or corrupt work (issue 39): a `fedstyle deploy` killed outright (SIGKILL, the OOM
killer) leaves no Flower process, the ServerApp holds the run directory's lock itself, and no federation
starts beside the orphans of another (item 1); a deployment that never started leaves nothing, and a
deployment's run directory resumes only on a federation (item 6). Issue 55: resume flags (item 3); expired
certificates, a resume beside a live deployment, logs removed with a failed start (item 9); a killed ServerApp
noticed at once, no <defunct> ServerApp left (item 11, on fake Flower processes).

One test kills a real deployment; the others need no Flower process. The supervision code on plain Python
processes: test_deploy_processes.py; the other real deployments: test_flower_deploy.py.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest
from process_waits import kill_all, wait_for

from fedstyle.cli.main import main
from fedstyle.errors import ConfigError
from fedstyle.experiments.rundir import check_new_run_dir
from fedstyle.io import DirectoryLock, LockedError
from fedstyle.runtimes.flower.processes import MARKER_ENV, DeployError, marked_processes

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process death and discovery are Linux's")

SLEEP = "import time; time.sleep(120)"


@pytest.fixture
def deployment_dir(tiny_config, tmp_path):
    """A new deployment's run directory (2 sites), as `fedstyle deploy` writes it before starting Flower."""
    from fedstyle.experiments.runner import start_run_dir

    out = tmp_path / "dep"
    (out / "flower").mkdir(parents=True)
    (out / "flower" / "deploy.json").write_text(json.dumps({"sites": 2, "insecure": True}))
    start_run_dir(tiny_config.updated(targets=["grey", "blue"], rounds=1), out, quiet=True)
    return out


def test_no_federation_starts_beside_the_orphans_of_a_killed_one(deployment_dir, capsys):
    from fedstyle.runtimes.flower.deployment import DeploySettings, Federation

    out = deployment_dir
    marker = uuid.uuid4().hex
    (out / "flower" / "supervisor.json").write_text(json.dumps({"marker": marker, "owner": "999999999:1",
                                                                "host": socket.gethostname()}))
    orphan = subprocess.Popen([sys.executable, "-c", SLEEP], env=dict(os.environ, **{MARKER_ENV: marker}))
    try:
        wait_for(lambda: marked_processes(marker) == [orphan.pid], 20, "the orphan")
        with pytest.raises(DeployError, match=f"processes {orphan.pid} .* still running"):
            with Federation(out, DeploySettings(sites=2, insecure=True)):
                pass
        assert main(["deploy", "--resume", str(out)]) == 2
        err = capsys.readouterr().err.strip()
        assert f"kill {orphan.pid}" in err and "\n" not in err  # one line, naming what to stop
        assert not (out / "metrics.jsonl").exists()
    finally:
        orphan.kill()
        orphan.wait()
    with Federation(out, DeploySettings(sites=2, insecure=True)):  # once it is gone, the federation may start
        pass


def test_the_serverapp_holds_the_run_directory_lock(deployment_dir, monkeypatch):
    pytest.importorskip("flwr", reason="the ServerApp needs fedstyle[flower]")
    from fedstyle.runtimes.flower import serverapp

    out = deployment_dir
    deploy_lock = DirectoryLock(out).acquire().share()  # as `fedstyle deploy` holds it when it submits the run
    seen = []

    def serve(grid, run_dir, policy, **kwargs):
        deploy_lock.release()  # `fedstyle deploy` is killed while the ServerApp trains
        with pytest.raises(LockedError, match=f"process {os.getpid()}"):  # a resume is still refused
            DirectoryLock(run_dir).acquire()
        seen.append(run_dir)

    monkeypatch.setattr(serverapp, "serve", serve)
    try:
        serverapp.main(None, SimpleNamespace(run_config={"run-dir": str(out)}))
    finally:
        deploy_lock.release()
    assert seen == [out]
    DirectoryLock(out).acquire().release()  # both gone: free again


def test_a_shared_lock_refuses_exclusive_takers_while_any_holder_lives(tmp_path):
    first = DirectoryLock(tmp_path).acquire()
    first.share()
    second = DirectoryLock(tmp_path, shared=True).acquire()
    first.release()
    with pytest.raises(LockedError):
        DirectoryLock(tmp_path).acquire()
    second.release()
    DirectoryLock(tmp_path).acquire().release()


def test_a_deployment_resumes_only_on_a_federation(deployment_dir, capsys):
    out = deployment_dir
    assert main(["run", "--resume", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert f"fedstyle deploy --resume {out}" in err and "\n" not in err
    assert not (out / "metrics.jsonl").exists() and not (out / "done").exists()  # nothing ran on the simulator
    with pytest.raises(ConfigError, match=f"fedstyle deploy --resume {out}"):  # the refusal of a new run says so too
        check_new_run_dir(out)


def deploy_argv(out: Path, tiny_root, *flags: str) -> list[str]:
    return ["deploy", *flags, "--sites", "2", "--quiet", "--out", str(out), "--dataset", "folder", "--data-root",
            str(tiny_root), "--resolution", "16", "--target", "grey", "--target", "blue", "--rounds", "1",
            "--batch-size", "8", "--local-steps", "1", "--min-client-size", "2", "--device", "cpu"]


def test_a_port_in_use_is_refused_in_one_line_before_anything_is_written(tiny_root, tmp_path, capsys):
    pytest.importorskip("flwr", reason="fedstyle deploy needs fedstyle[flower]")
    out = tmp_path / "dep"
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(deploy_argv(out, tiny_root, "coordinator", "--insecure", "--host", "127.0.0.1",
                                "--port", str(port))) == 2
    err = capsys.readouterr().err.strip()
    assert f"127.0.0.1:{port}" in err and "--port" in err and "\n" not in err
    assert not out.exists()


def test_a_deployment_that_fails_to_start_leaves_nothing(tiny_root, tmp_path, capsys, monkeypatch):
    # whatever stops the federation before its first checkpoint (a SuperLink that exits at once, here)
    pytest.importorskip("flwr", reason="fedstyle deploy needs fedstyle[flower]")
    from fedstyle.runtimes.flower import deployment

    def superlink_fails(self, timeout=120.0):
        assert (self.run_dir / "config.json").exists() and (self.run_dir / "partition.json").exists()
        raise DeployError("the SuperLink exited (code 1)")

    monkeypatch.setattr(deployment.Federation, "start_superlink", superlink_fails)
    out = tmp_path / "dep"
    assert main(deploy_argv(out, tiny_root, "--insecure")) == 2
    err = capsys.readouterr().err
    assert f"nothing was kept in {out}: run the same command again" in err and "--resume" not in err
    assert not out.exists()  # the corrected command is not refused
    out.mkdir()  # a folder the user made stays, emptied
    assert main(deploy_argv(out, tiny_root, "--insecure")) == 2
    assert out.is_dir() and not list(out.iterdir())


def federation_of(out: Path) -> list[tuple[int, str]]:
    """(pid, command line) of the processes started for the run directory ``out`` (their FLWR_HOME lies in it)
    that still run code: an exited process waiting to be reaped does not, one whose main thread has exited
    while other threads run does."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if str(out).encode() in (entry / "environ").read_bytes() and (
                    (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z" or len(list((entry / "task").iterdir())) > 1):
                found.append((int(entry.name), (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()))
        except (OSError, IndexError):
            continue
    return found


@pytest.mark.slow
@pytest.mark.xdist_group("deploy")
def test_a_sigkilled_deploy_leaves_no_flower_process(tiny_root, tmp_path):
    pytest.importorskip("flwr", reason="fedstyle deploy needs fedstyle[flower]")
    out = tmp_path / "dep"
    # one site (red, the one source domain) is the quickest start with every kind of process: SuperLink, SuperNode,
    # flwr run, both SuperExecs, the ServerApp (and ClientApps once it sends)
    argv = [sys.executable, "-m", "fedstyle.cli.main", "deploy", "--sites", "1", "--insecure", "--quiet", "--out", str(out),
            "--dataset", "folder", "--data-root", str(tiny_root), "--resolution", "16", "--target", "grey",
            "--target", "blue", "--target", "green", "--rounds", "50", "--batch-size", "8", "--local-steps", "1",
            "--min-client-size", "2", "--device", "cpu"]
    deploy = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        # the ServerApp (the run directory's writer) runs: the whole federation is up
        wait_for(lambda: any("flwr-serverapp" in cmd for _, cmd in federation_of(out)) or deploy.poll() is not None,
                 120, "the ServerApp to start")
        assert deploy.poll() is None, deploy.stderr.read()[-2000:]
        deploy.kill()  # as the OOM killer does: no handler, no atexit
        deploy.wait()
        started = time.monotonic()
        wait_for(lambda: not federation_of(out), 10, "every Flower process of the killed deploy to exit")
        print(f"all gone {time.monotonic() - started:.2f} s after the SIGKILL")
    finally:
        deploy.kill()
        deploy.wait()
        kill_all(pid for pid, _ in federation_of(out))  # whatever happened, nothing trains on beside the suite
    DirectoryLock(out).acquire().release()  # nobody holds the run directory any more


@pytest.mark.parametrize("damage", ["garbage server.crt", "one flipped byte in server.crt", "another key"])
def test_a_bad_certificate_is_refused_in_one_line_and_leaves_nothing(tiny_root, tmp_path, capsys, damage):
    pytest.importorskip("flwr", reason="fedstyle deploy needs fedstyle[flower]")
    from fedstyle.runtimes.flower.certs import make_certificates

    certs = tmp_path / "certs"
    make_certificates(certs, sites=2)
    if damage == "garbage server.crt":
        (certs / "server.crt").write_text("-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n-----END CERTIFICATE-----\n")
    elif damage == "one flipped byte in server.crt":
        lines = (certs / "server.crt").read_text().splitlines()
        lines[3] = lines[3][:10] + ("A" if lines[3][10] != "A" else "B") + lines[3][11:]  # one flipped character
        (certs / "server.crt").write_text("\n".join(lines) + "\n")
    else:
        (certs / "server.key").write_bytes((certs / "ca.key").read_bytes())
    out = tmp_path / "dep"
    assert main(["deploy", "--sites", "2", "--certs", str(certs), "--quiet", "--out", str(out), "--dataset", "folder",
                 "--data-root", str(tiny_root), "--resolution", "16", "--target", "grey", "--target", "blue"]) == 2
    err = capsys.readouterr().err.strip()
    assert "server." in err and "fedstyle deploy certs" in err and "\n" not in err
    assert not out.exists()


def test_client_batching_is_refused_in_one_line(tiny_root, tmp_path, capsys):
    # each site trains one client in a process of its own: nothing to batch, so "on" would be ignored silently
    pytest.importorskip("flwr", reason="fedstyle deploy needs fedstyle[flower]")
    out = tmp_path / "dep"
    assert main(deploy_argv(out, tiny_root, "--insecure", "--client-batching", "on")) == 2
    err = capsys.readouterr().err.strip()
    assert "--client-batching" in err and "\n" not in err
    assert not out.exists()


# -- issue 55 item 3: deploy --resume never ignores a flag ------------------------------------------
@pytest.mark.parametrize("flags", [["--sites", "3"], ["--insecure"], ["--min-sites", "2"], ["--node-auth"]])
def test_resume_refuses_the_flags_that_would_change_the_federation(deployment_dir, capsys, flags):
    before = (deployment_dir / "flower" / "deploy.json").read_text()
    assert main(["deploy", "--resume", str(deployment_dir), *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and flags[0] in err and "--certs" in err  # names what it refuses and what it may change
    assert (deployment_dir / "flower" / "deploy.json").read_text() == before


def test_resume_applies_new_certificates_and_stores_absolute_paths(deployment_dir, tmp_path, monkeypatch):
    from fedstyle.cli.deploy import _resume_settings, _settings
    from fedstyle.runtimes.flower.deployment import load_settings

    certs = pytest.importorskip("fedstyle.runtimes.flower.certs")
    certs.make_certificates(tmp_path / "old-ca", hosts=[], sites=2)
    certs.make_certificates(tmp_path / "new-ca", hosts=[], sites=2)
    (deployment_dir / "flower" / "deploy.json").write_text(json.dumps({"sites": 2, "certs": str(tmp_path / "old-ca")}))
    monkeypatch.chdir(tmp_path)
    settings = _resume_settings(SimpleNamespace(certs="new-ca", round_timeout=60.0), deployment_dir)
    saved = load_settings(deployment_dir)
    assert saved == settings and saved.certs == str(tmp_path / "new-ca") and saved.round_timeout == 60.0
    assert saved.sites == 2  # what was not given stays as it was
    # a new deployment stores --certs as an absolute path: a resume from another folder finds it
    made = _settings(SimpleNamespace(sites=2, certs="new-ca", site_data_root=["data"]), local=True)
    assert made.certs == str(tmp_path / "new-ca") and made.site_data_roots == [str(tmp_path / "data")]


def test_resume_of_a_relative_certs_folder_from_elsewhere_names_the_folder_not_a_new_ca(deployment_dir, tmp_path,
                                                                                         monkeypatch):
    from fedstyle.cli.deploy import _resume_settings

    (deployment_dir / "flower" / "deploy.json").write_text(json.dumps({"sites": 2, "certs": "certs"}))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="resume from that folder, or give --certs DIR") as err:
        _resume_settings(SimpleNamespace(), deployment_dir)
    assert "deploy certs" not in str(err.value)


# -- issue 55 item 9: an expired certificate is named, and no message names a log that was removed ------
def expire_server_certificate(certs: Path, days_ago: int = 2) -> str:
    """Sign a new server.crt for server.key with the folder's CA, valid until ``days_ago`` days ago; the
    expiry date as the refusal writes it."""
    import datetime as dt

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization

    ca_key = serialization.load_pem_private_key((certs / "ca.key").read_bytes(), password=None)
    ca_cert = x509.load_pem_x509_certificate((certs / "ca.crt").read_bytes())
    old = x509.load_pem_x509_certificate((certs / "server.crt").read_bytes())
    now = dt.datetime.now(dt.timezone.utc)
    expired = now - dt.timedelta(days=days_ago)
    builder = (x509.CertificateBuilder().subject_name(old.subject).issuer_name(ca_cert.subject)
               .public_key(old.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - dt.timedelta(days=400)).not_valid_after(expired))
    for extension in old.extensions:
        builder = builder.add_extension(extension.value, extension.critical)
    (certs / "server.crt").write_bytes(builder.sign(ca_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM))
    return f"{expired:%Y-%m-%d %H:%M} UTC"


@pytest.fixture
def no_federation(monkeypatch):
    """Fail at once should a federation start (the refusals below must come before it)."""
    pytest.importorskip("flwr", reason="fedstyle deploy needs fedstyle[flower]")
    from fedstyle.runtimes.flower import deployment

    def refuse(self, timeout=120.0):
        raise AssertionError("the federation started on an expired certificate")

    monkeypatch.setattr(deployment.Federation, "start_superlink", refuse)


def test_an_expired_server_certificate_is_named_with_its_date_before_anything_starts(tiny_root, tmp_path, capsys,
                                                                                     no_federation):
    # the TLS handshake refuses it only as the sites connect: the deployment waited out --wait-timeout, then named
    # serverapp.log, which it removed with the run directory, and never the certificate
    from fedstyle.runtimes.flower.certs import make_certificates

    certs = tmp_path / "certs"
    make_certificates(certs, sites=2)
    expiry = expire_server_certificate(certs)
    out = tmp_path / "dep"
    assert main(deploy_argv(out, tiny_root, "--certs", str(certs))) == 2
    err = capsys.readouterr().err.strip()
    assert f"{certs / 'server.crt'} expired on {expiry}" in err and "\n" not in err
    assert "fedstyle deploy certs --out" in err and ".log" not in err
    assert not out.exists()


def test_a_resume_on_expired_certificates_names_them_and_the_command_that_continues(deployment_dir, tmp_path,
                                                                                     capsys, no_federation):
    from fedstyle.runtimes.flower.certs import make_certificates

    certs = tmp_path / "certs"
    make_certificates(certs, sites=2)
    (deployment_dir / "flower" / "deploy.json").write_text(json.dumps({"sites": 2, "certs": str(certs)}))
    expiry = expire_server_certificate(certs)  # it expired while the deployment was stopped
    assert main(["deploy", "--resume", str(deployment_dir)]) == 2
    err = capsys.readouterr().err.strip()
    assert f"{certs / 'server.crt'} expired on {expiry}" in err and "\n" not in err
    assert f"fedstyle deploy --resume {deployment_dir} --certs " in err
    assert not (deployment_dir / "metrics.jsonl").exists()


def test_a_failed_start_quotes_its_log_instead_of_naming_the_removed_file(tiny_root, tmp_path, capsys, monkeypatch):
    pytest.importorskip("flwr", reason="fedstyle deploy needs fedstyle[flower]")
    from fedstyle.runtimes.flower import deployment

    def superlink_fails(self, timeout=120.0):
        log = self.flower_dir / "superlink.log"
        log.write_text("starting\nssl: the key does not match\n")
        raise DeployError("the SuperLink exited (code 1)", log)

    monkeypatch.setattr(deployment.Federation, "start_superlink", superlink_fails)
    out = tmp_path / "dep"
    assert main(deploy_argv(out, tiny_root, "--insecure")) == 2
    err = capsys.readouterr().err
    assert "ssl: the key does not match" in err and "superlink.log (removed with the rest)" in err
    assert str(out / "flower") not in err and not out.exists()


#: a live deployment's owner: a Supervisor for the run directory's flower/ with one site process; argv: flower/
LIVE_OWNER = """
import os, sys, time
from pathlib import Path
from fedstyle.runtimes.flower.processes import Supervisor
with Supervisor(Path(sys.argv[1])) as supervisor:
    supervisor.launch("site-0", [sys.executable, "-c", "import time; time.sleep(120)"], dict(os.environ))
    print(supervisor.marker, flush=True)
    time.sleep(120)
"""


def test_a_resume_beside_a_live_deployment_names_it_as_running(deployment_dir, capsys):
    # not "processes OWNER SITE... of its earlier deployment are still running; kill ...": the deploy is no orphan
    out = deployment_dir
    owner = subprocess.Popen([sys.executable, "-c", LIVE_OWNER, str(out / "flower")], stdout=subprocess.PIPE, text=True)
    marker = owner.stdout.readline().strip()
    try:
        found: list[int] = []

        def one_site() -> bool:  # one scan's answer kept: a second scan can miss the site while it execs
            found[:] = marked_processes(marker)
            return len(found) == 1

        wait_for(one_site, 20, "the site")
        (site,) = found
        assert main(["deploy", "--resume", str(out)]) == 2
        err = capsys.readouterr().err.strip()
        assert f"a deployment is running (pid {owner.pid})" in err and "\n" not in err
        assert str(site) not in err.replace(str(out), "")
        owner.terminate()  # what the refusal says to do: the deploy stops its processes itself
        owner.wait(timeout=60)
        assert marked_processes(marker) == []
    finally:
        owner.kill()
        owner.wait()
        kill_all(marked_processes(marker))


# -- issue 55 item 11: a killed ServerApp is noticed at once, and no <defunct> one is left -------------
#: a SuperLink stand-in: its SuperExec, in a session of its own, starts the ServerApp and never waits for it
#: (Flower's SubprocessExecutor drops its Popen); argv: the ServerApp program, a file for the ServerApp's pid
FAKE_SUPERLINK = """
import subprocess, sys, time
superexec = ("import subprocess, sys, time\\n"
             "server = subprocess.Popen([sys.argv[1]])\\n"
             "open(sys.argv[2], 'w').write(str(server.pid))\\n"
             "time.sleep(120)\\n")
subprocess.Popen([sys.executable, "-c", superexec, *sys.argv[1:]], start_new_session=True)
time.sleep(120)
"""


def fake_serverapp(folder: Path, code: str) -> Path:
    """An executable named flwr-serverapp running ``code``."""
    folder.mkdir()
    program = folder / "flwr-serverapp"
    program.write_text(f"#!{sys.executable}\n{code}\n")
    program.chmod(0o755)
    return program


def start_fake_federation(federation, tmp_path, serverapp_code: str, flwr_run_seconds: float):
    """The fake SuperLink and `flwr run --stream` (a process that ends after ``flwr_run_seconds``, as the real one
    once the SuperLink has declared the run over); (that process, the ServerApp's pid)."""
    # as fedstyle's ServerApp, once it began the run: it says so (flower/serverapp.pid)
    began = ("from pathlib import Path\nfrom fedstyle.runtimes.flower.deployment import record_serverapp\n"
             f"record_serverapp(Path({str(federation.run_dir)!r}))\n")
    program = fake_serverapp(tmp_path / "bin", began + serverapp_code)
    pid_file = tmp_path / "serverapp.pid"
    federation.launch("superlink", [sys.executable, "-c", FAKE_SUPERLINK, str(program), str(pid_file)], federation.env())
    submitted = federation.launch("serverapp", [sys.executable, "-c", f"import time; time.sleep({flwr_run_seconds})"],
                                  federation.env())
    began = federation.flower_dir / "serverapp.pid"
    wait_for(lambda: pid_file.exists() and pid_file.read_text().strip() and began.exists(), 60, "the ServerApp to start")
    return submitted, int(pid_file.read_text())


def test_a_killed_serverapp_is_noticed_within_seconds(deployment_dir, tmp_path):
    # Flower's SuperLink declares the run over only after two missed heartbeats (51 s measured); `fedstyle deploy`
    # waited for that, then said "the run did not finish"
    from fedstyle.runtimes.flower.deployment import DeploySettings, Federation

    import threading

    killed = []

    def kill(pid):
        os.kill(pid, signal.SIGKILL)
        killed.append(time.monotonic())

    with Federation(deployment_dir, DeploySettings(sites=2, insecure=True), quiet=True) as federation:
        submitted, server = start_fake_federation(federation, tmp_path, "import time; time.sleep(120)", 30)
        timer = threading.Timer(2.0, kill, (server,))  # while the deployment waits for the run, as in a real one
        timer.start()
        try:
            with pytest.raises(DeployError, match=f"the ServerApp \\(pid {server}\\) ended before the run finished"):
                federation.wait(submitted, rounds=1)
        finally:
            timer.join()
        noticed = time.monotonic() - killed[0]
    print(f"a SIGKILLed ServerApp noticed after {noticed:.2f} s")
    assert noticed < 5


def test_no_defunct_serverapp_is_left_when_the_federation_returns(deployment_dir, tmp_path):
    # the ServerApp ended, unreaped by its SuperExec; once the SuperExec is stopped it was init's to reap, which
    # took up to 2 s here (`[flwr-serverapp] <defunct>` in ps after deploy returned)
    from fedstyle.runtimes.flower.deployment import DeploySettings, Federation

    with Federation(deployment_dir, DeploySettings(sites=2, insecure=True), quiet=True) as federation:
        _, server = start_fake_federation(federation, tmp_path, "pass", 120)
        wait_for(lambda: Path(f"/proc/{server}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z", 30,
                 "the ServerApp to end")
    assert not Path(f"/proc/{server}").exists()  # reaped, not <defunct>
