"""Cross-client style augmentation, shared by CCST, PARDON and FedDG-FFT (and reusable by later methods).

The pieces of a setup-phase style exchange (CCST Section 3.2, Algorithm 1):

* :func:`client_style` — what a client uploads: J single-image styles of randomly drawn images
  (CCST Eq. 6, 7) or its overall style over all images (Eq. 8), or over a class-stratified sample
  of them (:func:`style_sample`, the approximation CCST Section 3.2 suggests);
* :class:`StyleBank` — the server's concatenation of every client's styles (Eq. 9, 10) with, per
  style, the client (= domain) it came from, as a payload;
* :class:`AugmentPlan` and :func:`plan_cross_client` — which content image and which bank style
  every output image uses (Algorithm 1: K distinct domains per image, own domain = original; or,
  ``keep_original="always"``, the original plus K distinct other domains).

Making the images (and caching the clients' styles) is :mod:`fedstyle.style.transfer.stylize`'s part.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch

from fedstyle.devices import resolve_device
from fedstyle.errors import ConfigError
from fedstyle.payload import Payload
from fedstyle.style.privacy import StylePrivacy
from fedstyle.style.transfer.base import (
    TRANSFER_BACKENDS,
    Style,
    StyleMismatchError,
    StyleTransfer,
    check_private_backend,
)

# ctx.state keys carrying the style computation's cost from setup_upload to setup_download
_STYLE_SECONDS, _STYLE_IMAGES, _STYLE_HIT = "setup/style_seconds", "setup/style_images", "setup/style_cache_hit"
_STYLE_COUNTS = "setup/style_count/"  # + a name: the computation's other numbers (PARDON's clusters)


def make_backend(name: str, device: torch.device | str, **options: Any) -> StyleTransfer:
    """The backend ``name`` built with ``device`` and the non-empty ``options`` (e.g. weight paths)."""
    kept = {k: v for k, v in options.items() if v not in ("", None)}
    return TRANSFER_BACKENDS.get(name)(device=device, **kept)


def resolve_style_device(name: str, run_device: torch.device) -> torch.device:
    """``auto`` = the run's device; otherwise the named device (checked like ``--device``)."""
    if name == "auto":
        return run_device
    return resolve_device(name)


def tensor_digest(*tensors: torch.Tensor, extra: str = "") -> str:
    """SHA-256 over the shapes, dtypes and bytes of ``tensors`` (and ``extra``)."""
    digest = hashlib.sha256(extra.encode())
    for t in tensors:
        t = t.detach().to("cpu").contiguous()
        digest.update(f"{tuple(t.shape)}{t.dtype}".encode())
        digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return digest.hexdigest()


def weights_fingerprint(backend: StyleTransfer) -> str:
    """Digest of every network the backend holds (encoder and decoder weights), '' when it has none."""
    cached = getattr(backend, "_fedstyle_weights_fingerprint", None)
    if cached is None:
        modules = {k: v for k, v in vars(backend).items() if isinstance(v, torch.nn.Module)}
        tensors, names = [], []
        for attr, module in sorted(modules.items(), key=lambda item: item[0]):
            for name, value in sorted(module.state_dict().items()):
                names.append(f"{attr}.{name}")
                tensors.append(value)
        cached = tensor_digest(*tensors, extra="|".join(names)) if tensors else ""
        backend._fedstyle_weights_fingerprint = cached
    return cached


# -- the client's style ---------------------------------------------------------------------------
def client_style(
    backend: StyleTransfer, images: torch.Tensor, *, style_type: str, count: int, seed: int, batch_size: int,
    progress: Callable[[int], None] | None = None, privacy: StylePrivacy | None = None,
    noise: torch.Generator | None = None,
) -> tuple[Style, int]:
    """A client's style upload and how many images it was computed from.

    ``single``: the styles of ``count`` images drawn without replacement with ``seed`` (all of them
    if ``count`` exceeds the data); ``overall``: the backend's dataset style over every image (pass a
    :func:`style_sample` of them to approximate it). ``progress(n)`` is called after each batch.
    ``privacy`` (enabled): released clipped and noised, the noise drawn from ``noise``
    (:mod:`fedstyle.style.privacy`; backends with ``supports_privacy`` only).
    """
    n = int(images.shape[0])
    if n == 0:
        raise StyleMismatchError("a client with no images has no style; choose a partition that leaves no client empty")
    private = privacy is not None and privacy.enabled
    if private:
        check_private_backend(backend)
    tick = progress or (lambda _: None)

    def counted(batch: torch.Tensor) -> torch.Tensor:
        tick(len(batch))
        return batch

    if style_type == "overall":
        batches = (counted(images[s : s + batch_size]) for s in range(0, n, batch_size))
        if private:
            return backend.dataset_style(batches, privacy=privacy, generator=noise), n
        return backend.dataset_style(batches), n
    if style_type != "single":
        raise ConfigError(f"style type {style_type!r} is not single or overall")
    count = min(int(count), n)
    chosen = torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:count].sort().values
    parts = [backend.image_styles(counted(images[chosen[s : s + batch_size]])) for s in range(0, count, batch_size)]
    style = Style.concat(parts)
    return (backend.private_styles(style, privacy, noise) if private else style), count


