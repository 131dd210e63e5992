"""Necks of the baselines: FedSR's Gaussian representation and MOON's projection head.

Both take the backbone's last maps through the backbone's own pooling first: global average
pooling for ResNets and EfficientNet-Lite0, the flatten of the last map (C x h x w features, 256 at
32 x 32) for the Digits-DG ConvNet. A neck's parameters are part of the model's state; which of
them stay on a client (FedSR's reference distribution) is the method's decision (``local_keys``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from fedstyle.errors import ConfigError
from fedstyle.models.base import Backbone, Neck

#: FedSR's prediction rules (see :class:`GaussianNeck`)
PREDICT_RULES = ("mean", "mc")


def gaussian_kl(mu: torch.Tensor, sigma: torch.Tensor, mu_r: torch.Tensor, sigma_r: torch.Tensor) -> torch.Tensor:
    """Element-wise KL( N(mu, sigma^2) || N(mu_r, sigma_r^2) ) of diagonal Gaussians:
    log(sigma_r / sigma) + (sigma^2 + (mu - mu_r)^2) / (2 sigma_r^2) - 1/2."""
    return torch.log(sigma_r / sigma) + (sigma.square() + (mu - mu_r).square()) / (2.0 * sigma_r.square()) - 0.5


class GaussianNeck(Neck):
    """FedSR's probabilistic representation (Nguyen et al., NeurIPS'22): z ~ N(mu(x), diag(sigma(x)^2)).

    One linear layer on the pooled features outputs 2·z_dim numbers [m, s]: mu = m,
    sigma = softplus(s) + sigma_floor (the floor keeps log sigma finite in the CMI term; the public
    code has none). In training the neck returns one reparameterised sample z = mu + sigma·eps,
    eps ~ N(0, I) from torch's (seeded) global generator; at test time:

    - ``predict="mean"`` (default): the deterministic z = mu, so ``model(x) = head(mu)``;
    - ``predict="mc"``: the public code's rule, the softmax probabilities averaged over
      ``mc_samples`` draws of z; ``model(x)`` returns log of that mean (argmax = the averaged
      prediction). The draws come from a generator seeded with ``mc_seed`` at every call, so an
      evaluation is deterministic and does not touch the training random streams.

    It also holds the class-conditional reference r(z|y) = N(ref_mu[y], diag(softplus(ref_rho[y])^2))
    (ref_mu starts at 0, ref_rho at 1: sigma_y ≈ 1.313, as the public code) and, with
    ``cmi_scale=True``, the public code's learnable scalar C (starts at 1) that multiplies mu and
    sigma inside the KL only. These are not used for prediction; FedSR keeps them local to each
    client (see ``fedstyle.algorithms.fedsr``).
    """

    #: parameter names of the reference distribution (the ones a method may keep local)
    REFERENCE = ("ref_mu", "ref_rho", "ref_scale")

    def __init__(self, backbone: Backbone, num_classes: int, z_dim: int, sigma_floor: float = 1e-6,
                 predict: str = "mean", mc_samples: int = 20, mc_seed: int = 0, cmi_scale: bool = False):
        super().__init__()
        if z_dim < 1:
            raise ConfigError(f"z_dim must be at least 1, got {z_dim}")
        if predict not in PREDICT_RULES:
            raise ConfigError(f"unknown prediction rule {predict!r}; choose {' or '.join(PREDICT_RULES)}")
        if mc_samples < 1:
            raise ConfigError(f"mc_samples must be at least 1, got {mc_samples}")
        if not sigma_floor > 0:
            raise ConfigError(f"sigma_floor must be > 0 (e.g. 1e-6), got {sigma_floor}")
        self._pool = backbone.pool  # a bound method: no parameters, no state keys
        self.z_dim, self.sigma_floor = int(z_dim), float(sigma_floor)
        self.predict, self.mc_samples, self.mc_seed = predict, int(mc_samples), int(mc_seed)
        self.fc = nn.Linear(backbone.feature_dim, 2 * self.z_dim)
        self.ref_mu = nn.Parameter(torch.zeros(num_classes, self.z_dim))
        self.ref_rho = nn.Parameter(torch.ones(num_classes, self.z_dim))
        if cmi_scale:
            self.ref_scale = nn.Parameter(torch.ones(()))
        else:
            self.register_parameter("ref_scale", None)

    def out_dim(self, backbone: Backbone) -> int:
        return self.z_dim

    def distribution(self, maps: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(mu, sigma) of p(z|x), each (B, z_dim)."""
        mu, s = self.fc(self._pool(maps)).split(self.z_dim, dim=1)
        return mu, F.softplus(s) + self.sigma_floor

    @staticmethod
    def sample(mu: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        """One reparameterised draw z = mu + sigma·eps (eps from torch's global generator)."""
        return mu + sigma * torch.randn_like(mu)

    def forward(self, maps: torch.Tensor) -> torch.Tensor:
        mu, sigma = self.distribution(maps)
        return self.sample(mu, sigma) if self.training else mu

    def classify(self, head: nn.Module, maps: torch.Tensor) -> torch.Tensor:
        if self.training or self.predict == "mean":
            return head(self(maps))
        mu, sigma = self.distribution(maps)
        gen = torch.Generator(device=mu.device).manual_seed(self.mc_seed)
        eps = torch.randn((self.mc_samples, *mu.shape), generator=gen, device=mu.device, dtype=mu.dtype)
        log_probs = F.log_softmax(head(mu + sigma * eps), dim=-1)  # (S, B, C)
        return torch.logsumexp(log_probs, dim=0) - math.log(self.mc_samples)

    def reference(self, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(mu_y, sigma_y) of r(z|y) for the labels ``y``, each (B, z_dim)."""
        return self.ref_mu[y], F.softplus(self.ref_rho[y]) + self.sigma_floor

    def cmi(self, mu: torch.Tensor, sigma: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """FedSR's CMI bound: KL(p(z|x) || r(z|y)) summed over the z_dim dimensions, averaged over the batch."""
        if self.ref_scale is not None:
            mu, sigma = self.ref_scale * mu, self.ref_scale * sigma
        mu_y, sigma_y = self.reference(y)
        return gaussian_kl(mu, sigma, mu_y, sigma_y).sum(1).mean()


class ProjectionNeck(Neck):
    """MOON's projection head (Li et al., CVPR'21): pooled features h (d) -> Linear(d, d) -> ReLU ->
    Linear(d, out_dim) = z; the classifier is applied to z, the representation the model-contrastive
    loss compares (as the public code: not to h)."""

    def __init__(self, backbone: Backbone, out_dim: int = 256):
        super().__init__()
        if out_dim < 1:
            raise ConfigError(f"the projection's out_dim must be at least 1, got {out_dim}")
        d = backbone.feature_dim
        self._pool = backbone.pool
        self._out_dim = int(out_dim)
        self.proj = nn.Sequential(nn.Linear(d, d), nn.ReLU(), nn.Linear(d, self._out_dim))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Kaiming normal (fan_in) for the ReLU layer and for the linear one, zero biases: the
        variance-preserving init the backbones' convolutions get. PyTorch's default Linear init (the
        public code's) shrinks the signal by ~sqrt(3) per layer, so two extra layers before the
        classifier made a from-scratch ConvNet learn far slower than FedAvg's (the learning check,
        tests/test_learning.py: best source-validation accuracy 28 % against FedAvg's 53 % on the same
        budget; 39 % with this init)."""
        first, last = self.proj[0], self.proj[2]
        nn.init.kaiming_normal_(first.weight, mode="fan_in", nonlinearity="relu")
        nn.init.kaiming_normal_(last.weight, mode="fan_in", nonlinearity="linear")
        nn.init.zeros_(first.bias)
        nn.init.zeros_(last.bias)

    def out_dim(self, backbone: Backbone) -> int:
        return self._out_dim

    def forward(self, maps: torch.Tensor) -> torch.Tensor:
        return self.proj(self._pool(maps))
