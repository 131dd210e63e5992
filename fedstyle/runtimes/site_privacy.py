"""What a deployed site does to keep its style releases private (docs/privacy.md), whatever the coordinator asks.

Three things, all on the site, none of which the coordinator can change or roll back:

* **The operator's floor** (:func:`apply_floor`): the node config's ``dp-min-noise`` and ``dp-max-clip``
  (:class:`~fedstyle.runtimes.flower.node_config.SitePrivacy`) raise the run's noise multiplier to at
  least z_min and lower its clip to at most C_max before the site builds the run: z = max(z_run, z_min),
  C = min(C_run, C_max) (C_run = 0, no clipping, counts as infinite).
* **One answer per question** (:class:`SiteReleases`): a defended release is kept on the site, keyed by
  (run, client, round, release name, digest of what the message sent: weights and payload). The same
  question again (a repeated query, a resumed coordinator redoing a round, a restarted site) gets the
  same release, bit for bit, not a fresh noisy copy to average.
* **An append-only ledger and a budget** (:class:`ReleaseLedger`): one JSON line per new release,
  appended with ``O_APPEND`` and fsynced, under an exclusive ``flock``, in ``<state dir>/privacy/``,
  beside (never inside) the per-run folders that :meth:`~fedstyle.runtimes.site_state.ClientStateStore.prune`
  rolls back on a resume. The site's eps is the composition of every release in its client's ledger,
  over all runs: Gaussian mechanisms at noise multipliers z_i compose exactly to one at
  z = (sum_i z_i^-2)^(-1/2) (Gaussian DP, Dong, Roth & Su JRSS-B'22, Cor. 3.3), whose eps at delta is
  :func:`~fedstyle.style.privacy.gaussian_epsilon`. A release that would take it past ``dp-max-epsilon``
  is refused in one line (:class:`PrivacyBudgetError`).

The algorithms stay written once: they make a release through ``ClientContext.release`` (which calls
``make()`` directly in a simulation) and the site's runtime sets ``ctx.release_keeper`` to a
:class:`SiteReleases`.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import torch

from fedstyle.errors import ConfigError, FedstyleError
from fedstyle.io import atomic_write
from fedstyle.payload import Payload
from fedstyle.style.privacy import StylePrivacy, gaussian_epsilon

#: the ledgers' folder inside a site's state folder (the per-run folders are ``run-*``: no resume touches it)
PRIVACY_DIR = "privacy"
LEDGER_NAME = "ledger.jsonl"
RELEASES_DIR = "releases"
_META_KEY = "fedstyle.release"


class PrivacyBudgetError(FedstyleError):
    """A new release would take the site past its privacy budget (node config ``dp-max-epsilon``)."""


class LedgerError(FedstyleError):
    """A kept release the ledger names cannot be read back as it was recorded."""


# -- the operator's floor -------------------------------------------------------------------------
def apply_floor(config, floor) -> tuple[Any, dict[str, float]]:
    """``config`` with the style defence at least as strong as the site's ``floor``
    (:class:`~fedstyle.runtimes.flower.node_config.SitePrivacy`); and what the coordinator asked, for the
    ledger (``{"noise": z_run, "clip": C_run}``, empty for a method without the defence). A method without
    the dp_* hyperparameters is returned as it is (its payloads are outside the defence: docs/privacy.md)."""
    from fedstyle.algorithms import METHODS

    names = {h.name for h in METHODS.get(config.method).HPARAMS}
    if not {"dp_noise", "dp_clip"} <= names:
        return config, {}
    hp = dict(config.hparams)
    asked_noise, asked_clip = float(hp.get("dp_noise", 0.0)), float(hp.get("dp_clip", 0.0))
    asked = {"noise": asked_noise, "clip": asked_clip}
    if not floor.floor_set:
        return config, asked
    noise = max(asked_noise, floor.min_noise)
    clip = asked_clip
    if floor.max_clip > 0:
        clip = floor.max_clip if asked_clip == 0 else min(asked_clip, floor.max_clip)  # 0 = no clipping = infinite
    if noise > 0 and clip == 0:
        raise ConfigError(f"this site's dp-min-noise={floor.min_noise:g} needs a clip, and the run sets none "
                          "(dp_clip=0): add dp-max-clip=C to the site's node config")
    if (noise, clip) == (asked_noise, asked_clip):
        return config, asked
    return config.updated(hparams={**hp, "dp_noise": noise, "dp_clip": clip}), asked


# -- digests ----------------------------------------------------------------------------------------
def tensors_digest(*mappings: Mapping[str, Any]) -> str:
    """sha256 over the keys, dtypes, shapes and bytes of the tensors (and the repr of the scalars) of
    ``mappings``, in key order: what a message sent, whatever device it was loaded on."""
    h = hashlib.sha256()
    for mapping in mappings:
        h.update(b"\x00mapping")
        for key in sorted(mapping):
            value = mapping[key]
            h.update(key.encode() + b"\x00")
            if isinstance(value, torch.Tensor):
                plain = value.detach().to("cpu").contiguous()
                h.update(f"{plain.dtype}{tuple(plain.shape)}".encode())
                h.update(plain.reshape(-1).view(torch.uint8).numpy().tobytes())
            else:
                h.update(repr(value).encode())
    return h.hexdigest()


# -- the ledger -------------------------------------------------------------------------------------
def composed_noise(noises: list[float]) -> float:
    """The one Gaussian mechanism that releases at noise multipliers ``noises`` compose to (exactly: GDP,
    mu = 1 / z adds in quadrature): (sum z_i^-2)^(-1/2); 0 when any z_i is 0 (no noise: no guarantee),
    inf for no release."""
    if not noises:
        return math.inf
    if any(z <= 0 for z in noises):
        return 0.0
    return 1.0 / math.sqrt(sum(1.0 / (z * z) for z in noises))


def ledger_epsilon(noises: list[float], delta: float) -> float:
    """eps at ``delta`` of releases at noise multipliers ``noises`` (0 for none; inf when one had no noise)."""
    if not noises:
        return 0.0
    z = composed_noise(noises)
    return math.inf if z == 0 else gaussian_epsilon(z, delta)


@dataclass(frozen=True)
class LedgerEntry:
    """One release as the ledger records it (a JSON line)."""

    key: str
    run: str
    client: int
    round: int
    name: str
    inputs: str
    noise: float
    clip: float
    delta: float
    source: str
    asked: dict
    file: str
    sha256: str
    time: float

    @classmethod
    def from_json(cls, line: str) -> "LedgerEntry":
        data = json.loads(line)
        return cls(**{k: data[k] for k in cls.__dataclass_fields__})


class ReleaseLedger:
    """A client's releases on this site: ``<state root>/privacy/client-<K>/ledger.jsonl`` (append-only,
    one JSON line per release) and the releases themselves, ``releases/<key>.safetensors``."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self.path = self.folder / LEDGER_NAME

    @classmethod
    def open(cls, state_root: str | Path, client_id: int) -> "ReleaseLedger":
        return cls(Path(state_root) / PRIVACY_DIR / f"client-{int(client_id)}")

    # -- reading ----------------------------------------------------------------------------------
    def entries(self, run: str | None = None) -> list[LedgerEntry]:
        """Every release of the client, in the order made (``run``: only that run's, a
        :func:`~fedstyle.runtimes.site_state.run_key`). A torn last line (a crash mid-append) is skipped."""
        if not self.path.is_file():
            return []
        found = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                entry = LedgerEntry.from_json(line)
            except (ValueError, KeyError, TypeError):
                continue  # only a crash between write and fsync leaves one: that release was never sent
            if run is None or entry.run == run:
                found.append(entry)
        return found

    def find(self, key: str) -> LedgerEntry | None:
        return next((e for e in self.entries() if e.key == key), None)

    def epsilon(self, delta: float, run: str | None = None) -> float:
        """eps at ``delta`` of the releases in the ledger (:func:`ledger_epsilon`; ``run``: that run's only)."""
        return ledger_epsilon([e.noise for e in self.entries(run)], delta)

    def load(self, entry: LedgerEntry) -> Payload:
        """The release ``entry`` recorded, as it was sent (its bytes checked against the ledger)."""
        from safetensors.torch import load_file

        path = self.folder / entry.file
        try:
            tensors = load_file(str(path))
            from safetensors import safe_open

            with safe_open(str(path), framework="pt") as handle:
                scalars = json.loads((handle.metadata() or {}).get(_META_KEY, "{}"))
        except Exception as err:
            raise LedgerError(f"the release ledger {self.path} names {path}, which cannot be read ({err}); "
                                     "the site will not release this again with fresh noise: restore the file, or "
                                     "move the ledger away knowingly") from None
        payload: Payload = {**tensors, **scalars}
        if tensors_digest(payload) != entry.sha256:
            raise LedgerError(f"{path} differs from what the ledger {self.path} recorded; restore it, or move "
                                     "the ledger away knowingly")
        return payload

    # -- writing ----------------------------------------------------------------------------------
    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """An exclusive ``flock`` on the ledger (blocking): one release decision at a time on the site."""
        self.folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.folder / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def append(self, entry: LedgerEntry, payload: Payload) -> None:
        """Write the release (atomically), then its ledger line (one ``O_APPEND`` write, fsynced)."""
        from safetensors.torch import save_file

        tensors = {k: v.detach().to("cpu").contiguous().clone() for k, v in payload.items()
                   if isinstance(v, torch.Tensor)}
        scalars = {k: v for k, v in payload.items() if not isinstance(v, torch.Tensor)}
        atomic_write(self.folder / entry.file,
                     lambda tmp: save_file(tensors, str(tmp), metadata={_META_KEY: json.dumps(scalars)}))
        line = (json.dumps(entry.__dict__, sort_keys=True) + "\n").encode("utf-8")
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":  # a torn last line: never glue this one to it
                line = b"\n" + line
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)


