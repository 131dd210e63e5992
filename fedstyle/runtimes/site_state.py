"""A site's per-client persistent state on disk, versioned by round (Flower deployments, flower-sim).

A client's ``ClientContext.state`` (FedDyn's gradient term, FedBN's local layers ``local/...``, any
tensor a method keeps across rounds) must outlive the process that computed it: Flower runs every
message in a fresh ClientApp process, a site may be restarted, and a resumed coordinator is a new
Flower run whose ``context.state`` starts empty. :class:`ClientStateStore` keeps it in a folder per
run and client::

    <state dir>/run-<sha256(config JSON)[:16]>/client-<K>/
        setup-upload.<session>.safetensors      what the setup exchange left
        setup-download.<session>.safetensors
        r000003-query.<session>.safetensors     after round 3's (0-based) query phase
        r000003-train.<session>.safetensors     after round 3's training
        data.safetensors                        the client's built data (see clientapp)

Each file is a *snapshot*: the whole state after the message that produced it, written atomically
(temporary file + rename) and only when the message changed the state. Snapshots are ordered by
**step** (:func:`step_of`: setup upload -2, setup download -1, round r's query 2r, its training
2r+1). A message at step s works on the newest snapshot *before* s, so a coordinator that resumes
from a checkpoint older than the site's state (and redoes rounds) gets the state as it was after
the client's last participation before the round being redone — exactly what the in-process
runner restores from its checkpoint.

The coordinator tells the site, with every message, its :class:`Session`: a random id per start of
the round loop, the checkpoint round that start resumed from, and the round of the run's last
checkpoint (``durable_round``). :meth:`ClientStateStore.prune` then

- deletes snapshots of rounds >= the session's start that another session wrote (a future that
  the resumed coordinator redoes; also what a finished earlier run with the same config left);
- keeps, of the snapshots before the durable round, only the newest (no resume can go further
  back than the last checkpoint).

The setup exchange reruns at every start (as ``fedstyle run --resume`` does in process); its
snapshots are rewritten with identical content and never count as stale.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import torch

from fedstyle.errors import FedstyleError
from fedstyle.io import aligned, atomic_write

#: overrides the default state folder of a site (flower-sim and the tests set it)
STATE_DIR_ENV = "FEDSTYLE_SITE_STATE"
_META_KEY = "fedstyle"
_SUFFIX = ".safetensors"
_NAME = re.compile(r"^(setup-upload|setup-download|r(\d{6,})-(query|train))\.([0-9a-zA-Z_-]+)\.safetensors$")

#: the client phases whose messages may change the state, and their position inside a round
PHASE_OFFSETS = {"setup_upload": 0, "setup_download": 1, "round_query": 0, "train": 1}


class StateStoreError(FedstyleError):
    """A site's state folder cannot be read."""


def default_state_root() -> Path:
    """``$FEDSTYLE_SITE_STATE`` if set, else the per-user state folder (``platformdirs``)."""
    configured = os.environ.get(STATE_DIR_ENV)
    if configured:
        return Path(configured).expanduser()
    import platformdirs

    return Path(platformdirs.user_state_dir("fedstyle")) / "sites"


def run_key(config_json: str) -> str:
    """The run's folder name: a digest of its resolved config (what every message carries)."""
    return "run-" + hashlib.sha256(config_json.encode("utf-8")).hexdigest()[:16]


def step_of(phase: str, round_index: int) -> int:
    """Order of a message among a client's messages: setup upload -2, setup download -1, round r's
    query 2r, round r's training 2r + 1."""
    if phase.startswith("setup_"):
        return -2 + PHASE_OFFSETS[phase]
    return 2 * round_index + PHASE_OFFSETS[phase]


def round_of(step: int) -> int:
    """The round a step belongs to (-1 for the setup exchange)."""
    return -1 if step < 0 else step // 2


def _label(step: int) -> str:
    if step < 0:
        return "setup-upload" if step == -2 else "setup-download"
    return f"r{step // 2:06d}-{'train' if step % 2 else 'query'}"


@dataclass(frozen=True)
class Session:
    """What the coordinator says about the run's history (sent with every message).

    ``id``: random per start of the coordinator's round loop; ``start_round``: the checkpoint round
    it resumed from (0 for a new run); ``durable_round``: the round of the run's last checkpoint.
    """

    id: str
    start_round: int = 0
    durable_round: int = 0


