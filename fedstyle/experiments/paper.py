"""A paper beside fedstyle: its reported numbers, its claims checked on a sweep's runs, and the presets.

A preset (``fedstyle reproduce NAME``) is a sweep file in ``fedstyle/experiments/presets/`` with
scales (see :mod:`fedstyle.experiments.grid`) plus what the paper says::

    [paper]
    title = "Federated Domain Generalization for Image Recognition via Cross-Client Style Transfer"
    cite = "Chen et al., WACV 2023"

    [[paper.results]]                      # one column of the paper's numbers (several allowed)
    name = "PACS, ResNet-50"
    dataset = "PACS"
    source = "Table 1"
    setting = "4 clients (one per domain), 500 rounds, ImageNet-pretrained ResNet-50"
    domains = ["P", "A", "C", "S"]
    [paper.results.numbers]                # row -> its average (avg) and, optionally, per domain
    fedavg = { P = 95.51, A = 82.23, C = 78.20, S = 73.56, avg = 82.37 }
    ccst-overall-k3 = 86.52                # a bare number is the average

    [[claim]]                              # an ordering of rows the paper reports
    says = "ccst-overall-k3 > fedavg"      # "a > b", "a < b", or a chain "a > b > c"
    source = "Table 1"
    claims = ["ccst-overall-k2 > ccst-overall-k1"]   # the short form, at the top of the file

Rows are variant names (``name[key=value]`` for a row a variant crosses itself). A claim is
checked on every report group of the sweep by the rule of :mod:`fedstyle.experiments.verdict`: the
paired differences per (held-out target, seed) of the two rows, and whether the 95 % interval of
their mean lies above 0 (holds), below 0 (fails) or around it (within noise); the verdict names its
cells and seeds, the differences in favour, and the sign test.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from fedstyle.errors import ConfigError
from fedstyle.experiments.rundir import DONE, SUMMARY
from fedstyle.experiments.verdict import (NOT_LEARNED_STATUS, RULE, STATUSES, judge_paired, not_learned_reason,
                                         target_cell)

PRESETS_DIR = Path(__file__).resolve().parent / "presets"
_ROW = r"[A-Za-z0-9._+@-]+(?:\[[^\]]*\])?"
_CLAIM = re.compile(rf"^\s*({_ROW})((?:\s*[<>]\s*{_ROW})+)\s*$")


@dataclass(frozen=True)
class PaperResults:
    """One column of the paper's numbers: row -> {"avg": x, <domain>: y, ...} (percent)."""

    name: str
    dataset: str
    source: str
    setting: str
    domains: tuple[str, ...]
    numbers: dict[str, dict[str, float]]


@dataclass(frozen=True)
class Paper:
    title: str
    cite: str
    note: str
    results: tuple[PaperResults, ...]


@dataclass(frozen=True)
class Claim:
    """``better`` is claimed above ``worse`` (``text`` as the paper file wrote it)."""

    better: str
    worse: str
    text: str
    source: str = ""


# ----------------------------------------------------------------------------- parsing


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{where}: {value!r} is not a number")
    return float(value)


def parse_paper(raw: Any, where: str) -> Paper | None:
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: [paper] must be a table (title, cite, [[paper.results]])")
    results = []
    for i, item in enumerate(raw.get("results", [])):
        here = f"{where}: [[paper.results]] {i + 1}"
        if not isinstance(item, Mapping) or not isinstance(item.get("numbers"), Mapping):
            raise ConfigError(f"{here} needs a dataset and a [paper.results.numbers] table of row = average")
        numbers = {}
        for row, value in item["numbers"].items():
            if isinstance(value, Mapping):
                if "avg" not in value:
                    raise ConfigError(f"{here}: numbers.{row} needs avg = the paper's average")
                numbers[row] = {k: _number(v, f"{here}: numbers.{row}.{k}") for k, v in value.items()}
            else:
                numbers[row] = {"avg": _number(value, f"{here}: numbers.{row}")}
        dataset = str(item.get("dataset", ""))
        if not dataset:
            raise ConfigError(f"{here} needs dataset = the paper's dataset (e.g. \"PACS\")")
        domains = tuple(item.get("domains", ()))
        results.append(PaperResults(str(item.get("name", dataset)), dataset, str(item.get("source", "")),
                                    str(item.get("setting", "")), domains, numbers))
    return Paper(str(raw.get("title", "")), str(raw.get("cite", "")), str(raw.get("note", "")), tuple(results))


