"""Parity fixture for ``pardon``: PARDON's client style, server interpolation style, local step and AdaIN
transfer in judydnguyen/PARDON-FedDG (fedstyle's ``reference_code``).

Runs, from a checkout of the authors' repository at ``COMMIT``, importing ``src/client.py`` and
``src/server.py`` (see "Import stubs"), on CPU in float32:

* **client style** — ``DGClient.abstract_style`` (``src/client.py:607-657``): features of the client's images
  from ``list(vgg.children())[:-1]`` (``:612``), FINCH (their ``src/finch.py``, cosine) on the flattened
  maps, the coarsest partition (``c[:, -1]``, ``:630-636``), per cluster ``calc_sum`` (``src/utils.py:38-50``)
  / count, averaged over the clusters, var = E[f^2] - mu^2, std = sqrt(var + 1e-5) (``:638-652``). Their
  global ``vgg`` (the AdaIN VGG-19 up to relu4_1, ``:28,36``) is replaced by a small seeded stand-in
  (``standin_vgg``: three convolutions and a last ReLU, so the ``[:-1]`` cut drops that ReLU, as theirs drops
  relu4_1's); the client's data loader by the 48 images of ``client_images()`` (three visibly different
  "domains" of 16, 32 x 32) fed as ``uint8 / 255`` in batches of 20, 20, 8 (FINCH finds 12, then 4
  clusters). ``torch.device("cuda")`` (``:610``) is replaced by the CPU: the module's ``torch`` is a proxy of
  torch whose ``device`` returns the CPU while the function runs. Stored: the style and FINCH's coarsest labels (their ``FINCH`` wrapped to
  record its output).
* **server style S_g** — ``DGServer.find_optimal_metadata`` (``src/server.py:387-427``): FINCH on the
  [mean, std] rows of the client styles, the finest partition (``c[:, 0]``, ``:402``), each cluster's mean,
  the element-wise ``torch.median`` (the lower of the two middle values) over the cluster means. Inputs: 18
  client styles of 512 channels (the code hard-codes 512, ``:395-396``) from ``client_styles()``, seeded
  (two groups of three domain centres, each client a seeded perturbation; FINCH finds 6, then 2 clusters, so
  the finest partition and the lower median of an even count both matter). The function saves its result with
  ``np.save`` under ``style_stats/`` of the working directory: it runs in a temporary folder. ``vgg.to(cuda)``
  (``:419-420``): the same CPU proxy. Stored: S_g and the finest labels.
* **one local step** — ``DGClient.contrastive_fit`` (``src/client.py:449-486``) with ``contrastive_loss`` and
  ``sample_local_triplets`` (``:526-543``, ``:585-605``): one batch of 8 (x, x', labels) — x and x' fixed
  seeded tensors (``seeded("step/x")``, ``seeded("step/xp")``) handed in for the batch and for its transfer
  (``style_stransfer_batch`` is replaced on the instance by one returning x': their transfer is checked
  apart, below); CE (their PACS bundle's ``ElementwiseLoss(CrossEntropyLoss(reduction='none'))`` then
  ``.mean()``: a stand-in ``ds_bundle.loss`` computing exactly that) + 0.75 triplet + 0.2 reg. The model is
  fedstyle's ConvNet (``build_model("convnet", 4, 32)``) with ``seeded_weights``: the featurizer a wrapper of
  its ``features`` whose ``train()`` puts BatchNorm in eval mode as their ResNet's does (``src/models.py:95-105``),
  the classifier its ``head``, both through their ``setup_model`` (``:578-583``). Their ``random.choice`` of
  each anchor's negative (``:602``) draws from ``random.Random(SEED)`` and is recorded. Their ``step``
  (``:436-447``) runs unchanged; the optimiser named for ``init_train``'s ``eval`` is an SGD with lr 0 whose
  ``step()`` records the gradients (by fedstyle's parameter names); the loss is read as ``step`` receives it.
  Stored: the loss (its terms are not returned separately by their code), the gradients (``gradient_record``)
  and the draws.
* **transfer (features)** — ``style_transfer`` (``src/utils.py:52-67``, ``adaIN_StyleStat_ContentFeat`` of
  ``src/functions.py:26-35`` with ``calc_mean_std``'s unbiased variance, ``:4-13``) at alpha 0.5 (their call,
  ``src/client.py:465``) with the full stand-in ``vgg`` (relu included, ``:36``) and a seeded stand-in decoder,
  of 3 of the client images to the client style above. Stored: the decoder's float output.

Import stubs: torchvision, wandb, wilds, termcolor and ``src/adain_net.py`` are stub modules while
``src/client.py`` and ``src/server.py`` import, and ``torch.load`` returns an empty dict during the import
(``src/client.py:34-35``, ``src/server.py:29-30`` load ``src/models/*.pth``, not in the repository), by
:func:`parity.common.feddg_benchmark_imports`; none of it is used by the compared functions (``wandb.log`` in
``step`` and ``colored`` in ``abstract_style`` are called, as stubs). Their global ``vgg``/``decoder`` are then
set to the stand-ins. Nothing needs installing besides the project's environment (their FINCH needs
scikit-learn and scipy, present).

Run: ``.venv/bin/python -m parity.pardon --checkout /tmp/parity/PARDON-FedDG``.
"""

