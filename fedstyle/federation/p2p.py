"""The in-process peer-to-peer simulator: decentralized SGD on a graph (DSGD, StyleDDG's Eq. 14).

Each device i keeps its own weights theta_i. Every iteration each device draws a mini-batch,
optionally computes a payload from it (``Algorithm.p2p_share``, e.g. StyleDDG's batch style),
sends theta_i and the payload to its one-hop neighbours, computes its gradient g_i on the batch
(``training_loss`` receives its neighbours' payloads as ``payload = {j: share_j}``), and updates::

    theta_i <- sum_j P_ij theta_j - lr * m_i,   m_i = momentum * m_i + g_i + wd * theta_i

with Metropolis–Hastings weights P. Momentum 0 is plain DSGD. BatchNorm running statistics are
mixed with the same weights; keys the algorithm keeps local (FedBN) are not mixed.

Devices' weights are stacked per state key (n x ...), so mixing is one matmul per key; the one
shared ``nn.Module`` is loaded with a device's weights to compute its gradient. ``p2p_share`` runs in
eval mode (no BatchNorm statistics change), ``training_loss`` in train mode; each draws from
torch's generators seeded per (round, step, device), so a random choice differs between steps.
"""

from __future__ import annotations

import math
import time

import networkx as nx
import torch
from torch import nn

from fedstyle.algorithms.base import Algorithm, check_finite
from fedstyle.algorithms.context import ClientContext
from fedstyle.data.client import ClientData
from fedstyle.errors import ConfigError
from fedstyle.federation.client import enter_client, snapshot
from fedstyle.federation.rounds import (
    FederationSettings,
    RoundResult,
    Traffic,
    check_finite_weights,
    mean_metrics,
    release_counts,
)
from fedstyle.federation.states import ClientStates
from fedstyle.federation.topology import consensus_distance, metropolis_hastings
from fedstyle.payload import check_payload, payload_nbytes, payload_values, weights_nbytes
from fedstyle.seeding import derive_seed