def style_sample(labels: torch.Tensor, count: int, seed: int) -> torch.Tensor | None:
    """Sorted rows of a class-stratified random sample of ``count`` images, or None for all of them
    (``count`` 0 or at least the number of images).

    CCST Section 3.2 ("Computation and communication trade-off"): "choosing a relatively large portion
    of images from each class to approximate the overall domain style". Class c gets ``count * n_c /
    n`` rows rounded by largest remainder (ties to the smaller class id), so the sample keeps the
    client's class mix; the rows of each class are drawn without replacement with ``seed``.
    """
    labels = labels.detach().to("cpu", torch.long).reshape(-1)
    n = len(labels)
    if count <= 0 or count >= n:
        return None
    classes, sizes = torch.unique(labels, return_counts=True)
    exact = sizes.to(torch.float64) * count / n
    quota = exact.floor().long()
    short = count - int(quota.sum())
    if short:  # largest remainders first; a stable sort keeps ties in class order
        order = torch.sort(exact - quota, descending=True, stable=True).indices
        quota[order[:short]] += 1
    g = torch.Generator().manual_seed(seed)
    picks = []
    for c, q in zip(classes.tolist(), quota.tolist()):
        members = (labels == c).nonzero().flatten()
        picks.append(members[torch.randperm(len(members), generator=g)[:q]])
    return torch.cat(picks).sort().values


def record_style_cost(state: dict[str, torch.Tensor], seconds: float, images: int, cached: bool = False,
                      counts: Mapping[str, float] | None = None) -> None:
    """Keep the style computation's time and image count until :func:`pop_style_cost` (setup_download);
    ``cached``: the style came from the cache (a hit is counted; no time, so no rate). ``counts``: other
    numbers of the computation, reported as ``style_<name>`` (PARDON's ``clusters``)."""
    state[_STYLE_IMAGES] = torch.tensor(float(images), dtype=torch.float64)
    if cached:
        state[_STYLE_HIT] = torch.tensor(1.0, dtype=torch.float64)
    else:
        state[_STYLE_SECONDS] = torch.tensor(float(seconds), dtype=torch.float64)
    for name, value in (counts or {}).items():
        state[_STYLE_COUNTS + name] = torch.tensor(float(value), dtype=torch.float64)


def pop_style_cost(state: dict[str, torch.Tensor]) -> dict[str, float]:
    """``{"style_images", "style_seconds"}`` recorded at upload, or ``{"style_images", "style_cache_hits": 1}``
    when the style came from the cache, then the ``style_<name>`` counts (removed from the client state);
    {} when nothing was recorded."""
    if _STYLE_IMAGES not in state:
        return {}
    out = {"style_images": float(state.pop(_STYLE_IMAGES))}
    if _STYLE_HIT in state:
        out["style_cache_hits"] = float(state.pop(_STYLE_HIT))
    else:
        out["style_seconds"] = float(state.pop(_STYLE_SECONDS))
    for key in [k for k in state if k.startswith(_STYLE_COUNTS)]:
        out["style_" + key[len(_STYLE_COUNTS):]] = float(state.pop(key))
    return out