from __future__ import annotations

import contextlib
import os
import random
import tempfile
import types
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from parity.common import (feddg_benchmark_imports, generate, gradient_record, importable, patched, recorder, seeded,
                           seeded_weights, weight_sums)

REPOSITORY = "judydnguyen/PARDON-FedDG"
COMMIT = "e5df7dd8de43142413885b336e66210104ce9162"
NAME = "pardon"

SIZE = 32
DOMAINS, PER_DOMAIN = 3, 16
LOADER_BATCHES = ((0, 20), (20, 40), (40, 48))
CLIENTS, CHANNELS = 18, 512
STEP_BATCH, CLASSES = 8, 4
LABELS = (0, 1, 2, 3, 0, 1, 2, 2)
TRANSFER_IMAGES = (0, 20, 40)
ALPHA = 0.5
SEED = 0
SETTINGS = {"size": SIZE, "domains": DOMAINS, "per_domain": PER_DOMAIN, "loader_batches": LOADER_BATCHES,
            "clients": CLIENTS, "channels": CHANNELS, "step_batch": STEP_BATCH, "classes": CLASSES,
            "labels": LABELS, "transfer_images": TRANSFER_IMAGES, "alpha": ALPHA, "seed": SEED}


# -- inputs and stand-in models both sides rebuild -----------------------------------------------
def client_images() -> torch.Tensor:
    """(48, 3, 32, 32) uint8: 16 images of each of three looks — white strokes on black (digits), a coloured
    stroke on a smooth colour field (mnistm-like), dark strokes on a light textured ground (inverted)."""
    g = torch.Generator().manual_seed(SEED)
    out = []
    ys, xs = torch.meshgrid(torch.linspace(-1, 1, SIZE), torch.linspace(-1, 1, SIZE), indexing="ij")
    for domain in range(DOMAINS):
        for _ in range(PER_DOMAIN):
            angle, offset = float(torch.rand(1, generator=g)) * 3.14, float(torch.rand(1, generator=g)) - 0.5
            stroke = ((xs * np.cos(angle) + ys * np.sin(angle) - offset).abs() < 0.18).float()
            stroke = torch.maximum(stroke, ((xs - offset) ** 2 + ys ** 2 - 0.3).abs().lt(0.12).float())
            if domain == 0:
                image = stroke.expand(3, -1, -1) * (200 + 55 * torch.rand(1, generator=g))
            elif domain == 1:
                field = F.interpolate(torch.rand(1, 3, 4, 4, generator=g) * 255, size=(SIZE, SIZE), mode="bilinear",
                                      align_corners=False)[0]
                colour = torch.rand(3, 1, 1, generator=g) * 255
                image = field * (1 - stroke) + colour * stroke
            else:
                ground = 200 + 40 * torch.rand(3, SIZE, SIZE, generator=g)
                image = ground * (1 - stroke) + 30 * stroke
            out.append(image.clamp(0, 255).round().to(torch.uint8))
    return torch.stack(out)


def client_styles() -> tuple[torch.Tensor, torch.Tensor]:
    """(mean, std), each (18, 512): two groups of three domain centres, three clients per domain, each a
    seeded perturbation of its centre (FINCH: 6 clusters, then 2)."""
    groups, domains = 2, 6
    domain = torch.arange(CLIENTS) % domains
    group = domain % groups
    mean = (seeded("server/group_mean", (groups, CHANNELS), SEED)[group]
            + seeded("server/sub_mean", (domains, CHANNELS), SEED, scale=0.5)[domain]
            + seeded("server/mean_noise", (CLIENTS, CHANNELS), SEED, scale=0.15))
    std = ((seeded("server/group_std", (groups, CHANNELS), SEED).abs() * 0.5 + 0.2)[group]
           * (1 + seeded("server/sub_std", (domains, CHANNELS), SEED, scale=0.15)[domain]).abs()
           * (1 + seeded("server/std_noise", (CLIENTS, CHANNELS), SEED, scale=0.05)).abs())
    return mean, std


