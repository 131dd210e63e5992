"""What a run records: one evaluation row of metrics.jsonl, the model-selection rule, summary.json.

:func:`evaluate_round` measures the round's model (source validation, targets, held-out validation,
peer-to-peer devices) and its traffic; :class:`Selector` follows the configured selection rule over
the rows; :func:`make_summary` turns the rows into summary.json, with :func:`divergence_warnings`
for a run that stayed finite but learned nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from fedstyle.errors import FedstyleError
from fedstyle.experiments.build import Experiment
from fedstyle.algorithms.style_exchange import style_privacy
from fedstyle.federation.evaluate import evaluate
from fedstyle.federation.rounds import RELEASES_ROW_KEY, releases_in_rows

SELECTION_LABELS = {
    "source_val": "source_val (best mean source-validation accuracy)",
    "heldout_val": "heldout_val (best accuracy on the held-out validation domain)",
    "last": "last (final round)",
    "oracle": "oracle (best on the target — optimistic, not a valid model selection)",
}


@dataclass
class Selector:
    """Tracks the model chosen by the selection rule over evaluations.

    ``pending``: the chosen row did not measure the targets (``--target-eval end``); the runner keeps that
    round's weights and measures them at the end (:meth:`resolve`).
    """

    rule: str
    best_score: float = -math.inf
    best_round: int = 0
    best_targets: dict[str, float] = field(default_factory=dict)
    pending: bool = False

    def score(self, record: dict[str, Any]) -> float:
        if self.rule == "source_val":
            values = list(record["source_val_acc"].values())
        elif self.rule == "heldout_val":
            values = list(record["heldout_val_acc"].values())
        elif self.rule == "oracle":
            values = list(record["target_acc"].values())
        else:  # last
            return float(record["round"])
        return sum(values) / len(values) if values else -math.inf

    def update(self, record: dict[str, Any]) -> bool:
        """Take ``record``'s round if it scores better (ties keep the earlier round); True when it did."""
        score = self.score(record)
        if not score > self.best_score:  # also a NaN score: never selected
            return False
        self.best_score, self.best_round = score, record["round"]
        self.best_targets = dict(record.get("target_acc", {}))
        self.pending = "target_acc" not in record
        return True

    @property
    def must_keep_weights(self) -> bool:
        """The chosen round's weights must be kept, to measure its targets at the end: a pending choice, except
        under ``last``, whose choice is the last round (its row measures the targets)."""
        return self.pending and self.rule != "last"

    def resolve(self, targets: dict[str, float]) -> None:
        """The pending round's target accuracy, measured on its kept weights."""
        self.best_targets, self.pending = dict(targets), False

    def state(self) -> dict[str, Any]:
        return {"rule": self.rule, "best_score": self.best_score, "best_round": self.best_round,
                "best_targets": self.best_targets, "pending": self.pending}



def mean(values) -> float:
    values = list(values)
    return sum(values) / len(values) if values else float("nan")


