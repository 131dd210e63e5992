"""FedOMG: on-server gradient matching (Nguyen, Nguyen, Park, Pham, Hwang, ICLR'25; arXiv 2501.14653).

The server treats each client's update Delta_i = w_i - w^r as its domain's gradient and looks for the
direction whose *least* inner product with them is largest (gradient matching, the invariant gradient
direction), within a ball around the federated update g_FL so that it still descends the average loss:

    max_d  min_i <Delta_i, d>     subject to  ||d - g_FL|| <= kappa ||g_FL||

Its Lagrangian dual (the CAGrad form, Liu et al. NeurIPS'21) is a problem over the simplex of the round's
S clients, solved on their S x S Gram matrix — no extra communication, the clients send what FedAvg sends:

    Gamma* = argmin_{Gamma in simplex}  Gamma^T G^T g_FL + kappa ||g_FL|| ||G Gamma||,    G = [Delta_1 .. Delta_S]
    d      = g_FL + kappa ||g_FL|| G Gamma* / ||G Gamma*||
    w^{r+1} = w^r + eta d                                                     (eta = ``lr``)

Hyperparameters, results, privacy, parity and the paper-versus-code analysis: docs/methods/fedomg.md.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from fedstyle.algorithms.base import Algorithm, apply_reference_code
from fedstyle.algorithms.hparams import HParam
from fedstyle.algorithms.registry import register_method
from fedstyle.algorithms.server_opt import SERVER_OPTS, ServerOptimizer

#: reference_code=true: the DG code's values, for the options not given explicitly
REFERENCE = {"lr": 0.5, "steps": 20, "rescale": True}
_CHUNK = 1 << 20  # elements per block of the Gram pass (bounds its float64 memory)


def gram(base, weights, aggregated, keys) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(M, b, c) in float64 on the CPU: M_ij = <Delta_i, Delta_j>, b_i = <Delta_i, g_FL>, c = ||g_FL||^2 over
    ``keys``, with Delta_i = weights[i] - base and g_FL = aggregated - base, one block of a tensor at a time."""
    S = len(weights)
    M, b, c = (torch.zeros(shape, dtype=torch.float64) for shape in ((S, S), (S,), ()))
    for key in keys:
        w0 = base[key].reshape(-1)
        work = w0.device if w0.device.type != "mps" else torch.device("cpu")  # MPS has no float64
        for start in range(0, w0.numel(), _CHUNK):
            block = slice(start, start + _CHUNK)
            ref = w0[block].to(work, torch.float64)
            deltas = torch.stack([w[key].reshape(-1)[block].to(work, torch.float64) for w in weights]) - ref
            g = aggregated[key].reshape(-1)[block].to(work, torch.float64) - ref
            M += (deltas @ deltas.T).cpu()
            b += (deltas @ g).cpu()
            c += (g @ g).cpu()
    return M, b, c


def project_simplex(v: np.ndarray) -> np.ndarray:
    """Euclidean projection onto {x >= 0, sum x = 1} (sort-based; Duchi et al., ICML'08, Fig. 1)."""
    u = np.sort(v)[::-1]
    cumulative = np.cumsum(u) - 1.0
    rho = int(np.nonzero(u - cumulative / np.arange(1, len(v) + 1) > 0)[0].max())
    return np.maximum(v - cumulative[rho] / (rho + 1), 0.0)


def solve_dual(M: torch.Tensor, b: torch.Tensor, radius: float, steps: int) -> torch.Tensor:
    """argmin over the simplex of Gamma.b + radius sqrt(Gamma^T M Gamma) (radius = kappa ||g_FL||), by projected
    gradient descent with backtracking from the uniform Gamma (docs/methods/fedomg.md)."""
    M, b = M.numpy(), b.numpy()
    S = len(b)
    gamma = np.full(S, 1.0 / S)
    scale = float(np.sqrt(np.clip(np.diag(M), 0, None)).mean())
    if S == 1 or scale == 0.0:
        return torch.from_numpy(gamma)
    M, b, radius = M / scale**2, b / scale**2, radius / scale

    def value(x):
        return float(x @ b) + radius * math.sqrt(max(float(x @ M @ x), 0.0))

    def slope(x):
        norm = math.sqrt(max(float(x @ M @ x), 0.0))
        return b + radius * (M @ x) / norm if norm > 1e-12 else b

    step, current = 1.0, value(gamma)
    for _ in range(steps):
        grad = slope(gamma)
        while True:  # backtracking: the quadratic upper bound must hold at the candidate
            candidate = project_simplex(gamma - step * grad)
            move = candidate - gamma
            new = value(candidate)
            if new <= current + float(grad @ move) + float(move @ move) / (2 * step) + 1e-15 or step < 1e-12:
                break
            step /= 2
        if float(np.abs(move).max()) < 1e-13:
            break
        gamma, current, step = candidate, new, step * 2
    return torch.from_numpy(gamma)