def parse_claim_text(text: str, where: str, source: str = "") -> list[Claim]:
    """``"a > b"``, ``"a < b"`` or a chain ``"a > b > c"`` (each neighbouring pair is one claim)."""
    if not isinstance(text, str) or not _CLAIM.match(text):
        raise ConfigError(f"{where}: claim {text!r} is not an ordering like \"ccst > fedavg\" or \"a > b > c\"")
    tokens = re.findall(rf"{_ROW}|[<>]", text)
    rows, ops = tokens[0::2], tokens[1::2]
    if len(set(rows)) < len(rows):
        raise ConfigError(f"{where}: claim {text!r} names a row twice; an ordering compares different rows")
    claims = []
    for left, op, right in zip(rows, ops, rows[1:]):
        better, worse = (left, right) if op == ">" else (right, left)
        claims.append(Claim(better, worse, f"{left} {op} {right}", source))
    return claims


def parse_claims(data: Mapping[str, Any], where: str) -> list[Claim]:
    claims: list[Claim] = []
    short = data.get("claims", [])
    if not isinstance(short, list):
        raise ConfigError(f"{where}: claims must be a list of orderings, e.g. claims = [\"ccst > fedavg\"]")
    for text in short:
        claims += parse_claim_text(text, where)
    for i, item in enumerate(data.get("claim", [])):
        if not isinstance(item, Mapping) or "says" not in item:
            raise ConfigError(f"{where}: [[claim]] {i + 1} needs says = \"a > b\"")
        claims += parse_claim_text(item["says"], where, str(item.get("source", "")))
    return claims


def check_claim_rows(grid, rows: Sequence[str]) -> None:
    """Every row a claim or the paper's numbers name is a variant of the file (and a planned row, when
    it names crossed values of a variant that is planned)."""
    names = [c.better for c in grid.claims] + [c.worse for c in grid.claims]
    if grid.paper is not None:
        names += [row for r in grid.paper.results for row in r.numbers]
    planned_variants = {row.split("[")[0] for row in rows}
    for name in names:
        variant = name.split("[")[0]
        if variant not in grid.all_variants:
            raise ConfigError(f"{grid.where}: the paper's claims or numbers name {name!r}, which is no variant; "
                              f"variants: {', '.join(grid.all_variants)}")
        if "[" in name and variant in planned_variants and name not in rows:
            raise ConfigError(f"{grid.where}: the paper's claims or numbers name the row {name!r}; the grid's rows "
                              f"of {variant} are {', '.join(r for r in rows if r.split('[')[0] == variant)}")


# ----------------------------------------------------------------------------- presets


def preset_path(name: str) -> Path:
    """The preset file of ``name`` (or ``name`` itself when it is a path to a TOML file)."""
    path = Path(name)
    if name.endswith(".toml"):
        if not path.is_file():
            raise ConfigError(f"preset file {name} does not exist")
        return path
    from fedstyle.registry import did_you_mean

    candidate = PRESETS_DIR / f"{name.lower()}.toml"
    if not candidate.is_file():
        names = [p.stem for p in sorted(PRESETS_DIR.glob("*.toml"))]
        raise ConfigError(f"no preset {name!r}; {did_you_mean(name, names)}presets: {', '.join(names) or 'none'} "
                          "(`fedstyle reproduce --list`)")
    return candidate


def list_presets() -> list[tuple[str, dict[str, Any]]]:
    """(name, TOML data) of every preset shipped in the package, by name."""
    import tomllib

    out = []
    for path in sorted(PRESETS_DIR.glob("*.toml")):
        out.append((path.stem, tomllib.loads(path.read_text())))
    return out


# ----------------------------------------------------------------------------- statistics


@dataclass
class RowStats:
    """A row's per-seed averages over its held-out targets (percent), and its accuracy per (cell, seed) — a
    cell being a dataset and one held-out target (``"digits4 → mnistm"``) — which claims are judged on."""

    label: str
    per_seed: dict[int, float] = field(default_factory=dict)
    partial: bool = False
    per_cell: dict[tuple[str, int], float] = field(default_factory=dict)
    #: the same models' source-validation accuracy (percent), one value per finished run
    source_val: list[float] = field(default_factory=list)
    num_classes: int | None = None

    @property
    def source_val_mean(self) -> float | None:
        return statistics.fmean(self.source_val) if self.source_val else None

    @property
    def n(self) -> int:
        return len(self.per_seed)

    @property
    def mean(self) -> float | None:
        return statistics.fmean(self.per_seed.values()) if self.per_seed else None

    @property
    def std(self) -> float | None:
        return statistics.stdev(self.per_seed.values()) if self.n >= 2 else None

    def text(self) -> str:
        if self.mean is None:
            return "—"
        body = f"{self.mean:.1f}" if self.std is None else f"{self.mean:.1f} ± {self.std:.1f}"
        return body + ("*" if self.partial else "")