# -- the server's bank ----------------------------------------------------------------------------
@dataclass
class StyleBank:
    """Every client's styles concatenated (CCST Eq. 9, 10); ``owner[i]`` is the client of style i.

    Rows are grouped by client in increasing client id, so client c's styles are one contiguous block.
    """

    style: Style
    owner: torch.Tensor

    @classmethod
    def from_uploads(cls, uploads: Mapping[int, Payload], prefix: str = "style") -> "StyleBank":
        """Concatenate the clients' style payloads; refuses an empty bank and mixed backends or encoders."""
        ids = sorted(uploads)
        styles = [Style.from_payload(uploads[c], prefix) for c in ids]
        style = Style.concat(styles)  # raises StyleMismatchError for none / empty / mixed origins
        owner = torch.cat([torch.full((len(s),), c, dtype=torch.long) for c, s in zip(ids, styles)])
        return cls(style, owner)

    def to_payload(self, prefix: str = "bank") -> Payload:
        payload = self.style.to_payload(prefix)
        payload[f"{prefix}/owner"] = self.owner
        return payload

    @classmethod
    def from_payload(cls, payload: Payload, prefix: str = "bank") -> "StyleBank":
        style = Style.from_payload(payload, prefix)
        owner = payload.get(f"{prefix}/owner")
        if not style.tensors or len(style) == 0 or not isinstance(owner, torch.Tensor) or len(owner) == 0:
            raise StyleMismatchError("the broadcast style bank is empty: no client contributed a style")
        owner = owner.to("cpu", torch.long)
        if len(owner) != len(style) or bool((owner[1:] < owner[:-1]).any()):
            raise StyleMismatchError("the style bank's owner list does not match its styles (rows grouped by client)")
        return cls(style, owner)

    def __len__(self) -> int:
        return len(self.style)

    def domains(self) -> list[int]:
        return sorted(set(self.owner.tolist()))

    def blocks(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(domain ids, first row, row count) of each client's block."""
        ids, counts = torch.unique_consecutive(self.owner, return_counts=True)
        first = torch.cumsum(counts, 0) - counts
        return ids, first, counts

    def digest(self) -> str:
        names = sorted(self.style.tensors)
        return tensor_digest(self.owner, *(self.style.tensors[k] for k in names),
                             extra=f"{self.style.backend}|{self.style.encoder}|{names}")


# -- what to generate -----------------------------------------------------------------------------
@dataclass
class AugmentPlan:
    """Output image m is content image ``source[m]`` restyled to bank row ``style_row[m]``
    (``-1``: the original image), with interpolation ``ratio[m]`` (None: the method's alpha)."""

    source: torch.Tensor
    style_row: torch.Tensor
    ratio: torch.Tensor | None = None

    def __len__(self) -> int:
        return int(self.source.shape[0])

    def digest(self) -> str:
        parts = [self.source, self.style_row] + ([self.ratio] if self.ratio is not None else [])
        return tensor_digest(*parts)


#: :func:`plan_cross_client`'s rules for the original image (CCST's ``keep_original``)
KEEP_ORIGINAL = ("own_domain", "always")


def plan_cross_client(num_images: int, bank: StyleBank, own: int, k: int, seed: int, per_batch: int = 0,
                      keep_original: str = "own_domain") -> AugmentPlan:
    """Which style every output image of client ``own`` gets (CCST Section 3.2.3).

    ``keep_original="own_domain"`` — CCST Algorithm 1, the paper's: K distinct bank domains per
    image, drawn uniformly without replacement; the own domain keeps the original, another domain
    gives a style drawn uniformly from that domain's block (its overall style when the block has one
    row). d x K outputs; the original is among them only when the own domain is drawn (probability
    K / N for N domains: always when K = N, as in the paper's experiments with one client per domain).

    ``keep_original="always"``: every image's original, then K distinct domains drawn the same way
    among the *other* domains of the bank (K <= N - 1), each a restyled copy: d x (K + 1) outputs.
    At K = N - 1 it holds the same images as Algorithm 1 at K = N.

    ``per_batch > 0`` (the public code): the style of a domain is drawn once per run of
    ``per_batch`` consecutive images instead of once per image. Outputs are image-major:
    output ``i * k + j`` is image i's j-th draw (``always``: ``i * (k + 1)`` is image i's original,
    ``i * (k + 1) + 1 + j`` its j-th draw).
    """
    if keep_original not in KEEP_ORIGINAL:
        raise ConfigError(f"keep_original={keep_original!r} is not one of {', '.join(KEEP_ORIGINAL)}")
    ids, first, counts = bank.blocks()
    n = len(ids)
    always = keep_original == "always"
    # positions into ids that may be drawn: every domain (Algorithm 1) or every domain but the own one
    drawable = (ids != own).nonzero().flatten() if always else torch.arange(n)
    if k > len(drawable):
        if always:
            raise ConfigError(
                f"k={k} restyled copies per image from other clients' styles, but the style bank holds only "
                f"{len(drawable)} domains besides client {own}'s (clients {ids.tolist()}); choose k <= "
                f"{len(drawable)} (keep_original=always draws the K domains without replacement among the others)"
            )
        raise ConfigError(
            f"k={k} styles per image, but the style bank holds only {n} domains (clients {ids.tolist()}); "
            f"choose k <= {n} (Algorithm 1 draws the K domains without replacement)"
        )
    g = torch.Generator().manual_seed(seed)
    # positions into ids, distinct per row
    picks = drawable[torch.rand(num_images, len(drawable), generator=g).argsort(dim=1)[:, :k]]
    if per_batch > 0:
        u = torch.rand(math.ceil(num_images / per_batch), n, generator=g)
        u = u[torch.arange(num_images) // per_batch].gather(1, picks)
    else:
        u = torch.rand(num_images, k, generator=g)
    rows = first[picks] + (u * counts[picks]).long().clamp_max(counts[picks] - 1)
    rows = torch.where(ids[picks] == own, torch.full_like(rows, -1), rows)  # Algorithm 1 line 5; never under always
    if always:
        rows = torch.cat([torch.full((num_images, 1), -1, dtype=rows.dtype), rows], dim=1)
    per_image = rows.shape[1]
    return AugmentPlan(torch.arange(num_images).repeat_interleave(per_image), rows.reshape(-1))
