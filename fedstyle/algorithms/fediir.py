"""FedIIR: implicit invariant relationships by inter-client gradient alignment (Guo, Guo, Cao, Wu, Chang, ICML'23).

The model is a featurizer Phi and a classifier w (here: the neck's hidden layer and the head). A relationship
between input and label that holds on every client is one the clients' classifiers agree on; the paper
measures it by their prediction disagreement and bounds that by how far each client's classifier gradient
lies from the clients' mean, so client e trains, per mini-batch,

    L_e = CE_e(w o Phi) + gamma || grad_w CE_e(w o Phi) - g_bar ||^2          (summed over the classifier's tensors)

with g_bar the clients' mean classifier gradient at the round's global model, which the server tracks across
rounds with an exponential moving average (the paper's App. C):

    g_hat^t = mean_{e in S_t} grad_w R_e(w^t o Phi^t)        query phase: each sampled client, downloaded model
    g_bar^t = beta g_bar^{t-1} + (1 - beta) g_hat^t,  g_bar^0 = 0          (server.state, checkpointed)

One more exchange per round (the query): each sampled client receives the model for it (fedstyle's star
counts that download like the training one) and sends its classifier gradient up (|w| numbers); g_bar comes
down beside the training download (|w| numbers). The penalty's gradient is a second-order pass through the
classifier (``create_graph``), which reaches Phi too.

Hyperparameters, results, privacy, parity and the paper-versus-code analysis: docs/methods/fediir.md.
"""

from __future__ import annotations

import math
import time

import torch
import torch.nn.functional as F
from torch import nn

from fedstyle.algorithms.base import Algorithm
from fedstyle.algorithms.context import ClientContext, ServerContext
from fedstyle.algorithms.hparams import HParam
from fedstyle.algorithms.registry import register_method
from fedstyle.models.base import Backbone, Neck
from fedstyle.models.convnet import ConvNet
from fedstyle.payload import Payload

GRAD = "g/"  # payload key prefix: one tensor per classifier parameter
BATCHES = "batches"  # query payload: the client's number of training batches (reference_code weighting)
_EMA = "fediir/ema/"  # server.state: g_bar, per classifier parameter
_QUERY_SECONDS = "fediir/query_seconds"  # ctx.state: this round's query time, logged by local_train
_CHUNK = 256


class HiddenNeck(Neck):
    """The backbone's pooled features (d) -> Linear(d, width) -> ReLU: the first layer of FedIIR's two-layer
    classifier, Kaiming-normal weight as the authors' code (its PyTorch-default bias kept)."""

    def __init__(self, backbone: Backbone, width: int):
        super().__init__()
        self._pool = backbone.pool  # a bound method: no parameters
        self.hidden = nn.Linear(backbone.feature_dim, width)
        nn.init.kaiming_normal_(self.hidden.weight)

    def out_dim(self, backbone: Backbone) -> int:
        return self.hidden.out_features

    def forward(self, maps: torch.Tensor) -> torch.Tensor:
        return F.relu(self.hidden(self._pool(maps)))