def row_stats(runs: Sequence[Any], which: str = "selected") -> dict[str, RowStats]:
    """Row id -> its statistics over the finished runs in ``runs`` (PlannedRun objects of one group)."""
    from fedstyle.errors import DataError
    from fedstyle.experiments.report.runs import RunRecord, read_metrics

    planned: dict[tuple[str, int], int] = {}
    values: dict[tuple[str, int], list[float]] = {}
    cells: dict[str, dict[tuple[str, int], float]] = {}
    labels: dict[str, str] = {}
    sources: dict[str, list[float]] = {}
    classes: dict[str, int] = {}
    for run in runs:
        labels.setdefault(run.row, run.row_label)
        key = (run.row, run.seed)
        planned[key] = planned.get(key, 0) + max(1, len(run.config.targets))
        if not (run.run_dir / DONE).exists():
            continue
        try:
            summary = json.loads((run.run_dir / SUMMARY).read_text())
        except (OSError, ValueError):
            continue
        try:
            metrics = read_metrics(run.run_dir / "metrics.jsonl", complete=True)
        except DataError:
            metrics = []  # a damaged metrics file: its source validation is unknown, its summary still counts
        fitted = RunRecord(run.run_dir, {}, summary, metrics, True).source_val_accuracy(which)
        if fitted is not None:
            sources.setdefault(run.row, []).append(100.0 * fitted)
        if isinstance(summary.get("num_classes"), int):
            classes[run.row] = summary["num_classes"]
        for target, entry in summary.get("targets", {}).items():
            if isinstance(entry, Mapping) and isinstance(entry.get(which), (int, float)):
                values.setdefault(key, []).append(100.0 * entry[which])
                cells.setdefault(run.row, {})[(target_cell(run.config.dataset, target), run.seed)] = 100.0 * entry[which]
    stats = {row: RowStats(label, per_cell=cells.get(row, {}), source_val=sources.get(row, []),
                           num_classes=classes.get(row)) for row, label in labels.items()}
    for (row, seed), accuracies in values.items():
        stats[row].per_seed[seed] = statistics.fmean(accuracies)
        if len(accuracies) < planned[(row, seed)]:
            stats[row].partial = True
    for (row, seed) in planned:
        if (row, seed) not in values and stats[row].per_seed:
            stats[row].partial = True
    return stats


@dataclass
class Verdict:
    claim: str
    source: str
    better: str
    worse: str
    status: str  # one of fedstyle.experiments.verdict.STATUSES, or "not run"
    gap: float | None = None  # the mean paired difference (points)
    low: float | None = None  # its 95 % confidence interval
    high: float | None = None
    ahead: int = 0  # paired differences in favour of the claim
    paired: int = 0  # paired differences
    sign_p: float | None = None
    cells: list[str] = field(default_factory=list)
    seeds: list[int] = field(default_factory=list)
    n_better: int = 0  # seeds with a finished run
    n_worse: int = 0
    paper_gap: float | None = None
    paper: str = ""
    text: str = ""


def judge(claim: Claim, stats: Mapping[str, RowStats], paper: Paper | None = None) -> Verdict:
    """Whether ``claim`` holds on these rows, by the rule of :mod:`fedstyle.experiments.verdict`: paired
    per (cell, seed) differences, their mean's 95 % t interval (holds / fails / within noise), the sign test."""
    verdict = Verdict(claim.text, claim.source, claim.better, claim.worse, "not run")
    if paper is not None:
        for result in paper.results:
            if claim.better in result.numbers and claim.worse in result.numbers:
                a, b = result.numbers[claim.better]["avg"], result.numbers[claim.worse]["avg"]
                verdict.paper_gap = a - b
                verdict.paper = f"{a:.2f} vs {b:.2f} ({a - b:+.2f}, {result.dataset})"
                break
    better, worse = stats.get(claim.better), stats.get(claim.worse)
    if better is None or worse is None or better.mean is None or worse.mean is None:
        absent = [name for name, s in ((claim.better, better), (claim.worse, worse)) if s is None]
        unfinished = [name for name, s in ((claim.better, better), (claim.worse, worse))
                      if s is not None and s.mean is None]
        parts = []
        if absent:
            parts.append(f"{' and '.join(absent)} {'is' if len(absent) == 1 else 'are'} not in this sweep")
        if unfinished:
            parts.append(f"{' and '.join(unfinished)} {'has' if len(unfinished) == 1 else 'have'} no finished run")
        verdict.text = "; ".join(parts)
        return verdict
    verdict.n_better, verdict.n_worse = better.n, worse.n
    paired = judge_paired(better.per_cell, worse.per_cell)
    verdict.status = paired.status
    verdict.gap, verdict.low, verdict.high = paired.mean, paired.low, paired.high
    verdict.ahead, verdict.paired, verdict.sign_p = paired.ahead, paired.n, paired.sign_p
    verdict.cells, verdict.seeds = paired.cells, paired.seeds
    verdict.text = paired.text() + ("; * some seeds lack targets" if better.partial or worse.partial else "")
    reason = not_learned_reason({claim.better: better.source_val_mean, claim.worse: worse.source_val_mean},
                                better.num_classes or worse.num_classes)
    if reason:  # a row at chance: the gap between the rows is noise about nothing
        verdict.status = NOT_LEARNED_STATUS
        verdict.text = f"{reason}; {verdict.text}"
    return verdict


