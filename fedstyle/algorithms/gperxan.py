"""gPerXAN: personalised, explicitly assembled normalization and a guiding regulariser (Le, Ho, Do, Le-Phuoc, Wong,
CVPR'24, arXiv 2403.15605; code lhkhiem28/gPerXAN).

Three pieces, each a hyperparameter away from the others (the paper's ablation rows):

- **XAN** (``fedstyle.models.assembled_norm``): every BatchNorm2d of the backbone becomes
  ``a_BN * BN(x) + a_IN * IN(x)``, (a_BN, a_IN) = softmax of two learnable scores, both branches affine.
  InstanceNorm filters each image's own style (its channel statistics); BatchNorm keeps what discriminates.
- **PerXAN**: the InstanceNorm branch, the scores and every other weight are averaged by the server (FedAvg);
  the BatchNorm branch (affine weight and bias, running statistics) is personalised: it never comes down from the
  server and no client's model ever holds another's. FedBN's mechanism (``local_bn``, on by default here; off is
  the paper's plain-XAN row, everything averaged).
- **guiding regulariser** (``guide`` = lambda): client k trains on

      L_k = CE(W_k h_k(x), y) + lambda * CE(W_g h_k(x), y)

  with h_k its features (its personalised BatchNorm inside) and W_g the round's global classifier, frozen (what the
  client downloaded; its gradient reaches h_k only): the features must suit the classifier every client shares.

Hyperparameters, results, privacy, parity and the paper-versus-code analysis: docs/methods/gperxan.md.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fedstyle.algorithms.base import Algorithm
from fedstyle.algorithms.hparams import HParam
from fedstyle.algorithms.registry import register_method
from fedstyle.errors import ConfigError
from fedstyle.models.assembled_norm import assemble_norms, assembled_norms

#: the score that switches the BatchNorm branch off in the evaluation model (eval_norm=instance):
#: exp(-1e4 - s) is 0 in float32 and float64 for any score s the InstanceNorm branch can reach
BATCHNORM_OFF = -1e4


@register_method
class GPerXAN(Algorithm):
    """Assembled BatchNorm + InstanceNorm, the BatchNorm branch personalised, guided by the global classifier."""

    name = "gperxan"
    label = "gPerXAN"
    summary = ("every BatchNorm becomes a learned mix of BatchNorm and InstanceNorm; the InstanceNorm branch is "
               "averaged, the BatchNorm branch stays on its client; local features are also trained to suit the "
               "frozen global classifier. Sends weights only")
    paper = ("Le, Ho, Do, Le-Phuoc, Wong, Efficiently assemble normalization layers and regularization for federated "
             "domain generalization, CVPR 2024")
    HPARAMS = (
        HParam("guide", 0.5, "lambda: weight of the guiding regulariser CE(frozen global classifier(features), y)",
               low=0.0),
        HParam("eval_norm", "average", "the evaluation model's BatchNorm branch: the clients' average, sent up with "
               "the weights (average: the authors' code), or none, the target classified through the InstanceNorm "
               "branch alone and the BatchNorm branch never leaving its client (instance)",
               choices=("average", "instance")),
        HParam("reference_code", False, "the authors' code: the BatchNorm branch's score is personalised with it "
               "(their key filter 'batchnorm' also matches score_batchnorm)"),
    )
    DEFAULTS = {"local_bn": True}  # PerXAN: FedBN's local layers are the BatchNorm branches

    # -- model --------------------------------------------------------------------------
    def configure_model(self, model):
        if self.hp["eval_norm"] == "instance" and not self.hp["local_bn"]:
            raise ConfigError("gperxan eval_norm=instance keeps the BatchNorm branch on its client, which needs "
                              "local_bn=true; drop --hp local_bn=false or use eval_norm=average")
        assemble_norms(model)
        self.norm_names = list(assembled_norms(model))
        if not self.norm_names:
            raise ConfigError("gperxan assembles InstanceNorm with each BatchNorm2d layer and this backbone has none; "
                              "use one with BatchNorm (convnet, resnet18, resnet50, efficientnet_lite0)")
        super().configure_model(model)
        self.kept_on_server = sorted(self.private_keys(model))

    def score_keys(self) -> set[str]:
        """The BatchNorm branches' scores: local with ``reference_code`` or ``eval_norm=instance``."""
        return {f"{name}.score_batchnorm" for name in self.norm_names}

    def local_keys(self, model):
        keys = super().local_keys(model)
        if self.hp["reference_code"] or self.hp["eval_norm"] == "instance":
            keys |= self.score_keys()
        return keys

    def private_keys(self, model):
        return self.local_keys(model) if self.hp["eval_norm"] == "instance" else set()

    # -- server -------------------------------------------------------------------------
    def init_server_state(self, server):
        for key in self.score_keys() & set(self.kept_on_server):  # the evaluation model: InstanceNorm only
            server.weights[key] = torch.full_like(server.weights[key], BATCHNORM_OFF)

    def aggregate(self, server, updates):
        """FedAvg of what came up; keys that never leave a client keep the server's own (evaluation) value."""
        out = super().aggregate(server, updates)
        for key in self.kept_on_server:
            out[key] = server.weights[key]
        return out

    # -- client -------------------------------------------------------------------------
    def training_loss(self, ctx, model, x, y, payload):
        features = model.features(x)
        ce = F.cross_entropy(model.head(features), y)
        ctx.log("gperxan_ce", ce)
        if self.hp["guide"] == 0:
            return ce
        weight, bias = ctx.global_weights["head.weight"], ctx.global_weights["head.bias"]
        guide = F.cross_entropy(F.linear(features, weight.to(features), bias.to(features)), y)
        ctx.log("gperxan_guide", guide)
        return ce + self.hp["guide"] * guide

    def after_local_train(self, ctx, model):
        with torch.no_grad():
            a_in = torch.stack([m.branch_weights()[1] for m in assembled_norms(model).values()])
        ctx.log("gperxan_in_weight", a_in.mean())