def step_inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x, x' (8, 3, 32, 32) float (an augmented, normalised batch and its unclamped transfer) and labels."""
    x = seeded("step/x", (STEP_BATCH, 3, SIZE, SIZE), SEED)
    xp = seeded("step/xp", (STEP_BATCH, 3, SIZE, SIZE), SEED, scale=0.8, offset=0.2)
    return x, xp, torch.tensor(LABELS)


def standin_vgg() -> nn.Sequential:
    """The stand-in for their ``vgg`` (VGG-19 to relu4_1): convolutions to 32 channels at 16 x 16, a last ReLU."""
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, stride=2, padding=1),
                         nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1), nn.ReLU())


def standin_decoder() -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(32, 16, 3, padding=1), nn.ReLU(), nn.Upsample(scale_factor=2, mode="nearest"),
                         nn.Conv2d(16, 3, 3, padding=1))


def step_model() -> nn.Module:
    from fedstyle.models import build_model

    return build_model("convnet", CLASSES, SIZE)


def weights() -> dict[str, torch.Tensor]:
    """Seeded weights: ``vgg.*`` and ``decoder.*`` (the stand-ins), ``model.*`` (fedstyle's ConvNet's names)."""
    shapes = {f"vgg.{k}": tuple(v.shape) for k, v in standin_vgg().state_dict().items()}
    shapes.update({f"decoder.{k}": tuple(v.shape) for k, v in standin_decoder().state_dict().items()})
    shapes.update({f"model.{k}": tuple(v.shape) for k, v in step_model().state_dict().items()})
    return seeded_weights(shapes, SEED)


def load(module: nn.Module, state: dict[str, torch.Tensor], prefix: str) -> nn.Module:
    module.load_state_dict({k[len(prefix):]: v.clone() for k, v in state.items() if k.startswith(prefix)})
    return module


# -- running the authors' functions --------------------------------------------------------------
class _CpuTorch(types.ModuleType):
    """torch, except ``device(...)`` is the CPU (their ``torch.device("cuda")``)."""

    def __init__(self):
        super().__init__("torch")

    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def device(*args, **kwargs):
        return torch.device("cpu")


def recording_finch(finch):
    """Their ``FINCH``, keeping each call's partitions (``values``)."""
    return recorder(finch, lambda result, *args, **kwargs: np.asarray(result[0]).copy())