@dataclass(frozen=True)
class Snapshot:
    step: int
    session: str
    path: Path

    @property
    def round(self) -> int:
        return round_of(self.step)


def same_state(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> bool:
    """Equal keys and bitwise-equal tensors (dtype and shape included)."""
    if a.keys() != b.keys():
        return False
    for key, value in a.items():
        other = b[key]
        if value.dtype != other.dtype or value.shape != other.shape:
            return False
        if not torch.equal(value.detach().cpu(), other.detach().cpu()):
            return False
    return True


class ClientStateStore:
    """The snapshots of one client of one run on this site (see the module docstring)."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)

    @classmethod
    def open(cls, root: str | Path, config_json: str, client_id: int) -> "ClientStateStore":
        return cls(Path(root) / run_key(config_json) / f"client-{int(client_id)}")

    # -- reading ------------------------------------------------------------------------
    def snapshots(self) -> list[Snapshot]:
        """Every snapshot, by step (then by modification time)."""
        if not self.folder.is_dir():
            return []
        found = []
        for path in self.folder.iterdir():
            match = _NAME.match(path.name)
            if match is None:
                continue
            name, number, kind, session = match.groups()
            if name == "setup-upload":
                step = -2
            elif name == "setup-download":
                step = -1
            else:
                step = 2 * int(number) + (1 if kind == "train" else 0)
            found.append((step, path.stat().st_mtime_ns, Snapshot(step, session, path)))
        return [s for _, _, s in sorted(found, key=lambda t: (t[0], t[1]))]

    def latest_before(self, step: int, session: str | None = None) -> Snapshot | None:
        """The newest snapshot strictly before ``step``; at equal steps the given session's wins."""
        candidates = [s for s in self.snapshots() if s.step < step]
        if not candidates:
            return None
        best = candidates[-1].step
        same = [s for s in candidates if s.step == best]
        mine = [s for s in same if s.session == session]
        return (mine or same)[-1]

    def load(self, before_step: int, session: str | None = None,
             device: torch.device | str = "cpu") -> tuple[dict[str, torch.Tensor], Snapshot | None]:
        """The state after the newest snapshot before ``before_step`` ({} and None when there is none)."""
        snap = self.latest_before(before_step, session)
        if snap is None:
            return {}, None
        from safetensors.torch import load_file

        try:
            tensors = load_file(str(snap.path))
        except Exception as err:  # not a file this store wrote
            raise StateStoreError(f"cannot read the site state {snap.path}: {err}; delete {self.folder} to start "
                                  "this client's state afresh (the run then differs from an uninterrupted one)") from None
        return {k: aligned(v).to(device) for k, v in tensors.items()}, snap

    # -- writing ------------------------------------------------------------------------
    def save(self, step: int, session: str, state: Mapping[str, torch.Tensor]) -> Path:
        """Write ``state`` as the snapshot of ``step`` (atomically), replacing any other of that step."""
        from safetensors.torch import save_file

        plain = {k: v.detach().to("cpu").contiguous().clone() for k, v in state.items()}
        meta = {"step": step, "round": round_of(step), "session": session, "written": time.time()}
        path = self.folder / f"{_label(step)}.{session}{_SUFFIX}"
        atomic_write(path, lambda tmp: save_file(plain, str(tmp), metadata={_META_KEY: json.dumps(meta)}))
        for other in self.snapshots():
            if other.step == step and other.path != path:
                other.path.unlink(missing_ok=True)
        return path

    def prune(self, session: Session, *, durable: bool = True) -> list[Path]:
        """Delete what no message of ``session`` (or of a later resume) can need; the removed paths.

        Stale futures: snapshots of rounds >= ``session.start_round`` written by another session.
        With ``durable``: of the snapshots before ``session.durable_round``, all but the newest.
        Leftover temporary files of a killed write go too.
        """
        removed = []
        keep = []
        for snap in self.snapshots():
            if snap.round >= session.start_round and snap.session != session.id:
                removed.append(snap.path)
            else:
                keep.append(snap)
        if durable:
            older = [s for s in keep if s.step < 2 * session.durable_round]
            removed += [s.path for s in older[:-1]]
        if self.folder.is_dir():
            removed += [p for p in self.folder.glob(".*.tmp")]
        for path in removed:
            path.unlink(missing_ok=True)
        return removed