# ----------------------------------------------------------------------------- rendering


def _escape(text: str) -> str:
    return text.replace("|", r"\|").replace("*", r"\*")


def paper_section(paper: Paper | None, claims: Sequence[Claim], stats: Mapping[str, RowStats], rows: Sequence[str],
                  dataset: str, labels: Mapping[str, str] | None = None) -> tuple[list[str], list[Verdict]]:
    """Markdown lines: the paper's numbers beside fedstyle's, and a verdict per claim; and the verdicts.

    ``labels``: row id -> its name in tables, for rows this sweep did not run."""
    labels = dict(labels or {})
    labels.update({row: s.label for row, s in stats.items()})
    lines: list[str] = []
    verdicts = [judge(c, stats, paper) for c in claims]
    if paper is None and not claims:
        return lines, verdicts
    lines += ["## Against the paper", ""]
    if paper is not None and (paper.title or paper.cite):
        lines += [f"Paper: {paper.title}" + (f" ({paper.cite})" if paper.cite else "") + ".", ""]
    if paper is not None and paper.note:
        lines += [paper.note, ""]
    if paper is not None and paper.results:
        for result in paper.results:
            lines.append(f"- **paper: {result.name}** — {result.source}" + (f"; {result.setting}" if result.setting
                                                                            else ""))
        lines += [f"- **fedstyle: {dataset}** — this sweep's runs (settings in the table above); mean ± sample std "
                  "over seeds of the average over held-out targets", ""]
        shown = [r for r in rows if r in stats or any(r in res.numbers for res in paper.results)]
        header = ["Row", *(f"paper: {r.name}" for r in paper.results), f"fedstyle: {dataset}", "n"]
        lines += ["| " + " | ".join(header) + " |", "|:--" + "|--:" * (len(header) - 1) + "|"]
        for row in shown:
            s = stats.get(row)
            label = labels.get(row, row)
            cells = [f"{res.numbers[row]['avg']:.2f}" if row in res.numbers else "—" for res in paper.results]
            lines.append("| " + " | ".join(_escape(c) for c in [label, *cells, s.text() if s else "—",
                                                                 str(s.n if s else 0)]) + " |")
        lines.append("")
        for result in paper.results:
            domains = list(result.domains) or sorted({d for v in result.numbers.values() for d in v if d != "avg"})
            if not domains:
                continue
            lines += [f"The paper's numbers per held-out domain ({result.name}, {result.source}):", "",
                      "| Row | " + " | ".join(domains) + " | Avg |", "|:--" + "|--:" * (len(domains) + 1) + "|"]
            for row, numbers in result.numbers.items():
                label = labels.get(row, row)
                cells = [f"{numbers[d]:.2f}" if d in numbers else "—" for d in domains]
                lines.append("| " + " | ".join([_escape(label), *cells, f"{numbers['avg']:.2f}"]) + " |")
            lines.append("")
    if verdicts:
        lines += ["### The paper's claims, checked here", "",
                  RULE, "",
                  "| Claim | paper | here: first | here: second | verdict |", "|:--|--:|--:|--:|:--|"]
        for v in verdicts:
            first, second = stats.get(v.better), stats.get(v.worse)
            claim = v.claim + (f" ({v.source})" if v.source else "")
            cells = [claim, v.paper or "—", (first.text() + f" (n={first.n})") if first else "—",
                     (second.text() + f" (n={second.n})") if second else "—"]
            lines.append("| " + " | ".join(_escape(c) for c in cells) + f" | **{v.status}**: {_escape(v.text)} |")
        lines.append("")
        counts = {status: sum(v.status == status for v in verdicts) for status in (*STATUSES, NOT_LEARNED_STATUS)}
        run = sum(v.status != "not run" for v in verdicts)
        stuck = counts[NOT_LEARNED_STATUS]
        lines += [f"Of {run} claims checked here: {counts['holds']} hold, {counts['fails']} fail, "
                  f"{counts['within noise']} within noise, {counts['not judged']} not judged (one seed)"
                  + (f", {stuck} not judged (a row did not learn)" if stuck else "")
                  + (f"; {len(verdicts) - run} not run" if run < len(verdicts) else "") + ".", ""]
    return lines, verdicts


def verdicts_json(verdicts: Sequence[Verdict]) -> list[dict[str, Any]]:
    return [asdict(v) for v in verdicts]
