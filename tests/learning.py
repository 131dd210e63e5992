"""The learning check's data, budget, variants and statistic (not collected: no test_ prefix).

``digits3x``: scikit-learn's 1,797 hand-written 8x8 digits (shipped in the package, so offline),
upsampled to 32x32 with a random shift of up to 3 pixels and drawn in four visual domains, a
disjoint quarter of the digits each: ``ink`` (white on black), ``paper`` (dark on light),
``colour`` (a random ink colour on a random, contrasting background) and ``noise`` (ink over
uniform noise, the held-out target). Ten classes, about 45 images per class and domain: small
enough to train on in seconds, hard enough that a method which does not fit its sources shows it
(a constant guess is 10 %, the ConvNet reaches ~90 % source-validation accuracy in the budget).

Shared by tests/test_learning.py (which asserts) and benchmarks/learning_check.py (which measures
every sound method and every known regression over several seeds and prints the table the test's
docstring summarises): the budget, the cost knobs, the regressions and the statistic live here once.
"""

from __future__ import annotations

import json
import math
import statistics
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ContextManager, Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

DOMAINS = ("ink", "paper", "colour", "noise")
TARGET = "noise"
SIZE = 32
#: the held-out target keeps every TARGET_EVERY-th of its digits (~110 images): the check never reads its
#: accuracy, and its evaluation after every round was ~60 % of the evaluation's cost. It is the last domain
#: drawn, so the source domains' images are the same as with all of it
TARGET_EVERY = 4

#: cost knob: the check's network is the Digits-DG ConvNet (fedstyle.models.convnet) 32 channels wide instead of
#: 64, registered as ``convnet_32ch`` around each run (:func:`check_backbone`). Every method's code path is the
#: same at any width; a run costs about half (one process each, imports included: FedAvg 16 -> 9.5 CPU s,
#: FedCCRL 52 -> 28, gPerXAN 30 -> 17; tests/test_learning.py with tests/test_loss_terms.py ~620 -> 287 CPU s on
#: two workers). The narrower network learns more slowly; each regression still sits 3+ spreads over its
#: method's ceiling (StableFDG now on two seeds, as StyleDDG: tests/test_learning.py's table)
WIDTH = 32

#: the budget of the methods with a known regression (REGRESSIONS): 3 source clients (one per domain), all
#: sampled each round, 6 rounds. Their regressions fall behind over the later rounds: at 4 rounds StableFDG's
#: ``explore_repeat`` sits 2.1 single-run spreads from the equal-distance point, against 3.3 at 6 (tests/
#: test_learning.py)
BUDGET = dict(rounds=6, local_steps=15, augment="crop", batch_size=32, lr=0.02, val_fraction=0.2, eval_every=1,
              backbone=f"convnet_{WIDTH}ch")
#: every other method's budget: the same with 4 rounds. With no regression to tell apart, the check only has to
#: see the method fit its sources at its measured rate, which the late loss of rounds 2-4 shows (the ceilings
#: are the same rule on seeds measured with this budget); a third less training for 22 of the 26 methods
SHORT_BUDGET = {**BUDGET, "rounds": 4}

#: cost knobs only: CCST and PARDON restyle with the ``fft`` backend (``lite`` decodes through a CNN, ~10x
#: the setup time on a CPU), FedGCA trains on J = 1 augmented view instead of 3 (every loss term still runs),
#: FedADG's generator is 256 -> 512 wide instead of the authors' 2,048 -> 4,096 (9.5 M weights, updated every
#: step: its run 41 -> 20 CPU s; the discriminator keeps its width, its terms' ratios stay 8.8x+ their floors)
COST_KNOBS: dict[str, dict[str, Any]] = {"ccst": {"style_backend": "fft"}, "pardon": {"style_backend": "fft"},
                                         "fedgca": {"augment_views": 1},
                                         "fedadg": {"noise_dim": 256, "gen_hidden": 512}}
#: what a method is compared with: FedAvg on a star, DSGD (peer-to-peer FedAvg) on a graph
REFERENCE = {"star": "fedavg", "complete": "dsgd"}