# -- the keeper a site hands its algorithm -------------------------------------------------------------
class SiteReleases:
    """``ClientContext.release_keeper`` on a deployed site, for one message: the run, the client, the round
    and ``inputs`` (a callable returning the digest of what the message sent, computed only when a defended
    release is made)."""

    def __init__(self, ledger: ReleaseLedger, *, run: str, client: int, round_index: int,
                 inputs: Callable[[], str], floor, asked: Mapping[str, float] | None = None,
                 log: Callable[[str], None] | None = None):
        self.ledger, self.run, self.client, self.round = ledger, run, int(client), int(round_index)
        self.inputs, self.floor, self.asked = inputs, floor, dict(asked or {})
        self.log = log or (lambda text: None)

    def key(self, name: str, inputs: str) -> str:
        ident = json.dumps([self.run, self.client, self.round, name, inputs])
        return hashlib.sha256(ident.encode()).hexdigest()[:32]

    def release(self, name: str, privacy: StylePrivacy, make: Callable[[], Payload]) -> Payload:
        """The release ``name`` of this message: the kept one when this question was answered before, else
        ``make()``'s, recorded in the ledger (refused when it would exceed the site's budget)."""
        inputs = self.inputs()
        key = self.key(name, inputs)
        with self.ledger.locked():
            kept = self.ledger.find(key)
            if kept is not None:
                self.log(f"fedstyle: client {self.client} round {self.round} {name}: the same question again; "
                         f"replayed release {kept.sha256[:12]} (ledger {self.ledger.path}, no new release)")
                return self.ledger.load(kept)
            self.check_budget(privacy)
            payload = make()
            entry = LedgerEntry(key=key, run=self.run, client=self.client, round=self.round, name=name, inputs=inputs,
                                noise=float(privacy.noise), clip=float(privacy.clip), delta=float(privacy.delta),
                                source=privacy.source, asked=self.asked, file=f"{RELEASES_DIR}/{key}.safetensors",
                                sha256=tensors_digest(payload), time=time.time())
            self.ledger.append(entry, payload)
        return payload

    def check_budget(self, privacy: StylePrivacy) -> None:
        budget = self.floor.max_epsilon
        if math.isinf(budget):
            return
        made = [e.noise for e in self.ledger.entries()]
        eps = ledger_epsilon(made + [float(privacy.noise)], self.floor.budget_delta)
        if eps > budget:
            raise PrivacyBudgetError(
                f"site refuses client {self.client}'s release {len(made) + 1} (run {self.run}, round {self.round}): "
                f"eps would reach {eps:.4g} > dp-max-epsilon={budget:g} at delta={self.floor.budget_delta:g} "
                f"(ledger {self.ledger.path}); raise dp-max-epsilon in the site's node config to release more")