class _Featurizer(nn.Module):
    """The featurizer: ``model.features``, BatchNorm kept in eval mode by ``train()`` (their ResNet.train)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model.features(x)

    def train(self, mode=True):
        super().train(mode)
        for m in self.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.eval()
        return self


class _RecordingChoice:
    """``random`` for their module: ``choice`` from a seeded generator, each pick recorded."""

    def __init__(self, seed):
        self.rng, self.picks = random.Random(seed), []

    def choice(self, seq):
        pick = self.rng.choice(seq)
        self.picks.append(pick)
        return pick

    def __getattr__(self, name):
        return getattr(random, name)


def run_step(client_module, cpu, state, feat_mean, feat_std, dtype: torch.dtype,
             prefix: str) -> dict[str, torch.Tensor]:
    """One ``contrastive_fit`` step (loss, negatives, gradients under ``prefix``) with the model and the batch in
    ``dtype`` (float64: torch's default dtype too, so their own tensors follow)."""
    model = load(step_model(), state, "model.").to(dtype)
    x, xp, y = step_inputs()
    x, xp = x.to(dtype), xp.to(dtype)
    grads: dict[str, torch.Tensor] = {}
    names = {id(p): n for n, p in model.named_parameters()}

    class RecordingSGD(torch.optim.SGD):
        def __init__(self, params, **config):
            super().__init__(params, lr=0.0)

        @torch.no_grad()
        def step(self, closure=None):
            for group in self.param_groups:
                for p in group["params"]:
                    grads[names[id(p)]] = p.grad.detach().clone()

    client = object.__new__(client_module.DGClient)
    client.client_id, client.device = 0, "cpu"
    client.beta, client.total_round, client.local_epochs, client.gamma = 1.0, 1, 1, 0.5
    client.ds_bundle = types.SimpleNamespace(loss=types.SimpleNamespace(
        compute=lambda outputs, labels, return_dict=False: F.cross_entropy(outputs, labels, reduction="none")))
    client.optimizer_name, client.optim_config = "RecordingSGD", {}
    client.scheduler_name = "torch.optim.lr_scheduler.ConstantLR"
    client.scheduler_config = {"factor": 1, "total_iters": 1}
    client.saved_optimizer = False
    client.dataloader = [(x.clone(), y.clone(), [])]
    client.setup_model(_Featurizer(model), model.head)
    client.style_stransfer_batch = lambda batch, alpha=0.5, output_size=224, style_stat=None: xp.clone()
    client.step = recorder(client.step, lambda result, objective, *args, **kwargs: float(objective.detach()))
    chooser = _RecordingChoice(SEED)
    with tempfile.TemporaryDirectory() as tmp:
        client.opt_dict_path, client.sch_dict_path = f"{tmp}/opt.pt", f"{tmp}/sch.pt"
        with patched(client_module, RecordingSGD=RecordingSGD, random=chooser, torch=cpu):
            client.contrastive_fit(metadata=(feat_mean, feat_std), flr=0)
    out = {f"{prefix}loss": torch.tensor(client.step.values, dtype=torch.float64),
           f"{prefix}negatives": torch.tensor(chooser.picks, dtype=torch.long)}
    out.update(gradient_record(grads, prefix=f"{prefix}grad/"))
    return out


def run(checkout: Path) -> dict[str, torch.Tensor]:
    state = weights()
    out: dict[str, torch.Tensor] = {"image_sum": client_images().double().sum().reshape(1)}
    with importable(checkout), feddg_benchmark_imports():
        import src.client as client_module
        import src.server as server_module
        import src.utils as utils_module

        vgg = load(standin_vgg(), state, "vgg.").eval()
        decoder = load(standin_decoder(), state, "decoder.").eval()
        cpu = _CpuTorch()

        # -- client style (abstract_style) ----------------------------------------------------------------
        images = client_images().float() / 255.0
        client = object.__new__(client_module.DGClient)
        client.client_id = 0
        client.dataloader = [(images[a:b], torch.zeros(b - a, dtype=torch.long), []) for a, b in LOADER_BATCHES]
        finch = recording_finch(client_module.FINCH)
        with patched(client_module, vgg=vgg, torch=cpu, FINCH=finch):
            feat_mean, feat_std = client.abstract_style()
        calls = finch.values
        out["client/mean"], out["client/std"] = feat_mean.flatten(1).float(), feat_std.flatten(1).float()
        out["client/labels"] = torch.from_numpy(calls[-1][:, -1].astype(np.int64))
        out["client/partitions"] = torch.tensor([calls[-1].shape[1]])

        # -- server style (find_optimal_metadata) ---------------------------------------------------------
        mean, std = client_styles()
        server = types.SimpleNamespace(dataset="parity", params={"split_scheme": "x", "iid": 0}, num_clients=CLIENTS)
        finch = recording_finch(server_module.FINCH)
        with tempfile.TemporaryDirectory() as tmp, contextlib.chdir(tmp):
            os.makedirs("style_stats/parity")
            with patched(server_module, torch=cpu, FINCH=finch):
                s_mean, s_std = server_module.DGServer.find_optimal_metadata(
                    server, mean.numpy()[:, :, None, None], std.numpy()[:, :, None, None])
        calls = finch.values
        out["server/mean"], out["server/std"] = s_mean.flatten(1), s_std.flatten(1)
        out["server/labels"] = torch.from_numpy(calls[-1][:, 0].astype(np.int64))
        out["server/style_sums"] = torch.stack([mean.double().sum(), std.double().sum()])
        if len(np.unique(calls[-1][:, 0])) % 2:
            raise SystemExit("the server's finest partition has an odd number of clusters: the lower median "
                             "is not exercised; choose other client styles")

        # -- one local step (contrastive_fit), in float32 and in float64 ----------------------------------
        out.update(run_step(client_module, cpu, state, feat_mean, feat_std, torch.float32, "step/"))
        before = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        try:
            out.update(run_step(client_module, cpu, state, feat_mean.double(), feat_std.double(), torch.float64,
                                "step64/"))
        finally:
            torch.set_default_dtype(before)

        # -- transfer features (style_transfer at alpha 0.5) ----------------------------------------------
        content = client_images()[list(TRANSFER_IMAGES)].float() / 255.0
        with torch.no_grad():
            output = utils_module.style_transfer(vgg=vgg, decoder=decoder, content=content,
                                                 style_stat=[feat_mean, feat_std], alpha=ALPHA, device="cpu")
        out["transfer/output"] = output.float()
    out.update(weight_sums(state))
    return out


def main(argv: list[str] | None = None) -> Path:
    return generate(NAME, __doc__, REPOSITORY, COMMIT, run, argv=argv,
                    description="PARDON: client style (FINCH on flat maps, coarsest, pooled moments), server S_g "
                                "(finest, lower median), one contrastive_fit step (loss, gradients, negatives), "
                                "AdaIN transfer at alpha 0.5; seeded stand-in encoder/decoder and ConvNet",
                    settings=SETTINGS)


if __name__ == "__main__":
    main()
