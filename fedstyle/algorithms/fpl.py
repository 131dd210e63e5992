"""FPL: federated prototypes learning with cluster and unbiased prototypes (Huang, Ye, Shi, Li, Du,
"Rethinking Federated Learning with Domain Shift: A Prototype View", CVPR'23, Sec. 3; public code
WenkeHuang/RethinkFL, ``models/fpl.py``). PARDON (pardon.txt, Tables I-II) runs it as a baseline with
the FedDG benchmark's defaults (its code: judydnguyen/PARDON-FedDG, ``FPLClient``, ``--infoNCET 0.02``).

z = model.features(x) is the representation before the classifier (the neck's output: pooled features
on ResNets, the flattened 64 x h x w map on the ConvNet; the paper's f, 512-d on its ResNet-10).

Client m, after local training (Eq. 2, Algorithm 1): one local prototype per class it holds,
c_m^k = mean of z over its samples of class k, uploaded as ``{"fpl/protos": (K_m, d), "fpl/classes": (K_m,)}``
(``prototypes=local``: a pass over all local images after training, un-augmented, eval mode, as
Algorithm 1; ``batches``: the mean of the detached z of the training batches of the round's last local
epoch — its last ceil(d / B) steps, every step of a round of at most one epoch —, train mode, as the
public code collects them, ``models/fpl.py:189-196``, ``agg_func`` ``:19-33``). A class absent on a client
has no prototype from it.

Hyperparameters, results, privacy, parity and the paper-versus-code analysis: docs/methods/fpl.md.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch
import torch.nn.functional as F

from fedstyle.algorithms.base import Algorithm, apply_reference_code
from fedstyle.algorithms.hparams import HParam
from fedstyle.algorithms.registry import register_method
from fedstyle.devices import inference_batch
from fedstyle.errors import ConfigError
from fedstyle.style.transfer.interpolation import check_partition, finch_partition

PROTOS, CLASSES = "fpl/protos", "fpl/classes"  # payload keys (up: local prototypes; down: cluster prototypes)
SERVER_PROTOS, SERVER_CLASSES = "fpl/cluster_protos", "fpl/cluster_classes"  # server.state
_RECEIVED, _SUMS, _STEP = "fpl/received", "fpl/sums", "fpl/step"  # ctx.scratch
REFERENCE = {"tau": 0.02, "prototypes": "batches"}  # RethinkFL's choices (reference_code=true; main.py:55)
_BATCH = 256  # images per forward of the prototype pass on a GPU (on the CPU: fedstyle.devices.inference_batch)


def class_sums(z: torch.Tensor, y: torch.Tensor, num_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-class sums (C, d) in float64 and counts (C,) of the rows of ``z`` (a matmul: deterministic on GPUs)."""
    onehot = F.one_hot(y, num_classes).to(torch.float64)
    return onehot.T @ z.detach().to(torch.float64), onehot.sum(0)