def _masks(images: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """8x8 digits (0..16) -> 32x32 ink masks in [0, 1], each shifted by up to 3 pixels."""
    x = torch.from_numpy(images / 16.0).float().unsqueeze(1)
    x = F.interpolate(x, size=(24, 24), mode="bilinear", align_corners=False).squeeze(1).numpy()
    out = np.zeros((len(x), SIZE, SIZE), dtype=np.float32)
    offsets = rng.integers(1, 8, size=(len(x), 2))
    for i, (dy, dx) in enumerate(offsets):
        out[i, dy : dy + 24, dx : dx + 24] = x[i]
    return out.clip(0, 1)


def _render(domain: str, mask: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    m = mask[..., None]
    if domain == "ink":
        img = 255 * m * np.ones(3)
    elif domain == "paper":
        img = 235 - 200 * m * np.ones(3)
    elif domain == "colour":
        fg = rng.uniform(0, 255, 3)
        bg = 255 - fg + rng.uniform(-40, 40, 3)  # contrasting background
        img = m * fg + (1 - m) * bg
    else:
        bg = rng.uniform(0, 200, (SIZE, SIZE, 3))
        img = m * 255 + (1 - m) * bg
    return np.clip(img, 0, 255).astype(np.uint8)


def write_digits3x(root: Path, seed: int = 0) -> Path:
    """root/<domain>/<class>/<i>.png (the folder dataset layout)."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    rng = np.random.default_rng(seed)
    masks = _masks(digits.images, rng)
    for d, domain in enumerate(DOMAINS):
        for i in range(d, len(masks), len(DOMAINS) * (TARGET_EVERY if domain == TARGET else 1)):
            folder = root / domain / str(int(digits.target[i]))
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(_render(domain, masks[i], rng)).save(folder / f"{i}.png")
    return root


# -- the variants: every registered method with its defaults, and the known regressions ----------------------
@contextmanager
def pytorch_default_projection_init():
    """MOON's projection head with PyTorch's default Linear init (the public code's; fedstyle's before issue
    21's follow-up): ``ProjectionNeck.reset_parameters`` does nothing, so the layers keep the init their
    constructors gave them. Test-only: there is no user option for it."""
    from fedstyle.models.necks import ProjectionNeck

    saved = ProjectionNeck.reset_parameters
    ProjectionNeck.reset_parameters = lambda self: None
    try:
        yield
    finally:
        ProjectionNeck.reset_parameters = saved


@contextmanager
def pooled_attention_embedding():
    """StableFDG's attention neck as before issue 21 (commit 15c9f94): the classifier sees
    [avgpool(z), A(z)] (2C = 128 features on the ConvNet) instead of [the backbone's own embedding, A(z)]
    (the flattened 64 x 2 x 2 map + 64 = 320). Test-only: no user option keeps the old neck."""
    from fedstyle.algorithms import stablefdg
    from fedstyle.models.attention import AttentionNeck

    class PooledAttentionNeck(AttentionNeck):
        def out_dim(self, backbone):
            return 2 * self.channels

        def forward(self, maps, partner=None):
            highlighted = torch.einsum("bhw,bchw->bc", self.weights(maps, partner), maps)
            return torch.cat([maps.mean((2, 3)), highlighted], 1)

    saved = stablefdg.AttentionNeck
    stablefdg.AttentionNeck = PooledAttentionNeck
    try:
        yield
    finally:
        stablefdg.AttentionNeck = saved


@dataclass(frozen=True)
class Variant:
    """One configuration the check trains: a method, its hyperparameters (cost knobs included) and, for a
    regression that no hyperparameter reaches, a test-only patch held around the run. ``guard``: for a
    regression this check does not see, the test that pins it instead, and why."""

    name: str
    method: str
    hparams: dict[str, Any] = field(default_factory=dict)
    patch: Callable[[], ContextManager] | None = None
    why: str = ""
    guard: str = ""

    @property
    def topology(self) -> str:
        from fedstyle.algorithms import METHODS

        return "star" if "star" in METHODS.get(self.method).topologies else "complete"

    def context(self) -> ContextManager:
        return self.patch() if self.patch is not None else nullcontext()


def sound(method: str) -> Variant:
    """A registered method with its defaults (and the cost knobs)."""
    return Variant(method, method, dict(COST_KNOBS.get(method, {})))


#: the known regressions (issue 35), each reached through a hyperparameter or a test-only patch
REGRESSIONS: tuple[Variant, ...] = (
    Variant("stablefdg:explore_repeat=every_firing_stage", "stablefdg", {"explore_repeat": "every_firing_stage"},
            why="issue 21: Eq. 4-5 compounded at every firing stage, (1 + alpha)^k from the batch centre"),
    Variant("stablefdg:pooled_attention", "stablefdg", {}, pooled_attention_embedding,
            why="issue 21: the attention neck's embedding was the pooled map, not the ConvNet's flattened map"),
    Variant("styleddg:mix_from=explored", "styleddg", {"mix_from": "explored"},
            why="issue 21: Eq. 19's MixStyle mixed within the explored styles"),
    Variant("pardon:batchnorm_stats=joint", "pardon", {"style_backend": "fft", "batchnorm_stats": "joint"},
            why="BatchNorm statistics over [x; x'] while the cross-entropy sees the originals only",
            guard="tests/test_pardon.py::test_transfers_change_neither_the_originals_features_nor_the_running_"
                  "statistics and ::test_a_training_step_moves_the_running_statistics_as_a_step_on_the_originals_"
                  "alone: the mixed statistics cost the held-out target (issue 21: 31.0 % vs 50.2 % on mnistm), "
                  "not the fit of the sources, which is what this check measures"),
    Variant("pardon:ce_views=both", "pardon", {"style_backend": "fft", "ce_views": "both"},
            why="cross-entropy on the originals and their transfers (PARDON-v3's reading)"),
    Variant("moon:pytorch_default_init", "moon", {}, pytorch_default_projection_init,
            why="the projection head with PyTorch's default Linear init (shrinks the signal ~sqrt(3) per layer)"),
)


# -- one run, its statistic and the check's rule ------------------------------------------------------------
#: the statistic: the mean training loss (the method's whole loss, each round's mean over its steps and clients)
#: of the last LATE_ROUNDS rounds, averaged over the method's SEEDS
LATE_ROUNDS = 3
#: the seeds a method trains on in the check (default: seed 0 alone). Two where one run's seed spread is too
#: wide for the method's regression to sit 3 spreads above a ceiling that the method sits 3 spreads under
#: (StyleDDG and ``mix_from=explored``: 2.5 single-run spreads; StableFDG and ``explore_repeat``: 2.2): averaging
#: two seeds divides the spread by sqrt(2) (see tests/test_learning.py)
SEEDS: dict[str, tuple[int, ...]] = {"stablefdg": (0, 1), "styleddg": (0, 1)}
#: a sanity floor beside it: the best source-validation accuracy (mean over the source domains, and over the
#: seeds) must reach this (chance: 0.1); the statistic above is what decides
ACCURACY_FLOOR = 0.15
#: a ceiling is at least this fraction above its method's measured mean (so that a spread measured small on
#: five seeds does not make a ceiling the next machine's float rounding crosses)
RELATIVE_SLACK = 0.04


def seeds(method: str) -> tuple[int, ...]:
    return SEEDS.get(method, (0,))


def budget_of(method: str) -> dict[str, Any]:
    """The budget ``method`` (and each of its regressions) trains with: BUDGET where the method has a known
    regression, else SHORT_BUDGET."""
    return BUDGET if any(r.method == method for r in REGRESSIONS) else SHORT_BUDGET


@dataclass
class Run:
    """What the check reads from one run's metrics.jsonl, per evaluated round."""

    losses: list[float]                 # the round's mean training loss (every term of the method's loss)
    source_val: list[float]             # source-validation accuracy, mean over the source domains
    terms: list[set[str]]               # the names the round logged (ctx.log)
    target: list[float] = field(default_factory=list)  # the held-out domain's accuracy (reported, not checked)
    metrics: list[dict[str, float]] = field(default_factory=list)  # the round's logged values

    @property
    def late_loss(self) -> float:
        """The mean training loss of the last LATE_ROUNDS rounds."""
        late = self.losses[-LATE_ROUNDS:]
        return sum(late) / len(late) if all(math.isfinite(v) for v in late) else math.inf

    @property
    def best_source_val(self) -> float:
        return max(self.source_val)

    def to_json(self) -> dict:
        return {"losses": self.losses, "source_val": self.source_val, "terms": [sorted(t) for t in self.terms],
                "target": self.target, "metrics": self.metrics}

    @classmethod
    def from_json(cls, row: dict) -> "Run":
        return cls(row["losses"], row["source_val"], [set(t) for t in row["terms"]], row.get("target", []),
                   row.get("metrics", []))


def statistic(runs: list[Run]) -> float:
    """The check's statistic: the late loss averaged over the runs (one per seed)."""
    return sum(r.late_loss for r in runs) / len(runs)


def failures(method: str, runs: list[Run]) -> list[str]:
    """Why ``runs`` of ``method`` (one per seed of :func:`seeds`) fail the learning check (empty: they pass)."""
    out = []
    ceiling, value = CEILINGS[method], statistic(runs)
    late = ", ".join(f"{r.late_loss:.3f}" for r in runs)
    if not value <= ceiling:
        out.append(f"{method}: mean training loss of the last {LATE_ROUNDS} rounds {value:.3f} (per seed {late}) is "
                   f"above its ceiling {ceiling:.3f}; per round {[[round(v, 3) for v in r.losses] for r in runs]}")
    best = sum(r.best_source_val for r in runs) / len(runs)
    if not best >= ACCURACY_FLOOR:
        out.append(f"{method}: best source-validation accuracy {best:.3f} is under {ACCURACY_FLOOR} (chance 0.1; "
                   f"per round {[[round(v, 3) for v in r.source_val] for r in runs]})")
    return out


@contextmanager
def check_backbone():
    """The check's ConvNet (:data:`WIDTH` channels) registered as ``convnet_{WIDTH}ch`` while a run is built and
    trained, and removed after (the package's own listing of backbones stays as it is)."""
    from fedstyle.models.convnet import ConvNet
    from fedstyle.models.registry import BACKBONES, STAGES_1_TO_3, BackboneSpec

    name = f"convnet_{WIDTH}ch"
    if name in BACKBONES:  # a run inside a run's context (nothing to add)
        yield
        return

    def build(input_size: int, pretrained: bool, weights) -> ConvNet:
        return ConvNet(input_size=input_size, channels=WIDTH)

    BACKBONES.add(name, BackboneSpec(build, STAGES_1_TO_3, None))
    try:
        yield
    finally:
        BACKBONES.unregister(name)


def train(root: Path, out: Path, variant: Variant, seed: int = 0, budget: dict | None = None) -> Run:
    """Train ``variant`` on digits3x with its method's budget (:func:`budget_of`, or ``budget``) on one torch
    thread."""
    from fedstyle.experiments.config import RunConfig
    from fedstyle.experiments.runner import run_experiment

    config = RunConfig(dataset="folder", data_root=str(root), resolution=SIZE, targets=[TARGET], method=variant.method,
                       topology=variant.topology, hparams=dict(variant.hparams), device="cpu", seed=seed,
                       **(budget or budget_of(variant.method)))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with variant.context(), check_backbone():
            run_experiment(config, out, quiet=True)
    finally:
        torch.set_num_threads(threads)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "train_loss" in r]
    return Run([r["train_loss"] for r in rows],
               [sum(r["source_val_acc"].values()) / len(r["source_val_acc"]) for r in rows],
               [set(r.get("train_metrics", {})) for r in rows],
               [sum(r["target_acc"].values()) / len(r["target_acc"]) for r in rows],
               [r.get("train_metrics", {}) for r in rows])


# -- the rule that places the ceilings, from the benchmark's seeds (tests/fixtures/learning_check.json) ----------
#: the measured late losses, best source-validation accuracies and term ratios per seed that the thresholds rest on
#: (written by benchmarks/learning_check.py --write-fixture)
FIXTURE = Path(__file__).parent / "fixtures" / "learning_check.json"


def mean_and_spread(values: Sequence[float], n: int) -> tuple[float, float]:
    """The mean of per-seed ``values`` and the seed-to-seed spread of an ``n``-seed mean: sample std / sqrt(n)."""
    return statistics.mean(values), statistics.stdev(values) / math.sqrt(n)


def ceilings_by_rule(late: Mapping[str, Sequence[float]]) -> dict[str, float]:
    """Each sound method's ceiling from ``late`` (variant name -> late loss per measured seed; sound methods under
    their method's name): the smallest of its mean plus the larger of 4 spreads and RELATIVE_SLACK of the mean,
    and, for each regression the statistic sees (no ``guard``), the point between the two means that is the same
    number of each one's spreads from both. Spreads are those of the statistic the check uses (n = the method's
    number of SEEDS). Rounded to 3 decimals."""
    out = {}
    for method, values in late.items():
        if ":" in method:
            continue
        n = len(seeds(method))
        m, s = mean_and_spread(values, n)
        ceiling = m + max(4 * s, RELATIVE_SLACK * m)
        for regression in REGRESSIONS:
            if regression.method == method and not regression.guard and regression.name in late:
                mr, sr = mean_and_spread(late[regression.name], n)
                ceiling = min(ceiling, (m * sr + mr * s) / (s + sr))
        out[method] = round(ceiling, 3)
    return out


def margins(late: Mapping[str, Sequence[float]], ceilings: Mapping[str, float]) -> dict[str, float]:
    """Per variant, how many spreads its mean sits on the right side of its method's ceiling (sound methods under
    it, regressions over it; negative: the wrong side)."""
    out = {}
    for name, values in late.items():
        method = name.split(":")[0]
        m, s = mean_and_spread(values, len(seeds(method)))
        out[name] = (ceilings[method] - m) / s if name == method else (m - ceilings[method]) / s
    return out


#: per method, the ceiling of the statistic (benchmarks/learning_check.py --propose; the rule and the measured
#: table are in tests/test_learning.py's docstring)
CEILINGS: dict[str, float] = {
    "ccst": 2.297, "dsgd": 1.908, "dsu": 2.125, "fedadg": 1.984, "fedavg": 2.073, "fedbn": 2.072, "fedccrl": 6.681,
    "feddg_fft": 2.19, "feddg_ga": 2.069, "feddyn": 2.032, "fedgca": 2.347, "fedgma": 2.156, "fediir": 2.101,
    "fedomg": 2.074, "fedprox": 2.077, "fedsam": 2.136, "fedsr": 3.564, "fpl": 4.224, "gperxan": 2.97,
    "jigen": 2.568, "mixstyle": 2.15, "moon": 2.446, "pardon": 2.147, "rsc": 2.297, "stablefdg": 2.096,
    "styleddg": 2.135,
}
