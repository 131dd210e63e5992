"""Measured quality of a feature-AdaIN backend (issue 3 criteria a and b; run by benchmarks/style_quality.py).

(a) Style moves: for content image c restyled to target style t, with S(x) = (mu, sigma) of the
    backend's encoder features at the AdaIN stage and
        d(x, t) = ||mu(x) - mu_t||_2 + ||sigma(x) - sigma_t||_2,
    the mean of d(output, t) over images must be at most half the mean of d(c, t). The output is the
    uint8 image the backend returns (resized back, quantised), re-encoded like any image.
(b) Content stays: a ConvNet trained on the original images keeps at least 80 % of its accuracy on
    test images restyled to another domain's overall style.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from fedstyle.data.contract import DomainDataset
from fedstyle.seeding import derive_seed
from fedstyle.style.transfer.base import Style, StyleTransfer


def style_distance(a: Style, b: Style) -> torch.Tensor:
    """d = ||mu_a - mu_b||_2 + ||sigma_a - sigma_b||_2 per row (b may hold one style for all rows)."""
    a.check_compatible(b)
    mean = (a.tensors["mean"] - b.tensors["mean"]).norm(dim=1)
    std = (a.tensors["std"] - b.tensors["std"]).norm(dim=1)
    return mean + std


def split_domains(dataset: DomainDataset, test_per_domain: int, seed: int) -> tuple[dict, dict]:
    """Per domain a seeded (train indices, test indices) split with ``test_per_domain`` test images."""
    train, test = {}, {}
    for domain in dataset.domains:
        order = torch.from_numpy(np.random.default_rng(derive_seed(seed, "quality-split", domain)).permutation(
            dataset.size(domain)))
        test[domain], train[domain] = order[:test_per_domain], order[test_per_domain:]
    return train, test


@dataclass
class StyleShift:
    """Criterion (a) for one kind of target style: mean distances to the target before and after transfer."""

    content_distance: float
    output_distance: float

    @property
    def ratio(self) -> float:
        return self.output_distance / self.content_distance


def measure_style_shift(
    backend: StyleTransfer, content: torch.Tensor, targets: Style, alpha: float = 1.0,
    content_style: Style | None = None,
) -> tuple[StyleShift, torch.Tensor]:
    """Criterion (a) for ``content`` restyled to ``targets`` (one per image, or one for all), and the output.

    ``content_style`` (the content's own image styles) may be given when it is already known.
    """
    output = backend.transfer(content, targets, alpha=alpha)
    before = style_distance(content_style if content_style is not None else backend.image_styles(content), targets)
    after = style_distance(backend.image_styles(output), targets)
    return StyleShift(before.mean().item(), after.mean().item()), output


def train_classifier(
    images: torch.Tensor, labels: torch.Tensor, epochs: int, seed: int, device: torch.device, batch_size: int = 64
) -> torch.nn.Module:
    """A ConvNet (fedstyle.models) trained with Adam on uint8 (N, 3, 32, 32) images (normalised: mean = std = 0.5)."""
    from fedstyle.models import build_model

    torch.manual_seed(derive_seed(seed, "quality-classifier"))
    model = build_model("convnet", int(labels.max()) + 1, images.shape[-1]).to(device).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(derive_seed(seed, "quality-batches"))
    for _ in range(epochs):
        order = torch.randperm(images.shape[0], generator=generator)
        for start in range(0, images.shape[0], batch_size):
            idx = order[start : start + batch_size]
            x = (images[idx].to(device).float() / 255.0 - 0.5) / 0.5
            loss = F.cross_entropy(model(x), labels[idx].to(device))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    return model.eval()


@torch.no_grad()
def accuracy(model: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor, device: torch.device) -> float:
    correct = 0
    for start in range(0, images.shape[0], 512):
        x = (images[start : start + 512].to(device).float() / 255.0 - 0.5) / 0.5
        correct += (model(x).argmax(1).cpu() == labels[start : start + 512]).sum().item()
    return correct / images.shape[0]


def measure_quality(
    backend: StyleTransfer,
    dataset: DomainDataset,
    test_per_domain: int = 200,
    epochs: int = 3,
    seed: int = 0,
    device: torch.device | str = "cpu",
    classifier: bool = True,
) -> dict:
    """Criteria (a) and (b) on ``dataset``: every domain's test images restyled to every other domain.

    Targets of (a): the other domain's overall style (CCST Eq. 8, from its training images), and a
    single-image style (a random training image of a random other domain per test image).
    """
    device = torch.device(device)
    train, test = split_domains(dataset, test_per_domain, seed)
    overall = {d: backend.dataset_style([dataset.images[d][train[d]]]) for d in dataset.domains}
    rng = np.random.default_rng(derive_seed(seed, "quality-targets"))
    rows, restyled, restyled_labels = [], [], []
    single_before, single_after = [], []
    for domain in dataset.domains:
        content = dataset.images[domain][test[domain]]
        labels = dataset.labels[domain][test[domain]]
        others = [d for d in dataset.domains if d != domain]
        content_style = backend.image_styles(content)  # once per domain, for every target style
        for other in others:
            shift, output = measure_style_shift(backend, content, overall[other], content_style=content_style)
            rows.append({"content": domain, "style": other, "before": shift.content_distance,
                         "after": shift.output_distance})
            restyled.append(output)
            restyled_labels.append(labels)
        # single-image styles: each test image gets a random training image of a random other domain
        pick_domain = rng.integers(len(others), size=content.shape[0])
        style_images = torch.stack([
            dataset.images[others[k]][train[others[k]][rng.integers(len(train[others[k]]))]] for k in pick_domain
        ])
        shift, _ = measure_style_shift(backend, content, backend.image_styles(style_images),
                                       content_style=content_style)
        single_before.append(shift.content_distance)
        single_after.append(shift.output_distance)
    result = {
        "pairs": rows,
        "overall": StyleShift(float(np.mean([r["before"] for r in rows])), float(np.mean([r["after"] for r in rows]))),
        "single": StyleShift(float(np.mean(single_before)), float(np.mean(single_after))),
    }
    if classifier:
        train_images = torch.cat([dataset.images[d][train[d]] for d in dataset.domains])
        train_labels = torch.cat([dataset.labels[d][train[d]] for d in dataset.domains])
        model = train_classifier(train_images, train_labels, epochs, seed, device)
        test_images = torch.cat([dataset.images[d][test[d]] for d in dataset.domains])
        test_labels = torch.cat([dataset.labels[d][test[d]] for d in dataset.domains])
        result["accuracy_original"] = accuracy(model, test_images, test_labels, device)
        for row, images, labels in zip(rows, restyled, restyled_labels):
            row["accuracy"] = accuracy(model, images, labels, device)
        # accuracy over all restyled images = correct counts of the pairs summed (no second pass)
        correct = sum(round(row["accuracy"] * len(labels)) for row, labels in zip(rows, restyled_labels))
        result["accuracy_restyled"] = correct / sum(len(labels) for labels in restyled_labels)
    return result
