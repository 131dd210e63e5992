"""StableFDG's attention-based feature highlighter as a neck (Park et al., NeurIPS'23, Section 3.2).

For the last stage's feature map z_i (C x H x W), flattened to X_i (C x HW), and a partner X_j of
the same class, Eq. 8 scores the key positions of X_i against the mixed query::

    S = ((W_q X_j + W_q X_i) / 2)^T (W_k X_i)            (HW x HW; W_q, W_k in R^{d x C}, d = 30)
    a_s = softmax_n( mean_m S[m, n] )                     (attention over the H x W key positions)
    A(z_i)_c = sum_n a_s[n] z_i[c, n]                     (Eq. 7)

and the classifier sees [e(z_i), A(z_i)], where e is "the last embedding feature" of Section 3.2:
the backbone's own embedding, i.e. the neck the model had before (``embedding``, normally the
:class:`~fedstyle.models.base.PooledNeck`): global average pooling on ResNets and EfficientNet
(2C features, the paper's "twice as large" classifier input), the flattened C x h x w map on the
Digits-DG ConvNet (64 x 2 x 2 + 64 = 320 at 32 px). At test time the query is the sample itself
(j = i: self-attention). W_q and W_k are 1 x 1 convolutions without bias (the paper's matrices
W in R^{d x C}), stored as ``query.weight`` / ``key.weight`` and aggregated like every other weight.

Computed without the HW x HW matrix: the mean over query positions m commutes with the linear
maps, so mean_m S[m, n] = q^T W_k X_i[:, n] with q = W_q (pool(X_i) + pool(X_j)) / 2, i.e. the
score of position n is (W_k^T q) . X_i[:, n] — O(C d + C HW) per sample instead of O(d C HW + HW^2 d).
:meth:`AttentionNeck.weights_by_definition` keeps the literal formula for the tests.

The public code (cross_attn.py, class AFH) differs, and ``cosine=True, bias=True,
embedding_divisor=49`` reproduces it: its 1 x 1 convolution has a bias (cross_attn.py:19); each
position's query and key are L2-normalised over the d channels before the product (cross_attn.py:67-68),
so the scores are cosines (the 1/sqrt(d) scaling of its queries, cross_attn.py:96, then cancels); and
its embedding is the last map divided by 49 and summed over positions (cross_attn.py:84 with
resnet.py:254), the average pooling only at 224 px input (7 x 7 maps). With normalised queries the
mean over m still commutes: mean_m S[m, n] = ((mean_m q^_j,m + mean_m q^_i,m) / 2) . k^_i,n.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fedstyle.errors import ConfigError
from fedstyle.models.base import Backbone, Neck

PARTNER_MODES = ("random", "next")


class AttentionNeck(Neck):
    """[e(z), A(z)]: the backbone's own embedding e(z) (the wrapped ``embedding`` neck) next to the
    attention-pooled feature A(z) (Eq. 7); e's width + C outputs.

    ``cosine``: queries and keys L2-normalised per position; ``bias``: the 1 x 1 convolutions have
    biases; ``embedding_divisor`` = D: e(z) = sum over positions / D instead of the wrapped neck (the
    public code's D = 49). The three reproduce the public code (see the module docstring).
    """

    def __init__(self, embedding: Neck, channels: int, dim: int = 30, *, cosine: bool = False, bias: bool = False,
                 embedding_divisor: float | None = None):
        super().__init__()
        if channels < 1 or dim < 1:
            raise ConfigError(f"the attention neck needs channels >= 1 and dim >= 1, got {channels} and {dim}")
        if isinstance(embedding, AttentionNeck):
            raise ConfigError("the attention neck wraps the backbone's own embedding, not another attention neck")
        if embedding_divisor is not None and not embedding_divisor > 0:
            raise ConfigError(f"embedding_divisor must be > 0, got {embedding_divisor}")
        self.embedding = embedding  # the model's previous neck: "the last embedding feature" (Section 3.2)
        self.channels, self.dim = int(channels), int(dim)
        self.cosine, self.embedding_divisor = bool(cosine), embedding_divisor
        self.query = nn.Conv2d(self.channels, self.dim, 1, bias=bias)
        self.key = nn.Conv2d(self.channels, self.dim, 1, bias=bias)

    def extra_repr(self) -> str:
        extra = (", cosine=True" if self.cosine else "") + (
            f", embedding_divisor={self.embedding_divisor}" if self.embedding_divisor else "")
        return f"channels={self.channels}, dim={self.dim}{extra}"

    def out_dim(self, backbone: Backbone) -> int:
        if backbone.out_channels != self.channels:
            raise ConfigError(f"the attention neck was built for {self.channels} channels but the backbone's last "
                              f"stage has {backbone.out_channels}")
        width = self.channels if self.embedding_divisor else self.embedding.out_dim(backbone)
        return width + self.channels

    def _scores(self, maps: torch.Tensor, partner: torch.Tensor | None) -> torch.Tensor:
        """mean_m S[m, n] of Eq. 8 for every sample, shape (B, H, W)."""
        if self.cosine:  # per-position unit queries and keys: average the unit queries over positions
            queries = F.conv2d(maps, self.query.weight, self.query.bias)
            queries = queries / queries.norm(dim=1, keepdim=True)
            keys = F.conv2d(maps, self.key.weight, self.key.bias)
            keys = keys / keys.norm(dim=1, keepdim=True)
            pooled = queries.mean((2, 3))
            mixed = pooled if partner is None else (pooled + pooled.index_select(0, partner)) * 0.5
            return torch.einsum("bd,bdhw->bhw", mixed, keys)
        pooled = maps.mean((2, 3))
        mixed = pooled if partner is None else (pooled + pooled.index_select(0, partner)) * 0.5
        q = F.linear(mixed, self.query.weight.flatten(1), self.query.bias)  # (B, d): mean over m of the query
        v = F.linear(q, self.key.weight.flatten(1).t())                     # (B, C): W_k^T q
        scores = torch.einsum("bc,bchw->bhw", v, maps)
        if self.key.bias is not None:  # q . b_k, the same at every position
            scores = scores + (q @ self.key.bias).view(-1, 1, 1)
        return scores

    def weights(self, maps: torch.Tensor, partner: torch.Tensor | None = None) -> torch.Tensor:
        """The attention a_s of each sample over the H x W positions, shape (B, H, W); sums to 1."""
        scores = self._scores(maps, partner)
        return scores.flatten(1).softmax(1).view_as(scores)

    def weights_by_definition(self, maps: torch.Tensor, partner: torch.Tensor | None = None) -> torch.Tensor:
        """Eq. 8 literally: the HW x HW similarity, its mean over query positions, softmax (tests only)."""
        b, c, h, w = maps.shape
        queries = F.conv2d(maps, self.query.weight, self.query.bias).reshape(b, self.dim, h * w)  # (B, d, HW)
        keys = F.conv2d(maps, self.key.weight, self.key.bias).reshape(b, self.dim, h * w)
        if self.cosine:
            queries = queries / queries.norm(dim=1, keepdim=True)
            keys = keys / keys.norm(dim=1, keepdim=True)
        qj = queries if partner is None else queries[partner]
        s = ((qj + queries) / 2).transpose(1, 2) @ keys            # (B, HW_m, HW_n)
        return s.mean(1).softmax(1).view(b, h, w)

    def forward(self, maps: torch.Tensor, partner: torch.Tensor | None = None) -> torch.Tensor:
        """``partner``: index (B,) of each sample's same-class partner in training (None: self-attention)."""
        attention = self.weights(maps, partner)
        highlighted = torch.einsum("bhw,bchw->bc", attention, maps)
        if self.embedding_divisor:
            embedded = maps.sum((2, 3)) / self.embedding_divisor
        else:
            embedded = self.embedding(maps)
        return torch.cat([embedded, highlighted], 1)


def same_class_partners(labels: torch.Tensor, mode: str = "random") -> torch.Tensor:
    """For each sample, the index of another sample of its class (the partner X_j of Eq. 8).

    ``random``: uniformly among the other same-class samples of the batch (torch's generator of
    the labels' device); ``next``: the next one in batch order, cyclically (the public code). A
    sample whose class has no other member in the batch is its own partner (self-attention, the
    test-time rule). Batched on the labels' device, no host synchronisation.
    """
    if mode not in PARTNER_MODES:
        raise ConfigError(f"partner mode {mode!r} is not one of {', '.join(PARTNER_MODES)}")
    n = labels.shape[0]
    index = torch.arange(n, device=labels.device)
    candidate = (labels[:, None] == labels[None, :]) & (index[:, None] != index[None, :])
    if mode == "random":
        score = torch.rand(n, n, device=labels.device)
    else:
        score = -((index[None, :] - index[:, None]) % max(n, 1)).float()
    score = score.masked_fill(~candidate, float("-inf"))
    best = score.argmax(1) if n else index
    return torch.where(candidate.any(1), best, index)
