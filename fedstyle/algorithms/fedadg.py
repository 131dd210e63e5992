"""FedADG (Zhang, Lei, Shi, Huang, Chen, "Federated learning with domain generalization", arXiv 2111.10487,
2021; IEEE IoT Journal 2023): federated adversarial alignment of every client's features to one generated,
class-conditional reference distribution.

Each client holds the feature extractor F (backbone + neck: ``model.features``), the classifier C (the head),
a distribution generator G and a discriminator D. G maps uniform noise xi ~ U[0, 1)^noise_dim and the label
code c(y) = onehot · e_y to a reference feature r = G(xi, c(y)); D(h, c(y)) in (0, 1) tells a reference feature
(target 1) from a client's feature h = F(x) (target 0), per class (the label code is an input of D). With the
paper's loss names (the forms are the authors' least-squares ones, see Sources):

    L_err  = CE(C(F(x)), y)                                        (label smoothing: ``label_smoothing``)
    L_advd = mean[(1 - D(G(xi, c), c))^2 + D(F(x), c)^2]            D: references -> 1, features -> 0
    L_advf = mean[(1 - D(F(x), c))^2]                                F: its features look like the reference
    L_advg = mean[D(G(xi, c), c)^2]                                  G: the reference moves to the features
    F, C minimise (1 - lambda_adv) · L_err + lambda_adv · L_advf

Hyperparameters, results, privacy, parity and the paper-versus-code analysis: docs/methods/fedadg.md.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from fedstyle.algorithms.base import Algorithm
from fedstyle.algorithms.hparams import HParam
from fedstyle.algorithms.registry import register_method
from fedstyle.errors import ConfigError

GENERATOR, DISCRIMINATOR = "fedadg_generator", "fedadg_discriminator"


class ReferenceGenerator(nn.Module):
    """r = ReLU(W2 · LeakyReLU(W1 · [xi, c] + b1) + b2): noise and label code -> a reference feature (B, d)."""

    def __init__(self, noise_dim: int, num_classes: int, hidden: int, feature_dim: int):
        super().__init__()
        self.noise_dim = int(noise_dim)
        self.fc1 = nn.Linear(noise_dim + num_classes, hidden)
        self.fc2 = nn.Linear(hidden, feature_dim)
        for layer in (self.fc1, self.fc2):
            nn.init.xavier_uniform_(layer.weight, gain=0.5)

    def forward(self, noise: torch.Tensor, code: torch.Tensor) -> torch.Tensor:
        return F.relu(self.fc2(F.leaky_relu(self.fc1(torch.cat([noise, code], 1)))))


class ClassDiscriminator(nn.Module):
    """D(h, c) = sigmoid(V2 · LeakyReLU(V1 · [P h, c] + a1) + a2), shape (B,): a feature's probability of being a
    reference feature of class code c (P: the bias-free projection to rp_size)."""

    def __init__(self, feature_dim: int, num_classes: int, rp_size: int, hidden: int):
        super().__init__()
        self.projection = nn.Linear(feature_dim, rp_size, bias=False)
        self.fc1 = nn.Linear(rp_size + num_classes, hidden)
        self.fc2 = nn.Linear(hidden, 1)
        for layer in (self.projection, self.fc1, self.fc2):
            nn.init.kaiming_uniform_(layer.weight)

    def forward(self, h: torch.Tensor, code: torch.Tensor) -> torch.Tensor:
        z = torch.cat([self.projection(h.flatten(1)), code], 1)
        return torch.sigmoid(self.fc2(F.leaky_relu(self.fc1(z)))).squeeze(1)


def discriminator_loss(d_reference: torch.Tensor, d_features: torch.Tensor) -> torch.Tensor:
    """L_advd = mean[(1 - D(reference))^2 + D(features)^2]."""
    return ((1.0 - d_reference).square() + d_features.square()).mean()


def extractor_loss(d_features: torch.Tensor) -> torch.Tensor:
    """L_advf = mean[(1 - D(features))^2]."""
    return (1.0 - d_features).square().mean()


def generator_loss(d_reference: torch.Tensor) -> torch.Tensor:
    """L_advg = mean[D(reference)^2]."""
    return d_reference.square().mean()


#: the widest generator / projection layer accepted (the authors' sizes are 2,048 and 4,096): a width of 10^12
#: would ask the allocator for terabytes and die with its traceback instead of a sentence
MAX_WIDTH = 65_536
#: the generator's first layer, (noise_dim + K) x gen_hidden, at most this many weights (2^28: 1 GiB of float32)
MAX_GENERATOR_WEIGHTS = 2**28


@register_method
class FedADG(Algorithm):
    name = "fedadg"
    label = "FedADG"
    summary = ("adversarial alignment of each client's features to a generated class-conditional reference "
               "distribution (generator averaged, discriminator local)")
    paper = "Zhang, Lei, Shi, Huang, Chen, Federated learning with domain generalization, arXiv 2111.10487, 2021"
    HPARAMS = (
        HParam("lambda_adv", 0.15, "weight of L_advf in F and C's loss; L_err gets 1 - lambda_adv", low=0.0, high=1.0),
        HParam("noise_dim", 2048, "dimension of the generator's uniform noise", low=1, high=MAX_WIDTH),
        HParam("gen_hidden", 4096, "hidden width of the distribution generator", low=1, high=MAX_WIDTH),
        HParam("rp_size", 1024, "width of the discriminator's projection of a feature", low=1, high=MAX_WIDTH),
        HParam("disc_hidden", 1024, "hidden width of the discriminator", low=1, high=MAX_WIDTH),
        HParam("onehot", 0.7, "value of the label code's hot entry (generator and discriminator input)", low=0.0),
        HParam("adv_lr_scale", 0.02, "learning rate of G and D as a multiple of the run's (scheduled) lr (the "
               "code's lr1 / lr0 = 0.7 times its per-round warm-up, ~3 %)", low=0.0),
        HParam("ce_warmup", 0.3, "fraction of each round's local steps that train F and C on L_err alone",
               low=0.0, high=1.0),
        HParam("label_smoothing", 0.0, "label smoothing of L_err", low=0.0, high=1.0),
    )

    @classmethod
    def resolve(cls, given):
        hp = super().resolve(given)
        if hp["noise_dim"] * hp["gen_hidden"] > MAX_GENERATOR_WEIGHTS:
            raise ConfigError(f"noise_dim x gen_hidden = {hp['noise_dim'] * hp['gen_hidden']:,} generator weights is "
                              f"above {MAX_GENERATOR_WEIGHTS:,} (1 GiB); lower noise_dim or gen_hidden (the authors': "
                              "2048 and 4096)")
        return hp

    def configure_model(self, model):
        width = model.head.in_features  # the neck's output: the feature h = F(x)
        setattr(model, GENERATOR, ReferenceGenerator(self.hp["noise_dim"], self.num_classes, self.hp["gen_hidden"],
                                                     width))
        setattr(model, DISCRIMINATOR, ClassDiscriminator(width, self.num_classes, self.hp["rp_size"],
                                                         self.hp["disc_hidden"]))
        super().configure_model(model)  # after the modules: param_keys then include them
        self.discriminator_keys = {f"{DISCRIMINATOR}.{k}" for k in getattr(model, DISCRIMINATOR).state_dict()}

    def local_keys(self, model):
        return super().local_keys(model) | self.discriminator_keys

    def aggregate(self, server, updates):
        out = super().aggregate(server, updates)
        for key in self.discriminator_keys:  # each client's own; the server's copy is never used
            out[key] = server.weights[key]
        return out

    def local_train(self, ctx, model, payload):
        """The base loop (its optimiser steps F and C: G and D never hold a gradient when it steps) with
        G's and D's optimisers and the round's warm-up length in ``ctx.scratch``."""
        adversarial = dataclasses.replace(ctx.train, lr=ctx.train.lr * self.hp["adv_lr_scale"])
        ctx.scratch["fedadg/g_opt"] = adversarial.make_optimizer(getattr(model, GENERATOR).parameters())
        ctx.scratch["fedadg/d_opt"] = adversarial.make_optimizer(getattr(model, DISCRIMINATOR).parameters())
        ctx.scratch["fedadg/warmup"] = int(self.hp["ce_warmup"] * ctx.train.steps_for(ctx.data))
        ctx.scratch["fedadg/step"] = 0
        return super().local_train(ctx, model, payload)

    def label_code(self, y: torch.Tensor) -> torch.Tensor:
        return self.hp["onehot"] * F.one_hot(y, self.num_classes).float()

    def training_step(self, ctx, model, optimizer, x, y, payload):
        step = ctx.scratch["fedadg/step"]
        ctx.scratch["fedadg/step"] = step + 1
        smoothing = self.hp["label_smoothing"]
        if step < ctx.scratch["fedadg/warmup"]:  # E0: L_err alone
            ce = F.cross_entropy(model(x), y, label_smoothing=smoothing)
            optimizer.zero_grad(set_to_none=True)
            ce.backward()
            optimizer.step()
            ctx.log("fedadg_ce", ce)
            return ce.detach()
        generator, discriminator = getattr(model, GENERATOR), getattr(model, DISCRIMINATOR)
        g_opt, d_opt = ctx.scratch["fedadg/g_opt"], ctx.scratch["fedadg/d_opt"]
        code = self.label_code(y)
        noise = torch.rand(x.shape[0], generator.noise_dim, device=x.device)
        # (1) D on L_advd: F's features in eval mode (the code's fetExtrac.eval()), both inputs detached
        with torch.no_grad():
            model.eval()
            h_eval = model.features(x)
            model.train()
            reference = generator(noise, code)
        adv_d = discriminator_loss(discriminator(reference, code), discriminator(h_eval, code))
        d_opt.zero_grad(set_to_none=True)
        adv_d.backward()
        d_opt.step()
        d_opt.zero_grad(set_to_none=True)
        # (2) F and C on (1 - lambda) L_err + lambda L_advf, through the updated D (frozen)
        discriminator.requires_grad_(False)
        try:
            h = model.features(x)
            ce = F.cross_entropy(model.head(h), y, label_smoothing=smoothing)
            adv_f = extractor_loss(discriminator(h, code))
            loss = (1.0 - self.hp["lambda_adv"]) * ce + self.hp["lambda_adv"] * adv_f
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            # (3) G on L_advg, the same noise and codes
            adv_g = generator_loss(discriminator(generator(noise, code), code))
            g_opt.zero_grad(set_to_none=True)
            adv_g.backward()
            g_opt.step()
            g_opt.zero_grad(set_to_none=True)
        finally:
            discriminator.requires_grad_(True)
        for name, value in (("ce", ce), ("adv_d", adv_d), ("adv_f", adv_f), ("adv_g", adv_g)):
            ctx.log(f"fedadg_{name}", value)
        return loss.detach()