class P2PSimulator:
    topology = "p2p"

    def __init__(
        self,
        algo: Algorithm,
        model: nn.Module,
        clients: list[ClientData],
        settings: FederationSettings,
        graph: nx.Graph,
        seed: int,
        device: torch.device,
    ):
        if graph.number_of_nodes() != len(clients):
            raise ConfigError(f"the graph has {graph.number_of_nodes()} nodes but there are {len(clients)} clients")
        if settings.optimizer != "sgd":
            raise ConfigError("peer-to-peer runs use decentralized SGD; pass --optimizer sgd")
        if getattr(algo, "server_opt", None) is not None:
            raise ConfigError(f"server_opt={algo.hp['server_opt']} is a server's step and a peer-to-peer run has no "
                              "server; use --topology star or drop --hp server_opt")
        for cid, data in enumerate(clients):
            if len(data) == 0:
                raise ConfigError(f"device {cid} has no training samples; change --partition or --clients")
        self.algo, self.model, self.clients, self.graph = algo, model, clients, graph
        self.settings, self.seed, self.device = settings, seed, device
        self.mixing = metropolis_hastings(graph).to(device=device, dtype=torch.float32)
        self.neighbours = {i: sorted(graph.neighbors(i)) for i in graph.nodes}
        self.local_keys = algo.local_keys(model)
        self.param_keys = [k for k, _ in model.named_parameters()]
        init = snapshot(model)
        n = len(clients)
        self.stacked = {k: v.unsqueeze(0).repeat(n, *([1] * v.dim())).clone() for k, v in init.items()}
        self.momentum_buf = {k: torch.zeros_like(self.stacked[k]) for k in self.param_keys}
        # every device takes part in every iteration (their contexts live through the round): all in memory
        self.client_states = ClientStates(n, None, device)
        self.traffic = Traffic()

    @property
    def num_clients(self) -> int:
        return len(self.clients)

    def steps_per_round(self) -> int:
        s = self.settings
        if s.local_steps > 0:
            return s.local_steps
        mean_batches = sum(c.num_batches(s.batch_size) for c in self.clients) / self.num_clients
        return max(1, s.local_epochs * math.ceil(mean_batches))

    def device_weights(self) -> list[dict[str, torch.Tensor]]:
        return [{k: v[i] for k, v in self.stacked.items()} for i in range(self.num_clients)]

    def eval_weights(self) -> dict[str, torch.Tensor]:
        """The average model (1/n) sum_i theta_i."""
        out = {}
        for k, v in self.stacked.items():
            out[k] = v.mean(0) if v.is_floating_point() else torch.round(v.double().mean(0)).to(v.dtype)
        return out

    def consensus(self) -> float:
        flat = torch.cat([self.stacked[k].flatten(1).double() for k in self.param_keys if k not in self.local_keys], 1)
        return consensus_distance(flat)

    def setup(self) -> dict[str, float]:
        return {}

    def _context(self, i: int, round_index: int, steps: int, phase: str = "train") -> ClientContext:
        train = self.settings.train_settings(round_index)
        train.local_steps = steps
        return ClientContext(
            client_id=i,
            data=self.clients[i],
            state=self.client_states[i],
            train=train,
            round=round_index,
            num_clients=self.num_clients,
            device=self.device,
            seed=derive_seed(self.seed, "p2p", round_index, i),
            phase=phase,
        )

    def run_round(self, round_index: int) -> RoundResult:
        start = time.perf_counter()
        steps = self.steps_per_round()
        n = self.num_clients
        contexts = [self._context(i, round_index, steps) for i in range(n)]
        share_contexts = [self._context(i, round_index, steps, "share") for i in range(n)]
        shares_used = self.algo.uses_phase("share")
        iterators = [ctx.batches() for ctx in contexts]
        shared_keys = [k for k in self.stacked if k not in self.local_keys]
        model_bytes = weights_nbytes({k: self.stacked[k][0] for k in shared_keys})
        lr = contexts[0].train.lr
        mom, wd = self.settings.momentum, self.settings.weight_decay
        params = dict(self.model.named_parameters())
        buffers = dict(self.model.named_buffers())
        total_loss = torch.zeros((), device=self.device)
        for step in range(steps):
            batches = [next(it) for it in iterators]
            shares = {}
            if shares_used:
                for i, ctx in enumerate(share_contexts):
                    enter_client(self.algo, self.model, ctx, {k: v[i] for k, v in self.stacked.items()})
                    torch.manual_seed(derive_seed(self.seed, "p2p-share", round_index, step, i))
                    shares[i] = check_payload(self.algo.p2p_share(ctx, self.model, batches[i][0]), "p2p_share")
            grads = {k: torch.zeros_like(self.stacked[k]) for k in self.param_keys}
            new_buffers = {k: self.stacked[k].clone() for k in buffers}
            for i, ctx in enumerate(contexts):
                received = {j: shares[j] for j in self.neighbours[i]} if shares_used else {}
                enter_client(self.algo, self.model, ctx, {k: v[i] for k, v in self.stacked.items()})
                torch.manual_seed(derive_seed(self.seed, "p2p-step", round_index, step, i))
                x, y, _ = batches[i]
                x, y = self.algo.augment_batch(ctx, x, y)  # the local augment= option
                loss = self.algo.training_loss(ctx, self.model, x, y, received)
                self.model.zero_grad(set_to_none=True)
                loss.backward()
                total_loss += loss.detach()
                for k in self.param_keys:
                    if params[k].grad is not None:
                        grads[k][i] = params[k].grad
                for k in buffers:
                    new_buffers[k][i] = buffers[k]
                deg = len(self.neighbours[i])
                self.traffic.model_up += deg * model_bytes
                self.traffic.model_down += deg * model_bytes
                self.traffic.edge_messages += deg
                if shares_used:
                    sent = payload_nbytes(shares[i]) * deg
                    self.traffic.payload_up += sent
                    self.traffic.payload_down += sent
                    self.traffic.payload_values += payload_values(shares[i]) * deg
            self._mix_and_step(grads, new_buffers, lr, mom, wd)
            self.traffic.iterations += 1
        mean_loss = float(total_loss) / (steps * n)
        check_finite(mean_loss, contexts[0])
        check_finite_weights(self.stacked, round_index, lr, "the devices' mixed models")
        # a device's metrics: what its share hook logged (e.g. share_seconds) and its training hook logged
        metrics = [{**share.logged_metrics(), **train.logged_metrics()}
                   for share, train in zip(share_contexts, contexts)]
        return RoundResult(round_index, mean_loss, list(range(n)), time.perf_counter() - start,
                           metrics=mean_metrics(metrics), releases=release_counts(dict(enumerate(metrics))))

    @torch.no_grad()
    def _mix_and_step(self, grads, new_buffers, lr: float, momentum: float, weight_decay: float) -> None:
        n = self.num_clients
        for k in self.param_keys:
            theta = self.stacked[k]
            mixed = theta if k in self.local_keys else (self.mixing @ theta.reshape(n, -1)).reshape(theta.shape)
            g = grads[k] + weight_decay * theta
            buf = self.momentum_buf[k]
            buf.mul_(momentum).add_(g)
            step = lr * self.settings.head_lr_scale if k.startswith("head.") else lr  # the linear head's own lr
            self.stacked[k] = mixed - step * buf
        for k, value in new_buffers.items():
            if not value.is_floating_point():
                self.stacked[k] = value
            elif k in self.local_keys:
                self.stacked[k] = value
            else:
                self.stacked[k] = (self.mixing @ value.reshape(n, -1)).reshape(value.shape)

    # -- checkpointing ------------------------------------------------------------------
    def state_tensors(self) -> dict[str, torch.Tensor]:
        out = {f"device/{k}": v for k, v in self.stacked.items()}
        out.update({f"momentum/{k}": v for k, v in self.momentum_buf.items()})
        out.update(self.client_states.checkpoint_tensors())
        return out

    def checkpoint_saved(self) -> None:
        self.client_states.checkpoint_saved()

    def load_state_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        self.stacked = {k[7:]: v.to(self.device) for k, v in tensors.items() if k.startswith("device/")}
        self.momentum_buf = {k[9:]: v.to(self.device) for k, v in tensors.items() if k.startswith("momentum/")}
        self.client_states.restore(tensors)

    def meta(self) -> dict:
        return {"traffic": self.traffic.as_dict()}

    def load_meta(self, meta: dict) -> None:
        self.traffic = Traffic(**meta["traffic"])
