"""Where the time of a loopback `fedstyle deploy` goes: seconds per phase, from the processes' own logs.

Runs ``fedstyle deploy`` (SuperLink + N SuperNodes on 127.0.0.1, no TLS) with ``FLWR_LOG_LEVEL=DEBUG``,
which makes Flower timestamp every log line, and reads the milestones back from ``<out>/flower/*.log``:

    start-up        launch -> run directory written (CLI imports, the run built once to write config.json)
                    -> SuperLink listening -> every SuperNode registered -> ServerApp process started
                    -> first message at a site (the ServerApp built the run)
    identify        first identify received at a site -> last reply sent
    round r         first train message received -> last reply sent (the sites' part of the round)
    between rounds  aggregation, evaluation, checkpoint, and Flower's SuperNode poll (every 3 s when idle)
    shutdown        last reply -> ServerApp finished -> `done` -> every process exited, `fedstyle deploy` returned

and per message, averaged over the sites: SuperNode pulled it -> ``flwr-clientapp`` process up
(Flower's SuperExec poll + the interpreter importing Flower) -> ClientApp loaded -> reply pushed (fedstyle:
imports, the run rebuilt, the state loaded, the hook; the split is in fedstyle's own DEBUG line where
the code has it) -> reply sent.

    python benchmarks/deploy_timeline.py --out /tmp/deploy-timeline            # 3 sites, digits4, 2 rounds
    python benchmarks/deploy_timeline.py --out DIR --report-only               # parse an earlier run again
    python benchmarks/deploy_timeline.py --out DIR -- --local-steps 5          # extra `fedstyle deploy` flags

Wall-clock numbers depend on the machine's load: compare runs taken side by side.
"""

from __future__ import annotations

import argparse
import calendar
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

ANSI = re.compile(r"\x1b\[[0-9;]*m")
FLOWER_TS = re.compile(r"^(DEBUG|INFO|WARNING|ERROR)\s+(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\s*:\s*(.*)$")
UVICORN_TS = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3})Z (.*)$")
ROUND = re.compile(r"\[RUN \d+, ROUND (-?\d+)\]")
JOB = ["--method", "fedavg", "--dataset", "digits4", "--target", "mnist", "--partition", "per_domain"]


def lines(path: Path) -> list[tuple[float, str]]:
    """(unix time, message) of every timestamped line of a Flower / uvicorn log."""
    out = []
    if not path.exists():
        return out
    for raw in path.read_text(errors="replace").splitlines():
        line = ANSI.sub("", raw).strip()
        m = FLOWER_TS.match(line)
        if m:  # Flower's asctime: local time
            t = time.mktime(datetime.strptime(m.group(2), "%Y-%m-%d %H:%M:%S,%f").timetuple())
            out.append((t + int(m.group(2)[-3:]) / 1000, m.group(3)))
            continue
        m = UVICORN_TS.match(line)
        if m:  # uvicorn: UTC
            dt = datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S.%f")
            out.append((calendar.timegm(dt.timetuple()) + dt.microsecond / 1e6, m.group(2)))
    return out


def first(entries, needle: str) -> float | None:
    return next((t for t, msg in entries if needle in msg), None)


def last(entries, needle: str) -> float | None:
    found = [t for t, msg in entries if needle in msg]
    return found[-1] if found else None


def site_messages(path: Path) -> list[dict]:
    """The messages a site handled, in order: type, round and the time of each step."""
    messages, current, round_index = [], None, None
    for t, msg in lines(path):
        m = ROUND.search(msg)
        if m:
            round_index = int(m.group(1))
        if msg.startswith("Receiving: "):
            current = {"type": msg.split()[1], "round": round_index, "received": t}
            messages.append(current)
        elif current is None:
            continue
        elif msg.startswith("Received successfully"):
            current["pulled"] = t
        elif msg.startswith("Start `flwr-clientapp` process"):
            current["process"] = t
        elif msg.startswith("Loading ClientApp"):
            current["loading"] = t
        elif msg.startswith("fedstyle: client"):
            # "fedstyle: client 0 train round 1: import 0.10 s, build 1.20 s, ..." -> {"import": 0.1, ...}
            parts = [part.rsplit(" ", 2) for part in msg.split(": ", 2)[2].split(", ")]
            current["fedstyle"] = {name: float(value) for name, value, _ in parts}
        elif msg.startswith("Sending: "):
            current["sending"] = t
        elif msg.startswith("Sent successfully"):
            current["sent"] = t
            current = None
    return messages