@register_method
class FedIIR(Algorithm):
    """Inter-client alignment of the classifier's gradients (docs/methods/fediir.md)."""

    name = "fediir"
    label = "FedIIR"
    summary = ("each client's classifier gradient is pulled towards the clients' mean (an EMA the server keeps "
               "from a query each round), so the classifier learns relationships that hold on every client")
    paper = ("Guo, Guo, Cao, Wu, Chang, Out-of-distribution generalization of federated learning via implicit "
             "invariant relationships, ICML 2023")
    HPARAMS = (
        HParam("penalty", 1e-3, "gamma: weight of || grad_w CE - g_bar ||^2", low=0.0),
        HParam("ema", 0.95, "beta of the server's moving average of the mean classifier gradient", low=0.0, high=1.0),
        HParam("hidden", -1, "width of the classifier's hidden layer (0: none, the linear head; -1: the authors' "
               "rule, half the feature width on ResNet / EfficientNet and none on the ConvNet)", low=-1),
        HParam("grad_samples", 0, "samples of the client's data for its mean gradient (0: all of them)", low=0),
        HParam("reference_code", False, "the authors' code: the mean gradient pools the clients' batches (a client "
               "weighs its number of batches) instead of the plain mean over clients"),
    )

    # -- model --------------------------------------------------------------------------
    def configure_model(self, model):
        width = self.hp["hidden"]
        if width < 0:  # auto: the authors' rule, a hidden layer on the large pretrained-style featurizers only
            width = 0 if isinstance(model.backbone, ConvNet) else model.backbone.feature_dim // 2
        if width > 0:
            model.set_neck(HiddenNeck(model.backbone, width))
        nn.init.kaiming_normal_(model.head.weight)  # the code initialises every classifier layer so
        super().configure_model(model)  # after the neck: param_keys then include it
        self.classifier_keys = [k for k in self.param_keys if k.startswith(("head.", "neck."))]

    def classifier(self, model) -> list[torch.Tensor]:
        named = dict(model.named_parameters())
        return [named[k] for k in self.classifier_keys]

    # -- query: the client's mean classifier gradient on the downloaded model ----------------------------------
    def round_query(self, ctx: ClientContext, model) -> Payload:
        start = time.perf_counter()
        data = ctx.data
        index = torch.arange(len(data))
        if 0 < self.hp["grad_samples"] < len(data):
            index = torch.randperm(len(data), generator=ctx.generator)[: self.hp["grad_samples"]]
        params = self.classifier(model)
        total = [torch.zeros_like(p) for p in params]
        images, labels = data.images, data.labels  # each read gathers the client's rows: once
        with torch.enable_grad():
            for chunk in index.split(_CHUNK):
                x = data.transform(images[chunk].to(ctx.device), train=False)
                loss = F.cross_entropy(model(x), labels[chunk].to(ctx.device), reduction="sum")
                for acc, g in zip(total, torch.autograd.grad(loss, params)):
                    acc.add_(g)
        if ctx.device.type == "cuda":
            torch.cuda.synchronize(ctx.device)  # once per round: the phase's time for the metrics
        ctx.state[_QUERY_SECONDS] = torch.tensor(time.perf_counter() - start, dtype=torch.float64)
        out: Payload = {GRAD + k: (g / len(index)).detach() for k, g in zip(self.classifier_keys, total)}
        out[BATCHES] = math.ceil(len(data) / ctx.train.batch_size)
        return out

    # -- server: the moving average ------------------------------------------------------------------------------
    def init_server_state(self, server: ServerContext) -> None:
        for key in self.classifier_keys:
            server.state[_EMA + key] = torch.zeros(server.weights[key].shape, dtype=torch.float32)

    def round_payloads(self, server, client_ids, queries):
        answered = [c for c in client_ids if GRAD + self.classifier_keys[0] in queries.get(c, {})]
        if not answered:
            return {}
        weights = [float(queries[c][BATCHES]) if self.hp["reference_code"] else 1.0 for c in answered]
        beta, total = self.hp["ema"], sum(weights)
        grad_sq = ema_sq = 0.0
        for key in self.classifier_keys:
            mean = sum(w * queries[c][GRAD + key].detach().to("cpu", torch.float32) for w, c in zip(weights, answered))
            mean = mean / total
            server.state[_EMA + key] = beta * server.state[_EMA + key] + (1.0 - beta) * mean
            grad_sq += float(mean.square().sum())
            ema_sq += float(server.state[_EMA + key].square().sum())
        server.metrics.update(fediir_grad_norm=math.sqrt(grad_sq), fediir_ema_norm=math.sqrt(ema_sq))
        payload = {GRAD + k: server.state[_EMA + k].clone() for k in self.classifier_keys}
        return {c: payload for c in answered}

    # -- client: the penalised loss ---------------------------------------------------------------------------------
    def local_train(self, ctx, model, payload):
        seconds = ctx.state.pop(_QUERY_SECONDS, None)
        if seconds is not None:
            ctx.log("fediir_query_seconds", float(seconds))
        return super().local_train(ctx, model, payload)

    def training_loss(self, ctx, model, x, y, payload):
        ce = F.cross_entropy(model(x), y)
        ctx.log("fediir_ce", ce)
        if GRAD + self.classifier_keys[0] not in payload:  # no g_bar this round (the server got no query)
            return ce
        with ctx.timed("fediir_penalty"):
            params = self.classifier(model)
            grads = torch.autograd.grad(ce, params, create_graph=True)
            penalty = sum((g - payload[GRAD + k].to(g.device, g.dtype)).square().sum()
                          for g, k in zip(grads, self.classifier_keys))
        ctx.log("fediir_penalty", penalty)
        return ce + self.hp["penalty"] * penalty
