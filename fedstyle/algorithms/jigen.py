"""JiGen (Carlucci, D'Innocente, Bucci, Caputo, Tommasi, CVPR'19): a jigsaw puzzle beside the classifier.

Applied inside each client under FedAvg, as CCST's Table 1 does ("JiGen and RSC can be directly
integrated into FedAvg without further modifications", CCST Sec. 4). Per mini-batch (JiGen Sec. 3):

    each image is cut into a 3 x 3 grid of tiles; with probability beta it stays ordered (jigsaw class 0),
    otherwise its tiles are rearranged by one of P permutations, drawn uniformly (jigsaw class p in 1..P)
    z      = neck(backbone(x~))                      the shared representation of the (partly shuffled) batch
    L      = CE_ordered(head(z), y) + alpha · CE(jigsaw_head(z), p)                      (Eq. 1)

The object classifier sees the ordered images only (Eq. 1's first sum runs over the original images;
``classify=all`` is the public code's default, where ``--classify_only_sane`` is off, and classifies the
shuffled ones too); the jigsaw classifier sees every image, ordered ones as class 0. At test time only the
object classifier runs: ``model(x)`` is unchanged.

Hyperparameters, results, privacy, parity and the paper-versus-code analysis: docs/methods/jigen.md.
"""

from __future__ import annotations

import functools
import itertools

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedstyle.algorithms.base import Algorithm, apply_reference_code
from fedstyle.algorithms.hparams import HParam
from fedstyle.algorithms.registry import register_method
from fedstyle.errors import ConfigError

#: tiles per side of the puzzle (the paper's 3 x 3 grid)
GRID = 3
#: reference_code=true: the public code's default for the options not given explicitly (train_jigsaw.py:44,
#: ``--classify_only_sane`` off: every image is classified)
REFERENCE = {"classify": "all"}


@functools.lru_cache(maxsize=4)
def _greedy_permutations(count: int, seed: int) -> torch.Tensor:
    every = np.array(list(itertools.permutations(range(GRID * GRID))), dtype=np.int8)  # row 0: the identity
    columns = np.ascontiguousarray(every.T)
    n = len(every)
    priority = np.random.default_rng(seed).permutation(n)  # seeded tie-break, below one unit of distance
    total = np.zeros(n, dtype=np.int64)  # summed Hamming distance to the chosen set
    chosen = [0]
    for _ in range(count):
        for k, value in enumerate(every[chosen[-1]]):
            total += columns[k] != value
        key = total * n + priority
        key[chosen] = -1
        chosen.append(int(key.argmax()))
    return torch.from_numpy(every[chosen].astype(np.int64))


def jigsaw_permutations(count: int = 30, seed: int = 0) -> torch.Tensor:
    """(count + 1, 9) tile orders: row 0 the identity (the ordered image), rows 1..count the greedy
    maximal-Hamming-distance set (docs/methods/jigen.md)."""
    if not 1 <= count < 362880:
        raise ConfigError(f"the number of jigsaw permutations must be in [1, 362879], got {count}")
    return _greedy_permutations(int(count), int(seed)).clone()