def mean(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else None


def analyse(out: Path, launched: float | None, returned: float | None) -> dict:
    flower = out / "flower"
    superlink, serverapp = lines(flower / "superlink.log"), lines(flower / "serverapp.log")
    sites = {p.stem: site_messages(p) for p in sorted(flower.glob("site-*.log"))}
    every = [m for ms in sites.values() for m in ms]
    marks: list[tuple[str, float | None]] = []
    if launched is not None:
        marks.append(("launch", launched))
    marks += [
        ("run directory written", (out / "config.json").stat().st_mtime),
        ("SuperLink listening", first(superlink, "Uvicorn running on")),
        ("every SuperNode registered", last(superlink, "/v1/fleet/activate-node")),
        ("ServerApp process started", first(serverapp, "Start `flwr-serverapp` process")),
        ("first message at a site", min((m["received"] for m in every), default=None)),
    ]
    identify = [m for m in every if m["type"] == "query.identify"]
    if identify:
        marks.append(("identify: last reply sent", max(m.get("sent", 0) for m in identify)))
    rounds = sorted({m["round"] for m in every if m["type"] == "train"})
    for r in rounds:
        train = [m for m in every if m["type"] == "train" and m["round"] == r]
        marks.append((f"round {r + 1}: first train message at a site", min(m["received"] for m in train)))
        marks.append((f"round {r + 1}: last reply sent", max(m.get("sent", 0) for m in train)))
    marks += [("ServerApp finished", first(serverapp, "ServerApp finished running")),
              ("`done` written", (out / "done").stat().st_mtime if (out / "done").exists() else None)]
    if returned is not None:
        marks.append(("`fedstyle deploy` returned (every process exited)", returned))
    known = [(name, t) for name, t in marks if t]
    t0 = known[0][1]
    phases = []
    for (name, t), (_, before) in zip(known[1:], known[:-1]):
        phases.append({"milestone": name, "at_s": round(t - t0, 2), "phase_s": round(t - before, 2)})

    def per(kind: str) -> dict:
        ms = [m for m in every if m["type"] == kind]
        steps = {
            "SuperNode pulled -> flwr-clientapp up (SuperExec poll, Flower imports)":
                mean(m.get("process", 0) - m.get("pulled", 0) for m in ms if "process" in m and "pulled" in m),
            "flwr-clientapp up -> ClientApp loading": mean(m["loading"] - m["process"] for m in ms if "loading" in m and "process" in m),
            "ClientApp loading -> reply pushed (fedstyle)": mean(m["sending"] - m["loading"] for m in ms if "sending" in m and "loading" in m),
            "reply pushed -> sent to the SuperLink": mean(m["sent"] - m["sending"] for m in ms if "sent" in m and "sending" in m),
            "receiving -> sent (total)": mean(m["sent"] - m["received"] for m in ms if "sent" in m),
        }
        fed = [m["fedstyle"] for m in ms if "fedstyle" in m]
        if fed:
            for key in fed[0]:
                steps[f"  fedstyle: {key}"] = mean(f.get(key) for f in fed)
        return {"messages": len(ms), **{k: None if v is None else round(v, 2) for k, v in steps.items()}}

    between = []
    for a, b in zip(rounds, rounds[1:]):
        end = max(m.get("sent", 0) for m in every if m["type"] == "train" and m["round"] == a)
        start = min(m["received"] for m in every if m["type"] == "train" and m["round"] == b)
        between.append(round(start - end, 2))
    return {"phases": phases, "per_message": {k: per(k) for k in ("query.identify", "train") if any(m["type"] == k for m in every)},
            "between_rounds_s": between, "total_s": round(known[-1][1] - t0, 2)}


def report(result: dict) -> str:
    rows = ["| milestone | at (s) | phase (s) |", "|---|---:|---:|"]
    rows += [f"| {p['milestone']} | {p['at_s']:.1f} | {p['phase_s']:.1f} |" for p in result["phases"]]
    for kind, steps in result["per_message"].items():
        rows += ["", f"| per {kind} message (mean over {steps['messages']}) | s |", "|---|---:|"]
        rows += [f"| {k} | {'' if v is None else f'{v:.2f}'} |" for k, v in steps.items() if k != "messages"]
    rows += ["", f"between rounds (aggregation, evaluation, checkpoint, SuperNode poll): {result['between_rounds_s']} s",
             f"total: {result['total_s']:.1f} s"]
    return "\n".join(rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="run directory (replaced unless --report-only)")
    parser.add_argument("--sites", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--report-only", action="store_true", help="parse the logs of an earlier run in --out")
    parser.add_argument("extra", nargs="*", help="more `fedstyle deploy` flags (after --)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    timing = out.parent / (out.name + ".timing.json")
    launched = returned = None
    if not args.report_only:
        shutil.rmtree(out, ignore_errors=True)
        argv = [sys.executable, "-m", "fedstyle.cli.main", "deploy", "--sites", str(args.sites), "--insecure", "--quiet",
                *JOB, "--clients", str(args.sites), "--rounds", str(args.rounds), "--out", str(out), *args.extra]
        env = dict(os.environ, FLWR_LOG_LEVEL="DEBUG")
        launched = time.time()
        subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL)
        returned = time.time()
        timing.write_text(json.dumps({"launched": launched, "returned": returned, "argv": argv,
                                      "load_average": os.getloadavg()}))
    elif timing.exists():
        saved = json.loads(timing.read_text())
        launched, returned = saved["launched"], saved["returned"]
    result = analyse(out, launched, returned)
    if timing.exists():
        result["load_average_at_end"] = json.loads(timing.read_text()).get("load_average")
    (out.parent / (out.name + ".timeline.json")).write_text(json.dumps(result, indent=2))
    print(report(result))
    if result.get("load_average_at_end"):
        print(f"load average at the end: {result['load_average_at_end']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
