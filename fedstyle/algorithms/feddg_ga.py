"""FedDG-GA: generalization adjustment of the aggregation weights (Zhang et al., CVPR'23; baselines notes §5).

Local training is FedAvg's; the server keeps one aggregation weight a_i per client (a probability
vector over all N clients, ``server.state``, checkpointed; a_i = 1/N at the start, the paper's
uniform initialisation) and moves it each round towards the clients whose generalization gap is
larger:

    G_i   = L(w^r; D_i) - L(w_i; D_i)                 the gap (``metric=loss``, s = +1), or
    G_i   = Acc(w^r; D_i) - Acc(w_i; D_i)             (``metric=acc``, s = -1, the official scripts)
    G^_i  = G_i / max_j |G_j|                          (``center=true``: G - mean G first)
    a_i  <- a_i + s * (d_r / M) * G^_i,    d_r = d * (1 - r / R)          linear step decay
    a    <- clip(a, 0, 1) / sum(clip(a, 0, 1))          stays a probability vector

with w^r the global model received in round r, w_i the client's model after its own last local
training, r the round (0-based) and R the number of rounds. M: the official code hard-codes 1/3 for
its three source clients; here M = N, the number of clients the weights are spread over, so a
weight moves by the same fraction of itself as in the paper (``step_divisor`` overrides M).

The round's aggregation: w^{r+1} = sum_{i in S} a_i w_i / sum_{i in S} a_i over the clients that
returned an update (the stored weights renormalised over the sampled clients).

Hyperparameters, results, privacy, parity and the paper-versus-code analysis: docs/methods/feddg_ga.md.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import torch
import torch.nn.functional as F

from fedstyle.algorithms.base import Algorithm, apply_reference_code, weighted_average
from fedstyle.algorithms.hparams import HParam
from fedstyle.algorithms.registry import register_method
from fedstyle.devices import inference_batch
from fedstyle.errors import ConfigError

WEIGHTS = "feddg_ga/weights"  # server.state: a (N,), a probability vector
_SIZE_ROUND = "feddg_ga/size_round"  # server.state: 1 when this round aggregates by size (reference code)
_BEFORE = "feddg_ga/local_loss"  # ctx.state: loss of the client's model after its last local training
_BEFORE_ACC = "feddg_ga/local_acc"
_GAP_POSITIONS = "feddg_ga/gap_positions"  # ctx.state: the client's positions the gap is measured on (gap_fraction < 1)
_EVAL_BATCH = 256  # images per pass on a GPU (on the CPU: fedstyle.devices.inference_batch)

#: reference_code=true: PARDON's fork, for the options not given explicitly
REFERENCE = {"step": 1.0, "step_divisor": 3, "local_loss": "train"}


@torch.no_grad()
def local_loss_and_accuracy(model, data, device: torch.device, batch_size: int | None = None,
                            positions: torch.Tensor | None = None) -> tuple[float, float]:
    """Mean cross-entropy and accuracy of ``model`` on a client's data (or its samples at ``positions``),
    eval mode, no augmentation."""
    batch_size = batch_size or inference_batch(device, _EVAL_BATCH)
    was_training = model.training
    model.eval()
    loss = torch.zeros((), dtype=torch.float64, device=device)
    correct = torch.zeros((), dtype=torch.float64, device=device)
    n = len(data) if positions is None else len(positions)
    for start in range(0, n, batch_size):
        chunk = slice(start, start + batch_size)
        images, labels = data.take(chunk if positions is None else positions[chunk])
        x = data.transform(images.to(device), train=False)
        y = labels.to(device)
        logits = model(x)
        loss += F.cross_entropy(logits, y, reduction="sum").double()
        correct += (logits.argmax(dim=1) == y).sum().double()
    model.train(was_training)
    return float(loss) / max(1, n), float(correct) / max(1, n)


def adjust_weights(weights: torch.Tensor, clients: list[int], gaps: list[float], step: float, *,
                   sign: float = 1.0, center: bool = False, keep_zero: bool = False) -> torch.Tensor:
    """One generalization adjustment: ``weights`` (N,) moved by ``sign * step * G^_i`` for the clients
    with a finite gap, clipped to [0, 1] and renormalised to a probability vector (see the module).
    When every weight is clipped to 0: 1/N each, or (``keep_zero``, PARDON's fork) all 0."""
    out = weights.clone().to(torch.float64)
    g = torch.tensor(gaps, dtype=torch.float64)
    valid = torch.isfinite(g)
    if bool(valid.any()):
        ids = torch.tensor(clients, dtype=torch.long)[valid]
        g = g[valid]
        if center:
            g = g - g.mean()
        scale = g.abs().max()
        if float(scale) > 0:
            out[ids] += sign * step * g / scale
    out.clamp_(0.0, 1.0)
    total = float(out.sum())
    if total > 0:
        return out / total
    return out if keep_zero else torch.full_like(out, 1.0 / len(out))


@register_method
class FedDGGA(Algorithm):
    """Generalization adjustment of the aggregation weights (docs/methods/feddg_ga.md)."""

    name = "feddg_ga"
    family = "domain-invariance"
    shares = "weights; each round, losses for the aggregation weights"
    label = "FedDG-GA"
    summary = ("FedAvg whose per-client aggregation weights move each round towards the clients with the larger "
               "generalization gap (global model's loss on local data minus the local model's), step decayed")
    paper = "Zhang et al., Federated domain generalization with generalization adjustment, CVPR 2023"
    HPARAMS = (
        HParam("step", 0.2, "step size d of the weight update, decayed linearly to 0 over the rounds", low=0.0),
        HParam("step_divisor", 0, "M in d_r / M (0: the number of clients)", low=0),
        HParam("metric", "loss", "generalization gap in loss (paper) or accuracy (official scripts' default)",
               choices=("loss", "acc")),
        HParam("center", False, "subtract the participants' mean gap before normalising"),
        HParam("local_loss", "eval", "the local model's loss kept for the next gap: evaluated after training (eval) "
               "or the round's mean training loss (train, no extra pass)", choices=("eval", "train")),
        HParam("gap_fraction", 1.0, "share of a client's images the gap is measured on: a random subset drawn once "
               "per client and kept (< 1 makes the two extra passes a round cheaper; the official scripts measure "
               "it on a validation split, about a tenth of a domain)", low=0.0, high=1.0),
        HParam("reference_code", False, "PARDON's fork: step (1 - r/R)/3, size-weighted round 0 and NaN rounds, "
               "previous loss 0 before a first participation, training loss as the local loss"),
    )

    @classmethod
    def resolve(cls, given: Mapping[str, Any]) -> dict[str, Any]:
        hp = apply_reference_code(super().resolve(given), given, REFERENCE)
        if hp["metric"] == "acc" and hp["local_loss"] == "train":
            raise ConfigError("feddg_ga metric=acc needs the local model's accuracy: use local_loss=eval")
        if not hp["gap_fraction"] > 0:
            raise ConfigError("feddg_ga gap_fraction must be above 0 (1: every image of the client)")
        return hp

    # -- server -------------------------------------------------------------------------
    def init_server_state(self, server):
        server.state[WEIGHTS] = torch.full((server.num_clients,), 1.0 / server.num_clients, dtype=torch.float64)
        server.state[_SIZE_ROUND] = torch.zeros((), dtype=torch.float64)

    def step_at(self, server) -> float:
        """d_r / M of round ``server.round`` (no decay when the number of rounds is unknown)."""
        decay = 1.0 - server.round / server.rounds if server.rounds > 0 else 1.0
        divisor = self.hp["step_divisor"] or server.num_clients
        return self.hp["step"] * max(0.0, decay) / divisor

    def round_payloads(self, server, client_ids, queries):
        gaps = [float(queries.get(c, {}).get("gap", math.nan)) for c in client_ids]
        sign = -1.0 if self.hp["metric"] == "acc" else 1.0
        reference = self.hp["reference_code"]
        by_size = reference and (server.round == 0 or not all(math.isfinite(g) for g in gaps))
        if not by_size:  # the fork adjusts nothing in a round it aggregates by size (src/server.py:686-689)
            server.state[WEIGHTS] = adjust_weights(server.state[WEIGHTS].cpu(), list(client_ids), gaps,
                                                   self.step_at(server), sign=sign, center=self.hp["center"],
                                                   keep_zero=reference)
        server.state[_SIZE_ROUND] = torch.tensor(float(by_size), dtype=torch.float64)
        return {}

    def aggregate(self, server, updates):
        weights = server.state[WEIGHTS]
        coefs = [float(weights[u.client_id]) for u in updates]
        if bool(server.state[_SIZE_ROUND]):
            return weighted_average(updates)
        if sum(coefs) <= 0:  # every participant clipped to 0: by size (the fork: equally, src/server.py:646-647)
            return weighted_average(updates, uniform=self.hp["reference_code"])
        return weighted_average(updates, coefs=coefs)

    # -- client -------------------------------------------------------------------------
    def gap_positions(self, ctx) -> torch.Tensor | None:
        """The client's positions its losses are measured on: None (every image) when ``gap_fraction`` is 1, else
        max(1, round(fraction * n)) positions drawn once, from this call's seed, and kept in the client's state
        (the global model's loss and the local model's must be measured on the same images)."""
        fraction, n = self.hp["gap_fraction"], len(ctx.data)
        if fraction >= 1.0:
            return None
        kept = ctx.state.get(_GAP_POSITIONS)
        if kept is None or (len(kept) and int(kept.max()) >= n):
            draw = torch.Generator().manual_seed(ctx.seed)  # its own generator: training's draws stay as they are
            count = max(1, round(fraction * n))
            kept = ctx.state[_GAP_POSITIONS] = torch.randperm(n, generator=draw)[:count].sort().values
        return kept

    def round_query(self, ctx, model):
        """The gap of the received global model (``model`` holds it, eval mode) on the local data."""
        loss, acc = local_loss_and_accuracy(model, ctx.data, ctx.device, positions=self.gap_positions(ctx))
        after, before_key = (acc, _BEFORE_ACC) if self.hp["metric"] == "acc" else (loss, _BEFORE)
        if before_key in ctx.state:
            before = float(ctx.state[before_key])
        else:
            before = 0.0 if self.hp["reference_code"] else math.nan
        return {"gap": after - before}

    def local_train(self, ctx, model, payload):
        result = super().local_train(ctx, model, payload)
        if self.hp["local_loss"] == "eval":
            loss, acc = local_loss_and_accuracy(model, ctx.data, ctx.device, positions=self.gap_positions(ctx))
            ctx.state[_BEFORE_ACC] = torch.tensor(acc, dtype=torch.float64)
        else:
            loss = result.train_loss
        ctx.state[_BEFORE] = torch.tensor(loss, dtype=torch.float64)
        return result
