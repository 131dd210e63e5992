"""The batched client executor (Issue 23): a round's sampled clients trained as one computation.

On the sequential path (:func:`~fedstyle.federation.client.run_client_phase` per client) each client's
mini-batches run one after another on the shared model. On a GPU a small model's step is launch-bound
(the digits ConvNet reaches about 1% of an H100's matmul rate), so :class:`BatchedTrainer` stacks the
clients' weights, BatchNorm buffers and optimiser states along a leading client axis and steps every
client at once: ``torch.func.vmap`` over ``grad`` of ``torch.func.functional_call`` (the model and the
method's :meth:`~fedstyle.algorithms.base.Algorithm.functional_loss` are written once), then the
optimiser's update on the stacked tensors. Each client keeps what is its own on the sequential path:

- weights in: the download, then its local layers (FedBN), loaded by ``enter_client`` as before;
- data: its own ``training_batches(ctx)`` iterator (its generator), pulled in client order; torch's
  global generators are swapped per client around each pull, so an augmentation draws its stream;
- BatchNorm running statistics: passed batched to ``functional_call``, so the in-place updates land
  per client (checked against the module in tests/test_batched_clients.py);
- optimiser: ``torch.optim.SGD`` (momentum, weight decay) and ``Adam`` re-implemented on the stacked
  tensors with per-client state, fresh each round at the round's ``ctx.train.lr``;
- ragged steps: clients step in lockstep; each step's active clients are grouped by batch shape (a
  client out of steps drops out, a short last batch forms its own group), gathered and scattered back;
- the end: each client's weights go back into the shared model for ``after_local_train``,
  ``upload_payload`` and the :class:`~fedstyle.algorithms.context.ClientUpdate`, as on the sequential path.

Equal to the sequential path within float32 rounding, not bitwise (batched convolutions sum in another
order; the test states the bound). ``--client-batching auto`` batches on CUDA only: on a 2-core CPU
(ConvNet, 30 clients x 5 steps of 32) the sequential path trained 1,000-1,500 samples/s, vmap 350 and
grouped convolutions 560-760. The Flower runtimes keep the sequential path (one client per site).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Iterator

import torch
from torch.func import functional_call, grad_and_value, vmap

from fedstyle.algorithms.base import DEFER_TRAINING, Algorithm, ClientResult, finish_local_train
from fedstyle.algorithms.context import ClientContext, ClientUpdate, TrainSettings
from fedstyle.errors import ConfigError
from fedstyle.federation.client import client_update, enter_client

#: --client-batching: auto (batched on CUDA where the method allows), on (wherever it allows), off
MODES = ("auto", "on", "off")
_DEVICES = ("cpu", "cuda")
_ADAM_BETAS, _ADAM_EPS = (0.9, 0.999), 1e-8  # torch.optim.Adam's defaults, as TrainSettings.make_optimizer


@dataclass
class BatchingDecision:
    """How a run's in-process training phases run: ``trainer`` None is the sequential path, ``reason`` why."""

    trainer: "BatchedTrainer | None"
    reason: str = ""


def decide_batching(sim: Any, mode: str) -> BatchingDecision:
    """The decision for star simulator ``sim`` under ``mode`` (one of :data:`MODES`); ``on`` warns when
    the method, optimiser, device or model rules batching out, and the run goes on sequentially."""
    if mode not in MODES:
        raise ConfigError(f"--client-batching {mode!r} is not one of {', '.join(MODES)}")
    if mode == "off":
        return BatchingDecision(None, "--client-batching off")
    if mode == "auto" and sim.device.type != "cuda":
        return BatchingDecision(None, f"--client-batching auto batches on CUDA only (on {sim.device.type} the "
                                      "sequential path is faster)")
    algo = sim.algo
    reason = (algo.batching_support(algo.hp)
              or (f"device {sim.device.type} (batched on {' and '.join(_DEVICES)} only)"
                  if sim.device.type not in _DEVICES else None)
              or (f"optimizer {sim.settings.optimizer}" if sim.settings.optimizer not in ("sgd", "adam") else None)
              or _vmap_probe(sim.model, tuple(sim.clients[0].pool.images.shape[1:]), sim.device))
    if reason:
        if mode == "on":  # one line on stderr, not a UserWarning with a source line
            print(f"fedstyle: --client-batching on: {algo.name} trains its clients one by one: {reason}",
                  file=sys.stderr)
        return BatchingDecision(None, reason)
    return BatchingDecision(BatchedTrainer(sim), "batched")


