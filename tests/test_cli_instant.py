"""Instant answers (issue 53): the command line's listings and refusals import no torch, parsers refuse
abbreviated options, and misspelt names and options get "did you mean" with the right command's usage."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from fedstyle.cli import catalog
from fedstyle.cli.main import main

HEAVY = ("torch", "matplotlib", "flwr", "datasets", "mlflow")


def _modules_after(argv: list[str]) -> tuple[int, set[str], str]:
    """Run ``fedstyle ARGV`` in a fresh interpreter; its exit status, which heavy modules it imported, stderr."""
    code = f"""
import json, sys
from fedstyle.cli.main import main
try:
    status = main({argv!r})
except SystemExit as exit:
    status = exit.code
print(json.dumps([status, sorted(m for m in {HEAVY!r} if m in sys.modules)]))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    status, heavy = json.loads(done.stdout.strip().splitlines()[-1])
    return status, set(heavy), done.stderr


@pytest.mark.parametrize("argv, status", [
    (["--help"], 0), (["--version"], 0), (["methods"], 0), (["methods", "ccst"], 0), (["data", "list"], 0),
    (["reproduce", "--list"], 0), (["reproduce", "--list", "ccst"], 0), (["run", "--help"], 0),
    (["run", "--method", "ccts", "--out", "never"], 2), (["run", "--rouns", "1"], 2),
    (["run", "--method", "fedavg", "--target", "mnsit", "--out", "never"], 2),
    (["run", "--method", "fedprox", "--hp", "mu2=0.1", "--out", "never"], 2),
    (["run", "--dataset", "digit4", "--out", "never"], 2), (["rnu"], 2),
    (["report", "nowhere", "--claim", "A > A"], 2),
])
def test_listings_and_refusals_never_import_torch(argv, status):
    """Each answers without torch (or matplotlib, flwr, datasets, mlflow): importing torch alone takes seconds."""
    got, heavy, stderr = _modules_after(argv)
    assert got == status, stderr
    assert heavy == set(), f"fedstyle {' '.join(argv)} imported {heavy}"


def test_every_parser_refuses_abbreviations_and_names_the_option(capsys):
    """--round is not --rounds (argparse's prefix matching is off), and the error is run's, with its usage."""
    with pytest.raises(SystemExit) as exit:
        main(["run", "--round", "1", "--out", "never"])
    assert exit.value.code == 2
    err = capsys.readouterr().err
    assert "usage: fedstyle run " in err and "fedstyle run: error: unrecognized arguments: --round 1" in err
    assert "did you mean --rounds?" in err
    with pytest.raises(SystemExit):
        main(["reproduce", "ccst", "--scal", "smoke"])
    err = capsys.readouterr().err
    assert "usage: fedstyle reproduce" in err and "did you mean --scale?" in err


def test_a_bad_choice_suggests_the_close_one(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--partition", "lamda"])
    assert "invalid choice: 'lamda'; did you mean lambda?" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["rnu"])
    assert "did you mean run?" in capsys.readouterr().err


@pytest.mark.parametrize("argv, said", [
    (["run", "--method", "ccts", "--out", "never"], "unknown method 'ccts'; did you mean 'ccst'?"),
    (["run", "--method", "fedavg", "--target", "mnsit", "--out", "never"],
     "--target 'mnsit' is no domain of digits4; did you mean 'mnist'"),
    (["run", "--dataset", "pac", "--out", "never"], "unknown dataset 'pac'; did you mean 'pacs'?"),
    (["run", "--method", "fedprox", "--hp", "mu2=0.1", "--out", "never"],
     "unknown hyperparameter 'mu2' for method 'fedprox'; did you mean 'mu'?"),
    (["run", "--backbone", "resnet19", "--out", "never"], "unknown backbone 'resnet19'; did you mean 'resnet18'"),
])
def test_misspelt_names_get_did_you_mean(argv, said, tmp_path, capsys):
    assert main(argv) == 2
    assert said in capsys.readouterr().err
    assert not (tmp_path / "never").exists()


def test_version_names_the_package(capsys):
    with pytest.raises(SystemExit) as exit:
        main(["--version"])
    assert exit.value.code == 0
    assert capsys.readouterr().out.startswith("fedstyle ")


