"""What StableFDG's style exploration (Eq. 4-5) does to the features at its firing stage (issue 35 section 2).

StableFDG extrapolates the oversampled part of every batch away from the batch's mean style,

    mu_e = mu + alpha (mu - mean_b mu),   sigma_e = sigma + alpha (sigma - mean_b sigma)   (Eq. 4-5, alpha = 3),

and restyles each explored sample-channel by AdaIN, x_e = sigma_e (x - mu) / sigma + mu_e, i.e. it scales the
channel's deviations by |sigma_e| / sigma. A sample-channel whose sigma is far below the batch's mean sigma
(a map that is nearly constant: after a ReLU, a feature that fires at few positions of that image) gets
sigma_e ~ -alpha * mean sigma, so its few residual deviations are blown up by ~alpha * mean sigma / sigma into
a full-contrast map (and, with a negative sigma_e, inverted).

This script runs a StableFDG run (the settings of any run folder's ``config.json``, e.g. one of
``benchmarks/stablefdg_table.py`` or ``fedstyle reproduce stablefdg``) in this process with a recorder around
the firing stage (:func:`fedstyle.style.fused.explore_and_mix`, as the pipeline calls it), and prints per round:

* the share of sample-channels at the firing stage whose sigma is under 10 % / 1 % of their channel's batch
  mean sigma (near-constant maps), excluding exactly constant ones (variance under 1e-10: AdaIN maps those
  to the constant mu_e whatever the scale);
* over the explored (oversampled) sample-channels: the share whose AdaIN scale |sigma_e| / sigma exceeds
  10x and 100x, the largest scale, and the share with sigma_e < 0 (contrast inverted); over the explored
  samples: the share with at least one channel scaled over 10x / 100x;
* the mean training loss of the round (metrics.jsonl).

The statistics are those the method itself uses (biased per-sample variance + 1e-6, the batch mean as the
centre; ``reference_code=true`` runs are read the same way, so their unbiased variances are not mirrored).

    PYTHONPATH=. python benchmarks/stablefdg_exploration.py RUN_DIR [--rounds N] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
from collections import defaultdict
from pathlib import Path

import torch

import fedstyle.algorithms.stablefdg_pipeline as pipeline
from fedstyle.errors import ConfigError
from fedstyle.experiments.config import RunConfig
from fedstyle.experiments.runner import run_experiment
from fedstyle.models.base import Classifier
from fedstyle.style.stats import channel_stats

#: the round a client is training (Classifier.enter_round is told it before every client's local training)
_current_round = [0]


class FiringStageRecorder:
    """Wraps ``explore_and_mix``: counts, per round, what Eq. 4-5 would do to each sample-channel it sees."""

    def __init__(self, wrapped):
        self.wrapped = wrapped
        self.sums: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.largest: dict[int, float] = defaultdict(float)

    def __call__(self, x, start, alpha, **kwargs):
        if start is not None and start < x.shape[0]:
            self.record(x.detach(), start, alpha, kwargs.get("center_count"))
        return self.wrapped(x, start, alpha, **kwargs)

    @torch.no_grad()
    def record(self, x: torch.Tensor, start: int, alpha: float, center_count: int | None) -> None:
        mu, sigma = channel_stats(x.float())
        variance = sigma.square() - 1e-6
        centre = (sigma if center_count is None else sigma[:center_count]).mean(0, keepdim=True)
        varying = variance > 1e-10  # exactly constant maps: AdaIN returns the constant mu_e, no scale applies
        relative = sigma / centre.clamp_min(1e-12)
        sigma_e = sigma[start:] + alpha * (sigma[start:] - centre)
        scales = torch.where(varying[start:], sigma_e.abs() / sigma[start:], torch.zeros_like(sigma_e))
        scale = scales[varying[start:]]
        largest_per_sample = scales.flatten(1).amax(1)
        row = self.sums[_current_round[0]]
        row["calls"] += 1
        row["channels"] += sigma.numel()
        row["constant"] += (~varying).sum().item()
        row["below_10pct"] += (varying & (relative < 0.1)).sum().item()
        row["below_1pct"] += (varying & (relative < 0.01)).sum().item()
        row["explored"] += sigma_e.numel()
        row["explored_varying"] += scale.numel()
        row["scale_over_10"] += (scale > 10).sum().item()
        row["scale_over_100"] += (scale > 100).sum().item()
        row["negative"] += (sigma_e < 0).sum().item()
        row["explored_samples"] += largest_per_sample.numel()
        row["samples_over_10"] += (largest_per_sample > 10).sum().item()
        row["samples_over_100"] += (largest_per_sample > 100).sum().item()
        if scale.numel():
            self.largest[_current_round[0]] = max(self.largest[_current_round[0]], scale.max().item())


def _percent(part: float, whole: float) -> str:
    return f"{100 * part / whole:.1f}" if whole else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path, help="a run folder whose config.json gives the setting (method stablefdg)")
    parser.add_argument("--rounds", type=int, default=None, help="train this many rounds instead (default: the run's)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="change a setting (JSON value), e.g. --set seed=1 or --set hparams.explore=false")
    parser.add_argument("--out", type=Path, default=None, help="where the run is written (default: a temporary folder)")
    args = parser.parse_args()

    config_path = args.run_dir / "config.json"
    if not config_path.is_file():
        parser.error(f"{config_path} does not exist; give a run folder (one with config.json), e.g. one of "
                     "benchmarks/stablefdg_table.py's or `fedstyle reproduce stablefdg`'s runs")
    settings = json.loads(config_path.read_text())
    if settings.get("method") != "stablefdg":
        parser.error(f"{args.run_dir} is a {settings.get('method')!r} run; give a stablefdg run's folder")
    for item in args.set:
        key, _, value = item.partition("=")
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            pass
        if key.startswith("hparams."):
            settings.setdefault("hparams", {})[key.removeprefix("hparams.")] = value
        else:
            settings[key] = value
    if args.rounds is not None:
        settings["rounds"] = args.rounds
        settings["eval_every"] = min(settings.get("eval_every", 1), args.rounds)
    try:
        config = RunConfig.from_mapping(settings, f"{config_path} with --set {args.set}")
    except ConfigError as err:  # a misspelt --set key or a bad value: one line, nothing run
        parser.error(str(err))

    recorder = FiringStageRecorder(pipeline.explore_and_mix)
    pipeline.explore_and_mix = recorder
    enter_round = Classifier.enter_round

    def remember_round(model, round_number):
        _current_round[0] = round_number
        return enter_round(model, round_number)

    Classifier.enter_round = remember_round
    with tempfile.TemporaryDirectory() as scratch:
        out = args.out or Path(scratch) / "run"
        try:
            run_experiment(config, out, quiet=True)
        except ConfigError as err:  # refused before training (a bad value, a used --out): one line
            parser.error(str(err))
        losses = {row["round"]: row.get("train_loss") for row in map(json.loads, (out / "metrics.jsonl").open())
                  if "round" in row and "train_loss" in row}

    print(f"StableFDG's firing stage, {config.dataset} -> {', '.join(config.targets)}, {config.backbone}, alpha "
          f"{config.hparams.get('alpha', 3.0)}, seed {config.seed}: sample-channels per round")
    print("| round | batches | constant % | sigma < 10 % of the batch mean, % | < 1 %, % | explored: scale > 10x, % "
          "| > 100x, % | largest scale | sigma_e < 0, % | explored samples with a channel > 10x, % | > 100x, % "
          "| train loss |")
    print("|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
    for round_number in sorted(recorder.sums):
        row = recorder.sums[round_number]
        loss = losses.get(round_number)
        print(f"| {round_number} | {int(row['calls'])} | {_percent(row['constant'], row['channels'])} "
              f"| {_percent(row['below_10pct'], row['channels'])} | {_percent(row['below_1pct'], row['channels'])} "
              f"| {_percent(row['scale_over_10'], row['explored_varying'])} "
              f"| {_percent(row['scale_over_100'], row['explored_varying'])} | {recorder.largest[round_number]:.0f} "
              f"| {_percent(row['negative'], row['explored'])} "
              f"| {_percent(row['samples_over_10'], row['explored_samples'])} "
              f"| {_percent(row['samples_over_100'], row['explored_samples'])} "
              f"| {'-' if loss is None or not math.isfinite(loss) else f'{loss:.2f}'} |")


if __name__ == "__main__":
    main()
