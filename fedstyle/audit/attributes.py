"""Attribute inference from shared styles: linear probes that read the domain or the class mix.

A linear probe on standardised features is the standard way to ask "is attribute A linearly
decodable from representation R" (Alain & Bengio, ICLR'17 workshop, "Understanding intermediate
layers using linear classifier probes"); property inference from shared model information in
federated learning is Melis et al. (IEEE S&P'19, "Exploiting Unintended Feature Leakage in
Collaborative Learning"). The attacker trains the probe on styles computed from public data with
known attributes and applies it to the styles a client shared.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from fedstyle.errors import ConfigError

KINDS = ("classify", "regress")


@dataclass
class Probe:
    """A fitted linear probe: standardisation (mean, scale), weight (D, K), bias (K,).

    ``classes`` (classify): the target values seen in training, in the order of the logits.
    """

    kind: str
    mean: torch.Tensor
    scale: torch.Tensor
    weight: torch.Tensor
    bias: torch.Tensor
    classes: torch.Tensor | None = None

    def decision(self, features: torch.Tensor) -> torch.Tensor:
        """Logits (classify) or predicted targets (regress), (N, K)."""
        x = _features(features, "features")
        if x.shape[1] != self.mean.numel():
            raise ConfigError(f"features have width {x.shape[1]} but the probe was trained on width "
                              f"{self.mean.numel()}; compute them with the same statistic")
        x = (x.to(self.mean.device) - self.mean) / self.scale
        return x @ self.weight + self.bias

    def predict(self, features: torch.Tensor) -> torch.Tensor:
        """Class labels (N,) for classify (values of ``classes``); targets (N, K) for regress."""
        out = self.decision(features)
        if self.kind == "classify":
            return self.classes[out.argmax(1)]
        return out


def _features(x, what: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ConfigError(f"{what} must be an (N, D) tensor, got {shape}; flatten each style to one row")
    if x.shape[0] == 0 or x.shape[1] == 0:
        raise ConfigError(f"{what} is empty (shape {tuple(x.shape)}); pass at least one row with one feature")
    if not torch.isfinite(x).all():
        raise ConfigError(f"{what} contains NaN or inf; drop or repair those rows first")
    return x.detach().double()


def _targets(targets, n: int, kind: str) -> torch.Tensor:
    if kind not in KINDS:
        raise ConfigError(f"unknown probe kind {kind!r}; use one of {list(KINDS)}")
    t = torch.as_tensor(targets).detach()
    if t.shape[:1] != (n,):
        raise ConfigError(f"targets have shape {tuple(t.shape)} but there are {n} feature rows; pass one target per row")
    if kind == "classify":
        if t.dim() != 1 or t.is_floating_point() and not torch.equal(t, t.round()):
            raise ConfigError("classify targets must be (N,) integer labels; use kind='regress' for histograms")
        return t.long()
    t = t.double().reshape(n, -1)
    if not torch.isfinite(t).all():
        raise ConfigError("regress targets contain NaN or inf; repair them first")
    return t


def train_probe(features: torch.Tensor, targets, *, kind: str = "classify", l2: float = 1e-3, steps: int = 100,
                seed: int = 0) -> Probe:
    """A linear probe on features standardised with the training set's mean and std.

    classify: multinomial logistic regression (mean cross-entropy + l2/2 ||W||^2) fitted by full-batch
    L-BFGS with strong-Wolfe line search from zero weights, at most ``steps`` iterations, float64:
    deterministic (``seed`` is accepted for a uniform API but unused: nothing is random).
    Needs at least two classes. regress: closed-form ridge, W = (X'X + l2 N I)^-1 X'(Y - mean Y),
    bias = mean Y (unpenalised), for (N, K) targets such as class histograms.
    """
    x = _features(features, "features")
    t = _targets(targets, x.shape[0], kind)
    if not l2 >= 0:
        raise ConfigError(f"l2 must be >= 0, got {l2}")
    mean = x.mean(0)
    std = x.std(0, unbiased=False)
    scale = torch.where(std > 1e-12, std, torch.ones_like(std))
    z = (x - mean) / scale
    n, d = z.shape
    if kind == "regress":
        y_mean = t.to(z.device).mean(0)
        gram = z.T @ z + l2 * n * torch.eye(d, dtype=z.dtype, device=z.device)
        weight = torch.linalg.lstsq(gram, z.T @ (t.to(z.device) - y_mean)).solution
        return Probe(kind, mean, scale, weight, y_mean)
    classes, y = torch.unique(t.to(z.device), sorted=True, return_inverse=True)
    if classes.numel() < 2:
        raise ConfigError(f"classify targets hold a single class ({classes.tolist()}); the probe needs >= 2 classes")
    weight = torch.zeros(d, classes.numel(), dtype=z.dtype, device=z.device, requires_grad=True)
    bias = torch.zeros(classes.numel(), dtype=z.dtype, device=z.device, requires_grad=True)
    optimiser = torch.optim.LBFGS([weight, bias], lr=1.0, max_iter=max(int(steps), 1),
                                  line_search_fn="strong_wolfe", tolerance_grad=1e-9, tolerance_change=1e-12)

    def closure():
        optimiser.zero_grad()
        loss = F.cross_entropy(z @ weight + bias, y) + 0.5 * l2 * weight.pow(2).sum()
        loss.backward()
        return loss

    optimiser.step(closure)
    return Probe(kind, mean, scale, weight.detach(), bias.detach(), classes)


def _histograms(t: torch.Tensor) -> torch.Tensor:
    """Rows clipped at 0 and renormalised to sum 1 (an all-zero row becomes uniform)."""
    t = t.clamp_min(0)
    total = t.sum(1, keepdim=True)
    uniform = torch.full_like(t, 1.0 / t.shape[1])
    return torch.where(total > 0, t / total.clamp_min(1e-300), uniform)


def attribute_scores(probe: Probe, features: torch.Tensor, targets, kind: str | None = None) -> dict[str, float]:
    """How well the probe infers the attribute on held-out features, next to a chance level.

    classify: {"accuracy", "chance" = 1 / number of classes seen in training, "majority_rate" = the
    frequency of the most common class in ``targets`` (the best constant guess)}.
    regress (class mix, rows of histograms or counts): predictions clipped at 0 and renormalised;
    {"majority_class_accuracy": argmax predicted == argmax true, "majority_chance": the frequency
    of the most common true majority class (the best constant guess), both over the ``majority_rows``
    rows whose true histogram has a single largest class (a class-balanced sender has no majority
    class to read: NaN when no row has one), "tv_error": mean total variation 0.5 sum |p - t| between
    predicted and true histograms, "tv_error_uniform_guess": the same for the uniform histogram}.
    """
    kind = probe.kind if kind is None else kind
    if kind != probe.kind:
        raise ConfigError(f"the probe was trained for {probe.kind!r}, not {kind!r}; train one with kind={kind!r}")
    x = _features(features, "features")
    t = _targets(targets, x.shape[0], kind).to(probe.mean.device)
    if kind == "classify":
        predicted = probe.predict(x)
        return {"accuracy": float((predicted == t).double().mean()),
                "chance": 1.0 / probe.classes.numel(),
                "majority_rate": torch.unique(t, return_counts=True)[1].max().item() / t.numel()}
    if t.shape[1] != probe.weight.shape[1]:
        raise ConfigError(f"targets have {t.shape[1]} columns but the probe predicts {probe.weight.shape[1]}; "
                          "use histograms over the same classes")
    truth = _histograms(t)
    predicted = _histograms(probe.predict(x))
    uniform = torch.full_like(truth, 1.0 / truth.shape[1])
    true_major = truth.argmax(1)
    top = truth.topk(min(2, truth.shape[1]), dim=1).values
    defined = top[:, 0] > top[:, -1] + 1e-12 if truth.shape[1] > 1 else torch.ones_like(true_major, dtype=torch.bool)
    rows = int(defined.sum())
    hits = (predicted.argmax(1) == true_major)[defined]
    return {"majority_class_accuracy": float(hits.double().mean()) if rows else float("nan"),
            "majority_chance": (torch.unique(true_major[defined], return_counts=True)[1].max().item() / rows
                                if rows else float("nan")),
            "majority_rows": float(rows),
            "tv_error": float(0.5 * (predicted - truth).abs().sum(1).mean()),
            "tv_error_uniform_guess": float(0.5 * (uniform - truth).abs().sum(1).mean())}