def test_methods_prints_one_line_per_method_and_a_method_in_detail(capsys):
    assert main(["methods"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    methods = catalog.load()["methods"]
    body = [line for line in lines[1:] if line.split(" ")[0] in methods]
    assert len(body) == len(methods) and len(lines) <= len(methods) + 3
    ccst = next(line for line in body if line.startswith("ccst "))
    assert "style-sharing" in ccst and "Chen et al., WACV 2023" in ccst and "style statistics" in ccst
    assert main(["methods", "fedAvg"]) == 0  # any case, and the detail is accepted
    detail = capsys.readouterr().out
    assert detail.startswith("fedavg: FedAvg") and "--hp" in detail and "style_p=0.5" in detail


def test_reproduce_list_is_one_line_per_paper_and_a_paper_shows_its_tracks_own_scales(capsys):
    from fedstyle.experiments.paper import list_presets

    assert main(["reproduce", "--list"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert len(lines) == len(list_presets()) + 1  # one per paper and how to see one
    assert main(["reproduce", "--list", "ccst"]) == 0
    out = capsys.readouterr().out
    tracks = out.split("  --track ")
    scratch = next(t for t in tracks if t.startswith("from-scratch"))
    batchstats = next(t for t in tracks if t.startswith("pretrained-batchstats"))
    smoke = next(line for line in batchstats.splitlines() if "--scale smoke" in line)
    # the batch-statistics track extends the pretrained one: its smoke scale is the pretrained track's
    assert "1 round x 2 local steps" in smoke
    assert smoke not in scratch
    assert "ccst-overall-k3" in out and "CCST (overall, K=3)" in out


def test_run_help_shows_examples_first(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    out = capsys.readouterr().out
    assert out.index("examples:") < out.index("--config FILE.toml  ")
    assert out.index("examples:") < 20 * 80  # within the first screen


def _tour_commands() -> list[tuple[str, str]]:
    """(where, command line) of every command in the two tours: `fedstyle --help`'s and docs/cli.md's."""
    from pathlib import Path

    from fedstyle.cli.main import MAIN_EPILOG

    page = (Path(__file__).resolve().parents[1] / "docs" / "cli.md").read_text()
    tour = page.split("## A tour", 1)[1].split("```text", 1)[1].split("```", 1)[0]
    lines = [("fedstyle --help", line) for line in MAIN_EPILOG.splitlines()]
    lines += [("docs/cli.md", line) for line in tour.splitlines()]
    # a command ends where its explanation starts: two spaces or more
    return [(where, line.strip().split("   ")[0].split("  ")[0]) for where, line in lines
            if line.strip().startswith("fedstyle ")]


@pytest.mark.parametrize("where, command", _tour_commands())
def test_every_command_of_the_tours_parses(where, command, capsys):
    """A tour names only commands and options the parser takes (a renamed command would leave the tour lying)."""
    import shlex

    from fedstyle.cli.main import build_parser

    try:
        build_parser().parse_args(shlex.split(command)[1:])
    except SystemExit as exit:  # --help and --version exit 0; a refusal exits 2
        assert exit.code == 0, f"{where}'s tour: `{command}` is refused: {capsys.readouterr().err}"


def test_an_os_error_on_a_users_path_names_the_fix(tmp_path, capsys):
    """`--out FILE` where a folder goes said only "File exists: FILE"."""
    in_the_way = tmp_path / "afile"
    in_the_way.write_text("")
    assert main(["leaderboard", "show", "--out", str(in_the_way), "--no-figures"]) == 2
    assert capsys.readouterr().err.strip() == (f"fedstyle: error: File exists: {in_the_way}; a file is in the way of "
                                               "a folder there: give a folder (or a new name) instead")


def test_every_os_error_fix_is_advice():
    import errno

    from fedstyle.cli.main import os_error_fix

    assert os_error_fix(OSError(errno.ENOSPC, "No space left on device")).startswith("the disk is full")
    assert os_error_fix(OSError(errno.EPIPE, "Broken pipe")) == ""  # no general advice: the OS's words alone


def test_refusals_name_the_right_command(tmp_path, capsys):
    """Hints that pointed at the wrong fix: a file audited as a run spoke of "--out FILE/audit"; an empty
    folder resumed by `deploy` was told to start a `fedstyle run`."""
    a_file = tmp_path / "afile"
    a_file.write_text("")
    assert main(["audit", "privacy", str(a_file)]) == 2
    said = capsys.readouterr().err
    assert f"{a_file} is no run directory (a file); give the folder `fedstyle run --out` wrote" in said
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["deploy", "--resume", str(empty)]) == 2
    assert f"start one with `fedstyle deploy --out {empty} ...`" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["deploy", "certs", "--sites", "-1"], "--sites must be 0 or more, got -1"),
    (["deploy", "certs", "--host", "bad host!"], "--host 'bad host!' is no host name or IP address"),
    (["deploy", "site", "--superlink", "coord", "--insecure", "--partition-id", "0"],
     "--superlink coord: give HOST:PORT"),
    (["deploy", "site", "--superlink", "a:9093", "--insecure", "--partition-id", "-1"],
     "--partition-id must be 0 or more"),
    (["deploy", "site", "--superlink", "a:9093", "--root-certificates", "/no/ca.crt", "--partition-id", "0"],
     "--root-certificates /no/ca.crt is not a file"),
])
def test_deploy_refuses_what_flower_would_fail_on_later(tmp_path, capsys, argv, message):
    """Negative site counts and partition ids, bad host names, a SuperLink address without a port: certificates
    were written, a SuperNode started."""
    if argv[1] == "certs":
        argv = [*argv, "--out", str(tmp_path / "certs")]
    assert main(argv) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "certs").exists()