def mean_prototypes(sums: torch.Tensor, counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 2: the prototypes (K, d) float32 of the classes present (counts > 0) and those classes (K,)."""
    present = (counts > 0).nonzero().flatten()
    return (sums[present] / counts[present, None]).to(torch.float32), present


def cluster_prototypes(by_class: Mapping[int, list[torch.Tensor]], partition: str | int = "coarsest"
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 4-5: per class (ascending), FINCH on its client prototypes, one mean per cluster.
    Returns the cluster prototypes (J, d) and their classes (J,)."""
    protos, classes = [], []
    for k in sorted(by_class):
        members = torch.stack([p.to(torch.float32) for p in by_class[k]])
        labels = finch_partition(members, partition)
        for j in range(int(labels.max()) + 1):
            protos.append(members[labels == j].mean(0))
            classes.append(k)
    return torch.stack(protos), torch.tensor(classes, dtype=torch.long)


def unbiased_prototypes(protos: torch.Tensor, classes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 6: U^k = plain mean of class k's cluster prototypes. Returns (C', d) and the classes (C',)."""
    present = torch.unique(classes)  # sorted
    return torch.stack([protos[classes == k].mean(0) for k in present.tolist()]), present


def prototype_losses(z: torch.Tensor, y: torch.Tensor, protos: torch.Tensor, classes: torch.Tensor, tau: float,
                     upcr: str = "mean") -> tuple[torch.Tensor, torch.Tensor]:
    """(L_CPCL, L_UPCR) of a batch (Eq. 7, 8, 10): per-sample terms summed over the samples whose class
    has prototypes, divided by the batch size."""
    pos = y[:, None] == classes[None, :]  # (B, J)
    covered = pos.any(1)
    if not bool(covered.any()):
        zero = z.sum() * 0.0
        return zero, zero
    zc, pos = z[covered], pos[covered]
    sim = F.normalize(zc, dim=1) @ F.normalize(protos, dim=1).T / tau  # Eq. 7
    cpcl = torch.logsumexp(sim, 1) - torch.logsumexp(sim.masked_fill(~pos, float("-inf")), 1)  # Eq. 8
    unbiased, present = unbiased_prototypes(protos, classes)
    target = unbiased[(y[covered, None] == present[None, :]).float().argmax(1)]
    sq = (zc - target).square()
    per_sample = sq.sum(1) if upcr == "sum" else sq.mean(1)  # Eq. 10 / the code's MSELoss
    return cpcl.sum() / z.shape[0], per_sample.sum() / z.shape[0]


@register_method
class FPL(Algorithm):
    """FPL (docs/methods/fpl.md)."""

    name = "fpl"
    label = "FPL"
    summary = ("clients upload per-class prototypes; the server clusters each class's prototypes (FINCH) into "
               "cluster prototypes and averages them into unbiased ones; local loss CE + prototype contrastive "
               "(CPCL) + L2 to the unbiased prototype (UPCR)")
    paper = ("Huang, Ye, Shi, Li, Du, Rethinking federated learning with domain shift: a prototype view, "
             "CVPR 2023")
    HPARAMS = (
        HParam("tau", 0.02, "temperature of CPCL (Eq. 7; paper and public code 0.02)"),
        HParam("lambda_cpcl", 1.0, "weight of the cluster-prototype contrastive loss (Eq. 12: 1)", low=0.0),
        HParam("lambda_upcr", 1.0, "weight of the unbiased-prototype regulariser (Eq. 12: 1)", low=0.0),
        HParam("upcr", "mean", "UPCR over the feature dimensions: mean (public code's MSELoss) or sum (Eq. 10 "
               "as printed)", choices=("mean", "sum")),
        HParam("partition", "coarsest", "FINCH partition of a class's client prototypes: coarsest (public code), "
               "finest (Eq. 4's first-neighbour links alone) or a number of clusters"),
        HParam("prototypes", "local", "local prototypes from a pass over all local images after training (local, "
               "Algorithm 1) or from the training batches of the round's last local epoch (batches, public code)",
               choices=("local", "batches")),
        HParam("reference_code", False, "the public code's choices (tau 0.02, prototypes=batches) for the options "
               "not given explicitly"),
    )

    @classmethod
    def resolve(cls, given: Mapping[str, Any]) -> dict[str, Any]:
        hp = apply_reference_code(super().resolve(given), given, REFERENCE)
        if not hp["tau"] > 0:
            raise ConfigError(f"hyperparameter 'tau' of fpl must be > 0 (the CPCL temperature; the paper uses "
                              f"0.02), got {hp['tau']}")
        hp["partition"] = str(check_partition(hp["partition"], "partition"))
        return hp

    # -- server -------------------------------------------------------------------------
    def round_payloads(self, server, client_ids, queries):
        """The cluster prototypes P and their classes (Eq. 5), to every client of the round."""
        if SERVER_PROTOS not in server.state:
            return {}  # round 0: none yet
        payload = {PROTOS: server.state[SERVER_PROTOS], CLASSES: server.state[SERVER_CLASSES]}
        return {cid: payload for cid in client_ids}

    def aggregate(self, server, updates):
        """FedAvg of the weights; FINCH per class on the round's local prototypes (kept in server.state)."""
        by_class: dict[int, list[torch.Tensor]] = {}
        for update in updates:  # client-id order
            if PROTOS in update.payload:
                for proto, k in zip(update.payload[PROTOS].cpu(), update.payload[CLASSES].tolist()):
                    by_class.setdefault(int(k), []).append(proto)
        if by_class:
            partition = check_partition(self.hp["partition"])
            server.state[SERVER_PROTOS], server.state[SERVER_CLASSES] = cluster_prototypes(by_class, partition)
        return super().aggregate(server, updates)

    # -- client -------------------------------------------------------------------------
    def received(self, ctx, payload) -> tuple[torch.Tensor, torch.Tensor] | None:
        """This round's cluster prototypes and classes on the device (once per local training), or None."""
        if _RECEIVED not in ctx.scratch:
            protos = payload.get(PROTOS)
            ctx.scratch[_RECEIVED] = None if protos is None or not protos.numel() else (
                protos.to(ctx.device, torch.float32), payload[CLASSES].to(ctx.device, torch.long))
        return ctx.scratch[_RECEIVED]

    def training_loss(self, ctx, model, x, y, payload):
        z = model.features(x)
        ce = F.cross_entropy(model.head(z), y)
        ctx.log("fpl_ce", ce)
        if self.hp["prototypes"] == "batches":
            step = ctx.scratch.get(_STEP, 0)
            ctx.scratch[_STEP] = step + 1
            if step >= self.last_epoch_start(ctx):  # the code collects its last local epoch's features
                sums, counts = class_sums(z, y, self.num_classes)
                acc = ctx.scratch.get(_SUMS)
                ctx.scratch[_SUMS] = (sums, counts) if acc is None else (acc[0] + sums, acc[1] + counts)
        received = self.received(ctx, payload)
        if received is None:  # round 0: no prototypes yet
            return ce
        cpcl, upcr = prototype_losses(z, y, *received, self.hp["tau"], self.hp["upcr"])
        ctx.log("fpl_cpcl", cpcl)
        ctx.log("fpl_upcr", upcr)
        return ce + self.hp["lambda_cpcl"] * cpcl + self.hp["lambda_upcr"] * upcr

    @staticmethod
    def last_epoch_start(ctx) -> int:
        """The first step of the round's last local epoch (0 for a round of at most one epoch)."""
        return max(0, ctx.train.steps_for(ctx.data) - ctx.data.num_batches(ctx.train.batch_size))

    @torch.no_grad()
    def upload_payload(self, ctx, model):
        """The client's local prototypes (Eq. 2) and their classes."""
        if self.hp["prototypes"] == "batches":
            sums, counts = ctx.scratch.pop(_SUMS)
        else:
            sums, counts = self.local_sums(ctx, model)
        protos, classes = mean_prototypes(sums, counts)
        return {PROTOS: protos.cpu(), CLASSES: classes.cpu()}

    def local_sums(self, ctx, model) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-class feature sums over all local images (eval transform, model in eval mode)."""
        was_training = model.training
        model.eval()
        images, labels = ctx.data.images, ctx.data.labels
        sums = counts = None
        batch = inference_batch(ctx.device, _BATCH)
        for s in range(0, len(images), batch):
            x = ctx.data.transform(images[s : s + batch].to(ctx.device, non_blocking=True), train=False)
            part = class_sums(model.features(x), labels[s : s + batch].to(ctx.device), self.num_classes)
            sums, counts = part if sums is None else (sums + part[0], counts + part[1])
        model.train(was_training)
        return sums, counts