def solve_dual_reference(M: torch.Tensor, kappa: float, steps: int) -> tuple[torch.Tensor, float]:
    """The code's solve on the columns' Gram ``M`` (fed_merge.py:88-122): the softmax weights and lambda. Its
    SGD (momentum 0.5, no dampening) written out: torch.optim's first use costs seconds of imports."""
    S = M.shape[0]
    scale = (M.diagonal() + 1e-4).sqrt().mean()
    GG = M / scale**2
    Gg = GG.mean(1, keepdim=True)
    c = (Gg.mean() + 1e-4).sqrt() * kappa
    lr = 50.0 if S == 50 else 25.0
    logits = torch.zeros(S, 1, dtype=torch.float64, requires_grad=True)
    best, best_logits, velocity = math.inf, logits.detach().clone(), None
    for i in range(steps + 1):
        ww = torch.softmax(logits, 0)
        objective = (ww.T @ Gg + c * (ww.T @ GG @ ww + 1e-4).sqrt()).squeeze()
        if float(objective.detach()) < best:
            best, best_logits = float(objective.detach()), logits.detach().clone()
        if i < steps:
            (grad,) = torch.autograd.grad(objective, logits)
            velocity = grad if velocity is None else 0.5 * velocity + grad
            logits = (logits.detach() - lr * velocity).requires_grad_(True)
    ww = torch.softmax(best_logits, 0).reshape(-1)
    return ww, float(c / ((ww @ GG @ ww + 1e-4).sqrt() + 1e-4))


@SERVER_OPTS.register("omg")
class OMG(ServerOptimizer):
    """FedOMG's on-server gradient matching after any method's aggregation (docs/methods/fedomg.md)."""

    name = "omg"
    label = "OMG"
    HPARAMS = (
        HParam("kappa", 0.5, "radius of the search ball around the method's update, in units of its norm", low=0.0),
        HParam("lr", 1.0, "server learning rate eta: w <- w + eta d", low=0.0),
        HParam("steps", 500, "iterations of the dual solve over the simplex", low=1),
        HParam("rescale", False, "divide d by 1 + kappa^2 (the code; CAGrad's rescale=1)"),
        HParam("reference_code", False, "the authors' DG code: weighted columns, its SGD solve and epsilons, eta 0.5, "
               "d / (1 + kappa^2), buffers never aggregated"),
    )

    def __init__(self, options):
        super().__init__(options)
        apply_reference_code(self.hp, options, REFERENCE)

    def step(self, server, updates, aggregated, keys, uniform):
        kappa, reference = self.hp["kappa"], self.hp["reference_code"]
        keys = [k for k in keys if server.weights[k].is_floating_point()]
        M, b, c = gram(server.weights, [u.weights for u in updates], aggregated, keys)
        S = len(updates)
        if reference:  # columns p_i Delta_i, g_FL their plain mean: d = sum_i p_i (1/S + lambda Gamma_i) Delta_i
            sizes = torch.tensor([1.0 if uniform else float(u.num_samples) for u in updates], dtype=torch.float64)
            p = sizes / sizes.sum()
            gamma, lam = solve_dual_reference(p[:, None] * M * p[None, :], kappa, self.hp["steps"])
            alpha, beta = 0.0, p * (1.0 / S + lam * gamma)
        else:  # d = g_FL + kappa ||g_FL|| G Gamma / ||G Gamma||
            gamma = solve_dual(M, b, kappa * math.sqrt(float(c)), self.hp["steps"])
            norm = math.sqrt(max(float(gamma @ M @ gamma), 0.0))
            coef = kappa * math.sqrt(float(c)) / norm if kappa > 0 and norm > 0 else 0.0
            alpha, beta = 1.0, coef * gamma
        if self.hp["rescale"]:
            alpha, beta = alpha / (1 + kappa**2), beta / (1 + kappa**2)
        self._log(server, M, b, c, alpha, beta, gamma)
        eta = self.hp["lr"]
        out = dict(aggregated) if not reference else {k: v for k, v in server.weights.items()}
        for key in keys:  # w^r + eta (alpha g_FL + sum_i beta_i Delta_i), in float64
            base = server.weights[key].to(torch.float64)
            d = alpha * (aggregated[key].to(torch.float64) - base)
            for coef_i, u in zip(beta.tolist(), updates):
                d += coef_i * (u.weights[key].to(torch.float64) - base)
            out[key] = (base + eta * d).to(server.weights[key].dtype)
        return out

    @staticmethod
    def _log(server, M, b, c, alpha, beta, gamma) -> None:
        """What the step did, from the Gram matrix: d = alpha g_FL + G beta."""
        inner = alpha * b + M @ beta  # <Delta_i, d>
        d_sq = alpha**2 * float(c) + 2 * alpha * float(beta @ b) + float(beta @ M @ beta)
        client_norms = M.diagonal().clamp_min(0).sqrt()
        if float(c) <= 0 or d_sq <= 0 or bool((client_norms == 0).any()):
            return
        d_norm, fl_norm = math.sqrt(d_sq), math.sqrt(float(c))
        server.metrics.update(
            omg_step_ratio=d_norm / fl_norm,
            omg_cos_method=(alpha * float(c) + float(beta @ b)) / (d_norm * fl_norm),
            omg_min_cos_method=float((b / (client_norms * fl_norm)).min()),
            omg_min_cos=float((inner / (client_norms * d_norm)).min()),
            omg_gamma_max=float(gamma.max()))


@register_method
class FedOMG(Algorithm):
    """FedAvg's clients with the ``omg`` server optimiser (docs/methods/fedomg.md)."""

    name = "fedomg"
    label = "FedOMG"
    summary = ("FedAvg's clients; the server moves along the direction that maximises the least inner product with "
               "the clients' updates within a ball around their average (on-server gradient matching, no extra "
               "communication); as server_opt=omg it composes with every star method")
    paper = ("Nguyen, Nguyen, Park, Pham, Hwang, Federated domain generalization with data-free on-server gradient "
             "matching, ICLR 2025")
    DEFAULTS = {"server_opt": "omg"}