def evaluate_round(exp: Experiment, completed_rounds: int, train_loss: float, seconds: float,
                   train_metrics: dict[str, float] | None = None, releases: dict[int, int] | None = None,
                   targets: bool = True) -> dict[str, Any]:
    """One metrics.jsonl row. ``releases``: each client's defended style releases so far, logged in every row
    (``dp_releases_per_client``) so that eps can be counted from any row, whatever ``--eval-every``.
    ``targets=False`` (``--target-eval end`` before the last round) leaves out the held-out targets, and the
    peer-to-peer devices' accuracy on them: the row has no ``target_acc``."""
    sim = exp.simulator
    weights = sim.eval_weights()
    record: dict[str, Any] = {
        "round": completed_rounds,
        "seconds": round(seconds, 4),
        "train_loss": train_loss,
        "source_val_acc": evaluate(exp.model, weights, exp.source_val, exp.transform, exp.device),
    }
    if targets:
        record["target_acc"] = evaluate(exp.model, weights, exp.targets, exp.transform, exp.device)
    if exp.heldout_val:
        record["heldout_val_acc"] = evaluate(exp.model, weights, exp.heldout_val, exp.transform, exp.device)
    devices = sim.device_weights()
    if devices:  # peer-to-peer: the average model above, and every device's own model
        if targets:
            per_device = [evaluate(exp.model, w, exp.targets, exp.transform, exp.device) for w in devices]
            record["device_target_acc"] = {
                d: {"mean": mean(acc[d] for acc in per_device),
                    "std": float(_std([acc[d] for acc in per_device]))} for d in exp.targets
            }
        record["consensus_distance"] = sim.consensus()
    if train_metrics:  # the method's loss terms and timings (ctx.log / ctx.timed), see fedstyle.algorithms.context
        record["train_metrics"] = train_metrics
    if releases:
        record[RELEASES_ROW_KEY] = {str(cid): int(n) for cid, n in sorted(releases.items())}
    t = sim.traffic
    record.update({"bytes_up": t.up, "bytes_down": t.down, "bytes_model_up": t.model_up,
                   "bytes_model_down": t.model_down, "bytes_payload_up": t.payload_up,
                   "bytes_payload_down": t.payload_down})
    per_edge = t.per_edge_iteration()
    if per_edge:  # peer-to-peer: what one edge carries per iteration (weights and share apart)
        record["per_edge_iteration"] = per_edge
    return record


def _std(values: list[float]) -> float:
    if len(values) < 2:
        return 0.0
    m = mean(values)
    return math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))