def tile_index(perms: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """(K, H·W) long: for each permutation, the source pixel (flat index) of every output pixel.

    Tiles are floor(H/3) x floor(W/3), the grid centred; pixels outside it map to themselves."""
    th, tw = height // GRID, width // GRID
    if th == 0 or tw == 0:
        raise ConfigError(f"a {GRID}x{GRID} jigsaw needs images of at least {GRID}x{GRID} pixels, got {height}x{width}")
    oh, ow = (height - GRID * th) // 2, (width - GRID * tw) // 2
    rows, cols = torch.arange(height), torch.arange(width)
    tr = torch.div(rows - oh, th, rounding_mode="floor")
    tc = torch.div(cols - ow, tw, rounding_mode="floor")
    inside = ((tr >= 0) & (tr < GRID))[:, None] & ((tc >= 0) & (tc < GRID))[None, :]
    tile = torch.where(inside, tr[:, None] * GRID + tc[None, :], torch.zeros((), dtype=torch.long))
    src_tile = perms.long()[:, tile]  # (K, H, W): the input tile shown at each output pixel
    src_r = oh + torch.div(src_tile, GRID, rounding_mode="floor") * th + (rows - oh - tr * th)[None, :, None]
    src_c = ow + (src_tile % GRID) * tw + (cols - ow - tc * tw)[None, None, :]
    same = rows[:, None] * width + cols[None, :]
    return torch.where(inside, src_r * width + src_c, same).reshape(len(perms), -1)


def shuffle_tiles(x: torch.Tensor, orders: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Sample i of ``x`` (B, C, H, W) rearranged by permutation ``orders[i]`` of ``index``
    (:func:`tile_index`, on x's device): one gather over the batch, channels-last layout."""
    b, c, h, w = x.shape
    pixels = x.permute(0, 2, 3, 1).reshape(b, h * w, c)
    src = index[orders].unsqueeze(-1).expand(b, h * w, c)
    return pixels.gather(1, src).view(b, h, w, c).permute(0, 3, 1, 2)


@register_method
class JiGen(Algorithm):
    name = "jigen"
    label = "JiGen"
    summary = "FedAvg with a jigsaw-puzzle head beside the classifier on every client (self-supervised auxiliary task)"
    paper = "Carlucci, D'Innocente, Bucci, Caputo, Tommasi, Domain generalization by solving jigsaw puzzles, CVPR 2019"
    HPARAMS = (
        HParam("jig_weight", 0.7, "alpha: weight of the jigsaw loss", low=0.0),
        HParam("bias_whole_image", 0.9, "beta: probability that an image stays ordered (jigsaw class 0)",
               low=0.0, high=1.0),
        HParam("permutations", 30, "P: tile permutations (jigsaw classes 1..P; class 0 is the ordered image)",
               low=1, high=1000),
        HParam("perm_seed", 0, "seed of the greedy maximal-Hamming permutation set's tie-breaking", low=0),
        HParam("classify", "ordered", "object classification on the ordered images only (ordered: the paper's "
                                      "Eq. 1) or on every image (all: the public code's default)",
               choices=("ordered", "all")),
        HParam("reference_code", False, "the public code: classify=all unless given, and its draw of the jigsaw "
                                        "class (uniform over 0..P, then 0 with probability beta)"),
    )

    @classmethod
    def resolve(cls, given):
        return apply_reference_code(super().resolve(given), given, REFERENCE)

    def __init__(self, hparams=None, *, num_classes, num_clients):
        super().__init__(hparams, num_classes=num_classes, num_clients=num_clients)
        self.perms = jigsaw_permutations(self.hp["permutations"], self.hp["perm_seed"])
        self._index: dict[tuple, torch.Tensor] = {}

    def configure_model(self, model):
        model.jigsaw_head = nn.Linear(model.head.in_features, self.hp["permutations"] + 1)
        super().configure_model(model)  # after the head: param_keys then include it

    def pixel_index(self, height: int, width: int, device: torch.device) -> torch.Tensor:
        key = (height, width, str(device))
        if key not in self._index:
            self._index[key] = tile_index(self.perms, height, width).to(device)
        return self._index[key]

    def draw_orders(self, batch: int, device: torch.device) -> torch.Tensor:
        """Jigsaw class per sample: 0 (ordered) with probability beta, else uniform in 1..P (torch's
        generator of ``device``, seeded by the runtime). ``reference_code``: as the public loader
        (data/JigsawLoader.py:88-91), uniform in 0..P, then 0 with probability beta."""
        if self.hp["reference_code"]:
            drawn = torch.randint(0, self.hp["permutations"] + 1, (batch,), device=device)
            forced = torch.rand(batch, device=device) < self.hp["bias_whole_image"]
            return torch.where(forced, torch.zeros_like(drawn), drawn)
        ordered = torch.rand(batch, device=device) < self.hp["bias_whole_image"]
        shuffled = torch.randint(1, self.hp["permutations"] + 1, (batch,), device=device)
        return torch.where(ordered, torch.zeros_like(shuffled), shuffled)

    def jigsaw_batch(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(the batch with its shuffled images, the jigsaw labels)."""
        orders = self.draw_orders(x.shape[0], x.device)
        return shuffle_tiles(x, orders, self.pixel_index(x.shape[-2], x.shape[-1], x.device)), orders

    def jigen_loss(self, ctx, model, z: torch.Tensor, y: torch.Tensor, orders: torch.Tensor) -> torch.Tensor:
        """Eq. 1 on the representation ``z`` of the jigsaw batch."""
        jigsaw = F.cross_entropy(model.jigsaw_head(z), orders)
        logits = model.head(z)
        ordered = (orders == 0).float()
        if self.hp["classify"] == "all":
            ce = F.cross_entropy(logits, y)
        else:
            ce = (F.cross_entropy(logits, y, reduction="none") * ordered).sum() / ordered.sum().clamp_min(1.0)
        ctx.log("jigen_ce", ce)
        ctx.log("jigen_jigsaw", jigsaw)
        ctx.log("jigen_ordered", ordered.mean())
        return ce + self.hp["jig_weight"] * jigsaw

    def training_loss(self, ctx, model, x, y, payload):
        shuffled, orders = self.jigsaw_batch(x)
        return self.jigen_loss(ctx, model, model.features(shuffled), y, orders)