def _vmap_probe(model: torch.nn.Module, sample_shape: tuple[int, ...], device: torch.device) -> str | None:
    """None when the model's training forward runs under vmap without random draws (else why not)."""
    params = {n: p.detach().unsqueeze(0).expand(2, *p.shape) for n, p in model.named_parameters()}
    buffers = {n: b.detach().unsqueeze(0).repeat(2, *[1] * b.dim()) for n, b in model.named_buffers()}
    dtype = next(iter(params.values())).dtype if params else torch.float32
    x = torch.zeros(2, 2, *sample_shape, device=device, dtype=dtype)
    was_training = model.training
    model.train()
    try:
        with torch.no_grad():
            vmap(lambda p, b, x: functional_call(model, (p, b), (x,)), randomness="error")(params, buffers, x)
    except Exception as err:  # any failure: the model cannot be batched, the sequential path can
        return f"the model's forward pass does not run under torch.func.vmap ({str(err).splitlines()[0][:120]})"
    finally:
        model.train(was_training)
    return None


def _rng_state(device: torch.device) -> tuple:
    return torch.get_rng_state(), torch.cuda.get_rng_state(device) if device.type == "cuda" else None


def _set_rng_state(state: tuple, device: torch.device) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)


@dataclass
class _Client:
    ctx: ClientContext
    batches: Iterator
    rng: tuple
    wrapped: ClientResult | None  # what a BATCHING_WRAPPERS local_train returned (its metrics, payload)
    steps: int = 0
    done: bool = False