#: whole words the docs write for a value the reader picks, and a value of the right type to parse in their place
DOC_PLACEHOLDERS = {"K": "0"}  # `--partition-id K`: site K of a deployment
_SHELL_ENDS = {"|", "&&", "||", ";", ">", ">>", "2>&1", "&"}


def _doc_commands() -> list[tuple[str, str]]:
    """(page, command) of every ``fedstyle ...`` line in a code block of the README and docs/: continuation lines
    joined, ``VAR=value`` prefixes, comments, shell operators, the tours' explanations and ``...`` dropped.
    Transcripts (``$ fedstyle ...``) are left out: they show refusals on purpose."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    out = []
    for page in [root / "README.md", *sorted((root / "docs").rglob("*.md"))]:
        in_code, pending = False, ""
        for line in page.read_text(encoding="utf-8").splitlines():
            if line.strip().startswith(("```", "~~~")):
                in_code, pending = not in_code, ""
                continue
            if not in_code:
                continue
            text = pending + line.strip()
            if text.endswith("\\"):
                pending = text[:-1] + " "
                continue
            pending = ""
            text = re.sub(r"^(?:[A-Z_]+=\S*\s+)+", "", text).removeprefix(".venv/bin/")
            if text.startswith("fedstyle ") and not re.match(r"fedstyle(?: [\w-]+)*: ", text):  # not its output
                out.append((page.relative_to(root).as_posix(), re.split(r"\s{3,}", text)[0]))
    return out


@pytest.mark.parametrize("page, command", _doc_commands())
def test_every_command_in_the_docs_parses(page, command, capsys):
    """The docs name only commands and options the parser takes: a renamed option leaves no page lying."""
    import shlex

    from fedstyle.cli.main import build_parser

    words = []
    for word in shlex.split(command, comments=True)[1:]:
        if word in _SHELL_ENDS:
            break
        if word != "...":
            words.append(DOC_PLACEHOLDERS.get(word, word))
    try:
        build_parser().parse_args(words)
    except SystemExit as exit:  # --help and --version exit 0; a refusal exits 2
        assert exit.code == 0, f"{page}: `{command}` is refused: {capsys.readouterr().err}"


def test_the_docs_command_reader_finds_the_commands():
    """The reader above finds what the docs hold (it cannot pass by finding nothing)."""
    commands = _doc_commands()
    assert len(commands) > 100
    assert ("docs/cli.md", "fedstyle leaderboard run --workers 2") in commands
    assert not any("--rouns" in command for _, command in commands)  # a transcript and its output


def test_cache_clear_help_lists_every_kind_the_cache_has(capsys):
    """The help's list is written in the CLI (importing the cache imports torch); it listed five of seven kinds
    (PARDON's transfers and the client styles were missing) until this test compared it with the cache's."""
    from fedstyle.cli.main import CACHE_KINDS
    from fedstyle.data.cache import DERIVED_KINDS

    assert list(CACHE_KINDS) == ["datasets", *DERIVED_KINDS]
    with pytest.raises(SystemExit):
        main(["cache", "clear", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert all(kind in help_text for kind in CACHE_KINDS)