def setup_record(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The setup exchange's metrics (the ``{"event": "setup"}`` line of metrics.jsonl), or {}."""
    for record in records:
        if record.get("event") == "setup":
            return {k: v for k, v in record.items() if k != "event"}
    return {}



def divergence_warnings(records: list[dict[str, Any]], num_classes: int, lr: float) -> list[str]:
    """Warnings for a run that stayed finite but blew up: a loss far above a uniform guess's, or one
    that grew while accuracy sits at chance."""
    rows = [r for r in records if "round" in r and "event" not in r and isinstance(r.get("train_loss"), float)]
    measured = [r for r in rows if isinstance(r.get("target_acc"), dict)]  # --target-eval end: the last row only
    if not measured:
        return []
    uniform = math.log(max(2, num_classes))
    first, last = rows[0]["train_loss"], rows[-1]["train_loss"]
    chance = 1.0 / max(1, num_classes)
    # --protocol all holds no target: its source validation is the accuracy it has
    which = "target_acc" if measured[-1]["target_acc"] else "source_val_acc"
    accuracy = mean(measured[-1].get(which, {}).values())
    out = []
    if last > 100 * uniform:
        out.append(f"the training loss reached {last:.3g}, far above a uniform guess's {uniform:.2f}: training "
                   f"likely diverged; lower --lr (now {lr:g})")
    elif last > 10 * first and last > 2 * uniform:
        out.append(f"the training loss grew from {first:.3g} to {last:.3g}: training likely diverged; lower --lr "
                   f"(now {lr:g})")
    if accuracy <= chance + 0.02 and (last > first or last > uniform):
        out.append(f"{'target' if which == 'target_acc' else 'source-validation'} accuracy {accuracy:.3f} is at "
                   f"chance ({chance:.3f}) and the loss did not fall: the "
                   f"model learned nothing; lower --lr (now {lr:g}) or train longer")
    return out


def _lazy_stylize_rate(records: list[dict[str, Any]]) -> dict[str, float]:
    """``stylized_images_per_s`` of the images made by training batches (CCST/PARDON, stylize=lazy):
    the rounds' stylized images over their stylization seconds (both means over the clients), or {}."""
    images = sum(r.get("train_metrics", {}).get("stylized_images", 0.0) for r in records)
    seconds = sum(r.get("train_metrics", {}).get("stylize_seconds", 0.0) for r in records)
    return {"training_stylized_images_per_s": images / seconds} if images and seconds > 0 else {}


def released_epsilon(hp: dict[str, Any], records: list[dict[str, Any]]) -> dict[str, Any]:
    """summary.json's ``style_privacy``: the defence's settings and the eps as released: ``epsilon_total`` over
    every release of the client that made the most (``releases_max``; a receiver sees all of one sender's
    releases, and the run's guarantee is its worst sender's: the audit's rule, fedstyle.audit.accounting), with
    ``releases_per_client`` from the last row's counts. None without noise or releases."""
    privacy = style_privacy(hp)
    released = releases_in_rows(records)
    most = max(released.values(), default=0)
    return {"dp_clip": hp["dp_clip"], "dp_noise": hp["dp_noise"], "dp_delta": hp["dp_delta"],
            "noise_source": hp.get("dp_noise_source"),
            "epsilon_total": privacy.total_epsilon(most) if privacy.noise > 0 and most else None,
            "epsilon_per_release": privacy.epsilon() if privacy.noise > 0 else None,
            "releases_max": most, "releases_per_client": {str(c): n for c, n in released.items()}}


def _mean_source_val(records: list[dict[str, Any]], round_: int | None = None) -> float | None:
    """The mean source-validation accuracy of round ``round_``'s evaluation (the last one: None)."""
    rows = [r for r in records if r.get("source_val_acc") and (round_ is None or r["round"] == round_)]
    return mean(rows[-1]["source_val_acc"].values()) if rows else None


def make_summary(exp: Experiment, records: list[dict[str, Any]], selector: Selector) -> dict[str, Any]:
    setup = setup_record(records)
    records = [r for r in records if "round" in r and "event" not in r]
    if not records:
        raise FedstyleError("the run finished without any evaluation")
    config, last = exp.config, records[-1]
    label = (config.label or exp.label) + (" (oracle)" if config.selection == "oracle" else "")
    summary = {
        "method": config.method,
        "label": label,
        "dataset": config.dataset,
        "protocol": config.protocol,
        "partition": config.partition,
        "topology": config.topology,
        "seed": config.seed,
        "selection": config.selection,
        "selection_rule": SELECTION_LABELS[config.selection],
        "selected_round": selector.best_round,
        "rounds": config.rounds,
        "num_clients": len(exp.client_specs),
        "num_classes": exp.dataset.num_classes,
        "targets": {d: {"selected": selector.best_targets.get(d), "last": last["target_acc"][d]} for d in exp.targets},
        # --protocol all holds no domain out: no target, so no average (None, not NaN: JSON has no NaN)
        "target_avg": {
            "selected": mean(selector.best_targets.values()) if exp.targets else None,
            "last": mean(last["target_acc"].values()) if exp.targets else None,
        },
        # the mean source-validation accuracy of the selected and the last model: beside the targets it tells
        # underfitting from a domain gap, and under --protocol all it is the only held-out measure
        "source_val": {"selected": _mean_source_val(records, selector.best_round), "last": _mean_source_val(records)},
        "seconds": last["seconds"],
        "bytes_up": last["bytes_up"],
        "bytes_down": last["bytes_down"],
        "traffic": {k: last[k] for k in last if k.startswith("bytes_")},
    }
    if "per_edge_iteration" in last:
        summary["traffic"]["per_edge_iteration"] = last["per_edge_iteration"]
    if setup:
        summary["setup"] = dict(setup, **_lazy_stylize_rate(records))
    if config.val_domain:
        summary["val_domain"] = config.val_domain
    if "device_target_acc" in last:
        summary["device_target_acc_last"] = last["device_target_acc"]
        summary["consensus_distance_last"] = last["consensus_distance"]
    if config.target_eval != "rounds":
        summary["target_eval"] = config.target_eval
    hp = exp.algorithm.hp
    if hp.get("dp_clip", 0) or hp.get("dp_noise", 0):  # the style defence: what was promised and how the noise was made
        summary["style_privacy"] = released_epsilon(hp, records)
    warnings = divergence_warnings(records, exp.dataset.num_classes, config.lr)
    if warnings:
        summary["warnings"] = warnings
    return summary