class _StackedOptimizer:
    """``torch.optim.SGD`` / ``Adam`` (as :meth:`TrainSettings.make_optimizer` makes them) on stacked
    tensors: the same element-wise updates, per client; ``index`` None means every client. One difference:
    a trainable parameter the forward never uses gets a zero gradient here (so weight decay and momentum
    move it) where torch's optimisers skip a parameter without one; no batchable method has such a one."""

    def __init__(self, train: TrainSettings, params: dict[str, torch.Tensor]):
        self.train = train
        names = {"sgd": ("momentum_buffer",) if train.momentum else (), "adam": ("exp_avg", "exp_avg_sq")}
        self.state = {n: {s: torch.zeros_like(p) for s in names[train.optimizer]} for n, p in params.items()}

    def step(self, params: dict[str, torch.Tensor], grads: dict[str, torch.Tensor], index, t: int) -> None:
        for name, p in params.items():
            full = self.state[name]
            state = full if index is None else {s: v.index_select(0, index) for s, v in full.items()}
            lr = self.train.lr * (self.train.head_lr_scale if name.startswith("head.") else 1.0)
            (self._sgd if self.train.optimizer == "sgd" else self._adam)(p, grads[name], state, t, lr)
            if index is not None:
                for s, v in state.items():
                    full[s].index_copy_(0, index, v)

    def _sgd(self, p, grad, state, t, lr):
        train = self.train
        if train.weight_decay:
            grad = grad.add(p, alpha=train.weight_decay)
        if train.momentum:
            buf = state["momentum_buffer"]
            buf.copy_(grad) if t == 0 else buf.mul_(train.momentum).add_(grad, alpha=1)
            grad = buf
        p.add_(grad, alpha=-lr)

    def _adam(self, p, grad, state, t, lr):
        (beta1, beta2), step = _ADAM_BETAS, float(t + 1)
        if self.train.weight_decay:
            grad = grad.add(p, alpha=self.train.weight_decay)
        state["exp_avg"].lerp_(grad, 1 - beta1)
        state["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        step_size = lr / (1 - beta1**step)
        denom = (state["exp_avg_sq"].sqrt() / (1 - beta2**step) ** 0.5).add_(_ADAM_EPS)
        p.addcdiv_(state["exp_avg"], denom, value=-step_size)


class BatchedTrainer:
    """The training phase of a star simulator's in-process transport, all requested clients at once."""

    def __init__(self, sim: Any):
        self.sim = sim
        model = sim.model
        self.tensors = {**dict(model.named_parameters()), **dict(model.named_buffers())}
        self.trainable = [n for n, p in model.named_parameters() if p.requires_grad]
        self.fixed = [n for n, p in model.named_parameters() if not p.requires_grad]
        self.buffers = [n for n, _ in model.named_buffers()]
        # batching_support allowed an overridden local_train only as a declared wrapper of the base loop
        self.wraps_local_train = type(sim.algo).local_train is not Algorithm.local_train
        algo = sim.algo

        def loss(trainable, fixed, buffers, x, y, global_weights):
            logits = functional_call(model, (trainable, fixed, buffers), (x,))
            return algo.functional_loss(logits, y, trainable, global_weights)

        def one_client(trainable, fixed, buffers, x, y, global_weights):
            # buffers are arguments, not captured: BatchNorm's in-place running-stat updates must land in them
            return grad_and_value(loss)(trainable, fixed, buffers, x, y, global_weights)

        self._step_fn = vmap(one_client, in_dims=(0, 0, 0, 0, 0, None), randomness="error")

    def train(self, requests: dict, round_index: int) -> dict[int, ClientUpdate]:
        """Every request's client trained; replies in the requests' order, as the sequential path's."""
        device = self.sim.device
        k = len(requests)
        self.stacked = {n: torch.empty((k, *t.shape), dtype=t.dtype, device=t.device) for n, t in self.tensors.items()}
        try:
            clients = [self._enter(i, cid, request, round_index) for i, (cid, request) in enumerate(requests.items())]
            self.optimizer = _StackedOptimizer(clients[0].ctx.train, {n: self.stacked[n] for n in self.trainable})
            self.totals = torch.zeros(k, device=device)
            self.global_weights = clients[0].ctx.global_weights
            self._lockstep(clients, k)
            return {client.ctx.client_id: self._leave(i, client) for i, client in enumerate(clients)}
        finally:  # the stacked copies live for one phase only
            self.stacked = self.optimizer = self.totals = self.global_weights = None

    def _lockstep(self, clients: list[_Client], k: int) -> None:
        """Step every client with a batch left, each step's clients grouped by batch shape."""
        device = self.sim.device
        t = 0
        while True:
            groups: dict[tuple, list[tuple[int, tuple]]] = {}
            for i, client in enumerate(clients):
                if client.done:
                    continue
                _set_rng_state(client.rng, device)
                batch = next(client.batches, None)  # the client's own stream, in client order
                client.rng = _rng_state(device)
                if batch is None:
                    client.done = True
                    continue
                x, y = batch
                groups.setdefault((tuple(x.shape), x.dtype, tuple(y.shape), y.dtype), []).append((i, batch))
            if not groups:
                break
            for members in groups.values():
                self._step([i for i, _ in members], [b for _, b in members], t, k)
                for i, _ in members:
                    clients[i].steps += 1
            t += 1

    def _enter(self, i: int, cid: int, request, round_index: int) -> _Client:
        """Client ``cid``'s start, as the sequential path's: downloaded weights, local layers, state, seed."""
        sim, algo, model = self.sim, self.sim.algo, self.sim.model
        ctx = sim.context(cid, round_index, "train")
        weights = sim.initial_weights if request.weights is None else request.weights
        enter_client(algo, model, ctx, weights, sim.initial_weights)
        with torch.no_grad():
            for name, tensor in self.tensors.items():
                self.stacked[name][i].copy_(tensor)
        wrapped = None
        if self.wraps_local_train:  # a BATCHING_WRAPPERS local_train: its block reads the batches once
            ctx.scratch[DEFER_TRAINING] = True
            wrapped = algo.local_train(ctx, model, request.payload)
            del ctx.scratch[DEFER_TRAINING]
        rng = _rng_state(sim.device)
        return _Client(ctx, iter(algo.training_batches(ctx)), rng, wrapped)

    def _step(self, members: list[int], batches: list[tuple], t: int, k: int) -> None:
        """One optimisation step of the clients ``members`` (one batch shape) on their stacked slices."""
        index = None if len(members) == k else torch.tensor(members, device=self.sim.device)

        def take(names):
            return {n: self.stacked[n] if index is None else self.stacked[n].index_select(0, index) for n in names}

        trainable, fixed, buffers = take(self.trainable), take(self.fixed), take(self.buffers)
        x = torch.stack([b[0] for b in batches])
        y = torch.stack([b[1] for b in batches])
        grads, losses = self._step_fn(trainable, fixed, buffers, x, y, self.global_weights)
        with torch.no_grad():
            self.optimizer.step(trainable, grads, index, t)
            if index is None:  # as the sequential path's float32 `total += loss`
                self.totals += losses.detach()
            else:
                summed = self.totals.index_select(0, index) + losses.detach()
                self.totals.index_copy_(0, index, summed.to(self.totals.dtype))
                for name, value in {**trainable, **buffers}.items():
                    self.stacked[name].index_copy_(0, index, value)

    def _leave(self, i: int, client: _Client) -> ClientUpdate:
        """Client ``i``'s trained weights back in the shared model, then the sequential path's ending."""
        sim, algo, model, ctx = self.sim, self.sim.algo, self.sim.model, client.ctx
        with torch.no_grad():
            for name, tensor in self.tensors.items():
                tensor.copy_(self.stacked[name][i])
        _set_rng_state(client.rng, sim.device)  # the client's stream, as after its last step
        result = finish_local_train(algo, ctx, model, float(self.totals[i]) / max(1, client.steps))
        if client.wrapped is not None:  # what the wrapper added, as on the sequential path
            result.metrics.update(client.wrapped.metrics)
            result.payload.update(client.wrapped.payload)
        return client_update(algo, model, ctx, result, sim.local_keys)

